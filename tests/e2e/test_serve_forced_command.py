"""``zbak serve`` as the SSH forced command of a real sshd, with real zfs-fuse pools.

The backup host's authorized_keys line is ``command="zbak serve --root BAK/replicas
--log LOG",restrict KEY``: every session of zbak's key runs ``zbak serve``, whatever it asked.
``zbak replicate`` must work through it unchanged (capability probes, listings, the
``zstd -d | zfs receive`` pipeline, the ``mbuffer -V`` probe and the receive buffer, the guid
check), and hostile or out-of-root requests sent
with the real OpenSSH client must be refused, logged with their reason, and change nothing.
Hostile requests try to create a canary file instead of doing damage, in case a refusal ever
failed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from support.cli import content_of, exists, prop, restored_content, run_zbak, settled_snapshots, zfs
from support.common import hosts_table
from support.served import served_pools

from zrepl_py.errors import ExitStatus
from zrepl_py.proc.openssh import remote_command, ssh_argv
from zrepl_py.restore.mark import RESTORING
from zrepl_py.serve.token import make_token

pytestmark = [pytest.mark.zfs, pytest.mark.ssh]

ZBAK = Path(sys.executable).with_name("zbak")
REFUSED = 126


def guids(dataset: str) -> dict[str, int]:
    out = zfs("get", "-Hp", "-r", "-o", "name,property,value", "guid", dataset)
    return {n.split("@", 1)[1]: int(v) for n, _, v in (line.split("\t") for line in out.splitlines())
            if n.startswith(dataset + "@")}


class Served:
    """A source pool, a backup pool whose ``replicas`` is served, and a config pushing to it."""

    def __init__(self, make_pool, sshd_factory, tmp_path, capsys, *, serve_options="",
                 replicate_extra="", compression="zstd", job_extra=""):
        pools = served_pools(make_pool)
        self.src, self.bak, self.data = pools.src, pools.bak, pools.data
        self.root, self.replica = pools.root, pools.replica
        zfs("create", f"{self.bak.name}/other")
        self.log = tmp_path / "serve.log"
        self.canary = tmp_path / "canary"
        command = f"{ZBAK} serve --root {self.root} --log {self.log} {serve_options}".strip()
        self.server = sshd_factory(forced_command=command)
        self.host = self.server.host_config()
        self.tmp, self.capsys = tmp_path, capsys
        self.config = tmp_path / "zbak.toml"
        self.config.write_text(textwrap.dedent(f"""
            state_dir = "{tmp_path / 'state'}"
        """) + hosts_table("backup", self.host, connect_timeout=5) + textwrap.dedent(f"""
            [jobs.j]
            dataset = "{self.data}"
            {job_extra}
            [jobs.j.replicate]
            targets = ["backup:{self.replica}"]
            compression = "{compression}"
        """) + textwrap.dedent(replicate_extra))

    def zbak(self, *args: str):
        return run_zbak("--config", str(self.config), *args)

    def ssh(self, request: str) -> subprocess.CompletedProcess:
        """Send ``request`` verbatim as the remote command (no local shell involved)."""
        argv = ssh_argv(self.host, known_hosts_default=self.tmp / "known_hosts") + [request]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)

    def log_lines(self, kind: str) -> list[str]:
        return [line for line in self.log.read_text().splitlines() if f" {kind} " in line]


@pytest.fixture
def served(make_pool, sshd_factory, tmp_path, capsys):
    return Served(make_pool, sshd_factory, tmp_path, capsys)


def test_zbak_replicate_pushes_full_and_incremental_through_the_forced_command(
        make_pool, sshd_factory, tmp_path, capsys):
    """docs/reliability.md#r36-forced-command. Without the receive buffer: the two-command data
    path."""
    served = Served(make_pool, sshd_factory, tmp_path, capsys,
                    replicate_extra="receive_buffer = 0\n")
    (served.src.mountpoint / "data" / "a.bin").write_bytes(b"a" * 200_000)
    zfs("snapshot", f"{served.data}@zbak_20260101T000000Z")
    (served.src.mountpoint / "data" / "b.bin").write_bytes(b"b" * 100_000)
    zfs("snapshot", f"{served.data}@zbak_20260102T000000Z")
    assert served.zbak("init", "--no-checks")[0] == ExitStatus.OK
    status, out, err = served.zbak("replicate", "--json")
    assert status == ExitStatus.OK, out + err
    assert guids(served.replica) == guids(served.data)

    zfs("snapshot", f"{served.data}@zbak_20260103T000000Z")
    status, out, err = served.zbak("replicate", "--json")
    assert status == ExitStatus.OK, out + err
    assert json.loads(out)["rows"][0]["plan"].startswith("incremental -I zbak_20260102T000000Z")
    assert guids(served.replica) == guids(served.data)

    allowed = "\n".join(served.log_lines("ALLOWED"))
    assert "zstd -q -d -c | zfs receive -u" in allowed, "the data path ran through zbak serve"
    assert "zpool get" in allowed and "zfs get" in allowed, "probes and listings did too"
    assert not served.log_lines("REFUSED"), served.log.read_text()


def test_a_replica_property_serve_was_not_started_with_is_refused_and_then_allowed(
        make_pool, sshd_factory, tmp_path_factory, capsys):
    """docs/decisions.md#replica-properties-keep-a-failover-replica-faithful: zbak serve lets
    through exactly the replica properties of its ``--receive-set`` (over the defaults). zfs-fuse
    has no ``receive -o``, so zbak sets them with ``zfs set`` after the full receive, through serve
    as well: a property serve was not told about is refused (the run fails naming it), the same job
    passes once serve allows it, and the defaults (canmount=noauto, readonly=on) need no option."""
    extra = """\
        [jobs.j.replicate.properties]
        set = { "com.example:role" = "replica" }
    """
    for options, ok in (("", False), ("--receive-set com.example:role=replica", True)):
        served = Served(make_pool, sshd_factory, tmp_path_factory.mktemp("p"), capsys,
                        serve_options=options, replicate_extra=extra)
        zfs("snapshot", f"{served.data}@zbak_20260101T000000Z")
        assert served.zbak("init", "--no-checks")[0] == ExitStatus.OK
        status, out, err = served.zbak("replicate", "--json")
        value = zfs("get", "-H", "-o", "value,source", "com.example:role", served.replica)
        assert zfs("get", "-H", "-o", "value", "canmount", served.replica).strip() == "noauto"
        if ok:
            assert status == ExitStatus.OK, out + err
            assert value.split() == ["replica", "local"]
            assert not served.log_lines("REFUSED"), served.log.read_text()
        else:
            assert status == ExitStatus.FAILED, out + err
            assert "zfs set com.example:role=replica" in out and "--receive-set" in out, out
            assert value.split() == ["-", "-"]
            (refused,) = served.log_lines("REFUSED")
            assert "com.example:role=replica" in refused


def test_the_replicas_of_a_tree_get_their_properties_through_serve_in_batches(
        make_pool, sshd_factory, tmp_path, capsys):
    """docs/design.md#replication-settle-order: on a receiver without ``zfs receive -o`` (zfs-fuse)
    zbak sets canmount and readonly on every replica a batch of full streams created with one ``zfs
    set PROP=VALUE DS...`` (``replication.settle`` step 1); zbak serve allows that form (it took one
    dataset only, so a batch was refused and set again one replica at a time)."""
    served = Served(make_pool, sshd_factory, tmp_path, capsys, job_extra="recursive = true",
                    replicate_extra="concurrency = 4\n")
    children = [f"c{i}" for i in range(6)]
    for child in children:
        zfs("create", f"{served.data}/{child}")
    zfs("snapshot", "-r", f"{served.data}@zbak_20260101T000000Z")
    assert served.zbak("init", "--no-checks")[0] == ExitStatus.OK
    status, out, err = served.zbak("replicate", "--json")
    assert status == ExitStatus.OK, out + err
    for replica in [served.replica] + [f"{served.replica}/{c}" for c in children]:
        got = zfs("get", "-H", "-o", "value", "canmount,readonly", replica).split()
        assert got == ["noauto", "on"], replica
    assert not served.log_lines("REFUSED"), served.log.read_text()
    sets = [line for line in served.log_lines("ALLOWED") if "zfs set readonly=on" in line]
    assert sum(line.count(f"{served.root}/") for line in sets) == 1 + len(children)
    assert len(sets) < 1 + len(children), "at least one batch of several replicas"


@pytest.mark.parametrize("compression, pipeline", [
    ("zstd", "'zstd -q -d -c | mbuffer -q -v 1 -s 128k -m 2048k | zfs receive -u"),
    ("none", "'mbuffer -q -v 1 -s 128k -m 2048k | zfs receive -u"),
])
def test_zbak_replicate_pushes_through_the_receive_buffer_the_forced_command_allows(
        make_pool, sshd_factory, tmp_path, capsys, compression, pipeline):
    """docs/reliability.md#r36-forced-command. The host answers the ``mbuffer -V`` probe through
    zbak serve, so zbak puts mbuffer before ``zfs receive`` (``transport.stages``); serve runs the
    pipeline with ``--mbuffer``'s path and the stream arrives whole, full and incremental."""
    served = Served(make_pool, sshd_factory, tmp_path, capsys, compression=compression,
                    serve_options="--mbuffer /usr/bin/mbuffer",
                    replicate_extra="receive_buffer = \"2MiB\"\n")
    (served.src.mountpoint / "data" / "a.bin").write_bytes(bytes(range(256)) * 4000)
    zfs("snapshot", f"{served.data}@zbak_20260101T000000Z")
    assert served.zbak("init", "--no-checks")[0] == ExitStatus.OK
    status, out, err = served.zbak("replicate", "--json")
    assert status == ExitStatus.OK, out + err
    (served.src.mountpoint / "data" / "b.bin").write_bytes(b"b" * 300_000)
    zfs("snapshot", f"{served.data}@zbak_20260102T000000Z")
    status, out, err = served.zbak("replicate", "--json")
    assert status == ExitStatus.OK, out + err
    assert guids(served.replica) == guids(served.data)

    assert not served.log_lines("REFUSED"), served.log.read_text()
    allowed = "\n".join(served.log_lines("ALLOWED"))
    assert "'mbuffer -V'" in allowed, "the probe ran through zbak serve"
    assert allowed.count(pipeline) == 2, allowed  # the request's repr, as zbak sent it


