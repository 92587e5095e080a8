"""The ``sftp://`` store against the real sshd with an SFTP-only, chrooted user
(``support.sftpd``: ``internal-sftp``, no shell, no forwarding), beyond the store contract
every scheme passes (``tests/integration/test_store_contract.py``): what the server allows,
the temporary files, the write path's checks, lost connections, and the channel limit
(docs/decisions.md#sftp-store).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pwd
import random
import subprocess
import threading
import time
from pathlib import Path

import paramiko
import pytest
from support.cli import Zbak
from support.common import hosts_table

from zrepl_py.errors import ExitStatus, HostKeyUnknown, ObjectNotFound, StorePermanent
from zrepl_py.proc.ssh import SSHExecutor
from zrepl_py.proc.sshconn import SshConnection
from zrepl_py.stores import sftp_session
from zrepl_py.stores.retry import RetryPolicy
from zrepl_py.stores.sftp import SftpBackend

MiB = 1 << 20
PART = 1 * MiB
FAST = RetryPolicy(attempts=3, initial_wait=0.01, max_wait=0.02)


def payload(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


def chunked(data: bytes, step: int = 256 * 1024 + 3):
    for start in range(0, len(data), step):
        yield data[start:start + step]


def read_all(store, key: str, chunk_size: int = MiB) -> bytes:
    return b"".join(store.get(key, chunk_size=chunk_size))


@pytest.fixture
def connection(sftpd, tmp_path):
    conn = SshConnection("box", sftpd.host_config(), known_hosts_default=tmp_path / "kh")
    yield conn
    conn.close()


@pytest.fixture
def store(connection, sftp_dir):
    """A store with 1 MiB parts written two at a time, and quick retries."""
    backend = SftpBackend("box", connection, sftp_dir, part_size=PART, concurrency=2,
                          retry=FAST)
    yield backend
    backend.close()


@pytest.fixture
def local(sftpd, sftp_dir) -> Path:
    """The store's directory as this machine sees it (inside the chroot)."""
    return sftpd.local(sftp_dir)


def test_the_sftp_user_gets_no_shell_no_command_and_no_forwarding(sftpd, tmp_path):
    """The test bed is the server a storage box offers: an exec request does not run the
    command (sshd answers ``This service allows sftp connections only.`` and exit status 1),
    and a TCP forwarding is refused; SFTP works."""
    marker = sftpd.local("/home/made-by-a-command")
    with SSHExecutor("box", sftpd.host_config(),
                     known_hosts_default=tmp_path / "kh") as executor:
        done = executor.run(["sh", "-c", f"echo shell-ran; : > {marker}"], check=False)
        assert done.returncode == 1 and b"shell-ran" not in done.stdout
        assert b"allows sftp connections only" in done.stdout + done.stderr
        assert not marker.exists()
        transport = executor.connection.transport()
        with pytest.raises(paramiko.ChannelException):
            transport.open_channel("direct-tcpip", ("127.0.0.1", sftpd.ssh.port),
                                   ("127.0.0.1", 0))
        sftp = paramiko.SFTPClient.from_transport(transport)
        assert sftp.normalize(".") == "/"  # the chroot
        sftp.close()


def test_a_put_writes_a_hidden_temporary_file_and_the_key_appears_whole_mode_0600(
        store, local):
    """While the put runs, the key still holds the earlier object and the bytes go to
    ``.NAME.partial-XXXXXXXX`` beside it; once it returns, the key holds the new object,
    owned by the SFTP user, mode 0600, and no temporary file is left."""
    store.put("d/obj", [b"earlier object"])
    seen = {}

    def source():
        yield from chunked(payload(3 * PART + 5))
        seen["names"] = sorted(os.listdir(local / "d"))
        seen["during"] = read_all(store, "d/obj")

    result = store.put("d/obj", source())
    assert seen["during"] == b"earlier object"
    (temporary,) = [n for n in seen["names"] if n != "obj"]
    assert temporary.startswith(".obj.partial-") and len(temporary) == len(".obj.partial-") + 8
    assert sorted(os.listdir(local / "d")) == ["obj"]
    st = os.stat(local / "d" / "obj")
    assert (st.st_mode & 0o777, st.st_uid) == (0o600, pwd.getpwnam("zbak-sftp").pw_uid)
    assert st.st_size == result.size == 3 * PART + 5
    assert read_all(store, "d/obj") == payload(3 * PART + 5)


def test_a_put_removes_what_an_interrupted_put_of_the_same_key_left_and_nothing_else(
        store, local):
    """As ``file://`` (docs/decisions.md#leftover-uploads-of-interrupted-archives), by the
    server's clock: a temporary file of the same key last written before this put created
    its own goes; one written later (a put running elsewhere), and one of another key, stay."""
    store.put("d/obj", [b"first"])
    an_hour_ago, in_an_hour = time.time() - 3600, time.time() + 3600
    for name, when in ((".obj.partial-killed12", an_hour_ago),
                       (".obj.partial-running1", in_an_hour),
                       (".other.partial-killed12", an_hour_ago)):
        (local / "d" / name).write_bytes(b"half a volume")
        os.utime(local / "d" / name, (when, when))
    store.put("d/obj", [b"second"])
    assert sorted(os.listdir(local / "d")) == [".obj.partial-running1",
                                               ".other.partial-killed12", "obj"]
    assert read_all(store, "d/obj") == b"second"


