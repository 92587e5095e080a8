"""docs/reliability.md#r38-encrypted-datasets, the archive path, end to end on real OpenZFS 2.3: an
encrypted dataset is archived raw (``zfs send -w``), so the store holds no plaintext; it restores as
an encrypted dataset whose key is not loaded; ``zbak audit --deep`` walks the raw streams clean.
Into a sealed store (docs/sealed.md#encrypted-datasets), the raw stream is age-encrypted on top
and restores with both keys: the age identity, then the dataset's own.

zbak runs on this host; the job's dataset is ``vm:SRC/data`` in the QEMU guest of
tests/support/openzfs.py and the store a ``file://`` directory here, so every stream is
``ssh guest zfs send -w ...`` read by zbak. The dataset is created with
``keyformat=passphrase keylocation=prompt`` and the passphrase on stdin, as a user would.
Expected values are read in the guest with plain ``zfs get``/``zfs list``/``cat``.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest
import zstandard
from support.cli import run_zbak
from support.common import hosts_table
from support.openzfs import COMMAND_TIMEOUT

from zrepl_py.errors import ExitStatus

PASSPHRASE = b"zbak raw archive passphrase 38"
MARKER = b"zbak-r38-plaintext-marker "
"""Written many times into a file of the encrypted dataset (compression off): any stream
carrying the file decrypted holds it verbatim."""


class Rig:
    """An encrypted ``SRC/data`` in the guest, a ``file://`` store here, a config archiving
    ``vm:SRC/data`` to it."""

    def __init__(self, vm, executor, pools, tmp_path, capsys, store_extra: str = ""):
        self.executor, self.capsys = executor, capsys
        self.data = f"{pools.source}/data"
        self.target_pool = pools.target
        self.store = tmp_path / "store"
        self.store.mkdir()
        self.config = tmp_path / "zbak.toml"
        self.config.write_text(
            f'state_dir = "{tmp_path / "state"}"\n'
            + hosts_table("vm", vm.host_config(), connect_timeout=30)
            + textwrap.dedent(f"""\
            [stores.cold]
            url = "file://{self.store}"
            volume_size = "1MiB"
            {store_extra}
            [jobs.j]
            dataset = "vm:{self.data}"
            [jobs.j.archive]
            store = "cold"
        """))

    def __call__(self, *args: str) -> tuple[int, str, str]:
        """Run ``zbak --config CONFIG ARGS`` (a process); return (status, stdout, stderr)."""
        return run_zbak("--config", str(self.config), *args)

    def guest(self, *argv: str, input: bytes | None = None) -> str:
        """Run argv in the guest (must succeed); return its stdout."""
        return self.executor.run(list(argv), input=input, check=True,
                                 timeout=COMMAND_TIMEOUT).text  # fmt: skip

    def prop(self, name: str, prop: str) -> str:
        return self.guest("zfs", "get", "-H", "-o", "value", prop, name).strip()

    def snapshots(self, dataset: str) -> dict[str, int]:
        """``{short name: guid}`` of the dataset's snapshots."""
        text = self.guest("zfs", "get", "-Hp", "-d", "1", "-t", "snapshot", "-o", "name,value",
                          "guid", dataset)  # fmt: skip
        return {line.split("\t")[0].split("@", 1)[1]: int(line.split("\t")[1])
                for line in text.splitlines()}  # fmt: skip

    def write(self, name: str, content: bytes) -> None:
        self.guest("dd", f"of=/{self.data}/{name}", "status=none", input=content)

    def archive(self) -> list[dict]:
        """``zbak archive --json`` must succeed; return its rows."""
        status, out, err = self("archive", "--json")
        assert status == ExitStatus.OK, out + err
        return json.loads(out)["rows"]

    def manifests(self) -> list[dict]:
        """Every stream manifest in the store, oldest stream first."""
        return [json.loads(p.read_text())
                for p in sorted(self.store.rglob("manifest.json"), key=lambda p: p.parent.name)]

    def stored_stream_bytes(self) -> bytes:
        """All volumes of the store, decompressed and concatenated."""
        out = b""
        for volume in sorted(self.store.rglob("vol-*.zst")):
            out += zstandard.ZstdDecompressor().decompressobj().decompress(volume.read_bytes())
        return out


