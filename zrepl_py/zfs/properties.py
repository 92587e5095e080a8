"""Replica properties: what zbak sets (``zfs receive -o``) and excludes (``-x``) on receive.

PURE: names and values are validated once, at config load (``config.schema``) or when
``zbak serve`` starts, so nothing that reaches a process is unchecked. Facts from zfsprops(7)
and zfs-receive(8) of OpenZFS 2.3 and ``module/zcommon/zfs_prop.c``:

- A received property (``zfs send -p``) has source ``received``; a local value (``zfs set``,
  ``zfs receive -o``) overrides it; ``zfs inherit`` masks it (the mask survives later
  receives; verified on OpenZFS 2.3.2 and zfs-fuse 0.7).
- ``-x PROP`` is meant to keep the stream's value from taking effect, but OpenZFS 2.3 does
  not always honour it: an incremental with properties into a replica that was received
  without them takes the stream's ``mountpoint`` (openzfs/zfs#17240, reproduced on 2.3.2),
  and an excluded ``refreservation`` was reported to come and go between incrementals
  (#18737, OpenZFS 2.4.3). So the driver reads the replica back after each receive and
  repairs what ``fixes`` names.
- ``-o`` of a property that does not apply to the dataset's type fails the whole receive
  ("property 'canmount' does not apply to datasets of this type"), so ``for_kind`` drops
  filesystem-only properties for volumes (and volume-only ones for filesystems).
- User properties are ``module:property``: lowercase letters, digits and ``:-._``, a colon
  required, at most 256 bytes, no leading ``-``; values under 8192 bytes (zfsprops(7) "User
  Properties").
- Encryption properties cannot be set or excluded on a raw receive ("encryption property
  '...' cannot be set or excluded for raw streams", libzfs ``zfs_setup_cmdline_props``),
  and zbak always sends encrypted datasets raw: they are refused here.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping

from zrepl_py.errors import InvalidProperty

FILESYSTEM = "filesystem"
VOLUME = "volume"
_BOTH = frozenset({FILESYSTEM, VOLUME})
_FS = frozenset({FILESYSTEM})
_VOL = frozenset({VOLUME})

DEFAULT_SET: Mapping[str, str] = {"canmount": "noauto", "readonly": "on"}
"""Set on every replica: it is never mounted at boot (``zfs mount -a`` skips ``noauto``) and
never written, so a backup host that mounts and reads it cannot make it diverge."""

DEFAULT_EXCLUDE: tuple[str, ...] = ("mountpoint", "sharenfs", "sharesmb", "refreservation")
"""Kept from the stream: replicas inherit their mountpoint below the target's parent (never a
path of the backup host, such as a source's ``/home``), are never shared over NFS/SMB, and
reserve no space on the backup pool."""

_ONOFF = ("on", "off")
_SIZE = re.compile(r"[0-9]+(?:\.[0-9]+)?[KMGTPE]?B?", re.IGNORECASE)
"""A size as zfs reads it (``nicestrtonum``): ``512``, ``128K``, ``1.5T``, ``10GB``."""
_COMPRESSION = re.compile(
    r"on|off|lzjb|zle|lz4|gzip(?:-[1-9])?|zstd(?:-(?:[1-9]|1[0-9]))?"
    r"|zstd-fast(?:-(?:[1-9]|10|[2-9]0|100|500|1000))?")
_CHECKSUMS = ("on", "off", "fletcher2", "fletcher4", "sha256", "noparity", "sha512", "skein",
              "edonr", "blake3")
_DEDUP = re.compile(r"on|off|verify|(?:sha256|sha512|skein|blake3)(?:,verify)?|edonr,verify")
_USER_NAME = re.compile(r"[a-z0-9_.:-]*:[a-z0-9_.:-]*")
_FREE_TEXT = re.compile(r"[A-Za-z0-9_.,:=+@/%-](?:[A-Za-z0-9 _.,:=+@/%-]*[A-Za-z0-9_.,:=+@/%-])?")
"""Values of share options and user properties: no shell, quote or control character, no
space at either end."""
MAX_USER_VALUE = 8191
MAX_NAME = 256
_ENCRYPTION = frozenset({"encryption", "keyformat", "keylocation", "pbkdf2iters", "pbkdf2salt"})


@dataclasses.dataclass(frozen=True)
class _Native:
    kinds: frozenset[str]
    inheritable: bool
    values: tuple[str, ...] | re.Pattern[str] | None
    """Allowed values: a tuple of words, a pattern, or None for the property's own check."""
    reset: str | None = None
    """The value that undoes a received value of a non-inheritable property (``zfs inherit``
    refuses those: "'quota' property cannot be inherited")."""


