"""Write zbak's man pages and shell completion scripts, generated from its click command tree.

    .venv/bin/python scripts/make-docs.py [OUTDIR]        (default: build/docs)

OUTDIR/man1/ gets one page per command, git style (click-man): zbak(1) lists every command
and its exit status, zbak-init(1), zbak-config-check(1), ... describe one each.
OUTDIR/completion/ gets zbak.bash, _zbak (zsh) and zbak.fish: click's own completion
scripts, the same text ``_ZBAK_COMPLETE=bash_source zbak`` prints; each asks ``zbak`` for
the words at every TAB. docs/install.md#man-pages-and-shell-completion says where they go.
Needs zbak and click-man in the running Python (``pip install 'zbak[docs]'``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

try:
    import click
    from click.shell_completion import get_completion_class

    from zrepl_py import __version__
    from zrepl_py.cli import cli
    from zrepl_py.errors import ExitStatus
except ImportError as exc:
    print(f"make-docs: {exc.name or exc} is not installed in {sys.executable}: run it with"
          " the Python zbak is installed in (.venv/bin/python scripts/make-docs.py)",
          file=sys.stderr)
    sys.exit(2)

PROG = "zbak"
COMPLETION_FILES = {"bash": "zbak.bash", "zsh": "_zbak", "fish": "zbak.fish"}


def eager_tree(group: click.Group) -> click.Group:
    """``group`` with its subcommands loaded: click-man walks ``Group.commands``, which zbak's
    lazy top-level group leaves empty until a command is looked up."""
    ctx = click.Context(group, info_name=PROG)
    commands = {name: group.get_command(ctx, name) for name in group.list_commands(ctx)}
    # zbak(1)'s NAME line: the help without its "zbak: " (click-man cuts help at 45 chars).
    summary = (group.help or "").removeprefix(f"{PROG}: ").rstrip(".")
    return click.Group(PROG, commands=commands, params=group.params, help=group.help,
                       short_help=summary)


def exit_status_section() -> str:
    """The EXIT STATUS section of zbak(1), from the table ``zbak --help`` prints."""
    lines = ['.SH "EXIT STATUS"']
    for row in ExitStatus.help_table().splitlines():
        code, meaning = row.split(None, 1)
        lines += [".TP", rf"\fB{code}\fP", meaning]
    return "\n".join(lines) + "\n"


def write_man_pages(directory: Path) -> list[Path]:
    """Write every command's page into ``directory``; return the paths, zbak.1 first."""
    from click_man.core import write_man_pages as click_man_pages

    directory.mkdir(parents=True, exist_ok=True)
    click_man_pages(PROG, eager_tree(cli), version=__version__, target_dir=str(directory))
    main_page = directory / f"{PROG}.1"
    main_page.write_text(main_page.read_text() + exit_status_section())
    return [main_page, *sorted(directory.glob(f"{PROG}-*.1"))]


def write_completions(directory: Path) -> list[Path]:
    """Write the bash, zsh and fish completion scripts into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for shell, name in COMPLETION_FILES.items():
        source = get_completion_class(shell)(cli, {}, PROG, f"_{PROG.upper()}_COMPLETE").source()
        (directory / name).write_text(source)
        written.append(directory / name)
    return written


def main(argv: list[str]) -> int:
    """Write man pages to OUTDIR/man1 and completion scripts to OUTDIR/completion."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", nargs="?", type=Path, default=Path("build/docs"))
    args = parser.parse_args(argv)
    try:
        pages = write_man_pages(args.outdir / "man1")
    except ImportError:
        print(f"make-docs: click-man is not installed in {sys.executable}:"
              " pip install 'zbak[docs]'", file=sys.stderr)
        return 2
    scripts = write_completions(args.outdir / "completion")
    print(f"make-docs: {len(pages)} man pages in {args.outdir / 'man1'}, completion scripts"
          f" {', '.join(p.name for p in scripts)} in {args.outdir / 'completion'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
