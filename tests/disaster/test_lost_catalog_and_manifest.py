"""Disaster: the catalog database is lost, and so is the manifest pair of one stream.

@0..@9 are archived to a ``file://`` store as a full and five incrementals (several volumes
each); then the catalog and ``manifest.json`` + ``manifest.json.copy`` of the stream ending
at @4 are deleted. ``zbak catalog rebuild`` brings back what the manifests can (@0..@3), the
audit must then say exactly what the store can and cannot restore, exit 4, and give advice
that works: after ``zbak archive --full`` the newest snapshot restores again and the audit is
clean, still listing the snapshots lost from this store.
"""

from __future__ import annotations

import json

import pytest

from zrepl_py.archive.layout import MANIFEST, MANIFEST_COPY
from zrepl_py.errors import ExitStatus

pytestmark = pytest.mark.zfs

MIB = 1024 * 1024


def _coverage(out: str) -> dict:
    (job,) = json.loads(out)["jobs"]
    (cov,) = job["coverage"]
    return cov


def test_a_lost_catalog_and_manifest_pair_is_an_audit_error_naming_the_restorable_set(site):
    store = site.tmp / "store"
    store.mkdir(mode=0o700)
    site.write(f"""
        [stores.cold]
        url = "file://{store}"
        volume_size = "1MiB"
        [jobs.data]
        dataset = "{site.data}"
        [jobs.data.archive]
        store = "cold"
    """)
    site.ok("init", "--no-checks")
    for steps in (range(0, 1), range(1, 2), range(2, 4), range(4, 5), range(5, 8), range(8, 10)):
        site.snapshot_steps(steps, 2 * MIB)
        site.ok("archive")
    status, out, err = site.run("audit", "--json")
    assert status == ExitStatus.OK, out + err
    assert _coverage(out)["restorable"] == [f"@{i}" for i in range(10)]

    # the disaster: the catalog and both manifests of the stream ending at @4
    (lost,) = [d for d in store.rglob("*-incr-*") if (d / MANIFEST).exists()
               and json.loads((d / MANIFEST).read_text())["to"]["name"] == "4"]
    assert len(list(lost.glob("vol-*.zst"))) >= 2
    (lost / MANIFEST).unlink()
    (lost / MANIFEST_COPY).unlink()
    for db in (site.tmp / "state").glob("catalog.sqlite*"):
        db.unlink()

    site.ok("init", "--no-checks")
    status, out, err = site.run("catalog", "rebuild", "cold")
    assert status == ExitStatus.FAILED, out + err     # documented: exit 1 when any is skipped
    assert "no stream ends at @4" in out + err

    status, out, err = site.run("audit")
    assert status == ExitStatus.AUDIT_FINDINGS, out + err
    assert "restorable: @0..@3 (4); stored but unrestorable: @4..@9 (6)" in out
    assert "broken at @4" in out and "zbak archive --full" in out
    assert "--merge` adds it" not in out               # the advice that could not help
    status, out, err = site.run("audit", "--json")
    cov = _coverage(out)
    assert cov["restorable"] == ["@0", "@1", "@2", "@3"]
    assert cov["stored_unrestorable"] == [f"@{i}" for i in range(4, 10)]
    assert cov["broken_at"] == "@4" and str(lost.relative_to(store)) + "/" in cov["dead_prefixes"]
    errors = [f for f in json.loads(out)["findings"] if f["severity"] == "error"]
    assert len(errors) == 1 and "@4..@9" in errors[0]["problem"]

    # the advice: a new chain. The newest snapshot restores again; the directories no chain
    # can use are deleted by that archive run; @4..@8 cannot come back from this store.
    site.ok("archive", "--full")
    assert not [p for p in lost.rglob("*") if p.is_file()]
    status, out, err = site.run("audit")
    assert status == ExitStatus.OK, out + err
    assert "restorable: @0..@3, @9 (5)\n" in out
    restored = site.ok("restore", "--to", "@9", "--into", f"{site.pool}/back", "--from", "cold",
                       "--yes")
    assert restored is not None
    status, out, err = site.run("restore", "--to", "@5", "--into", f"{site.pool}/five",
                                "--from", "cold", "--yes")
    assert status != ExitStatus.OK