def _prepared(r: Rig) -> Rig:
    """Create the encrypted ``SRC/data`` and run ``zbak init``."""
    # keylocation=prompt: zfs create reads the passphrase from stdin (not a terminal: once).
    # pbkdf2iters: the minimum (zfsprops(7)); the default costs ~4 s of emulated CPU per use.
    r.guest("zfs", "create", "-o", "encryption=on", "-o", "keyformat=passphrase",
            "-o", "keylocation=prompt", "-o", "pbkdf2iters=100000", "-o", "compression=off",
            r.data, input=PASSPHRASE + b"\n")  # fmt: skip
    assert r("init", "--no-checks")[0] == ExitStatus.OK
    return r


@pytest.fixture
def rig(openzfs_vm, openzfs_executor, openzfs_pools, tmp_path, capsys):
    return _prepared(Rig(openzfs_vm, openzfs_executor, openzfs_pools, tmp_path, capsys))


def test_an_encrypted_dataset_is_archived_raw_restores_locked_and_audits_deep_clean(rig):
    """docs/reliability.md#r38-encrypted-datasets."""
    secret = MARKER * 8000  # ~300 KB
    rig.write("secret.txt", secret)
    rig.guest("zfs", "snapshot", f"{rig.data}@s1")

    assert [r["stream"] for r in rig.archive()] == ["full @s1"]
    stored = rig.stored_stream_bytes()
    assert len(stored) > len(secret)  # the file's blocks are in the stream ...
    assert MARKER not in stored and PASSPHRASE not in stored  # ... encrypted, keyless
    (full,) = rig.manifests()
    assert full["raw"] is True and full["send_flags"] == ["-w"]

    # restore: the new dataset is encrypted, its key unloaded, and holds @s1's guid
    into = f"{rig.target_pool}/restored1"
    status, out, err = rig("restore", f"vm:{rig.data}", "--to", "@s1", "--into", into,
                           "--from", "cold", "--yes")  # fmt: skip
    assert status == ExitStatus.OK, out + err
    assert f"zfs load-key {into}" in err
    assert rig.prop(into, "encryption") == "aes-256-gcm"
    assert rig.prop(into, "keystatus") == "unavailable"
    assert rig.snapshots(into) == {"s1": rig.snapshots(rig.data)["s1"]}
    rig.guest("zfs", "load-key", into, input=PASSPHRASE + b"\n")
    rig.guest("zfs", "mount", into)
    mountpoint = rig.prop(into, "mountpoint")
    assert rig.guest("cat", f"{mountpoint}/secret.txt").encode() == secret

    # an incremental -I stream, raw too; restoring the middle snapshot trims @s3 and rolls
    # back the new dataset while its key is not loaded
    rig.write("more.txt", MARKER * 100)
    rig.guest("zfs", "snapshot", f"{rig.data}@s2")
    rig.write("last.txt", b"last\n")
    rig.guest("zfs", "snapshot", f"{rig.data}@s3")
    assert [r["stream"] for r in rig.archive()] == ["incremental -I @s1 -> @s3"]
    incremental = rig.manifests()[-1]
    assert incremental["raw"] is True and incremental["send_flags"] == ["-w", "-I"]
    assert MARKER not in rig.stored_stream_bytes()

    into2 = f"{rig.target_pool}/restored2"
    status, out, err = rig("restore", f"vm:{rig.data}", "--to", "@s2", "--into", into2,
                           "--from", "cold", "--yes")  # fmt: skip
    assert status == ExitStatus.OK, out + err
    source = rig.snapshots(rig.data)
    assert rig.snapshots(into2) == {"s1": source["s1"], "s2": source["s2"]}
    assert rig.prop(into2, "keystatus") == "unavailable"
    rig.guest("zfs", "load-key", into2, input=PASSPHRASE + b"\n")
    rig.guest("zfs", "mount", into2)
    files = rig.guest("ls", rig.prop(into2, "mountpoint")).split()
    assert files == ["more.txt", "secret.txt"]  # @s2: last.txt came with @s3 only

    status, out, err = rig("audit", "--deep", "--json")
    assert status == ExitStatus.OK, out + err
    doc = json.loads(out)
    assert doc["findings"] == []
    assert len(doc["jobs"][0]["verified"]) == 2


