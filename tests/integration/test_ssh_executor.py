"""SSHExecutor (paramiko), ssh_argv (real OpenSSH client) and host selection against a real sshd.

Covers the Executor contract for LocalExecutor and SSHExecutor alike, and
docs/reliability.md#r35-ssh-host-keys: unknown host keys are refused, changed ones raise
HostKeyMismatch with the fingerprint, and no command runs in either case.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import paramiko
import pytest
from support.common import free_port

from zrepl_py.config.schema import Config
from zrepl_py.errors import (
    CommandFailed,
    HostKeyMismatch,
    HostKeyUnknown,
    HostUnreachable,
    UsageError,
)
from zrepl_py.invocation.hosts import ExecutorPool, executor_for
from zrepl_py.proc import openssh
from zrepl_py.proc.local import LocalExecutor
from zrepl_py.proc.openssh import (
    SOCKET_PATH_MAX,
    control_dir,
    control_path,
    remote_command,
    ssh_argv,
)
from zrepl_py.proc.ssh import SSHExecutor

MB = 1024 * 1024


def fingerprint_of(public_key_file: Path) -> str:
    """The SHA256 fingerprint as ``ssh-keygen -lf`` prints it (independent of our code)."""
    out = subprocess.run(["ssh-keygen", "-lf", str(public_key_file)], capture_output=True,
                         check=True, text=True).stdout  # fmt: skip
    return out.split()[1]


@pytest.fixture
def ssh(sshd, tmp_path):
    """An SSHExecutor for the session sshd, closed after the test."""
    with SSHExecutor("backup1", sshd.host_config(), known_hosts_default=tmp_path / "kh") as ex:
        yield ex


@pytest.fixture(params=["local", pytest.param("ssh", marks=pytest.mark.ssh)])
def executor(request, tmp_path):
    """Each Executor implementation in turn (the contract suite)."""
    if request.param == "local":
        yield LocalExecutor()
        return
    sshd = request.getfixturevalue("sshd")
    with SSHExecutor("backup1", sshd.host_config(), known_hosts_default=tmp_path / "kh") as ex:
        yield ex


# --- the Executor contract, for every implementation ---------------------------------------


def test_a_command_runs_and_returns_its_exit_status_and_output(executor):
    """``run`` returns Completed with argv, exit status 0 and stdout bytes."""
    done = executor.run(["printf", "%s|", "a b", "c"])
    assert (done.returncode, done.stdout, done.stderr) == (0, b"a b|c|", b"")
    assert done.argv == ("printf", "%s|", "a b", "c")


def test_a_non_zero_exit_raises_command_failed_with_stderr_and_host(executor):
    """With check=True a failing command raises CommandFailed carrying code, stderr and host."""
    with pytest.raises(CommandFailed) as info:
        executor.run(["sh", "-c", "echo 'no such dataset' >&2; exit 3"])
    assert info.value.returncode == 3
    assert info.value.stderr == "no such dataset"
    assert info.value.host == executor.host
    assert info.value.argv[:2] == ["sh", "-c"]
    assert f"[{executor.host}]" in str(info.value)


def test_check_false_returns_a_failing_exit_status_instead_of_raising(executor):
    """With check=False the non-zero status and stderr come back in Completed."""
    done = executor.run(["sh", "-c", "echo out; echo err >&2; exit 7"], check=False)
    assert (done.returncode, done.stdout, done.error_text) == (7, b"out\n", "err")


def test_output_on_stderr_alone_does_not_raise(executor):
    """A zero exit with stderr output is a success."""
    assert executor.run(["sh", "-c", "echo warning >&2"]).error_text == "warning"


def test_without_input_the_command_reads_an_empty_stdin(executor):
    """input=None gives the command EOF on stdin, so a reader never hangs."""
    assert executor.run(["cat"], timeout=10).stdout == b""


def test_a_timeout_stops_waiting_quickly_and_raises_command_failed_without_returncode(executor):
    """timeout expiry raises CommandFailed(returncode=None) instead of waiting for the
    command's 60 s (the 30 s bound holds on a loaded host; it catches the wait, not speed)."""
    started = time.monotonic()
    with pytest.raises(CommandFailed) as info:
        executor.run(["sleep", "60"], timeout=0.5)
    assert info.value.returncode is None
    assert "timed out" in info.value.stderr
    assert time.monotonic() - started < 30
    assert executor.run(["true"]).returncode == 0  # the executor is still usable


