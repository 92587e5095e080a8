"""Capabilities cached in the state directory, on a real zfs-fuse pool (``capability_cache``)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import stat

from support.zfs import COMMAND_TIMEOUT

from zrepl_py.proc.local import LocalExecutor
from zrepl_py.zfs.capabilities import detect
from zrepl_py.zfs.capability_cache import DEFAULT_TTL, cached_capabilities, entry_path

NOW = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC)


class Recording:
    """The real LocalExecutor, keeping every argv it ran."""

    host = "local"

    def __init__(self) -> None:
        self.inner = LocalExecutor()
        self.argvs: list[list[str]] = []

    def run(self, argv, **kwargs):
        self.argvs.append(list(argv))
        return self.inner.run(argv, **kwargs)


def lookup(executor, pool, cache_dir, now=NOW):
    return cached_capabilities(executor, pool, cache_dir=cache_dir, now=now,
                               timeout=COMMAND_TIMEOUT)  # fmt: skip


def test_a_second_run_asks_one_command_and_gets_what_detect_found(zpool, tmp_path):
    cache = tmp_path / "state" / "capabilities"
    first = Recording()
    caps = lookup(first, zpool.name, cache)
    assert caps == detect(LocalExecutor(), zpool.name, timeout=COMMAND_TIMEOUT)
    assert len(first.argvs) >= 6

    second = Recording()
    assert lookup(second, zpool.name, cache, NOW + dt.timedelta(hours=1)) == caps
    assert second.argvs == [["zpool", "get", "all", zpool.name]]
    path = entry_path(cache, "local", zpool.name, "zfs", "zpool")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700


def test_a_corrupt_stale_or_foreign_entry_is_detected_again_and_replaced(zpool, tmp_path):
    cache = tmp_path / "capabilities"
    caps = lookup(Recording(), zpool.name, cache)
    path = entry_path(cache, "local", zpool.name, "zfs", "zpool")
    good = json.loads(path.read_text())
    lying = {**good["capabilities"], "resume_tokens": True, "bookmarks": True}
    for broken in ("\x00garbage", json.dumps({**good, "fingerprint": "another pool"}),
                   json.dumps({**good, "capabilities": lying, "fingerprint": "x"})):
        path.write_text(broken)
        again = Recording()
        assert lookup(again, zpool.name, cache) == caps
        assert len(again.argvs) > 1, "detected again"
        assert json.loads(path.read_text())["fingerprint"] == good["fingerprint"]

    late = Recording()
    assert lookup(late, zpool.name, cache, NOW + DEFAULT_TTL + dt.timedelta(minutes=1)) == caps
    assert len(late.argvs) > 1, "an expired entry is detected again"


def test_an_unwritable_cache_only_costs_the_detection(zpool, tmp_path):
    blocker = tmp_path / "capabilities"
    blocker.write_text("a file where the directory should be")
    caps = lookup(Recording(), zpool.name, blocker)
    assert dataclasses.asdict(caps) == dataclasses.asdict(
        detect(LocalExecutor(), zpool.name, timeout=COMMAND_TIMEOUT))
