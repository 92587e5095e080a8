"""A real hook program for the hook tests: it appends its arguments and environment to a
JSON-lines file, optionally writes a file (e.g. into the dataset before the snapshot),
prints a line, and exits with the status it is told."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import json, os, sys
    record, touch, code = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with open(record, "a") as out:
        out.write(json.dumps({"argv": sys.argv[4:], "env": dict(os.environ)}) + "\\n")
    if touch != "-":
        with open(touch, "w") as f:
            f.write("written by the hook\\n")
            f.flush()
            os.fsync(f.fileno())
    print(f"hook says: {os.environ.get('ZBAK_HOOK')} {os.environ.get('ZBAK_ACTION')}")
    sys.exit(code)
""")


class HookScript:
    """The hook program under ``tmp``; ``argv(...)`` is a ``pre``/``post`` list for a config.

    Args:
        tmp: a directory of the test.
    """

    def __init__(self, tmp: Path):
        self.path = tmp / "hook.py"
        self.path.write_text(SCRIPT)
        self.records = tmp / "hook-records.jsonl"

    def argv(self, *args: str, touch: Path | None = None, exit_code: int = 0) -> list[str]:
        """``[python, hook.py, RECORDS, TOUCH, EXIT, *args]``: records every call to the same file."""
        return [sys.executable, str(self.path), str(self.records),
                str(touch) if touch else "-", str(exit_code), *args]

    def calls(self) -> list[dict]:
        """Each call so far: ``{"argv": [...], "env": {...}}``, in order."""
        if not self.records.exists():
            return []
        return [json.loads(line) for line in self.records.read_text().splitlines()]

    def toml(self, *args: str, touch: Path | None = None, exit_code: int = 0) -> str:
        """``argv(...)`` as a TOML array."""
        return json.dumps(self.argv(*args, touch=touch, exit_code=exit_code))
