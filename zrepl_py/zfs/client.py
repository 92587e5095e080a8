"""The ZFS client: one method, one zfs/zpool command, typed errors (docs/style.md#no-shell-strings
and docs/style.md#typed-errors-at-the-boundary).

Every method builds an argv list from validated names (``zrepl_py.zfs.names``), runs it on
an Executor (this machine or an SSH host) and maps a failure with
``zrepl_py.zfs.errors.map_error``. No method loops over snapshots: listings come from one
``zfs get``/``zfs list`` and bulk operations take all names in one command. Exceptions to
"one command" are named in the method docs (a failed destroy asks why; health needs two
numbers).

Never issued here: ``zfs destroy -r/-R/-f`` (docs/design.md#snapshots) and ``zfs receive -F``.
Output is read only in parsable form (``-Hp``): without ``-p`` zfs prints humanized
numbers such as ``15.9E`` for a guid. Names may contain spaces and ``:``; ``-H`` output
is tab-separated and names hold no tab, so the first field is always the whole name.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from zrepl_py.clock import from_epoch
from zrepl_py.errors import (
    CommandFailed,
    DatasetBusy,
    DatasetNotFound,
    InvalidName,
    SnapshotHeld,
    Unsupported,
    ZfsError,
)
from zrepl_py.proc.executor import Completed, Executor
from zrepl_py.zfs.capabilities import Capabilities
from zrepl_py.zfs.errors import map_error
from zrepl_py.zfs.model import (
    BookmarkInfo,
    ListingError,
    PoolHealth,
    PropertyValue,
    Tree,
    build_tree,
)

# check_property_name and parse_any_name live in names, not here, so that zbak serve checks
# names without loading the client:
from zrepl_py.zfs.names import (
    BookmarkName,
    DatasetName,
    SnapshotName,
    check_hold_tag,
    check_property_name,
    parse_any_name,
)
from zrepl_py.zfs.sendrecv import abort_argv

TREE_PROPERTIES = ("type", "guid", "createtxg", "creation", "userrefs", "origin")
"""What ``Zfs.tree`` reads for every dataset and snapshot."""

NAMES_PER_COMMAND = 32 * 1024
"""Bytes of names one batched command takes; more are split over several commands. A remote
command reaches the host's shell as one argument, which Linux bounds at MAX_ARG_STRLEN
(128 KiB, execve(2)); a quarter of that leaves room for the rest of the argv and quoting."""

_NO_PROPERTIES: Mapping[str, str] = MappingProxyType({})
_STATE = re.compile(r"^\s*state:\s*(\S+)", re.MULTILINE)


def check_property_value(prop: str, value: str) -> str:
    """Validate a property value and return it.

    ZFS stores any string; zbak refuses control characters (tab, newline, NUL) so values
    stay one field of the tab-separated listings it parses.

    Raises:
        InvalidName: the value is not a str or holds a control character.
    """
    if not isinstance(value, str) or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise InvalidName(f"value of {prop}: {value!r} holds a control character")
    return value


def batches(names: Sequence[str], limit: int = NAMES_PER_COMMAND) -> list[list[str]]:
    """Split ``names`` into runs of at most ``limit`` bytes (each name counted with one
    separator), in order; an empty input gives no runs. A name longer than ``limit`` is a
    run of its own."""
    runs: list[list[str]] = []
    size = limit + 1
    for name in names:
        length = len(name.encode()) + 1
        if size + length > limit:
            runs.append([])
            size = 0
        runs[-1].append(name)
        size += length
    return runs


def parse_get_output(text: str) -> list[tuple[str, dict[str, str]]]:
    """Group ``zfs get -Hp -o name,property,value`` lines into ``(name, {prop: value})``,
    in order of first appearance.

    Raises:
        ListingError: a line does not have three tab-separated fields.
    """
    rows: dict[str, dict[str, str]] = {}
    for line in text.split("\n"):
        if not line:
            continue
        fields = line.split("\t", 2)
        if len(fields) != 3:
            raise ListingError(f"unexpected zfs get line {line!r}")
        name, prop, value = fields
        rows.setdefault(name, {})[prop] = value
    return list(rows.items())


def parse_holds_output(text: str, snapshots: Sequence[str]) -> dict[str, list[str]]:
    """Read ``zfs holds -Hp SNAP...`` into ``{snapshot: [tag, ...]}`` (in output order; only
    the snapshots that have holds are keys).

    Each record is ``NAME<tab>TAG<tab>EPOCH<newline>`` (zfs_main.c ``print_holds``). OpenZFS
    checks only a tag's length, so another program's tag may hold tabs and newlines (seen on
    OpenZFS 2.3): a record is one of ``snapshots``, a tab, and the shortest tag after which a
    tab, the decimal timestamp and a newline end the text or come before the next record's
    snapshot and tab. A line-by-line reading failed the whole listing on a newline.

    Raises:
        ListingError: the text is not a run of such records.
    """
    names = "|".join(re.escape(s) for s in sorted(set(snapshots), key=len, reverse=True))
    record = re.compile(rf"({names})\t(.*?)\t[0-9]+\n(?=(?:{names})\t|\Z)", re.DOTALL)
    found: dict[str, list[str]] = {}
    at = 0
    while at < len(text):
        match = record.match(text, at) if names else None
        if match is None:
            raise ListingError(f"unexpected zfs holds output at {text[at:at + 200]!r}")
        found.setdefault(match[1], []).append(match[2])
        at = match.end()
    return found


def parse_list_output(text: str, props: Sequence[str]) -> list[tuple[str, dict[str, str]]]:
    """Read ``zfs list -Hp -o name,PROPS`` lines into ``(name, {prop: value})``.

    Raises:
        ListingError: a line does not have ``1 + len(props)`` tab-separated fields.
    """
    rows = []
    for line in text.split("\n"):
        if not line:
            continue
        fields = line.split("\t")
        if len(fields) != 1 + len(props):
            raise ListingError(f"unexpected zfs list line {line!r}")
        rows.append((fields[0], dict(zip(props, fields[1:], strict=True))))
    return rows


def _options(properties: Mapping[str, str]) -> list[str]:
    argv: list[str] = []
    for prop in sorted(properties):
        value = check_property_value(prop, properties[prop])
        argv += ["-o", f"{check_property_name(prop)}={value}"]
    return argv


def _pool_name(pool: str) -> str:
    name = DatasetName(pool)
    if name.pool != name:
        raise InvalidName(f"{pool!r} is a dataset, not a pool")
    return name


class Zfs:
    """ZFS operations on one host.

    Args:
        executor: runs the commands (LocalExecutor, SSH executor); its ``host`` labels errors.
        zfs, zpool: the commands (a path, or e.g. ``/sbin/zfs``); sudo goes in the
            executor's prefix, not here.
        capabilities: what the host supports (``capabilities.detect``); default
            ``Capabilities.NONE``: the slow, portable command forms, no multi-snapshot.
        timeout: seconds any one command may take before it is killed and ZfsError
            (returncode None) is raised; None waits forever. A wedged zfs-fuse daemon
            never answers, so tests and the scheduler should set one.

    Every method raises, besides what it lists: ``InvalidName`` for a bad name before
    running anything, ``PermissionDenied`` (see ``zfs allow``), ``ZfsError`` for an
    unmapped failure or unreadable output, ``HostUnreachable``/``HostKeyMismatch`` from an
    SSH executor.
    """

    def __init__(
        self,
        executor: Executor,
        *,
        zfs: str = "zfs",
        zpool: str = "zpool",
        capabilities: Capabilities | None = None,
        timeout: float | None = None,
    ):
        self.executor = executor
        self.zfs = zfs
        self.zpool = zpool
        self.capabilities = capabilities if capabilities is not None else Capabilities.NONE
        self.timeout = timeout

    @property
    def host(self) -> str:
        """The executor's host label."""
        return self.executor.host

    def _run(self, argv: list[str]) -> Completed:
        """Run argv; on failure raise the mapped ZfsError.

        zfs-fuse prints some failures on stdout with nothing on stderr (``zfs holds``:
        "internal error: /usr/lib/zfs/pyzfs.py not found", exit 255), so an empty stderr
        is replaced by stdout for the mapping and the message.
        """
        try:
            done = self.executor.run(argv, check=False, timeout=self.timeout)
        except ZfsError:
            raise
        except CommandFailed as exc:  # timeout or missing binary
            raise map_error(exc) from exc
        if done.returncode != 0:
            message = done.error_text or done.text.strip()[-2000:]
            raise map_error(CommandFailed(list(done.argv), done.returncode, message, self.host))
        return done

    def _unexpected(self, argv: list[str], problem: object) -> ZfsError:
        return ZfsError(argv, 0, f"unexpected output: {problem}", self.host)

    # -- listing ---------------------------------------------------------------------

    def tree(self, root: DatasetName | str, *, recursive: bool) -> Tree:
        """List ``root`` (and with ``recursive`` every descendant) with all snapshots.

        One command: ``zfs get -Hp -r|-d 1 -o name,property,value PROPS ROOT`` (works on
        zfs-fuse, which includes snapshots in ``get -r``), or with
        ``capabilities.parsable_list`` the faster ``zfs list -Hp -t filesystem,volume,
        snapshot -o name,PROPS -r|-d 1 ROOT``; both feed ``model.build_tree``, so the
        result is the same. PROPS is ``TREE_PROPERTIES``.

        Args:
            root: the dataset to list.
            recursive: include descendants; False lists ``root`` and its snapshots only.

        Raises:
            DatasetNotFound: ``root`` does not exist.
        """
        root = DatasetName(root)
        depth = ["-r"] if recursive else ["-d", "1"]
        if self.capabilities.parsable_list:
            argv = [self.zfs, "list", "-Hp", "-t", "filesystem,volume,snapshot",
                    "-o", ",".join(("name",) + TREE_PROPERTIES), *depth, root]
        else:
            argv = [self.zfs, "get", "-Hp", *depth, "-o", "name,property,value",
                    ",".join(TREE_PROPERTIES), root]
        text = self._run(argv).text
        try:
            if self.capabilities.parsable_list:
                rows = parse_list_output(text, TREE_PROPERTIES)
            else:
                rows = parse_get_output(text)
            return build_tree(root, rows, recursive=recursive)
        except ListingError as exc:
            raise self._unexpected(argv, exc) from exc

    def clones(self, pool: str) -> dict[SnapshotName, list[DatasetName]]:
        """Map every snapshot of ``pool`` that has clones to its clones, pool-wide.

        One command, filesystems and volumes only (``zfs list -H -o name,origin -t
        filesystem,volume -r POOL``; ``origin`` is a name, so no ``-p`` is needed and this
        works on zfs-fuse). A clone can live anywhere in its origin's pool (zfs-clone(8)),
        so a job's own tree listing is not enough to see them.

        Raises:
            DatasetNotFound: no such pool.
        """
        argv = [self.zfs, "list", "-H", "-o", "name,origin", "-t", "filesystem,volume",
                "-r", _pool_name(pool)]
        text = self._run(argv).text
        try:
            rows = parse_list_output(text, ("origin",))
        except ListingError as exc:
            raise self._unexpected(argv, exc) from exc
        found: dict[SnapshotName, list[DatasetName]] = {}
        for name, props in rows:
            if props["origin"] != "-" and "%" not in name:
                found.setdefault(SnapshotName(props["origin"]), []).append(DatasetName(name))
        return found

    def exists(self, name: str) -> bool:
        """Tell whether a dataset, snapshot or bookmark exists (``zfs get -H type NAME``).

        Raises:
            InvalidName: ``name`` is not a valid name of any kind.
        """
        parsed = parse_any_name(name)
        try:
            self._run([self.zfs, "get", "-H", "-o", "value", "type", parsed])
        except DatasetNotFound:
            return False
        return True

    def get_properties(self, name: str, props: Sequence[str]) -> dict[str, str]:
        """Return ``{property: parsable value}`` for a dataset, snapshot or bookmark.

        One ``zfs get -Hp -o property,value P1,P2 NAME``. Values are exact (sizes in
        bytes, times in epoch seconds); ``-`` means not set or not applicable.

        Raises:
            DatasetNotFound: no such object.
            Unsupported: this ZFS does not know one of ``props``.
        """
        parsed = parse_any_name(name)
        wanted = [check_property_name(p) for p in props]
        if not wanted:
            return {}
        return self._pairs([self.zfs, "get", "-Hp", "-o", "property,value", ",".join(wanted),
                            parsed])

    def _pairs(self, argv: list[str]) -> dict[str, str]:
        """Run ``argv`` (a ``zfs get -H`` of two columns) and read ``{first: second}``.

        Raises:
            ZfsError: a line without a tab.
        """
        values = {}
        for line in self._run(argv).text.split("\n"):
            if line:
                key, sep, value = line.partition("\t")
                if not sep:
                    raise self._unexpected(argv, repr(line))
                values[key] = value
        return values

    def property_of_each(self, names: Sequence[str], prop: str) -> dict[str, str]:
        """Return ``{name: value}`` of one property for several datasets in one command:
        ``zfs get -H -o name,value PROP NAME...`` (values as zfs prints them, not ``-p``).

        Raises:
            DatasetNotFound: a name does not exist.
            Unsupported: this ZFS does not know ``prop``.
        """
        return self._pairs([self.zfs, "get", "-H", "-o", "name,value", check_property_name(prop),
                            *(parse_any_name(n) for n in names)])

    def property_sources(
        self, names: Sequence[str], props: Sequence[str]
    ) -> dict[str, dict[str, tuple[str, str]]]:
        """Return ``{name: {property: (parsable value, source)}}`` for several objects in one
        ``zfs get -Hp -o name,property,value,source P1,P2 NAME...`` (one per
        ``NAMES_PER_COMMAND`` bytes of names). Sources read as zfs
        prints them: ``local``, ``received``, ``default``, ``inherited from DS``, ``-``;
        a property that does not apply to an object (``canmount`` of a snapshot) is
        ``("-", "-")``.

        Raises:
            DatasetNotFound: a name does not exist.
            Unsupported: this ZFS does not know one of ``props``.
        """
        wanted = [check_property_name(p) for p in props]
        found: dict[str, dict[str, tuple[str, str]]] = {}
        for run in batches([parse_any_name(n) for n in names]):
            argv = [self.zfs, "get", "-Hp", "-o", "name,property,value,source",
                    ",".join(wanted), *run]
            for line in self._run(argv).text.split("\n"):
                if line:
                    fields = line.split("\t")
                    if len(fields) != 4:
                        raise self._unexpected(argv, repr(line))
                    found.setdefault(fields[0], {})[fields[1]] = (fields[2], fields[3])
        return found

    def set_here(self, root: DatasetName | str, prop: str, *, recursive: bool) -> dict[str, str]:
        """The filesystems and volumes at (and with ``recursive`` below) ``root`` on which
        ``prop`` is set (source ``local``), with its value: one ``zfs get -H [-r] -s local
        -o name,value PROP ROOT`` (snapshots inherit from their dataset, so ``-s local``
        leaves them out; works on zfs-fuse).

        Raises:
            DatasetNotFound: ``root`` does not exist.
            Unsupported: this ZFS does not know ``prop``.
        """
        found = self._pairs([self.zfs, "get", "-H", *(["-r"] if recursive else []), "-s",
                             "local", "-o", "name,value", check_property_name(prop),
                             DatasetName(root)])
        return {name: value for name, value in found.items() if "@" not in name}

    def inherit_property(self, name: str, prop: str) -> None:
        """Clear a local or received value: ``zfs inherit PROP NAME`` (the property is then
        inherited, or its default; a received value stays masked, zfs-inherit(8)).

        Raises:
            DatasetNotFound: no such object.
            Unsupported: this ZFS does not know ``prop``.
            ZfsError: ``prop`` cannot be inherited (e.g. ``quota``).
        """
        parsed = parse_any_name(name)
        self._run([self.zfs, "inherit", check_property_name(prop), parsed])

    def dataset_properties(
        self, root: DatasetName | str, props: Sequence[str], *, recursive: bool,
        children: bool = False,
    ) -> dict[DatasetName, dict[str, PropertyValue]]:
        """Return ``{dataset: {property: PropertyValue}}`` for ``root`` (and with
        ``recursive`` every filesystem and volume below it, with ``children`` those directly
        below it), values parsable, with their source (``local``, ``received``,
        ``inherited from X``, ...).

        One command: ``zfs get -Hp [-r|-d 1] [-t filesystem,volume] -o
        name,property,value,source PROPS ROOT``. ``-t`` only with ``capabilities.typed_get``;
        zfs-fuse has no ``get -t`` and lists every snapshot too, which are left out here, as
        are ZFS-internal names holding ``%``.

        Raises:
            DatasetNotFound: ``root`` does not exist.
            Unsupported: this ZFS does not know one of ``props``.
        """
        ds = DatasetName(root)
        wanted = [check_property_name(p) for p in props]
        depth = ["-r"] if recursive else ["-d", "1"] if children else []
        types = ["-t", "filesystem,volume"] if self.capabilities.typed_get else []
        argv = [self.zfs, "get", "-Hp", *depth, *types, "-o", "name,property,value,source",
                ",".join(wanted), ds]
        found: dict[DatasetName, dict[str, PropertyValue]] = {}
        for line in self._run(argv).text.split("\n"):
            if not line:
                continue
            fields = line.split("\t")
            if len(fields) != 4:
                raise self._unexpected(argv, repr(line))
            name, prop, value, source = fields
            if "@" in name or "%" in name or "#" in name:
                continue
            found.setdefault(DatasetName(name), {})[prop] = PropertyValue(value, source)
        return found

    def set_property(self, name: str, prop: str, value: str) -> None:
        """Set one property: ``zfs set PROP=VALUE NAME``.

        Raises:
            DatasetNotFound: no such object.
            Unsupported: this ZFS does not know ``prop``.
            ZfsError: the value is refused.
        """
        parsed = parse_any_name(name)
        check_property_name(prop)
        check_property_value(prop, value)
        self._run([self.zfs, "set", f"{prop}={value}", parsed])

    def set_property_many(self, names: Sequence[str], prop: str, value: str) -> None:
        """Set one property on several objects: ``zfs set PROP=VALUE NAME...`` (one command
        per ``NAMES_PER_COMMAND`` bytes of names; zfs-fuse and OpenZFS both take several
        names, zfs-set(8)). zfs goes on past a name it cannot set and exits non-zero after
        the last, so on an error some names may be set. Empty ``names``: nothing is run.

        Raises:
            DatasetNotFound: a name does not exist.
            Unsupported: this ZFS does not know ``prop``.
            ZfsError: the value is refused.
        """
        parsed = [parse_any_name(n) for n in names]
        check_property_name(prop)
        check_property_value(prop, value)
        for run in batches(parsed):
            self._run([self.zfs, "set", f"{prop}={value}", *run])

    # -- snapshots -------------------------------------------------------------------

    def snapshot(self, name: SnapshotName | str, *, recursive: bool = False) -> None:
        """Create ``name`` (``zfs snapshot [-r] NAME``; ``-r`` snapshots every descendant
        atomically, in one transaction group).

        Raises:
            DatasetExists: the snapshot exists.
            DatasetNotFound: its dataset does not exist.
        """
        snap = SnapshotName(name)
        self._run([self.zfs, "snapshot", *(["-r"] if recursive else []), snap])

    def snapshot_many(self, names: Sequence[SnapshotName | str]) -> None:
        """Create several snapshots atomically in one ``zfs snapshot A@x B@y ...``.

        Args:
            names: at most one per dataset, all in one pool (libzfs ``zfs_snapshot_nvl``
                and ``lzc_snapshot`` require both). Empty: nothing is run.

        Raises:
            Unsupported: ``capabilities.multi_snapshot`` is False (zfs-fuse); nothing is run.
            ValueError: two names for one dataset, or names in several pools.
            DatasetExists / DatasetNotFound: as for ``snapshot``; then none was created.
        """
        snaps = [SnapshotName(n) for n in names]
        if not snaps:
            return
        datasets = [s.dataset for s in snaps]
        if len(set(datasets)) != len(datasets):
            raise ValueError("snapshot_many: at most one snapshot per dataset")
        if len({d.pool for d in datasets}) != 1:
            raise ValueError("snapshot_many: all snapshots must be in one pool")
        argv = [self.zfs, "snapshot", *snaps]
        if not self.capabilities.multi_snapshot:
            raise Unsupported(
                argv, None, "not run: this zfs cannot create several snapshots in one "
                "command (capabilities.multi_snapshot is False)", self.host
            )
        self._run(argv)

    def destroy_snapshot(self, name: SnapshotName | str) -> None:
        """Destroy one snapshot: plain ``zfs destroy NAME`` (never -r, -R, -f or -d).

        zfs-fuse reports a held snapshot as "dataset is busy"; on DatasetBusy this method
        reads the snapshot's ``userrefs`` (a second command) to raise SnapshotHeld instead.

        Raises:
            SnapshotHeld: the snapshot carries user holds.
            SnapshotHasClones: clones depend on it.
            DatasetBusy: it is in use (e.g. being sent); may pass after a moment.
            DatasetNotFound: it does not exist.
        """
        snap = SnapshotName(name)
        try:
            self._run([self.zfs, "destroy", snap])
        except DatasetBusy as exc:
            refs = self._userrefs(snap)
            if refs:
                raise SnapshotHeld(
                    exc.argv, exc.returncode, f"{exc.stderr} (it carries {refs} user hold(s))",
                    exc.host,
                ) from exc
            raise

    def _userrefs(self, snap: SnapshotName) -> int:
        """The snapshot's hold count, 0 when it cannot be read (e.g. destroyed meanwhile)."""
        try:
            refs = self.get_properties(snap, ["userrefs"]).get("userrefs", "")
        except ZfsError:
            return 0
        return int(refs) if refs.isdigit() else 0

    # -- holds -----------------------------------------------------------------------

    def hold(self, snapshot: SnapshotName | str, tag: str) -> None:
        """Put a user hold ``tag`` on ``snapshot`` (``zfs hold TAG SNAP``).

        Raises:
            HoldExists: the snapshot already has a hold with this tag.
            DatasetNotFound: no such snapshot.
            InvalidName: bad tag (``names.check_hold_tag``).
        """
        snap = SnapshotName(snapshot)
        self._run([self.zfs, "hold", check_hold_tag(tag), snap])

    def release(self, snapshot: SnapshotName | str, tag: str) -> None:
        """Remove the user hold ``tag`` from ``snapshot`` (``zfs release TAG SNAP``).

        Raises:
            HoldNotFound: the snapshot has no hold with this tag.
            DatasetNotFound: no such snapshot.
        """
        snap = SnapshotName(snapshot)
        self._run([self.zfs, "release", check_hold_tag(tag), snap])

    def hold_many(self, snapshots: Sequence[SnapshotName | str], tag: str) -> None:
        """Put the user hold ``tag`` on several snapshots: ``zfs hold TAG SNAP...`` (one command
        per ``NAMES_PER_COMMAND`` bytes of names). Not atomic: zfs holds each in turn, goes on
        past one it cannot hold and exits non-zero after the last (zfs_main.c
        ``zfs_do_hold_rele_impl``; the same in zfs-fuse 0.7), so on an error some may be held;
        ``hold`` each to learn which. Empty ``snapshots``: nothing is run.

        Raises:
            HoldExists: one of them already has the tag.
            DatasetNotFound: one of them does not exist.
            InvalidName: bad tag (``names.check_hold_tag``).
        """
        snaps = [SnapshotName(s) for s in snapshots]
        checked = check_hold_tag(tag)
        for run in batches(snaps):
            self._run([self.zfs, "hold", checked, *run])

    def release_many(self, snapshots: Sequence[SnapshotName | str], tag: str) -> None:
        """Remove the user hold ``tag`` from several snapshots: ``zfs release TAG SNAP...``
        (not atomic, as ``hold_many``). Empty ``snapshots``: nothing is run.

        Raises:
            HoldNotFound: one of them has no hold with this tag.
            DatasetNotFound: one of them does not exist.
        """
        snaps = [SnapshotName(s) for s in snapshots]
        checked = check_hold_tag(tag)
        for run in batches(snaps):
            self._run([self.zfs, "release", checked, *run])

    def holds(self, snapshots: Sequence[SnapshotName | str]) -> dict[SnapshotName, list[str]]:
        """Return the hold tags of each snapshot (sorted; ``[]`` if none) from ``zfs holds
        -Hp S1 S2 ...``, one command per ``NAMES_PER_COMMAND`` bytes of names (records read
        by ``parse_holds_output``: another program's tag may hold a tab or a newline).
        Empty input: ``{}``, nothing run.

        Raises:
            Unsupported: this ZFS cannot list holds (zfs-fuse: "pyzfs.py not found"; use
                ``SnapshotInfo.userrefs`` there).
            DatasetNotFound: one of the snapshots does not exist.
        """
        snaps = [SnapshotName(s) for s in snapshots]
        result: dict[SnapshotName, list[str]] = {s: [] for s in snaps}
        for run in batches(snaps):
            argv = [self.zfs, "holds", "-Hp", *run]
            try:
                found = parse_holds_output(self._run(argv).text, run)
            except ListingError as exc:
                raise self._unexpected(argv, exc) from exc
            for name, tags in found.items():
                result[SnapshotName(name)] += tags
        return {snap: sorted(tags) for snap, tags in result.items()}

    # -- bookmarks -------------------------------------------------------------------

    def _require(self, feature: str, argv: list[str], what: str) -> None:
        """Raise Unsupported (nothing run) when ``capabilities.<feature>`` is False."""
        if not getattr(self.capabilities, feature):
            raise Unsupported(
                argv, None, f"not run: this zfs/pool has no {what} "
                f"(capabilities.{feature} is False; callers check capabilities first)",
                self.host,
            )

    def bookmarks(self, dataset: DatasetName | str) -> list[BookmarkInfo]:
        """Return the bookmarks of ``dataset`` (not of its children), oldest first.

        One ``zfs list -Hp -t bookmark -o name,guid,createtxg,creation -d 1 DATASET``.

        Raises:
            Unsupported: ``capabilities.bookmarks`` is False (zfs-fuse); nothing is run.
            DatasetNotFound: no such dataset.
        """
        ds = DatasetName(dataset)
        return self.bookmarks_of([ds]).get(ds, [])

    def bookmarks_of(
        self, datasets: Sequence[DatasetName | str]
    ) -> dict[DatasetName, list[BookmarkInfo]]:
        """Return the bookmarks of each dataset (not of their children), oldest first, every
        dataset a key (``[]`` for none). ``zfs list -Hp -t bookmark -o
        name,guid,createtxg,creation -d 1 DATASET...``, one command per
        ``NAMES_PER_COMMAND`` bytes of names. Empty ``datasets``: ``{}``, nothing run.

        Raises:
            Unsupported: ``capabilities.bookmarks`` is False (zfs-fuse); nothing is run.
            DatasetNotFound: a dataset does not exist.
        """
        names = [DatasetName(d) for d in datasets]
        props = ("guid", "createtxg", "creation")
        head = [self.zfs, "list", "-Hp", "-t", "bookmark", "-o", ",".join(("name",) + props),
                "-d", "1"]
        self._require("bookmarks", [*head, *names], "bookmarks")
        found: dict[DatasetName, list[BookmarkInfo]] = {ds: [] for ds in names}
        for run in batches(names):
            argv = head + run
            text = self._run(argv).text
            try:
                for name, values in parse_list_output(text, props):
                    mark = BookmarkInfo(
                        name=BookmarkName(name),
                        guid=int(values["guid"]),
                        createtxg=int(values["createtxg"]),
                        creation=from_epoch(int(values["creation"])),
                    )
                    found.setdefault(DatasetName(name.split("#", 1)[0]), []).append(mark)
            except (ListingError, ValueError) as exc:
                raise self._unexpected(argv, exc) from exc
        return {ds: sorted(marks, key=lambda b: (b.createtxg, b.name))
                for ds, marks in found.items()}

    def bookmark(self, snapshot: SnapshotName | str, bookmark: BookmarkName | str) -> None:
        """Bookmark ``snapshot`` as ``bookmark`` (``zfs bookmark SNAP DS#NAME``); the
        bookmark keeps the snapshot's guid and createtxg and stays a valid ``zfs send -i``
        base after the snapshot is destroyed (zfs-bookmark(8)).

        Raises:
            Unsupported: ``capabilities.bookmarks`` is False; nothing is run.
            DatasetExists: a bookmark of that name exists.
            DatasetNotFound: no such snapshot.
            ValueError: the bookmark is not in the snapshot's dataset.
        """
        snap = SnapshotName(snapshot)
        mark = BookmarkName(bookmark)
        if mark.split("#", 1)[0] != snap.dataset:
            raise ValueError(f"bookmark {mark} must be in the dataset of {snap}")
        argv = [self.zfs, "bookmark", snap, mark]
        self._require("bookmarks", argv, "bookmarks")
        self._run(argv)

    def destroy_bookmark(self, name: BookmarkName | str) -> None:
        """Destroy one bookmark: ``zfs destroy DS#NAME`` (no snapshot or data is touched).

        Raises:
            Unsupported: ``capabilities.bookmarks`` is False; nothing is run.
            DatasetNotFound: no such bookmark ("bookmark 'DS#NAME' does not exist").
        """
        mark = BookmarkName(name)
        argv = [self.zfs, "destroy", mark]
        self._require("bookmarks", argv, "bookmarks")
        self._run(argv)

    # -- resumable receive and rollback ------------------------------------------------

    def resume_token(self, dataset: DatasetName | str) -> str | None:
        """Return the dataset's ``receive_resume_token``, None when it has none (``-``).

        One ``zfs get -H -o value receive_resume_token DATASET``. Describe the token on the
        SOURCE host with ``zfs.resume.describe_token``.

        Raises:
            Unsupported: ``capabilities.resume_tokens`` is False (zfs-fuse has no such
                property); nothing is run.
            DatasetNotFound: no such dataset.
        """
        ds = DatasetName(dataset)
        argv = [self.zfs, "get", "-H", "-o", "value", "receive_resume_token", ds]
        self._require("resume_tokens", argv, "resumable receive")
        value = self._run(argv).text.strip()
        return None if value in ("-", "") else value

    def abort_resume(self, dataset: DatasetName | str) -> None:
        """Discard a partial receive: ``zfs receive -A DATASET`` (zfs-receive(8)). For an
        interrupted incremental the dataset keeps its last complete snapshot; an interrupted
        FULL receive destroys the partially received dataset itself.

        Raises:
            Unsupported: ``capabilities.resume_tokens`` is False; nothing is run.
            ZfsError: there is no partial state to abort ("does not have any resumable
                receive state to abort").
            DatasetNotFound: no such dataset.
        """
        argv = abort_argv(dataset, zfs=self.zfs)
        self._require("resume_tokens", argv, "resumable receive")
        self._run(argv)

    def rollback(self, snapshot: SnapshotName | str) -> None:
        """Roll the snapshot's dataset back to it: plain ``zfs rollback SNAP`` (never -r,
        -R or -f). Changes since the snapshot are discarded.

        Raises:
            NewerSnapshotsExist: newer snapshots (or bookmarks) exist; zfs refuses without
                ``-r`` and zbak destroys them explicitly first, when the user opted in.
            DatasetNotFound: no such snapshot.
            DatasetBusy: the dataset is in use.
        """
        snap = SnapshotName(snapshot)
        self._run([self.zfs, "rollback", snap])

    # -- filesystems -----------------------------------------------------------------

    def create_filesystem(
        self,
        name: DatasetName | str,
        *,
        parents: bool = False,
        properties: Mapping[str, str] = _NO_PROPERTIES,
    ) -> None:
        """Create a filesystem: ``zfs create [-p] [-o PROP=VALUE ...] NAME``.

        Args:
            parents: create missing parents too (and succeed if ``name`` exists).
            properties: set at creation, e.g. ``{"mountpoint": "none"}``.

        Raises:
            DatasetExists: it exists (without ``parents``).
            DatasetNotFound: its parent does not exist (without ``parents``).
        """
        ds = DatasetName(name)
        self._run([self.zfs, "create", *(["-p"] if parents else []), *_options(properties), ds])

    def destroy_filesystem(
        self, name: DatasetName | str, *, attempts: int = 6, delay: float = 0.5
    ) -> None:
        """Destroy one filesystem or volume without children or snapshots: plain
        ``zfs destroy NAME``, retried while it answers "busy" (``attempts`` tries,
        ``delay`` seconds apart): zfs-fuse answers "dataset is busy" for about a second
        after a clone was unmounted (docs/testbed.md#zfs-fuse). Meant for zbak's temporary clones.

        Raises:
            DatasetBusy: still busy after the last attempt.
            DatasetNotFound: it does not exist.
            ZfsError: it has children or snapshots ("use '-r'"), which zbak never forces.
        """
        ds = DatasetName(name)
        argv = [self.zfs, "destroy", ds]
        for attempt in range(1, attempts + 1):
            try:
                self._run(argv)
                return
            except DatasetBusy:
                if attempt >= attempts:
                    raise
                time.sleep(delay)

    def clone(
        self,
        snapshot: SnapshotName | str,
        target: DatasetName | str,
        properties: Mapping[str, str] = _NO_PROPERTIES,
    ) -> None:
        """Clone ``snapshot`` as ``target``: ``zfs clone [-o PROP=VALUE ...] SNAP TARGET``.

        Raises:
            DatasetExists: ``target`` exists.
            DatasetNotFound: the snapshot or ``target``'s parent does not exist.
        """
        snap = SnapshotName(snapshot)
        ds = DatasetName(target)
        self._run([self.zfs, "clone", *_options(properties), snap, ds])

    def promote(self, clone: DatasetName | str) -> None:
        """Make ``clone`` independent of its origin: ``zfs promote CLONE`` (zfs-promote(8):
        the origin snapshot and every snapshot before it move to the clone, with their
        holds; the origin dataset becomes a clone of it).

        Raises:
            DatasetNotFound: no such dataset.
            ZfsError: it is not a clone, or a snapshot name would clash.
        """
        self._run([self.zfs, "promote", DatasetName(clone)])

    def rename(self, name: DatasetName | str, new: DatasetName | str) -> None:
        """Rename a filesystem or volume (its children and snapshots go with it): plain
        ``zfs rename OLD NEW`` in one pool, never ``-r``, ``-f`` or ``-p``. zfs-fuse answers
        "dataset is busy" while it is mounted (unmount it first).

        Raises:
            DatasetExists: ``new`` exists.
            DatasetNotFound: ``name`` or ``new``'s parent does not exist.
            DatasetBusy: it is mounted and in use.
        """
        self._run([self.zfs, "rename", DatasetName(name), DatasetName(new)])

    def mount(self, name: DatasetName | str) -> None:
        """Mount one filesystem at its ``mountpoint``: ``zfs mount NAME``.

        Raises:
            DatasetNotFound: no such dataset.
            DatasetBusy: its mountpoint is in use.
            ZfsError: it is mounted already, or cannot be mounted there.
        """
        self._run([self.zfs, "mount", DatasetName(name)])

    def unmount(self, name: DatasetName | str) -> None:
        """Unmount one filesystem: ``zfs unmount NAME`` (never ``-f``: a file in use keeps
        it mounted and the caller says so).

        Raises:
            DatasetNotFound: no such dataset.
            DatasetBusy: it is in use.
            ZfsError: it is not mounted.
        """
        self._run([self.zfs, "unmount", DatasetName(name)])

    def local_properties(self, name: DatasetName | str) -> dict[str, str]:
        """The properties set on ``name`` itself (``zfs set``, ``create -o``; not inherited,
        received or default): ``zfs get -Hp -s local -o property,value all NAME``, values
        parsable.

        Raises:
            DatasetNotFound: no such dataset.
        """
        return self._pairs([self.zfs, "get", "-Hp", "-s", "local", "-o", "property,value",
                            "all", DatasetName(name)])

    # -- pools -----------------------------------------------------------------------

    def sync_pool(self, pool: str) -> None:
        """Write the pool's dirty data out now: ``zpool sync POOL`` (zpool-sync(8), OpenZFS
        0.7 and later). Until a transaction group is synced, a dataset's ``written`` still
        reads 0 for data written seconds ago (seen on OpenZFS 2.3 in the zfsvm guest).

        Raises:
            DatasetNotFound: no such pool.
            ZfsError: this zpool has no ``sync`` (zfs-fuse) or it failed.
        """
        self._run([self.zpool, "sync", _pool_name(pool)])

    def pool_health(self, pool: str) -> PoolHealth:
        """Read a pool's state and free space.

        Two commands: ``zpool status POOL`` (full text, not ``-x``; its ``state:`` line)
        and ``zfs get -Hp -o value available POOL`` (exact bytes; zfs-fuse's ``zpool``
        has no ``-p``, so ``zpool list`` numbers are humanized).

        Raises:
            DatasetNotFound: no such pool.
        """
        name = _pool_name(pool)
        status = self._run([self.zpool, "status", name]).text
        match = _STATE.search(status)
        argv = [self.zfs, "get", "-Hp", "-o", "value", "available", name]
        available = self._run(argv).text.strip()
        if not available.isdigit():
            raise self._unexpected(argv, repr(available))
        return PoolHealth(
            pool=name,
            state=match.group(1) if match else "UNKNOWN",
            free_bytes=int(available),
            status_text=status,
        )
