"""docs/reliability.md#r7-a-failing-pipeline-stage-is-detected,
docs/reliability.md#r8-truncated-stream-object, docs/reliability.md#r9-bit-flip-in-an-object,
docs/reliability.md#r10-trailing-garbage-after-the-last-frame-is-rejected,
docs/reliability.md#r11-flaky-read, docs/reliability.md#r12-valid-zstd-around-an-invalid-zfs-stream,
docs/reliability.md#r18-zero-length-object on the archive and restore path, with real zfs-fuse
pools, a real ``file://`` store (and moto's S3 for the zero-length stream) and faults injected by
wrapping: ``support.backend.FaultyBackend`` around the store the restore opens,
``support.executor`` stage wrappers around the real ``zfs send``.

How the faulty store reaches ``zbak restore``: the command runs as a process under
``support/crash_runner.py`` (``support.cli.faulty_zbak``), which opens every store wrapped in
a ``FaultyBackend`` with the faults the test names and logs each store call to a file; the
store, the CLI and the restore code are unchanged. A ``FaultyBackend`` has no
``local_path``, so the volumes are downloaded through ``get`` into the spool and verified
there, as from S3.

Three tests of the restore's read-ahead
(docs/decisions.md#restore-verifies-each-volume-before-it-is-received-and-reads-ahead) watch the
order of its receive threads and decodes inside one process: they run ``main()`` in-process
with ``restore.execute``'s ``ReceiveWriter`` and ``decompress_frame`` wrapped by
``monkeypatch``, the one kind of hook a process boundary hides
(docs/reliability.md#in-process-hooks-kept).
"""

from __future__ import annotations

import json
import os
import random
import threading
from pathlib import Path

import pytest
import zstandard
from support.archive_checks import catalog_of, catalogued, store_state
from support.backend import FaultyBackend
from support.cli import (
    InProcessZbak,
    Ran,
    Zbak,
    faulty_zbak,
    file_archive_config,
    gone,
    prop,
    snapshots,
    zfs,
)
from support.executor import cut_stage, fail_at_end_stage, flip_stage, garbage_stage, stderr_stage
from support.procwatch import cmdline, descendants

from zrepl_py.archive.planner import PlannedStream
from zrepl_py.archive.writer import StreamSpec, write_stream
from zrepl_py.clock import SystemClock
from zrepl_py.errors import ExitStatus, PipelineFailed, StoreError, StreamCorrupt
from zrepl_py.objects.layout import MANIFEST, PROGRESS, stream_prefix
from zrepl_py.objects.manifest import CarriedSnapshot
from zrepl_py.proc.pipeline import Stage
from zrepl_py.restore import execute as restore_execute
from zrepl_py.restore.fetch import VolumeFetch
from zrepl_py.stores import registry as store_registry
from zrepl_py.stores.file import FileBackend
from zrepl_py.streams.codec import Codec
from zrepl_py.streams.frames import decompress_frame

pytestmark = pytest.mark.zfs

KiB = 1 << 10
MiB = 1 << 20




@pytest.fixture
def setup(zpool, tmp_path):
    """``POOL/data`` with @0, @1, @2 (about 300 KB each of random data), a ``file://`` store
    named ``cold``, a config and an initialised catalog; nothing archived yet."""
    data = f"{zpool.name}/data"
    zfs("create", data)
    mount = Path(prop(data, "mountpoint"))
    for step in range(3):
        (mount / f"f{step}.bin").write_bytes(os.urandom(300 * KiB))
        zfs("snapshot", f"{data}@{step}")
    config, store = file_archive_config(tmp_path, data, volume_size="1MiB")
    run = Zbak(config)
    status, out, err = run("init", "--no-checks")
    assert status == ExitStatus.OK, out + err
    return run, zpool, data, store


@pytest.fixture
def archived(setup):
    """``setup`` archived: a full @0 and an incremental -I @0 -> @2 in ``cold``."""
    run, pool, data, store = setup
    status, out, err = run("archive")
    assert status == ExitStatus.OK, out + err
    return setup


