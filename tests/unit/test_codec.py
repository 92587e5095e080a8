"""The codec chain (zrepl_py/streams/codec.py) with real pyrage: a volume round-trips through
plain and sealed chains, age X25519 and ssh-ed25519 keys (made by ``ssh-keygen``) both
work, a copy passes stored bytes through only to a chain that stores them alike, and
re-encoding changes the chain without changing the raw bytes."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import blake3
import pyrage
import pytest

from zrepl_py.errors import IdentityNeeded, IdentityRefused, StreamCorrupt
from zrepl_py.streams import age, frames
from zrepl_py.streams import codec as codec_module
from zrepl_py.streams.codec import Codec, Sealing
from zrepl_py.streams.frames import Digest

MIB = 1 << 20
RAW = os.urandom(MIB) + b"compressible " * 100_000


def pieces(data: bytes, size: int = 256 * 1024) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


def sealed_with(*keys: pyrage.x25519.Identity) -> Codec:
    """A sealed codec that encrypts to and decrypts with ``keys``."""
    names = tuple(str(k.to_public()) for k in keys)
    return Codec(sealing=Sealing(names, tuple(age.recipients(names, "test")), tuple(keys)))


def stored(codec: Codec, raw: bytes = RAW) -> tuple[bytes, Digest]:
    digest = Digest()
    return b"".join(codec.encode(pieces(raw), digest)), digest


def decoded(codec: Codec, data: bytes, raw_bytes: int | None = None) -> bytes:
    return b"".join(codec.decode(pieces(data), "vol", raw_bytes=raw_bytes))


@pytest.mark.parametrize("sealed", [False, True], ids=["zstd", "zstd+age"])
def test_a_volume_round_trips_and_the_digest_describes_both_sides(sealed):
    codec = sealed_with(pyrage.x25519.Identity.generate()) if sealed else Codec()
    data, digest = stored(codec)
    assert data.startswith(age.MAGIC) == sealed
    assert (digest.raw_bytes, digest.raw_hash) == (len(RAW), blake3.blake3(RAW).hexdigest())
    assert (digest.stored_bytes, digest.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert decoded(codec, data, raw_bytes=len(RAW)) == RAW
    assert Codec.named(codec.name).steps == codec.steps


@pytest.mark.parametrize("sealed", [False, True], ids=["zstd", "zstd+age"])
def test_a_reader_that_checks_the_raw_size_alone_hashes_no_raw_byte(sealed, monkeypatch):
    codec = sealed_with(pyrage.x25519.Identity.generate()) if sealed else Codec()
    data, _ = stored(codec)

    class Refused:
        def update(self, data: bytes) -> None:
            raise AssertionError("a raw byte was hashed")

    monkeypatch.setitem(frames.RAW_HASHES, frames.RAW_HASH, Refused)
    digest = Digest(hash_raw=False)  # what the deep audit reads volumes with
    assert b"".join(codec.decode(pieces(data), "vol", digest, raw_bytes=len(RAW))) == RAW
    assert (digest.raw_bytes, digest.stored_bytes) == (len(RAW), len(data))
    assert digest.sha256 == hashlib.sha256(data).hexdigest()
    with pytest.raises(ValueError, match="without hashing"):
        digest.raw_hash  # noqa: B018


def test_an_ssh_ed25519_key_pair_made_by_ssh_keygen_seals_and_opens(tmp_path: Path):
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "admin@laptop",
                    "-f", str(key)], check=True)
    public = key.with_suffix(".pub").read_text().strip()
    writing = Codec(sealing=Sealing((public,), tuple(age.recipients([public], "test"))))
    bare = " ".join(public.split()[:2])  # as a recipients file may name it
    reading = Codec(sealing=Sealing((bare,), identities=tuple(age.identities(key))))
    assert decoded(reading, stored(writing)[0]) == RAW
    assert writing.stores_like(reading)  # the comment is not part of the key


def test_a_sealed_volume_needs_one_of_its_identities():
    mine, other = pyrage.x25519.Identity.generate(), pyrage.x25519.Identity.generate()
    data, _ = stored(sealed_with(mine))
    with pytest.raises(IdentityRefused):
        decoded(sealed_with(other), data)
    with pytest.raises(IdentityNeeded):
        decoded(Codec.named("zstd+age"), data)
    assert decoded(sealed_with(other, mine), data) == RAW


def test_an_unknown_chain_is_refused():
    with pytest.raises(StreamCorrupt, match="upgrade zbak"):
        Codec.named("zstd+rot13")


def test_stored_bytes_pass_through_a_copy_only_to_a_chain_that_stores_them_alike():
    one, two = pyrage.x25519.Identity.generate(), pyrage.x25519.Identity.generate()
    assert Codec(level=19).stores_like(Codec(level=1))
    assert not Codec().stores_like(sealed_with(one))
    assert not sealed_with(one).stores_like(Codec())
    assert sealed_with(one, two).stores_like(sealed_with(two, one))
    assert not sealed_with(one).stores_like(sealed_with(two))


def test_reencoding_changes_the_chain_and_keeps_the_raw_bytes():
    key = pyrage.x25519.Identity.generate()
    plain, sealed = Codec(), sealed_with(key)
    data, _ = stored(plain)
    digest, read, seen = Digest(), Digest(), bytearray()
    again = b"".join(sealed.reencode(pieces(data), plain, "vol", digest, read=read,
                                     raw_bytes=len(RAW), sink=seen.extend))
    assert again.startswith(age.MAGIC)
    assert digest.raw_hash == blake3.blake3(RAW).hexdigest()
    assert (read.stored_bytes, read.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert seen == RAW
    assert decoded(sealed, again) == RAW
    back = b"".join(plain.reencode(pieces(again), sealed, "vol", Digest()))
    assert decoded(plain, back) == RAW


@pytest.mark.parametrize("sealed", [False, True], ids=["zstd", "zstd+age"])
def test_a_new_frame_that_decodes_to_other_bytes_is_refused_before_its_last_piece(
        sealed, monkeypatch):
    """``Codec.reencode`` decodes the zstd frame it makes again: a compressor that drops the
    first byte of every chunk (standing in for a defect; the real one is wrapped) stops the
    volume with StreamCorrupt before its last stored piece, so a put never completes it."""
    plain = Codec()
    data, _ = stored(plain)
    target = sealed_with(pyrage.x25519.Identity.generate()) if sealed else Codec()
    real = codec_module.compress_frame

    def dropping(raw, level, digest):
        return real((chunk[1:] for chunk in raw), level, digest)

    monkeypatch.setattr(codec_module, "compress_frame", dropping)
    made = []
    with pytest.raises(StreamCorrupt, match="the new zstd frame decodes to"):
        for piece in target.reencode(pieces(data), plain, "vol", Digest(hash_stored=False)):
            made.append(piece)
    with pytest.raises((StreamCorrupt, IdentityRefused)):  # what came out is no whole volume
        b"".join(target.decode(pieces(b"".join(made)), "vol"))
