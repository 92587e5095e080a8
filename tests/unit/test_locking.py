"""Per-dataset locks: exclusive across processes, released when the holder dies, private files."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap

import pytest

from zrepl_py.errors import Locked
from zrepl_py.locking import dataset_lock, lock_path


def test_a_second_holder_of_the_same_dataset_fails_fast_with_locked(tmp_path):
    with dataset_lock(tmp_path, "local:tank/a", "replicate"):
        with pytest.raises(Locked, match="replicate"):
            with dataset_lock(tmp_path, "local:tank/a", "snapshot"):
                pass


def test_different_datasets_lock_independently(tmp_path):
    with dataset_lock(tmp_path, "local:tank/a", "x"):
        with dataset_lock(tmp_path, "local:tank/b", "y"):
            pass


def test_a_lock_held_by_a_killed_process_is_free_again(tmp_path):
    code = textwrap.dedent(f"""
        import sys, time
        from zrepl_py.locking import dataset_lock
        with dataset_lock(__import__('pathlib').Path({str(tmp_path)!r}), 'local:tank/a', 'x'):
            print('held', flush=True)
            time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    with pytest.raises(Locked, match=f"pid {proc.pid}"):
        with dataset_lock(tmp_path, "local:tank/a", "y"):
            pass
    proc.kill()
    proc.wait()
    with dataset_lock(tmp_path, "local:tank/a", "y"):
        pass


def test_lock_files_are_0600_in_a_0700_directory_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        with dataset_lock(tmp_path / "state", "local:tank/a", "x"):
            pass
    finally:
        os.umask(old)
    path = lock_path(tmp_path / "state", "local:tank/a")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
