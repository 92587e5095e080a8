"""An archive to an ``sftp://`` store on an SFTP-only server, the storage box's kind
(``support.sftpd``: OpenSSH ``internal-sftp``, chrooted, no shell), killed mid-volume
(docs/decisions.md#sftp-store).

``zbak init`` creates the store's directory on the server (mode 0700). ``kill -9`` of ``zbak
archive`` (a process, as cron runs it) while it uploads a 40 MiB full of random data in 4 MiB
volumes, once four volumes are durable and the fifth is being written, leaves that put's
temporary file on the server (``.vol-000004.zst.partial-...``); ``zbak audit`` reports it. Then
the rerun converges (exit 0, the stored volumes resumed, not sent again), nothing of the killed
put is left, the store holds exactly the catalog's objects, ``zbak audit --deep`` (every
volume read back over SFTP and hashed) is clean, and ``zbak restore`` from the store gives
the snapshot's files.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import MIB, content_of, restored_content, volume_in_flight
from support.archive_checks import catalog_of, catalogued, converged_problems
from support.common import hosts_table

from zrepl_py.config.loading import load_config
from zrepl_py.errors import ExitStatus
from zrepl_py.objects.layout import PROGRESS
from zrepl_py.stores.registry import open_store
from zrepl_py.stores.scheme import StoreEnv

pytestmark = [pytest.mark.zfs, pytest.mark.slow]

SIZE = 40 * MIB
VOLUME = 4 * MIB


def test_an_archive_to_an_sftp_only_server_killed_mid_volume_resumes_audits_and_restores(
        site, sftpd, sftp_dir):
    path = f"{sftp_dir}/zbak"
    store = sftpd.local(path)
    site.write(hosts_table("box", sftpd.host_config()) + f"""
        [stores.offsite]
        url = "sftp://box{path}"
        volume_size = {VOLUME}
        [jobs.data]
        dataset = "{site.data}"
        [jobs.data.archive]
        store = "offsite"
    """)
    checks = site.ok("init")
    assert f"directory {path} on box" in checks and "posix-rename yes, fsync yes" in checks
    assert (store.stat().st_mode & 0o777) == 0o700
    (site.mount / "big.bin").write_bytes(os.urandom(SIZE))
    subprocess.run(["zfs", "snapshot", f"{site.data}@big"], check=True)

    site.kill_when(volume_in_flight(store, 4), "archive", "data")
    prefix = next(store.rglob(PROGRESS)).parent
    (left,) = prefix.glob(".vol-*.partial-*")
    key = str(left.relative_to(store).with_name(left.name.split(".partial-")[0][1:]))
    found = {f["key"]: f for f in site.unfinished_uploads()}
    assert f"temporary file {left.name}, {left.stat().st_size:,} bytes" in (
        found[key]["problem"]), found

    rows = json.loads(site.ok("archive", "data", "--json"))["rows"]
    assert rows[0]["stream"] == "full @big" and "resumed" in rows[0]["volumes"], rows
    assert int(rows[0]["volumes"].split(", ")[1].split()[0]) >= 4, rows
    assert not [p for p in store.rglob("*") if ".partial-" in p.name], sorted(store.rglob(".*"))
    config = load_config(site.config)
    backend = open_store("offsite", config.stores["offsite"],
                         StoreEnv(hosts=config.hosts, known_hosts=site.tmp / "state/known_hosts"))
    try:
        with catalog_of(site.config) as catalog:
            streams = catalogued(catalog, site.data)
        assert [(s.kind, s.to_name) for s, _ in streams] == [("full", "big")]
        assert converged_problems(backend, streams) == []
    finally:
        backend.close()

    deep = site.run("audit", "--deep", "--json")
    assert deep.status == ExitStatus.OK, deep.stdout + deep.stderr
    assert json.loads(deep.stdout)["findings"] == [], deep.stdout
    into = f"{site.pool}/back"
    site.ok("restore", site.data, "--to", "@big", "--into", into, "--from", "offsite", "--yes")
    assert restored_content(into) == content_of(f"{site.data}@big", site.pool, "big")