def test_five_megabytes_of_stdin_round_trip_to_stdout_without_deadlock(executor):
    """5 MB streamed in while 5 MB stream out arrive intact (stdin and stdout concurrently)."""
    data = os.urandom(5 * MB)
    done = executor.run(["cat"], input=data, timeout=60)
    assert len(done.stdout) == len(data) and done.stdout == data


def test_large_stderr_before_stdout_is_drained_without_deadlock(executor):
    """3 MB on stderr ahead of 3 MB on stdout: both are read concurrently, neither blocks."""
    script = "head -c 3000000 /dev/zero >&2; head -c 3000000 /dev/zero"
    done = executor.run(["sh", "-c", script], timeout=60)
    assert (len(done.stderr), len(done.stdout)) == (3000000, 3000000)


def test_a_command_that_ignores_its_stdin_still_completes(executor):
    """Input the command never reads is dropped, not an error (like a broken pipe locally)."""
    done = executor.run(["true"], input=os.urandom(2 * MB), timeout=60)
    assert done.returncode == 0


# --- SSHExecutor specifics -----------------------------------------------------------------


def test_one_connection_serves_many_commands_and_reconnects_after_close(ssh):
    """Commands share one SSH connection; after close() the next run connects again."""
    assert not ssh.connected  # lazy: nothing happens before the first command
    first = ssh.run(["sh", "-c", "echo $SSH_CONNECTION"]).stdout
    assert ssh.connected
    assert ssh.run(["sh", "-c", "echo $SSH_CONNECTION"]).stdout == first
    ssh.close()
    assert not ssh.connected
    assert ssh.run(["sh", "-c", "echo $SSH_CONNECTION"]).stdout != first


def test_a_session_the_server_keeps_refusing_fails_after_connect_timeout_saying_so(
    sshd_factory, tmp_path
):
    """A refused session is asked for again only until ``connect_timeout``: a server that
    allows no session (``MaxSessions 0``) gives HostUnreachable naming the refusal, after
    about that long (not the default 15 s), and the connection stays up: a refusal, not a
    lost connection."""
    server = sshd_factory(extra_config=["MaxSessions 0"])
    config = server.host_config(connect_timeout="2s")
    with SSHExecutor("backup1", config, known_hosts_default=tmp_path / "kh") as ex:
        began = time.monotonic()
        with pytest.raises(HostUnreachable, match="refused a new session"):
            ex.run(["true"])
        assert 2 <= time.monotonic() - began < 12
        assert ex.connected  # refused, not lost


def test_the_control_connection_sends_small_packets_without_waiting_nagle_off(ssh):
    """Control commands are a few small packets each: the connection has TCP_NODELAY set, so
    they do not wait for the server's delayed ACK (about 45 ms per command otherwise)."""
    ssh.run(["true"])
    sock = ssh.connection.transport().sock
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_the_test_sshd_runs_commands_as_nested_shells_with_the_callers_variables(
    sshd_factory, tmp_path
):
    """The tests' sshd sets SHLVL=1, so the login shell counts as nested and skips ~/.bashrc
    (a host's set-up there cost up to 0.7 s a command); a SetEnv line of the caller's joins
    it, since sshd reads only the first (tests/support/sshd.py). bash raises SHLVL to 2 and
    gives one back when it execs the command: without the line the command sees 0."""
    server = sshd_factory(extra_config=["SetEnv ZBAK_PROBE=set"])
    with SSHExecutor("backup1", server.host_config(), known_hosts_default=tmp_path / "kh") as ex:
        done = ex.run(["sh", "-c", "echo $SHLVL $ZBAK_PROBE"])
    assert done.stdout.split() == [b"1", b"set"]


def test_sudo_puts_sudo_n_in_front_of_the_remote_argv(sshd, tmp_path):
    """HostConfig.sudo runs ``sudo -n ARGV`` (non-interactive sudo, never a password prompt)."""
    assert remote_command(["zfs", "list", "a b"], sudo=True) == "sudo -n zfs list 'a b'"
    config = sshd.host_config(sudo=True)
    with SSHExecutor("backup1", config, known_hosts_default=tmp_path / "kh") as ex:
        done = ex.run(["true"], check=False)
    assert done.argv == ("sudo", "-n", "true")
    # sudo may be absent on the test bed: either it ran, or the shell reports it missing
    assert done.returncode == 0 or b"sudo" in done.stderr


