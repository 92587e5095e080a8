"""Prometheus metrics from a real catalog after real snapshot, replicate and archive runs on
zfs-fuse, scraped over HTTP from the endpoint and read back from the textfile."""

from __future__ import annotations

import os
import textwrap
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.cli import run_zbak, zfs

from zrepl_py.config.loading import load_config
from zrepl_py.errors import ExitStatus, ZbakError
from zrepl_py.invocation.context import Context
from zrepl_py.observe.runlog import recorded_run
from zrepl_py.status.metrics import registry_for, serve, write_textfile

pytestmark = pytest.mark.zfs


def put(path, data: bytes) -> None:
    """Write and fsync: zfs-fuse sees page-cached FUSE writes only once they are flushed."""
    with open(path, "wb") as f:
        f.write(data)
        os.fsync(f.fileno())


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(found, name, **labels):
    return found[(name, frozenset(labels.items()))]


@pytest.fixture
def world(make_pool, tmp_path, capsys):
    """src/data snapshotted, replicated to bak/replica, archived; then changed and
    snapshotted again, so the replica is one snapshot behind and s1 pins the old file."""
    src, bak = make_pool(), make_pool()
    data, replica = f"{src.name}/data", f"{bak.name}/replica"
    zfs("create", data)
    (tmp_path / "store").mkdir()
    config = tmp_path / "zbak.toml"
    config.write_text(textwrap.dedent(f"""
        state_dir = "{tmp_path / 'state'}"
        [metrics]
        textfile = "{tmp_path / 'zbak.prom'}"
        [stores.cold]
        url = "file://{tmp_path / 'store'}"
        [jobs.j]
        dataset = "{data}"
        [jobs.j.snapshot]
        schedule = "0 * * * *"
        [restore]
        scratch = "{bak.name}/scratch"
        [jobs.j.replicate]
        targets = ["local:{replica}"]
        protection_budget = {{ max_bytes = "1G", max_age = "7d" }}
        [jobs.j.archive]
        store = "cold"
    """))
    zfs("create", f"{bak.name}/scratch")

    def run(*args):
        status, out, err = run_zbak("--config", str(config), *args)
        assert status == ExitStatus.OK, out + err
        return out

    run("init", "--no-checks")
    put(src.mountpoint / "data" / "old.bin", os.urandom(400_000))
    run("snapshot")
    run("replicate")
    run("archive")
    (src.mountpoint / "data" / "old.bin").unlink()
    put(src.mountpoint / "data" / "new.bin", os.urandom(100_000))
    os.sync()
    time.sleep(1.1)  # snapshot names have one-second resolution
    run("snapshot")
    ctx = Context(config=load_config(config), config_path=config)
    yield ctx, data, replica, run
    ctx.close()


def test_the_endpoint_serves_last_success_lag_bytes_chain_length_and_held_bytes(world):
    ctx, data, replica, _ = world
    with pytest.raises(ZbakError):
        with recorded_run(ctx.catalog(), ctx.clock, "j", "audit"):
            raise ZbakError("audit found 2 problems")
    registry, collector = registry_for(ctx)
    collector.refresh_held()
    server = serve(registry, ("127.0.0.1", 0))
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    found = samples(text)
    target = f"local:{replica}"
    now = ctx.clock.now().timestamp()
    for action, where in (("snapshot", ""), ("replicate", target), ("archive", f"cold:{data}")):
        stamp = value(found, "zbak_last_success_timestamp_seconds", job="j", action=action,
                      target=where)
        assert now - 600 < stamp <= now, action
        assert value(found, "zbak_last_run_ok", job="j", action=action, target=where) == 1
    # A local zfs-fuse send | receive has no faithful byte counter (proc/pipeline.py): the
    # metric must equal what the run recorded, whatever that is.
    (replicated,) = [r for r in ctx.catalog().last_runs("j") if r.action == "replicate"]
    assert replicated.bytes > 0
    assert value(found, "zbak_last_run_bytes", job="j", action="replicate", target=target) == replicated.bytes
    assert value(found, "zbak_replication_lag_snapshots", job="j", target=target, dataset=data) == 1
    assert value(found, "zbak_replication_lag_seconds", job="j", target=target, dataset=data) >= 0
    assert value(found, "zbak_archive_chain_length", job="j", dataset=data, store="cold") == 1
    assert value(found, "zbak_archive_chain_stored_bytes", job="j", dataset=data, store="cold") > 0
    assert value(found, "zbak_audit_ok", job="j") == 0
    assert value(found, "zbak_snapshots", job="j") == 2
    held = value(found, "zbak_held_bytes", job="j")
    assert 400_000 <= held < 1_000_000, "the first snapshot, held for replica and archive, pins old.bin"


