"""Audit level 2, the objects: what the store holds against what the catalog records.

For each store, the dataset prefixes in scope are listed once (``Backend.list``; no request
per object), then, per stream that is not condemned (a condemned stream's objects may be
gone on purpose; the graph audit reports the unfinished prune):

* every volume exists with the recorded size and storage class (a class changed behind
  zbak's back, e.g. by a bucket lifecycle rule, is a warning: restores will need a thaw); a
  volume missing or of another size is an error, and ``audit.job`` marks its stream bad;
* the manifest exists, in STANDARD class, parses (``Manifest.from_json``, falling back to
  ``manifest.json.copy`` when the primary fails: a damaged or missing primary is a warning,
  both damaged an error, docs/reliability.md#r26-catalog-metadata-copy-with-checksum) and agrees
  with the catalog: host, dataset, kind, from/to snapshot names and guids, createtxg, the
  snapshots carried, every volume's key, sizes and SHA-256, the storage class and
  compression (manifests are fetched in parallel, ``concurrency`` at a time). A manifest an
  earlier audit read and found agreeing is trusted instead of read again while the listing
  shows it unchanged (:func:`must_read`: the same size and etag, ``catalog.stamps``) and that
  read is younger than its share of ``TRUST_MANIFESTS_FOR``; a changed, new or long-unread
  manifest is read (docs/decisions.md#audit-trusts-a-manifest-whose-listing-has-not-changed);
* what unfinished puts left under the job's prefix (a ``file://`` temporary file, an S3
  multipart upload: no object, but stored bytes) is reported with its key and size
  (:func:`unfinished_findings`), a warning once older than ``zbak audit --repair``'s age;
* objects under the prefixes that no catalogued stream owns are leftovers, reported as
  information per stream directory: an uncatalogued stream with a manifest (``zbak catalog
  rebuild STORE --merge`` adds it), a partial upload of an interrupted archive run
  (``progress.json``, no manifest: the next ``zbak archive`` resumes or deletes it), or
  anything else.

The comparisons and the trust rule are pure functions (:func:`compare_volumes`,
:func:`compare_manifest`, :func:`leftovers`, :func:`must_read`); :func:`audit_objects`
does the reads over a listing its caller made.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import datetime as dt
from collections.abc import Iterable, Iterator, Mapping, Sequence

from zrepl_py.audit.findings import Finding, Severity
from zrepl_py.catalog.rows import StreamRow, VolumeRow
from zrepl_py.errors import NeedsThaw, ObjectNotFound, StoreError, StreamCorrupt
from zrepl_py.objects.checked import Loaded, read_with_copy
from zrepl_py.objects.layout import (
    MANIFEST,
    MANIFEST_COPY,
    PROGRESS,
    is_stream_prefix,
    parse_export_key,
    stream_dataset,
)
from zrepl_py.objects.manifest import CarriedSnapshot, Manifest
from zrepl_py.objects.versions import Pinned, Tampered
from zrepl_py.stores.base import Backend, ObjectInfo, Unfinished, Version

MANIFEST_CLASS = "STANDARD"
TRUST_MANIFESTS_FOR = dt.timedelta(days=30)
"""The longest an agreeing read of an unchanged manifest is trusted; each stream's share
is between half and all of it (:func:`must_read`), so the re-reads of a store stamped in
one audit spread over the second half of this period instead of coming back at once. A
listing cannot see bytes rotting in place on a disk (a ``file://`` store), so even an
unchanged manifest is read again within this period."""
_LOST = ("marked bad: the stream and every stream applying after it cannot be restored from"
         " this store; the next `zbak archive` (or `zbak archive --full`) starts a new chain"
         " with a full")


def _finding(stream: StreamRow, severity: Severity, problem: str, action: str,
             key: str | None) -> Finding:
    return Finding(severity, "objects", problem, action, host=stream.host,
                   dataset=stream.dataset, store=stream.store, stream=stream.id, key=key)


def compare_volumes(stream: StreamRow, volumes: Sequence[VolumeRow],
                    listing: Mapping[str, ObjectInfo]) -> list[Finding]:
    """Findings for ``stream``'s volumes (by index) against the store's ``listing``
    (key -> ObjectInfo): missing objects, other sizes, other storage classes."""
    found = []
    for volume in volumes:
        where = f"volume {volume.index} of stream {stream.id} (@{stream.to_name})"
        info = listing.get(volume.key)
        if info is None:
            found.append(_finding(stream, Severity.ERROR, f"{where} is missing from store"
                                  f" {stream.store}: {volume.key}", _LOST, volume.key))
        elif info.size != volume.stored_bytes:
            found.append(_finding(stream, Severity.ERROR, f"{where} has {info.size} bytes in the"
                                  f" store, the catalog records {volume.stored_bytes}:"
                                  f" {volume.key}", _LOST, volume.key))
        elif info.storage_class != stream.storage_class:
            found.append(_finding(
                stream, Severity.WARNING, f"{where} is in storage class {info.storage_class},"
                f" the catalog records {stream.storage_class}",
                "check the bucket's lifecycle rules; restores from a cold class need a thaw"
                " first (zbak requests it)", volume.key))
    return found


def compare_manifest(stream: StreamRow, volumes: Sequence[VolumeRow],
                     carried: Sequence[CarriedSnapshot], manifest: Manifest,
                     key: str) -> list[Finding]:
    """Findings where ``manifest`` disagrees with the catalog's rows for ``stream``."""
    differ: list[str] = []

    def check(what: str, in_manifest: object, in_catalog: object) -> None:
        if in_manifest != in_catalog:
            differ.append(f"{what}: manifest {in_manifest!r}, catalog {in_catalog!r}")

    check("host", manifest.host, stream.host)
    check("dataset", manifest.dataset, stream.dataset)
    check("kind", manifest.kind, stream.kind)
    check("from guid", manifest.from_snap.guid if manifest.from_snap else None, stream.from_guid)
    check("from snapshot", manifest.from_snap.name if manifest.from_snap else None,
          stream.from_name)
    check("to guid", manifest.to_snap.guid, stream.to_guid)
    check("to snapshot", manifest.to_snap.name, stream.to_name)
    check("to createtxg", manifest.to_snap.createtxg, stream.to_createtxg)
    check("storage class", manifest.storage_class, stream.storage_class)
    check("compression", manifest.compression, stream.compression)
    check("raw bytes", manifest.raw_bytes, stream.raw_bytes)
    check("stored bytes", manifest.stored_bytes, stream.stored_bytes)
    if carried:
        check("snapshots carried", [(s.name, s.guid) for s in manifest.snapshots],
              [(c.name, c.guid) for c in carried])
    check("volume count", len(manifest.volumes), len(volumes))
    # Counts that differ are a finding of their own (above); the pairs that exist compare.
    for mine, theirs in zip(manifest.volumes, volumes, strict=False):
        check(f"volume {theirs.index}", (mine.key, mine.raw_bytes, mine.stored_bytes, mine.sha256),
              (theirs.key, theirs.raw_bytes, theirs.stored_bytes, theirs.sha256))
    if not differ:
        return []
    return [_finding(stream, Severity.ERROR, f"the manifest of stream {stream.id}"
                     f" (@{stream.to_name}) disagrees with the catalog: {'; '.join(differ[:5])}"
                     + (f" and {len(differ) - 5} more" if len(differ) > 5 else ""),
                     "find out which side is right: `zbak audit --deep` reads the volumes; a"
                     " wrong catalog row is fixed by `zbak catalog rebuild`", key)]


def leftovers(listing: Mapping[str, ObjectInfo], known: set[str],
              known_prefixes: set[str], store: str) -> list[Finding]:
    """Information findings for objects no catalogued stream owns, one per stream directory.

    Args:
        listing: key -> ObjectInfo under the audited prefixes.
        known: every key the catalog records (volumes, manifests) in ``store``.
        known_prefixes: the object prefixes (ending in ``/``) of catalogued streams.
        store: the store's name.
    """
    groups: dict[str, list[str]] = {}
    for key in listing:
        if key not in known:
            head = key.rpartition("/")[0] + "/"
            groups.setdefault(head, []).append(key.rpartition("/")[2])
    found = []
    for head in sorted(groups):
        leaves = sorted(groups[head])
        if head in known_prefixes:
            if leaves == [PROGRESS]:
                problem = (f"a stale {PROGRESS} of a finished upload is left in {head}")
                action = "nothing to do; the next `zbak archive` removes it"
            else:
                problem = (f"{len(leaves)} object(s) in {head} not in the catalog:"
                           f" {', '.join(leaves[:5])}")
                action = "check what wrote them; zbak does not use them"
        elif is_stream_prefix(head) and (MANIFEST in leaves or MANIFEST_COPY in leaves):
            problem = f"stream {head} has a manifest but is not in the catalog"
            action = f"`zbak catalog rebuild {store} --merge` adds it to the catalog"
        elif is_stream_prefix(head) and PROGRESS in leaves:
            problem = (f"{head} is a partial upload of an interrupted archive run"
                       f" ({len(leaves)} object(s))")
            action = "the next `zbak archive` resumes or deletes it"
        else:
            problem = (f"{len(leaves)} object(s) in {head} not in the catalog:"
                       f" {', '.join(leaves[:5])}")
            action = "check what wrote them; zbak does not use them"
        found.append(Finding(Severity.INFO, "objects", problem, action, store=store, key=head))
    return found


def version_findings(pinned: Pinned, owned: Mapping[str, StreamRow]) -> list[Finding]:
    """Findings of a write-once store's versions (pure; ``objects.versions``): an error
    per catalogued key whose newest version or delete marker is not zbak's (tampering,
    docs/design.md#immutable-cold-storage), naming the key, zbak's version and the
    intruder's; information for the other versions of catalogued keys the catalog does
    not know. ``owned``: ``catalog.rows.owners``. zbak's version is still there, so nothing is
    marked bad: restore and audit read it."""
    found = []
    named: set[tuple[str, str]] = set()
    for tampered in pinned.tampered:
        stream = owned.get(tampered.key)
        if stream is None:
            continue
        named.add((tampered.key, tampered.latest.version_id))
        found.append(_finding(
            stream, Severity.ERROR, f"tampering: {tampered.key} of stream {stream.id}"
            f" (@{stream.to_name}) in store {stream.store} was {_tampered_how(tampered)}",
            _TAMPERED_ACTION, tampered.key))
    for key, versions in pinned.unknown.items():
        stream = owned.get(key)
        others = [v for v in versions if (key, v.version_id) not in named]
        if stream is None or not others:
            continue
        found.append(_finding(stream, Severity.INFO, _unknown_text(key, others),
                              "nothing reads them; check what wrote them", key))
    return found


_TAMPERED_ACTION = ("someone holding the store's credentials wrote it: find out who and replace"
                    " the keys; restores read zbak's version, which is still there")


def _tampered_how(tampered: Tampered) -> str:
    """What was done to a tampered key, and which version zbak wrote."""
    latest = tampered.latest
    when = f"{latest.info.modified:%Y-%m-%d %H:%M:%S}Z"
    what = (f"hidden by a delete marker ({when})" if latest.marker else
            f"overwritten by version {latest.version_id} ({latest.info.size:,} bytes, {when})")
    return f"{what} after zbak wrote version {tampered.own.version_id}; zbak writes each key once"


def _unknown_text(key: str, others: Sequence[Version]) -> str:
    return (f"{len(others)} version(s) of {key} the catalog does not know:"
            f" {', '.join(v.version_id for v in others[:3])}"
            + (f" and {len(others) - 3} more" if len(others) > 3 else ""))


def export_version_findings(pinned: Pinned, *, store: str) -> list[Finding]:
    """Findings of the versions of a job's catalog export generations in a write-once store
    (pure; ``objects.generations.job_generations`` pinned by ``objects.versions.pin``): an
    error per generation key whose newest version or delete marker is not zbak's
    (docs/decisions.md#write-once-catalog-exports: each generation is written once),
    information for its other versions. Nothing reads the newest versions: rollback checks
    read the versions the mark records, recoveries the store as of a time."""
    found = [Finding(Severity.ERROR, "objects", f"tampering: catalog export {t.key} in store"
                     f" {store} was {_tampered_how(t)}", _TAMPERED_ACTION, store=store, key=t.key)
             for t in pinned.tampered]
    named = {(t.key, t.latest.version_id) for t in pinned.tampered}
    for key, versions in pinned.unknown.items():
        others = [v for v in versions if (key, v.version_id) not in named]
        if others:
            found.append(Finding(Severity.INFO, "objects", _unknown_text(key, others),
                                 "nothing reads them; check what wrote them", store=store,
                                 key=key))
    return found


def foreign_generation_findings(versions: Iterable[Version], own: str, trusted: int, *,
                                store: str) -> list[Finding]:
    """An error per generation key of this machine's own export (single key ``own``)
    numbered above ``trusted``, the generation its mark trusts (pure): only this machine
    writes its own exports and it moves its mark right after each, so a higher generation
    is a forged catalog that a rebuild without ``--not-after`` would read
    (docs/decisions.md#write-once-catalog-exports); the one other way is an archive killed
    between the export and the mark, which the next archive moves past."""
    found: dict[str, int] = {}
    for v in versions:
        parsed = parse_export_key(v.info.key)
        if parsed is not None and parsed[0] == own and parsed[2] is not None \
                and parsed[2] > trusted:
            found[v.info.key] = parsed[2]
    return [Finding(Severity.ERROR, "objects", f"tampering: catalog export {key} in store"
                    f" {store} is generation {generation}, newer than generation {trusted}"
                    " this machine last wrote and trusts: another writer put it (or an archive"
                    " was killed before it recorded it)", "find out who wrote it and replace the"
                    " keys; this machine reads the generation its mark names, and a rebuild on"
                    " another host needs `zbak catalog rebuild --not-after` a time before it",
                    store=store, key=key)
            for key, generation in sorted(found.items())]


def unfinished_findings(uploads: Sequence[Unfinished], *, host: str, store: str,
                        now: dt.datetime, stale_after: dt.timedelta) -> list[Finding]:
    """A finding per leftover of an unfinished put (``Backend.unfinished_uploads``) under
    a job's prefix (pure), naming its key and size: bytes the store keeps (S3 bills the
    parts) that no listing shows. Information while it may be a put running now; a
    warning once it is older than ``stale_after`` (what ``zbak audit --repair`` removes by
    default). ``host``: the job's source host (keys start with it); ``now``: aware UTC.
    See ``docs/decisions.md#leftover-uploads-of-interrupted-archives``."""
    found = []
    for upload in uploads:
        dataset = stream_dataset(upload.key, host)
        size = "an unknown number of" if upload.size is None else f"{upload.size:,}"
        old = now - upload.since > stale_after
        found.append(Finding(
            Severity.WARNING if old else Severity.INFO, "objects",
            f"an unfinished upload of {upload.key} ({upload.what}, {size} bytes, last"
            f" written {upload.since:%Y-%m-%d %H:%M}Z) is kept in store {store}: a process"
            " was killed while it wrote; it is no object and nothing reads it",
            "none while an archive of this stream may run; the next `zbak archive` that"
            " resumes or gives up the stream removes it, `zbak audit --repair` removes it once"
            f" older than --stale-uploads-days ({stale_after.days} by default)",
            host=host if dataset is not None else None, dataset=dataset, store=store,
            key=upload.key))
    return found


def _read_manifest(backend: Backend, key: str,
                   versions: Mapping[str, str] | None) -> Loaded[Manifest]:
    return read_with_copy(backend, key, Manifest.from_json, StreamCorrupt, versions)


def must_read(stream_id: int, info: ObjectInfo, stamp: tuple[str, dt.datetime] | None,
              now: dt.datetime) -> bool:
    """Whether the audit reads a stream's manifest (listed as ``info``) instead of trusting
    the ``stamp`` (``(identity, read at)``, ``catalog.stamps``) of an earlier agreeing read:
    always without a stamp or an etag, when the listing's identity differs from the stamp's
    (the object was replaced or rewritten), and once the stamp is older than the stream's
    share of :data:`TRUST_MANIFESTS_FOR` (half of it plus ``stream_id mod 1000`` thousandths
    of the other half)."""
    if stamp is None or info.identity is None or stamp[0] != info.identity:
        return True
    share = TRUST_MANIFESTS_FOR * (0.5 + (stream_id % 1000) / 2000)
    return now - stamp[1] > share


@dataclasses.dataclass
class ObjectsAudit:
    """What :func:`audit_objects` found.

    Attributes:
        findings: every finding.
        seen: ``{stream id: identity}`` of the manifests read from their primary and found
            agreeing with the catalog: the stamps to record (``Catalog.stamp_manifests``).
        wrong: streams whose manifest was read and failed (unreadable, from its copy, or
            disagreeing): stamps to forget.
        read / trusted: manifests read, and trusted from their stamp without a read.
    """

    findings: list[Finding]
    seen: dict[int, str] = dataclasses.field(default_factory=dict)
    wrong: set[int] = dataclasses.field(default_factory=set)
    read: int = 0
    trusted: int = 0


def audit_objects(
    backend: Backend,
    streams: Sequence[StreamRow],
    volumes: Mapping[int, Sequence[VolumeRow]],
    carried: Mapping[int, Sequence[CarriedSnapshot]],
    listing: Mapping[str, ObjectInfo],
    *,
    known_streams: Sequence[StreamRow] | None = None,
    concurrency: int = 4,
    stamps: Mapping[int, tuple[str, dt.datetime]] | None = None,
    now: dt.datetime | None = None,
    versions: Mapping[str, str] | None = None,
) -> ObjectsAudit:
    """Check the objects of ``streams`` (all in ``backend``'s store) and list leftovers.

    Args:
        backend: the store (manifests are read from it).
        streams: the streams to check (condemned ones are skipped).
        volumes: their volume rows by stream id.
        carried: their carried snapshots by stream id.
        listing: key -> ObjectInfo of every object under the audited prefixes
            (``layout.dataset_prefix`` of each audited tree or dataset: ``audit.job``
            audits a large job in batches of datasets).
        known_streams: every catalogued stream of the store under those prefixes (also
            other jobs'), so their objects are not leftovers; default ``streams``.
        concurrency: manifests read at once.
        stamps: ``Catalog.manifest_stamps`` of the streams: manifests :func:`must_read`
            lets pass are not read; None or empty: every manifest is read.
        now: aware UTC, for the stamps' age (required with ``stamps``).
        versions: on a write-once store, key -> zbak's version of it
            (``objects.versions.Pinned.versions``): manifests are read by version.
    """
    result = ObjectsAudit([])
    findings = result.findings
    reads = []
    for stream in streams:
        if stream.state == "condemned":
            continue
        findings += compare_volumes(stream, volumes.get(stream.id, ()), listing)
        found, readable = _manifest_listed(stream, listing)
        findings += found
        if not readable:
            continue
        key = stream.object_prefix + MANIFEST
        info = listing.get(key)
        if (stamps and info is not None and now is not None
                and not must_read(stream.id, info, stamps.get(stream.id), now)):
            result.trusted += 1
            continue
        reads.append((stream, key))
    result.read = len(reads)
    _read_manifests(backend, reads, listing, volumes, carried, concurrency, result, versions)
    known: set[str] = set()
    known_prefixes: set[str] = set()
    for stream in known_streams if known_streams is not None else streams:
        known_prefixes.add(stream.object_prefix)
        known.add(stream.object_prefix + MANIFEST)
        known.add(stream.object_prefix + MANIFEST_COPY)
    for rows in volumes.values():
        known.update(v.key for v in rows)
    findings += leftovers(listing, known, known_prefixes, backend.name)
    return result


def _manifest_listed(stream: StreamRow, listing: Mapping[str, ObjectInfo]
                     ) -> tuple[list[Finding], bool]:
    """What the listing says of the stream's manifest and its copy (missing, or in a class
    read only after a thaw), and whether one of them is there to be read."""
    key = stream.object_prefix + MANIFEST
    info = listing.get(key)
    copy = listing.get(stream.object_prefix + MANIFEST_COPY)
    if info is None and copy is None:
        return [_finding(stream, Severity.WARNING, f"the manifest of stream {stream.id}"
                         f" (@{stream.to_name}) is missing: {key}", "the stream restores"
                         " without it, but `zbak catalog rebuild` cannot recover it; it is"
                         " rewritten only by a new chain", key)], False
    findings = []
    if info is None:
        findings.append(_finding(stream, Severity.WARNING, f"the manifest of stream"
                                 f" {stream.id} (@{stream.to_name}) is missing: {key}; its"
                                 f" copy {MANIFEST_COPY} is there and is used",
                                 f"copy {MANIFEST_COPY} to {MANIFEST} in the same folder", key))
    for each in (info, copy):
        if each is not None and each.storage_class != MANIFEST_CLASS:
            findings.append(_finding(stream, Severity.WARNING, f"the manifest {each.key} is in"
                                     f" storage class {each.storage_class}, not"
                                     f" {MANIFEST_CLASS}", "check the bucket's lifecycle rules:"
                                     " manifests must stay readable without a thaw", each.key))
    return findings, True


def _read_manifests(backend: Backend, reads: Sequence[tuple[StreamRow, str]],
                    listing: Mapping[str, ObjectInfo],
                    volumes: Mapping[int, Sequence[VolumeRow]],
                    carried: Mapping[int, Sequence[CarriedSnapshot]],
                    concurrency: int, result: ObjectsAudit,
                    versions: Mapping[str, str] | None) -> None:
    """Read the manifests ``reads`` names (``concurrency`` at once, the copy where the primary
    fails), compare each with its stream's catalog rows, and add the findings, the
    identities to stamp and the streams whose manifest failed to ``result``."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, concurrency))
    try:
        for stream, key, future in _in_window(pool, reads, backend, 4 * max(1, concurrency),
                                              versions):
            try:
                loaded = future.result()
            except (StreamCorrupt, ObjectNotFound, NeedsThaw, StoreError) as exc:
                result.findings.append(_finding(
                    stream, Severity.ERROR, f"the manifest of stream {stream.id} cannot be"
                    f" read: {exc}", "`zbak catalog rebuild` cannot use it; check the store",
                    key))
                result.wrong.add(stream.id)
                continue
            found = []
            if loaded.from_copy and key in listing:
                found.append(_finding(stream, Severity.WARNING, f"the manifest of stream"
                                      f" {stream.id} fails its checks:"
                                      f" {loaded.primary_problem}; its copy is used",
                                      f"copy {MANIFEST_COPY} over {MANIFEST} in the same"
                                      " folder (the copy passed its checksum)", key))
            found += compare_manifest(stream, volumes.get(stream.id, ()),
                                      carried.get(stream.id, ()), loaded.value, loaded.key)
            result.findings += found
            identity = listing[key].identity if key in listing else None
            if found or loaded.from_copy:
                result.wrong.add(stream.id)
            elif identity is not None:
                result.seen[stream.id] = identity
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


_Reading = tuple[StreamRow, str, concurrent.futures.Future[Loaded[Manifest]]]


def _in_window(pool: concurrent.futures.Executor, reads: Sequence[tuple[StreamRow, str]],
               backend: Backend, window: int,
               versions: Mapping[str, str] | None) -> Iterator[_Reading]:
    """``(stream, key, future of its manifest)`` in the order of ``reads``, at most
    ``window`` reads submitted ahead: the first audit of 100,000 streams held every parsed
    manifest at once (1 GiB) when all were submitted up front."""
    pending: collections.deque[_Reading] = collections.deque()
    for stream, key in reads:
        pending.append((stream, key, pool.submit(_read_manifest, backend, key, versions)))
        if len(pending) >= window:
            yield pending.popleft()
    while pending:
        yield pending.popleft()
