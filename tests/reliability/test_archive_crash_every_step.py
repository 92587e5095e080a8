"""docs/decisions.md#crash-tests-kill-at-every-step: ``zbak archive`` killed (SIGKILL) after its
k-th store or catalog step, for every k, then run again.

The run under test archives a full (@0) and an incremental (-I @0 -> @2) of a real zfs-fuse
dataset to a ``file://`` store with 1 MiB volumes, so each stream has several volumes and the
steps are: volume, progress.json, ..., manifest, catalog row, progress.json deleted.
``support/crash_runner.py`` runs the real CLI in a subprocess and kills it after step k (see
its docstring). After each crash:

* the catalog names only objects that are stored whole (size and SHA-256), and every other
  prefix is a partial upload or an adoptable manifest (``support.archive_checks``);
then after a normal rerun:
* the rerun succeeds; volumes the crashed run had recorded in progress.json are not uploaded
  again; a manifest written before the crash is adopted, not re-sent;
* the catalog holds exactly the chain full @0 -> incremental @2, the store exactly its
  manifests and volumes (no progress.json, nothing else), all matching;
* ``zbak restore --from STORE`` of the newest snapshot gives its guid back;
* ``zbak audit`` is clean.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.archive_checks import (
    catalog_of,
    catalog_problems,
    catalogued,
    converged_problems,
    leftovers,
)
from support.catalog import initialised_state
from support.cli import Ran, file_archive_config, prop, run_zbak, zfs

from zrepl_py.errors import ExitStatus
from zrepl_py.objects.layout import MANIFEST, PROGRESS
from zrepl_py.stores.file import FileBackend

pytestmark = [pytest.mark.zfs, pytest.mark.slow]

RUNNER = Path(__file__).resolve().parents[1] / "support" / "crash_runner.py"
MiB = 1 << 20


def write_config(base: Path, dataset: str) -> tuple[Path, Path]:
    base.mkdir(parents=True, exist_ok=True)
    return file_archive_config(base, dataset, volume_size="1MiB")


def zbak(config: Path, *args: str) -> Ran:
    """Run ``zbak --config CONFIG ARGS`` as a process."""
    return run_zbak("--config", str(config), *args)


def crash(config: Path, base: Path, k: int | None) -> tuple[int, list[tuple[str, str]], str]:
    """Run ``zbak archive`` under the crash runner; return its exit status (-9 when killed),
    the steps it completed ``(op, key)`` and its stderr."""
    steps_file = base / f"steps-{k}"
    env = dict(os.environ, ZBAK_FAULT_STEPS_FILE=str(steps_file), ZBAK_LOG_LEVEL="WARNING")
    env.pop("ZBAK_FAULT_KILL_AFTER", None)
    if k is not None:
        env["ZBAK_FAULT_KILL_AFTER"] = str(k)
    done = subprocess.run([sys.executable, str(RUNNER), "--config", str(config), "archive"],
                          env=env, capture_output=True, text=True, timeout=180)
    steps = []
    if steps_file.exists():
        steps = [tuple(line.split("\t")[1:3]) for line in steps_file.read_text().splitlines()]
    return done.returncode, steps, done.stderr


@pytest.fixture
def source(zpool):
    """``POOL/data`` with @0 (1.5 MiB of random data), @1 (+1.2 MiB) and @2 (a small edit)."""
    data = f"{zpool.name}/data"
    zfs("create", data)
    mount = Path(prop(data, "mountpoint"))
    (mount / "a.bin").write_bytes(os.urandom(3 * MiB // 2))
    zfs("snapshot", f"{data}@0")
    (mount / "b.bin").write_bytes(os.urandom(6 * MiB // 5))
    zfs("snapshot", f"{data}@1")
    (mount / "notes.txt").write_text("edited\n" * 100)
    zfs("snapshot", f"{data}@2")
    return zpool, data


def _check_converged(config: Path, store: Path, data: str, *, stale_progress_ok=False) -> None:
    with catalog_of(config) as catalog:
        streams = catalogued(catalog, data)
    chain = [(s.kind, s.from_name, s.to_name, s.state) for s, _ in streams]
    assert chain == [("full", None, "0", "uploaded"), ("incremental", "0", "2", "uploaded")]
    assert streams[1][0].parent_id == streams[0][0].id
    assert converged_problems(FileBackend("cold", store), streams,
                              stale_progress_ok=stale_progress_ok) == []


def test_an_archive_killed_after_any_store_or_catalog_step_converges_on_rerun_and_restores(
        source, tmp_path):
    pool, data = source
    k, total, adopted_seen, resumed_seen = 0, None, 0, 0
    while total is None:
        k += 1
        assert k < 60, "the archive never finished: the step count does not converge"
        base = tmp_path / f"k{k}"
        config, store = write_config(base, data)
        initialised_state(config)
        code, steps, stderr = crash(config, base, k)
        if code == 0:  # k is past the last step: the run completed
            total = len(steps)
            assert total == k - 1, stderr
            _check_converged(config, store, data)
            break
        assert code == -signal.SIGKILL, stderr
        assert len(steps) == k
        last_op, last_key = steps[-1]
        backend = FileBackend("cold", store)

        # The state the crash left: the catalog only names whole objects; the rest is a
        # partial upload or an adoptable manifest.
        with catalog_of(config) as catalog:
            streams = catalogued(catalog, data)
        assert catalog_problems(backend, streams) == [], f"after step {k} ({last_op} {last_key})"
        rest = leftovers(backend, streams)
        assert all(v in ("partial", "adoptable") for v in rest.values()), (k, rest)
        progress_volumes = {}
        for prefix in rest:
            if (store / prefix / PROGRESS).exists():
                recorded = json.loads((store / prefix / PROGRESS).read_bytes())["volumes"]
                progress_volumes.update({v["key"]: (store / v["key"]).stat().st_mtime_ns
                                         for v in recorded})

        status, out, err = zbak(config, "archive", "--json")
        assert status == ExitStatus.OK, f"rerun after step {k} ({last_op} {last_key}): {err}"
        rows = {r["stream"]: r for r in json.loads(out)["rows"]}
        if last_op == "put" and last_key.endswith(MANIFEST):
            # Killed between the manifest and the catalog row: the rerun adopts it.
            assert any(r["volumes"] == "adopted" for r in rows.values()), (k, rows)
            adopted_seen += 1
        for key, mtime in progress_volumes.items():
            assert (store / key).stat().st_mtime_ns == mtime, \
                f"after step {k}: {key} was uploaded again although progress.json listed it"
        resumed_seen += bool(progress_volumes)
        # Killed after the last catalog row: the rerun has nothing to write and leaves the
        # last stream's progress.json for the next run that writes (archive.job).
        last_row = [i for i, (op, _) in enumerate(steps) if op == "catalog.add_stream"]
        nothing_left = len(last_row) == 2 and last_row[-1] == len(steps) - 1
        _check_converged(config, store, data, stale_progress_ok=nothing_left)

        into = f"{pool.name}/r{k}"
        status, out, err = zbak(config, "restore", data, "--to", "@2", "--into", into,
                                "--from", "cold", "--yes")
        assert status == ExitStatus.OK, out + err
        assert prop(f"{into}@2", "guid") == prop(f"{data}@2", "guid")
        status, out, err = zbak(config, "audit")
        assert status == ExitStatus.OK, f"audit after step {k}: {out}{err}"
    # Two streams, each: >= 2 volumes and progress records, a manifest, a catalog row and the
    # progress delete.
    assert total >= 2 * (2 * 2 + 3)
    assert adopted_seen == 2 and resumed_seen >= 2


def _incremental_step(steps: list[tuple[str, str]], which: str) -> int:
    """The 1-based number of the incremental stream's step ``which``."""
    incr = [i + 1 for i, (op, key) in enumerate(steps) if "-incr-" in key and op == "put"]
    volumes = [i for i in incr if "/vol-" in steps[i - 1][1]]
    if which == "volume":
        return volumes[0]
    if which == "progress":
        return volumes[0] + 1
    return next(i for i in incr if steps[i - 1][1].endswith(MANIFEST))



