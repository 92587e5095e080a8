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
from pathlib import Path

import pytest
from conftest import MIB, content_of, prop, restored_content, snapshots
from support.cli import file_archive_config

from zrepl_py.errors import ExitStatus
from zrepl_py.objects.layout import MANIFEST, MANIFEST_COPY

pytestmark = pytest.mark.zfs


def _coverage(out: str) -> dict:
    (job,) = json.loads(out)["jobs"]
    (cov,) = job["coverage"]
    return cov


def _archiving(site) -> Path:
    """Configure job ``data`` archiving to a ``file://`` store of 1 MiB volumes, init the
    catalog; return the store directory."""
    _, store = file_archive_config(site.tmp, site.data, volume_size="1MiB")
    site.ok("init", "--no-checks")
    return store


def test_a_lost_catalog_and_manifest_pair_is_an_audit_error_naming_the_restorable_set(site):
    store = _archiving(site)
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

    # the advice: a new chain. The newest snapshot restores again; the manifest-less
    # directory is deleted by that archive run, the finished streams after it (manifests,
    # no progress.json) are kept and reported; @4..@8 cannot come back from this store.
    site.ok("archive", "--full")
    assert not [p for p in lost.rglob("*") if p.is_file()]
    status, out, err = site.run("audit")
    assert status == ExitStatus.OK, out + err
    assert "restorable: @0..@3, @9 (5)" in out
    back = f"{site.pool}/back"
    site.ok("restore", "--to", "@9", "--into", back, "--from", "cold", "--yes")
    assert snapshots(back) == ["9"]                    # the new chain's full @9
    assert prop(f"{back}@9", "guid") == prop(f"{site.data}@9", "guid")
    assert restored_content(back) == content_of(f"{site.data}@9", site.pool, "nine")
    status, out, err = site.run("restore", "--to", "@5", "--into", f"{site.pool}/five",
                                "--from", "cold", "--yes")
    assert status != ExitStatus.OK


def test_an_archive_run_before_the_catalog_is_rebuilt_deletes_none_of_the_history(site):
    """The catalog is lost and the nightly `zbak archive` runs before anyone notices: it
    starts a new chain, but every stream folder the empty catalog does not know stays, so
    `zbak catalog rebuild --merge` brings all of them back and @1 still restores."""
    store = _archiving(site)
    for step in range(3):
        site.snapshot_steps(range(step, step + 1), 1 * MIB)
        site.ok("archive")
    before = {p.relative_to(store) for p in store.rglob("*") if p.is_file()
              and "catalog" not in p.name}
    expected = content_of(f"{site.data}@1", site.pool, "one")
    for db in (site.tmp / "state").glob("catalog.sqlite*"):
        db.unlink()
    site.ok("init", "--no-checks")
    site.snapshot_steps(range(3, 4), 1 * MIB)
    status, out, err = site.run("archive")  # the nightly run, before any rebuild
    after = {p.relative_to(store) for p in store.rglob("*") if p.is_file()}
    assert before <= after, f"deleted: {sorted(map(str, before - after))}; {out}{err}"
    assert "not in the catalog: kept" in err
    status, out, err = site.run("catalog", "rebuild", "cold", "--merge")
    assert status == ExitStatus.OK, out + err
    site.ok("restore", "--to", "@1", "--into", f"{site.pool}/one", "--from", "cold", "--yes")
    assert restored_content(f"{site.pool}/one") == expected
