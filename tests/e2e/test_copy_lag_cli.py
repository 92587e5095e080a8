"""How far each copy lags (docs/copies.md#how-far-a-copy-lags), as the admin and the monitoring
see it: ``zbak status`` (table and ``--json``), ``zbak status --check`` and the metrics of
``--prom-textfile``, every command a ``zbak`` process, on a zfs-fuse pool archived to one
``file://`` store and copied to two others.

Store ``b`` lacks all three streams and allows no lag (``max_lag = "0s"``: any stream waiting
is a warning, so the test needs no clock of its own); store ``c`` lacks the newest
incremental only, within its 30 days. The figures are those of ``zbak copy --dry-run``'s
planned rows, and a copy clears them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.cli import initialised, write_synced, zfs

from zrepl_py.errors import ExitStatus

pytestmark = pytest.mark.zfs

DAY = 86400


@pytest.fixture
def lagging(make_pool, tmp_path, capsys):
    """Job ``data`` archived to ``a`` as a full @0 and incrementals to @1 and @2; ``c`` got
    a copy after @1, ``b`` none."""
    pool = make_pool()
    data = f"{pool.name}/data"
    zfs("create", data)
    for name in "abc":
        (tmp_path / name).mkdir()
    stores = "".join(f'[stores.{name}]\nurl = "file://{tmp_path / name}"\n' for name in "abc")
    run = initialised(tmp_path, stores + f"""
        [jobs.data]
        dataset = "{data}"
        [jobs.data.archive]
        store = "a"
        [jobs.data.copy.b]
        max_lag = "0s"
        [jobs.data.copy.c]
        max_lag = "30d"
    """, capsys)
    mount = Path(zfs("get", "-Hpo", "value", "mountpoint", data).strip())
    for step in range(3):
        write_synced(mount / f"file{step}.bin", os.urandom(64 * 1024))
        zfs("snapshot", f"{data}@{step}")
        assert run("archive").status == ExitStatus.OK
        if step == 1:
            assert run("copy", "--to", "c").status == ExitStatus.OK
    run.data, run.tmp = data, tmp_path
    return run


def ok(run, *args: str) -> str:
    ran = run(*args)
    assert ran.status == ExitStatus.OK and "Traceback" not in ran.err, ran
    return ran.out


def streams_in(run, store: str) -> list[dict]:
    return [s for s in json.loads(ok(run, "list", "streams", "--json"))
            if s["store"] == store]


def test_status_check_and_metrics_show_how_far_each_copy_lags_and_a_copy_clears_it(lagging):
    run = lagging
    archived = streams_in(run, "a")
    assert len(archived) == 3
    planned = json.loads(ok(run, "copy", "--dry-run", "--json"))["rows"]
    assert [(r["to"], r["stream"]) for r in planned] == [
        ("b", "full @0"), ("b", "incremental @0 -> @1"), ("b", "incremental @1 -> @2"),
        ("c", "incremental @1 -> @2")]

    (state,) = json.loads(ok(run, "status", "--offline", "--json"))
    copies = {c["store"]: c for c in state["copies"]}
    b, c = copies["b"], copies["c"]
    assert (b["source"], b["streams"], b["bytes"]) == (
        "a", 3, sum(s["stored_bytes"] for s in archived))
    assert b["oldest_missing"] == archived[0]["uploaded_at"]
    assert b["lag_seconds"] > 0 and b["max_lag"] == 0 and b["lagging"]
    assert (b["newest"], b["target_newest"]) == (f"{run.data}@2", None)
    assert (c["streams"], c["bytes"]) == (1, archived[2]["stored_bytes"])
    assert c["oldest_missing"] == archived[2]["uploaded_at"]
    assert (c["newest"], c["target_newest"], c["max_lag"], c["lagging"]) == (
        f"{run.data}@2", f"{run.data}@1", 30 * DAY, False)

    table = ok(run, "status", "--offline")
    rows = table.split("\ncopies\n", 1)[1].splitlines()
    assert rows[0].split() == ["job", "store", "from", "lacks", "bytes", "lag", "max", "lag",
                               "newest", "in", "from", "newest", "in", "store"]
    assert rows[1].split()[:4] == ["data", "b", "a", "3"] and "LAGGING" in rows[1], rows
    assert rows[2].split()[:4] == ["data", "c", "a", "1"] and "LAGGING" not in rows[2], rows

    ran = run("status", "--check")
    assert ran.status == 1, ran  # Nagios WARNING
    assert ran.out.splitlines()[0].startswith(
        "ZBAK WARNING - 1 warning: copy of job data to store b lags "), ran.out
    assert "(max_lag 0 s): 3 stream(s)" in ran.out and "of store a not copied" in ran.out

    prom = run.tmp / "zbak.prom"
    ok(run, "status", "--offline", "--prom-textfile", str(prom))
    found = {(s.name, s.labels["store"]): s.value
             for family in text_string_to_metric_families(prom.read_text())
             for s in family.samples if s.name.startswith("zbak_copy_")}
    assert {k: v for k, v in found.items() if k[0] != "zbak_copy_lag_seconds"} == {
        ("zbak_copy_lag_streams", "b"): 3, ("zbak_copy_lag_streams", "c"): 1,
        ("zbak_copy_lag_bytes", "b"): b["bytes"], ("zbak_copy_lag_bytes", "c"): c["bytes"],
        ("zbak_copy_max_lag_seconds", "b"): 0, ("zbak_copy_max_lag_seconds", "c"): 30 * DAY}
    assert found["zbak_copy_lag_seconds", "b"] > found["zbak_copy_lag_seconds", "c"] > 0

    ok(run, "copy")
    (state,) = json.loads(ok(run, "status", "--offline", "--json"))
    assert [(c["store"], c["streams"], c["bytes"], c["lag_seconds"], c["lagging"],
             c["target_newest"]) for c in state["copies"]] == [
        ("b", 0, 0, 0, False, f"{run.data}@2"), ("c", 0, 0, 0, False, f"{run.data}@2")]
    assert run("status", "--check").out.startswith("ZBAK OK - 1 job(s), no problem")
