"""A sealed volume file decoded by Debian's ``age`` command (``Codec.decode_file``,
``streams.age.decrypt_file``; docs/decisions.md#sealed-restore-decrypts-with-the-age-command):
the command gets the identity file's path and the volume's path, never a key; a wrong
identity is ``IdentityRefused`` before any plaintext; a damaged payload is ``StreamCorrupt``
after some; an OpenSSH ed25519 identity file works as an age one; without the command on
the PATH pyrage decodes the same bytes. Real ``age``, ``age-keygen``, ``ssh-keygen`` and
pyrage; volumes of about 3 MiB of raw data (48 age chunks of 64 KiB)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from zrepl_py.errors import IdentityRefused, StreamCorrupt
from zrepl_py.streams import age
from zrepl_py.streams.codec import Codec, Sealing
from zrepl_py.streams.frames import Digest

MIB = 1 << 20
RAW = os.urandom(2 * MIB) + b"compressible " * 80_000

pytestmark = pytest.mark.skipif(shutil.which("age") is None, reason="needs Debian's age")


def keygen(path: Path) -> str:
    """``age-keygen -o PATH``; return the public key."""
    subprocess.run(["age-keygen", "-o", str(path)], check=True, capture_output=True)
    return subprocess.run(["age-keygen", "-y", str(path)], check=True, capture_output=True,
                          text=True).stdout.strip()


def reading(identity: Path) -> Codec:
    """The codec a restore reads a sealed store with, from the identity file (as
    ``stores.sealing`` builds it)."""
    return Codec.named("zstd+age", sealing=Sealing(
        identities=tuple(age.identities(identity)), identity_file=identity, store="cold"))


def sealed(tmp_path: Path, raw: bytes) -> tuple[Path, Path]:
    """(a sealed volume file of ``raw`` encrypted to ``key``, ``key``)."""
    key = tmp_path / "key.txt"
    recipient = keygen(key)
    codec = Codec(sealing=Sealing((recipient,), tuple(age.recipients([recipient], "test"))))
    path = tmp_path / "vol-000000.zst"
    path.write_bytes(b"".join(codec.encode([raw[i:i + MIB] for i in range(0, len(raw), MIB)],
                                           Digest(hash_stored=False))))
    return path, key


@pytest.fixture
def volume(tmp_path: Path) -> tuple[Path, Path]:
    """(a sealed volume file of RAW encrypted to ``key``, ``key``)."""
    return sealed(tmp_path, RAW)


@pytest.fixture
def logged_age(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An ``age`` first on the PATH that logs its argv, one argument a line, and runs the
    real one; returns the log."""
    real = shutil.which("age")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "age-argv.log"
    (bin_dir / "age").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {log}\nexec {real} "$@"\n')
    (bin_dir / "age").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return log


def test_the_age_command_decrypts_a_volume_file_given_the_identity_path_only(volume, logged_age):
    path, key = volume
    assert b"".join(reading(key).decode_file(path, "cold:vol", raw_bytes=len(RAW))) == RAW
    argv = logged_age.read_text().splitlines()
    assert argv == ["-d", "-i", str(key), str(path)]
    assert not any("AGE-SECRET-KEY" in arg for arg in argv)


def test_a_wrong_identity_is_refused_before_any_plaintext(volume, logged_age, tmp_path):
    path, _ = volume
    other = tmp_path / "other.txt"
    keygen(other)
    out: list[bytes] = []
    with pytest.raises(IdentityRefused, match="none of the identities"):
        out.extend(reading(other).decode_file(path, "cold:vol"))
    assert out == [] and logged_age.exists()


def test_a_damaged_payload_fails_as_a_corrupt_volume_after_some_plaintext(tmp_path):
    path, key = sealed(tmp_path, os.urandom(4 * MIB))
    data = bytearray(path.read_bytes())
    data[-1_000] ^= 1  # the last 64 KiB chunk: 3 MiB and more authenticate first, and
    # every whole piece but the one held back comes out
    path.write_bytes(bytes(data))
    out: list[bytes] = []
    with pytest.raises(StreamCorrupt, match="does not decrypt"):
        out.extend(age.decrypt_file(shutil.which("age") or "age", path, key, "cold:vol"))
    assert 0 < sum(map(len, out)) < len(data)