def _words(*words: str) -> tuple[str, ...]:
    return words


NATIVE: Mapping[str, _Native] = {
    "canmount": _Native(_FS, False, _words("on", "off", "noauto"), reset="on"),
    "readonly": _Native(_BOTH, True, _ONOFF),
    "mountpoint": _Native(_FS, True, _words("none", "legacy")),
    "sharenfs": _Native(_FS, True, None),
    "sharesmb": _Native(_FS, True, None),
    "atime": _Native(_FS, True, _ONOFF),
    "relatime": _Native(_FS, True, _ONOFF),
    "exec": _Native(_FS, True, _ONOFF),
    "setuid": _Native(_FS, True, _ONOFF),
    "devices": _Native(_FS, True, _ONOFF),
    "overlay": _Native(_FS, True, _ONOFF),
    "nbmand": _Native(_FS, True, _ONOFF),
    "vscan": _Native(_FS, True, _ONOFF),
    "xattr": _Native(_FS, True, _words("on", "off", "sa", "dir")),
    "snapdir": _Native(_FS, True, _words("hidden", "visible", "disabled")),
    "acltype": _Native(_FS, True, _words("off", "noacl", "nfsv4", "posix", "posixacl")),
    "aclinherit": _Native(_FS, True, _words("discard", "noallow", "restricted", "passthrough",
                                            "passthrough-x")),
    "aclmode": _Native(_FS, True, _words("discard", "groupmask", "passthrough", "restricted")),
    "dnodesize": _Native(_FS, True, _words("legacy", "auto", "1k", "2k", "4k", "8k", "16k")),
    "recordsize": _Native(_FS, True, None),
    "quota": _Native(_FS, False, None, reset="none"),
    "refquota": _Native(_FS, False, None, reset="none"),
    "filesystem_limit": _Native(_FS, False, re.compile(r"none|[0-9]+"), reset="none"),
    "compression": _Native(_BOTH, True, _COMPRESSION),
    "checksum": _Native(_BOTH, True, _CHECKSUMS),
    "dedup": _Native(_BOTH, True, _DEDUP),
    "sync": _Native(_BOTH, True, _words("standard", "always", "disabled")),
    "logbias": _Native(_BOTH, True, _words("latency", "throughput")),
    "primarycache": _Native(_BOTH, True, _words("all", "none", "metadata")),
    "secondarycache": _Native(_BOTH, True, _words("all", "none", "metadata")),
    "copies": _Native(_BOTH, True, _words("1", "2", "3")),
    "redundant_metadata": _Native(_BOTH, True, _words("all", "most", "some", "none")),
    "special_small_blocks": _Native(_BOTH, True, None),
    "reservation": _Native(_BOTH, False, None, reset="none"),
    "refreservation": _Native(_BOTH, False, None, reset="none"),
    "snapshot_limit": _Native(_BOTH, False, re.compile(r"none|[0-9]+"), reset="none"),
    "volmode": _Native(_VOL, True, _words("default", "full", "geom", "dev", "none")),
    "snapdev": _Native(_VOL, True, _words("hidden", "visible")),
}
"""The native properties zbak lets a job set or exclude (zfsprops(7)): where they apply,
whether they inherit, and their values. Others (read-only ones such as ``used``, creation-
only ones such as ``casesensitivity``, encryption) are refused, so a typo is an error."""


def is_user_property(name: str) -> bool:
    """True for a user property name (``com.example:tag``; see the module doc)."""
    return _USER_NAME.fullmatch(name) is not None and not name.startswith("-")


