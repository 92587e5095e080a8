"""``files.extract`` on real tar streams and a real file system
(docs/decisions.md#restored-files-are-checked-like-a-hostile-archive).

Two kinds of stream: the one zbak gets in production, GNU tar's (``snapshot_files.tar_argv``)
of a tree on this machine, which must come back equal (content, mode with setuid bits,
numeric owner, mtime to the nanosecond, symlinks, hard links, binary extended attributes);
and hostile streams made member by member with ``tarfile`` (what a compromised backup host
could send), of which nothing may land outside DIR.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest
from support.files import rich_tree, tree_state

from zrepl_py.errors import RestoreError
from zrepl_py.files.extract import ExtractError, extract, prepare_directory
from zrepl_py.files.snapshot_files import tar_argv


def inodes(root: Path, *names: str) -> set[int]:
    return {os.lstat(root / n).st_ino for n in names}


@pytest.fixture
def source(tmp_path) -> Path:
    """A tree with everything a restore keeps (``support.files.rich_tree``)."""
    root = tmp_path / "src"
    rich_tree(root)
    return root


def gnu_tar(root: Path, paths: list[str]) -> io.BytesIO:
    done = subprocess.run(tar_argv(str(root), paths), capture_output=True, check=True)
    return io.BytesIO(done.stdout)


def test_gnu_tar_s_stream_comes_back_equal_to_the_tree(source, tmp_path):
    into = Path(prepare_directory(str(tmp_path / "out"), ["home"], overwrite=False))
    done = extract(gnu_tar(source, ["home"]), str(into), ["home"], overwrite=False)
    assert done.refused == [] and done.warnings == []
    assert tree_state(into) == tree_state(source)
    assert len(inodes(into / "home" / "alice", "notes.txt", "hard")) == 1
    assert done.bytes == 11000 + 10 + 8  # notes once (hard is a link), tool, the odd name


def test_only_the_requested_paths_are_written(source, tmp_path):
    into = tmp_path / "out"
    into.mkdir()
    stream = gnu_tar(source, ["home"])
    done = extract(stream, str(into), ["home/alice"], overwrite=False)
    assert sorted(p.name for p in (into / "home").iterdir()) == ["alice"]
    assert any("outside the requested paths" in r for r in done.refused)


def hostile(*members: tuple[tarfile.TarInfo, bytes]) -> io.BytesIO:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for info, data in members:
            archive.addfile(info, io.BytesIO(data) if data else None)
    out.seek(0)
    return out


def member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", link: str = "",
           mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode, info.size = kind, link, mode, len(data)
    return info, data


def test_nothing_of_a_hostile_stream_lands_outside_the_directory(tmp_path):
    into = tmp_path / "box" / "out"
    into.mkdir(parents=True)
    outside = tmp_path / "box"
    stream = hostile(
        member("../escaped", data=b"x"),
        member("/abs-escaped", data=b"x"),
        member("a/../../escaped2", data=b"x"),
        member("a/up", tarfile.SYMTYPE, link="../.."),
        member("a/up/escaped3", data=b"x"),
        member("a/etc", tarfile.SYMTYPE, link="/etc"),
        member("a/etc/zbak-canary", data=b"x"),
        member("a/hard", tarfile.LNKTYPE, link="../../escaped4"),
        member("a/dev", tarfile.CHRTYPE),
        member("a/fifo", tarfile.FIFOTYPE),
        member("a/ok", data=b"fine"),
        member("a/inside", tarfile.SYMTYPE, link="ok"),
    )
    done = extract(stream, str(into), ["a", ".."], overwrite=False)
    assert sorted(os.listdir(outside)) == ["out"]
    assert not Path("/etc/zbak-canary").exists() and not Path("/abs-escaped").exists()
    # The refused symlinks' names became plain directories for the members below them.
    assert sorted(os.listdir(into / "a")) == ["etc", "inside", "ok", "up"]
    assert not (into / "a" / "up").is_symlink() and not (into / "a" / "etc").is_symlink()
    for path in into.rglob("*"):
        assert str(path.resolve()).startswith(str(into.resolve()) + "/")
    assert (into / "a" / "inside").read_bytes() == b"fine"
    assert len(done.refused) == 8
    for line in done.refused:
        assert "\n" not in line


def test_a_symlink_already_in_the_directory_is_never_written_through(tmp_path):
    into = tmp_path / "out"
    (into / "a").mkdir(parents=True)
    target = tmp_path / "victim"
    target.write_bytes(b"keep me")
    os.symlink(tmp_path, into / "a" / "dir")
    os.symlink(target, into / "a" / "file")
    done = extract(hostile(member("a/dir/victim", data=b"evil"), member("a/file", data=b"evil")),
                   str(into), ["a"], overwrite=True)
    assert target.read_bytes() == b"keep me"
    assert (into / "a" / "file").read_bytes() == b"evil" and not (into / "a" / "file").is_symlink()
    assert len(done.refused) == 1 and "leads out" in done.refused[0]


def test_an_existing_file_is_kept_without_overwrite_and_replaced_with_it(tmp_path):
    into = tmp_path / "out"
    (into / "a").mkdir(parents=True)
    (into / "a" / "f").write_bytes(b"mine")
    other = into / "a" / "other-link"
    os.link(into / "a" / "f", other)
    done = extract(hostile(member("a/f", data=b"theirs")), str(into), ["a"], overwrite=False)
    assert (into / "a" / "f").read_bytes() == b"mine" and "--overwrite" in done.refused[0]
    extract(hostile(member("a/f", data=b"theirs")), str(into), ["a"], overwrite=True)
    assert (into / "a" / "f").read_bytes() == b"theirs"
    assert other.read_bytes() == b"mine"  # replaced, not written into the shared inode


def test_a_directory_in_the_place_of_a_file_is_never_removed(tmp_path):
    into = tmp_path / "out"
    (into / "a" / "f").mkdir(parents=True)
    (into / "a" / "f" / "keep").write_bytes(b"k")
    done = extract(hostile(member("a/f", data=b"x")), str(into), ["a"], overwrite=True)
    assert (into / "a" / "f" / "keep").read_bytes() == b"k"
    assert "directory" in done.refused[0]


def test_a_requested_path_already_in_the_directory_stops_before_anything_is_read(tmp_path):
    into = tmp_path / "out"
    (into / "home").mkdir(parents=True)
    with pytest.raises(RestoreError, match="--overwrite"):
        prepare_directory(str(into), ["home", "etc"], overwrite=False)
    assert prepare_directory(str(into), ["home"], overwrite=True) == str(into)
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(RestoreError, match="not a directory"):
        prepare_directory(str(tmp_path / "file"), ["a"], overwrite=False)


def test_a_stream_that_is_no_tar_archive_is_one_error(tmp_path):
    with pytest.raises(ExtractError, match="not a tar archive"):
        extract(io.BytesIO(b"this is not tar" * 100), str(tmp_path), ["a"], overwrite=False)


def test_a_hard_link_through_a_symlink_already_in_the_directory_is_refused(tmp_path):
    into = tmp_path / "out"
    into.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    victim.chmod(0o600)
    os.symlink(tmp_path, into / "home")  # DIR held it before; --overwrite lets the run start
    done = extract(hostile(member("data/x", tarfile.LNKTYPE, link="home/victim", mode=0o4777)),
                   str(into), ["home", "data"], overwrite=True)
    assert os.stat(victim).st_mode & 0o7777 == 0o600 and os.stat(victim).st_nlink == 1
    assert not (into / "data" / "x").exists()
    assert len(done.refused) == 1 and "leads out" in done.refused[0]
