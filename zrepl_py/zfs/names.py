"""ZFS names as validated values (parse, don't validate:
docs/style.md#parse-once-into-validated-values).

Rules follow OpenZFS ``module/zcommon/zfs_namecheck.c``:
- allowed characters are ASCII letters, digits and ``-_.:`` plus space (``valid_char``);
- a dataset name is ``/``-separated non-empty components, no ``.``/``..`` component,
  no leading, trailing or doubled ``/``, and is shorter than ZFS_MAX_DATASET_NAME_LEN (256);
- a pool name (first component) starts with a letter, is not ``mirror``, ``raidz*``,
  ``draid*``, ``spare``, ``log``, does not look like a disk (``c[0-9]...``), and is shorter
  than 240 bytes (``pool_namecheck`` leaves room for ``POOL/$ORIGIN@$ORIGIN``);
- a snapshot is ``DATASET@NAME`` and a bookmark ``DATASET#NAME`` with one delimiter and a
  non-empty, valid short name; the full name too is under 256 bytes.
``%`` (used only by ZFS-internal temporary clones) is rejected, as is anything non-ASCII.
Every name that passes is safe as one argv element: it cannot start with ``-`` and holds no
shell metacharacter other than space and ``:``, which the SSH executor quotes.
"""

from __future__ import annotations

import re

from zrepl_py.errors import InvalidName

MAX_NAME_LEN = 255  # ZFS_MAX_DATASET_NAME_LEN (256) includes the terminating NUL
MAX_POOL_NAME_LEN = 239  # pool_namecheck: under 256 - 2 - 2 * len("$ORIGIN") bytes
_COMPONENT = re.compile(r"[A-Za-z0-9_.: -]+")
_RESERVED_POOL = re.compile(r"^(mirror|raidz\d*|draid\d*|spare|log)$|^c\d")


def _check_component(part: str, whole: str, what: str) -> None:
    if not part:
        raise InvalidName(f"{what} {whole!r}: empty component")
    if part in (".", ".."):
        raise InvalidName(f"{what} {whole!r}: component {part!r} is not allowed")
    if not _COMPONENT.fullmatch(part):
        bad = sorted({c for c in part if not _COMPONENT.fullmatch(c)})
        raise InvalidName(f"{what} {whole!r}: invalid character(s) {''.join(bad)!r}")


class DatasetName(str):
    """A valid ZFS filesystem or volume name, e.g. ``tank/data``.

    Raises:
        InvalidName: on construction from a string that breaks the rules in the module doc.
    """

    __slots__ = ()

    def __new__(cls, value: str) -> DatasetName:
        if not isinstance(value, str):
            raise InvalidName(f"dataset name must be a string, got {type(value).__name__}")
        if not value:
            raise InvalidName("dataset name is empty")
        if "@" in value or "#" in value:
            raise InvalidName(f"dataset {value!r}: '@' and '#' belong to snapshot/bookmark names")
        parts = value.split("/")
        for part in parts:
            _check_component(part, value, "dataset")
        if len(value) > MAX_NAME_LEN:  # ASCII only by now, so characters == bytes
            raise InvalidName(f"dataset {value[:40]!r}...: longer than {MAX_NAME_LEN} bytes")
        if len(parts[0]) > MAX_POOL_NAME_LEN:
            raise InvalidName(f"dataset {value[:40]!r}...: pool name longer than"
                              f" {MAX_POOL_NAME_LEN} bytes")
        if not parts[0][0].isalpha():
            raise InvalidName(f"dataset {value!r}: pool name must start with a letter")
        if _RESERVED_POOL.search(parts[0]):
            raise InvalidName(f"dataset {value!r}: {parts[0]!r} is a reserved pool name")
        return super().__new__(cls, value)

    @property
    def pool(self) -> str:
        """The pool, i.e. the first component."""
        return self.split("/", 1)[0]

    def child(self, relative: str) -> DatasetName:
        """Return ``self/relative`` (validated); ``relative`` may be ``""`` for self."""
        return DatasetName(f"{self}/{relative}" if relative else str(self))

    def relative_to(self, root: DatasetName) -> str:
        """Return the path below ``root`` (``""`` for root itself).

        Raises:
            ValueError: when self is not root or below it.
        """
        if self == root:
            return ""
        if not self.startswith(root + "/"):
            raise ValueError(f"{self} is not below {root}")
        return self[len(root) + 1 :]


def check_short_name(value: str, what: str = "snapshot name") -> str:
    """Validate the part after ``@`` or ``#`` and return it.

    Raises:
        InvalidName: empty, invalid characters, or a leading ``-`` (argv-injection guard,
            stricter than OpenZFS).
    """
    if not isinstance(value, str):
        raise InvalidName(f"{what} must be a string")
    _check_component(value, value, what)
    if value.startswith("-"):
        raise InvalidName(f"{what} {value!r}: must not start with '-'")
    if len(value.encode()) > MAX_NAME_LEN - 2:  # no POOL@NAME of at most MAX_NAME_LEN holds it
        raise InvalidName(f"{what} {value[:40]!r}...: longer than {MAX_NAME_LEN - 2} bytes")
    return value


