"""Run what ``policy.check`` approved, without a shell, and keep an audit log of every request.

- One command: ``os.execvpe`` (``proc.spawn.exec_replace``) replaces the zbak process, so
  stdin, stdout and stderr are the ssh session's own and no Python stays in the data path.
- A pipeline of two or three commands (``zstd -d | zfs receive``, ``mbuffer | zfs receive``,
  ``zstd -d | mbuffer | zfs receive``, ``zfs send | zstd``): every stage starts with
  ``proc.spawn.popen`` (argv lists), each one's stdout is the next one's stdin (pipes
  between the processes; zbak serve only waits), SIGTERM/SIGHUP/SIGINT received by zbak
  serve are passed on to every stage still running. The exit status is that of the last
  stage that failed (``pipefail``): a ``zfs send`` that dies shows through its zstd, and a
  ``zfs receive`` that fails shows as itself, not as the broken pipe of the mbuffer that
  fed it.
- A real ``zfs send -t TOKEN``: before it runs, a snapshot with the token's ``toguid`` must
  exist at or below the token's dataset (``zfs get -Hp -r -o name,value guid DS``), because
  zfs picks the snapshot by guid (``serve.token``).
- A file verb (``--allow-file-read``) runs inside zbak serve (``serve.files``).
- ``zbak digest SNAP`` (``--allow-drill``) is answered by this process itself: the
  snapshot's file manifest on stdout (``drill.manifest``), its commands run with the
  scrubbed environment below.
- With a floor (``serve.floor``): a destroy or rollback is checked right before it runs and
  a receive or snapshot is witnessed right after (``serve.guard``); such a command runs as a
  child zbak serve waits for, not with exec, so the check's lock is held until zfs exits.

Commands run with a scrubbed environment (``PATH``, ``HOME``, ``USER``, ``LOGNAME``,
``LANG``, ``LC_ALL``, nothing else), so variables a client might pass through sshd
(``AcceptEnv``) reach none of zfs, zstd and mbuffer.

The audit log gets one line per request: ``ALLOWED`` or ``REFUSED`` with the reason, the
client (``$SSH_CLIENT``) and the request (``repr``, so a newline cannot forge a line). It
goes to ``--log FILE`` (appended, created 0600), to syslog (``/dev/log``, facility
``authpriv``, ident ``zbak-serve``) or, without a syslog socket, to
``~/.local/state/zbak/serve.log``; never to stderr: stderr belongs to the zfs command, whose
messages zbak parses on the other end.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import logging.handlers
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn, TextIO

from zrepl_py.errors import CommandRefused, ZbakError
from zrepl_py.proc import spawn
from zrepl_py.runtime.statedir import ensure_private_dir
from zrepl_py.serve.cmdline import split_command_line
from zrepl_py.serve.failover import run_verb
from zrepl_py.serve.floor import floor_action
from zrepl_py.serve.guard import guarded
from zrepl_py.serve.policy import Approved, Policy, check
from zrepl_py.serve.token import TokenTarget
from zrepl_py.zfs.names import SnapshotName

REFUSED = 126
"""Exit status of a refused request (POSIX shells use 126 for "found but cannot execute";
127, "not found", would make zbak's method ``auto`` think the host has no zfs)."""
NOT_FOUND = 127
"""Exit status when the approved program is not installed (as a shell would)."""

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_KEPT_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL")
_LOG_NAME = "zrepl_py.serve.audit"
FALLBACK_LOG = Path(".local/state/zbak/serve.log")
"""The audit log, relative to the home directory, where there is neither ``--log`` nor a
syslog socket (XDG Base Directory spec's state home)."""


def audit_logger(log_file: Path | None, home: str | None = None) -> logging.Logger:
    """Return the audit logger: ``log_file`` (appended, 0600), else syslog, else
    ``FALLBACK_LOG`` below the user's home; never stderr (the zfs command's).

    Args:
        log_file: ``--log FILE``; None logs to syslog through ``/dev/log``, or where the host
            has no syslog socket to ``~/.local/state/zbak/serve.log``
            (docs/decisions.md#zbak-serve-records-every-refusal: every refusal is recorded; it also
            reaches the client's stderr).
        home: the home directory for the fallback (default ``$HOME``).

    Raises:
        OSError: ``log_file`` cannot be opened (a fallback that cannot be opened is skipped).
    """
    logger = logging.getLogger(_LOG_NAME)
    for old in list(logger.handlers):
        logger.removeHandler(old)
        old.close()
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handler: logging.Handler
    if log_file is not None:
        handler = _file_handler(log_file)
    elif os.path.exists("/dev/log"):
        handler = logging.handlers.SysLogHandler(
            "/dev/log", facility=logging.handlers.SysLogHandler.LOG_AUTHPRIV)
        handler.setFormatter(logging.Formatter("zbak-serve[%(process)d]: %(message)s"))
    else:
        try:
            fallback = Path(home or os.path.expanduser("~")) / FALLBACK_LOG
            ensure_private_dir(fallback.parent)
            handler = _file_handler(fallback)
        except (OSError, ZbakError):
            handler = logging.NullHandler()  # the refusal still reaches the client's stderr
    logger.addHandler(handler)
    return logger


def _file_handler(path: Path) -> logging.Handler:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    handler = logging.StreamHandler(os.fdopen(fd, "a", encoding="utf-8", errors="replace"))
    formatter = logging.Formatter("%(asctime)s zbak-serve[%(process)d]: %(message)s",
                                  "%Y-%m-%dT%H:%M:%SZ")  # fmt: skip
    formatter.converter = time.gmtime
    handler.setFormatter(formatter)
    return handler


def clean_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment commands run with: ``_KEPT_ENV`` from ``env``, PATH defaulted."""
    kept = {key: env[key] for key in _KEPT_ENV if key in env}
    kept.setdefault("PATH", DEFAULT_PATH)
    return kept


def decide(request: str | None, policy: Policy) -> Approved:
    """Split and check one request (``$SSH_ORIGINAL_COMMAND``); with a floor, say what the
    floor does around it (``Approved.floor``).

    Raises:
        CommandRefused: see ``cmdline.split_command_line``, ``policy.check`` and
            ``floor.floor_action``.
    """
    commands = split_command_line(request)
    approved = check(commands, policy)
    if policy.floor is None or commands[-1][0] not in ("zfs", policy.zfs):
        return approved
    return dataclasses.replace(approved, floor=floor_action(commands[-1]))


def serve(
    request: str | None,
    policy: Policy,
    *,
    log: logging.Logger,
    env: Mapping[str, str],
    stderr: TextIO | None = None,
) -> int:
    """Run one request if the policy allows it; return the exit status otherwise.

    For an allowed single command this does not return (the process becomes the command).

    Args:
        request: ``$SSH_ORIGINAL_COMMAND``, None for a login without a command.
        policy: what is allowed.
        log: from ``audit_logger``.
        env: the process environment (for ``$SSH_CLIENT`` and ``clean_env``).
        stderr: where a refusal is explained to the client (default ``sys.stderr``).

    Returns:
        ``REFUSED`` (126), ``NOT_FOUND`` (127), or a pipeline's exit status.
    """
    stderr = stderr or sys.stderr
    client = env.get("SSH_CLIENT", "local").split(" ")[0]
    around = contextlib.ExitStack()
    try:
        approved = decide(request, policy)
        if approved.token is not None:
            check_token_guid(approved.token, policy, clean_env(env))
        if approved.floor is not None and policy.floor is not None:
            around.enter_context(guarded(approved.floor, policy.floor, policy.zfs,
                                         clean_env(env), log))
    except CommandRefused as exc:
        return _refused(exc, client, request, log, stderr)
    with around:
        log.info("ALLOWED from %s: %r", client, request)
        for handler in log.handlers:
            handler.flush()
        if approved.files is not None:
            # Loaded here: a refused command loads no zfs client (docs/design.md#security).
            from zrepl_py.serve.files import run_files

            return run_files(approved.files, policy.zfs, clean_env(env), stderr=stderr)
        if approved.verb is not None:
            try:
                return run_verb(approved.verb, policy, clean_env(env), stderr=stderr)
            except CommandRefused as exc:  # what the dataset or the path says when it runs
                return _refused(exc, client, request, log, stderr)
        if approved.digest is not None:
            return digest(approved.digest, policy, clean_env(env), stderr=stderr)
        return run(approved.argvs, clean_env(env), stderr=stderr,
                   replace=approved.floor is None)


def _refused(exc: CommandRefused, client: str, request: str | None, log: logging.Logger,
             stderr: TextIO) -> int:
    """Log and tell the client a refusal; return ``REFUSED``."""
    # Printable ASCII only: a request may hold any byte (surrogate escapes), and a
    # message must not break the log line or its encoder.
    reason = str(exc).encode("ascii", "backslashreplace").decode("ascii")
    reason = "".join(c if c.isprintable() else repr(c)[1:-1] for c in reason)
    log.warning("REFUSED from %s: %s; request: %r", client, reason, request)
    print(f"zbak serve: refused: {reason}", file=stderr, flush=True)
    return REFUSED
def digest(snapshot: SnapshotName, policy: Policy, env: Mapping[str, str], *,
           stderr: TextIO) -> int:
    """Print ``snapshot``'s file manifest (``drill.manifest``) as ``zbak digest`` would, the
    commands it runs (``zfs``, ``mktemp``, ``rmdir``) with ``env`` only; return 0, or 1 with
    the error on ``stderr``."""
    from zrepl_py.drill.manifest import print_manifest
    from zrepl_py.proc.local import LocalExecutor
    from zrepl_py.zfs.client import Zfs

    os.environ.clear()  # the children start from this process's environment (proc.spawn)
    os.environ.update(env)
    try:
        print_manifest(Zfs(LocalExecutor(), zfs=policy.zfs), snapshot, sys.stdout)
    except ZbakError as exc:
        print(f"zbak serve: {exc}", file=stderr, flush=True)
        return 1
    return 0


def check_token_guid(token: TokenTarget, policy: Policy, env: Mapping[str, str]) -> None:
    """Require a snapshot with ``token.toguid`` at or below the token's dataset.

    Raises:
        CommandRefused: none there (or it cannot be listed): zfs would look for the guid
            in ever larger ancestors, outside the root.
    """
    # `zfs get -r` lists snapshots too (its default types include them) and, unlike
    # `list -p` and `get -t`, exists in every zfs zbak supports.
    argv = [policy.zfs, "get", "-H", "-p", "-r", "-o", "name,value", "guid",
            token.toname.dataset]  # fmt: skip
    try:
        done = spawn.run(argv, env=env, stdin=spawn.DEVNULL,
                              capture_output=True, timeout=120, check=False)  # fmt: skip
    except (OSError, spawn.TimeoutExpired) as exc:
        raise CommandRefused(f"cannot check the resume token's snapshot: {exc}") from None
    guids = {value.strip() for name, _, value in
             (line.partition("\t") for line in done.stdout.decode("utf-8", "replace").split("\n"))
             if "@" in name}
    if done.returncode != 0 or str(token.toguid) not in guids:
        raise CommandRefused(f"the resume token's snapshot (guid {token.toguid}) is not in "
                             f"{token.toname.dataset}")


def run(argvs: Sequence[Sequence[str]], env: Mapping[str, str], *, stderr: TextIO,
        replace: bool = True) -> int:
    """Execute one command (exec, never returns unless it cannot start) or a pipeline; with
    ``replace`` False a single command runs as a child too, and its status is returned."""
    if len(argvs) == 1 and replace:
        argv = list(argvs[0])
        # Python ignores SIGPIPE and an ignored signal stays ignored across exec: give zfs
        # the default back, as a shell would (subprocess does the same, restore_signals).
        for name in ("SIGPIPE", "SIGXFSZ"):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
        try:
            spawn.exec_replace(argv, env)
        except OSError as exc:
            print(f"zbak serve: {argv[0]}: {exc.strerror}", file=stderr, flush=True)
            return NOT_FOUND
    return _pipeline(argvs, env, stderr=stderr)


def _pipeline(argvs: Sequence[Sequence[str]], env: Mapping[str, str], *, stderr: TextIO) -> int:
    """Run ``argvs`` (one or more) as a pipeline without a shell; return its pipefail status
    (see the module doc), ``NOT_FOUND`` when a stage cannot start."""
    procs: list[spawn.Popen[bytes]] = []
    previous = None
    try:
        for index, argv in enumerate(argvs):
            last = index == len(argvs) - 1
            procs.append(spawn.popen(
                argv, stdin=previous, stdout=None if last else spawn.PIPE,
                env=env, close_fds=True,
            ))  # fmt: skip
            if previous is not None:
                previous.close()
            previous = procs[-1].stdout
    except OSError as exc:
        print(f"zbak serve: {exc.filename or argv[0]}: {exc.strerror}", file=stderr, flush=True)
        for proc in procs:
            proc.kill()
            proc.wait()
        return NOT_FOUND

    def forward(signum: int, _frame: object) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, forward)
    statuses = [proc.wait() for proc in procs]
    failed = [s for s in statuses if s != 0]
    if not failed:
        return 0
    status = failed[-1]
    return 128 - status if status < 0 else status


def exit_now(status: int) -> NoReturn:
    """Leave with ``status`` (what the ssh client sees as the remote exit status)."""
    sys.stdout.flush()
    sys.stderr.flush()
    raise SystemExit(status)