class FaultyRun:
    """Runs ``zbak --config CONFIG ARGS`` as a process whose stores read through a
    ``FaultyBackend`` with ``faults`` (``support.cli.faulty_zbak``); ``calls()`` are the
    store calls of every run so far, ``(op, key)``."""

    def __init__(self, config: Path, log: Path, **faults: object):
        self.config, self.log, self.faults = config, log, faults

    def __call__(self, *args: str) -> Ran:
        faults = {k: (v.hex() if isinstance(v, bytes) else v) for k, v in self.faults.items()}
        return faulty_zbak("--config", str(self.config), *args,
                           env={"ZBAK_FAULT_STORE": json.dumps(faults),
                                "ZBAK_FAULT_CALLS": str(self.log)})

    def calls(self) -> list[tuple[str, str]]:
        text = self.log.read_text() if self.log.exists() else ""
        return [tuple(line.split("\t", 1)) for line in text.splitlines()]


@pytest.fixture
def faulty_store(tmp_path):
    """Call with ``FaultyBackend`` keyword arguments (``keys`` a substring): a ``FaultyRun``
    of the test's config whose stores have those faults."""
    return lambda run, **faults: FaultyRun(run.config, tmp_path / "store-calls.log", **faults)


def _in_process_faults(monkeypatch, **faults) -> list[FaultyBackend]:
    """Wrap every store ``main()`` opens in this process in a FaultyBackend with ``faults``
    (only for the read-ahead tests, see the module docstring)."""
    made: list[FaultyBackend] = []
    real = store_registry.open_store

    def open_store(*args, **kwargs):
        made.append(FaultyBackend(real(*args, **kwargs), **faults))
        return made[-1]

    monkeypatch.setattr(store_registry, "open_store", open_store)
    return made


def newest_volume(store: Path) -> tuple[str, int]:
    """Key and size of the last volume of the incremental (the chain's newest stream)."""
    state = store_state(FileBackend("cold", store))
    key = max(k for k in state.objects if "-incr-" in k and "/vol-" in k)
    return key, state.objects[key]


def restore_refused(run, pool, data, into: str) -> str:
    status, out, err = run("restore", data, "--to", "@2", "--into", into, "--from", "cold",
                           "--yes")
    assert status == ExitStatus.FAILED, out + err
    assert gone(into), "a refused restore must receive nothing"
    return err


# -- 8, 9, 10: truncated, flipped, extended objects -----------------------------------------