class SnapshotName(str):
    """A full snapshot name ``DATASET@NAME``, validated.

    Raises:
        InvalidName: when either part breaks the rules or the whole is too long.
    """

    __slots__ = ()

    def __new__(cls, value: str) -> SnapshotName:
        if not isinstance(value, str) or value.count("@") != 1:
            raise InvalidName(f"snapshot {value!r}: needs exactly one '@'")
        ds, short = value.split("@")
        DatasetName(ds)
        check_short_name(short)
        if len(value.encode()) > MAX_NAME_LEN:
            raise InvalidName(f"snapshot {value[:40]!r}...: longer than {MAX_NAME_LEN} bytes")
        return super().__new__(cls, value)

    @classmethod
    def of(cls, dataset: DatasetName | str, short: str) -> SnapshotName:
        """Build ``dataset@short`` and validate it."""
        return cls(f"{dataset}@{short}")

    @property
    def dataset(self) -> DatasetName:
        """The dataset part."""
        return DatasetName(self.split("@", 1)[0])

    @property
    def short(self) -> str:
        """The part after ``@``."""
        return self.split("@", 1)[1]


class BookmarkName(str):
    """A full bookmark name ``DATASET#NAME``, validated like SnapshotName."""

    __slots__ = ()

    def __new__(cls, value: str) -> BookmarkName:
        if not isinstance(value, str) or value.count("#") != 1 or "@" in value:
            raise InvalidName(f"bookmark {value!r}: needs exactly one '#' and no '@'")
        ds, short = value.split("#")
        DatasetName(ds)
        check_short_name(short, "bookmark name")
        if len(value.encode()) > MAX_NAME_LEN:
            raise InvalidName(f"bookmark {value[:40]!r}...: longer than {MAX_NAME_LEN} bytes")
        return super().__new__(cls, value)


def check_hold_tag(value: str) -> str:
    """Validate a ``zfs hold`` tag (zbak makes them as ``zbak:<job>:<target>``).

    OpenZFS accepts any string under MAXNAMELEN (256) bytes as a tag; zbak keeps tags to
    printable ASCII without a leading ``-`` so they are safe, readable argv elements.

    Raises:
        InvalidName: when the tag is empty, too long, or has other characters.
    """
    if not isinstance(value, str) or not value or len(value.encode()) > MAX_NAME_LEN:
        raise InvalidName(f"hold tag {value!r}: must be 1..{MAX_NAME_LEN} bytes")
    if value.startswith("-") or not all(" " <= c <= "~" for c in value):
        raise InvalidName(f"hold tag {value!r}: printable ASCII only, no leading '-'")
    return value


def parse_any_name(name: str) -> DatasetName | SnapshotName | BookmarkName:
    """Parse ``name`` as a snapshot (has ``@``), bookmark (has ``#``) or dataset name.

    Raises:
        InvalidName: the name breaks the rules of its kind.
    """
    if isinstance(name, str) and "@" in name:
        return SnapshotName(name)
    if isinstance(name, str) and "#" in name:
        return BookmarkName(name)
    return DatasetName(name)


_PROPERTY = re.compile(r"[A-Za-z0-9_.:@+][A-Za-z0-9_.:@+-]*")


def check_property_name(prop: str) -> str:
    """Validate a native or user property name (``compression``, ``com.example:tag``,
    ``userquota@bob``) for use in argv and return it.

    Raises:
        InvalidName: empty, over 256 bytes (ZAP_MAXNAMELEN, zfsprops(7) "User Properties"),
            a leading ``-``, or characters outside letters, digits and ``_.:@+-``.
    """
    if not isinstance(prop, str) or not _PROPERTY.fullmatch(prop) or len(prop) > 256:
        raise InvalidName(f"property name {prop!r}: letters, digits and _.:@+- only")
    return prop


_USER_PROPERTY = re.compile(r"[a-z0-9_.:-]+")
MAX_PROPERTY_VALUE = 8192
"""Bytes a user property value may hold (zfsprops(7) "User Properties": 8192)."""


def check_user_property(value: str) -> str:
    """Validate a user property name (``zbak:job``, ``com.example:backup``) and return it.

    zfsprops(7) "User Properties": the name contains a ``:``, holds only lower-case letters,
    digits and ``:-._``, does not start with ``-`` and is at most 256 characters.

    Raises:
        InvalidName: the name breaks one of those rules.
    """
    if not isinstance(value, str) or not _USER_PROPERTY.fullmatch(value) or len(value) > 256:
        raise InvalidName(f"user property {value!r}: lower-case letters, digits and ':-._' "
                          "only, at most 256 characters (zfsprops(7))")
    if ":" not in value or value.startswith("-"):
        raise InvalidName(f"user property {value!r}: needs a ':' (e.g. 'zbak:job') and must "
                          "not start with '-' (zfsprops(7))")
    return value


def check_user_property_value(value: str, what: str = "user property value") -> str:
    """Validate a user property value zbak compares against and return it.

    ZFS stores any string up to ``MAX_PROPERTY_VALUE`` bytes; zbak refuses control
    characters (values must stay one field of a tab-separated listing) and ``-`` (what
    ``zfs get`` prints for a property that is not set).

    Raises:
        InvalidName: empty, ``-``, too long, or holding a control character.
    """
    if not isinstance(value, str) or not value or value == "-":
        raise InvalidName(f"{what} {value!r}: must be a non-empty string other than '-'")
    if len(value.encode()) > MAX_PROPERTY_VALUE or any(ord(c) < 32 or ord(c) == 127
                                                        for c in value):
        raise InvalidName(f"{what} {value[:40]!r}: at most {MAX_PROPERTY_VALUE} bytes, "
                          "no control characters")
    return value
