"""The OpenZFS 2.3 tier: zbak's ZFS layer and the host-side ssh data path against real OpenZFS.

Both pools live in the QEMU guest of tests/support/openzfs.py, so every transfer here has a
remote source and a remote target: ``ssh guest zfs send ... | ssh guest zfs receive ...`` run
from this host, the way zbak moves streams between two remote machines 
(docs/design.md#replication). The OpenSSH argv comes from ``proc.openssh.ssh_argv`` +
``remote_command`` (strict host keys); control commands go through paramiko's ``SSHExecutor``.
Expected values are read with plain ``zfs get``, independently of the code under test.
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

from support.openzfs import COMMAND_TIMEOUT

from zrepl_py.proc.openssh import remote_command
from zrepl_py.zfs.capabilities import Capabilities, detect
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.encryption import Encryption, probe_encryption
from zrepl_py.zfs.names import DatasetName

PASSPHRASE = b"correct horse battery staple"
PLAINTEXT = b"zbak plaintext marker 7f3a9c0e "


def guest(executor, *argv: str, input: bytes | None = None) -> str:
    """Run argv in the guest (must succeed) and return its stdout."""
    return executor.run(list(argv), input=input, timeout=COMMAND_TIMEOUT).text


def write_random(executor, path: str, kib: int) -> None:
    """Write ``kib`` KiB of incompressible data to ``path`` in the guest."""
    guest(executor, "dd", "if=/dev/urandom", f"of={path}", "bs=64K", f"count={kib // 64}",
          "iflag=fullblock", "status=none")  # fmt: skip


def snapshot_guids(executor, dataset: str) -> dict[str, int]:
    """``{short snapshot name: guid}`` of ``dataset``'s own snapshots, from ``zfs get``."""
    text = guest(executor, "zfs", "get", "-Hp", "-d", "1", "-t", "snapshot", "-o", "name,value",
                 "guid", dataset)  # fmt: skip
    return {line.split("\t")[0].split("@", 1)[1]: int(line.split("\t")[1])
            for line in text.splitlines()}  # fmt: skip


def make_dataset_with_snapshots(executor, dataset: str, shorts: list[str]) -> None:
    """Create ``dataset`` and take the snapshots ``shorts`` in order, 256 KiB new data each."""
    guest(executor, "zfs", "create", dataset)
    mountpoint = guest(executor, "zfs", "get", "-H", "-o", "value", "mountpoint", dataset).strip()
    for short in shorts:
        write_random(executor, f"{mountpoint}/{short}.bin", 256)
        guest(executor, "zfs", "snapshot", f"{dataset}@{short}")


def ssh_pipe(vm, send: list[str], receive: list[str], tmp_path: Path,
             limit: int | None = None) -> tuple[int, int, str]:  # fmt: skip
    """Run ``ssh guest SEND | ssh guest RECEIVE`` from this host.

    With ``limit``, only the first ``limit`` bytes of the stream reach the receiver, which then
    sees EOF (an interrupted transfer); the sender is cut off.

    Returns:
        (sender exit status, receiver exit status, both stderr texts).
    """
    prefix = vm.ssh_prefix()
    send_err, recv_err = tmp_path / "send.err", tmp_path / "recv.err"
    with open(send_err, "wb") as serr, open(recv_err, "wb") as rerr:
        sender = subprocess.Popen(prefix + [remote_command(send, sudo=False)],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=serr)  # fmt: skip
        if limit is None:
            receiver = subprocess.Popen(prefix + [remote_command(receive, sudo=False)],
                                        stdin=sender.stdout, stdout=subprocess.DEVNULL,
                                        stderr=rerr)  # fmt: skip
            sender.stdout.close()  # the receiver holds the only read end: EPIPE reaches send
        else:
            receiver = subprocess.Popen(prefix + [remote_command(receive, sudo=False)],
                                        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                        stderr=rerr)  # fmt: skip
            passed = 0
            while passed < limit:
                chunk = sender.stdout.read(min(65536, limit - passed))
                if not chunk:
                    break
                receiver.stdin.write(chunk)
                passed += len(chunk)
            receiver.stdin.close()
            sender.stdout.close()
        try:
            receive_status = receiver.wait(COMMAND_TIMEOUT)
            send_status = sender.wait(COMMAND_TIMEOUT)
        finally:
            for proc in (sender, receiver):
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    errors = (f"send: {send_err.read_text(errors='replace')}\n"
              f"receive: {recv_err.read_text(errors='replace')}")  # fmt: skip
    return send_status, receive_status, errors


