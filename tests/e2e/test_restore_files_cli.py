"""``zbak restore --path ... --into-dir DIR`` and ``zbak find`` as the admin types them (a real
``zbak`` process), on real zfs-fuse pools: from the local snapshot (zfs-fuse has no
``.zfs/snapshot``: a temporary clone), from a replica through ``zbak serve --allow-file-read``
behind the real sshd, from archive chains in a file:// store and in moto's S3 (received into
``[restore] scratch``), and after a SIGKILL at each of the archive path's steps
(docs/files.md, docs/decisions.md#restored-files-are-checked-like-a-hostile-archive).

Every restored tree is compared with the snapshot's own files, read through a clone: mode
(setuid and setgid bits), numeric owner, mtime, content, symlink targets, hard links.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.cli import ZBAK_TIMEOUT, prop, run_zbak, snapshots, zfs
from support.common import hosts_table
from support.files import NEWLINE, hard_linked, populate, snapshot_state, tree_state, views_left
from support.served import served_pools

pytestmark = pytest.mark.zfs

ZBAK = Path(sys.executable).with_name("zbak")
SCRATCH_CHILD = "zbak-files-"


class Rig:
    """A source pool with ``SRC/data`` at @1 and @2 (``support.files.populate``), a config
    with job ``data`` (``extra`` TOML appended) and an initialised catalog."""

    def __init__(self, pool, tmp_path: Path, extra: str = "", *, data: str | None = None):
        self.pool = pool
        self.data = data or f"{pool.name}/data"
        if data is None:
            zfs("create", self.data)
        self.mount = Path(prop(self.data, "mountpoint"))
        for version in (1, 2):
            populate(self.mount, version)
            zfs("snapshot", f"{self.data}@{version}")
        self.tmp = tmp_path
        self.config = tmp_path / "zbak.toml"
        self.config.write_text(f'state_dir = "{tmp_path / "state"}"\n' + textwrap.dedent(extra)
                               + f'\n[jobs.data]\ndataset = "{self.data}"\n')
        assert self.zbak("init", "--no-checks")[0] == 0

    def zbak(self, *args: str) -> tuple[int, str, str]:
        return run_zbak("--config", str(self.config), *args)

    def restore(self, snap: str, *paths: str, into: Path, extra: tuple[str, ...] = ()):
        argv = ["restore", self.data, "--to", snap, "--into-dir", str(into), "--yes", *extra]
        for path in paths:
            argv += ["--path", path]
        return self.zbak(*argv)


@pytest.fixture
def rig(zpool, tmp_path) -> Rig:
    return Rig(zpool, tmp_path)


def test_files_come_back_from_a_local_snapshot_through_a_temporary_clone(rig):
    out = rig.tmp / "out"
    assert killed(rig, "extract", "restore", rig.data, "--to", "@1", "--path", "home",
                  "--into-dir", str(out), "--yes") == -signal.SIGKILL
    assert len(views_left(rig.pool.name)) == 1  # the killed run's clone, still mounted
    status, stdout, err = rig.restore("@1", "home", into=out)
    assert status == 0, stdout + err
    assert "left by a run that is gone" in err
    assert tree_state(out, "home") == snapshot_state(f"{rig.data}@1", "home")
    assert tree_state(out, "home") != snapshot_state(f"{rig.data}@2", "home")
    assert hard_linked(out / "home" / "alice", "notes.txt", "hard")
    assert os.lstat(out / "home" / "tool").st_mode & 0o7777 == 0o4750
    assert os.readlink(out / "home" / "alice" / "link") == "notes.txt"
    assert "through temporary clone" in err and views_left(rig.pool.name) == []
    assert f"into {out}" in stdout and "from local" in stdout


def test_a_path_outside_the_dataset_is_refused_before_anything_is_read(rig):
    out = rig.tmp / "out"
    for path in ("../x", "/etc/passwd", "home/../../x", ""):
        status, stdout, err = rig.restore("@1", path, into=out)
        assert status == 2, (path, stdout + err)
        assert len(err.strip().splitlines()) == 1 and "--path" in err
        assert not out.exists()
    status, stdout, err = rig.restore("@1", "a/", into=out)  # relative, but not there
    assert status == 1 and "'a' is not in @1" in err and "nothing was read" in err


def test_links_that_lead_out_are_refused_and_the_rest_of_the_directory_is_restored(rig):
    out = rig.tmp / "box" / "out"
    out.parent.mkdir()
    status, stdout, err = rig.restore("@1", "trap", into=out)
    assert status == 1
    refused = [line for line in err.splitlines() if line.startswith("not restored:")]
    assert len(refused) == 2 and "'trap/passwd'" in err and "'trap/up'" in err
    assert sorted(os.listdir(out / "trap")) == ["plain"]
    assert sorted(os.listdir(out.parent)) == ["out"]
    status, stdout, err = rig.restore("@1", "trap/up/etc/passwd", into=rig.tmp / "out2")
    assert status == 1 and "reached through 'trap/up', a symlink -> ../../.." in err
    assert not (rig.tmp / "out2" / "trap").exists()


def test_a_name_with_a_newline_is_restored_byte_for_byte_and_shown_on_one_line(rig):
    out = rig.tmp / "out"
    status, stdout, err = rig.restore("@2", f"home/{NEWLINE}", into=out)
    assert status == 0, stdout + err
    assert (out / "home" / NEWLINE).read_bytes() == b"odd name 2"
    assert "'home/new\\nline'" in stdout


def test_an_existing_file_is_replaced_only_with_overwrite(rig):
    out = rig.tmp / "out"
    assert rig.restore("@1", "home/alice", into=out)[0] == 0
    (out / "home" / "alice" / "notes.txt").write_bytes(b"edited since")
    status, stdout, err = rig.restore("@1", "home/alice", into=out)
    assert status == 1 and "--overwrite" in err and "nothing was read" in err
    assert (out / "home" / "alice" / "notes.txt").read_bytes() == b"edited since"
    status, stdout, err = rig.restore("@1", "home/alice", into=out, extra=("--overwrite",))
    assert status == 0, stdout + err
    assert tree_state(out, "home/alice") == snapshot_state(f"{rig.data}@1", "home/alice")


def test_zbak_find_lists_every_version_of_a_file_oldest_first(rig):
    zfs("snapshot", f"{rig.data}@3")  # notes.txt unchanged since @2
    (rig.mount / "home" / "alice" / "notes.txt").unlink()
    (rig.mount / "home" / "alice" / "hard").unlink()
    zfs("snapshot", f"{rig.data}@4")
    status, stdout, err = rig.zbak("find", rig.data, "home/alice/notes.txt", "--json")
    assert status == 0, stdout + err
    rows = json.loads(stdout)["versions"]
    assert [(r["snapshot"], r["version"], r["kind"]) for r in rows] == [
        ("1", 1, "file"), ("2", 2, "file"), ("3", 2, "file"), ("4", 0, "absent")]
    assert rows[0]["size"] == len(b"version 1\n" * 5000)
    assert rows[1]["sha256"] == rows[2]["sha256"] != rows[0]["sha256"]
    assert all(r["where"] == [f"local:{rig.data}"] for r in rows)
    assert views_left(rig.pool.name) == []
    status, stdout, err = rig.zbak("find", rig.data, "home/alice/notes.txt")
    assert status == 0 and "@2 .. @3 (2)" in stdout and "absent" in stdout


class Served:
    """``Rig`` whose dataset replicates to ``backup:BAK/replicas/data`` through
    ``zbak serve --root BAK/replicas --allow-file-read`` as the sshd's forced command; a
    second sshd serves the same root without the flag (``without_flag``: a config whose
    ``[hosts.backup]`` is that one)."""

    def __init__(self, make_pool, sshd_factory, tmp_path: Path):
        pools = served_pools(make_pool)
        self.log = tmp_path / "serve.log"

        def server(options: str):
            return sshd_factory(forced_command=f"{ZBAK} serve --root {pools.root} --log"
                                               f" {self.log} {options}").host_config()

        reader, plain = server("--allow-file-read"), server("")
        self.bak, self.replica = pools.bak, pools.replica
        hosts = hosts_table("backup", reader, connect_timeout=10)
        self.rig = Rig(pools.src, tmp_path, hosts, data=pools.data)
        with open(self.rig.config, "a") as config:
            config.write(f'[jobs.data.replicate]\ntargets = ["backup:{self.replica}"]\n')
        self.without_flag = tmp_path / "without-flag.toml"
        self.without_flag.write_text(self.rig.config.read_text().replace(
            hosts, hosts_table("backup", plain, connect_timeout=10)))
        status, out, err = self.rig.zbak("replicate")
        assert status == 0, out + err


def test_files_and_versions_come_back_from_a_replica_through_zbak_serve(make_pool, sshd_factory,
                                                                        tmp_path):
    served = Served(make_pool, sshd_factory, tmp_path)
    rig = served.rig
    zfs("destroy", f"{rig.data}@1")  # gone from the source: only the replica has it
    zfs("snapshot", f"{rig.data}@3")
    out = tmp_path / "out"
    status, stdout, err = rig.restore("@1", "home", f"home/{NEWLINE}", into=out)
    assert status == 0, stdout + err
    assert "from replica backup" in stdout
    assert tree_state(out, "home") == snapshot_state(f"{served.replica}@1", "home")
    assert hard_linked(out / "home" / "alice", "notes.txt", "hard")
    status, stdout, err = rig.restore("@1", "home/nothere", into=tmp_path / "out2",
                                      extra=("--from", "backup"))
    assert status == 1 and "'home/nothere' is not in @1" in err
    assert not (tmp_path / "out2" / "home").exists()

    status, stdout, err = rig.zbak("find", rig.data, "trap/plain", "--json")
    assert status == 0, stdout + err
    rows = json.loads(stdout)["versions"]
    local, backup = f"local:{rig.data}", f"backup:{served.replica}"
    assert [(r["snapshot"], r["where"]) for r in rows] == [
        ("1", [backup]), ("2", [local, backup]), ("3", [local])]
    assert [r["version"] for r in rows] == [1, 1, 1]  # written once, before @1
    assert views_left(served.bak.name) == [] and views_left(rig.pool.name) == []
    log = served.log.read_text().replace("'", "")
    assert "zbak-files read" in log and "zbak-files versions" in log and "zfs clone" not in log

    status, stdout, err = run_zbak("--config", str(served.without_flag), "restore", rig.data, "--to",
                                           "@1", "--path", "home", "--into-dir",
                                           str(tmp_path / "out3"), "--yes")
    assert status == 1
    assert "--allow-file-read" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out3" / "home").exists()


def file_store(tmp_path: Path) -> str:
    """``[stores.cold]`` in a new directory ``tmp_path/store``."""
    store = tmp_path / "store"
    store.mkdir(mode=0o700)
    return f'[stores.cold]\nurl = "file://{store}"\n'


def archive_rig(pool, tmp_path: Path, store: str) -> Rig:
    scratch = f"{pool.name}/scratch"
    zfs("create", scratch)
    rig = Rig(pool, tmp_path, f'[restore]\nscratch = "{scratch}"\n{store}')
    with open(rig.config, "a") as config:
        config.write('[jobs.data.archive]\nstore = "cold"\n')
    status, out, err = rig.zbak("archive")
    assert status == 0, out + err
    rig.scratch = scratch  # type: ignore[attr-defined]
    return rig


def scratch_children(rig: Rig) -> list[str]:
    out = zfs("list", "-H", "-o", "name", "-r", rig.scratch)  # type: ignore[attr-defined]
    return [n for n in out.split() if SCRATCH_CHILD in n]


def test_files_come_back_from_a_file_store_through_the_scratch_dataset(zpool, tmp_path):
    rig = archive_rig(zpool, tmp_path, file_store(tmp_path))
    out = tmp_path / "out"
    no_scratch = tmp_path / "no-scratch.toml"
    no_scratch.write_text(rig.config.read_text().replace(
        f'[restore]\nscratch = "{rig.scratch}"\n', ""))  # type: ignore[attr-defined]
    status, stdout, err = run_zbak("--config", str(no_scratch), "restore", rig.data, "--to", "@1",
                                           "--path", "home", "--into-dir", str(out),
                                           "--from", "cold", "--yes")
    assert status == 1 and "[restore] scratch" in err and str(no_scratch) in err
    status, stdout, err = rig.zbak("restore", rig.data, "--to", "@1", "--path", "home",
                                   "--into-dir", str(out), "--from", "cold", "--dry-run")
    assert status == 0 and "receive full @1" in stdout and "no thaw needed" in stdout
    assert not (out / "home").exists() and scratch_children(rig) == []
    status, stdout, err = rig.restore("@1", "home/nothere", into=out, extra=("--from", "cold"))
    assert status == 1 and "'home/nothere' is not in @1" in err
    assert scratch_children(rig) == [] and views_left(zpool.name) == []  # received, destroyed
    status, stdout, err = rig.restore("@1", "home", into=out, extra=("--from", "cold"))
    assert status == 0, stdout + err
    assert tree_state(out, "home") == snapshot_state(f"{rig.data}@1", "home")
    assert scratch_children(rig) == [] and views_left(zpool.name) == []


def test_files_come_back_from_glacier_in_s3_after_the_thaw(zpool, tmp_path, s3_server, s3_bucket):
    rig = archive_rig(zpool, tmp_path, textwrap.dedent(f"""
        [stores.cold]
        url = "s3://{s3_bucket}/zbak"
        endpoint = "{s3_server.endpoint_url}"
        region = "us-east-1"
        storage_class = {{ full = "GLACIER", incremental = "GLACIER" }}
    """))
    out = tmp_path / "out"
    status, stdout, err = rig.zbak("restore", rig.data, "--to", "@2", "--path", "home/alice",
                                   "--into-dir", str(out), "--from", "cold", "--dry-run")
    assert status == 0 and "thaw 2 object(s)" in stdout, stdout + err
    assert "in retrieval fees" in stdout and "receive full @1" in stdout  # cost, what is received
    status, stdout, err = rig.restore("@2", "home/alice", into=out, extra=("--from", "cold"))
    assert status == 75 and "run the same restore again" in err
    assert scratch_children(rig) == [] and not (out / "home").exists()
    status, stdout, err = rig.restore("@2", "home/alice", into=out, extra=("--from", "cold"))
    assert status == 0, stdout + err
    assert tree_state(out, "home/alice") == snapshot_state(f"{rig.data}@2", "home/alice")
    assert scratch_children(rig) == [] and views_left(zpool.name) == []


KILLER = textwrap.dedent("""
    import os, signal, sys
    import zrepl_py.files.restore as files_restore
    import zrepl_py.restore.execute as execute
    where = os.environ["KILL_AT"]

    def die(*_a, **_k):
        os.kill(os.getpid(), signal.SIGKILL)

    if where == "extract":
        files_restore.extract = die
    else:  # after the first stream was received and marked
        mark = execute._mark
        def marked(zfs, plan, value):
            mark(zfs, plan, value)
            if value is not None:
                die()
        execute._mark = marked
    from zrepl_py.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def killed(rig: Rig, at: str, *args: str) -> int:
    done = subprocess.run([sys.executable, "-c", KILLER, "--config", str(rig.config), *args],
                          env={**os.environ, "KILL_AT": at}, capture_output=True, text=True,
                          timeout=ZBAK_TIMEOUT)
    return done.returncode