def test_an_unreachable_port_raises_host_unreachable_saying_what_to_check(sshd, tmp_path):
    """Nothing listening on the port: HostUnreachable naming the address and what to check."""
    config = sshd.host_config(port=free_port())
    with SSHExecutor("backup1", config, known_hosts_default=tmp_path / "kh") as ex:
        with pytest.raises(HostUnreachable) as info:
            ex.run(["true"])
    message = str(info.value)
    assert "backup1" in message and f"127.0.0.1:{config.port}" in message
    assert "check" in message


def test_a_refused_login_raises_host_unreachable(sshd, tmp_path):
    """A key the server does not authorize: HostUnreachable mentioning identity_file."""
    config = sshd.host_config(identity_file=sshd.host_key_file)  # a valid key, not authorized
    with SSHExecutor("backup1", config, known_hosts_default=tmp_path / "kh") as ex:
        with pytest.raises(HostUnreachable, match="identity_file"):
            ex.run(["true"])


def test_an_unknown_host_key_is_refused_and_no_command_runs(sshd, tmp_path):
    """docs/reliability.md#r35-ssh-host-keys: RejectPolicy: a host missing from known_hosts raises
    HostKeyUnknown; nothing executes."""
    canary = tmp_path / "ran"
    known_hosts = tmp_path / "empty_known_hosts"
    known_hosts.write_text("")
    config = sshd.host_config(known_hosts=known_hosts)
    with SSHExecutor("backup1", config, known_hosts_default=tmp_path / "kh") as ex:
        with pytest.raises(HostKeyUnknown) as info:
            ex.run(["touch", str(canary)])
    assert isinstance(info.value, HostKeyMismatch)
    assert fingerprint_of(sshd.host_key_pub) in str(info.value)
    assert not canary.exists()
    assert known_hosts.read_text() == ""


def test_a_missing_known_hosts_file_refuses_the_host_and_creates_nothing(sshd, tmp_path):
    """docs/reliability.md#r35-ssh-host-keys: No known_hosts at all (the default path): refused, and
    the file is not created."""
    config = sshd.host_config(known_hosts=None)
    default = tmp_path / "state" / "known_hosts"
    with SSHExecutor("backup1", config, known_hosts_default=default) as ex:
        with pytest.raises(HostKeyUnknown):
            ex.run(["true"])
    assert not default.exists()


def test_a_changed_host_key_raises_host_key_mismatch_with_the_offered_fingerprint(
    sshd, sshd_factory, tmp_path
):
    """docs/reliability.md#r35-ssh-host-keys: A host whose key differs from known_hosts:
    HostKeyMismatch naming host, port and the offered key's SHA256 fingerprint, and the command
    never runs."""
    changed = sshd_factory(known_hosts_from=sshd)
    canary = tmp_path / "ran"
    with SSHExecutor("backup1", changed.host_config(), known_hosts_default=tmp_path / "kh") as ex:
        with pytest.raises(HostKeyMismatch) as info:
            ex.run(["touch", str(canary)])
    assert not isinstance(info.value, HostKeyUnknown)
    message = str(info.value)
    assert "backup1" in message and "127.0.0.1" in message and str(changed.port) in message
    assert fingerprint_of(changed.host_key_pub) in message  # the offered (new) key
    assert fingerprint_of(sshd.host_key_pub) in message  # the one we expected
    assert not canary.exists()