def test_capability_detection_over_ssh_finds_every_openzfs_feature(
    openzfs_vm, openzfs_executor, openzfs_pools
):
    caps = detect(openzfs_executor, openzfs_pools.source, timeout=COMMAND_TIMEOUT)

    assert openzfs_vm.zfs_version.startswith("2.3.")
    assert dataclasses.replace(caps, features=()) == Capabilities(
        parsable_list=True,
        resume_tokens=True,
        bookmarks=True,
        raw_send=True,
        compressed_send=True,
        holds=True,
        multi_snapshot=True,
        pool_version=5000,
        list_holds=True,
        receive_properties=True,
        typed_get=True,
        written=True,
    )
    # the stream features zbak matches its send flags to (zfs.sendrecv.stream_flags)
    for feature in ("large_blocks", "embedded_data", "lz4_compress", "zstd_compress"):
        assert caps.feature_enabled(feature), caps.features
    assert caps.feature_active("lz4_compress"), "a new pool's root is lz4-compressed"
    # the multi-snapshot probe must not leave anything behind
    assert snapshot_guids(openzfs_executor, openzfs_pools.source) == {}


def test_tree_over_ssh_lists_snapshots_with_the_guids_zfs_get_reports(
    openzfs_executor, openzfs_pools
):
    dataset = f"{openzfs_pools.source}/data"
    make_dataset_with_snapshots(openzfs_executor, dataset, ["a", "b", "c"])
    expected = snapshot_guids(openzfs_executor, dataset)
    detected = detect(openzfs_executor, openzfs_pools.source, timeout=COMMAND_TIMEOUT)

    # both listing paths: `zfs list -Hp` (OpenZFS) and `zfs get -Hp` (the zfs-fuse form)
    for caps in (detected, Capabilities.NONE):
        tree = Zfs(openzfs_executor, capabilities=caps, timeout=COMMAND_TIMEOUT).tree(
            openzfs_pools.source, recursive=True
        )
        snapshots = tree.snapshots(dataset)
        assert [s.short for s in snapshots] == ["a", "b", "c"], caps
        assert {s.short: s.guid for s in snapshots} == expected
        assert len(set(expected.values())) == 3


def test_ssh_pipe_between_remote_pools_replicates_full_and_incremental_with_equal_guids(
    openzfs_vm, openzfs_executor, openzfs_pools, tmp_path
):
    source, target = f"{openzfs_pools.source}/data", f"{openzfs_pools.target}/data"
    make_dataset_with_snapshots(openzfs_executor, source, ["a", "b", "c"])

    full = ssh_pipe(openzfs_vm, ["zfs", "send", f"{source}@a"],
                    ["zfs", "receive", "-u", target], tmp_path)  # fmt: skip
    assert full[:2] == (0, 0), full[2]
    incremental = ssh_pipe(openzfs_vm, ["zfs", "send", "-I", "@a", f"{source}@c"],
                           ["zfs", "receive", "-u", target], tmp_path)  # fmt: skip
    assert incremental[:2] == (0, 0), incremental[2]

    assert snapshot_guids(openzfs_executor, target) == snapshot_guids(openzfs_executor, source)


def test_interrupted_ssh_transfer_resumes_from_the_receive_resume_token(
    openzfs_vm, openzfs_executor, openzfs_pools, tmp_path
):
    """docs/reliability.md#r2-interrupted-incremental-i-resumes."""
    source, target = f"{openzfs_pools.source}/data", f"{openzfs_pools.target}/data"
    make_dataset_with_snapshots(openzfs_executor, source, ["a"])
    assert ssh_pipe(openzfs_vm, ["zfs", "send", f"{source}@a"],
                    ["zfs", "receive", "-u", target], tmp_path)[:2] == (0, 0)  # fmt: skip
    mountpoint = guest(openzfs_executor, "zfs", "get", "-H", "-o", "value", "mountpoint", source)
    write_random(openzfs_executor, f"{mountpoint.strip()}/big.bin", 2048)
    guest(openzfs_executor, "zfs", "snapshot", f"{source}@b")

    cut = ssh_pipe(openzfs_vm, ["zfs", "send", "-i", "@a", f"{source}@b"],
                   ["zfs", "receive", "-s", "-u", target], tmp_path, limit=256 * 1024)  # fmt: skip
    assert cut[1] != 0, cut[2]
    token = guest(openzfs_executor, "zfs", "get", "-H", "-o", "value", "receive_resume_token",
                  target).strip()  # fmt: skip
    assert token not in ("", "-")
    assert "b" not in snapshot_guids(openzfs_executor, target)

    resumed = ssh_pipe(openzfs_vm, ["zfs", "send", "-t", token],
                       ["zfs", "receive", "-s", "-u", target], tmp_path)  # fmt: skip
    assert resumed[:2] == (0, 0), resumed[2]
    assert snapshot_guids(openzfs_executor, target) == snapshot_guids(openzfs_executor, source)
    assert guest(openzfs_executor, "zfs", "get", "-H", "-o", "value", "receive_resume_token",
                 target).strip() == "-"  # fmt: skip