@pytest.mark.parametrize("hostile", [
    "zfs list; touch {canary}",
    "zfs list && touch {canary}",
    "zfs list $(touch {canary})",
    "zfs list `touch {canary}`",
    "zfs list > {canary}",
    "zfs list\ntouch {canary}",
    "touch {canary}",
    "sh -c 'touch {canary}'",
    "mbuffer -q -v 1 -s 128k -m 1024k -o {canary} | zfs receive -u pool/x",
    "mbuffer -V -o {canary}",
])
def test_a_hostile_command_line_is_refused_logged_and_never_reaches_a_shell(served, hostile):
    """docs/reliability.md#r36-forced-command."""
    done = served.ssh(hostile.format(canary=served.canary))
    assert done.returncode == REFUSED, done.stdout + done.stderr
    assert "zbak serve: refused:" in done.stderr
    assert not served.canary.exists()
    (line,) = served.log_lines("REFUSED")
    assert "shell" in line or "is not allowed" in line


@pytest.mark.parametrize("request_of, reason", [
    (lambda s: f"zfs list -H -o name -r {s.bak.name}/other", "outside the allowed root"),
    (lambda s: f"zfs receive -u {s.bak.name}/other/x", "outside the allowed root"),
    (lambda s: f"zfs get -r -H all {s.bak.name}", "recursive read"),
    (lambda s: f"zfs destroy {s.root}/data@zbak_20260101T000000Z", "zfs destroy is not allowed"),
    (lambda s: f"zfs destroy -r {s.root}", "zfs destroy is not allowed"),
    (lambda s: f"zfs receive -u -F {s.root}/data", "-F is not allowed"),
    (lambda s: f"zfs receive -u {s.root}/data -F", "-F is not allowed"),
    (lambda s: f"zpool destroy {s.bak.name}", "zpool destroy is not allowed"),
    (lambda s: "cat /etc/hostname", "program 'cat' is not allowed"),
    (lambda s: "rsync --server -vlogDtpre.iLsfxC . /tmp", "program 'rsync' is not allowed"),
    (lambda s: None, "no command given"),
])
def test_requests_outside_the_root_or_the_allow_list_are_refused_with_the_reason_logged(
        served, request_of, reason):
    """docs/reliability.md#r36-forced-command."""
    zfs("snapshot", f"{served.bak.name}/other@zbak_20260101T000000Z")
    zfs("create", f"{served.root}/data")
    zfs("snapshot", f"{served.root}/data@zbak_20260101T000000Z")
    text = request_of(served)
    done = served.ssh(text) if text is not None else served.ssh("")
    assert done.returncode == REFUSED, done.stdout + done.stderr
    assert reason in done.stderr
    (line,) = served.log_lines("REFUSED")
    assert reason in line
    assert "zbak_20260101T000000Z" in guids(f"{served.root}/data"), "nothing was destroyed"
    assert "zbak_20260101T000000Z" in guids(f"{served.bak.name}/other")
    assert zfs("list", "-H", "-o", "name", f"{served.root}/data").strip()


