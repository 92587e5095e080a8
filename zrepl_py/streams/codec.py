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
* ``age`` (a sealed store, ``[stores.NAME.age]``): the zstd frame encrypted to every
  recipient as one age file (``streams.age``); decrypting needs an identity, and its
  stored structure is checked by the age header line alone.

The chain's name (``"zstd"``, ``"zstd+age"``) is what the catalog's ``compression`` column
and the stream manifest record; :meth:`Codec.named` turns it back into a codec that can
decode.

On the way out: raw chunks -> each step in order -> stored chunks, with the raw and stored
byte counts and the raw hash in a :class:`~zrepl_py.streams.frames.Digest`. On the way
back: stored chunks -> (the stored SHA-256 is the caller's check, against the catalog) ->
each step's inverse in reverse order -> raw chunks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

from zrepl_py.errors import IdentityNeeded, StreamCorrupt
from zrepl_py.streams.frames import (
    Digest,
    FrameWalk,
    compress_frame,
    decompress_frame,
    redecoded,
)

ZSTD = "zstd"
AGE = "age"
STEP_SEPARATOR = "+"
CHAINS = (ZSTD, ZSTD + STEP_SEPARATOR + AGE)
"""Every chain this zbak writes and reads."""
READ_CHUNK = 1 << 20
"""Bytes read from a volume file at a time (:func:`file_chunks`)."""


def file_chunks(path: Path) -> Iterator[bytes]:
    """Yield the bytes of the file ``path`` in chunks of ``READ_CHUNK``.

    Raises:
        OSError: the file cannot be opened or read.
    """
    with open(path, "rb") as f:
        while chunk := f.read(READ_CHUNK):
            yield chunk


class StoredWalk(Protocol):
    """Checks the structure of a volume's stored bytes as they pass, without decoding them
    (``FrameWalk`` for a zstd frame): ``feed`` every chunk in order, then ``end``; both raise
    ``StreamCorrupt``."""

    def feed(self, chunk: bytes) -> object:
        """Account for the next stored bytes."""

    def end(self) -> None:
        """The stored bytes are over: they must be complete."""


@dataclasses.dataclass(frozen=True)
class Sealing:
    """The age keys of a sealed store's codec (``streams.age``).

    Attributes:
        recipients: the public keys as configured (``age1...``, ``ssh-ed25519 BASE64``);
            what a copy compares (:meth:`Codec.stores_like`).
        encrypt_to: the parsed recipients (pyrage), needed to encode.
        identities: the parsed private keys (pyrage), needed to decode; never shown.
        store: the store's name, for messages.
        identity_file: the file ``identities`` were read from, which the ``age`` command
            reads itself when it decrypts a volume file (:meth:`Codec.decode_file`); None
            when the identities came from elsewhere.
    """

    recipients: tuple[str, ...] = ()
    encrypt_to: tuple[Any, ...] = dataclasses.field(default=(), repr=False, compare=False)
    identities: tuple[Any, ...] = dataclasses.field(default=(), repr=False, compare=False)
    store: str = ""
    identity_file: Path | None = dataclasses.field(default=None, compare=False)

    @property
    def keys(self) -> frozenset[str]:
        """The recipients without their comments (``ssh-ed25519 BASE64``)."""
        return frozenset(" ".join(r.split()[:2]) for r in self.recipients)


@dataclasses.dataclass(frozen=True)
class Codec:
    """The steps a volume's bytes go through, in the order they are applied on the way out.

    Attributes:
        level: the zstd level (1..22) used when encoding; decoding does not need it.
        sealing: the age keys of a sealed chain; None for plain zstd.
    """

    level: int = 3
    sealing: Sealing | None = None

    @property
    def steps(self) -> tuple[str, ...]:
        """The step names in order (``("zstd",)``, ``("zstd", "age")``)."""
        return (ZSTD, AGE) if self.sealing is not None else (ZSTD,)

    @property
    def name(self) -> str:
        """The chain as the catalog records it: the step names joined by ``+``."""
        return STEP_SEPARATOR.join(self.steps)

    @property
    def sealed(self) -> bool:
        """True when the stored bytes are encrypted (the ``age`` step)."""
        return self.sealing is not None

    @property
    def sealed_to(self) -> tuple[str, ...] | None:
        """The recipients' keys (:attr:`Sealing.keys`), sorted: what the catalog records of
        a stream this codec sealed (``streams.sealed_to``,
        docs/sealed.md#changing-the-recipients); None for a plain codec."""
        return tuple(sorted(self.sealing.keys)) if self.sealing is not None else None

    @property
    def fingerprint(self) -> str:
        """What an interrupted upload must have been encoded with to be resumed: the chain,
        the level and, sealed, a SHA-256 of the recipients (public keys: it decrypts
        nothing)."""
        text = f"{self.name}-{self.level}"
        if self.sealing is not None:
            keys = "\n".join(sorted(self.sealing.keys)).encode()
            text += ":" + hashlib.sha256(keys).hexdigest()[:16]
        return text

    @classmethod
    def named(cls, name: str, *, level: int = 3, sealing: Sealing | None = None) -> Codec:
        """The codec of a chain the catalog or a manifest records (its :attr:`name`);
        ``sealing`` gives a sealed chain its keys (without identities, decoding raises
        ``IdentityNeeded``).

        Raises:
            StreamCorrupt: a chain zbak does not know (written by a newer zbak).
        """
        if name not in CHAINS:
            raise StreamCorrupt(f"codec chain {name!r} is not one this zbak reads (it reads"
                                f" {', '.join(map(repr, CHAINS))}); upgrade zbak")
        if AGE not in name.split(STEP_SEPARATOR):
            return cls(level=level)
        return cls(level=level, sealing=sealing or Sealing())

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
        return self._encode(raw, digest, _unchecked)

    def _sealed(self, raw: Iterable[bytes], digest: Digest, sealing: Sealing,
                check: Callable[[Iterator[bytes]], Iterator[bytes]]) -> Iterator[bytes]:
        from zrepl_py.streams import age

        frame = Digest(hash_stored=False)
        for out in age.encrypt(check(compress_frame(raw, self.level, frame)),
                               sealing.encrypt_to):
            digest.add_stored(out)
            yield out
        digest.take_raw(frame)

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
                after it, another raw size; a sealed volume whose payload does not
                authenticate).
            IdentityNeeded: a sealed chain without identities (before any byte is read).
            IdentityRefused: a sealed volume's header opens with none of them (before any
                raw byte comes out).
        """
        if self.sealing is None:
            return decompress_frame(stored, what, digest, raw_bytes=raw_bytes)
        if not self.sealing.identities:
            raise IdentityNeeded(_identity_needed(self.sealing.store, what))
        return self._opened(stored, what, digest, raw_bytes, self.sealing)

    def _opened(self, stored: Iterable[bytes], what: str, digest: Digest | None,
                raw_bytes: int | None, sealing: Sealing) -> Iterator[bytes]:
        from zrepl_py.streams import age

        plain = age.decrypt(_counted(stored, digest) if digest is not None else stored,
                            sealing.identities, what)
        if digest is None:  # a restore's receive pass reads no raw hash: none is made
            yield from decompress_frame(plain, what, raw_bytes=raw_bytes)
            return
        frame = Digest(hash_stored=False, hash_raw=digest.hash_raw)
        yield from decompress_frame(plain, what, frame, raw_bytes=raw_bytes)
        digest.take_raw(frame)

    def decode_file(self, path: Path, what: str, *, raw_bytes: int | None = None
                    ) -> Iterator[bytes]:
        """:meth:`decode` of the volume stored in the local file ``path`` (a verified volume
        a restore receives), with the same checks and errors.

        A sealed volume is decrypted by the ``age`` command (:func:`streams.age.decrypt_file
        <zrepl_py.streams.age.decrypt_file>`) when it is installed and the identities came
        from a file: in its own process, so decryption runs beside this process's
        decompression on the other CPU instead of taking the GIL for every 8 KiB pyrage reads
        (docs/decisions.md#sealed-restore-decrypts-with-the-age-command). Otherwise pyrage
        decrypts, as :meth:`decode` does.

        Raises:
            StreamCorrupt, IdentityNeeded, IdentityRefused: as :meth:`decode`.
            OSError: the file cannot be read.
        """
        sealing = self.sealing
        if sealing is not None and sealing.identities and sealing.identity_file is not None:
            from zrepl_py.streams import age

            command = shutil.which(age.COMMAND)
            if command is not None:
                plain = age.decrypt_file(command, path, sealing.identity_file, what)
                return decompress_frame(plain, what, raw_bytes=raw_bytes)
        return self.decode(file_chunks(path), what, raw_bytes=raw_bytes)

    def walk(self, what: str) -> StoredWalk:
        """A structure check of this chain's stored bytes that decodes nothing (a zstd
        frame's headers; a sealed volume's age header line); ``what`` names the volume in
        error messages."""
        if self.sealing is not None:
            from zrepl_py.streams.age import HeaderWalk

            return HeaderWalk(what)
        return FrameWalk(what)

    def stores_like(self, other: Codec) -> bool:
        """True when a volume stored with ``other`` is what this codec would store, so a
        copy may pass the stored bytes through unchanged: the same steps and, sealed, the
        same recipients (a different zstd level still decodes the same: the level is not
        part of what is stored)."""
        if self.steps != other.steps:
            return False
        return (self.sealing is None or other.sealing is None
                or self.sealing.keys == other.sealing.keys)

    def reencode(self, stored: Iterable[bytes], source: Codec, what: str, digest: Digest, *,
                 read: Digest | None = None, raw_bytes: int | None = None,
                 sink: Callable[[bytes], object] | None = None) -> Iterator[bytes]:
        """Yield this codec's stored bytes for a volume stored with ``source``: decoded with
        every check of ``source``, then encoded (``digest`` as in :meth:`encode`). The new
        zstd frame is decoded again as it is made, and its last piece comes only once its
        raw bytes are the ones read (their count and BLAKE3): a copy into a store of another
        codec chain writes the same send stream
        (docs/decisions.md#copies-re-encode-volume-by-volume).

        Args:
            stored: the volume's stored bytes (``source``'s chain).
            source: the codec that decodes them (identities for a sealed chain).
            what: names the volume in error messages (store and key).
            digest: receives the raw count and hash and the new stored count (and SHA-256
                when it hashes stored bytes).
            read: when given, receives the stored count and SHA-256 of ``stored`` (the
                caller checks them against the catalog) and the raw count and hash.
            raw_bytes: the raw size the catalog records, checked at the end of the decode.
            sink: receives each decoded raw piece in order (a record walk).

        Raises:
            StreamCorrupt, IdentityNeeded, IdentityRefused: as :meth:`decode` of ``source``;
                StreamCorrupt too when the new frame decodes to other bytes.
            whatever ``sink`` raises.
        """
        taken = read if read is not None else Digest(hash_stored=False)
        raw = source.decode(stored, what, taken, raw_bytes=raw_bytes)
        if sink is not None:
            raw = _tapped(raw, sink)
        return self._encode(raw, digest, lambda frame: redecoded(frame, what, taken))

    def _encode(self, raw: Iterable[bytes], digest: Digest,
                check: Callable[[Iterator[bytes]], Iterator[bytes]]) -> Iterator[bytes]:
        """:meth:`encode`, with the zstd frame passed through ``check`` before any later
        step."""
        if self.sealing is None:
            return check(compress_frame(raw, self.level, digest))
        return self._sealed(raw, digest, self.sealing, check)


def _tapped(chunks: Iterable[bytes], sink: Callable[[bytes], object]) -> Iterator[bytes]:
    for chunk in chunks:
        sink(chunk)
        yield chunk


def _unchecked(frame: Iterator[bytes]) -> Iterator[bytes]:
    return frame


def _counted(stored: Iterable[bytes], digest: Digest) -> Iterator[bytes]:
    for chunk in stored:
        digest.add_stored(chunk)
        yield chunk


def _identity_needed(store: str, what: str) -> str:
    where = f"store {store}" if store else what
    return (f"{where} is sealed (age): reading its volumes needs an identity: pass"
            f" --identity FILE, or set [stores.{store or 'NAME'}.age] identity_file on this host"
            " (docs/sealed.md)")
