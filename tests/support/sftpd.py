"""An SFTP-only server, as a storage box offers one: the test sshd (``support.sshd``) with a
user that gets nothing but OpenSSH's ``internal-sftp``, chrooted, one per test session.

Recipe (docs/testbed.md#an-sftp-only-server): a system user ``zbak-sftp`` (no home, shell
``/usr/sbin/nologin``, password field ``*``: no password, and not locked, which sshd without
PAM refuses), and in the sshd_config

    Subsystem sftp internal-sftp
    Match User zbak-sftp
        AuthorizedKeysFile KEYS      # readable by the user: sshd reads it as the user
        ChrootDirectory DIR          # DIR and every parent owned by root, not group/world
                                     # writable (sshd refuses the login otherwise)
        ForceCommand internal-sftp   # an exec request gets "This service allows sftp
                                     # connections only." and exit status 1
        AllowTcpForwarding no
        X11Forwarding no
        PermitTTY no

``DIR`` lives under ``/srv/zbak-test-sftp`` (``/tmp`` is world-writable, so no chroot can be
below it); the user may write in ``DIR/home`` only. Tests that use ``sftpd`` or ``sftp_dir``
get the ``ssh`` marker.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.common import unavailable
from support.sshd import SshServer, _Sshd

SFTP_USER = "zbak-sftp"
BASE = Path("/srv/zbak-test-sftp")
HOME = "/home"
"""The directory of the chroot the user may write in, as its SFTP session sees it."""
_FIXTURES = {"sftpd", "sftp_dir"}


@dataclasses.dataclass(frozen=True)
class SftpServer:
    """A running SFTP-only sshd and the client-side files that reach it.

    Attributes:
        ssh: the server as an ``SshServer`` whose ``user`` is the SFTP-only user.
        chroot: the chroot directory on this machine (root-owned); the session's ``/``.
    """

    ssh: SshServer
    chroot: Path

    def local(self, path: str) -> Path:
        """This machine's path of ``path`` as the SFTP session sees it."""
        return self.chroot / path.lstrip("/")

    def host_config(self, **overrides: object):
        """A ``HostConfig`` for the SFTP-only user (see ``SshServer.host_config``)."""
        return self.ssh.host_config(**overrides)

    def fresh(self, name: str) -> str:
        """A new empty directory of the user's under ``/home``; its SFTP path."""
        where = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.local(HOME)))
        user = pwd.getpwnam(SFTP_USER)
        os.chown(where, user.pw_uid, user.pw_gid)
        return f"{HOME}/{where.name}"


def ensure_user() -> pwd.struct_passwd:
    """The SFTP-only user, created if missing (``scripts/setup-host.sh`` creates it too).

    Raises (through ``unavailable``): it cannot be created (not root).
    """
    try:
        return pwd.getpwnam(SFTP_USER)
    except KeyError:
        pass
    done = subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", "/",
                           "--shell", "/usr/sbin/nologin", "--password", "*", SFTP_USER],
                          capture_output=True, text=True)
    try:
        return pwd.getpwnam(SFTP_USER)  # made by this call, or by a session running meanwhile
    except KeyError:
        unavailable("sftp", f"cannot create the user {SFTP_USER}: {done.stderr.strip()}")
        raise


def _root_dir(path: Path) -> None:
    path.mkdir(mode=0o755, exist_ok=True)
    os.chown(path, 0, 0)
    os.chmod(path, 0o755)


@contextlib.contextmanager
def sftp_server(workdir: Path, user_key: Path) -> Iterator[SftpServer]:
    """Start an SFTP-only sshd (see the module docstring) whose files live in ``workdir``,
    for the user key ``user_key`` (``.pub`` beside it); stop it and remove its chroot at the
    end. Used by the ``sftpd`` fixture and by ``benchmarks/sftp_store.py``.

    Raises (through ``unavailable``): not root, the user cannot be created, sshd fails.
    """
    if os.geteuid() != 0:
        unavailable("sftp", "the chrooted SFTP user needs a root-owned directory: run as root")
    user = ensure_user()
    _root_dir(BASE)
    top = Path(tempfile.mkdtemp(prefix="session-", dir=BASE))
    try:
        _root_dir(top)
        chroot = top / "chroot"
        _root_dir(chroot)
        home = chroot / HOME.lstrip("/")
        home.mkdir(mode=0o700)
        os.chown(home, user.pw_uid, user.pw_gid)
        keys = top / "authorized_keys"
        keys.write_text(user_key.with_name(user_key.name + ".pub").read_text())
        os.chmod(keys, 0o644)
        server = _Sshd(workdir, user_key)
        try:
            ssh = server.start(extra_config=[
                "Subsystem sftp internal-sftp",
                f"Match User {SFTP_USER}",
                f'    AuthorizedKeysFile "{keys}"',
                f'    ChrootDirectory "{chroot}"',
                "    ForceCommand internal-sftp",
                "    AllowTcpForwarding no",
                "    X11Forwarding no",
                "    PermitTTY no",
            ])
            yield SftpServer(dataclasses.replace(ssh, user=SFTP_USER), chroot)
        finally:
            server.stop()
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture(scope="session")
def sftpd(tmp_path_factory, ssh_user_key) -> Iterator[SftpServer]:
    """The session's SFTP-only server (see the module docstring); stopped and its chroot
    removed when the session ends."""
    with sftp_server(tmp_path_factory.mktemp("sftpd"), ssh_user_key) as server:
        yield server


@pytest.fixture
def sftp_dir(sftpd) -> str:
    """A fresh empty directory of the SFTP user's, as its session sees it
    (``/home/test-XXXXXXXX``)."""
    return sftpd.fresh("test")


def pytest_collection_modifyitems(config, items) -> None:
    """Mark every test that uses an SFTP fixture with ``ssh``."""
    for item in items:
        if _FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.ssh)