def test_trust_on_first_use_records_the_key_with_mode_0600_and_reconnects_strictly(
    sshd, tmp_path
):
    """docs/reliability.md#r41-file-modes: TOFU accepts an unknown key once, writes it (0600) and
    later strict connections pass."""
    known_hosts = tmp_path / "state" / "known_hosts"
    tofu = sshd.host_config(known_hosts=None, trust_on_first_use=True)
    old_umask = os.umask(0)  # the mode must not depend on the ambient umask
    try:
        with SSHExecutor("backup1", tofu, known_hosts_default=known_hosts) as ex:
            assert ex.run(["echo", "first"]).stdout == b"first\n"
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(known_hosts.stat().st_mode) == 0o600
    recorded = known_hosts.read_text().split()
    public = sshd.host_key_pub.read_text().split()
    assert recorded == [f"[127.0.0.1]:{sshd.port}", public[0], public[1]]
    strict = sshd.host_config(known_hosts=known_hosts)
    with SSHExecutor("backup1", strict, known_hosts_default=tmp_path / "kh") as ex:
        assert ex.run(["echo", "second"]).stdout == b"second\n"
    assert len(known_hosts.read_text().splitlines()) == 1


def test_trust_on_first_use_still_refuses_a_changed_host_key(sshd, sshd_factory, tmp_path):
    """docs/reliability.md#r35-ssh-host-keys: TOFU never overrides a known key: a changed key raises
    HostKeyMismatch."""
    changed = sshd_factory(known_hosts_from=sshd)
    before = changed.known_hosts.read_text()
    config = changed.host_config(trust_on_first_use=True)
    with SSHExecutor("backup1", config, known_hosts_default=tmp_path / "kh") as ex:
        with pytest.raises(HostKeyMismatch):
            ex.run(["true"])
    assert changed.known_hosts.read_text() == before


# --- ssh_argv with the real OpenSSH client ------------------------------------------------


def test_ssh_argv_is_strict_key_only_and_ends_with_the_address(sshd, tmp_path):
    """The argv prefix pins host-key checking, identity and port, and ends ``-- ADDRESS``."""
    argv = ssh_argv(sshd.host_config(), known_hosts_default=tmp_path / "kh")
    assert argv[0] == "ssh" and argv[-2:] == ["--", "127.0.0.1"]
    options = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-o"]
    assert "BatchMode=yes" in options
    assert "StrictHostKeyChecking=yes" in options
    assert f'UserKnownHostsFile="{sshd.known_hosts}"' in options
    assert "IdentitiesOnly=yes" in options
    assert argv[argv.index("-i") + 1] == str(sshd.identity_file)
    assert argv[argv.index("-p") + 1] == str(sshd.port)
    assert argv[argv.index("-l") + 1] == "root"
    tofu = ssh_argv(sshd.host_config(trust_on_first_use=True, known_hosts=None),
                    known_hosts_default=tmp_path / "kh", batch=False)  # fmt: skip
    assert "BatchMode=yes" not in tofu
    assert "StrictHostKeyChecking=accept-new" in tofu
    assert f'UserKnownHostsFile="{tmp_path / "kh"}"' in tofu


def test_ssh_argv_runs_a_command_through_the_real_ssh_client(sshd, tmp_path):
    """``ssh_argv + [remote_command(argv)]`` runs argv remotely with its arguments intact."""
    argv = ssh_argv(sshd.host_config(), known_hosts_default=tmp_path / "kh")
    done = LocalExecutor().run(argv + [remote_command(["printf", "%s|", "a b", "$(x)"],
                                                      sudo=False)], timeout=30)  # fmt: skip
    assert done.stdout == b"a b|$(x)|"


def test_ssh_argv_handles_a_known_hosts_path_with_spaces_and_percent_signs(sshd, tmp_path):
    """ssh splits -o values on blanks and expands %-tokens; the path is quoted and escaped."""
    odd = tmp_path / "state dir %d %h" / "known hosts"
    odd.parent.mkdir()
    odd.write_bytes(sshd.known_hosts.read_bytes())
    argv = ssh_argv(sshd.host_config(known_hosts=odd), known_hosts_default=tmp_path / "kh")
    assert LocalExecutor().run(argv + ["true"], timeout=30).returncode == 0


def test_ssh_argv_refuses_a_changed_host_key_and_runs_nothing(sshd, sshd_factory, tmp_path):
    """docs/reliability.md#r35-ssh-host-keys: The real ssh client exits non-zero on a changed key
    and the command never runs."""
    changed = sshd_factory(known_hosts_from=sshd)
    canary = tmp_path / "ran"
    argv = ssh_argv(changed.host_config(trust_on_first_use=True),
                    known_hosts_default=tmp_path / "kh")  # fmt: skip
    done = LocalExecutor().run(argv + [remote_command(["touch", str(canary)], sudo=False)],
                               check=False, timeout=30)  # fmt: skip
    assert done.returncode != 0
    assert "Host key verification failed" in done.error_text
    assert not canary.exists()


