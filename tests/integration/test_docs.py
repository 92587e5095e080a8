"""The man pages and shell completion come from the click command tree
(``scripts/make-docs.py``): zbak(1) names every command, each command has its own page with
its options, groff renders them without warnings, and completion answers for subcommands
both through ``_ZBAK_COMPLETE`` and through the generated bash script in a real bash.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from zrepl_py.cli import cli

ROOT = Path(__file__).resolve().parents[2]
ZBAK = Path(sys.executable).with_name("zbak")


def _command_tree() -> dict[str, click.Command]:
    """Every command by its page name (``zbak``, ``zbak-holds-list``), via click's own lookup."""
    found: dict[str, click.Command] = {}

    def walk(command: click.Command, path: list[str]) -> None:
        found["-".join(path)] = command
        if isinstance(command, click.Group):
            ctx = click.Context(command, info_name=path[-1])
            for name in command.list_commands(ctx):
                walk(command.get_command(ctx, name), [*path, name])

    walk(cli, ["zbak"])
    return found


@pytest.fixture(scope="module")
def docs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("docs")
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "make-docs.py"), str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return out


def test_the_main_man_page_names_every_command_and_every_exit_status(docs):
    page = (docs / "man1" / "zbak.1").read_text()
    commands = page.split(".SH COMMANDS", 1)[1]
    ctx = click.Context(cli, info_name="zbak")
    for name in cli.list_commands(ctx):
        assert rf"\fB{name}\fP" in commands, name
        assert rf"\fBzbak-{name}(1)\fP" in commands, name
    exit_status = page.split('.SH "EXIT STATUS"', 1)[1]
    assert re.findall(r"\\fB(\d+)\\fP", exit_status) == ["0", "1", "2", "3", "4", "75"]


def test_every_command_has_a_page_listing_its_options(docs):
    pages = {p.stem for p in (docs / "man1").glob("*.1")}
    tree = _command_tree()
    assert pages == set(tree)
    for name, command in tree.items():
        page = (docs / "man1" / f"{name}.1").read_text()
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                assert param.opts[0].replace("-", r"\-") in page, (name, param.opts[0])


def test_groff_renders_every_page_without_a_warning(docs):
    groff = shutil.which("groff")
    assert groff, "groff (groff-base, installed with man-db by scripts/setup-host.sh)"
    for page in sorted((docs / "man1").glob("*.1")):
        done = subprocess.run([groff, "-man", "-Tutf8", "-ww", "-z", str(page)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and not done.stderr, (page.name, done.stderr)


def _complete(words: str, shell: str = "bash") -> list[str]:
    env = {**os.environ, "_ZBAK_COMPLETE": f"{shell}_complete", "COMP_WORDS": words,
           "COMP_CWORD": str(len(words.split(" ")) - 1)}
    done = subprocess.run([str(ZBAK)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_completion_answers_with_commands_subcommands_and_options():
    assert _complete("zbak ho") == ["plain,holds"]
    assert _complete("zbak holds ") == ["plain,list", "plain,release-stale"]
    assert "plain,--deep" in _complete("zbak audit --d")
    assert _complete("zbak catalog re") == ["plain,rebuild"]


def test_the_generated_bash_script_completes_a_subcommand_in_a_real_bash(docs):
    script = docs / "completion" / "zbak.bash"
    probe = (f"source {script}; COMP_WORDS=(zbak list s); COMP_CWORD=2; "
             "_zbak_completion zbak; printf '%s\\n' \"${COMPREPLY[@]}\"")
    env = {**os.environ, "PATH": f"{ZBAK.parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "--norc", "-c", probe], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["snapshots", "streams"]


def test_the_zsh_and_fish_scripts_are_written_for_zbak(docs):
    assert "#compdef zbak" in (docs / "completion" / "_zbak").read_text()
    assert "complete --no-files --command zbak" in (docs / "completion" / "zbak.fish").read_text()
