"""Health before work (``zrepl_py.checks.health``): ``zpool status`` parsing, a real DEGRADED mirror on
zfs-fuse, and the target free-space floor refusing a receive, through ``zbak replicate``."""

from __future__ import annotations

import json
import subprocess
import textwrap
import time

import pytest
from support.cli import Ran, run_zbak, zfs
from support.webhook import Webhook

from zrepl_py.catalog.db import make_engine
from zrepl_py.catalog.repository import Catalog
from zrepl_py.config.replicate import parse_free_floor
from zrepl_py.errors import ExitStatus
from zrepl_py.proc.local import LocalExecutor
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.pool_status import parse_status, pool_problems, pool_report

OPENZFS_DEGRADED = """\
  pool: tank
 state: DEGRADED
status: One or more devices could not be used because the label is missing or
\tinvalid.  Sufficient replicas exist for the pool to continue
\tfunctioning in a degraded state.
action: Replace the device using 'zpool replace'.
   see: https://openzfs.github.io/openzfs-docs/msg/ZFS-8000-4J
config:

\tNAME                      STATE     READ WRITE CKSUM
\ttank                      DEGRADED     0     0     0
\t  mirror-0                DEGRADED     0     0     0
\t    /var/tmp/my disk.img  ONLINE       0     0     0
\t    1234567890123456789   UNAVAIL      0     0     0  was /dev/sdc1
\t  mirror-1                ONLINE       0     0     0
\t    sdd                   ONLINE       0     0  1.2K
\t    sde                   ONLINE       0     0     0  (resilvering)
\tlogs
\t  sdf                     ONLINE       0     0     0
\tspares
\t  sdg                     AVAIL

errors: No known data errors
"""


def test_parse_status_reads_every_vdev_row_with_depth_section_counts_and_note():
    vdevs, data_errors = parse_status(OPENZFS_DEGRADED)
    rows = {v.name: v for v in vdevs}
    assert list(rows) == ["tank", "mirror-0", "/var/tmp/my disk.img", "1234567890123456789",
                          "mirror-1", "sdd", "sde", "sdf", "sdg"]
    assert rows["/var/tmp/my disk.img"].depth == 2
    assert rows["1234567890123456789"].note == "was /dev/sdc1"
    assert rows["sdd"].errors == ("0", "0", "1.2K")
    assert (rows["sdf"].section, rows["sdg"].section, rows["sdg"].errors) == ("logs", "spares", None)
    assert data_errors == "No known data errors"


def test_problems_name_the_pool_state_failed_devices_and_error_counts_but_not_an_idle_spare():
    vdevs, data_errors = parse_status(OPENZFS_DEGRADED)
    assert pool_problems("DEGRADED", vdevs, data_errors) == [
        "pool state DEGRADED",
        "mirror-0 DEGRADED",
        "1234567890123456789 UNAVAIL (was /dev/sdc1)",
        "sdd: 0 read, 0 write, 1.2K checksum errors",
    ]


def test_an_online_pool_with_checksum_errors_or_data_errors_still_has_problems():
    text = OPENZFS_DEGRADED.replace("DEGRADED", "ONLINE").replace("UNAVAIL", "ONLINE").replace(
        "errors: No known data errors", "errors: 2 data errors, use '-v' for a list")
    vdevs, data_errors = parse_status(text)
    assert pool_problems("ONLINE", vdevs, data_errors) == [
        "sdd: 0 read, 0 write, 1.2K checksum errors",
        "data errors: 2 data errors, use '-v' for a list",
    ]


def test_min_free_takes_a_size_or_a_percentage_of_the_pool():
    assert parse_free_floor("2GiB").floor_bytes(10**12) == 2 * 2**30
    assert parse_free_floor("10%").floor_bytes(5000) == 500
    for bad in ("0%", "100%", "ten%", "-1"):
        with pytest.raises(ValueError):
            parse_free_floor(bad)


@pytest.fixture
def mirror_pool(zfs_daemon, tmp_path):
    """A zfs-fuse pool mirrored over two 128 MB sparse files: ``(name, [file, file])``."""
    name = f"zhm{time.monotonic_ns() % 10**8}"
    files = [tmp_path / "mirror a.img", tmp_path / "mirror-b.img"]
    for f in files:
        subprocess.run(["truncate", "-s", "128M", str(f)], check=True)
    subprocess.run(["zpool", "create", "-m", str(tmp_path / f"{name}-mnt"), name, "mirror",
                    *map(str, files)], check=True, capture_output=True, timeout=60)
    yield name, files
    deadline = time.monotonic() + 10
    while subprocess.run(["zpool", "destroy", "-f", name], capture_output=True,
                         timeout=60).returncode != 0 and time.monotonic() < deadline:
        time.sleep(0.3)