def check_name(name: object) -> str:
    """Return ``name`` when zbak may set or exclude it on receive.

    Raises:
        InvalidProperty: not a str, an encryption property, or neither a native property of
            ``NATIVE`` nor a valid user property name.
    """
    if not isinstance(name, str) or not name:
        raise InvalidProperty(f"property name {name!r}: expected a non-empty string")
    if name in _ENCRYPTION:
        raise InvalidProperty(f"{name}: encryption properties cannot be set or excluded "
                              "(zbak sends encrypted datasets raw, which keeps them)")
    if name in NATIVE or (is_user_property(name) and len(name) <= MAX_NAME):
        return name
    raise InvalidProperty(f"{name!r} is not a ZFS property zbak can set or exclude: one of "
                          f"{', '.join(sorted(NATIVE))}, or a user property such as "
                          "com.example:tag (lowercase letters, digits, ':-._', one ':')")


def _size(value: str, *, minimum: int = 0, power_of_two: bool = False,
          maximum: int | None = None) -> int:
    if not _SIZE.fullmatch(value):
        raise ValueError
    number = value.upper().removesuffix("B")
    scale = 1
    if number and number[-1] in "KMGTPE":
        scale = 1024 ** ("KMGTPE".index(number[-1]) + 1)
        number = number[:-1]
    size = int(float(number) * scale)
    if size < minimum or (maximum is not None and size > maximum):
        raise ValueError
    if power_of_two and size & (size - 1):
        raise ValueError
    return size


def check_value(name: str, value: object) -> str:
    """Return ``value`` when it is a valid value of property ``name`` (already checked with
    ``check_name``) that zbak passes on.

    Raises:
        InvalidProperty: not a str, or not a value of that property. ``mountpoint`` takes
            ``none`` or ``legacy`` only: one path given to every replicated dataset of a job
            would mount them all on the same directory (exclude it to inherit instead).
    """
    if not isinstance(value, str):
        raise InvalidProperty(f"{name}: value {value!r} must be a string")
    native = NATIVE.get(name)
    try:
        if native is None or native.values is None:
            _check_free(name, value)
        elif isinstance(native.values, tuple):
            if value not in native.values:
                raise ValueError
        elif not native.values.fullmatch(value):
            raise ValueError
    except ValueError:
        allowed = _allowed(name, native)
        raise InvalidProperty(f"{name}: {value!r} is not allowed ({allowed})") from None
    return value


def _check_free(name: str, value: str) -> None:
    if name == "recordsize":
        _size(value, minimum=512, maximum=16 * 1024**2, power_of_two=True)
    elif name == "special_small_blocks":
        _size(value, maximum=16 * 1024**2, power_of_two=value != "0")
    elif name in ("quota", "refquota", "reservation", "refreservation"):
        if value != "none" and not (name == "refreservation" and value == "auto"):
            _size(value)
    elif not _FREE_TEXT.fullmatch(value) or len(value) > MAX_USER_VALUE:
        raise ValueError


def _allowed(name: str, native: _Native | None) -> str:
    if name == "mountpoint":
        return "none or legacy; exclude it to inherit the target parent's"
    if native is not None and isinstance(native.values, tuple):
        return "one of " + ", ".join(native.values)
    if name == "recordsize":
        return "a power of two from 512 to 16M"
    if name in ("quota", "refquota", "reservation", "refreservation", "special_small_blocks"):
        return "a size such as 10G, or none"
    if native is not None and isinstance(native.values, re.Pattern):
        return f"matching {native.values.pattern}"
    return (f"letters, digits, spaces inside and _.,:=+@/%- only, at most {MAX_USER_VALUE} "
            "bytes")


@dataclasses.dataclass(frozen=True)
class Fix:
    """One repair of a replica after a receive: ``zfs set PROP=VALUE`` (``value`` given) or
    ``zfs inherit PROP`` (``value`` None)."""

    prop: str
    value: str | None
    why: str


