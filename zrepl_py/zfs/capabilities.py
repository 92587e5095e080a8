"""What a host's ZFS can do, found with a few cheap, read-only probe commands.

zbak runs against OpenZFS 2.x and against zfs-fuse 0.7 (pool version 23, the test bed),
which lacks ``list -p``, resume tokens, bookmarks, ``send -c/-w``, multi-snapshot
``zfs snapshot`` and a working ``zfs holds``. Rather than parse version strings (zfs-fuse
has no ``zfs version``), ``detect`` asks each question directly:

1. ``zpool get -Hp -o property,value all POOL`` gives the pool version and every
   ``feature@NAME`` state (OpenZFS). zfs-fuse's ``zpool get`` has no ``-H``/``-o``; then
   ``zpool get version POOL`` is read as a table (NAME PROPERTY VALUE SOURCE).
   Feature-flag pools print ``version`` as ``-``: that is pool version 5000
   (zpool-features(7)). Holds need pool version 18 or feature flags (``zpool upgrade -v``:
   "18 Snapshot user holds"); bookmarks need ``feature@bookmarks`` enabled or active;
   resume tokens need ``feature@extensible_dataset`` (zfs-receive(8) ``-s``).
2. ``zfs list -Hp -o name -d 0 POOL``: success means ``list -p`` (exact numbers) exists;
   "invalid option 'p'" means not.
3. ``zfs get -H -o value receive_resume_token POOL``: success means the property (and
   ``receive -s`` / ``send -t``) exists; "bad property list: invalid property" means not.
4. ``zfs holds -H POOL@<probe>``: "dataset does not exist" means ``zfs holds`` works;
   zfs-fuse answers "internal error: /usr/lib/zfs/pyzfs.py not found" for any call.
5. ``zfs send -c -w`` with no snapshot (it sends nothing): "invalid option 'c'" means
   neither flag exists (``-c`` came first, OpenZFS 0.7), "invalid option 'w'" means ``-c``
   only (``-w`` came with encryption, OpenZFS 0.8); any other complaint ("missing
   snapshot argument") means both parsed.
6. ``zfs snapshot POOL@zbak%probe1 POOL@zbak%probe2``: OpenZFS validates every name before
   creating anything and refuses ``%`` ("invalid character '%' in name", libzfs
   ``zfs_validate_name`` with modifying=true), so nothing is created; zfs-fuse refuses
   any second name ("too many arguments"). Any other answer counts as unsupported.
7. ``zfs receive -x mountpoint`` with no dataset (it reads no stream): OpenZFS 0.7+ answers
   "missing snapshot argument", zfs-fuse "invalid option 'x'" (its ``receive [-vnF]`` has
   neither ``-o`` nor ``-x``, verified on 0.7.0).
8. ``zfs get -H -t filesystem -o value type POOL``: success means ``zfs get`` takes ``-t``
   (a typed listing leaves snapshots out); zfs-fuse answers "invalid option 't'".
9. ``zfs get -H -o value written POOL``: success means the ``written`` property (bytes
   written since the previous snapshot, zfsprops(7)) exists; zfs-fuse answers "bad property
   list: invalid property 'written'".

``fingerprint`` is the one cheap question a cached answer is checked against
(``zfs/capability_cache.py``): ``zpool get all POOL``, in the plain table form both zfs-fuse
and OpenZFS print, reduced to the pool's guid, version and every ``feature@`` state.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from typing import Any, ClassVar

from zrepl_py.errors import CommandFailed, DatasetNotFound, InvalidName, Unsupported, ZfsError
from zrepl_py.proc.executor import Completed, Executor
from zrepl_py.zfs.errors import map_error, parsed_names, refused_option, wants_snapshot
from zrepl_py.zfs.names import DatasetName

FEATURE_FLAGS_VERSION = 5000
"""Pool version of feature-flag pools (zpool-features(7)); ``version`` prints ``-`` there."""

HOLDS_VERSION = 18
"""First pool version with user holds (``zpool upgrade -v``)."""

_PROBE_SNAPSHOT = "zbak-capability-probe"


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """Features of one host's zfs/zpool commands and one of its pools.

    Attributes:
        parsable_list: ``zfs list -p`` exists (exact numbers from ``zfs list``).
        resume_tokens: ``receive_resume_token``, ``receive -s`` and ``send -t`` exist.
        bookmarks: ``zfs bookmark`` works on this pool (``feature@bookmarks``).
        raw_send: ``zfs send -w`` parses.
        compressed_send: ``zfs send -c`` parses.
        holds: ``zfs hold``/``release`` work (pool version >= 18 or feature flags).
        list_holds: ``zfs holds`` lists tags (False on zfs-fuse: its ``zfs holds`` needs
            a missing Python helper; use ``SnapshotInfo.userrefs`` for "is it held").
        multi_snapshot: one ``zfs snapshot`` takes several names, created atomically.
        pool_version: the pool's SPA version, 5000 for feature-flag pools, None when
            unknown.
        receive_properties: ``zfs receive`` takes ``-o PROP=VALUE`` and ``-x PROP``.
        features: ``(name, state)`` of the pool's features that are ``enabled`` or
            ``active`` (``zpool get feature@NAME``), sorted; empty on pools without
            feature flags (zfs-fuse, or one created with ``zpool create -d``).
        typed_get: ``zfs get -t filesystem,volume`` exists (False on zfs-fuse, whose
            ``zfs get -r`` lists every snapshot too).
        written: the ``written`` property exists (False on zfs-fuse): what
            ``[jobs.NAME.snapshot] min_change`` needs.
    """

    parsable_list: bool
    resume_tokens: bool
    bookmarks: bool
    raw_send: bool
    compressed_send: bool
    holds: bool
    multi_snapshot: bool
    pool_version: int | None
    list_holds: bool = False
    receive_properties: bool = False
    features: tuple[tuple[str, str], ...] = ()
    typed_get: bool = False
    written: bool = False

    NONE: ClassVar[Capabilities]
    """Assume nothing beyond what every supported ZFS has (the default before ``detect``)."""

    @property
    def send_writes_stream(self) -> bool:
        """The ``zfs send`` process writes the stream itself, so its own I/O counter
        (/proc/PID/io ``wchar``) measures it: true of OpenZFS (verified equal to the stream
        size on 2.3.2, proc/pipeline.py), false of zfs-fuse, whose daemon writes it. Of the
        ZFS zbak supports, zfs-fuse alone lacks ``zfs list -p``, which tells them apart."""
        return self.parsable_list

    @property
    def send_dry_run(self) -> bool:
        """``zfs send -n -P`` prints the stream's expected size (``zfs.estimate``): true of
        OpenZFS (since long before 2.x; verified on 2.3.2); zfs-fuse's send has neither
        flag. Of the ZFS zbak supports, zfs-fuse alone lacks ``zfs list -p``, which tells
        them apart."""
        return self.parsable_list

    def feature_enabled(self, name: str) -> bool:
        """True when the pool has ``feature@name`` enabled or active (it can receive blocks
        that need it)."""
        return any(feature == name for feature, _ in self.features)

    def feature_active(self, name: str) -> bool:
        """True when ``feature@name`` is active: some block of the pool uses it (a stream
        sent from it may need the feature, zpool-features(7))."""
        return (name, "active") in self.features

    def to_json(self) -> dict[str, Any]:
        """Return the fields as a JSON-ready dict (``from_json`` reads it back)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Capabilities:
        """Rebuild Capabilities from ``to_json`` output, checking every field's type.

        Raises:
            ValueError: a field is missing, unknown or of the wrong type (e.g. written by
                another zbak version): the caller detects again instead of trusting it.
        """
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if not isinstance(data, Mapping) or set(data) != set(fields):
            shown = sorted(data) if isinstance(data, Mapping) else data
            raise ValueError(f"capability fields {shown!r} are not {sorted(fields)}")
        values = dict(data)
        for name, value in data.items():
            if name == "pool_version":
                ok = value is None or (isinstance(value, int) and not isinstance(value, bool))
            elif name == "features":
                ok = isinstance(value, (list, tuple)) and all(
                    isinstance(pair, (list, tuple)) and len(pair) == 2
                    and all(isinstance(part, str) for part in pair) for pair in value)
                if ok:
                    values[name] = tuple(tuple(pair) for pair in value)
            else:
                ok = isinstance(value, bool)
            if not ok:
                raise ValueError(f"capability {name} has the wrong type: {value!r}")
        return cls(**values)


