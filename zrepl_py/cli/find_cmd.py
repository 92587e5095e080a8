"""``zbak find DATASET PATH [--json]``: a file's versions across snapshots and replicas."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

import click

from zrepl_py.cli.common import Invocation, emit_json, emit_table, json_option, pass_invocation
from zrepl_py.errors import ExitStatus

if TYPE_CHECKING:
    from zrepl_py.files.find import Found
    from zrepl_py.files.versions import Version


def _mtime(ns: int) -> str:
    """An mtime in ns as ``2024-01-02T03:04:05.123456789Z`` (UTC, nanoseconds kept)."""
    seconds, rest = divmod(ns, 1_000_000_000)
    stamp = dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{stamp}.{rest:09d}Z" if rest else f"{stamp}Z"


def _json_row(row: Version) -> dict[str, Any]:
    state = row.state
    return {"snapshot": state.snapshot, "guid": state.guid, "version": row.number,
            "kind": state.kind, "size": state.size if state.kind != "absent" else None,
            "mtime": _mtime(state.mtime_ns) if state.kind != "absent" else None,
            "sha256": state.sha256 or None, "target": state.target or None,
            "where": list(row.where)}


def _folded(rows: tuple[Version, ...]) -> list[tuple[Any, ...]]:
    """One table row per run of neighbours with the same version (or absent)."""
    runs: list[list[Version]] = []
    for row in rows:
        if runs and runs[-1][-1].number == row.number:
            runs[-1].append(row)
        else:
            runs.append([row])
    table: list[tuple[Any, ...]] = []
    for run in runs:
        first, last = run[0], run[-1]
        state = first.state
        snaps = (f"@{first.state.snapshot}" if len(run) == 1 else
                 f"@{first.state.snapshot} .. @{last.state.snapshot} ({len(run)})")
        places = sorted({p for r in run for p in r.where})
        if state.kind == "absent":
            table.append(("-", snaps, "absent", None, None, None, ", ".join(places)))
            continue
        content = state.sha256[:16] or (f"-> {state.target}" if state.target else "")
        table.append((first.number, snaps, state.kind, state.size, _mtime(state.mtime_ns),
                      content, ", ".join(places)))
    return table


@click.command("find")
@click.argument("dataset")
@click.argument("path")
@json_option
@pass_invocation
def command(inv: Invocation, dataset: str, path: str, as_json: bool) -> ExitStatus:
    """List PATH's versions (relative to DATASET's mountpoint) across the snapshots of
    DATASET ([HOST:]POOL/PATH) and of its ZFS replicas, oldest first: size, mtime and
    SHA-256, and where each snapshot lives. Snapshots in a row with the same content are one
    version."""
    from zrepl_py.config.hosts import parse_endpoint
    from zrepl_py.files.find import find_versions
    from zrepl_py.files.paths import parse_path

    parse_endpoint(dataset, allow_directory=False)
    wanted = parse_path(path)
    with inv.context() as ctx:
        found = find_versions(ctx, dataset, wanted)
    _show(found, as_json)
    return ExitStatus.OK


def _show(found: Found, as_json: bool) -> None:
    if as_json:
        emit_json({"dataset": f"{found.host}:{found.dataset}", "path": found.path,
                   "versions": [_json_row(r) for r in found.rows],
                   "problems": list(found.problems)})
        return
    versions = max(r.number for r in found.rows)
    emit_table(f"{found.path!r} in {found.host}:{found.dataset}: {versions} version(s) in"
               f" {len(found.rows)} snapshot(s), oldest first",
               ["version", "snapshots", "kind", "size", "mtime (UTC)", "sha256 / target",
                "where"], _folded(found.rows))
    for problem in found.problems:
        click.echo(f"warning: not read: {problem}", err=True)
