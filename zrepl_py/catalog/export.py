"""The catalog export in each store, and rollback detection
(docs/reliability.md#r25-catalog-rollback-detection and
docs/reliability.md#r26-catalog-metadata-copy-with-checksum).

Each store holds, per machine and job, ``_zbak/catalog/NODE/JOB.json`` (``layout.export_key``)
and its ``.copy``, both STANDARD class, put primary first. The object is an envelope::

    {"format": "zbak-catalog/1", "sha256": "<hex of the canonical JSON of 'catalog'>",
     "catalog": {"generation": 7, "written_at": "2026-01-01T00:00:00Z", "node": "backup1",
                 "job": "nightly", "store": "cold", "tool": "zbak 0.1.0",
                 "streams": [{"prefix": "local/tank/data/...-full-.../", "host": "local",
                              "dataset": "tank/data", "kind": "full", "from_guid": null,
                              "to_guid": "123", "to_name": "zbak_...", "to_createtxg": 9,
                              "state": "verified", "raw_bytes": 1, "stored_bytes": 1,
                              "verified_at": "2026-01-01T00:00:00Z"}, ...]}}

``streams`` are the job's catalogued streams in that store (condemned ones left out): what
``zbak catalog rebuild`` cannot learn from the manifests (which streams were verified or
bad, which streams existed whose manifests are gone).

``generation`` grows by one at every rewrite, after each ``zbak archive`` or ``zbak prune``
whose rows differ from the export (or when the export or its copy is missing or damaged).
After both objects are written, the generation is recorded as this machine's high-water mark
``<state_dir>/catalog-marks/STORE/_zbak/catalog/NODE/JOB.json``. Before an archive, prune or
restore touches a store, every mark of that store is compared with the export it names: an
export older than the mark, or missing, means the store was rolled back, restored from an
older copy or replaced (borg ``RepositoryReplay``), and the run stops with ``CatalogReplay``.
A store without marks (a new machine, or a deployment from before exports) is accepted and
the first archive or prune writes the export.

On a store that keeps versions (S3 Object Lock) no key is written twice
(docs/decisions.md#write-once-catalog-exports): each generation goes under a key of its own,
``_zbak/catalog/NODE/JOB/GNNNNNNNNNN.json`` and its copy (``layout.generation_key``), numbered
above every generation key the store ever held (delete markers included). The mark names
that key, the version ids the puts answered and their lock (the earlier of the two), so the
check reads exactly the versions zbak wrote (an overwrite or a delete marker since changes
nothing it reads), archive and audit extend that lock as the rolling lock does
(:meth:`StoreGuard.extend_lock`), and prune deletes older generations once their locks lapse
(:meth:`StoreGuard.prune_generations`). Readers take per ``NODE/JOB`` the newest generation
that reads (:func:`read_exports`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import socket
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from zrepl_py import __version__
from zrepl_py.catalog.rows import StreamRow
from zrepl_py.errors import (
    CatalogExportCorrupt,
    CatalogReplay,
    ObjectNotFound,
    StoreError,
    ZbakError,
)
from zrepl_py.objects.checked import canonical_sha256, put_with_copy, read_object, read_with_copy
from zrepl_py.objects.generations import candidates, next_generation, stale_versions
from zrepl_py.objects.layout import (
    EXPORT_PREFIX,
    copy_key,
    export_key,
    generation_key,
    generations_prefix,
)
from zrepl_py.runtime.statedir import write_private_file
from zrepl_py.stores.base import Backend, ObjectInfo, PutResult

log = logging.getLogger(__name__)

FORMAT = "zbak-catalog/1"
MARKS_DIR = "catalog-marks"
_TIME = "%Y-%m-%dT%H:%M:%SZ"
_ROW_FIELDS = ("prefix", "host", "dataset", "kind", "from_guid", "to_guid", "to_name",
               "to_createtxg", "state", "raw_bytes", "stored_bytes", "verified_at")


def _time_out(value: dt.datetime | None) -> str | None:
    return None if value is None else value.astimezone(dt.UTC).strftime(_TIME)


def parse_time(value: str) -> dt.datetime:
    """An export timestamp (``YYYY-MM-DDTHH:MM:SSZ``) as an aware UTC datetime.

    Raises:
        ValueError: another format.
    """
    return dt.datetime.strptime(value, _TIME).replace(tzinfo=dt.UTC)


def export_rows(streams: Sequence[StreamRow]) -> list[dict[str, Any]]:
    """The export's ``streams`` list for catalog rows (condemned ones left out), in the
    rows' order; guids as decimal strings, times as ``YYYY-MM-DDTHH:MM:SSZ`` (pure)."""
    return [{"prefix": s.object_prefix, "host": s.host, "dataset": s.dataset, "kind": s.kind,
             "from_guid": None if s.from_guid is None else str(s.from_guid),
             "to_guid": str(s.to_guid), "to_name": s.to_name, "to_createtxg": s.to_createtxg,
             "state": s.state, "raw_bytes": s.raw_bytes, "stored_bytes": s.stored_bytes,
             "verified_at": _time_out(s.verified_at)}
            for s in streams if s.state != "condemned"]