Capabilities.NONE = Capabilities(
    parsable_list=False,
    resume_tokens=False,
    bookmarks=False,
    raw_send=False,
    compressed_send=False,
    holds=False,
    multi_snapshot=False,
    pool_version=None,
    list_holds=False,
    receive_properties=False,
    features=(),
    typed_get=False,
    written=False,
)


def _pool_properties(
    executor: Executor, pool: str, zpool: str, timeout: float | None
) -> dict[str, str]:
    argv = [zpool, "get", "-Hp", "-o", "property,value", "all", pool]
    done = executor.run(argv, check=False, timeout=timeout)
    if done.returncode == 0:
        props = {}
        for line in done.text.splitlines():
            prop, _, value = line.partition("\t")
            props[prop] = value
        return props
    # zfs-fuse takes the flags for property names: "bad property list: invalid property '-Hp'".
    if not isinstance(failure := _failure(done, executor), Unsupported):
        raise failure
    argv = [zpool, "get", "version", pool]
    done = executor.run(argv, check=False, timeout=timeout)
    if done.returncode != 0:
        raise _failure(done, executor)
    props = {}
    for line in done.text.splitlines()[1:]:
        fields = line.rsplit(None, 3)
        if len(fields) == 4:
            props[fields[1]] = fields[2]
    return props