def test_a_scrape_reads_the_catalog_afresh_and_never_needs_held_bytes(world):
    ctx, data, replica, run = world
    registry, _ = registry_for(ctx)
    from prometheus_client import generate_latest

    before = samples(generate_latest(registry).decode())
    assert ("zbak_held_bytes", frozenset({("job", "j")})) not in before, "not read: no sample"
    run("replicate")
    after = samples(generate_latest(registry).decode())
    assert value(after, "zbak_replication_lag_snapshots", job="j", target=f"local:{replica}",
                 dataset=data) == 0


def test_the_textfile_is_written_atomically_by_zbak_status_and_by_write_textfile(world, tmp_path):
    ctx, data, replica, run = world
    path = tmp_path / "zbak.prom"
    run("status", "--prom-textfile", str(path))
    found = samples(path.read_text())
    assert value(found, "zbak_replication_lag_snapshots", job="j", target=f"local:{replica}",
                 dataset=data) == 1
    assert value(found, "zbak_held_bytes", job="j") >= 400_000
    other = tmp_path / "second.prom"
    write_textfile(ctx, other)
    assert samples(other.read_text()).keys() == found.keys()
    assert sorted(p.name for p in tmp_path.glob("*.prom*")) == ["second.prom", "zbak.prom"], \
        "no temporary file is left behind"


def test_drills_and_the_limits_of_the_config_are_exported(world):
    """zbak_drill_* per job and source after a real drill of the store and the replica, and
    the limits alert rules compare with (docs/drills.md, docs/observability.md)."""
    ctx, data, replica, run = world
    run("drill")
    registry, _ = registry_for(ctx)
    from prometheus_client import generate_latest

    found = samples(generate_latest(registry).decode())
    now = ctx.clock.now().timestamp()
    drills = {d.source: d for d in ctx.catalog().last_drills("j")}
    assert sorted(drills) == ["cold", f"local:{replica}"]
    for source, drill in drills.items():
        assert drill.result == "ok" and drill.files == 1  # the first snapshot holds old.bin only
        stamp = value(found, "zbak_drill_last_success_timestamp_seconds", job="j", source=source)
        assert now - 600 < stamp <= now and stamp == drill.ended_at.timestamp()
        assert value(found, "zbak_drill_duration_seconds", job="j", source=source) == drill.seconds > 0
        assert value(found, "zbak_drill_bytes", job="j", source=source) == drill.bytes >= 400_000
        assert value(found, "zbak_drill_ok", job="j", source=source) == 1
    assert value(found, "zbak_stale_after_seconds", action="drill") == 8 * 86400
    assert value(found, "zbak_stale_after_seconds", action="replicate") == 26 * 3600
    assert value(found, "zbak_protection_budget_max_bytes", job="j") == 10**9  # 1G: SI
    assert value(found, "zbak_protection_budget_max_age_seconds", job="j") == 7 * 86400
    cursor = value(found, "zbak_replication_cursor_timestamp_seconds", job="j",
                   target=f"local:{replica}", dataset=data)
    assert now - 600 < cursor <= now