@dataclasses.dataclass(frozen=True)
class CatalogExport:
    """One export (see the module docstring): ``generation`` >= 1, ``written_at`` aware UTC,
    ``streams`` as :func:`export_rows` makes them."""

    generation: int
    written_at: dt.datetime
    node: str
    job: str
    store: str
    tool: str
    streams: tuple[dict[str, Any], ...]

    def to_json(self) -> bytes:
        """The envelope as UTF-8 JSON, its ``sha256`` over the canonical ``catalog``."""
        body = {"generation": self.generation, "written_at": _time_out(self.written_at),
                "node": self.node, "job": self.job, "store": self.store, "tool": self.tool,
                "streams": list(self.streams)}
        return json.dumps({"format": FORMAT, "sha256": canonical_sha256(body), "catalog": body},
                          indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> CatalogExport:
        """Parse and check an export read from ``where`` (``STORE:KEY``, for messages).

        Raises:
            CatalogExportCorrupt: not JSON, another format, a ``sha256`` that does not match
                the content, missing or ill-typed fields.
        """
        try:
            obj = json.loads(data)
            if not isinstance(obj, dict) or obj.get("format") != FORMAT:
                raise ValueError(f"not a {FORMAT} object")
            body = obj["catalog"]
            if obj["sha256"] != canonical_sha256(body):
                raise ValueError("its content does not match its sha256 (changed bytes)")
            streams = tuple(body["streams"])
            for row in streams:
                if not isinstance(row, dict) or set(row) != set(_ROW_FIELDS):
                    raise ValueError(f"a stream row has other fields than {_ROW_FIELDS}")
            export = cls(generation=body["generation"], written_at=parse_time(body["written_at"]),
                         node=body["node"], job=body["job"], store=body["store"],
                         tool=body["tool"], streams=streams)
            if not isinstance(export.generation, int) or export.generation < 1:
                raise ValueError(f"generation {export.generation!r} is not a positive integer")
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            raise CatalogExportCorrupt(f"catalog export {where} is not a valid {FORMAT}"
                                       f" object: {exc}") from None
        return export


@dataclasses.dataclass(frozen=True)
class LoadedExport:
    """An export as read: the value, and whether the primary and its copy are both present,
    valid and equal (``healthy``; else the next write repairs them)."""

    export: CatalogExport
    healthy: bool


def load_export(backend: Backend, key: str,
                versions: Mapping[str, str] | None = None) -> LoadedExport | None:
    """Read the export at ``key`` (falling back to ``KEY.copy``); None when neither exists.
    ``versions``: key -> the version to read (``objects.checked.read_object``).

    Raises:
        CatalogExportCorrupt: the primary and the copy both fail (message names both).
        StoreError: the store failed and no copy answered.
    """
    try:
        loaded = read_with_copy(backend, key, CatalogExport.from_json, CatalogExportCorrupt,
                                versions)
    except ObjectNotFound:
        return None
    healthy = not loaded.from_copy
    if healthy:
        try:
            healthy = CatalogExport.from_json(read_object(backend, copy_key(key), versions),
                                              copy_key(key)) == loaded.value
        except (StoreError, CatalogExportCorrupt):
            healthy = False
    return LoadedExport(loaded.value, healthy)


def check_generation(key: str, store: str, found: int | None, mark: int | None,
                     mark_file: Path) -> None:
    """Refuse a store whose export ``key`` is behind this machine's high-water ``mark`` (pure).

    Args:
        key / store: the export and the store's name, for the message.
        found: the export's generation in the store, None when it is missing.
        mark: the generation this machine last wrote there, None when it never did.
        mark_file: the mark's file, named in the message.

    Raises:
        CatalogReplay: ``mark`` is set and ``found`` is missing or lower.
    """
    if mark is None or (found is not None and found >= mark):
        return
    seen = "is missing" if found is None else f"has generation {found}"
    raise CatalogReplay(
        f"store {store}: the catalog export {key} {seen}, but this machine wrote generation"
        f" {mark} there: the store was rolled back, restored from an older copy or replaced,"
        " so objects zbak wrote may be gone. Nothing was done. Find out what happened to the"
        f" store; once it is the one to keep, run `zbak audit` (and `zbak catalog rebuild"
        f" {store} --merge` for streams the catalog lacks), then remove {mark_file} to accept"
        " it; the next archive or prune writes a new export")


def marks_dir(state_dir: Path, store: str) -> Path:
    """``<state_dir>/catalog-marks/STORE``: this machine's high-water marks for ``store``."""
    return state_dir / MARKS_DIR / store


def mark_file(state_dir: Path, store: str, key: str) -> Path:
    """The mark file of export ``key`` in ``store`` (the key's path under :func:`marks_dir`)."""
    return marks_dir(state_dir, store) / key


@dataclasses.dataclass(frozen=True)
class Mark:
    """This machine's high-water mark of one export (module docstring).

    Attributes:
        key: the key of the generation it trusts: the single key (``layout.export_key``),
            or on a store that keeps versions that generation's own key.
        generation: >= 1.
        versions: key -> the version id zbak wrote there (the generation's primary and
            copy; empty where the store keeps no versions).
        retain_until: the earlier lock of the two (aware UTC); None without a lock.
    """

    key: str
    generation: int
    versions: Mapping[str, str] = dataclasses.field(default_factory=dict)
    retain_until: dt.datetime | None = None


def read_mark(path: Path) -> Mark | None:
    """The mark recorded in file ``path``, None when there is none (a mark written before
    versions were recorded has none of them).

    Raises:
        ZbakError: the file exists but cannot be read or parsed (the message names it).
    """
    try:
        obj = json.loads(path.read_bytes())
        generation, key = obj["generation"], obj["key"]
        if not isinstance(generation, int) or generation < 1:
            raise ValueError(f"generation {generation!r}")
        versions = obj.get("versions", {})
        if not isinstance(key, str) or not isinstance(versions, dict) or not all(
                isinstance(v, str) for v in (*versions, *versions.values())):
            raise ValueError("key or versions of the wrong type")
        until = obj.get("retain_until")
        return Mark(key, generation, versions, None if until is None else parse_time(until))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ZbakError(f"the catalog high-water mark {path} cannot be read ({exc}); remove it"
                        " to accept the store's export as it is") from None


def write_mark(path: Path, mark: Mark, now: dt.datetime) -> None:
    """Record ``mark`` in mark file ``path`` (atomic, mode 0600).

    Raises:
        OSError: the state directory cannot be written.
    """
    data = {"key": mark.key, "generation": mark.generation, "written_at": _time_out(now),
            "versions": dict(mark.versions), "retain_until": _time_out(mark.retain_until)}
    write_private_file(path, json.dumps(data).encode())


def _stored(key: str, puts: tuple[PutResult, PutResult]) -> tuple[dict[str, str],
                                                                  dt.datetime | None]:
    """The version ids ``put_with_copy`` answered for ``key`` and its copy, and the earlier
    of their locks (None when either has none)."""
    versions = {k: put.version_id for k, put in zip((key, copy_key(key)), puts, strict=True)
                if put.version_id is not None}
    dates = [put.retain_until for put in puts]
    return versions, None if None in dates else min(d for d in dates if d is not None)


def node_name() -> str:
    """This machine's name in export keys (its hostname)."""
    return socket.gethostname()


class StoreGuard:
    """Rollback check before a run touches a store, and the export write after it.

    Args:
        backend: the store; store: its name in the config.
        state_dir: zbak's state directory (marks live under ``catalog-marks``).
        job: the job whose export :meth:`publish` writes (None: check only, e.g. restore).
        node: this machine's name (default the hostname).
    """

    def __init__(self, backend: Backend, store: str, state_dir: Path, *, job: str | None = None,
                 node: str | None = None):
        self.backend = backend
        self.store = store
        self.state_dir = state_dir
        self.job = job
        self.key = export_key(node or node_name(), job) if job is not None else None
        self.node = node or node_name()
        self._loaded: LoadedExport | None = None
        self._checked = False

    def _load(self, key: str, mark_key: str,
              versions: Mapping[str, str] | None = None) -> LoadedExport | None:
        try:
            return load_export(self.backend, key, versions)
        except CatalogExportCorrupt as exc:
            raise CatalogExportCorrupt(
                f"{exc}. Nothing was done: zbak cannot tell whether store {self.store} was"
                " rolled back. Check the store (`zbak audit`); once it is the one to keep,"
                f" delete {key} and {copy_key(key)} from it and remove"
                f" {mark_file(self.state_dir, self.store, mark_key)}: the next archive or prune"
                " writes the export again") from None

    def _own(self) -> tuple[str, str, Path]:
        """The job, its export's single key and this machine's mark file of it."""
        if self.key is None or self.job is None:
            raise ValueError("a StoreGuard without a job has no export of its own")
        return self.job, self.key, mark_file(self.state_dir, self.store, self.key)

    def mark(self) -> Mark | None:
        """This machine's mark of the job's export in the store, None when it has none.

        Raises:
            ValueError: the guard has no job; ZbakError: the mark is unreadable.
        """
        return read_mark(self._own()[2])

    def check(self) -> None:
        """Compare every mark of this store with the export it names (module docstring):
        the generation the mark trusts, read by the versions it records.

        Raises:
            CatalogReplay: an export is missing or older than its mark.
            CatalogExportCorrupt: an export and its copy both fail their checks.
            StoreError: the store failed; ZbakError: a mark file is unreadable.
        """
        keys = set()
        root = marks_dir(self.state_dir, self.store)
        if root.is_dir():
            keys = {p.relative_to(root).as_posix() for p in root.rglob("*.json")
                    if p.is_file() and not p.name.startswith(".")}
        if self.key is not None:
            keys.add(self.key)
        for key in sorted(keys):
            path = mark_file(self.state_dir, self.store, key)
            mark = read_mark(path)
            at = key if mark is None else mark.key
            # by the versions zbak wrote, where the store keeps them
            pinned = mark.versions if mark is not None and self.backend.keeps_versions else None
            loaded = self._load(at, key, pinned)
            if key == self.key:
                self._loaded = loaded
            check_generation(at, self.store, loaded.export.generation if loaded else None,
                             None if mark is None else mark.generation, path)
        self._checked = True

    def forget(self) -> None:
        """Remove this machine's mark of the job's export in the store, for a refill: when the
        catalog holds none of the job's streams in the store, a store behind the mark (wiped,
        replaced) hides nothing the catalog relies on, and ``zbak copy`` checks every volume
        it puts there (docs/copies.md#refilling-a-lost-store).

        Raises:
            ValueError: the guard has no job.
            OSError: the mark could not be removed.
        """
        _, key, path = self._own()
        if path.exists():
            path.unlink()
            log.warning("store %s: the catalog holds no stream of job %s there: forgot this"
                        " machine's mark of its export %s; the store is filled again from"
                        " the start", self.store, self.job, key)

    def publish(self, streams: Sequence[StreamRow], now: dt.datetime) -> int | None:
        """Write the job's export for ``streams`` when it differs from the stored one or is
        not healthy, then record the new generation as the mark; return it (None: nothing
        to write). On a store that keeps versions the generation goes under a key of its
        own (module docstring).

        Raises:
            ValueError: the guard has no job.
            CatalogReplay, CatalogExportCorrupt: as :meth:`check` (run first when not yet).
            StoreError: a put failed (the mark is unchanged: the store is ahead, not behind).
            OSError: the mark could not be written.
        """
        job, single, path = self._own()
        if not self._checked:
            self.check()
        rows = tuple(export_rows(streams))
        old = self._loaded
        if old is not None and old.healthy and old.export.streams == rows:
            return None
        mark = read_mark(path)
        floor = max(old.export.generation if old else 0, mark.generation if mark else 0)
        if self.backend.keeps_versions:
            generation = next_generation(
                (v.info.key for v in self.backend.list_versions(generations_prefix(single))),
                floor)
            key = generation_key(single, generation)
        else:
            generation, key = floor + 1, single
        export = CatalogExport(generation, now, self.node, job, self.store,
                               f"zbak {__version__}", rows)
        versions, until = _stored(key, put_with_copy(self.backend, key, export.to_json()))
        write_mark(path, Mark(key, generation, versions, until), now)
        self._loaded = LoadedExport(export, True)
        log.info("store %s: catalog export %s is now generation %d (%d streams)", self.store,
                 key, generation, len(rows))
        return generation

    def extend_lock(self, now: dt.datetime) -> dt.datetime | None:
        """Extend the Object Lock of the generation this machine's mark trusts (primary and
        copy) to now + period once less than half the period is left, as the rolling lock
        does for volumes (``archive.rolling_lock``), and record the new date in the mark;
        return it (None: nothing was due, no lock store, or no mark with versions).

        Raises:
            ValueError: the guard has no job.
            StoreError: an extension failed (the mark keeps the old date).
            ZbakError: the mark is unreadable; OSError: it could not be written.
        """
        _, _, path = self._own()
        policy = self.backend.lock_policy
        mark = read_mark(path)
        if (policy is None or mark is None or mark.retain_until is None or not mark.versions
                or not policy.due(mark.retain_until, now)):
            return None
        until = min(self.backend.lock_version(key, version)
                    for key, version in mark.versions.items())
        write_mark(path, dataclasses.replace(mark, retain_until=until), now)
        log.info("store %s: extended the Object Lock of catalog export %s to %s", self.store,
                 mark.key, _time_out(until))
        return until

    def prune_generations(self, now: dt.datetime) -> list[tuple[str, str]]:
        """On a store that keeps versions, delete by version id every version and delete
        marker of the job's older export generations whose lock has lapsed (HeadObject of
        each version: whatever lock the store holds); never the newest generation's keys
        nor those this machine's mark trusts. Returns the ``(key, version id)`` deleted.

        Raises:
            ValueError: the guard has no job.
            StoreError: listing, a HeadObject or a delete failed (the rest waits for the
                next prune); ZbakError: the mark is unreadable.
        """
        job, single, path = self._own()
        if not self.backend.keeps_versions:
            return []
        mark = read_mark(path)
        keep = set() if mark is None else {mark.key, copy_key(mark.key)}
        listed = [v for v in self.backend.list_versions(single.removesuffix(".json"))
                  if v.info.key.startswith((single, generations_prefix(single)))]
        deleted = []
        for version in stale_versions(listed, keep):
            key, version_id = version.info.key, version.version_id
            until = None if version.marker else self.backend.retain_until(key, version_id)
            if until is not None and until > now:
                log.info("store %s: kept %s (version %s) of an older catalog export: locked"
                         " until %s", self.store, key, version_id, _time_out(until))
                continue
            self.backend.delete_version(key, version_id)
            deleted.append((key, version_id))
        if deleted:
            log.info("store %s: deleted %d version(s) of older catalog exports of job %s",
                     self.store, len(deleted), job)
        return deleted


def read_exports(backend: Backend, listing: Iterable[ObjectInfo] | None = None,
                 versions: Mapping[str, str] | None = None,
                 ) -> tuple[list[tuple[str, CatalogExport]], list[tuple[str, str]]]:
    """The newest catalog export of each ``NODE/JOB`` in the store as ``(key, export)``: of
    its single key and its newest generation key that reads (copies used where a primary
    fails), the higher generation; and ``(key, why)`` for those that cannot be read.
    ``listing``/``versions``: the objects and the version of each key to read (default:
    the store's listing, newest).

    Raises:
        StoreError: listing the store failed.
    """
    objects = backend.list(EXPORT_PREFIX) if listing is None else listing
    found: list[tuple[str, CatalogExport]] = []
    bad: list[tuple[str, str]] = []

    def load(key: str) -> CatalogExport | None:
        try:
            loaded = load_export(backend, key, versions)
        except (CatalogExportCorrupt, StoreError) as exc:
            bad.append((key, str(exc)))
            return None
        return None if loaded is None else loaded.export

    found_keys = candidates(info.key for info in objects)
    for single in sorted(found_keys):
        keys = found_keys[single]
        read = [(key, export) for key in ([keys.single] if keys.single else [])
                if (export := load(key)) is not None]
        for key in keys.generations:  # newest first: the first that reads
            if (export := load(key)) is not None:
                read.append((key, export))
                break
        if read:
            found.append(max(read, key=lambda ke: ke[1].generation))
    return found, bad
