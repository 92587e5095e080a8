"""Object keys: the one check every backend applies before touching the store."""

from __future__ import annotations

from zrepl_py.errors import StorePermanent

# S3 allows keys of up to 1,024 bytes of UTF-8 (AWS S3 user guide, "Naming Amazon S3 objects").
MAX_KEY_BYTES = 1024


def check_key(key: str, *, store: str) -> str:
    """Return ``key`` when it is a valid key relative to a store root, else raise.

    A valid key is non-empty, ``/``-separated, does not start or end with ``/``, has no empty,
    ``.`` or ``..`` segment, no NUL and no other control character, and is at most 1,024 bytes
    of UTF-8 (the S3 limit). These rules keep a key inside its prefix or directory and mean the
    same object on every backend.

    Raises:
        StorePermanent: the key breaks a rule (the message says which).
    """

    def bad(why: str) -> StorePermanent:
        return StorePermanent(f"store {store}: invalid object key {key!r}: {why}",
                              store=store, key=key)

    if not isinstance(key, str) or not key:
        raise bad("empty")
    if key.startswith("/"):
        raise bad("starts with '/' (keys are relative to the store root)")
    if any(ord(c) < 0x20 or c == "\x7f" for c in key):
        raise bad("contains NUL or a control character")
    for segment in key.split("/"):
        if segment == "":
            raise bad("has an empty segment ('//' or a trailing '/')")
        if segment in (".", ".."):
            raise bad(f"has a {segment!r} segment")
    try:
        encoded = key.encode("utf-8")
    except UnicodeEncodeError:
        raise bad("is not valid UTF-8") from None
    if len(encoded) > MAX_KEY_BYTES:
        raise bad(f"longer than {MAX_KEY_BYTES} bytes of UTF-8")
    return key


def check_prefix(prefix: str, *, store: str) -> str:
    """Return ``prefix`` when it may start keys (``""``, ``"streams/"``, ``"streams/ab"``), else
    raise ``StorePermanent``: it must not start with ``/`` nor contain NUL, control characters
    or a ``..`` segment."""
    if prefix == "":
        return prefix
    if prefix.startswith("/") or any(ord(c) < 0x20 or c == "\x7f" for c in prefix) or (
        ".." in prefix.split("/")
    ):
        raise StorePermanent(f"store {store}: invalid key prefix {prefix!r}", store=store)
    return prefix