@dataclasses.dataclass(frozen=True)
class ReceiveProperties:
    """What a job sets and excludes on receive, validated.

    Attributes:
        assigned: ``(property, value)`` pairs for ``zfs receive -o``, sorted by name.
        excluded: property names for ``zfs receive -x``, sorted.

    Raises:
        InvalidProperty: a bad name or value; a property both set and excluded;
            ``canmount=on`` while ``mountpoint`` is neither set nor excluded (each replica
            would mount itself on its source's path of the backup host, e.g. ``/home``).
    """

    assigned: tuple[tuple[str, str], ...] = ()
    excluded: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        pairs = tuple(sorted((check_name(k), check_value(k, v)) for k, v in self.assigned))
        names = tuple(sorted({check_name(p) for p in self.excluded}))
        values = dict(pairs)
        both = sorted(values.keys() & set(names))
        if both:
            raise InvalidProperty(f"{', '.join(both)}: both set and excluded")
        if values.get("canmount") == "on" and "mountpoint" not in values \
                and "mountpoint" not in names:
            raise InvalidProperty("canmount = \"on\" needs mountpoint excluded (or set to "
                                  "none or legacy): else every replica mounts itself on its "
                                  "source's path on the backup host")
        object.__setattr__(self, "assigned", pairs)
        object.__setattr__(self, "excluded", names)

    @classmethod
    def of(cls, assign: Mapping[str, str] | None = None,
           exclude: Iterable[str] | None = None) -> ReceiveProperties:
        """The effective properties of a config: ``assign`` over ``DEFAULT_SET`` (per
        property), and ``exclude`` instead of ``DEFAULT_EXCLUDE`` when given (the defaults
        leave out what ``assign`` sets, since ``-o`` already overrides the stream).

        Raises:
            InvalidProperty: as the class.
        """
        merged = {**DEFAULT_SET, **(assign or {})}
        if exclude is None:
            exclude = tuple(p for p in DEFAULT_EXCLUDE if p not in merged)
        return cls(tuple(merged.items()), tuple(exclude))

    def for_kind(self, kind: str) -> ReceiveProperties:
        """Only the properties that apply to a dataset of ``kind`` (``"filesystem"`` or
        ``"volume"``); user properties apply to both."""
        def applies(name: str) -> bool:
            native = NATIVE.get(name)
            return native is None or kind in native.kinds
        return ReceiveProperties(tuple((k, v) for k, v in self.assigned if applies(k)),
                                 tuple(p for p in self.excluded if applies(p)))

    def receive_args(self) -> list[str]:
        """``-o PROP=VALUE ... -x PROP ...`` for ``zfs receive``."""
        args: list[str] = []
        for name, value in self.assigned:
            args += ["-o", f"{name}={value}"]
        for name in self.excluded:
            args += ["-x", name]
        return args

    @property
    def names(self) -> tuple[str, ...]:
        """Every property set or excluded, to read back after a receive."""
        return tuple(k for k, _ in self.assigned) + self.excluded

    def repairs(self) -> tuple[dict[str, str], frozenset[str]]:
        """Every repair ``fixes`` can ask for: ``({property: value} for zfs set, {property}
        for zfs inherit)``: the set values, the reset value of each non-inheritable
        exclusion, and the inheritable exclusions (``zbak serve`` allows exactly these)."""
        values = dict(self.assigned)
        inherit = set()
        for name in self.excluded:
            native = NATIVE.get(name)
            if native is None or native.inheritable:
                inherit.add(name)
            elif native.reset is not None:
                values[name] = native.reset
        return values, frozenset(inherit)

    def fixes(self, observed: Mapping[str, tuple[str, str]]) -> list[Fix]:
        """What to repair on a replica whose properties read back as ``observed``.

        Args:
            observed: ``{property: (value, source)}`` from ``zfs get -o property,value,
                source`` of the replica; source is ``local``, ``received``, ``default``,
                ``inherited from X``, ``-`` and so on.

        Returns:
            a ``zfs set`` for each set property whose source is not ``local`` (the receive
            had no ``-o``, or could not apply it), and for each excluded property whose
            source is ``received`` a ``zfs inherit`` (or, when it cannot be inherited, a
            ``zfs set`` of its reset value).
        """
        found: list[Fix] = []
        for name, value in self.assigned:
            got, source = observed.get(name, ("-", "-"))
            if source != "local":
                found.append(Fix(name, value, f"was {got} ({source})"))
        values, inherit = self.repairs()
        for name in self.excluded:
            got, source = observed.get(name, ("-", "-"))
            if source == "received":
                reset = None if name in inherit else values[name]
                found.append(Fix(name, reset, f"was the stream's {got} (received, though "
                                              "excluded)"))
        return found