def test_ssh_argv_refuses_an_unknown_host_unless_trust_on_first_use(sshd, tmp_path):
    """docs/reliability.md#r35-ssh-host-keys: StrictHostKeyChecking=yes refuses an unknown host;
    accept-new records it (TOFU)."""
    known_hosts = tmp_path / "known_hosts"
    config = sshd.host_config(known_hosts=known_hosts)
    strict = ssh_argv(config, known_hosts_default=tmp_path / "kh")
    done = LocalExecutor().run(strict + ["true"], check=False, timeout=30)
    assert done.returncode != 0 and "Host key verification failed" in done.error_text
    tofu = ssh_argv(sshd.host_config(known_hosts=known_hosts, trust_on_first_use=True),
                    known_hosts_default=tmp_path / "kh")  # fmt: skip
    assert LocalExecutor().run(tofu + ["true"], timeout=30).returncode == 0
    assert LocalExecutor().run(strict + ["true"], timeout=30).returncode == 0
    # a key recorded by OpenSSH (possibly hashed) is accepted by the paramiko executor too
    with SSHExecutor("backup1", config, known_hosts_default=tmp_path / "kh") as ex:
        assert ex.run(["true"]).returncode == 0


# --- ssh_argv with a shared connection (ControlMaster) -------------------------------------


def close_master(argv: list[str]) -> None:
    """``ssh -O exit`` for the master ``argv`` (an ssh_argv with control_dir) may have left."""
    subprocess.run(argv[:-2] + ["-O", "exit"] + argv[-2:], capture_output=True, timeout=30)


def test_a_shared_connection_carries_later_sessions_after_the_listener_is_gone(
    sshd_factory, tmp_path
):
    """Consecutive ssh_argv invocations with a control_dir ride on one connection: once the
    first has connected, a second needs no new connection (proved by stopping the listener)."""
    server = sshd_factory()
    shared = control_dir(tmp_path / "state")
    argv = ssh_argv(server.host_config(), known_hosts_default=tmp_path / "kh", control_dir=shared)
    try:
        assert LocalExecutor().run(argv + ["true"], timeout=30).returncode == 0
        socket = control_path(shared, server.host_config(), server.known_hosts)
        assert stat.S_ISSOCK(os.stat(socket).st_mode)
        pid = int((server.config_file.parent / "sshd.pid").read_text())
        os.kill(pid, 15)  # the listener only: the master's own sshd process lives on
        for _ in range(100):
            fresh = ssh_argv(server.host_config(), known_hosts_default=tmp_path / "kh")
            if LocalExecutor().run(fresh + ["true"], check=False, timeout=30).returncode != 0:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the sshd listener did not stop")
        done = LocalExecutor().run(argv + [remote_command(["printf", "%s", "a b"], sudo=False)],
                                   timeout=30)  # fmt: skip
        assert done.stdout == b"a b"
    finally:
        close_master(argv)


@pytest.fixture
def short_dir():
    """A fresh directory under /tmp with a short path: a test's tmp_path (deeper on an xdist
    worker) can leave too few of a socket path's bytes for the state directory."""
    made = Path(tempfile.mkdtemp(prefix="zbak-sock-", dir="/tmp"))
    yield made
    shutil.rmtree(made, ignore_errors=True)


def test_control_sockets_live_only_in_a_private_directory_of_ours(tmp_path, short_dir):
    """docs/reliability.md#r41-file-modes: The socket directory is made 0700; a symlink or an
    over-long path is not used."""
    state = short_dir / "state"
    chosen = control_dir(state)
    assert chosen == state / "ssh"
    assert stat.S_IMODE(os.lstat(chosen).st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(state).st_mode) == 0o700

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    elsewhere.chmod(0o777)
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "ssh").symlink_to(elsewhere)
    fallback = control_dir(linked)
    assert fallback is not None and fallback != linked / "ssh"
    assert stat.S_IMODE(os.lstat(elsewhere).st_mode) == 0o777, "the link target is untouched"

    long_state = tmp_path / ("x" * 100)
    fallback = control_dir(long_state)
    info = os.lstat(fallback)
    assert stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()
    assert stat.S_IMODE(info.st_mode) == 0o700
    assert len(str(control_path(fallback, _host(), tmp_path / "kh"))) <= SOCKET_PATH_MAX