@pytest.mark.parametrize("which", [
    "volume",
    "progress",
    "manifest",
])
def test_a_partial_incremental_whose_plan_changed_before_the_rerun_leaves_no_orphan(
        source, tmp_path, which):
    """Killed inside the incremental (-I @0 -> @2: after its first volume, after that volume's
    progress record, or after its manifest), then @3 is taken: the rerun archives -I @0 -> @3
    and the store ends up holding only what the catalog names."""
    pool, data = source
    count_config, _ = write_config(tmp_path / "count", data)
    initialised_state(count_config)
    code, steps, stderr = crash(count_config, tmp_path / "count", None)
    assert code == 0, stderr
    k = _incremental_step(steps, which)

    config, store = write_config(tmp_path / "run", data)
    initialised_state(config)
    code, _, stderr = crash(config, tmp_path / "run", k)
    assert code == -signal.SIGKILL, stderr
    zfs("snapshot", f"{data}@3")
    status, out, err = zbak(config, "archive", "--json")
    assert status == ExitStatus.OK, err
    assert [r["stream"] for r in json.loads(out)["rows"]] == ["incremental -I @0 -> @3"]
    with catalog_of(config) as catalog:
        streams = catalogued(catalog, data)
    assert [(s.kind, s.to_name) for s, _ in streams] == [("full", "0"), ("incremental", "3")]
    assert converged_problems(FileBackend("cold", store), streams) == []
