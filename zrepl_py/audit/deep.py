"""Audit level 3, deep: read the volumes back and check what they hold.

For each stream chosen (:func:`choose`: all living streams, or ``--sample PERCENT`` of them,
least recently verified first, never-verified first of all), every volume is read in order
and checked: the SHA-256 and size of the stored bytes, then the stream's codec chain decodes
it with every check (``streams.codec``; zstd: content checksum, frame end, nothing after it)
and the raw size, all against the catalog; the decompressed
bytes of all volumes are walked as one send stream (``streams.records``): complete, well
formed, and its BEGIN records carry the catalog's guids (:func:`begin_problems`). A stream
that passes is marked ``verified`` (``verified_at`` now) as soon as it is done, so an
interrupted or sampled run continues with the others next time; one whose bytes or guids
are wrong, or with a volume missing, is marked ``bad`` (``archive.damage.mark_bad``, an alert
event; the archive planner then starts a new full, and prune never deletes an older chain on
its account).

Cold volumes (GLACIER, DEEP_ARCHIVE) are thawed like a restore does (``restore.thaw``): one
request per frozen object, recorded per stream; such streams are skipped this run and the
result says when to run again (exit 75 when nothing else is wrong).

``--max-duration SECONDS`` (:class:`Deadline`) bounds one run: once that much time has passed
no further stream (or chain) is started, but at least one is read per run so each run makes
progress; with the least-recently-verified order and ``verified_at`` written per stream, the
next run continues where this one stopped (borg ``check --max-duration``;
docs/reliability.md#r24-verify-is-read-only-repair-is-separate-and-explicit).

``--receive-into POOL`` also proves the chains restore: each chain holding a chosen stream is
received whole (``zfs receive -u``, full first) into ``POOL/zbak-audit-<random>/c<full id>``
while its volumes are read, the received snapshots' guids are compared with the catalog's,
then every snapshot and dataset the audit created there is destroyed one by one (never
``-r``); the scratch parent is created with ``canmount=off`` and ``mountpoint=none``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import itertools
import logging
import math
import secrets
import time
from collections.abc import Callable, Mapping, Sequence

from zrepl_py.archive.damage import mark_bad
from zrepl_py.audit.findings import Finding, Severity
from zrepl_py.catalog.repository import Catalog
from zrepl_py.catalog.rows import LIVING_STATES, StreamRow, VolumeRow, first_three
from zrepl_py.config.restore import RestoreConfig
from zrepl_py.errors import (
    IdentityRefused,
    NeedsThaw,
    ObjectNotFound,
    PipelineFailed,
    StreamCorrupt,
    ZbakError,
)
from zrepl_py.objects.manifest import CarriedSnapshot
from zrepl_py.proc.python_end import ReceiveWriter
from zrepl_py.restore.thaw import request_thaws
from zrepl_py.stores.base import COLD_CLASSES, Backend, get_recorded
from zrepl_py.streams.codec import Codec
from zrepl_py.streams.frames import Digest
from zrepl_py.streams.records import RecordWalker, StreamSummary
from zrepl_py.transport.stages import Side
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.names import DatasetName
from zrepl_py.zfs.sendrecv import receive_argv
from zrepl_py.zfs.teardown import destroy_tree

log = logging.getLogger(__name__)

_NEVER = dt.datetime.min.replace(tzinfo=dt.UTC)


def choose(streams: Sequence[StreamRow], sample: float | None) -> list[StreamRow]:
    """The living streams to read, least recently verified first (never verified first,
    then by ``verified_at``, then id): all, or ``ceil(sample% of them)`` (at least one).

    Raises:
        ValueError: ``sample`` outside (0, 100].
    """
    if sample is not None and not 0 < sample <= 100:
        raise ValueError(f"--sample must be a percentage in (0, 100], not {sample}")
    living = sorted((s for s in streams if s.state in LIVING_STATES),
                    key=lambda s: (s.verified_at is not None, s.verified_at or _NEVER, s.id))
    if sample is None or not living:
        return living
    return living[:max(1, math.ceil(len(living) * sample / 100))]


def begin_problems(summary: StreamSummary, stream: StreamRow,
                   carried: Sequence[CarriedSnapshot]) -> list[str]:
    """What the stream's own BEGIN records contradict in the catalog (pure).

    The first substream must start at the stream's from-guid (0 for a full), each further
    substream at the previous one's to-guid, the last must end at the stream's to-guid, and
    the substreams' to-guids must be the carried snapshots' guids in createtxg order.
    """
    subs = summary.substreams
    if not subs:
        return ["the stream holds no substream BEGIN record"]
    problems = []
    expected_from = stream.from_guid if stream.kind == "incremental" else 0
    if subs[0].fromguid != expected_from:
        problems.append(f"its first BEGIN record starts at guid {subs[0].fromguid}"
                        f" ({subs[0].toname}), the catalog says {expected_from}")
    for before, after in itertools.pairwise(subs):
        if after.fromguid != before.toguid:
            problems.append(f"the BEGIN record of {after.toname} starts at guid {after.fromguid},"
                            f" not at the previous substream's {before.toguid}")
    if subs[-1].toguid != stream.to_guid:
        problems.append(f"its last BEGIN record ends at guid {subs[-1].toguid}"
                        f" ({subs[-1].toname}), the catalog says {stream.to_guid}"
                        f" (@{stream.to_name})")
    if carried:
        want = [c.guid for c in sorted(carried, key=lambda c: c.createtxg)]
        have = [b.toguid for b in subs]
        if have != want:
            problems.append(f"it carries snapshots with guids {have[:10]}, the catalog records"
                            f" {want[:10]}")
    return problems


@dataclasses.dataclass
class StreamCheck:
    """What reading one stream found.

    Attributes:
        problems: why its bytes or guids are wrong (mark it bad), with the volume key of each.
        missing: volume keys the store does not have (also marks the stream bad).
        thawing: True when a volume turned out to be cold and unreadable after all.
        summary: the record walk, when every volume was read and well formed.
    """

    problems: list[tuple[str, str | None]] = dataclasses.field(default_factory=list)
    missing: list[str] = dataclasses.field(default_factory=list)
    thawing: bool = False
    summary: StreamSummary | None = None

    @property
    def clean(self) -> bool:
        """True when the stream was read whole and nothing was wrong."""
        return not (self.problems or self.missing or self.thawing)


def read_stream(backend: Backend, stream: StreamRow, volumes: Sequence[VolumeRow],
                carried: Sequence[CarriedSnapshot], *, codec: Codec | None = None,
                sink: Callable[[bytes], None] | None = None) -> StreamCheck:
    """Read every volume of ``stream`` in order and check it (see the module docstring);
    ``codec`` decodes its volumes (None: the plain chain its row names); ``sink`` receives
    the decoded bytes (a test receive).

    Raises:
        IdentityRefused: a sealed volume's header opens with none of the codec's identities
            while its stored bytes are the ones recorded (the key is wrong, not the stream).
    """
    check = StreamCheck()
    codec = codec or Codec.named(stream.compression)
    walker = RecordWalker(f"stream {stream.id} (@{stream.to_name}) in store {stream.store}")
    walk_error: str | None = None
    damaged = False
    for volume in volumes:
        where = f"{backend.name}:{volume.key}"
        digest = Digest(hash_raw=False)  # the raw size is checked, no raw hash recorded
        try:
            for chunk in codec.decode(get_recorded(backend, volume.key, volume.version_id), where,
                                     digest):
                if walk_error is None and not damaged:
                    try:
                        walker.feed(chunk)
                    except StreamCorrupt as exc:
                        walk_error = str(exc)
                if sink is not None and not damaged:
                    sink(chunk)
        except ObjectNotFound:
            check.missing.append(volume.key)
            damaged = True
            continue
        except NeedsThaw:
            check.thawing = True
            return check
        except StreamCorrupt as exc:
            check.problems.append((f"volume {volume.index} is damaged: {exc}", volume.key))
            damaged = True
            continue
        except IdentityRefused:
            # Decryption stopped at the header, before the hash saw the whole volume: only
            # the stored bytes' SHA-256 tells a damaged header from a wrong identity.
            if _stored_sha256(backend, volume.key, volume.version_id) == volume.sha256:
                raise
            check.problems.append((f"volume {volume.index} is damaged: its age header does"
                                   " not open and its SHA-256 differs from the catalog's",
                                   volume.key))
            damaged = True
            continue
        if digest.stored_bytes != volume.stored_bytes or digest.sha256 != volume.sha256:
            check.problems.append((
                f"volume {volume.index} holds {digest.stored_bytes} bytes with SHA-256"
                f" {digest.sha256[:16]}..., the catalog records {volume.stored_bytes} bytes and"
                f" {volume.sha256[:16]}...", volume.key))
            damaged = True
        elif digest.raw_bytes != volume.raw_bytes:
            check.problems.append((f"volume {volume.index} decodes to {digest.raw_bytes} bytes,"
                                   f" the catalog records {volume.raw_bytes}", volume.key))
            damaged = True
    if damaged:
        return check
    if walk_error is None:
        try:
            check.summary = walker.finish()
        except StreamCorrupt as exc:
            walk_error = str(exc)
    if walk_error is not None:
        check.problems.append((walk_error, None))
        return check
    assert check.summary is not None  # finish() returned it, or raised
    for problem in begin_problems(check.summary, stream, carried):
        check.problems.append((problem, None))
    return check


def _refused_finding(refused: Sequence[tuple[StreamRow, IdentityRefused]],
                     store: str) -> Finding:
    """The warning for sealed streams the identities given do not open while others did:
    their volumes match the catalog, so they are sealed to other keys (the store's recipients
    changed since they were written, docs/sealed.md#changing-the-recipients)."""
    names = first_three([f"{s.id} (@{s.to_name} of {s.host}:{s.dataset})" for s, _ in refused])
    return Finding(
        Severity.WARNING, "deep", f"{len(refused)} sealed stream(s) in store {store} open with"
        f" none of the identities given, which open its other streams: {names}; their volumes"
        " match the catalog, so they are sealed to other keys (the recipients changed since"
        " they were written); not read", "give an identity file that also holds their keys (one"
        " AGE-SECRET-KEY line each), or let retention remove their chains"
        " (docs/sealed.md#changing-the-recipients)", store=store)


def _stored_sha256(backend: Backend, key: str, version_id: str | None) -> str:
    sha = hashlib.sha256()
    for chunk in get_recorded(backend, key, version_id):
        sha.update(chunk)
    return sha.hexdigest()


@dataclasses.dataclass(frozen=True)
class ScratchPool:
    """Where ``--receive-into`` receives: a ZFS client and the side (local or ssh) of the
    host, and the scratch parent dataset ``POOL/zbak-audit-<random>`` to create."""

    zfs: Zfs
    side: Side
    parent: str

    @classmethod
    def under(cls, zfs: Zfs, side: Side, pool: str) -> ScratchPool:
        """A new scratch name under ``pool`` (a pool or dataset name)."""
        return cls(zfs, side, str(DatasetName(pool).child(f"zbak-audit-{secrets.token_hex(4)}")))


@dataclasses.dataclass
class DeepResult:
    """What the deep level did: findings, streams verified and marked bad, cold volumes
    still thawing and when they should be readable (aware UTC), chains test-received."""

    findings: list[Finding] = dataclasses.field(default_factory=list)
    verified: list[int] = dataclasses.field(default_factory=list)
    bad: list[int] = dataclasses.field(default_factory=list)
    waiting: int = 0
    ready_by: dt.datetime | None = None
    received: list[int] = dataclasses.field(default_factory=list)
    skipped: int = 0


class Deadline:
    """The time budget of one audit run's deep reads (``--max-duration``), across stores.

    Args:
        seconds: the budget; None: unbounded.
        monotonic: the clock (seconds, ``time.monotonic``); tests inject a fake.
    """

    def __init__(self, seconds: float | None, monotonic: Callable[[], float] = time.monotonic):
        if seconds is not None and seconds < 0:
            raise ValueError(f"--max-duration must be 0 or more seconds, not {seconds}")
        self.seconds, self._clock = seconds, monotonic
        self._start = monotonic()
        self.started = 0  # streams (or chains) begun this run

    def allows(self) -> bool:
        """True when another stream may be started: the first one always, then while the
        elapsed time is below the budget."""
        if self.seconds is None or self.started == 0:
            return True
        return self._clock() - self._start < self.seconds


def _chain_of(stream: StreamRow, by_id: Mapping[int, StreamRow]) -> list[StreamRow]:
    chain = [stream]
    while (chain[-1].parent_id is not None and chain[-1].parent_id in by_id
           and len(chain) <= len(by_id)):
        chain.append(by_id[chain[-1].parent_id])
    return list(reversed(chain))


def chains_to_receive(chosen: Sequence[StreamRow],
                      streams: Sequence[StreamRow]) -> list[list[StreamRow]]:
    """The chains (full first) a test receive covers: for each chosen stream, the path from
    its full to it, extended to the deepest living descendant; paths inside another are
    dropped (pure)."""
    by_id = {s.id: s for s in streams}
    children: dict[int, list[StreamRow]] = {}
    for s in streams:
        if s.parent_id is not None and s.state in LIVING_STATES:
            children.setdefault(s.parent_id, []).append(s)
    paths = []
    for s in chosen:
        path = _chain_of(s, by_id)
        while children.get(path[-1].id):
            path.append(max(children[path[-1].id], key=lambda c: (c.to_createtxg, c.id)))
        if path[0].kind == "full" and all(p.state in LIVING_STATES for p in path):
            paths.append(path)
    paths.sort(key=len, reverse=True)
    kept: list[list[StreamRow]] = []
    for path in paths:
        ids = [p.id for p in path]
        if not any(ids == [p.id for p in other][:len(ids)] for other in kept):
            kept.append(path)
    return sorted(kept, key=lambda p: p[0].id)


def _finding(stream: StreamRow, severity: Severity, problem: str, action: str,
             key: str | None = None, chain: int | None = None) -> Finding:
    return Finding(severity, "deep", problem, action, host=stream.host, dataset=stream.dataset,
                   store=stream.store, chain=chain, stream=stream.id, key=key)


class DeepAudit:
    """One deep audit of streams in one store (see the module docstring).

    Args:
        backend: the store.
        catalog: where states, verification times and thaw requests are recorded.
        volumes / carried: catalog rows by stream id.
        now: the clock (aware UTC).
        thaw: the ``[restore]`` settings (tier, days) used for thaw requests.
        deadline: the run's ``--max-duration`` budget (None: unbounded).
        job: the job audited, named by the event raised when a stream is marked bad.
        codec_of: the codec of a chain name (``Context.reading_codecs``); None: plain
            chains only.
    """

    def __init__(self, backend: Backend, catalog: Catalog,
                 volumes: Mapping[int, Sequence[VolumeRow]],
                 carried: Mapping[int, Sequence[CarriedSnapshot]],
                 now: Callable[[], dt.datetime], thaw: RestoreConfig,
                 deadline: Deadline | None = None, *, job: str | None = None,
                 codec_of: Callable[[str], Codec] | None = None):
        self.backend, self.catalog, self.job = backend, catalog, job
        self.codec_of = codec_of or (lambda chain: Codec.named(chain))
        self.volumes, self.carried = volumes, carried
        self.now, self.thaw = now, thaw
        self.deadline = deadline or Deadline(None)
        self.result = DeepResult()
        self.chain: dict[int, int] = {}  # stream id -> id of its chain's full
        self.refused: list[tuple[StreamRow, IdentityRefused]] = []  # opened by no identity

    def run(self, chosen: Sequence[StreamRow], streams: Sequence[StreamRow],
            scratch: ScratchPool | None = None) -> DeepResult:
        """Verify ``chosen`` (with ``scratch``: receive their chains there); ``streams``
        are all streams of the store in scope (to find the chains).

        Raises:
            IdentityRefused: the identities opened none of the sealed streams read (the
                first stream's error; exit 2). When they opened some, the others are a
                warning finding instead (sealed to other keys, docs/sealed.md).
        """
        result = self._run(chosen, streams, scratch)
        if self.refused:
            if not (result.verified or result.bad):
                raise self.refused[0][1]
            result.findings.append(_refused_finding(self.refused, self.backend.name))
        return result

    def _run(self, chosen: Sequence[StreamRow], streams: Sequence[StreamRow],
             scratch: ScratchPool | None) -> DeepResult:
        by_id = {s.id: s for s in streams}
        for stream in chosen:
            head = _chain_of(stream, by_id)[0]
            if head.kind == "full":
                self.chain[stream.id] = head.id
        if scratch is None:
            ready = self._readable(chosen)
            for done, stream in enumerate(ready):
                if not self.deadline.allows():
                    self.result.skipped += len(ready) - done
                    break
                self.deadline.started += 1
                self._verify(stream)
            return self.result
        chains = chains_to_receive(chosen, streams)
        every = list({s.id: s for chain in chains for s in chain}.values())
        readable = {s.id for s in self._readable(every)}
        scratch.zfs.create_filesystem(scratch.parent, properties={"canmount": "off",
                                                                  "mountpoint": "none"})
        try:
            for done, chain in enumerate(chains):
                if not self.deadline.allows():
                    self.result.skipped += sum(len(c) for c in chains[done:])
                    break
                if all(s.id in readable for s in chain):
                    self.deadline.started += 1
                    self._receive_chain(chain, scratch)
        finally:
            self._destroy_scratch(scratch)
        return self.result

    def _readable(self, streams: Sequence[StreamRow]) -> list[StreamRow]:
        """The streams whose volumes can be read now; thaws requested for the others."""
        ready = []
        for stream in streams:
            if stream.storage_class not in COLD_CLASSES:
                ready.append(stream)
                continue
            try:
                waiting, when = request_thaws(self.backend, self.catalog, [stream],
                                              {stream.id: self.volumes.get(stream.id, [])},
                                              self.thaw, self.now())
            except ObjectNotFound as exc:
                self.result.findings.append(_finding(
                    stream, Severity.ERROR, f"a volume of stream {stream.id} is missing: {exc}",
                    "see the objects findings", exc.key))
                continue
            if waiting:
                self.result.waiting += waiting
                if when is not None:
                    self.result.ready_by = max(self.result.ready_by or when, when)
            else:
                ready.append(stream)
        return ready

    def _verify(self, stream: StreamRow, sink: Callable[[bytes], None] | None = None) -> bool:
        """Read and check one stream, record the outcome; True when it is clean."""
        vols = self.volumes.get(stream.id, [])
        if not vols:
            return False  # the graph audit reports a living stream without volumes
        codec = self.codec_of(stream.compression)
        try:
            check = read_stream(self.backend, stream, vols, self.carried.get(stream.id, ()),
                                codec=codec, sink=sink)
        except IdentityRefused as exc:  # its stored bytes are the recorded ones: not bad
            self.refused.append((stream, exc))
            return False
        if check.problems and not check.missing and not check.thawing and sink is None:
            # docs/reliability.md#r11-flaky-read (restic errorOnceBackend, "check successful on
            # second attempt"): a flaky read (a connection that looked like EOF, a bit flipped in
            # transit) must not mark a good stream bad: read it once more, and report what the first
            # read saw. Not with a sink: its bytes already went to the scratch receive.
            first = check
            check = read_stream(self.backend, stream, vols, self.carried.get(stream.id, ()),
                                codec=codec)
            if not (check.problems or check.missing or check.thawing):
                what = "; ".join(p for p, _ in first.problems)
                keys = [k for _, k in first.problems if k]
                log.warning("stream %s (@%s): the first read failed verification (%s); the"
                            " second read verified it", stream.id, stream.to_name, what)
                self.result.findings.append(_finding(
                    stream, Severity.INFO, f"stream {stream.id} (@{stream.to_name}) failed"
                    f" verification on the first read and verified on the second: {what}",
                    "nothing to repair (a flaky store, network or disk); repeated reports"
                    " point at the store", keys[0] if keys else None,
                    self.chain.get(stream.id)))
        for key in check.missing:
            self.result.findings.append(_finding(
                stream, Severity.ERROR, f"volume {key} of stream {stream.id} (@{stream.to_name})"
                " is missing", "marked bad: the chain cannot be restored past it; the next"
                " `zbak archive` (or `zbak archive --full`) starts a new full", key,
                self.chain.get(stream.id)))
        if check.thawing:
            self.result.waiting += 1
            return False
        if check.problems:
            keys = [key for _, key in check.problems if key]
            self.result.findings.append(_finding(
                stream, Severity.ERROR, f"stream {stream.id} (@{stream.to_name} of"
                f" {stream.host}:{stream.dataset}) is bad: "
                + "; ".join(problem for problem, _ in check.problems),
                "marked bad: the chain cannot be restored past this stream; when it is the"
                " newest chain `zbak archive` starts a new full at its next run, else the"
                " newer chain is what restores", keys[0] if keys else None,
                self.chain.get(stream.id)))
        if check.problems or check.missing:
            # Each with its object: a volume's key, or the stream's prefix for what its
            # records as a whole contradict (a BEGIN record's guids).
            what = first_three([p if key and key in p else
                                f"{p}: {key or 'stream ' + stream.object_prefix}"
                                for p, key in check.problems]
                               + [f"volume {key} is missing" for key in check.missing])
            if mark_bad(self.catalog, stream, what, self.now(), job=self.job, action="audit"):
                self.result.bad.append(stream.id)
            return False
        self.catalog.set_stream_state(stream.id, "verified", self.now())
        self.result.verified.append(stream.id)
        return True

    def _receive_chain(self, chain: Sequence[StreamRow], scratch: ScratchPool) -> None:
        full = chain[0]
        target = str(DatasetName(scratch.parent).child(f"c{full.id}"))
        argv = receive_argv(target, caps=scratch.zfs.capabilities, resumable=False,
                            zfs=scratch.zfs.zfs)
        for stream in chain:
            try:
                with ReceiveWriter(scratch.side.wrap([argv], "zfs receive")) as writer:
                    if not self._verify(stream, sink=writer.write):
                        return  # leaving the block cancels the receive
                    writer.finish()
            except PipelineFailed as exc:
                self.result.findings.append(_finding(
                    stream, Severity.ERROR, f"a test receive of stream {stream.id}"
                    f" (@{stream.to_name}) into {target} failed: {exc}",
                    "the chain may not restore: check the message; `zbak restore --dry-run`"
                    " shows the path a restore would take", chain=full.id))
                return
        want = [c.guid for s in chain for c in sorted(self.carried.get(s.id, ()),
                                                      key=lambda c: c.createtxg)]
        have = [snap.guid for snap in scratch.zfs.tree(target, recursive=False).snapshots(target)]
        if want and have != want:
            self.result.findings.append(_finding(
                chain[-1], Severity.ERROR, f"the chain of full {full.id} received into {target}"
                f" holds snapshots with guids {have[:10]}, the catalog records {want[:10]}",
                "the catalog or the streams are wrong: run `zbak audit --deep` on the chain",
                chain=full.id))
            return
        self.result.received.append(full.id)

    def _destroy_scratch(self, scratch: ScratchPool) -> None:
        """Destroy what this audit created under the scratch parent, one by one."""
        try:
            destroy_tree(scratch.zfs, scratch.parent)
        except ZbakError as exc:
            log.error("could not destroy the scratch dataset %s: %s; destroy what is left"
                      " of it by hand (zfs destroy, one name at a time)", scratch.parent, exc)