def test_unfinished_uploads_are_the_temporary_files_and_only_old_ones_are_aborted(
        store, local):
    """docs/reliability.md#r15-multipart-edge-cases (sftp): each temporary file is reported
    under the key it was for, with its size and time; ``abort_stale_uploads`` removes those
    older than the age and never an object."""
    store.put("d/e/kept", [b"object"])
    (local / "d" / ".vol.partial-abc12345").write_bytes(b"x" * 1234)
    (local / "d" / "e" / ".vol.partial-def12345").write_bytes(b"y" * 10)
    (local / ".top.partial-ghi12345").write_bytes(b"z")
    two_days_ago = time.time() - 2 * 86400
    os.utime(local / "d" / ".vol.partial-abc12345", (two_days_ago, two_days_ago))
    found = store.unfinished_uploads()
    assert [(u.key, u.ident, u.size) for u in found] == [
        ("d/e/vol", ".vol.partial-def12345", 10), ("d/vol", ".vol.partial-abc12345", 1234),
        ("top", ".top.partial-ghi12345", 1)]
    assert [u.key for u in store.unfinished_uploads("d/e")] == ["d/e/vol"]
    assert found[1].since.timestamp() == int(two_days_ago)
    assert store.abort_stale_uploads(86400) == ["d/vol (temporary file .vol.partial-abc12345)"]
    assert not store.abort_upload(found[1])
    assert [u.key for u in store.unfinished_uploads()] == ["d/e/vol", "top"]
    with pytest.raises(StorePermanent, match="not a temporary file"):
        store.abort_upload(found[0]._replace(ident="kept"))
    assert read_all(store, "d/e/kept") == b"object"


def test_a_key_clashing_with_a_directory_is_a_permanent_error_not_a_missing_object(store):
    """As ``file://``: a directory is no object (stat and get say it is missing) and a put
    over it fails without touching what is below it."""
    store.put("a/b", [b"x"])
    with pytest.raises(StorePermanent):
        store.put("a", [b"y"])
    for call in (store.stat, store.get):
        with pytest.raises(ObjectNotFound):
            call("a")
    assert read_all(store, "a/b") == b"x"


def test_without_posix_rename_and_fsync_a_put_still_replaces_the_object(
        store, local, monkeypatch):
    """A server without ``posix-rename@openssh.com`` has only SFTP's own rename, which
    refuses an existing target: the earlier object is removed first. Without
    ``fsync@openssh.com`` the put does not ask for it. (The extensions are hidden from the
    client; the server is the real one.)"""
    advertised = sftp_session.Session._send_version

    def without(self):
        version = advertised(self)
        for name in (sftp_session.POSIX_RENAME, sftp_session.FSYNC):
            self.extensions.pop(name)
        return version

    monkeypatch.setattr(sftp_session.Session, "_send_version", without)
    monkeypatch.setattr(sftp_session.Session, "fsync", None)  # a call would fail loudly
    store.put("k", [b"old"])
    store.put("k", chunked(payload(2 * PART + 1)))
    assert read_all(store, "k") == payload(2 * PART + 1)
    assert os.listdir(local) == ["k"]
    assert "posix-rename no, fsync no" in store.probe()


@pytest.fixture
def tiny_disk(local, sftp_dir):
    """A directory of the store on a 1 MiB file system (tmpfs, in the test session's mount
    namespace): the server fails every write beyond it."""
    disk = local / "full"
    disk.mkdir()
    user = pwd.getpwnam("zbak-sftp")
    subprocess.run(["mount", "-t", "tmpfs", "-o",
                    f"size=1m,mode=0700,uid={user.pw_uid},gid={user.pw_gid}", "tmpfs", str(disk)],
                   check=True, capture_output=True)
    yield disk
    subprocess.run(["umount", str(disk)], check=True, capture_output=True)


def test_a_write_the_server_fails_fails_the_put_and_leaves_nothing(store, tiny_disk):
    """A full disk answers a write with ``SSH_FX_FAILURE``: the put fails naming the server's
    answer, no object appears and the temporary file is removed. (paramiko's own pipelined
    file drops the status of such a write and its ``close`` ignores errors.)"""
    with pytest.raises(StorePermanent, match="SSH_FX_FAILURE"):
        store.put("full/vol", chunked(payload(3 * PART)))
    assert os.listdir(tiny_disk) == []
    assert list(store.list()) == []