def test_a_resume_send_runs_only_when_the_tokens_guid_is_a_snapshot_inside_the_root(served):
    """docs/reliability.md#r36-forced-command: zfs picks a resumed send's snapshot by guid,
    searching ever larger ancestors, so a token naming a dataset inside the root but the guid of a
    snapshot elsewhere must be refused. (zfs-fuse has no ``send -t``: the allowed one fails in zfs,
    not in serve.)"""
    zfs("create", f"{served.root}/data")
    zfs("snapshot", f"{served.root}/data@zbak_20260101T000000Z")
    zfs("snapshot", f"{served.bak.name}/other@secret")
    inside = int(zfs("get", "-Hp", "-o", "value", "guid",
                     f"{served.root}/data@zbak_20260101T000000Z"))
    elsewhere = int(zfs("get", "-Hp", "-o", "value", "guid", f"{served.bak.name}/other@secret"))
    name = f"{served.root}/data@zbak_20260101T000000Z"

    forged = make_token([("object", 1), ("toguid", elsewhere), ("toname", name)])
    done = served.ssh(remote_command(["zfs", "send", "-t", forged], sudo=False))
    assert done.returncode == REFUSED and f"guid {elsewhere}" in done.stderr

    genuine = make_token([("object", 1), ("toguid", inside), ("toname", name)])
    done = served.ssh(remote_command(["zfs", "send", "-t", genuine], sudo=False))
    assert done.returncode not in (0, REFUSED), "zfs-fuse itself rejects -t"
    (allowed,) = served.log_lines("ALLOWED")
    assert genuine[:40] in allowed


