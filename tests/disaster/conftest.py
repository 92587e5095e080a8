"""The disaster tier (docs/design.md#invariants): whole-disaster scenarios on real zfs-fuse
pools, a ``file://`` store and moto's S3 server, driven through the ``zbak`` CLI as an admin
types it: every command is a ``zbak`` process (``support.cli.Zbak``), alerts are seen by a
webhook receiver (``webhook``), and the one in-process run left says why beside it.

Each test loses something for real (the source pool, an object after it was verified, a
volume, the catalog and a manifest pair, a process mid-upload) and then checks that what zbak
promises still holds: every retained snapshot it calls restorable can be brought back, and no
prune takes the last way back. Streams are at least 64 MiB where the size matters (timers
and samplers fire, volumes are many).

Shared here: ``Site`` (a source pool with a dataset of snapshots @0..@N, a state dir, a
config writer and the CLI runner) and the ``webhook`` receiver; the helpers that read
snapshots and their contents come from ``support.cli``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.cli import (  # noqa: F401 (re-exported for the disaster tests)
    Zbak,
    content_of,
    prop,
    restored_content,
    snapshots,
    start_zbak,
    tree_digest,
    zfs,
)
from support.webhook import Webhook

from zrepl_py.errors import ExitStatus
from zrepl_py.objects.layout import PROGRESS

MIB = 1024 * 1024
PACED_VOLUME = 32 * MIB
"""The volume size of the S3 kill tests: four 8 MiB parts (the store's part size)."""
PACED = 'bandwidth_limit = "8MiB"'
"""The store line of the S3 kill tests, beside ``PACED_VOLUME``. ``S3Backend.put`` reads two
parts before it creates the multipart upload (fewer is one PutObject), so with two-part
volumes, or unpaced, the upload is created with every byte at hand and completes a few
requests after a ``kill_when`` condition sees it: a kill lagging behind by that (a loaded
machine) left nothing open. Paced, the last two parts take two more seconds to be read."""


@dataclasses.dataclass
class Site:
    """A source pool with dataset ``data`` (``POOL/data``), zbak's state dir and config.

    Attributes:
        pool: the source pool's name; ``pool_handle`` its test-bed handle.
        data: the dataset archived/replicated.
        mount: where ``data`` is mounted.
        tmp: the test's tmp_path.
        config: the zbak config path (write it with ``write``).
        run: the CLI, a ``zbak`` process per call (``run("archive")`` -> (status, stdout,
            stderr)).
    """

    pool: str
    pool_handle: object
    data: str
    mount: Path
    tmp: Path
    config: Path
    run: Zbak

    def write(self, body: str) -> Path:
        """Write the config: ``state_dir`` first, then ``body`` (TOML, dedented)."""
        self.config.write_text(f'state_dir = "{self.tmp / "state"}"\n' + textwrap.dedent(body))
        return self.config

    def change(self, step: int, size: int = 1 * MIB) -> None:
        """Change the dataset: a new file of ``size`` random bytes, a rewritten note and, from
        step 3 on, the file of step - 3 deleted."""
        with open(self.mount / f"file{step}.bin", "wb") as out:
            out.write(os.urandom(size))
            os.fsync(out.fileno())  # in the pool before the snapshot that must carry it
        (self.mount / "notes.txt").write_text(f"step {step}\n" * (step + 1) * 100)
        if step >= 3:
            (self.mount / f"file{step - 3}.bin").unlink(missing_ok=True)

    def snapshot_steps(self, steps: range, size: int = 1 * MIB) -> None:
        """``change(step)`` then ``zfs snapshot DATA@step`` for each step."""
        for step in steps:
            self.change(step, size)
            zfs("snapshot", f"{self.data}@{step}")

    def ok(self, *args: str) -> str:
        """Run zbak ARGS, assert exit 0, return stdout."""
        status, out, err = self.run(*args)
        assert status == ExitStatus.OK, f"zbak {' '.join(args)} -> {status}: {out}{err}"
        return out

    def kill_when(self, ready: Callable[[], bool], *args: str) -> None:
        """Run zbak ARGS as a process and SIGKILL it as soon as ``ready()`` holds (polled
        every 10 ms); fail when it ends first."""
        proc = start_zbak("--config", str(self.config), *args,
                          env={**self.run.env, "ZBAK_LOG_LEVEL": "WARNING"})
        try:
            deadline = time.monotonic() + 300
            while proc.poll() is None and time.monotonic() < deadline and not ready():
                time.sleep(0.01)
            proc.send_signal(signal.SIGKILL)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == -signal.SIGKILL, f"zbak ended first: {err.decode()}"

    def unfinished_uploads(self) -> list[dict]:
        """The audit's findings about unfinished uploads (``zbak audit --json``)."""
        findings = json.loads(self.run("audit", "--json").out)["findings"]
        return [f for f in findings if f["problem"].startswith("an unfinished upload of ")]


def volume_in_flight(store: Path, stored: int) -> Callable[[], bool]:
    """For ``Site.kill_when``: whether the one stream under the directory ``store`` (a
    ``file://`` store, or an ``sftp://`` store's directory on this machine) has ``stored``
    volumes in its ``progress.json`` and the next one's temporary file beside it."""
    def ready() -> bool:
        for progress in store.rglob(PROGRESS):
            try:
                if len(json.loads(progress.read_bytes())["volumes"]) < stored:
                    return False
            except (OSError, ValueError):
                return False  # replaced under us
            return any(progress.parent.glob(".vol-*.partial-*"))
        return False

    return ready


@pytest.fixture
def webhook():
    """A ``support.webhook.Webhook`` receiving the alerts of the test's zbak processes."""
    hook = Webhook()
    yield hook
    hook.close()


@pytest.fixture
def site(make_pool, tmp_path, capsys) -> Site:
    """A 1 GiB source pool with an empty dataset ``data`` and no config yet (see ``Site``)."""
    return new_site(make_pool, tmp_path, capsys)


def new_site(make_pool, tmp_path, capsys, size: str = "1G") -> Site:
    """``site`` with a pool of ``size`` (a ``truncate -s`` size)."""
    handle = make_pool(size)
    data = f"{handle.name}/data"
    zfs("create", data)
    config = tmp_path / "zbak.toml"
    return Site(handle.name, handle, data, Path(prop(data, "mountpoint")), tmp_path, config,
                Zbak(config, capsys))