def test_a_connection_lost_mid_put_and_mid_get_is_dialled_again_and_both_complete(
        store, connection, local, monkeypatch):
    """The connection is closed under the put (after its first parts) and under the get
    (after its first window): each part and window is tried again on a new connection, the
    object is whole and its SHA-256 the one the put reports."""
    data = payload(12 * PART + 77, seed=9)
    first = connection.transport()

    def source():
        for number, chunk in enumerate(chunked(data, PART)):
            if number == 4:
                connection.close()
            yield chunk

    result = store.put("k", source())
    second = connection.transport()
    assert second is not first
    assert result.sha256 == hashlib.sha256(data).hexdigest()
    assert (local / "k").read_bytes() == data and os.listdir(local) == ["k"]

    monkeypatch.setattr("zrepl_py.stores.sftp.READ_WINDOW", 2 * PART)
    chunks = []
    for chunk in store.get("k", chunk_size=PART // 2):
        chunks.append(chunk)
        if len(chunks) == 2:
            connection.close()
    assert b"".join(chunks) == data
    assert connection.transport() is not second


def test_an_object_replaced_while_it_is_read_is_not_spliced_in(store, monkeypatch):
    monkeypatch.setattr("zrepl_py.stores.sftp.READ_WINDOW", PART)
    store.put("k", [payload(3 * PART)])
    reading = store.get("k", chunk_size=PART)
    assert next(reading) == payload(3 * PART)[:PART]
    store.put("k", [payload(3 * PART, seed=1)])  # same size: the time tells them apart
    with pytest.raises(StorePermanent, match="replaced or removed while it was read"):
        next(reading)


def test_more_channels_than_the_server_allows_are_waited_for_not_failed(store, monkeypatch):
    """sshd allows 10 sessions per connection (sshd_config(5) ``MaxSessions``): with all 10
    taken, the 11th is refused by the server; the store then uses the ten it has, and a
    caller waits for one of them."""
    store.put("k", [b"object"])
    monkeypatch.setattr(store._sessions, "_limit", 16)
    found = []
    waiting = threading.Thread(target=lambda: found.append(store.stat("k").size))
    with contextlib.ExitStack() as taken:
        for _ in range(10):
            taken.enter_context(store._sessions.session())
        waiting.start()
        deadline = time.monotonic() + 60
        while store._sessions._limit == 16 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store._sessions._limit == 10 and found == []
    waiting.join(60)
    assert found == [6]


def test_an_unknown_host_key_is_a_permanent_error_and_nothing_is_sent(sftpd, sftp_dir,
                                                                       tmp_path, local):
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    connection = SshConnection("box", sftpd.host_config(known_hosts=empty),
                               known_hosts_default=empty)
    backend = SftpBackend("box", connection, f"{sftp_dir}/new", retry=FAST)
    with pytest.raises(StorePermanent, match="is not in") as caught:
        backend.probe()
    assert isinstance(caught.value.__cause__, HostKeyUnknown)
    assert not (local / "new").exists()
    backend.close()


def test_zbak_init_refuses_an_sftp_server_whose_host_key_changed_and_creates_nothing(
        sftpd, sftp_dir, tmp_path, local, capsys):
    """docs/reliability.md#r35-ssh-host-keys on an ``sftp://`` store: known_hosts holds another
    key for the server's address and port (a reinstalled or impostor box): ``zbak init`` fails
    the store's check (exit 1) naming the offered fingerprint, and the store's directory is
    not created."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")],
                   check=True)
    other = (tmp_path / "other.pub").read_text().split()
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{sftpd.ssh.port} {other[0]} {other[1]}\n")
    offered = subprocess.run(["ssh-keygen", "-lf", str(sftpd.ssh.host_key_pub)],
                             capture_output=True, check=True, text=True).stdout.split()[1]
    config = tmp_path / "zbak.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n'
                      + hosts_table("box", sftpd.host_config(known_hosts=known_hosts))
                      + f'[stores.offsite]\nurl = "sftp://box{sftp_dir}/zbak"\n')
    status, out, err = Zbak(config, capsys)("init", "--json")
    assert status == ExitStatus.FAILED, out + err
    (check,) = [c for c in json.loads(out)["checks"] if c["subject"] == "store offsite"]
    assert not check["ok"] and "HOST KEY CHANGED" in check["detail"], check
    assert offered in check["detail"], check
    assert not (local / "zbak").exists()


def test_probe_creates_the_directory_0700_and_refuses_a_shared_one(connection, sftp_dir,
                                                                    local):
    backend = SftpBackend("box", connection, f"{sftp_dir}/a/b", retry=FAST)
    assert "writable over SFTP (posix-rename yes, fsync yes)" in backend.probe()
    assert (os.stat(local / "a" / "b").st_mode & 0o777) == 0o700
    assert os.listdir(local / "a" / "b") == []
    os.chmod(local / "a" / "b", 0o770)
    with pytest.raises(StorePermanent, match="writable by group or others"):
        backend.probe()
    missing = SftpBackend("box", connection, f"{sftp_dir}/never", retry=FAST)
    with pytest.raises(StorePermanent, match="does not exist .* run `zbak init`"):
        missing.put("k", [b"x"])
    assert not (local / "never").exists()