def test_rollback_on_divergence_needs_allow_destroy_own_and_then_destroys_only_zbak_snapshots(
        make_pool, sshd_factory, tmp_path, capsys):
    first = Served(make_pool, sshd_factory, tmp_path, capsys,
                   replicate_extra='on_divergence = "rollback"\n')
    zfs("snapshot", f"{first.data}@zbak_20260101T000000Z")
    assert first.zbak("init", "--no-checks")[0] == ExitStatus.OK
    assert first.zbak("replicate")[0] == ExitStatus.OK
    # The target gains a newer zbak snapshot the source never had: diverged.
    zfs("snapshot", f"{first.replica}@zbak_20260105T000000Z")
    zfs("snapshot", f"{first.data}@zbak_20260102T000000Z")
    status, out, err = first.zbak("replicate", "--json")
    assert status == ExitStatus.FAILED
    assert "zbak_20260105T000000Z" in guids(first.replica), "refused: nothing destroyed"
    assert any("zfs destroy is not allowed" in line for line in first.log_lines("REFUSED"))

    # The same host key, now allowed to destroy zbak's own snapshots.
    again = sshd_factory(forced_command=f"{ZBAK} serve --root {first.root} --log {first.log} "
                                        "--allow-destroy-own")
    first.config.write_text(first.config.read_text().replace(f"port = {first.host.port}",
                                                             f"port = {again.port}")
                            .replace(str(first.host.known_hosts), str(again.known_hosts)))
    status, out, err = first.zbak("replicate", "--json")
    assert status == ExitStatus.OK, out + err
    assert "rollback" in json.loads(out)["rows"][0]["plan"]
    assert guids(first.replica) == guids(first.data)
    allowed = "\n".join(first.log_lines("ALLOWED"))
    assert f"zfs destroy {first.replica}@zbak_20260105T000000Z" in allowed
    assert f"zfs rollback {first.replica}@zbak_20260101T000000Z" in allowed



