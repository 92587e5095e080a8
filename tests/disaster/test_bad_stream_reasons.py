"""A stream marked bad keeps the reason it was marked for, and a refused restore states it.

A chain @0..@9 is archived night by night to a ``file://`` store in 256 KiB volumes, by
``zbak`` processes as cron runs them. Then the store loses something, ``zbak audit`` finds it
and marks the stream bad, and ``zbak restore --to @9`` must refuse with that reason and the
object's key: a missing volume is not "zfs receive rejected its content" (nothing was
received). The reasons of the other markers (a volume of another size, another checksum)
are checked the same way through ``zbak list streams``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support.cli import file_archive_config

from zrepl_py.errors import ExitStatus

pytestmark = [pytest.mark.zfs, pytest.mark.slow]



@pytest.fixture
def nightly(site):
    """@0..@9 archived one night at a time: full @0, then -I @n-1 -> @n for each n."""
    _, store = file_archive_config(site.tmp, site.data, volume_size="256KiB")
    site.ok("init", "--no-checks")
    for step in range(10):
        site.snapshot_steps(range(step, step + 1), 600 * 1024)
        site.ok("archive")
    return site, store


def stream_rows(site) -> list[dict]:
    return json.loads(site.ok("list", "streams", "--json"))


def carrying(site, name: str) -> dict:
    """The incremental (``list streams`` row) whose to-snapshot is ``name``."""
    return next(s for s in stream_rows(site) if s["to_name"] == name and s["kind"] == "incremental")


def volume_files(store: Path, stream: dict) -> list[Path]:
    return sorted((store / stream["object_prefix"]).glob("vol-*.zst"))


def test_a_restore_refused_after_audit_found_a_volume_missing_says_it_is_missing(nightly):
    site, store = nightly
    lost = carrying(site, "4")
    victim = volume_files(store, lost)[1]
    key = str(victim.relative_to(store))
    victim.unlink()

    audit = site.run("audit")
    assert audit.returncode == ExitStatus.AUDIT_FINDINGS, audit.stdout + audit.stderr

    into = f"{site.pool}/back"
    done = site.run("restore", site.data, "--to", "@9", "--into", into, "--from", "cold",
                "--yes")
    assert done.returncode != ExitStatus.OK, done.stdout + done.stderr
    said = done.stdout + done.stderr
    assert f"stream {lost['id']} (incremental @4) is marked bad" in said, said
    assert "missing" in said and key in said, said
    assert "zfs receive" not in said, said
    assert subprocess.run(["zfs", "list", into], capture_output=True).returncode != 0


def test_each_marker_records_its_own_reason_with_the_objects_key(nightly):
    """A volume truncated (the listing's size differs: ``zbak audit``) and a volume whose
    bytes changed at the same size (``zbak audit --deep`` reads it): each stream's row says
    which, naming the volume's key."""
    site, store = nightly
    shrunk, altered = carrying(site, "3"), carrying(site, "7")
    short = volume_files(store, shrunk)[0]
    short.write_bytes(short.read_bytes()[:-100])
    flipped = volume_files(store, altered)[0]
    body = bytearray(flipped.read_bytes())
    body[len(body) // 2] ^= 0x01
    flipped.write_bytes(bytes(body))

    assert site.run("audit").returncode == ExitStatus.AUDIT_FINDINGS
    assert site.run("audit", "--deep").returncode == ExitStatus.AUDIT_FINDINGS
    rows = {s["id"]: s for s in stream_rows(site)}
    size = rows[shrunk["id"]]
    assert size["state"] == "bad", size
    assert str(short.relative_to(store)) in size["bad_reason"], size
    assert "bytes" in size["bad_reason"] and "catalog records" in size["bad_reason"], size
    digest = rows[altered["id"]]
    assert digest["state"] == "bad", digest
    assert str(flipped.relative_to(store)) in digest["bad_reason"], digest
    assert "SHA-256" in digest["bad_reason"] or "damaged" in digest["bad_reason"], digest
    assert "found by zbak audit" in digest["bad_reason"], digest