def _failure(done: Completed, executor: Executor) -> ZfsError:
    message = done.error_text or done.text.strip()
    return map_error(CommandFailed(list(done.argv), done.returncode, message, executor.host))


def _pool_version(props: dict[str, str]) -> int | None:
    value = props.get("version", "")
    if value.isdigit():
        return int(value)
    if value == "-" and any(key.startswith("feature@") for key in props):
        return FEATURE_FLAGS_VERSION
    return None


def _feature(props: dict[str, str], name: str) -> bool:
    return props.get(f"feature@{name}") in ("enabled", "active")


def _features(props: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((key.removeprefix("feature@"), value) for key, value in props.items()
                        if key.startswith("feature@") and value in ("enabled", "active")))


def fingerprint(
    executor: Executor, pool: str, *, zpool: str = "zpool", timeout: float | None = None
) -> str | None:
    """Return a short digest of what decides ``detect``'s answer for ``pool``, or None.

    One command, ``zpool get all POOL`` (the table form: zfs-fuse has no ``-H``/``-o``); the
    digest covers the pool's ``guid`` (another pool under the same name), ``version`` and
    every ``feature@NAME`` row with its state (``zpool upgrade``, a feature enabled, newer
    software listing new features). Those rows' values never hold spaces, so the columns
    NAME PROPERTY VALUE SOURCE split on whitespace. A software update that adds no pool
    feature does not change it: the cache's TTL bounds that.

    Args:
        executor: where ``pool`` is imported.
        pool: the pool name (checked by the caller).
        zpool: the zpool command on that host.
        timeout: seconds the command may take.

    Returns:
        32 hex digits, or None when the command failed or printed no guid (then detect).

    Raises:
        HostUnreachable, HostKeyMismatch: the host cannot be reached.
    """
    done = executor.run([zpool, "get", "all", pool], check=False, timeout=timeout)
    if done.returncode != 0:
        return None
    rows = []
    for line in done.text.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[0] == pool and (
            fields[1] in ("guid", "version") or fields[1].startswith("feature@")
        ):
            rows.append(f"{fields[1]}={fields[2]}")
    if not any(row.startswith("guid=") for row in rows):
        return None
    return hashlib.sha256("\n".join(sorted(rows)).encode()).hexdigest()[:32]


def detect(
    executor: Executor,
    pool: str,
    *,
    zfs: str = "zfs",
    zpool: str = "zpool",
    timeout: float | None = None,
) -> Capabilities:
    """Probe the ZFS on ``executor``'s host and ``pool`` (see the module doc for each probe).

    Args:
        executor: runs the probes; none of them changes anything.
        pool: an imported pool on that host.
        zfs, zpool: the commands to run (a path on hosts where they are not on PATH).
        timeout: seconds each probe may take (None: no limit).

    Raises:
        InvalidName: ``pool`` is not a valid pool name.
        DatasetNotFound: the pool does not exist.
        ZfsError / PermissionDenied: the pool properties cannot be read at all.
        HostUnreachable: the executor cannot reach the host.
        CommandFailed: a probe timed out.
    """
    name = DatasetName(pool)
    if name.pool != name:
        raise InvalidName(f"{pool!r} is a dataset, not a pool")
    props = _pool_properties(executor, pool, zpool, timeout)
    version = _pool_version(props)

    def probe(*args: str) -> Completed:
        return executor.run([zfs, *args], check=False, timeout=timeout)

    listing = probe("list", "-Hp", "-o", "name", "-d", "0", pool)
    token = probe("get", "-H", "-o", "value", "receive_resume_token", pool)
    holds = probe("holds", "-H", f"{pool}@{_PROBE_SNAPSHOT}")
    send = probe("send", "-c", "-w")
    multi = probe("snapshot", f"{pool}@zbak%probe1", f"{pool}@zbak%probe2")
    receive = probe("receive", "-x", "mountpoint")
    typed = probe("get", "-H", "-t", "filesystem", "-o", "value", "type", pool)
    written = probe("get", "-H", "-o", "value", "written", pool)

    refused = refused_option(send.error_text)
    compressed = refused in (None, "w")
    return Capabilities(
        parsable_list=listing.returncode == 0,
        resume_tokens=token.returncode == 0 and _feature(props, "extensible_dataset"),
        bookmarks=_feature(props, "bookmarks"),
        raw_send=refused is None,
        compressed_send=compressed,
        holds=version is not None and version >= HOLDS_VERSION,
        multi_snapshot=parsed_names(multi.error_text),
        pool_version=version,
        list_holds=holds.returncode == 0 or isinstance(_failure(holds, executor), DatasetNotFound),
        receive_properties=wants_snapshot(receive.error_text),
        features=_features(props),
        typed_get=typed.returncode == 0,
        written=written.returncode == 0,
    )
