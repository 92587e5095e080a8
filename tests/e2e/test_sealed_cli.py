"""Sealed cold storage as the admin runs it (docs/sealed.md): ``zbak archive`` into a
``file://`` store with ``[stores.cold.age]`` (and once into moto's S3 server, with SSE-KMS
beside it), restores and audits with and without the identity, tampering, a lost catalog, a
killed upload, and Debian's ``age`` restoring a chain without zbak. Real zfs-fuse pools, the
real CLI, Debian's ``age``/``age-keygen`` and ``zstd``."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import blake3
import pyrage
import pytest
from support.cli import (
    ZBAK_TIMEOUT,
    Ran,
    Zbak,
    exit_status,
    gone,
    prop,
    restored_content,
    snapshots,
    start_zbak,
    tree_digest,
    zfs,
)

from zrepl_py.errors import ExitStatus

MiB = 1 << 20
MAGIC = b"age-encryption.org/v1\n"
NEEDS = "reading its volumes needs an identity"


def keygen(path: Path) -> str:
    """``age-keygen -o PATH``; return the public key (``age1...``)."""
    subprocess.run(["age-keygen", "-o", str(path)], check=True, capture_output=True)
    return subprocess.run(["age-keygen", "-y", str(path)], check=True, capture_output=True,
                          text=True).stdout.strip()


class Site:
    """A pool with dataset ``data``, a sealed ``file://`` store ``cold`` and two identities:
    ``key`` (a recipient of the store) and ``other`` (not one)."""

    def __init__(self, pool, tmp: Path, capsys, *, volume_size: str = "1MiB",
                 identity_in_config: bool = False, store_url: str | None = None,
                 store_keys: tuple[str, ...] = ()):
        self.pool, self.tmp = pool, tmp
        self.data = f"{pool.name}/data"
        zfs("create", self.data)
        self.mount = Path(prop(self.data, "mountpoint"))
        self.store = tmp / "store"
        self.store.mkdir(mode=0o700)
        store_url = store_url or f"file://{self.store}"
        self.key, self.other = tmp / "zbak.key", tmp / "other.key"
        self.recipient = keygen(self.key)
        keygen(self.other)
        identity = f'identity_file = "{self.key}"' if identity_in_config else ""
        self.config = tmp / "zbak.toml"
        store = [f'url = "{store_url}"', f'volume_size = "{volume_size}"', *store_keys]
        self.config.write_text(f'state_dir = "{tmp / "state"}"\n[stores.cold]\n'
                               + "\n".join(store) + textwrap.dedent(f"""
            [stores.cold.age]
            recipients = ["{self.recipient}"]
            {identity}
            [jobs.data]
            dataset = "{self.data}"
            [jobs.data.archive]
            store = "cold"
        """))
        self.run = Zbak(self.config, capsys)
        assert self.run("init", "--no-checks")[0] == ExitStatus.OK

    def snapshot(self, name: str, size: int = 3 * MiB) -> None:
        """Write a file of ``size`` random bytes and a marker text, then snapshot @name."""
        (self.mount / f"f{name}.bin").write_bytes(os.urandom(size))
        (self.mount / f"marker{name}.txt").write_text(f"PLAINTEXT-MARKER-{name}\n" * 1000)
        zfs("snapshot", f"{self.data}@{name}")

    def scratch(self) -> str:
        """Create dataset ``scratch`` and make it the config's ``[restore] scratch`` (where
        files of an archived snapshot are read from); return its name."""
        scratch = f"{self.pool.name}/scratch"
        zfs("create", scratch)
        with open(self.config, "a") as config:
            config.write(f'[restore]\nscratch = "{scratch}"\n')
        return scratch

    def archive(self) -> None:
        status, out, err = self.run("archive")
        assert status == ExitStatus.OK, out + err

    def volumes(self) -> list[Path]:
        return sorted(self.store.rglob("vol-*.zst"))

    def restore(self, to: str, into: str, *identity: str) -> tuple[ExitStatus, str, str]:
        return self.run("restore", self.data, "--to", f"@{to}", "--into",
                        f"{self.pool.name}/{into}", "--from", "cold", "--yes", *identity)


@pytest.fixture
def site(zpool, tmp_path, capsys):
    return Site(zpool, tmp_path, capsys)


def age_decrypt(key: Path, volume: Path | bytes) -> bytes:
    """Debian's ``age -d -i KEY`` of a volume file or of a volume's bytes (on stdin)."""
    path, stdin = (["-"], volume) if isinstance(volume, bytes) else ([str(volume)], None)
    return subprocess.run(["age", "-d", "-i", str(key), *path], input=stdin, check=True,
                          capture_output=True).stdout


def raw_hashes(key: Path, volume: Path | bytes) -> list[bytes]:
    """The hex SHA-256 and BLAKE3 of a sealed volume's raw bytes (``age -d | zstd -d``), as
    ASCII."""
    raw = subprocess.run(["zstd", "-d", "-c"], input=age_decrypt(key, volume), check=True,
                         capture_output=True).stdout
    return [hashlib.sha256(raw).hexdigest().encode(), blake3.blake3(raw).hexdigest().encode()]


def store_bytes(store: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file())


def test_a_sealed_chain_restores_with_the_identity_and_the_store_holds_no_plaintext_nor_its_hash(
        site):
    """Every volume is an age file (Debian's ``age`` opens it with the identity); no marker
    text, no raw hash (SHA-256, BLAKE3) of a volume and no manifest field of the raw stream is in the store;
    the chain restores with ``--identity``."""
    site.snapshot("1")
    site.snapshot("2")
    site.archive()
    volumes = site.volumes()
    assert len(volumes) >= 6
    everything = store_bytes(site.store)
    assert b"PLAINTEXT-MARKER" not in everything
    for volume in volumes:
        assert volume.read_bytes().startswith(MAGIC), volume
        assert not [h for h in raw_hashes(site.key, volume) if h in everything], volume
    manifests = [json.loads(p.read_bytes()) for p in site.store.rglob("manifest.json")]
    assert {m["format"] for m in manifests} == {"zbak-stream/2"}
    assert all(m["codec"] == ["zstd", "age"] for m in manifests)
    status, out, err = site.restore("2", "back", "--identity", str(site.key))
    assert status == ExitStatus.OK, out + err
    assert restored_content(f"{site.pool.name}/back") == tree_digest(site.mount)


def test_without_an_identity_restore_and_deep_audit_exit_2_while_the_plain_audit_runs(site):
    site.snapshot("1")
    site.archive()
    status, out, err = site.restore("1", "back")
    assert status == ExitStatus.USAGE, out + err
    assert "store cold is sealed" in err and NEEDS in err and "--identity FILE" in err
    assert len(err.strip().splitlines()) == 1, err
    assert gone(f"{site.pool.name}/back")
    missing = site.tmp / "missing.key"
    status, out, err = site.restore("1", "back", "--identity", str(missing))
    assert status == ExitStatus.USAGE, out + err
    assert f"cannot read the identity file {missing}" in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert gone(f"{site.pool.name}/back")
    status, out, err = site.run("audit", "--deep")
    assert status == ExitStatus.USAGE, out + err
    assert NEEDS in err and len(err.strip().splitlines()) == 1, err
    status, out, err = site.run("audit")
    assert status == ExitStatus.OK, out + err
    status, out, err = site.run("audit", "--deep", "--identity", str(site.key))
    assert status == ExitStatus.OK, out + err
    assert "1 verified" in out


def test_a_wrong_identity_fails_at_the_first_header_receives_nothing_and_marks_nothing_bad(
        site):
    site.snapshot("1")
    site.archive()
    status, out, err = site.restore("1", "back", "--identity", str(site.other))
    assert status == ExitStatus.USAGE, out + err
    assert "opens with none of the identities" in err and "nothing was received" in err
    assert len(err.strip().splitlines()) == 1, err
    assert gone(f"{site.pool.name}/back")
    status, out, err = site.run("audit", "--deep", "--identity", str(site.other))
    assert status == ExitStatus.USAGE, out + err
    status, out, err = site.run("list", "streams", "--json")
    assert status == ExitStatus.OK and {s["state"] for s in json.loads(out)} == {"uploaded"}
    status, out, err = site.restore("1", "back", "--identity", str(site.key))
    assert status == ExitStatus.OK, out + err


def test_after_a_recipient_is_added_the_next_archive_starts_a_chain_its_identity_restores(site):
    """docs/sealed.md#changing-the-recipients, as an admin replaces a retired key: removing
    recipient ``key`` keeps the chain (``third`` opens all of it); adding ``other`` later
    starts a new chain at once, saying why, and ``other`` alone restores the newest snapshot
    (before, the chain went on from a full ``other`` cannot open, and every later snapshot
    needed ``third`` as well); the old chain still restores with the keys it was sealed to,
    and a deep audit with ``other`` warns of it instead of failing."""
    third = site.tmp / "third.key"
    other = subprocess.run(["age-keygen", "-y", str(site.other)], check=True,
                           capture_output=True, text=True).stdout.strip()
    keys = {"key": site.recipient, "third": keygen(third), "other": other}
    listed = f'recipients = ["{site.recipient}"]'

    def recipients(*names: str) -> None:
        nonlocal listed
        now = "recipients = [" + ", ".join(f'"{keys[n]}"' for n in names) + "]"
        site.config.write_text(site.config.read_text().replace(listed, now))
        listed = now

    def archived() -> list[tuple[str, str]]:
        status, out, err = site.run("archive", "--json")
        assert status == ExitStatus.OK, out + err
        return [(row["stream"], row["reason"]) for row in json.loads(out)["rows"]]

    recipients("key", "third")
    site.snapshot("1")
    assert [s for s, _ in archived()] == ["full @1"]
    recipients("third")
    site.snapshot("2")
    assert [s for s, _ in archived()] == ["incremental -I @1 -> @2"]
    status, out, err = site.restore("2", "two", "--identity", str(third))
    assert status == ExitStatus.OK, out + err

    recipients("third", "other")
    assert archived() == [("full @2", f"recipient(s) {keys['other'][:16]}... added to the store"
                           " since stream 1 (@1) of the chain was sealed cannot open it: a new"
                           " chain restores with any one identity")]
    site.snapshot("3")
    assert [s for s, _ in archived()] == ["incremental -I @2 -> @3"]
    assert archived() == [("", "up to date: the chain ends at @3")]
    status, out, err = site.restore("3", "three", "--identity", str(site.other))
    assert status == ExitStatus.OK, out + err
    assert restored_content(f"{site.pool.name}/three") == tree_digest(site.mount)
    status, out, err = site.restore("1", "one", "--identity", str(site.other))
    assert status == ExitStatus.USAGE and "opens with none of the identities" in err, out + err
    sealed_to = ", ".join(f"{k[:16]}..." for k in sorted((keys["key"], keys["third"])))
    assert f"stream 1 (@1) was sealed to {sealed_to}; nothing was received" in err, err
    status, out, err = site.restore("1", "one", "--identity", str(site.key))
    assert status == ExitStatus.OK, out + err

    # A deep audit with the new key reads the new chain and warns of the old one, which it
    # cannot open (nothing marked bad); a key that opens every stream verifies all four.
    status, out, err = site.run("audit", "--deep", "--json", "--identity", str(site.other))
    assert status == ExitStatus.AUDIT_FINDINGS, out + err
    report = json.loads(out)
    assert [(f["severity"], f["level"]) for f in report["findings"]] == [("warning", "deep")]
    problem = report["findings"][0]["problem"]
    assert problem.startswith("2 sealed stream(s) in store cold open with none of the"
                              " identities given") and "(@1 of" in problem, problem
    status, out, err = site.run("list", "streams", "--json")
    assert {s["state"] for s in json.loads(out)} == {"uploaded", "verified"}, out
    status, out, err = site.run("audit", "--deep", "--identity", str(third))
    assert status == ExitStatus.OK and "4 verified" in out, out + err


def test_init_checks_the_recipients_and_the_identity_file_this_host_names(site):
    """``zbak init`` reads a sealed store's recipients file and this host's identity file as
    archive and restore would: one it cannot read, or an identity file holding a public key,
    fails the check with exit 2 naming the file; an identity matching none of the recipients
    passes with a warning (a restore host may keep a key of an older chain)."""
    listed = f'recipients = ["{site.recipient}"]'
    missing, public = site.tmp / "missing.txt", site.tmp / "public.txt"
    public.write_text(site.recipient + "\n")
    base = site.config.read_text()

    def init(age_keys: str) -> tuple[ExitStatus, dict[str, tuple[bool, str]], str]:
        site.config.write_text(base.replace(listed, age_keys))
        status, out, err = site.run("init", "--json")
        checks = {c["subject"]: (c["ok"], c["detail"]) for c in json.loads(out)["checks"]}
        return status, checks, err

    sealing = "store cold: sealing"
    status, checks, _ = init(f'recipients_file = "{missing}"')
    assert status == ExitStatus.USAGE and checks[sealing] == (
        False, f"stores.cold.age.recipients_file: cannot read {missing}: No such file or"
               " directory"), checks
    for identity, says in ((missing, f"cannot read the identity file {missing}"),
                           (public, f"identity file {public}: a line is not an age identity")):
        status, checks, _ = init(f'{listed}\nidentity_file = "{identity}"')
        assert status == ExitStatus.USAGE and not checks[sealing][0], checks
        assert says in checks[sealing][1], checks
    status, checks, err = init(f'{listed}\nidentity_file = "{site.other}"')
    assert status == ExitStatus.OK and checks[sealing][0], checks
    assert f"identity_file {site.other} holds the key of none of them" in checks[sealing][1]
    assert "holds the key of none of them" in err, err
    status, checks, err = init(f'{listed}\nidentity_file = "{site.key}"')
    assert status == ExitStatus.OK and checks[sealing] == (
        True, f"sealed (age) to 1 recipient(s); identity_file {site.key} holds the key of one"
              " of them"), checks
    assert "WARNING" not in err.upper(), err


def test_a_flipped_ciphertext_byte_is_refused_before_anything_is_received(site):
    site.snapshot("1")
    site.snapshot("2")
    site.archive()
    victim = site.volumes()[-1]  # in the incremental: the full must not be received either
    body = bytearray(victim.read_bytes())
    body[len(body) // 2] ^= 0x01
    victim.write_bytes(bytes(body))
    status, out, err = site.restore("2", "back", "--identity", str(site.key))
    assert status == ExitStatus.FAILED, out + err
    assert victim.name in err and "SHA-256" in err and "nothing was received" in err
    assert gone(f"{site.pool.name}/back")
    status, out, err = site.run("audit", "--deep", "--identity", str(site.key))
    assert status == ExitStatus.AUDIT_FINDINGS, out + err
    assert "marked bad" in out + err


def test_a_volume_replaced_by_another_validly_encrypted_to_the_same_recipient_is_refused(site):
    """age does not authenticate the writer: anyone with the public key writes valid
    volumes. The replacement below decrypts and decodes exactly as the original (same
    plaintext, same size); only the SHA-256 the catalog recorded tells it apart."""
    site.snapshot("1")
    site.archive()
    victim = site.volumes()[0]
    plain = age_decrypt(site.key, victim)
    # rage (pyrage) adds a "grease" stanza of random length to each header: encrypt until
    # the forgery has the original's size, so the size check cannot be what refuses it.
    recipient = pyrage.x25519.Recipient.from_str(site.recipient)
    forged = b""
    for _ in range(2000):
        forged = pyrage.encrypt(plain, [recipient])
        if len(forged) == victim.stat().st_size:
            break
    assert len(forged) == victim.stat().st_size and forged != victim.read_bytes()
    victim.write_bytes(forged)
    status, out, err = site.restore("1", "back", "--identity", str(site.key))
    assert status == ExitStatus.FAILED, out + err
    assert victim.name in err and "SHA-256" in err and "nothing was received" in err
    assert gone(f"{site.pool.name}/back")


def test_stock_age_and_zstd_restore_a_sealed_chain_without_zbak(site):
    """docs/sealed.md#the-emergency-path-without-zbak, stream after stream, full first."""
    site.snapshot("1")
    site.snapshot("2")
    site.archive()
    streams = sorted(p for p in (site.store / "local" / site.data).iterdir() if p.is_dir())
    assert len(streams) == 2 and "-full-" in streams[0].name
    into = f"{site.pool.name}/emergency"
    for stream in streams:
        script = (f'for v in "{stream}"/vol-*.zst; do age -d -i "{site.key}" "$v"; done'
                  f' | zstd -d | zfs receive -u "{into}"')
        subprocess.run(["bash", "-o", "pipefail", "-c", script], check=True, capture_output=True,
                       timeout=300)
    assert snapshots(into) == ["1", "2"]
    assert restored_content(into) == tree_digest(site.mount)


def test_a_lost_catalog_is_rebuilt_without_an_identity_then_restores_with_one(site):
    site.snapshot("1")
    site.snapshot("2")
    site.archive()
    (site.tmp / "state" / "catalog.sqlite").unlink()
    assert site.run("init", "--no-checks")[0] == ExitStatus.OK
    status, out, err = site.run("catalog", "rebuild", "cold")
    assert status == ExitStatus.OK, out + err
    catalog = sqlite3.connect(site.tmp / "state" / "catalog.sqlite")
    try:
        chains = {row[0] for row in catalog.execute("select compression from streams")}
    finally:
        catalog.close()
    assert chains == {"zstd+age"}
    status, out, err = site.restore("2", "back", "--identity", str(site.key))
    assert status == ExitStatus.OK, out + err
    assert restored_content(f"{site.pool.name}/back") == tree_digest(site.mount)


def test_an_encrypted_upload_killed_mid_stream_resumes_from_the_hosts_record(zpool, tmp_path,
                                                                              capsys):
    """kill -9 in the middle of a 64 MiB sealed stream: its progress record is on this host
    (the store holds no progress.json and no raw hash), the rerun skips the stored volumes
    and converges, and the chain restores."""
    site = Site(zpool, tmp_path, capsys, volume_size="4MiB", identity_in_config=True)
    site.snapshot("big", 64 * MiB)
    records = tmp_path / "state" / "progress" / "cold"
    env = dict(os.environ, ZBAK_LOG_LEVEL="WARNING")
    proc = subprocess.Popen([sys.executable, "-m", "zrepl_py", "--config", str(site.config),
                             "archive"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    record = None
    while time.monotonic() < deadline and proc.poll() is None:
        found = list(records.rglob("progress.json"))
        if found:
            try:
                if len(json.loads(found[0].read_bytes())["volumes"]) >= 3:
                    record = found[0]
                    break
            except ValueError:
                pass  # replaced while read
        time.sleep(0.02)
    assert record is not None, "the archive finished before it could be interrupted"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not list(site.store.rglob("manifest.json"))
    assert not list(site.store.rglob("progress.json"))
    recorded = [v["raw_blake3"].encode() for v in json.loads(record.read_bytes())["volumes"]]
    assert not [h for h in recorded if h in store_bytes(site.store)]
    before = {p: p.stat().st_mtime_ns for p in site.volumes()}
    status, out, err = site.run("archive", "--json")
    assert status == ExitStatus.OK, out + err
    row = json.loads(out)["rows"][0]
    assert "resumed" in row["volumes"], row
    assert len([p for p, t in before.items() if p.stat().st_mtime_ns == t]) >= 3
    assert not list(records.rglob("progress.json"))
    assert not [h for h in recorded if h in store_bytes(site.store)]
    status, out, err = site.restore("big", "back")  # identity_file in the config
    assert status == ExitStatus.OK, out + err
    assert restored_content(f"{site.pool.name}/back") == tree_digest(site.mount)


KMS_KEY = "arn:aws:kms:us-east-1:123456789012:key/0b5d3e00-zbak-sealed"


@pytest.mark.s3
def test_a_sealed_chain_in_s3_with_sse_kms_restores_with_the_identity_and_the_bucket_holds_no_plaintext(
        zpool, tmp_path, capsys, s3_server, s3_bucket):
    """The same on moto's S3 server, with server-side encryption as well: every object is
    written with the KMS key (head_object), every volume is an age file, no marker text and
    no raw hash is in the bucket, and the restore (downloaded, checked in the spool)
    needs the identity."""
    site = Site(zpool, tmp_path, capsys, store_url=f"s3://{s3_bucket}/zbak",
                store_keys=(f'endpoint = "{s3_server.endpoint_url}"',
                            f'region = "{s3_server.region}"',
                            f'encryption = {{ sse = "aws:kms", kms_key_id = "{KMS_KEY}" }}'))
    site.snapshot("1")
    site.snapshot("2")
    site.archive()
    client = s3_server.client()
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket)["Contents"]]
    objects = {k: client.get_object(Bucket=s3_bucket, Key=k)["Body"].read() for k in keys}
    volumes = [k for k in keys if k.rsplit("/", 1)[-1].startswith("vol-")]
    assert len(volumes) >= 6
    everything = b"".join(objects.values())
    assert b"PLAINTEXT-MARKER" not in everything
    for key in volumes:
        assert objects[key].startswith(MAGIC), key
        assert not [h for h in raw_hashes(site.key, objects[key]) if h in everything], key
    for key in keys:
        head = client.head_object(Bucket=s3_bucket, Key=key)
        assert (head.get("ServerSideEncryption"), head.get("SSEKMSKeyId")) == (
            "aws:kms", KMS_KEY), key
    status, out, err = site.restore("2", "back")
    assert status == ExitStatus.USAGE and NEEDS in err, out + err
    status, out, err = site.restore("2", "back", "--identity", str(site.key))
    assert status == ExitStatus.OK, out + err
    assert restored_content(f"{site.pool.name}/back") == tree_digest(site.mount)


def test_files_of_a_sealed_archive_come_back_with_the_identity_only(site):
    """``zbak restore --path`` from a sealed store (docs/files.md's archive path: the chain
    received into the scratch dataset) takes ``--identity`` like a dataset restore."""
    site.snapshot("1")
    site.archive()
    site.scratch()
    out = site.tmp / "out"
    argv = ("restore", site.data, "--to", "@1", "--path", "marker1.txt", "--into-dir", str(out),
            "--from", "cold", "--yes")
    status, stdout, err = site.run(*argv)
    assert status == ExitStatus.USAGE, stdout + err
    assert NEEDS in err and len(err.strip().splitlines()) == 1, err
    status, stdout, err = site.run(*argv, "--identity", str(site.key))
    assert status == ExitStatus.OK, stdout + err
    assert (out / "marker1.txt").read_bytes() == (site.mount / "marker1.txt").read_bytes()


def on_terminal(config: Path, *args: str, typed: str = "n\n") -> Ran:
    """``zbak --config CONFIG ARGS`` as a process whose standard input is a terminal (a
    pty) on which the admin has already typed ``typed``."""
    master, slave = os.openpty()
    try:
        os.write(master, typed.encode())
        proc = start_zbak("--config", str(config), *args, stdin=slave)
    finally:
        os.close(slave)
    try:
        out, err = proc.communicate(timeout=ZBAK_TIMEOUT)
    finally:
        os.close(master)
    return Ran(exit_status(proc.returncode), out.decode(), err.decode())


def test_an_unusable_identity_is_refused_before_the_restore_asks_to_go_on(site):
    """On a terminal ``zbak restore`` shows its plan and asks before it restores; an identity
    that cannot open the sealed store (none, a missing file, the public key given as the
    identity, a FIFO) is refused with its one line and exit 2 before that question (the admin is
    never asked to go on with a restore that cannot read a volume), for a dataset and for
    files (``--path``); nothing is created."""
    site.snapshot("1")
    site.archive()
    scratch = site.scratch()
    missing, public, fifo = (site.tmp / n for n in ("missing.key", "public.txt", "fifo.key"))
    public.write_text(f"# the store's recipient, not its identity\n{site.recipient}\n")
    os.mkfifo(fifo)  # read as a file, a pipe with no writer would block the restore for ever
    out = site.tmp / "out"
    identities = [((), NEEDS),
                  (("--identity", str(missing)), f"cannot read the identity file {missing}"),
                  (("--identity", str(public)), f"identity file {public}: a line is not an age"
                                                " identity"),
                  (("--identity", str(fifo)), f"cannot read the identity file {fifo}: not a"
                                              " regular file")]
    for what in (("--into", f"{site.pool.name}/back"),
                 ("--path", "marker1.txt", "--into-dir", str(out))):
        for identity, says in identities:
            status, stdout, err = on_terminal(site.config, "restore", site.data, "--to", "@1",
                                              "--from", "cold", *what, *identity)
            assert status == ExitStatus.USAGE, stdout + err
            assert says in err and len(err.strip().splitlines()) == 1, err
            assert "Restore now?" not in stdout, stdout
    assert gone(f"{site.pool.name}/back") and not out.exists()
    assert zfs("list", "-H", "-o", "name", "-r", scratch).split() == [scratch]
    shared = site.tmp / "shared.key"  # an identity every user may read: used, with a warning
    shared.write_bytes(site.key.read_bytes())
    shared.chmod(0o644)
    status, stdout, err = on_terminal(site.config, "restore", site.data, "--to", "@1", "--from",
                                      "cold", "--into", f"{site.pool.name}/back", "--identity",
                                      str(shared), typed="y\n")
    assert status == ExitStatus.OK, stdout + err
    assert "Restore now?" in stdout, stdout
    assert f"identity file {shared} is readable by every user (mode 0644)" in err, err
    assert restored_content(f"{site.pool.name}/back") == tree_digest(site.mount)


def test_a_drill_skips_a_sealed_store_without_an_identity_and_drills_it_with_one(site):
    """``zbak drill`` of a sealed store: with no identity at hand the store is skipped (a
    recorded ``skipped`` with the reason, exit 0, no scratch made), never a failed drill nor a
    usage error mid-run; with ``--identity`` the chain is received and every file compared."""
    site.snapshot("1")
    site.archive()
    scratch = f"{site.pool.name}/scratch"
    zfs("create", scratch)
    with open(site.config, "a") as config:
        config.write(f'[restore]\nscratch = "{scratch}"\n[jobs.data.drill]\n')
    status, out, err = site.run("drill", "--json")
    assert status == ExitStatus.OK, out + err
    (row,) = json.loads(out)["drills"]
    assert row["result"] == "skipped", row
    assert "no identity" in row["detail"] and "store cold" in row["detail"], row
    assert zfs("list", "-H", "-o", "name", "-r", scratch).split() == [scratch]
    status, out, err = site.run("drill", "--json", "--identity", str(site.key))
    assert status == ExitStatus.OK, out + err
    (row,) = json.loads(out)["drills"]
    assert row["result"] == "ok" and row["snapshot"] == "1", row
    assert row["files"] == 2, row