def test_a_mirror_with_one_device_offline_is_reported_degraded_naming_the_device(mirror_pool):
    name, files = mirror_pool
    client = Zfs(LocalExecutor(), timeout=60)
    healthy = pool_report(client, name, with_size=True)
    assert healthy.state == "ONLINE" and not healthy.degraded
    assert 0 < healthy.free_bytes < healthy.size_bytes < 128 * 2**20

    subprocess.run(["zpool", "offline", name, str(files[1])], check=True, timeout=60)
    report = pool_report(client, name)
    assert report.state == "DEGRADED" and report.degraded
    assert f"{files[1]} OFFLINE" in report.problems
    assert report.describe().startswith(f"pool {name} on local is DEGRADED: ")


class Rig:
    """A source dataset and a local target pool, a config replicating one to the other."""

    def __init__(self, tmp_path, source_pool: str, target_pool: str, min_free: str):
        self.data, self.replica = f"{source_pool}/data", f"{target_pool}/replica"
        self.state = tmp_path / "state"
        self.webhook = Webhook()
        zfs("create", self.data)
        zfs("snapshot", f"{self.data}@s1")
        self.config = tmp_path / "zbak.toml"
        self.config.write_text(textwrap.dedent(f"""
            state_dir = "{self.state}"
            [jobs.j]
            dataset = "{self.data}"
            [jobs.j.replicate]
            targets = ["local:{self.replica}"]
            min_free = "{min_free}"
            [alerts.webhook]
            url = "{self.webhook.url}"
        """))
        assert self("init", "--no-checks")[0] == ExitStatus.OK

    def __call__(self, *args: str) -> Ran:
        return run_zbak("--config", str(self.config), *args)

    def events(self, kind: str) -> list[dict]:
        """The alerts of ``kind`` the webhook received."""
        return [b for b in self.webhook.bodies if b["kind"] == kind]

    def last_replicate_run(self):
        engine = make_engine(f"sqlite:///{self.state / 'catalog.sqlite'}")
        try:
            return next(r for r in Catalog(engine).last_runs("j") if r.action == "replicate")
        finally:
            engine.dispose()


def test_replicating_from_a_degraded_pool_works_and_the_warning_reaches_the_run_and_an_event(
        mirror_pool, make_pool, tmp_path):
    name, files = mirror_pool
    rig = Rig(tmp_path, name, make_pool().name, min_free="1M")
    try:
        subprocess.run(["zpool", "offline", name, str(files[0])], check=True, timeout=60)
        status, out, err = rig("replicate", "--json")
        assert status == ExitStatus.OK, out + err
        (warned,) = [r for r in json.loads(out)["rows"] if r["warnings"]]
        assert any(f"source pool {name} on local is DEGRADED" in w and f"{files[0]} OFFLINE" in w
                   for w in warned["warnings"])
        assert zfs("get", "-Hp", "-o", "value", "guid", f"{rig.replica}@s1").strip()
        run = rig.last_replicate_run()
        assert run.result == "ok" and "DEGRADED" in run.error
        (event,) = rig.events("degraded")
        assert (event["job"], event["action"], event["target"]) == (None, "health", f"local:{name}")
    finally:
        rig.webhook.close()


def test_a_target_pool_under_min_free_receives_nothing_and_the_run_fails_saying_why(
        make_pool, tmp_path):
    rig = Rig(tmp_path, make_pool().name, make_pool().name, min_free="1GiB")
    try:
        status, out, err = rig("replicate", "--json")
        assert status == ExitStatus.FAILED
        (failed,) = [r for r in json.loads(out)["rows"] if r["error"]]
        assert f"under min_free {2**30} bytes" in failed["error"], failed
        assert "nothing sent" in failed["error"]
        assert subprocess.run(["zfs", "get", "-H", "guid", rig.replica],
                              capture_output=True).returncode != 0, "nothing was received"
        run = rig.last_replicate_run()
        assert run.result == "failed" and "min_free" in run.error
        (event,) = rig.events("degraded")
        assert (event["job"], event["action"]) == ("j", "replicate")
    finally:
        rig.webhook.close()