def test_a_zstd_decoder_fed_a_truncated_frame_succeeds_silently_so_the_frame_end_check_is_needed():
    """docs/reliability.md#r8-truncated-stream-object, the pitfall behind it: zstandard's
    decompressobj returns a prefix without error."""
    raw = random.Random(8).randbytes(200 * KiB)
    frame = zstandard.ZstdCompressor(write_checksum=True).compress(raw)
    cut = frame[: len(frame) // 2]
    prefix = zstandard.ZstdDecompressor().decompressobj().decompress(cut)
    assert raw.startswith(prefix)  # no exception: a "successful" partial decode
    with pytest.raises(StreamCorrupt, match="truncated"):
        b"".join(decompress_frame([cut], "vol"))


@pytest.mark.parametrize("where", ["after-header", "middle", "last-byte"])
def test_a_volume_read_truncated_past_the_frame_header_is_refused_and_nothing_is_received(
        archived, faulty_store, where):
    """docs/reliability.md#r8-truncated-stream-object: the store's stat says the full size, the read
    stops early; the restore refuses with the volume named and no dataset is created."""
    run, pool, data, store = archived
    key, size = newest_volume(store)
    offset = {"after-header": 18, "middle": random.Random(size).randrange(19, size - 1),
              "last-byte": size - 1}[where]
    faulty = faulty_store(run, truncate_at=offset, keys=key)
    err = restore_refused(faulty, pool, data, f"{pool.name}/r")
    assert key in err and "nothing was received" in err
    assert ("get", key) in faulty.calls()


def test_a_flipped_bit_in_a_volume_is_refused_and_nothing_is_received(archived, faulty_store):
    """docs/reliability.md#r9-bit-flip-in-an-object: one bit flipped on every read: SHA-256 differs
    from the catalog."""
    run, pool, data, store = archived
    key, size = newest_volume(store)
    err = restore_refused(faulty_store(run, flip_byte_at=size // 2, keys=key), pool, data,
                          f"{pool.name}/r")
    assert key in err and "SHA-256" in err


def test_a_bad_volume_found_while_the_first_stream_is_received_is_never_decoded_and_nothing_is_received(
        zpool, tmp_path, monkeypatch, capsys):
    """docs/decisions.md#restore-verifies-each-volume-before-it-is-received-and-reads-ahead, bounded
    read-ahead: the receive of the full (3 MiB, three 1 MiB volumes) starts before the
    incremental's volume is verified (its read waits until the first bytes went into zfs receive),
    that volume then fails its SHA-256, and the restore stops: the bad volume is never decoded, the
    full's receive is cancelled before its END record, and nothing exists."""
    data = f"{zpool.name}/data"
    zfs("create", data)
    mount = Path(prop(data, "mountpoint"))
    for step, size in enumerate((3 * MiB, 300 * KiB)):
        (mount / f"f{step}.bin").write_bytes(os.urandom(size))
        zfs("snapshot", f"{data}@{step}")
    config, store = file_archive_config(tmp_path, data, volume_size="1MiB")
    run = Zbak(config)
    for args in (("init", "--no-checks"), ("archive",)):
        status, out, err = run(*args)
        assert status == ExitStatus.OK, out + err
    key, size = newest_volume(store)
    receiving = threading.Event()
    decoded: list[str] = []

    class Watched(restore_execute.ReceiveWriter):
        def write(self, chunk: bytes) -> None:
            receiving.set()
            super().write(chunk)

    real_decode = restore_execute.Codec.decode

    def watched_decode(self, stored, what, *args, **kwargs):
        decoded.append(what)
        return real_decode(self, stored, what, *args, **kwargs)

    def bad_after_receive_started(candidate: str) -> bool:
        if candidate != key:
            return False
        assert receiving.wait(60), "the first stream's receive never started"
        return True

    monkeypatch.setattr(restore_execute, "ReceiveWriter", Watched)
    monkeypatch.setattr(restore_execute.Codec, "decode", watched_decode)
    _in_process_faults(monkeypatch, flip_byte_at=size // 2, keys=bad_after_receive_started)
    status, out, err = InProcessZbak(config, capsys)(
        "restore", data, "--to", "@1", "--into", f"{zpool.name}/r", "--from", "cold", "--yes")
    assert status == ExitStatus.FAILED, out + err
    assert gone(f"{zpool.name}/r"), "a refused restore must receive nothing"
    assert key in err and "SHA-256" in err and "nothing was received" in err
    assert receiving.is_set() and decoded, "the full was not being received meanwhile"
    assert not [what for what in decoded if what.endswith(key)], decoded


@pytest.fixture
def three_streams(zpool, tmp_path):
    """``POOL/data`` archived one snapshot at a time: a full @0 (3 MiB) and incrementals
    @0 -> @1 and @1 -> @2 (300 KiB each, less than the receive's 1 MiB pipe)."""
    data = f"{zpool.name}/data"
    zfs("create", data)
    mount = Path(prop(data, "mountpoint"))
    config, store = file_archive_config(tmp_path, data, volume_size="1MiB")
    run = Zbak(config)
    status, out, err = run("init", "--no-checks")
    assert status == ExitStatus.OK, out + err
    for step, size in enumerate((3 * MiB, 300 * KiB, 300 * KiB)):
        (mount / f"f{step}.bin").write_bytes(os.urandom(size))
        zfs("snapshot", f"{data}@{step}")
        status, out, err = run("archive")
        assert status == ExitStatus.OK, out + err
    return run, zpool, data


def _watch_receives(monkeypatch, after_finish=None) -> list:
    """Record ``("start"|"finish"|"finished", n)`` for the n-th ``ReceiveWriter`` of the
    restore; ``after_finish(n)`` runs once the n-th receive finished. Returns the writers
    (events in ``Watched.events``)."""
    writers: list = []

    class Watched(restore_execute.ReceiveWriter):
        events: list[tuple[str, int]] = []

        def __init__(self, stages, **kwargs):
            super().__init__(stages, **kwargs)
            writers.append(self)
            self.n = len(writers)

        def start(self):
            if self._thread.ident is None:
                self.events.append(("start", self.n))
            return super().start()

        def finish(self):
            self.events.append(("finish", self.n))
            super().finish()
            self.events.append(("finished", self.n))
            if after_finish is not None:
                after_finish(self.n)

    monkeypatch.setattr(restore_execute, "ReceiveWriter", Watched)
    return writers


def test_each_stream_s_receive_starts_while_the_stream_before_it_commits(
        three_streams, monkeypatch, capsys):
    """docs/decisions.md#restore-verifies-each-volume-before-it-is-received-and-reads-ahead:
    the receive of stream N+1 is started (its process waiting for its first
    byte) before stream N's receive has finished, so its start-up is off the critical path;
    every stream still lands in order and the restored snapshot has the source's guid, and
    no receive process is left."""
    run, pool, data = three_streams
    writers = _watch_receives(monkeypatch)
    into = f"{pool.name}/r"
    status, out, err = InProcessZbak(run.config, capsys)(
        "restore", data, "--to", "@2", "--into", into, "--from", "cold", "--yes")
    assert status == ExitStatus.OK, out + err
    assert prop(f"{into}@2", "guid") == prop(f"{data}@2", "guid")
    events = writers[0].events
    assert len(writers) == 3, events
    for n in (1, 2):
        assert events.index(("start", n + 1)) < events.index(("finished", n)), events
    assert not any(w._thread.is_alive() for w in writers)
    assert not [pid for pid in descendants(os.getpid())
                if "receive" in " ".join(cmdline(pid))]


def test_a_receive_started_early_for_a_stream_that_never_comes_is_cancelled_having_received_nothing(
        three_streams, monkeypatch, capsys):
    """docs/decisions.md#restore-verifies-each-volume-before-it-is-received-and-reads-ahead:
    stream 2 of 3 fails in ``zfs receive`` (its base @0, which stream 1 brought, is destroyed from
    the new dataset in between): the receive already started for stream 3 is cancelled, no receive
    process is left, and the error names stream 2 and what stream 1 had received."""
    run, pool, data = three_streams
    into = f"{pool.name}/r"

    def lose_the_base(n: int) -> None:
        if n == 1:
            zfs("destroy", f"{into}@0")

    writers = _watch_receives(monkeypatch, after_finish=lose_the_base)
    status, out, err = InProcessZbak(run.config, capsys)(
        "restore", data, "--to", "@2", "--into", into, "--from", "cold", "--yes")
    assert status == ExitStatus.FAILED, out + err
    assert "(@1)" in err and f"{into} holds the streams up to @0" in err, err
    events = writers[0].events
    assert ("start", 3) in events and ("finished", 2) not in events, events
    assert not any(w._thread.is_alive() for w in writers)
    assert not [pid for pid in descendants(os.getpid())
                if "receive" in " ".join(cmdline(pid))]
    assert snapshots(into) == []


def test_a_downloaded_volume_is_read_once_and_a_torn_spool_file_from_an_earlier_run_is_fetched_again(
        archived, tmp_path):
    """docs/decisions.md#restore-verifies-each-volume-before-it-is-received-and-reads-ahead:
    a remote volume is verified as it is written into the spool (one read of
    the store, and the spool file holds exactly the verified bytes); a spool file an earlier
    run left with the right size but other bytes (a crash before its pages reached the
    disk) is verified again, refused, and downloaded anew."""
    run, pool, data, store = archived
    with catalog_of(run.config) as catalog:
        volumes = [v for _, stream_volumes in catalogued(catalog, data) for v in stream_volumes]
    spool = tmp_path / "spool"
    faulty = FaultyBackend(FileBackend("cold", store))
    with VolumeFetch(faulty, volumes, spool, 2) as fetch:
        files = fetch.wait_all()
    for volume in volumes:
        assert faulty.calls.count(("get", volume.key)) == 1
        assert files[volume.id].read_bytes() == (store / volume.key).read_bytes()
    torn = files[volumes[0].id]
    torn.write_bytes(bytes(volumes[0].stored_bytes))
    again = FaultyBackend(FileBackend("cold", store))
    with VolumeFetch(again, volumes, spool, 2) as fetch:
        files = fetch.wait_all()
    assert files[volumes[0].id].read_bytes() == (store / volumes[0].key).read_bytes()
    assert again.calls.count(("get", volumes[0].key)) == 1
    assert [v.key for v in volumes if ("get", v.key) in again.calls] == [volumes[0].key]


class _HeldFirst(FaultyBackend):
    """A store whose first volume's ``get`` waits for ``release`` (set it, or it waits 60 s)
    and records which volumes had been asked for by then in ``asked_meanwhile``."""

    def __init__(self, inner, first: str):
        super().__init__(inner)
        self.first = first
        self.release = threading.Event()
        self.asked_meanwhile: list[str | None] = []

    def get(self, key: str, *, chunk_size: int = 1 << 20):
        if key == self.first:
            self.release.wait(60)
            self.asked_meanwhile = [k for op, k in self.calls if op == "get"]
        return super().get(key, chunk_size=chunk_size)


def _all_volumes(run, data: str) -> list:
    with catalog_of(run.config) as catalog:
        return [v for _, stream_volumes in catalogued(catalog, data) for v in stream_volumes]


def test_the_volumes_after_the_first_are_read_only_once_the_first_verified(
        three_streams, tmp_path):
    """docs/decisions.md#restore-verifies-each-volume-before-it-is-received-and-reads-ahead:
    nothing is received before the first volume verified, so it is read alone (the read-ahead would
    only take CPU, disk or network from it): while its read is held for 0.5 s no other volume is
    asked for, and afterwards every one verifies."""
    run, pool, data = three_streams
    volumes = _all_volumes(run, data)
    assert len(volumes) >= 4
    store = _HeldFirst(FileBackend("cold", tmp_path / "store"), volumes[0].key)
    threading.Timer(0.5, store.release.set).start()
    with VolumeFetch(store, volumes, tmp_path / "spool", 4) as fetch:
        files = fetch.wait_all()
    assert store.asked_meanwhile == [], store.asked_meanwhile
    assert sorted(files) == sorted(v.id for v in volumes)
    assert [k for op, k in store.calls if op == "get"][0] == volumes[0].key


def test_a_restore_stopped_while_the_first_volume_is_read_reads_no_other_volume(
        three_streams, tmp_path):
    """docs/decisions.md#restore-verifies-each-volume-before-it-is-received-and-reads-ahead:
    leaving ``VolumeFetch`` (an error, Ctrl-C) while the first volume is still being read stops the
    checks waiting for it: no other volume is downloaded."""
    run, pool, data = three_streams
    volumes = _all_volumes(run, data)
    store = _HeldFirst(FileBackend("cold", tmp_path / "store"), volumes[0].key)
    fetch = VolumeFetch(store, volumes, tmp_path / "spool", 4)
    threading.Timer(1.0, store.release.set).start()  # close() has begun long before
    fetch.close()
    assert [k for op, k in store.calls if op == "get"] == [volumes[0].key]


def test_of_several_missing_or_short_volumes_the_first_in_chain_order_is_named_and_none_is_read(
        three_streams, tmp_path):
    """The presence check stats the volumes several at a time (on S3 each stat is a round
    trip), yet names the first bad volume in chain order, and refuses before any is read."""
    run, pool, data = three_streams
    volumes = _all_volumes(run, data)
    store_dir = tmp_path / "store"
    (store_dir / volumes[1].key).write_bytes(b"short")
    (store_dir / volumes[3].key).unlink()
    store = FaultyBackend(FileBackend("cold", store_dir))
    with pytest.raises(StreamCorrupt, match="truncated or replaced") as refused:
        VolumeFetch(store, volumes, tmp_path / "spool", 4)
    assert volumes[1].key in str(refused.value)
    assert not [k for op, k in store.calls if op == "get"]


@pytest.mark.parametrize("garbage", [b"\0", b"trailing garbage" * 64,
                                     zstandard.ZstdCompressor().compress(b"a second frame")],
                         ids=["one-byte", "text", "a-second-zstd-frame"])
def test_bytes_after_the_end_of_the_frame_are_refused_and_nothing_is_received(
        archived, faulty_store, garbage):
    """docs/reliability.md#r10-trailing-garbage-after-the-last-frame-is-rejected: trailing garbage,
    even a valid second frame, fails the volume."""
    run, pool, data, store = archived
    key, _ = newest_volume(store)
    err = restore_refused(faulty_store(run, append=garbage, keys=key), pool, data,
                          f"{pool.name}/r")
    assert key in err


def test_trailing_bytes_after_a_frame_fail_the_decoder_too():
    """docs/reliability.md#r10-trailing-garbage-after-the-last-frame-is-rejected at the codec:
    ``decompress_frame`` rejects a frame followed by bytes."""
    frame = zstandard.ZstdCompressor(write_checksum=True).compress(b"x" * 1000)
    with pytest.raises(StreamCorrupt, match="after the end"):
        b"".join(decompress_frame([frame + b"\0"], "vol"))
    with pytest.raises(StreamCorrupt, match="after the end"):
        b"".join(decompress_frame([frame, frame], "vol"))


# -- 11: flaky read ---------------------------------------------------------------------------


def test_a_volume_corrupt_on_the_first_read_only_is_read_again_and_the_restore_reports_it(
        archived, faulty_store):
    """docs/reliability.md#r11-flaky-read (restic errorOnceBackend): the first read of the volume is
    bad, the second good: the restore succeeds and warns, naming the volume."""
    run, pool, data, store = archived
    key, size = newest_volume(store)
    faulty = faulty_store(run, flip_byte_at=size // 3, faulty_reads=1, keys=key)
    into = f"{pool.name}/r"
    status, out, err = faulty("restore", data, "--to", "@2", "--into", into, "--from", "cold",
                              "--yes")
    assert status == ExitStatus.OK, out + err
    assert prop(f"{into}@2", "guid") == prop(f"{data}@2", "guid")
    assert faulty.calls().count(("get", key)) == 2
    warnings = [line for line in err.splitlines() if "WARNING" in line and key in line]
    assert any("failed verification on the first read" in line for line in warnings), err
    assert any("verified on the second read" in line for line in warnings), err


def test_a_volume_corrupt_on_every_read_is_read_twice_then_refused(archived, faulty_store):
    """docs/reliability.md#r11-flaky-read: One retry only: a volume bad on both reads fails the
    restore; nothing is received."""
    run, pool, data, store = archived
    key, size = newest_volume(store)
    faulty = faulty_store(run, flip_byte_at=size // 3, faulty_reads=2, keys=key)
    err = restore_refused(faulty, pool, data, f"{pool.name}/r")
    assert "failed verification on the first read" in err and key in err
    assert faulty.calls().count(("get", key)) == 2


def test_verify_reads_a_volume_bad_on_the_first_read_again_verifies_it_and_reports_it(
        archived, faulty_store):
    """docs/reliability.md#r11-flaky-read for ``verify`` (``zbak audit --deep``): the first read of
    the newest volume has a flipped bit, the second is good: the audit exits 0, the stream is
    ``verified`` (not ``bad``), and an info finding plus a warning say the first read
    failed."""
    run, pool, data, store = archived
    key, size = newest_volume(store)
    faulty = faulty_store(run, flip_byte_at=size // 3, faulty_reads=1, keys=key)
    status, out, err = faulty("audit", "--deep", "--json")
    assert faulty.calls().count(("get", key)) == 2
    assert status == ExitStatus.OK, out + err
    doc = json.loads(out)
    assert doc["jobs"][0]["bad"] == []
    notes = [f for f in doc["findings"] if f["key"] == key]
    assert notes and notes[0]["severity"] == "info" and "first read" in notes[0]["problem"]
    assert "first read failed verification" in err


def test_verify_marks_a_volume_bad_on_both_reads_bad(archived, faulty_store):
    """docs/reliability.md#r9-bit-flip-in-an-object, docs/reliability.md#r11-flaky-read, the other
    side for ``verify``: a volume whose every read is damaged
    is a finding and its stream is marked bad (exit 4)."""
    run, pool, data, store = archived
    key, size = newest_volume(store)
    status, out, err = faulty_store(run, flip_byte_at=size // 3, keys=key)("audit", "--deep",
                                                                           "--json")
    assert status == ExitStatus.AUDIT_FINDINGS, out + err
    doc = json.loads(out)
    assert len(doc["jobs"][0]["bad"]) == 1
    assert any(f["key"] == key and f["severity"] == "error" for f in doc["findings"])


# -- 12: valid zstd around an invalid ZFS stream -------------------------------------------------


def _spec(data: str, snap: CarriedSnapshot, stages: tuple[Stage, ...], *, store: str = "cold"
          ) -> StreamSpec:
    planned = PlannedStream("full", None, snap, (snap,), None, "test")
    prefix = stream_prefix("local", data, to_createtxg=snap.createtxg, to_guid=snap.guid,
                           from_guid=None)
    return StreamSpec(host="local", dataset=data, store=store, planned=planned, parent_id=None,
                      prefix=prefix, send_stages=stages, send_flags=(), volume_size=MiB,
                      codec=Codec(level=3), storage_class="STANDARD")


def _snap(data: str, name: str) -> CarriedSnapshot:
    return CarriedSnapshot(name, int(prop(f"{data}@{name}", "guid")),
                      int(prop(f"{data}@{name}", "createtxg")))


def _send(data: str, name: str) -> Stage:
    return Stage("zfs send", ("zfs", "send", f"{data}@{name}"))


@pytest.mark.parametrize("content", ["garbage", "bit-flipped"])
def test_a_verified_stream_that_zfs_receive_rejects_is_marked_bad_and_nothing_is_left(
        setup, content):
    """docs/reliability.md#r12-valid-zstd-around-an-invalid-zfs-stream: a full @0 whose zstd volumes
    are valid and match the catalog, but whose content is not a valid ZFS stream (random bytes, or
    the real stream with one bit flipped before compression) is rejected by ``zfs receive``: typed
    error, no dataset left, and the stream is ``bad`` in the catalog, so the next restore does not
    use it."""
    run, pool, data, store = setup
    snap = _snap(data, "0")
    stages = ((garbage_stage(400 * KiB, seed=12),) if content == "garbage"
              else (flip_stage(_send(data, "0"), at=150 * KiB),))
    with catalog_of(run.config) as catalog:
        written = write_stream(_spec(data, snap, stages), FileBackend("cold", store), catalog,
                               SystemClock().now)
    into = f"{pool.name}/r"
    status, out, err = run("restore", data, "--to", "@0", "--into", into, "--from", "cold",
                           "--yes")
    assert status == ExitStatus.FAILED, out + err
    assert "rejected stream" in err and "marked bad" in err
    assert ("bad magic number" if content == "garbage" else "checksum mismatch") in err
    assert gone(into)
    with catalog_of(run.config) as catalog:
        row = catalog.stream(written.stream_id)
    assert row.state == "bad"
    assert row.bad_reason.startswith("zfs receive rejected its content (stream"
                                     f" {row.object_prefix}, every volume verified)"), row
    status, out, err = run("restore", data, "--to", "@0", "--into", into, "--from", "cold",
                           "--yes")
    assert status != ExitStatus.OK, out + err
    assert (f"the chain carrying @0 in store cold is bad: stream {written.stream_id} (full @0)"
            " is marked bad: zfs receive rejected its content") in err, err
    assert gone(into)


def test_a_stream_rejected_as_unsupported_by_the_receiver_is_not_marked_bad():
    """docs/reliability.md#r12-valid-zstd-around-an-invalid-zfs-stream: Only the stream's own
    content marks it bad: "unsupported feature" is the receiver's limit (zfs-fuse receiving an
    OpenZFS 2.x stream) and leaves the stream living."""
    from zrepl_py.proc.pipeline import StageResult

    def rejected(stderr: str) -> bool:
        result = StageResult("zfs receive", ("zfs", "receive"), 1, stderr, False)
        return restore_execute._stream_rejected(PipelineFailed((result,), result),
                                                ["zfs", "receive", "p/x"], "local")

    assert rejected("cannot receive: invalid stream (bad magic number)")
    assert rejected("cannot receive new filesystem stream: invalid backup stream")
    assert not rejected("cannot receive: stream has unsupported feature, feature flags = 4")
    assert not rejected("cannot receive new filesystem stream: destination 'p/x' exists")


# -- 7: a failing stage of send | compress+hash | upload ----------------------------------------


def _nothing_uploaded(run, store: Path, data: str) -> None:
    state = store_state(FileBackend("cold", store))
    assert not [k for k in state.objects if k.endswith(MANIFEST)], state.objects
    with catalog_of(run.config) as catalog:
        assert catalogued(catalog, data) == []


@pytest.mark.parametrize("fault", ["killed-mid-stream", "exit-1-after-the-whole-stream"])
def test_a_failing_send_is_reported_as_the_send_stage_and_nothing_is_marked_uploaded(
        setup, fault):
    """docs/reliability.md#r7-a-failing-pipeline-stage-is-detected, send stage: ``zfs send``
    SIGKILLed after 200 KiB, or exiting 1 after writing its whole stream: PipelineFailed names the
    send; no manifest, no catalog row (volumes already stored stay for the next run, listed in
    progress.json)."""
    run, pool, data, store = setup
    send = _send(data, "2")
    stage = (cut_stage(send, 200 * KiB) if fault == "killed-mid-stream"
             else fail_at_end_stage(send, 1, "injected: zfs send failed at the end"))
    with catalog_of(run.config) as catalog, pytest.raises(PipelineFailed) as failure:
        write_stream(_spec(data, _snap(data, "2"), (stage,)), FileBackend("cold", store),
                     catalog, SystemClock().now)
    assert failure.value.culprit.name == "zfs send"
    assert ("killed" if fault == "killed-mid-stream" else "failed at the end") in str(failure.value)
    _nothing_uploaded(run, store, data)


def test_stderr_noise_from_a_send_that_exits_0_is_not_a_failure(setup):
    """docs/reliability.md#r7-a-failing-pipeline-stage-is-detected: the other side: warnings on
    stderr alone do not fail a stream."""
    run, pool, data, store = setup
    stage = stderr_stage(_send(data, "0"), "warning: injected noise on stderr")
    with catalog_of(run.config) as catalog:
        written = write_stream(_spec(data, _snap(data, "0"), (stage,)),
                               FileBackend("cold", store), catalog, SystemClock().now)
        assert catalog.stream(written.stream_id).state == "uploaded"


@pytest.mark.parametrize("calls", [0, 1, 2])
def test_a_failing_upload_is_reported_as_a_store_error_and_nothing_is_marked_uploaded(
        setup, calls):
    """docs/reliability.md#r7-a-failing-pipeline-stage-is-detected, upload stage: the store refuses
    its (calls+1)-th write (the first volume, its progress record, the manifest): StoreError, no
    manifest, no catalog row."""
    run, pool, data, store = setup
    backend = FaultyBackend(FileBackend("cold", store), fail_after_calls=calls)
    with catalog_of(run.config) as catalog, pytest.raises(StoreError, match="injected fault"):
        write_stream(_spec(data, _snap(data, "0"), (_send(data, "0"),)), backend, catalog,
                     SystemClock().now)
    _nothing_uploaded(run, store, data)


# -- 18: zero-length stream -------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["file", pytest.param("s3", marks=pytest.mark.s3)])
def test_a_zero_length_stream_round_trips_through_store_catalog_and_verification(
        setup, kind, request, tmp_path):
    """docs/reliability.md#r18-zero-length-object: a sender that writes nothing gives one
    empty-frame volume, a manifest and a catalog row; the volume verifies and decodes to zero
    bytes."""
    run, pool, data, store = setup
    if kind == "file":
        backend = FileBackend("cold", store)
    else:
        from zrepl_py.stores.s3 import S3Backend

        server = request.getfixturevalue("s3_server")
        bucket = request.getfixturevalue("s3_bucket")
        backend = S3Backend("cold", bucket, "zbak", endpoint_url=server.endpoint_url,
                            region=server.region)
    with catalog_of(run.config) as catalog:
        written = write_stream(_spec(data, _snap(data, "0"), (Stage("zfs send", ("true",)),)),
                               backend, catalog, SystemClock().now)
        volumes = catalog.volumes(written.stream_id)
    assert written.raw_bytes == 0 and len(volumes) == 1 and volumes[0].raw_bytes == 0
    assert backend.stat(volumes[0].key).size == volumes[0].stored_bytes > 0
    with VolumeFetch(FaultyBackend(backend), volumes, tmp_path / "spool", 2) as fetch:
        files = fetch.wait_all()
    assert b"".join(decompress_frame([files[volumes[0].id].read_bytes()], "vol",
                                     raw_bytes=0)) == b""
    assert not [k for k in store_state(backend).objects if k.endswith(PROGRESS)]
    backend.close()