def test_without_the_age_command_pyrage_decodes_the_file(volume, monkeypatch, tmp_path):
    path, key = volume
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert shutil.which("age") is None
    assert b"".join(reading(key).decode_file(path, "cold:vol", raw_bytes=len(RAW))) == RAW


def test_an_ssh_ed25519_identity_file_decrypts_through_the_age_command(tmp_path, logged_age):
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "admin@laptop",
                    "-f", str(key)], check=True)
    public = key.with_suffix(".pub").read_text().strip()
    writing = Codec(sealing=Sealing((public,), tuple(age.recipients([public], "test"))))
    path = tmp_path / "vol-000000.zst"
    path.write_bytes(b"".join(writing.encode([RAW], Digest(hash_stored=False))))
    assert b"".join(reading(key).decode_file(path, "cold:vol", raw_bytes=len(RAW))) == RAW
    assert logged_age.read_text().splitlines() == ["-d", "-i", str(key), str(path)]


@pytest.fixture
def trickling_age(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An ``age`` first on the PATH whose output reaches its pipe 4 KiB at a time, slower
    than zbak reads it (``pv -L``), and which fails when the real one fails."""
    real = shutil.which("age")
    bin_dir = tmp_path / "trickle-bin"
    bin_dir.mkdir()
    (bin_dir / "age").write_text("#!/bin/bash\nset -o pipefail\n"
                                 f'{real} "$@" | pv -q -B 4096 -L 16m\n')
    (bin_dir / "age").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def test_plaintext_written_in_small_pieces_reaches_the_consumer_in_whole_pieces(
        volume, trickling_age):
    path, key = volume
    pieces = list(age.decrypt_file(shutil.which("age") or "age", path, key, "cold:vol"))
    assert len(pieces) > 2
    assert [len(p) for p in pieces[:-1]] == [age.PIECE] * (len(pieces) - 1)
    assert 0 < len(pieces[-1]) <= age.PIECE
    assert pieces[0].startswith(b"\x28\xb5\x2f\xfd")  # the zstd frame the volume seals
    assert b"".join(reading(key).decode_file(path, "cold:vol", raw_bytes=len(RAW))) == RAW


def test_a_damaged_chunk_inside_the_first_piece_is_a_corrupt_volume_not_a_refused_identity(
        volume, trickling_age):
    path, key = volume
    data = bytearray(path.read_bytes())
    data[150_000] ^= 1  # the third 64 KiB chunk: two chunks of plaintext come out first
    path.write_bytes(bytes(data))
    out: list[bytes] = []
    with pytest.raises(StreamCorrupt, match="does not decrypt"):
        out.extend(age.decrypt_file(shutil.which("age") or "age", path, key, "cold:vol"))
    assert out == []  # less than a whole piece came out: the consumer got none of it


def test_the_last_whole_piece_before_a_failing_chunk_never_reaches_the_consumer(tmp_path):
    path, key = sealed(tmp_path, os.urandom(4 * MIB))
    data = bytearray(path.read_bytes())
    damaged = len(data) - 1_000
    data[damaged] ^= 1
    path.write_bytes(bytes(data))
    # age-encryption.org/v1: the header ends with its "--- MAC" line, a 16-byte nonce follows,
    # then the payload in chunks of 64 KiB of plaintext plus a 16-byte tag each
    payload = data.index(b"\n", data.index(b"\n--- ") + 1) + 1 + 16
    authenticated = (damaged - payload) // (64 * 1024 + 16) * 64 * 1024
    assert authenticated >= 2 * age.PIECE
    out: list[bytes] = []
    with pytest.raises(StreamCorrupt, match="does not decrypt"):
        out.extend(age.decrypt_file(shutil.which("age") or "age", path, key, "cold:vol"))
    assert sum(map(len, out)) == (authenticated // age.PIECE - 1) * age.PIECE