@pytest.mark.parametrize("length, in_state_dir", [
    (SOCKET_PATH_MAX, True), (SOCKET_PATH_MAX + 1, False), (100, False)])
def test_a_control_socket_at_the_length_limit_connects_and_one_past_it_falls_back(
        sshd_factory, short_dir, length, in_state_dir):
    """A state directory whose socket path is exactly SOCKET_PATH_MAX bytes long keeps its
    sockets and a real ssh connects through one; one byte longer (or 100, accepted before:
    ssh then failed "unix_listener: ... too long for Unix domain socket") falls back to the
    short directory, which connects as well."""
    server = sshd_factory()
    host, known_hosts = server.host_config(), server.known_hosts
    padding = length - len(os.fsencode(str(short_dir))) - len("/") - len("/ssh/") - 16
    state = short_dir / ("s" * padding)
    chosen = control_dir(state)
    assert chosen is not None
    shared = control_path(chosen, host, known_hosts)
    assert (chosen == state / "ssh") is in_state_dir
    if in_state_dir:
        assert len(os.fsencode(str(shared))) == length
    argv = ssh_argv(host, known_hosts_default=known_hosts, control_dir=chosen)
    try:
        done = LocalExecutor().run(argv + ["true"], check=False, timeout=30)
        assert done.returncode == 0, done.error_text
        assert stat.S_ISSOCK(os.stat(shared).st_mode)
    finally:
        close_master(argv)


def _host(**changes):
    from zrepl_py.config.hosts import HostConfig

    return HostConfig(**{"address": "h.example", "port": 22, "user": "root",
                         "identity_file": "/k/id", **changes})


def test_connections_are_shared_only_between_identical_identities_and_host_key_files(tmp_path):
    """Another key, known_hosts file, user, port or trust mode never rides on a master."""
    base = control_path(tmp_path, _host(), tmp_path / "kh")
    assert base == control_path(tmp_path, _host(), tmp_path / "kh")
    others = {
        control_path(tmp_path, _host(identity_file="/k/other"), tmp_path / "kh"),
        control_path(tmp_path, _host(), tmp_path / "other_kh"),
        control_path(tmp_path, _host(user="backup"), tmp_path / "kh"),
        control_path(tmp_path, _host(port=2222), tmp_path / "kh"),
        control_path(tmp_path, _host(trust_on_first_use=True), tmp_path / "kh"),
    }
    assert base not in others and len(others) == 5


def test_a_shared_connection_still_refuses_a_changed_host_key(sshd, sshd_factory, tmp_path):
    """docs/reliability.md#r35-ssh-host-keys: Sharing changes nothing about host keys: the master
    checks them and runs nothing."""
    changed = sshd_factory(known_hosts_from=sshd)
    canary = tmp_path / "ran"
    argv = ssh_argv(changed.host_config(trust_on_first_use=True),
                    known_hosts_default=tmp_path / "kh",
                    control_dir=control_dir(tmp_path / "state"))  # fmt: skip
    try:
        done = LocalExecutor().run(argv + [remote_command(["touch", str(canary)], sudo=False)],
                                   check=False, timeout=30)  # fmt: skip
        assert done.returncode != 0 and "Host key verification failed" in done.error_text
        assert not canary.exists()
    finally:
        close_master(argv)


# --- choosing executors from the config ----------------------------------------------------


def test_executor_for_local_is_a_local_executor_without_sudo(tmp_path):
    """``"local"`` maps to LocalExecutor with no prefix."""
    executor = executor_for(Config(state_dir=tmp_path), "local")
    assert isinstance(executor, LocalExecutor) and executor.prefix == []


def test_executor_for_an_undefined_host_raises_usage_error(tmp_path):
    """A host name missing from [hosts] is a UsageError naming it."""
    with pytest.raises(UsageError, match="nowhere"):
        executor_for(Config(state_dir=tmp_path), "nowhere")


