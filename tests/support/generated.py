"""A catalog and a ``file://`` store as ``zbak archive`` builds them, written directly at any
size: for the CLI tests of long outputs and audit stamps, and for benchmarks/catalog.py
(100,000 streams and more, which no test could archive through zfs).

Per dataset ``ROOT/dsNNNNN``: ``chains`` chains of ``chain_length`` streams (a full of three
volumes, then ``-I`` incrementals of one volume carrying two snapshots each), the next
chain's full one snapshot after the last chain's tip; every snapshot in the snapshots table
(the oldest quarter destroyed); one successful archive run. The older chains are
``verified`` (a day before ``now``), the newest ``uploaded``. The store holds every volume
(a sparse file of the recorded size) and each stream's ``manifest.json`` and
``manifest.json.copy`` (checksummed, agreeing with the catalog). Rows are plain bulk INSERTs
within the database's constraints; guids are deterministic.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from pathlib import Path

import sqlalchemy as sa

from zrepl_py.catalog.models import (
    dataset_table,
    run_table,
    snapshot_table,
    stream_snapshot_table,
    stream_table,
    volume_table,
)
from zrepl_py.objects.layout import MANIFEST, MANIFEST_COPY, stream_prefix, volume_key
from zrepl_py.objects.manifest import CarriedSnapshot, Manifest, VolumeRecord

HOST = "local"


def guid(dataset: int, snap: int) -> int:
    """A deterministic, well-spread unsigned 64-bit guid."""
    return int.from_bytes(hashlib.blake2b(f"{dataset}/{snap}".encode(), digest_size=8).digest(),
                          "big") or 1


def snapshot_name(snap: int) -> str:
    return f"zbak_{snap:05d}"


class Generated:
    """Rows and objects of a generated archive (module docstring), written in batches.

    Args:
        engine: a migrated, empty catalog.
        store: the ``file://`` store's directory.
        root: the job's dataset; datasets are ``ROOT/dsNNNNN``.
        store_name / job: the store's and the job's names in the config.
        chains / chain_length: per dataset.
        now: aware UTC; the newest snapshot is two hours before.
    """

    def __init__(self, engine: sa.Engine, store: Path, root: str, *, store_name: str = "cold",
                 job: str = "data", chains: int = 4, chain_length: int = 25,
                 now: dt.datetime | None = None):
        self.engine, self.store, self.root = engine, store, root
        self.store_name, self.job = store_name, job
        self.chains, self.chain_length = chains, chain_length
        self.now = now or dt.datetime.now(dt.UTC)
        self.rows: dict[sa.Table, list[dict]] = {m: [] for m in (dataset_table, snapshot_table,
                                                             stream_table, volume_table,
                                                             stream_snapshot_table, run_table)}
        self.ids = {m: 0 for m in self.rows}

    full_volumes = [(1000, 100)] * 3
    """``(raw bytes, stored bytes)`` of each volume of a full; a subclass may change it."""
    incremental_volumes = [(2000, 200)]
    """The same of an incremental."""

    def write_volume(self, path: Path, stored: int) -> str:
        """Write the volume file ``path`` of ``stored`` bytes; its recorded SHA-256 (hex).
        Here a sparse file, recorded with the SHA-256 of its path (no command here reads
        it); a subclass may write real bytes."""
        with open(path, "wb") as handle:
            handle.truncate(stored)
        return hashlib.sha256(str(path.relative_to(self.store)).encode()).hexdigest()

    def _add(self, table: sa.Table, **row) -> int:
        self.ids[table] += 1
        self.rows[table].append({"id": self.ids[table], **row})
        return self.ids[table]

    def flush(self) -> None:
        """Insert the rows gathered so far."""
        with self.engine.begin() as conn:
            for table, rows in self.rows.items():
                for start in range(0, len(rows), 20_000):
                    conn.execute(sa.insert(table), rows[start:start + 20_000])
                rows.clear()

    def datasets(self, count: int, *, flush_every: int = 50) -> None:
        """Add datasets ``ds00001 .. dsCOUNT`` and flush."""
        for d in range(1, count + 1):
            self.dataset(d)
            if d % flush_every == 0:
                self.flush()
        self.flush()

    def dataset(self, d: int) -> None:
        """Add dataset ``ds{d:05d}``: its snapshots, chains, objects and archive run."""
        name = f"{self.root}/ds{d:05d}"
        dataset_id = self._add(dataset_table, host=HOST, name=name)
        per_chain = 1 + 2 * (self.chain_length - 1)
        count = self.chains * (per_chain + 1)
        start = self.now - dt.timedelta(hours=count + 2)

        def created(s: int) -> dt.datetime:
            return start + dt.timedelta(hours=s)

        for s in range(count):
            self._add(snapshot_table, dataset_id=dataset_id, name=snapshot_name(s), guid=guid(d, s),
                      createtxg=100 + 10 * s, creation=created(s), first_seen=created(s),
                      destroyed_at=self.now - dt.timedelta(days=1) if s < count // 4 else None)
        snap = 0
        for c in range(self.chains):
            newest_chain = c == self.chains - 1
            parent = None
            for i in range(self.chain_length):
                full = i == 0
                carried = [snap] if full else [snap + 1, snap + 2]
                parent = self._stream(d, dataset_id, name, snap, carried, parent,
                                      created(carried[-1]), newest_chain)
                snap = carried[-1]
            snap += 1  # the next chain's full is of the snapshot after this chain's tip
        last_tip = snap - 1
        self._add(run_table, job=self.job, action="archive", target=f"{self.store_name}:{name}",
                  started_at=created(last_tip) + dt.timedelta(minutes=30),
                  ended_at=created(last_tip) + dt.timedelta(minutes=35), result="ok", bytes=0,
                  error=None)

    def _stream(self, d: int, dataset_id: int, name: str, base: int, carried: list[int],
                parent: int | None, when: dt.datetime, newest_chain: bool) -> int:
        full = parent is None
        to = carried[-1]
        prefix = stream_prefix(HOST, name, to_createtxg=100 + 10 * to, to_guid=guid(d, to),
                               from_guid=None if full else guid(d, base))
        sizes = self.full_volumes if full else self.incremental_volumes
        stream_id = self._add(
            stream_table, dataset_id=dataset_id, store=self.store_name,
            kind="full" if full else "incremental", parent_id=parent,
            from_guid=None if full else guid(d, base), to_guid=guid(d, to),
            from_name=None if full else snapshot_name(base), to_name=snapshot_name(to),
            to_createtxg=100 + 10 * to, raw_bytes=sum(r for r, _ in sizes),
            stored_bytes=sum(s for _, s in sizes), object_prefix=prefix,
            storage_class="STANDARD", compression="zstd",
            state="uploaded" if newest_chain else "verified", created_at=when,
            uploaded_at=when,
            verified_at=None if newest_chain else self.now - dt.timedelta(days=1))
        volumes = []
        for v, (raw, stored) in enumerate(sizes):
            key = volume_key(prefix, v)
            path = self.store / key
            path.parent.mkdir(parents=True, exist_ok=True)
            sha = self.write_volume(path, stored)
            self._add(volume_table, stream_id=stream_id, index=v, key=key, raw_bytes=raw,
                      stored_bytes=stored, sha256=sha)
            volumes.append(VolumeRecord(v, key, raw, stored, sha))
        snaps = tuple(CarriedSnapshot(snapshot_name(s), guid(d, s), 100 + 10 * s)
                      for s in carried)
        for snap in snaps:
            self._add(stream_snapshot_table, stream_id=stream_id, name=snap.name, guid=snap.guid,
                      createtxg=snap.createtxg)
        manifest = Manifest(
            host=HOST, dataset=name, kind="full" if full else "incremental",
            from_snap=None if full else CarriedSnapshot(snapshot_name(base), guid(d, base),
                                                        100 + 10 * base),
            to_snap=snaps[-1], snapshots=snaps, volumes=tuple(volumes), compression="zstd",
            compression_level=3, send_flags=() if full else ("-I",), storage_class="STANDARD",
            tool="zbak generated", created_at=when).to_json()
        (self.store / (prefix + MANIFEST)).write_bytes(manifest)
        (self.store / (prefix + MANIFEST_COPY)).write_bytes(manifest)
        return stream_id


def archive_config(path: Path, *, state: Path, store: Path, root: str, job: str = "data",
                   store_name: str = "cold", keep_chains: int = 2) -> Path:
    """Write a config with one recursive job over ``root`` archiving to the store."""
    path.write_text(f"""\
state_dir = "{state}"

[stores.{store_name}]
url = "file://{store}"

[jobs.{job}]
dataset = "{root}"
recursive = true

[jobs.{job}.archive]
store = "{store_name}"
keep_chains = {keep_chains}
""")
    path.chmod(0o600)
    return path