def test_raw_send_of_an_encrypted_dataset_arrives_locked_and_carries_no_plaintext(
    openzfs_vm, openzfs_executor, openzfs_pools, request
):
    """docs/reliability.md#r38-encrypted-datasets."""
    source, target = f"{openzfs_pools.source}/enc", f"{openzfs_pools.target}/enc"
    keyfile = f"/root/zbak-key-{openzfs_pools.source}"
    request.addfinalizer(lambda: openzfs_executor.run(["rm", "-f", keyfile], check=False))
    guest(openzfs_executor, "dd", f"of={keyfile}", "status=none", input=PASSPHRASE + b"\n")
    # pbkdf2iters: the minimum (zfsprops(7)); the default 350000 costs ~4 s of emulated CPU
    # at create and again at load-key
    guest(openzfs_executor, "zfs", "create", "-o", "encryption=on", "-o", "keyformat=passphrase",
          "-o", f"keylocation=file://{keyfile}", "-o", "pbkdf2iters=100000",
          "-o", "compression=off", source)  # fmt: skip
    mountpoint = guest(openzfs_executor, "zfs", "get", "-H", "-o", "value", "mountpoint",
                       source).strip()  # fmt: skip
    guest(openzfs_executor, "dd", f"of={mountpoint}/secret", "status=none",
          input=PLAINTEXT * 2048)  # fmt: skip
    guest(openzfs_executor, "zfs", "snapshot", f"{source}@0")
    prefix = openzfs_vm.ssh_prefix()

    def send(*flags: str) -> bytes:
        argv = prefix + [remote_command(["zfs", "send", *flags, f"{source}@0"], sudo=False)]
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=COMMAND_TIMEOUT)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert PLAINTEXT in send()  # control: a plain send carries the file's bytes
    raw = send("-w")
    assert PLAINTEXT not in raw and PASSPHRASE not in raw

    received = subprocess.run(prefix + [remote_command(["zfs", "receive", "-u", target],
                                                       sudo=False)],
                              input=raw, capture_output=True, timeout=COMMAND_TIMEOUT)  # fmt: skip
    assert received.returncode == 0, received.stderr
    props = guest(openzfs_executor, "zfs", "get", "-H", "-o", "property,value",
                  "encryption,keyformat,keystatus", target)  # fmt: skip
    assert dict(line.split("\t") for line in props.splitlines()) == {
        "encryption": "aes-256-gcm",
        "keyformat": "passphrase",
        "keystatus": "unavailable",
    }
    assert snapshot_guids(openzfs_executor, target) == snapshot_guids(openzfs_executor, source)
    # zbak's one probe of encryption and keystatus (zfs.encryption), in one zfs get
    zfs = Zfs(openzfs_executor, capabilities=dataclasses.replace(
        Capabilities.NONE, raw_send=True, pool_version=5000))  # as detected on OpenZFS 2.3
    names = [DatasetName(d) for d in (openzfs_pools.source, source, target)]
    assert probe_encryption(zfs, names, keystatus=True) == Encryption(
        encrypted=frozenset(names[1:]), locked=frozenset(names[2:]))
    assert probe_encryption(zfs, names) == Encryption(encrypted=frozenset(names[1:]))

    guest(openzfs_executor, "zfs", "load-key", "-L", f"file://{keyfile}", target)
    guest(openzfs_executor, "zfs", "mount", target)
    target_mountpoint = guest(openzfs_executor, "zfs", "get", "-H", "-o", "value", "mountpoint",
                              target).strip()  # fmt: skip
    sums = guest(openzfs_executor, "sha256sum", f"{mountpoint}/secret",
                 f"{target_mountpoint}/secret")  # fmt: skip
    first, second = (line.split()[0] for line in sums.splitlines())
    assert first == second