def test_a_restore_into_the_served_root_is_marked_and_a_killed_one_continues(
        make_pool, sshd_factory, tmp_path, capsys):
    """Restoring onto the backup host (``--into backup:ROOT/NAME``: the master's pool is lost,
    or the admin restores beside the replicas) goes through serve like replication. The
    restore's mark (``zbak:restoring``, set after the first stream, cleared at the end) must
    pass: without it a restore killed half-way leaves a dataset that the rerun refuses and
    that serve lets nobody destroy."""
    served = Served(make_pool, sshd_factory, tmp_path, capsys)
    data_dir = Path(prop(served.data, "mountpoint"))
    for step in range(6):
        (data_dir / f"f{step}.bin").write_bytes(os.urandom(16 * 1024 * 1024))
        zfs("snapshot", f"{served.data}@{step}")
    want = content_of(f"{served.data}@5", served.src.name, "want")
    assert served.zbak("init", "--no-checks")[0] == ExitStatus.OK
    back = f"{served.root}/back"
    cmd = [sys.executable, "-m", "zrepl_py", "--config", str(served.config), "restore",
           served.data, "--to", "@5", "--into", f"backup:{back}", "--from", "local", "--yes"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (exists(back) and prop(back, RESTORING) != "-"):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail("the restore ended (or stalled) before its mark was seen: "
                        + "".join(proc.communicate()))
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    held = settled_snapshots(back)
    assert held == [str(i) for i in range(len(held))] and 1 <= len(held) < 6, held

    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "from an interrupted restore" in done.stdout, done.stdout
    # The byte count is the stream's, though zfs-fuse's daemon, not its zfs send, writes it.
    received = int(re.search(r"(\d+) bytes received", done.stdout)[1])
    assert received >= (5 - int(held[-1])) * 16 * 1024 * 1024, done.stdout
    assert restored_content(back) == want and prop(back, RESTORING) == "-"
    allowed = "\n".join(served.log_lines("ALLOWED"))
    assert f"zfs set {RESTORING}=local:{served.data} {back}" in allowed
    assert f"zfs inherit {RESTORING} {back}" in allowed
    assert not served.log_lines("REFUSED"), served.log.read_text()


def _allow_argv(*args: str) -> list[str]:
    script = Path(__file__).resolve().parents[2] / "examples" / "zfs-allow.sh"
    done = subprocess.run(["sh", str(script), "-n", *args], capture_output=True, text=True,
                          check=True, timeout=30)
    return done.stdout.split()


def test_a_non_root_user_with_the_documented_zfs_allow_sets_can_replicate_on_openzfs(
        openzfs_vm, openzfs_executor, openzfs_pools, tmp_path):
    """docs/reliability.md#r37-delegation-only: zfs-fuse has no working ``zfs allow`` (it needs
    pyzfs), so the delegation sets of examples/zfs-allow.sh are proven on real OpenZFS 2.3: as
    ``nobody`` (uid 65534) a full and an incremental stream go from the source's delegated dataset
    into the target's, with the hold, bookmark, snapshot and destroy zbak needs; a received
    mountpoint is dropped; outside the delegated dataset the same user is refused."""
    from support.openzfs import COMMAND_TIMEOUT

    from zrepl_py.proc.openssh import remote_command

    run = openzfs_executor.run
    src, dst = f"{openzfs_pools.source}/data", f"{openzfs_pools.target}/replicas"
    for dataset in (src, dst, f"{openzfs_pools.target}/other"):
        run(["zfs", "create", dataset], timeout=COMMAND_TIMEOUT)
    run(["dd", "if=/dev/urandom", f"of=/{src}/f", "bs=64K", "count=4", "status=none"],
        timeout=COMMAND_TIMEOUT)
    run(["zfs", "snapshot", f"{src}@zbak_20260101T000000Z"], timeout=COMMAND_TIMEOUT)
    run(_allow_argv("source", "nobody", src), timeout=COMMAND_TIMEOUT)
    run(_allow_argv("target", "nobody", dst, "--rollback"), timeout=COMMAND_TIMEOUT)
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    prefix = openzfs_vm.ssh_prefix()

    def as_nobody(*argv: str, check: bool = True):
        done = run([*nobody, *argv], check=False, timeout=COMMAND_TIMEOUT)
        assert not check or done.returncode == 0, (argv, done.error_text)
        return done

    def transfer(send: list[str], receive: list[str]) -> int:
        sender = subprocess.Popen(prefix + [remote_command([*nobody, *send], sudo=False)],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
        receiver = subprocess.Popen(prefix + [remote_command([*nobody, *receive], sudo=False)],
                                    stdin=sender.stdout, stderr=subprocess.PIPE)
        sender.stdout.close()
        receiver.communicate(timeout=COMMAND_TIMEOUT)
        sender.wait(timeout=COMMAND_TIMEOUT)
        return receiver.returncode or sender.returncode

    assert transfer(["zfs", "send", f"{src}@zbak_20260101T000000Z"],
                    ["zfs", "receive", "-u", "-s", f"{dst}/data"]) == 0
    as_nobody("zfs", "hold", "zbak:j:backup", f"{src}@zbak_20260101T000000Z")
    as_nobody("zfs", "bookmark", f"{src}@zbak_20260101T000000Z", f"{src}#zbak_0a1b2c3d4e_1")
    as_nobody("zfs", "snapshot", f"{src}@zbak_20260102T000000Z")
    assert transfer(["zfs", "send", "-I", f"{src}@zbak_20260101T000000Z",
                     f"{src}@zbak_20260102T000000Z"],
                    ["zfs", "receive", "-u", "-s", f"{dst}/data"]) == 0
    as_nobody("zfs", "release", "zbak:j:backup", f"{src}@zbak_20260101T000000Z")
    as_nobody("zfs", "destroy", f"{dst}/data@zbak_20260102T000000Z")
    as_nobody("zfs", "rollback", f"{dst}/data@zbak_20260101T000000Z")
    as_nobody("zfs", "destroy", f"{src}@zbak_20260101T000000Z")
    guid = run(["zfs", "get", "-Hp", "-o", "value", "guid", f"{dst}/data@zbak_20260101T000000Z"],
               timeout=COMMAND_TIMEOUT).text.strip()
    assert guid == run(["zfs", "get", "-Hp", "-o", "value", "guid",
                        f"{src}#zbak_0a1b2c3d4e_1"], timeout=COMMAND_TIMEOUT).text.strip()

    # A stream carrying properties (zfs send -p) cannot give the replica a mountpoint,
    # even without -x: the delegated user holds no mountpoint permission
    # (docs/decisions.md#replica-properties-keep-a-failover-replica-faithful), and zfs receive
    # drops each property it may not set ("cannot receive mountpoint property ...: permission
    # denied") while receiving the data.
    run(["zfs", "create", "-o", "mountpoint=/tmp/hostile", f"{src}/props"], timeout=COMMAND_TIMEOUT)
    run(["zfs", "snapshot", f"{src}/props@s"], timeout=COMMAND_TIMEOUT)
    sender = subprocess.Popen(prefix + [remote_command(["zfs", "send", "-p", f"{src}/props@s"],
                                                       sudo=False)],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    receiver = subprocess.Popen(prefix + [remote_command([*nobody, "zfs", "receive", "-u",
                                                          f"{dst}/props"], sudo=False)],
                                stdin=sender.stdout, stderr=subprocess.PIPE)
    sender.stdout.close()
    _, err = receiver.communicate(timeout=COMMAND_TIMEOUT)
    sender.wait(timeout=COMMAND_TIMEOUT)
    assert b"cannot receive mountpoint property" in err
    source = run(["zfs", "get", "-H", "-o", "source", "mountpoint", f"{dst}/props"],
                 timeout=COMMAND_TIMEOUT).text.strip()
    assert source == "default"

    outside = as_nobody("zfs", "create", f"{openzfs_pools.target}/other/x", check=False)
    assert outside.returncode != 0 and "permission denied" in outside.error_text.lower()
    refused = as_nobody("zfs", "destroy", f"{openzfs_pools.target}/other", check=False)
    assert refused.returncode != 0