def test_executor_pool_keeps_one_ssh_executor_per_host_and_closes_them(sshd, tmp_path):
    """The pool caches per host, defaults known_hosts to state_dir, and closes on exit."""
    (tmp_path / "known_hosts").write_bytes(sshd.known_hosts.read_bytes())
    config = Config(state_dir=tmp_path, hosts={"backup1": sshd.host_config(known_hosts=None)})
    with ExecutorPool(config) as pool:
        remote = pool.get("backup1")
        assert isinstance(remote, SSHExecutor) and pool.get("backup1") is remote
        assert remote.known_hosts == tmp_path / "known_hosts"
        assert remote.run(["echo", "hi"]).stdout == b"hi\n"
        assert isinstance(pool.get("local"), LocalExecutor)
    assert not remote.connected


# --- ssh_argv ciphers (proc.openssh.data_ciphers) -------------------------------------------


def negotiated_cipher(argv: list[str]) -> str:
    """Run ``true`` with ``argv`` plus ``-v`` and return the client-to-server cipher ssh chose."""
    done = LocalExecutor().run([argv[0], "-v", *argv[1:], "true"], timeout=30)
    for line in done.error_text.splitlines():  # debug1: kex: client->server cipher: NAME MAC: ...
        if "kex: client->server cipher:" in line:
            return line.split("cipher:", 1)[1].split()[0]
    raise AssertionError(f"no cipher in ssh -v output: {done.error_text[-2000:]}")


def test_the_data_path_negotiates_aes_gcm_on_an_aes_cpu_and_falls_back_where_refused(
    sshd, sshd_factory, tmp_path
):
    default = negotiated_cipher(ssh_argv(sshd.host_config(), known_hosts_default=tmp_path / "kh"))
    if not openssh._local_cpu_has_aes():  # zbak leaves ssh its own order: ChaCha20 first
        assert default == "chacha20-poly1305@openssh.com"
        return
    assert default == "aes128-gcm@openssh.com"
    # ssh's own order starts with ChaCha20-Poly1305: what zbak used before choosing
    plain = ssh_argv(sshd.host_config(ciphers=[]), known_hosts_default=tmp_path / "kh")
    assert negotiated_cipher(plain) == "chacha20-poly1305@openssh.com"
    strict = sshd_factory(extra_config=["Ciphers chacha20-poly1305@openssh.com,aes256-ctr"])
    argv = ssh_argv(strict.host_config(), known_hosts_default=tmp_path / "kh")
    assert negotiated_cipher(argv) == "chacha20-poly1305@openssh.com"



def test_a_command_that_ends_before_its_stdin_eof_is_sent_keeps_the_connection(ssh, monkeypatch):
    """paramiko's ``shutdown_write`` sends the EOF after letting go of the channel's lock, so
    the server's CLOSE of a command that has already ended can be answered first, and sshd
    drops the whole connection for the EOF that follows ("ieof packet referred to nonexistent
    channel", paramiko issues #1115 and #1705; seen with 8 ``zfs set`` at once). The EOF is
    held back here until the command has surely ended: the connection must survive."""
    first = ssh.run(["sh", "-c", "echo $SSH_CONNECTION"]).stdout
    transport = ssh.connection.transport()
    send = transport._send_user_message

    def late_eof(message):
        if message.asbytes()[:1] == paramiko.common.cMSG_CHANNEL_EOF:
            time.sleep(0.5)  # `true` ends and the server closes its channel meanwhile
        send(message)

    # The race is inside paramiko's transport, below any executor (docs/reliability.md#in-process-hooks-kept).
    monkeypatch.setattr(transport, "_send_user_message", late_eof)
    assert ssh.run(["true"]).returncode == 0
    time.sleep(0.5)  # what sshd does with a late EOF
    assert ssh.connected
    assert ssh.run(["sh", "-c", "echo $SSH_CONNECTION"]).stdout == first


def test_many_short_commands_at_once_on_one_connection_all_complete(ssh):
    """Eight threads running short commands on one connection, as a tree's batch runs its
    ``zfs set`` commands: a command that ends before its stdin's EOF is sent must not make
    that EOF arrive after the channel's CLOSE (sshd then drops the connection: "ieof packet
    referred to nonexistent channel"; ``ssh._send_eof``)."""
    failures = []

    def worker():
        for _ in range(15):
            try:
                ssh.run(["true"])
            except Exception as exc:  # every failure is the finding
                failures.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert failures == []
