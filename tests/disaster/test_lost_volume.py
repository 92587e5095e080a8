"""docs/decisions.md#a-damaged-chain-is-never-extended, a lost incremental: a volume of the stream
carrying @4 is deleted from the store.

The chain @0..@9 is archived night by night (a full of @0, then one incremental per
snapshot, 256 KiB volumes so each incremental has volumes of its own). Once a volume of
``-I @3 -> @4`` is gone, @4..@9 cannot be restored from the store. What must hold:

* the next ``zbak archive`` finds the loss itself (one listing per stream prefix), marks the
  stream ``bad`` with an alert event naming it, and writes a NEW FULL of the newest snapshot,
  saying why; it never extends the broken chain;
* ``zbak restore --from cold`` refuses @6 (old tail) but restores @10 (new full) and @3 (the
  old chain up to the loss);
* ``zbak audit`` reports the loss (exit 4) and ``zbak list streams`` shows the stream bad;
* ``zbak archive --full`` on an up-to-date chain writes a full;
* ``zbak audit`` alone (objects level) marks a stream with a lost volume bad, and
  ``zbak audit --deep`` a stream whose volume holds other bytes of the same size;
* a manifest lost with its copy starts a new full too, the stream staying restorable.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest
from conftest import content_of, restored_content
from support.cli import InProcessZbak, file_archive_config

from zrepl_py.archive import job as archive_job
from zrepl_py.errors import ExitStatus

pytestmark = [pytest.mark.zfs, pytest.mark.slow]



@pytest.fixture
def nightly(site, webhook):
    """@0..@9 archived one night at a time: full @0, then -I @n-1 -> @n for each n; alerts
    go to ``webhook``."""
    _, store = file_archive_config(site.tmp, site.data, volume_size="256KiB",
                                   extra=f'[alerts.webhook]\nurl = "{webhook.url}"\n')
    site.ok("init", "--no-checks")
    for step in range(10):
        site.snapshot_steps(range(step, step + 1), 600 * 1024)
        site.ok("archive")
    return site, store


def streams(site) -> list[dict]:
    return json.loads(site.ok("list", "streams", "--json"))


def carrying(site, name: str) -> dict:
    """The stream (``list streams`` row) whose to-snapshot is ``name`` and kind incremental."""
    return next(s for s in streams(site) if s["to_name"] == name and s["kind"] == "incremental")


def volume_files(store, stream: dict) -> list:
    return sorted((store / stream["object_prefix"]).glob("vol-*.zst"))


def restore(site, snap: str, into: str):
    return site.run("restore", site.data, "--to", f"@{snap}", "--into", f"{site.pool}/{into}",
                    "--from", "cold", "--yes")


def test_a_lost_volume_makes_the_next_archive_mark_the_stream_bad_and_start_a_new_full(
        nightly, webhook):
    site, store = nightly
    lost = carrying(site, "4")
    victims = volume_files(store, lost)
    assert len(victims) >= 2, "the @4 incremental should span several volumes"
    victims[1].unlink()
    site.snapshot_steps(range(10, 11), 600 * 1024)

    out = site.ok("archive", "--json")
    rows = json.loads(out)["rows"]
    assert [r["stream"] for r in rows] == ["full @10"], rows
    reason = rows[0]["reason"]
    assert f"stream {lost['id']} (@4)" in reason and "missing" in reason
    assert victims[1].name in reason and "marked bad" in reason
    bad_events = [b for b in webhook.bodies
                  if b["kind"] == "failure" and f"stream {lost['id']} " in b["message"]]
    assert len(bad_events) == 1 and bad_events[0]["action"] == "archive"
    assert "marked bad" in bad_events[0]["message"]

    by_name = {(s["kind"], s["to_name"]): s for s in streams(site)}
    assert by_name[("incremental", "4")]["state"] == "bad"
    assert by_name[("full", "10")]["state"] == "uploaded"
    assert ("incremental", "10") not in by_name, "the broken chain was extended"

    status, out, err = restore(site, "6", "r6")
    assert status != ExitStatus.OK, out + err
    assert f"{site.pool}/r6" not in site.run("list", "snapshots", "--json")[1]
    for snap in ("10", "3"):
        status, out, err = restore(site, snap, f"r{snap}")
        assert status == ExitStatus.OK, out + err
        assert restored_content(f"{site.pool}/r{snap}") == content_of(
            f"{site.data}@{snap}", site.pool, snap)

    status, out, err = site.run("audit", "--json")
    assert status == ExitStatus.AUDIT_FINDINGS, out + err
    findings = json.loads(out)["findings"]
    assert any(f["stream"] == lost["id"] and f["severity"] == "error"
               and (f["key"] or "").endswith(victims[1].name) for f in findings), findings

    # The new chain is up to date after an incremental: --full still writes a full.
    site.snapshot_steps(range(11, 12), 64 * 1024)
    assert [r["stream"] for r in json.loads(site.ok("archive", "--json"))["rows"]] == [
        "incremental -I @10 -> @11"]
    assert "up to date" in json.loads(site.ok("archive", "--json"))["rows"][0]["reason"]
    rows = json.loads(site.ok("archive", "--full", "--json"))["rows"]
    assert [(r["stream"], r["reason"]) for r in rows] == [("full @11", "--full")]
    rows = json.loads(site.ok("archive", "--full", "--json"))["rows"]
    assert rows[0]["stream"] == "" and "already starts with a full of @11" in rows[0]["reason"]


def test_a_volume_lost_after_a_long_runs_listing_is_found_before_its_chain_is_extended(
        nightly, monkeypatch, capsys):
    """An archive run lists the job's tree in the store once; a run that spent hours on a
    large full of another dataset first would check this dataset's chain against a listing
    that old. Once it is ``RELIST_AFTER`` old the dataset's prefix is listed again, so a
    volume lost in between is found and the chain is not extended (the test ages the
    listing to 0 and loses the volume right after the tree was listed).

    In-process, with two patches of ``archive.job`` (docs/reliability.md#in-process-hooks-kept): the
    loss must land between two reads of one run, and the re-listing age is hours; no
    process boundary or wrapper reaches either."""
    site, store = nightly
    lost = carrying(site, "8")
    victim = volume_files(store, lost)[0]
    read = archive_job._Tree.read

    def read_then_lose(cls, *args, **kwargs):
        tree = read(*args, **kwargs)
        victim.unlink()
        return tree

    monkeypatch.setattr(archive_job._Tree, "read", classmethod(read_then_lose))
    monkeypatch.setattr(archive_job, "RELIST_AFTER", dt.timedelta(0))
    site.snapshot_steps(range(10, 11), 64 * 1024)
    status, out, err = InProcessZbak(site.config, capsys)("archive", "--json")
    assert status == ExitStatus.OK, out + err
    rows = json.loads(out)["rows"]
    assert [r["stream"] for r in rows] == ["full @10"], rows
    assert f"stream {lost['id']} (@8)" in rows[0]["reason"] and victim.name in rows[0]["reason"]
    by_name = {(s["kind"], s["to_name"]): s for s in streams(site)}
    assert by_name[("incremental", "8")]["state"] == "bad"
    assert ("incremental", "10") not in by_name, "the broken chain was extended"


def test_audit_marks_a_stream_with_a_lost_volume_bad_and_deep_one_with_altered_bytes(
        nightly, webhook):
    site, store = nightly
    lost, altered = carrying(site, "4"), carrying(site, "7")
    volume_files(store, lost)[0].unlink()
    path = volume_files(store, altered)[0]
    body = bytearray(path.read_bytes())
    body[len(body) // 2] ^= 0x01
    path.write_bytes(bytes(body))

    status, out, err = site.run("audit", "--json")
    assert status == ExitStatus.AUDIT_FINDINGS, out + err
    state = {s["id"]: s["state"] for s in streams(site)}
    assert state[lost["id"]] == "bad" and state[altered["id"]] != "bad"
    status, out, err = site.run("audit", "--deep", "--json")
    assert status == ExitStatus.AUDIT_FINDINGS, out + err
    assert {s["id"]: s["state"] for s in streams(site)}[altered["id"]] == "bad"
    marked = [b for b in webhook.bodies if b["kind"] == "failure" and "marked bad" in b["message"]]
    assert sorted(b["message"].split()[1] for b in marked) == sorted(
        [str(lost["id"]), str(altered["id"])])

    rows = json.loads(site.ok("archive", "--json"))["rows"]
    assert [r["stream"] for r in rows] == ["full @9"], rows
    assert f"stream {lost['id']} (@4)" in rows[0]["reason"] and "missing" in rows[0]["reason"]


def test_a_lost_manifest_and_copy_start_a_new_full_but_leave_the_stream_restorable(nightly):
    site, store = nightly
    stream = carrying(site, "4")
    for leaf in ("manifest.json", "manifest.json.copy"):
        (store / stream["object_prefix"] / leaf).unlink()
    rows = json.loads(site.ok("archive", "--json"))["rows"]
    assert [r["stream"] for r in rows] == ["full @9"], rows
    assert "manifest.json and manifest.json.copy are missing" in rows[0]["reason"]
    assert {s["id"]: s["state"] for s in streams(site)}[stream["id"]] == "uploaded"