def test_an_encrypted_dataset_whose_chain_was_archived_decrypted_starts_a_raw_chain(rig):
    """docs/reliability.md#r38-encrypted-datasets: a chain written before raw archiving (its tip's
    manifest has no -w) is not continued with a raw incremental, which zfs receive could not apply
    on it."""
    rig.write("secret.txt", MARKER * 100)
    rig.guest("zfs", "snapshot", f"{rig.data}@s1")
    assert [r["stream"] for r in rig.archive()] == ["full @s1"]
    # make the tip look like an old zbak wrote it: plain flags, no raw or sha256 fields
    (path,) = rig.store.rglob("manifest.json")
    for manifest in (path, Path(f"{path}.copy")):
        old = json.loads(manifest.read_text())
        old["send_flags"] = []
        del old["raw"], old["sha256"]
        manifest.write_text(json.dumps(old))
    rig.guest("zfs", "snapshot", f"{rig.data}@s2")

    (row,) = rig.archive()
    assert row["stream"] == "full @s2", row
    assert "archived decrypted" in row["reason"]
    assert rig.manifests()[-1]["raw"] is True


def test_restoring_an_encrypted_dataset_from_its_own_snapshots_sends_raw_never_decrypted(rig):
    """docs/reliability.md#r38-encrypted-datasets: ``--from local`` copies an encrypted dataset raw,
    like replication."""
    rig.write("secret.txt", MARKER * 100)
    rig.guest("zfs", "snapshot", f"{rig.data}@s1")
    into = f"{rig.target_pool}/copy"
    status, out, err = rig("--debug", "restore", f"vm:{rig.data}", "--to", "@s1", "--into", into,
                           "--from", "local", "--yes")  # fmt: skip
    assert status == ExitStatus.OK, out + err
    assert f"zfs send -w {rig.data}@s1" in err  # the pipeline's argv, logged at DEBUG
    assert rig.prop(into, "encryption") == "aes-256-gcm"  # a decrypted copy would be "off"
    assert rig.prop(into, "keystatus") == "unavailable"
    assert rig.snapshots(into) == rig.snapshots(rig.data)


def _age_identity(path: Path) -> str:
    """``age-keygen -o PATH``; return its public key."""
    subprocess.run(["age-keygen", "-o", str(path)], check=True, capture_output=True)
    return subprocess.run(["age-keygen", "-y", str(path)], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def sealed_rig(openzfs_vm, openzfs_executor, openzfs_pools, tmp_path, capsys):
    """The rig with ``[stores.cold.age]`` to the key in ``tmp_path/age.key``; (rig, key)."""
    key = tmp_path / "age.key"
    table = f'[stores.cold.age]\n            recipients = ["{_age_identity(key)}"]'
    return _prepared(Rig(openzfs_vm, openzfs_executor, openzfs_pools, tmp_path, capsys,
                         table)), key


def test_an_encrypted_dataset_is_sent_raw_into_a_sealed_store_and_needs_both_keys(sealed_rig):
    """docs/sealed.md#encrypted-datasets: the raw stream, age-encrypted on top; restored with
    the age identity, it arrives locked (the dataset's key is still needed)."""
    rig, key = sealed_rig
    rig.write("secret.txt", MARKER * 100)
    rig.guest("zfs", "snapshot", f"{rig.data}@s1")
    assert [r["stream"] for r in rig.archive()] == ["full @s1"]
    (full,) = rig.manifests()
    assert full["raw"] is True and full["send_flags"] == ["-w"]
    assert full["codec"] == ["zstd", "age"]
    volumes = sorted(rig.store.rglob("vol-*.zst"))
    assert volumes and all(v.read_bytes().startswith(b"age-encryption.org/v1\n")
                           for v in volumes)
    into = f"{rig.target_pool}/sealed"
    status, out, err = rig("restore", f"vm:{rig.data}", "--to", "@s1", "--into", into,
                           "--from", "cold", "--yes", "--identity", str(key))  # fmt: skip
    assert status == ExitStatus.OK, out + err
    assert rig.prop(into, "encryption") == "aes-256-gcm"
    assert rig.prop(into, "keystatus") == "unavailable"
    assert rig.snapshots(into) == {"s1": rig.snapshots(rig.data)["s1"]}
