"""What ``zbak audit`` trusts from a listing
(docs/decisions.md#audit-trusts-a-manifest-whose-listing-has-not-changed): a manifest it read and
found agreeing is not read again while the store lists it unchanged, but a changed one is read
again, and so is one whose read is older than its share of 30 days. The catalog and the ``file://``
store are generated (tests/support/generated.py), 2 datasets x 2 chains x 10 streams."""

from __future__ import annotations

import datetime as dt
import json
import os
import time

import pytest
import sqlalchemy as sa
from support.cli import Zbak
from support.generated import Generated, archive_config
from support.postgres import migrated_engine

from zrepl_py.catalog.db import make_engine
from zrepl_py.catalog.models import stream_table
from zrepl_py.errors import ExitStatus
from zrepl_py.objects.layout import MANIFEST

STREAMS = 2 * 2 * 10


@pytest.fixture
def store_and_run(tmp_path, capsys):
    state, store = tmp_path / "state", tmp_path / "store"
    state.mkdir(mode=0o700)
    store.mkdir()
    config = archive_config(tmp_path / "zbak.toml", state=state, store=store, root="tank/st")
    with migrated_engine(f"sqlite:///{state / 'catalog.sqlite'}") as engine:
        Generated(engine, store, "tank/st", chains=2, chain_length=10).datasets(2)
    return store, Zbak(config, capsys), state / "catalog.sqlite"


def audit(run) -> tuple[dict, list[dict]]:
    status, out, err = run("audit", "--json")
    doc = json.loads(out)
    return doc["jobs"][0]["manifests"], doc["findings"] if status != ExitStatus.OK else []


def test_the_first_audit_reads_every_manifest_and_the_next_trusts_the_unchanged_ones(
        store_and_run):
    _, run, _ = store_and_run
    assert audit(run) == ({"read": STREAMS, "trusted": 0}, [])
    assert audit(run) == ({"read": 0, "trusted": STREAMS}, [])


def test_a_manifest_changed_behind_zbaks_back_is_read_again_and_its_damage_reported(
        store_and_run):
    """Same size, one byte flipped in place: the listing shows another identity (the
    file's ctime), so that one manifest is read again and fails its checksum (its copy is
    used, a warning); the other manifests stay trusted."""
    store, run, _ = store_and_run
    audit(run)
    victim = sorted(store.rglob(MANIFEST))[7]
    data = bytearray(victim.read_bytes())
    at = data.index(b'"tool"') + 10
    data[at] ^= 0x01
    with open(victim, "r+b") as handle:  # in place: same inode, size and (set back) mtime
        handle.write(bytes(data))
    stat = victim.stat()
    os.utime(victim, ns=(stat.st_atime_ns, stat.st_mtime_ns - 10**9))
    manifests, findings = audit(run)
    assert manifests == {"read": 1, "trusted": STREAMS - 1}
    assert [f["severity"] for f in findings] == ["warning"]
    assert "fails its checks" in findings[0]["problem"] and "its copy is used" in findings[0]["problem"]
    # still wrong, so still read (no stamp kept for it), until it is repaired
    assert audit(run)[0] == {"read": 1, "trusted": STREAMS - 1}
    victim.write_bytes(victim.with_name(MANIFEST + ".copy").read_bytes())
    assert audit(run) == ({"read": 1, "trusted": STREAMS - 1}, [])
    assert audit(run) == ({"read": 0, "trusted": STREAMS}, [])


def test_a_manifest_replaced_by_one_disagreeing_with_the_catalog_is_read_and_reported(
        store_and_run):
    """A manifest rewritten whole (a checksummed one, of another stream) is no longer the object
    the audit read: read again, and the disagreement with the catalog is an error."""
    store, run, _ = store_and_run
    audit(run)
    first, second = sorted(store.rglob(MANIFEST))[3:5]
    time.sleep(0.01)
    first.write_bytes(second.read_bytes())
    manifests, findings = audit(run)
    assert manifests == {"read": 1, "trusted": STREAMS - 1}
    assert [f["severity"] for f in findings] == ["error"]
    assert "disagrees with the catalog" in findings[0]["problem"]


def test_a_read_older_than_its_share_of_thirty_days_is_read_again(store_and_run):
    _, run, db = store_and_run
    audit(run)
    engine = make_engine(f"sqlite:///{db}")
    old = dt.datetime.now(dt.UTC) - dt.timedelta(days=31)
    with engine.begin() as conn:
        conn.execute(sa.update(stream_table).where(stream_table.c.id.in_([2, 5, 9]))
                     .values(manifest_read_at=old))
    engine.dispose()
    assert audit(run)[0] == {"read": 3, "trusted": STREAMS - 3}
    assert audit(run)[0] == {"read": 0, "trusted": STREAMS}


def test_deep_reads_every_manifest_whatever_the_stamps(store_and_run):
    """--deep re-reads volumes and manifests alike (the generated volumes are not zstd, so
    the deep level marks them bad: only the manifest count matters here)."""
    _, run, _ = store_and_run
    audit(run)
    status, out, err = run("audit", "--deep", "--json")
    assert json.loads(out)["jobs"][0]["manifests"] == {"read": STREAMS, "trusted": 0}