def test_what_a_killed_restore_left_is_removed_by_the_next_or_read_by_its_rerun(zpool,
                                                                               tmp_path):
    rig = archive_rig(zpool, tmp_path, file_store(tmp_path))
    out = tmp_path / "out"
    args = ("restore", rig.data, "--to", "@1", "--path", "home", "--into-dir", str(out),
            "--from", "cold", "--yes")
    assert killed(rig, "extract", *args) == -signal.SIGKILL
    assert len(scratch_children(rig)) == 1 and len(views_left(zpool.name)) == 1
    status, stdout, err = rig.restore("@2", "home/tool", into=tmp_path / "other",
                                      extra=("--from", "cold"))
    assert status == 0, stdout + err
    assert "left by a file restore that was interrupted" in err
    assert scratch_children(rig) == [] and views_left(zpool.name) == []

    assert killed(rig, "extract", *args) == -signal.SIGKILL
    assert len(scratch_children(rig)) == 1 and len(views_left(zpool.name)) == 1
    status, stdout, err = rig.zbak(*args)
    assert status == 0, stdout + err
    assert "(received before)" in stdout  # the scratch held @1: nothing received again
    assert tree_state(out, "home") == snapshot_state(f"{rig.data}@1", "home")
    assert scratch_children(rig) == [] and views_left(zpool.name) == []


def test_a_restore_killed_after_its_first_stream_continues_with_the_rest(zpool, tmp_path):
    rig = archive_rig(zpool, tmp_path, file_store(tmp_path))
    out = tmp_path / "out"
    args = ("restore", rig.data, "--to", "@2", "--path", "home", "--into-dir", str(out),
            "--from", "cold", "--yes")
    assert killed(rig, "mark", *args) == -signal.SIGKILL
    [child] = scratch_children(rig)
    assert snapshots(child) == ["1"]
    status, stdout, err = rig.zbak(*args)
    assert status == 0, stdout + err
    assert "holds the first 1 stream(s)" in stdout
    assert tree_state(out, "home") == snapshot_state(f"{rig.data}@2", "home")
    assert scratch_children(rig) == []
