"""The codec chain: everything that happens to a volume's bytes between ``zfs send`` and the
store, and back (docs/design.md#codec-chain).

One :class:`Codec` per stream: archive encodes with it (``archive/volumes.py``), restore checks
and decodes with it (``restore/fetch.py``, ``restore/execute.py``), the deep audit decodes with
it (``audit/deep.py``), and copying between stores either passes stored bytes through
(:meth:`Codec.stores_like`) or re-encodes them (:meth:`Codec.reencode`). Each step keeps both
of its directions together, as zfs-autobackup's ``compressors.py`` keeps each compressor's
command and its inverse in one table entry:

* ``zstd``: one zstd frame per volume with a content checksum (``streams.frames``), level
  from the job; its reader checks the frame end, nothing after it and the decoded size
  (docs/style.md#the-zstandard-pitfall).

The chain's name (``"zstd"``) is what the catalog's ``compression`` column and the stream
manifest record; :meth:`Codec.named` turns it back into a codec that can decode.

On the way out: raw chunks -> each step in order -> stored chunks, with the raw and stored
byte counts and the raw SHA-256 in a :class:`~zrepl_py.streams.frames.Digest`. On the way
back: stored chunks -> (the stored SHA-256 is the caller's check, against the catalog) ->
each step's inverse in reverse order -> raw chunks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import Protocol

from zrepl_py.errors import StreamCorrupt
from zrepl_py.streams.frames import Digest, FrameWalk, compress_frame, decompress_frame

ZSTD = "zstd"
STEP_SEPARATOR = "+"


class StoredWalk(Protocol):
    """Checks the structure of a volume's stored bytes as they pass, without decoding them
    (``FrameWalk`` for a zstd frame): ``feed`` every chunk in order, then ``end``; both raise
    ``StreamCorrupt``."""

    def feed(self, chunk: bytes) -> object:
        """Account for the next stored bytes."""

    def end(self) -> None:
        """The stored bytes are over: they must be complete."""


@dataclasses.dataclass(frozen=True)
class Codec:
    """The steps a volume's bytes go through, in the order they are applied on the way out.

    Attributes:
        level: the zstd level (1..22) used when encoding; decoding does not need it.
    """

    level: int = 3

    @property
    def steps(self) -> tuple[str, ...]:
        """The step names in order (``("zstd",)``)."""
        return (ZSTD,)

    @property
    def name(self) -> str:
        """The chain as the catalog records it: the step names joined by ``+``."""
        return STEP_SEPARATOR.join(self.steps)

    @classmethod
    def named(cls, name: str, *, level: int = 3) -> Codec:
        """The codec of a chain the catalog or a manifest records (its :attr:`name`).

        Raises:
            StreamCorrupt: a chain zbak does not know (written by a newer zbak).
        """
        if name != ZSTD:
            raise StreamCorrupt(f"codec chain {name!r} is not one this zbak reads (it reads"
                                f" {ZSTD!r}); upgrade zbak")
        return cls(level=level)

    def encode(self, raw: Iterable[bytes], digest: Digest) -> Iterator[bytes]:
        """Yield the stored bytes of one volume whose raw bytes are ``raw``.

        Args:
            raw: the volume's raw chunks (1 MiB each from the archive); each must not change
                after it is yielded.
            digest: receives the raw count and SHA-256 and the stored count (and SHA-256
                when it hashes stored bytes); complete once the generator is exhausted.

        Raises:
            whatever iterating ``raw`` raises.
        """
        return compress_frame(raw, self.level, digest)

    def decode(self, stored: Iterable[bytes], what: str, digest: Digest | None = None, *,
               raw_bytes: int | None = None) -> Iterator[bytes]:
        """Yield the raw bytes of one volume from its stored bytes, with every check of
        every step; the last raw piece comes only once all of them passed, so a consumer
        (``zfs receive``) never gets the end of a volume that fails one.

        Args:
            stored: the stored bytes in chunks (already checked against the catalog's
                SHA-256 by the caller, where it has one).
            what: names the volume in error messages (store and key).
            digest: when given, receives the stored and raw counts and hashes.
            raw_bytes: the raw size the catalog records, checked at the end.

        Raises:
            StreamCorrupt: a step's check failed (a damaged frame, a truncated one, bytes
                after it, another raw size).
        """
        return decompress_frame(stored, what, digest, raw_bytes=raw_bytes)

    def walk(self, what: str) -> StoredWalk:
        """A structure check of this chain's stored bytes that decodes nothing (a zstd
        frame's headers); ``what`` names the volume in error messages."""
        return FrameWalk(what)

    def stores_like(self, other: Codec) -> bool:
        """True when a volume stored with ``other`` is what this codec would store, so a
        copy may pass the stored bytes through unchanged (a different zstd level still
        decodes the same: the level is not part of what is stored)."""
        return self.steps == other.steps

    def reencode(self, stored: Iterable[bytes], source: Codec, what: str, digest: Digest, *,
                 raw_bytes: int | None = None) -> Iterator[bytes]:
        """Yield this codec's stored bytes for a volume stored with ``source``: decoded with
        every check of ``source``, then encoded (``digest`` as in :meth:`encode`).

        Raises:
            StreamCorrupt: the stored bytes fail a check of ``source``.
        """
        return self.encode(source.decode(stored, what, raw_bytes=raw_bytes), digest)
