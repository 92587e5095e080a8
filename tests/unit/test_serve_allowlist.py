"""``zbak serve``: the request grammar, getopt reading, resume tokens and the allow-list (pure).

The argvs checked as "what zbak issues" come from zbak's own builders (``zfs.sendrecv``,
``transport.stages``, the ``Zfs`` client and ``capabilities.detect`` run against a
recording Executor), so the allow-list cannot drift from the commands it must let through.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
from pydantic import ValidationError

from zrepl_py.config.hosts import HostConfig
from zrepl_py.config.replicate import ReplicateConfig
from zrepl_py.errors import CommandRefused, ZbakError
from zrepl_py.proc.executor import Completed
from zrepl_py.proc.mbuffer import MAX_BYTES as MBUFFER_MAX_BYTES
from zrepl_py.proc.mbuffer import MIN_BYTES as MBUFFER_MIN_BYTES
from zrepl_py.proc.mbuffer import PROBE as MBUFFER_PROBE
from zrepl_py.proc.mbuffer import mbuffer_argv
from zrepl_py.proc.openssh import remote_command, remote_pipeline
from zrepl_py.restore.mark import RESTORING, mark_value
from zrepl_py.serve.cmdline import split_command_line
from zrepl_py.serve.options import parse
from zrepl_py.serve.policy import Policy, check
from zrepl_py.serve.token import make_token, read_token
from zrepl_py.transport.stages import Side, metered_transfer
from zrepl_py.zfs import capabilities
from zrepl_py.zfs.capabilities import Capabilities
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.properties import ReceiveProperties
from zrepl_py.zfs.sendrecv import abort_argv, receive_argv, send_argv
from zrepl_py.zfs.steps import BookmarkRef, Full, Incremental, SnapRef

DATA = Path(__file__).resolve().parents[1] / "data" / "resume"
ROOT = "backup/replicas"
POLICY = Policy(roots=("backup/replicas",))
DESTROYER = dataclasses.replace(POLICY, allow_destroy_own=True)
OPENZFS = Capabilities(parsable_list=True, resume_tokens=True, bookmarks=True, raw_send=True,
                       compressed_send=True, holds=True, multi_snapshot=True, pool_version=5000,
                       list_holds=True, receive_properties=True,
                       features=(("embedded_data", "active"), ("large_blocks", "enabled"),
                                 ("lz4_compress", "active")))  # fmt: skip
OWN = "zbak_20260101T000000Z"


def request(argv: list[str]) -> str:
    return remote_command(argv, sudo=False)


def allowed(text: str, policy: Policy = POLICY):
    return check(split_command_line(text), policy)


def refused(text: str | None, policy: Policy = POLICY) -> str:
    with pytest.raises(CommandRefused) as caught:
        check(split_command_line(text), policy)
    return str(caught.value)


# -- the request grammar -----------------------------------------------------------------

CORPUS = [
    "plain", "with space", "it's", "'", "''", '"', "$(touch /tmp/x)", "`id`", "a;b", "a|b",
    "a\nb", "a\tb", "~root", "*", "-F", "--", "", "${HOME}", "back\\slash", "naïve", "%x=y,z",
]


@pytest.mark.parametrize("word", CORPUS)
def test_every_word_zbak_quotes_comes_back_byte_identical(word):
    """docs/reliability.md#r33-quoting-corpus."""
    argv = ["zfs", "get", word, "x"]
    assert split_command_line(request(argv)) == [argv]


def test_random_words_round_trip_through_shlex_join():
    """docs/reliability.md#r33-quoting-corpus."""
    rng = random.Random(6)
    alphabet = "ab '\"$`;|&<>()\\\n\t*?~#!{}%=:,./-_@+"
    for _ in range(300):
        argv = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8)))
                for _ in range(rng.randint(1, 5))]
        assert split_command_line(request(argv)) == [argv]


def test_a_remote_pipeline_splits_into_its_commands():
    argvs = [["zstd", "-q", "-d", "-c"], ["zfs", "receive", "-u", "pool/a b|c"]]
    assert split_command_line(remote_pipeline(argvs, sudo=False)) == argvs


@pytest.mark.parametrize("text", [
    "zfs list; rm -rf /",
    "zfs list && rm -rf /",
    "zfs list $(rm -rf /)",
    "zfs list `rm -rf /`",
    "zfs list > /etc/passwd",
    "zfs receive -u pool/x < /etc/shadow",
    "zfs list\nrm -rf /",
    "zfs\tlist",
    "zfs list pool/*",
    "zfs list ~root",
    "zfs list || true",
    "zfs list |rm",
    "zfs list & rm -rf /",
    "zfs list 'unterminated",
    'zfs list "$HOME"',
    "zfs list \\; rm",
    "| zfs list",
    "zfs list |",
    "",
    "   ",
    None,
])
def test_shell_syntax_is_refused_before_anything_runs(text):
    """docs/reliability.md#r36-forced-command."""
    with pytest.raises(CommandRefused):
        split_command_line(text)


def test_the_refusal_names_the_offending_character_and_its_offset():
    message = refused("zfs list; rm -rf /")
    assert "';'" in message and "offset 8" in message


# -- getopt reading ------------------------------------------------------------------------


def test_options_after_operands_are_read_as_options_like_glibc_getopt():
    """docs/reliability.md#r36-forced-command."""
    parsed = parse(["pool/x", "-F"], flags="uF", what="zfs receive")
    assert parsed.has("F") and parsed.operands == ("pool/x",)


def test_a_valued_option_takes_the_next_argument_even_with_a_dash():
    parsed = parse(["-o", "-r", "pool/x"], flags="r", valued="o", what="zfs list")
    assert parsed.values("o") == ["-r"] and not parsed.has("r")


@pytest.mark.parametrize("args", [["--", "pool/x"], ["--raw", "pool/x@s"], ["-", "x"], ["-o"]])
def test_long_options_terminators_and_missing_values_are_refused(args):
    with pytest.raises(CommandRefused):
        parse(args, flags="r", valued="o", what="zfs send")


# -- resume tokens ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["full", "incremental_compressed", "incremental_from_bookmark",
                                  "raw_encrypted", "stale"])
def test_a_real_openzfs_token_gives_the_toname_and_toguid_zfs_itself_prints(case):
    token = (DATA / f"{case}.token").read_text().strip()
    fields = dict(line.strip().split(" = ", 1) for line in (DATA / f"{case}.txt").read_text()
                  .splitlines() if " = " in line)
    target = read_token(token)
    assert target.toname == fields["toname"]
    assert target.toguid == int(fields["toguid"], 16)


def test_a_token_with_a_changed_byte_is_refused_by_its_checksum():
    token = (DATA / "full.token").read_text().strip()
    head, hexdata = token.rsplit("-", 1)
    flipped = hexdata[:40] + ("0" if hexdata[40] != "0" else "1") + hexdata[41:]
    with pytest.raises(CommandRefused, match="checksum"):
        read_token(f"{head}-{flipped}")


def test_a_made_token_reads_back_and_one_naming_toname_twice_is_refused():
    assert read_token(make_token([("toguid", 7), ("toname", "p/d@s")])).toname == "p/d@s"
    with pytest.raises(CommandRefused, match="twice"):
        read_token(make_token([("toname", "p/inside@s"), ("toguid", 7), ("toname", "p/x@s")]))
    with pytest.raises(CommandRefused, match="toname"):
        read_token(make_token([("toguid", 7)]))


def test_garbage_that_merely_looks_like_a_token_is_refused():
    with pytest.raises(CommandRefused):
        read_token("1-0-10-00")


# -- what zbak issues is allowed -------------------------------------------------------------


class Recorder:
    """An Executor that records argvs and answers success with no output."""

    host = "backup"

    def __init__(self):
        self.argvs: list[list[str]] = []

    def run(self, argv, *, input=None, check=True, timeout=None):
        self.argvs.append(list(argv))
        return Completed(tuple(argv), 0, b"", b"")


def issued(action) -> list[list[str]]:
    recorder = Recorder()
    zfs = Zfs(recorder, capabilities=OPENZFS)
    try:
        action(zfs, recorder)
    except ZbakError:
        pass  # empty output may not parse; the argv was recorded first
    return recorder.argvs


CLIENT_CALLS = {
    "capability probes": lambda z, r: capabilities.detect(r, "backup"),
    "capability fingerprint": lambda z, r: capabilities.fingerprint(r, "backup"),
    "tree (list -p)": lambda z, r: z.tree(f"{ROOT}/tank", recursive=True),
    "tree (get)": lambda z, r: Zfs(r).tree(f"{ROOT}/tank", recursive=False),
    "clones": lambda z, r: z.clones("backup"),
    "exists (parent)": lambda z, r: z.exists("backup"),
    "properties": lambda z, r: z.get_properties(f"{ROOT}/tank@{OWN}", ["guid"]),
    "guid and replica properties": lambda z, r: z.property_sources(
        [f"{ROOT}/tank@{OWN}", f"{ROOT}/tank"], ["guid", *ReceiveProperties.of().names]),
    "set a replica property": lambda z, r: z.set_property(f"{ROOT}/tank", "canmount", "noauto"),
    "set a replica property on several (settle step 1)": lambda z, r: z.set_property_many(
        [f"{ROOT}/a", f"{ROOT}/b", f"{ROOT}/a/c"], "readonly", "on"),
    "reset an excluded one": lambda z, r: z.set_property(f"{ROOT}/tank", "refreservation",
                                                         "none"),
    "inherit an excluded one": lambda z, r: z.inherit_property(f"{ROOT}/tank", "mountpoint"),
    "mark a restore into the root": lambda z, r: z.set_property(
        f"{ROOT}/restored", RESTORING, mark_value("local", "tank/data")),
    "mark a restore of another host's dataset": lambda z, r: z.set_property(
        f"{ROOT}/restored", RESTORING, mark_value("master-1", "tank/a b/c")),
    "clear a restore's mark": lambda z, r: z.inherit_property(f"{ROOT}/restored", RESTORING),
    "hold": lambda z, r: z.hold(f"{ROOT}/tank@{OWN}", "zbak:j:backup:x"),
    "release": lambda z, r: z.release(f"{ROOT}/tank@{OWN}", "zbak:j:backup:x"),
    "hold many": lambda z, r: z.hold_many([f"{ROOT}/a@{OWN}", f"{ROOT}/b@{OWN}"],
                                          "zbak:j:backup:x"),
    "release many": lambda z, r: z.release_many([f"{ROOT}/a@{OWN}", f"{ROOT}/b@{OWN}"],
                                                "zbak:j:backup:x"),
    "holds": lambda z, r: z.holds([f"{ROOT}/tank@{OWN}"]),
    "bookmarks": lambda z, r: z.bookmarks(f"{ROOT}/tank"),
    "bookmark": lambda z, r: z.bookmark(f"{ROOT}/tank@{OWN}", f"{ROOT}/tank#zbak_0123456789_1"),
    "resume token": lambda z, r: z.resume_token(f"{ROOT}/tank"),
    "abort resume": lambda z, r: z.abort_resume(f"{ROOT}/tank"),
    "create parent": lambda z, r: z.create_filesystem(f"{ROOT}/host1", parents=True),
    "snapshot": lambda z, r: z.snapshot(f"{ROOT}/tank@{OWN}", recursive=True),
    "snapshot many": lambda z, r: z.snapshot_many([f"{ROOT}/a@{OWN}", f"{ROOT}/b@{OWN}"]),
    "pool health": lambda z, r: z.pool_health("backup"),
    "dataset properties": lambda z, r: z.dataset_properties(f"{ROOT}/tank", ["zbak:job"],
                                                            recursive=True),
    "dataset properties of an ancestor": lambda z, r: z.dataset_properties(
        "backup", ["zbak:job"], recursive=False),
    "pool sync": lambda z, r: z.sync_pool("backup"),
}


@pytest.mark.parametrize("call", sorted(CLIENT_CALLS))
def test_every_command_the_zfs_client_issues_inside_the_root_is_allowed(call):
    argvs = issued(CLIENT_CALLS[call])
    assert argvs
    for argv in argvs:
        approved = allowed(request(argv))
        assert approved.argvs == (tuple(argv),)


@pytest.mark.parametrize("call", ["destroy own snapshot", "destroy own bookmark", "rollback"])
def test_destroy_and_rollback_of_zbak_snapshots_are_allowed_with_allow_destroy_own(call):
    action = {
        "destroy own snapshot": lambda z, r: z.destroy_snapshot(f"{ROOT}/tank@{OWN}"),
        "destroy own bookmark": lambda z, r: z.destroy_bookmark(f"{ROOT}/tank#zbak_0a1b2c3d4e_1"),
        "rollback": lambda z, r: z.rollback(f"{ROOT}/tank@before-upgrade"),
    }[call]
    (argv,) = issued(action)
    assert allowed(request(argv), DESTROYER).argvs == (tuple(argv),)
    assert "not allowed" in refused(request(argv), POLICY)


def test_the_send_and_receive_argvs_of_every_step_kind_are_allowed():
    ds = f"{ROOT}/tank"
    a, b = SnapRef("a", 1, 10), SnapRef("b", 2, 20)
    sends = [
        send_argv(Full(a), source_dataset=ds, caps=OPENZFS, raw=False),
        send_argv(Full(a), source_dataset=ds, caps=OPENZFS, raw=True),
        send_argv(Incremental(a, b, True), source_dataset=ds, caps=OPENZFS, raw=False),
        send_argv(Incremental(BookmarkRef("bm", 1, 10), b, False), source_dataset=ds,
                  caps=Capabilities.NONE, raw=False),
    ]
    sends += [send_argv(step, source_dataset=ds, caps=OPENZFS, raw=raw, properties=True)
              for step in (Full(a), Incremental(a, b, True)) for raw in (False, True)]
    props = ReceiveProperties.of()
    receives = [receive_argv(ds, caps=OPENZFS, resumable=True),
                receive_argv(ds, caps=OPENZFS, resumable=True, properties=props),
                receive_argv(ds, caps=OPENZFS, resumable=False,
                             properties=props.for_kind("volume")),
                receive_argv(ds, caps=Capabilities.NONE, resumable=False), abort_argv(ds)]
    for argv in sends + receives:
        assert allowed(request(argv)).argvs == (tuple(argv),)


def test_the_receive_properties_serve_allows_are_the_ones_it_was_started_with():
    ds = f"{ROOT}/tank"
    props = ReceiveProperties.of({"compression": "zstd", "readonly": "off"}, ["mountpoint"])
    policy = dataclasses.replace(POLICY, properties=props)
    argv = receive_argv(ds, caps=OPENZFS, resumable=True, properties=props)
    assert "compression=zstd" in argv and "readonly=off" in argv
    assert allowed(request(argv), policy).argvs == (tuple(argv),)
    assert "-o 'compression=zstd' is not allowed" in refused(request(argv)), "not by default"
    default = receive_argv(ds, caps=OPENZFS, resumable=True, properties=ReceiveProperties.of())
    assert "-o 'readonly=on' is not allowed" in refused(request(default), policy)
    assert allowed(request(["zfs", "set", "compression=zstd", ds]), policy)
    many = ["zfs", "set", "compression=zstd", ds, f"{ROOT}/other", f"{ROOT}/third"]
    assert allowed(request(many), policy).argvs == (tuple(many),), "a batch (settle step 1)"
    assert "not allowed" in refused(request(["zfs", "set", "compression=zstd", ds]))


def _remote_side(tmp_path) -> Side:
    host = HostConfig(address="backup.example.org", identity_file=tmp_path / "id")
    return Side("backup", host, tmp_path / "known_hosts")


BUFFER = 64 * 1024 * 1024


@pytest.mark.parametrize("buffer", [None, BUFFER])
@pytest.mark.parametrize("compress", [False, True])
def test_the_remote_end_of_a_push_pipeline_is_allowed_as_the_ssh_client_sends_it(
        tmp_path, compress, buffer):
    local = Side("local", None, tmp_path / "known_hosts")
    send = send_argv(Full(SnapRef("a", 1, 10)), source_dataset="tank/data", caps=OPENZFS, raw=False)
    receive = receive_argv(f"{ROOT}/tank/data", caps=OPENZFS, resumable=True)
    stages, _ = metered_transfer(send, receive, source=local, target=_remote_side(tmp_path),
                                 compress=compress, bandwidth_limit=None, receive_buffer=buffer,
                                 send_writes_stream=True, share=False)
    remote = stages[-1].argv[-1]  # the command string after "ssh ... -- HOST"
    approved = allowed(remote)
    assert approved.argvs[-1] == tuple(receive)
    assert len(approved.argvs) == 1 + compress + (buffer is not None)
    if buffer is not None:
        assert approved.argvs[-2] == mbuffer_argv(buffer)


def test_the_receive_buffer_of_every_size_the_config_accepts_up_to_16_gib_is_allowed():
    receive = receive_argv(f"{ROOT}/tank", caps=OPENZFS, resumable=True)
    for size in (1024 * 1024, 1024 * 1024 + 1023, BUFFER, MBUFFER_MAX_BYTES):
        text = remote_pipeline([mbuffer_argv(size), receive], sudo=False)
        assert allowed(text).argvs == (mbuffer_argv(size), tuple(receive))


def test_the_config_accepts_exactly_the_receive_buffers_serve_allows():
    # Both sides keep their own bound (serve imports no config); they must not drift apart,
    # or a configured buffer would make every served receive fail instead of being refused
    # when the config loads.
    for size in (MBUFFER_MIN_BYTES, MBUFFER_MAX_BYTES):
        assert ReplicateConfig(targets=["h:p/a"], receive_buffer=size).receive_buffer == size
    for size in (MBUFFER_MIN_BYTES - 1, MBUFFER_MAX_BYTES + 1):
        with pytest.raises(ValidationError, match="receive_buffer"):
            ReplicateConfig(targets=["h:p/a"], receive_buffer=size)


def test_the_mbuffer_probe_is_allowed_alone_and_runs_the_configured_mbuffer():
    assert allowed(request(list(MBUFFER_PROBE))).argvs == (("mbuffer", "-V"),)
    policy = dataclasses.replace(POLICY, mbuffer="/usr/bin/mbuffer")
    assert allowed(request(list(MBUFFER_PROBE)), policy).argvs == (("/usr/bin/mbuffer", "-V"),)
    receive = receive_argv(f"{ROOT}/tank", caps=OPENZFS, resumable=True)
    text = remote_pipeline([("/usr/bin/mbuffer", *mbuffer_argv(BUFFER)[1:]), receive], sudo=False)
    assert allowed(text, policy).argvs[0][0] == "/usr/bin/mbuffer"


@pytest.mark.parametrize("compress", [False, True])
def test_the_remote_end_of_a_pull_pipeline_is_allowed_as_the_ssh_client_sends_it(tmp_path, compress):
    local = Side("local", None, tmp_path / "known_hosts")
    send = send_argv(Incremental(SnapRef("a", 1, 10), SnapRef(OWN, 2, 20), True),
                     source_dataset=f"{ROOT}/data", caps=OPENZFS, raw=False)
    receive = receive_argv("tank/replica", caps=OPENZFS, resumable=False)
    stages, _ = metered_transfer(send, receive, source=_remote_side(tmp_path), target=local,
                                 compress=compress, bandwidth_limit=None,
                                 send_writes_stream=True, share=False)
    approved = allowed(stages[0].argv[-1])
    assert approved.argvs[0] == tuple(send)


def test_a_resume_send_is_allowed_when_the_tokens_snapshot_is_inside_the_root():
    token = (DATA / "incremental_compressed.token").read_text().strip()  # toname src/data@b
    policy = Policy(roots=("src/data",))
    describe = allowed(request(["zfs", "send", "-n", "-v", "-t", token]), policy)
    assert describe.token is None, "a dry run needs no guid check"
    real = allowed(request(["zfs", "send", "-t", token]), policy)
    assert real.token is not None and real.token.toname == "src/data@b"
    assert "outside the allowed root" in refused(request(["zfs", "send", "-t", token]),
                                                 Policy(roots=("src/plain",)))


def test_a_configured_program_path_is_accepted_and_executed():
    policy = dataclasses.replace(POLICY, zfs="/usr/sbin/zfs")
    approved = allowed(request(["/usr/sbin/zfs", "list", "-H", ROOT]), policy)
    assert approved.argvs == (("/usr/sbin/zfs", "list", "-H", ROOT),)
    assert allowed(request(["zfs", "list", "-H", ROOT]), policy).argvs[0][0] == "/usr/sbin/zfs"


# -- what is refused ---------------------------------------------------------------------------


@pytest.mark.parametrize("argv, reason", [
    (["zfs", "destroy", f"{ROOT}/tank@{OWN}"], "--allow-destroy-own"),
    (["zfs", "receive", "-u", "-F", f"{ROOT}/tank"], "-F is not allowed"),
    (["zfs", "receive", "-u", f"{ROOT}/tank", "-F"], "-F is not allowed"),
    (["zfs", "receive", "-uF", f"{ROOT}/tank"], "-F is not allowed"),
    (["zfs", "recv", "-F", "-u", f"{ROOT}/tank"], "-F is not allowed"),
    (["zfs", "receive", f"{ROOT}/tank"], "without -u"),
    (["zfs", "receive", "-u", "backup/other/tank"], "outside the allowed root"),
    (["zfs", "receive", "-u", "backup/replicas2"], "outside the allowed root"),
    (["zfs", "receive", "-u", "backup"], "outside the allowed root"),
    (["zfs", "receive", "-u", "-o", "mountpoint=/root", f"{ROOT}/x"],
     "-o 'mountpoint=/root' is not allowed"),
    (["zfs", "receive", "-u", "-o", "canmount=on", f"{ROOT}/x"], "-o 'canmount=on' is not"),
    (["zfs", "receive", "-u", "-ocanmount=on", f"{ROOT}/x"], "-o 'canmount=on' is not"),
    (["zfs", "receive", "-u", f"{ROOT}/x", "-o", "readonly=off"], "-o 'readonly=off' is not"),
    (["zfs", "receive", "-u", "-o", "canmount", f"{ROOT}/x"], "-o 'canmount' is not"),
    (["zfs", "receive", "-u", "-o", "com.example:x=1", f"{ROOT}/x"], "only the configured"),
    (["zfs", "receive", "-u", "-x", "compression", f"{ROOT}/x"], "-x 'compression' is not"),
    (["zfs", "receive", "-u", "-x", "canmount", f"{ROOT}/x"], "-x 'canmount' is not"),
    (["zfs", "receive", "-A", "-o", "canmount=noauto", f"{ROOT}/x"], "-A takes no other"),
    (["zfs", "receive", "-x", "compression"], "exactly one dataset"),
    (["zfs", "receive", "-u", "-o", "canmount=noauto", "backup/other"], "outside the allowed"),
    (["zfs", "receive", "-u", "-d", f"{ROOT}/x"], "-d is not allowed"),
    (["zfs", "list", "-H", "-o", "name", "-r", "backup/other"], "outside the allowed root"),
    (["zfs", "list", "-H"], "listing every pool"),
    (["zfs", "get", "-r", "all", "backup"], "recursive read"),
    (["zfs", "get", "all", f"{ROOT}/$(id)"], "invalid character"),
    (["zfs", "send", "backup/other@s"], "outside the allowed root"),
    (["zfs", "send", "-R", f"{ROOT}/tank@s"], "-R is not allowed"),
    (["zfs", "send", "-b", f"{ROOT}/tank@s"], "-b is not allowed"),
    (["zfs", "send", "-i", "backup/other@a", f"{ROOT}/tank@b"], "not in the dataset"),
    (["zfs", "set", "mountpoint=/etc", f"{ROOT}/tank"], "'mountpoint=/etc' is not allowed"),
    (["zfs", "set", "canmount=on", f"{ROOT}/tank"], "'canmount=on' is not allowed"),
    (["zfs", "set", "canmount=noauto", "backup/other"], "outside the allowed root"),
    (["zfs", "set", "canmount=noauto", f"{ROOT}/tank@s"], "belong to snapshot"),
    (["zfs", "set", "canmount=noauto", "readonly=on", f"{ROOT}/tank"], "exactly one"),
    (["zfs", "set", "canmount=noauto", f"{ROOT}/a", "backup/other"], "outside the allowed"),
    (["zfs", "set", "canmount=noauto"], "exactly one property and one or more datasets"),
    (["zfs", "inherit", "mountpoint", f"{ROOT}/a", f"{ROOT}/b"], "one dataset"),
    (["zfs", "set", "-u", "canmount=noauto", f"{ROOT}/tank"], "-u is not allowed"),
    (["zfs", "set", "refreservation=10G", f"{ROOT}/tank"], "is not allowed"),
    (["zfs", "inherit", "compression", f"{ROOT}/tank"], "'compression' is not allowed"),
    (["zfs", "inherit", "refreservation", f"{ROOT}/tank"], "'refreservation' is not allowed"),
    (["zfs", "inherit", "canmount", f"{ROOT}/tank"], "'canmount' is not allowed"),
    (["zfs", "inherit", "-r", "mountpoint", f"{ROOT}/tank"], "-r is not allowed"),
    (["zfs", "inherit", "-S", "mountpoint", f"{ROOT}/tank"], "-S is not allowed"),
    (["zfs", "inherit", "mountpoint", "backup"], "outside the allowed root"),
    (["zfs", "set", "zbak:restoring=local:tank/data", "backup/other"], "outside the allowed"),
    (["zfs", "set", "zbak:restoring=local:tank/data", f"{ROOT}/a", f"{ROOT}/b"],
     "HOST:DATASET and one dataset"),
    (["zfs", "set", "zbak:restoring=tank/data", f"{ROOT}/a"], "HOST:DATASET"),
    (["zfs", "set", "zbak:restoring=-x:tank/data", f"{ROOT}/a"], "HOST:DATASET"),
    (["zfs", "set", "zbak:restoring=local:tank/da@ta", f"{ROOT}/a"], "HOST:DATASET"),
    (["zfs", "set", "zbak:restoring=local:", f"{ROOT}/a"], "HOST:DATASET"),
    (["zfs", "set", "zbak:other=local:tank/data", f"{ROOT}/a"], "is not allowed"),
    (["zfs", "inherit", "zbak:restoring", "backup/other"], "outside the allowed root"),
    (["zfs", "inherit", "-r", "zbak:restoring", f"{ROOT}/a"], "-r is not allowed"),
    (["zfs", "allow", "nobody", "destroy", ROOT], "zfs allow is not allowed"),
    (["zfs", "clone", f"{ROOT}/tank@s", f"{ROOT}/c"], "zfs clone is not allowed"),
    (["zfs", "rename", f"{ROOT}/a", f"{ROOT}/b"], "zfs rename is not allowed"),
    (["zfs", "snapshot", f"{ROOT}/tank@mine"], "not a zbak snapshot name"),
    (["zfs", "hold", "-r", "t", f"{ROOT}/tank@s"], "-r is not allowed"),
    (["zfs", "hold", "t", "backup/other@s"], "outside the allowed root"),
    (["zfs", "bookmark", f"{ROOT}/a@s", f"{ROOT}/b#m"], "not in the dataset"),
    (["zpool", "destroy", "backup"], "zpool destroy is not allowed"),
    (["zpool", "status", "otherpool"], "not the pool of an allowed root"),
    (["zpool", "status", "-c", "/tmp/x", "backup"], "-c is not allowed"),
    (["zpool", "get", "all"], "exactly one pool"),
    (["zpool", "sync", "otherpool"], "not the pool of an allowed root"),
    (["zpool", "sync"], "exactly one pool"),
    (["zpool", "sync", "-f", "backup"], "-f is not allowed"),
    (["zfs"], "without a subcommand"),
    (["rm", "-rf", "/"], "program 'rm' is not allowed"),
    (["sh", "-c", "zfs list"], "program 'sh' is not allowed"),
    (["/bin/zfs", "list", ROOT], "program '/bin/zfs' is not allowed"),
    (["python3", "-c", "print(1)"], "program 'python3' is not allowed"),
    (["rsync", "--server", "."], "program 'rsync' is not allowed"),
    (["sudo", "-n", "zfs", "list", ROOT], "sudo is not allowed"),
    (["zstd", "-d", "-c"], "only in a pipeline"),
])
def test_commands_zbak_does_not_issue_are_refused_with_the_rule_they_break(argv, reason):
    """docs/reliability.md#r36-forced-command."""
    assert reason in refused(request(argv))


@pytest.mark.parametrize("argv, reason", [
    (["zfs", "destroy", f"{ROOT}/tank"], "is a dataset"),
    (["zfs", "destroy", f"{ROOT}/tank@before-upgrade"], "not a zbak snapshot"),
    (["zfs", "destroy", "-r", f"{ROOT}/tank@{OWN}"], "-r is not allowed"),
    (["zfs", "destroy", "-R", f"{ROOT}/tank@{OWN}"], "-R is not allowed"),
    (["zfs", "destroy", f"{ROOT}/tank@{OWN}", "-f"], "-f is not allowed"),
    (["zfs", "destroy", f"{ROOT}/tank@{OWN}%zbak_20270101T000000Z"], "invalid character"),
    (["zfs", "destroy", f"{ROOT}/tank@{OWN},before-upgrade"], "invalid character"),
    (["zfs", "destroy", f"{ROOT}/tank#user-mark"], "not a zbak bookmark"),
    (["zfs", "destroy", f"backup/other@{OWN}"], "outside the allowed root"),
    (["zfs", "rollback", "-r", f"{ROOT}/tank@s"], "-r is not allowed"),
])
def test_allow_destroy_own_still_refuses_everything_but_single_zbak_snapshots(argv, reason):
    """docs/reliability.md#r36-forced-command."""
    assert reason in refused(request(argv), DESTROYER)


def test_receive_force_is_allowed_only_when_configured():
    """docs/reliability.md#r36-forced-command."""
    argv = ["zfs", "receive", "-u", "-F", f"{ROOT}/tank"]
    policy = dataclasses.replace(POLICY, allow_force_receive=True)
    assert allowed(request(argv), policy).argvs == (tuple(argv),)


@pytest.mark.parametrize("text, reason", [
    ("zstd -q -d -c | zfs receive -u -F backup/replicas/x", "-F is not allowed"),
    ("zstd -q -d -c /etc/shadow | zfs receive -u backup/replicas/x", "zstd argument"),
    ("zstd -q -d -c -o /etc/passwd | zfs receive -u backup/replicas/x", "zstd argument"),
    ("zstd -q -c | zfs receive -u backup/replicas/x", "expected zstd -d -c"),
    ("zstd -q -d -c | zfs list -H backup/replicas", "may only feed zfs receive"),
    ("zstd -q -d -c | zfs receive -A backup/replicas/x", "may only feed zfs receive"),
    ("zfs send backup/replicas/x@s | zstd -q -d -c", "expected zstd -c"),
    ("zfs list -H backup/replicas | zstd -c", "may only read from zfs send"),
    ("zfs send backup/replicas/x@s | zstd -c | zstd -d -c", "is not one zbak uses"),
    ("zfs send backup/replicas/x@s | sh", "program 'sh' is not allowed"),
    ("cat /etc/shadow | zfs receive -u backup/replicas/x", "program 'cat' is not allowed"),
])
def test_pipelines_other_than_the_two_data_path_shapes_are_refused(text, reason):
    """docs/reliability.md#r36-forced-command."""
    assert reason in refused(text)


MB = "mbuffer -q -v 1 -s 128k"
RECEIVE = f"zfs receive -u -s {ROOT}/x"


@pytest.mark.parametrize("text, reason", [
    (f"{MB} -m 65536k -o /etc/passwd | {RECEIVE}", "mbuffer option '-o' is not allowed"),
    (f"{MB} -m 65536k -O 192.0.2.1:9090 | {RECEIVE}", "mbuffer option '-O' is not allowed"),
    (f"{MB} -m 65536k -I 9090 | {RECEIVE}", "mbuffer option '-I' is not allowed"),
    (f"{MB} -m 65536k -i /etc/shadow | {RECEIVE}", "mbuffer option '-i' is not allowed"),
    (f"{MB} -m 65536k -l /root/.ssh/authorized_keys | {RECEIVE}", "option '-l' is not allowed"),
    (f"{MB} -m 65536k -A 'touch /tmp/x' | {RECEIVE}", "mbuffer option '-A' is not allowed"),
    (f"{MB} -m 65536k -f | {RECEIVE}", "mbuffer option '-f' is not allowed"),
    (f"{MB} -m 65536k -t | {RECEIVE}", "mbuffer option '-t' is not allowed"),
    (f"{MB} -m 65536k --append | {RECEIVE}", "option '--append' is not allowed"),
    (f"{MB} -m 65536k /etc/passwd | {RECEIVE}", "expected exactly -q -v 1 -s 128k -m"),
    (f"{MB} -m 65536k -q | {RECEIVE}", "expected exactly -q -v 1 -s 128k -m"),
    (f"mbuffer -m 65536k -q -v 1 -s 128k | {RECEIVE}", "expected exactly -q -v 1 -s 128k -m"),
    (f"mbuffer -q -v 6 -s 128k -m 65536k | {RECEIVE}", "expected exactly -q -v 1 -s 128k -m"),
    (f"{MB} -m 65536 | {RECEIVE}", "expected whole KiB"),
    (f"{MB} -m 64M | {RECEIVE}", "expected whole KiB"),
    (f"{MB} -m 50% | {RECEIVE}", "expected whole KiB"),
    (f"{MB} -m 16777217k | {RECEIVE}", "the buffer must be 1024k to 16777216k"),
    (f"{MB} -m 999999999999k | {RECEIVE}", "the buffer must be 1024k to 16777216k"),
    (f"{MB} -m 1023k | {RECEIVE}", "the buffer must be 1024k to 16777216k"),
    (f"{MB} -m 65536k", "mbuffer is not allowed alone"),
    ("mbuffer -V -o /tmp/x", "mbuffer is not allowed alone"),
    (f"{MB} -m 65536k | zfs receive -A {ROOT}/x", "mbuffer may only feed zfs receive"),
    (f"zstd -q -d -c | {MB} -m 65536k | zfs receive -A {ROOT}/x", "mbuffer may only feed zfs"),
    (f"{MB} -m 65536k | zfs send {ROOT}/x@s", "mbuffer may only feed zfs receive"),
    (f"{MB} -m 65536k | zfs list -H {ROOT}", "mbuffer may only feed zfs receive"),
    (f"{MB} -m 65536k | zfs receive -u -F {ROOT}/x", "-F is not allowed"),
    (f"{MB} -m 65536k | zfs receive -u backup/other", "outside the allowed root"),
    (f"zfs send {ROOT}/x@s | {MB} -m 65536k", "mbuffer runs only directly before zfs receive"),
    (f"zfs send {ROOT}/x@s | zstd -q -c | {MB} -m 65536k", "is not one zbak uses"),
    (f"{MB} -m 65536k | zstd -q -d -c | {RECEIVE}", "is not one zbak uses"),
    (f"{MB} -m 65536k | {MB} -m 65536k | {RECEIVE}", "is not one zbak uses"),
    (f"zstd -q -d -c | {MB} -m 65536k | {MB} -m 65536k | {RECEIVE}", "is not one zbak uses"),
    (f"zstd -q -d -c /etc/shadow | {MB} -m 65536k | {RECEIVE}", "zstd argument"),
    ("/usr/bin/mbuffer -V", "program '/usr/bin/mbuffer' is not allowed"),
    ("sudo -n mbuffer -V", "sudo is not allowed"),
])
def test_mbuffer_is_refused_unless_it_is_zbaks_exact_buffer_right_before_zfs_receive(
        text, reason):
    """docs/reliability.md#r36-forced-command: mbuffer(1) can read and write files, open TCP
    connections and run commands, so only the probe and zbak's own receive buffer pass."""
    assert reason in refused(text)


def test_a_token_naming_a_snapshot_outside_the_root_is_refused_even_for_a_dry_run():
    """docs/reliability.md#r36-forced-command."""
    token = (DATA / "full.token").read_text().strip()  # toname src/plain@s1
    assert "outside the allowed root" in refused(
        request(["zfs", "send", "-n", "-v", "-t", token]), Policy(roots=("src/data",)))


def test_quoting_cannot_smuggle_a_pipe_or_an_option_into_a_name():
    """docs/reliability.md#r36-forced-command."""
    assert "invalid character" in refused(request(["zfs", "receive", "-u", f"{ROOT}/x|sh"]))
    assert "not allowed" in refused(request(["zfs", "receive", "-u", "-F", f"{ROOT}/x"]))


# -- the command ---------------------------------------------------------------------------


def test_zbak_serve_exits_126_and_logs_the_reason_for_a_refused_request(tmp_path, capsys):
    """docs/reliability.md#r36-forced-command."""
    from zrepl_py.cli import main

    log = tmp_path / "serve.log"
    env = {"SSH_ORIGINAL_COMMAND": f"zfs destroy -r {ROOT}", "SSH_CLIENT": "192.0.2.7 5555 22"}
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--root", ROOT, "--log", str(log)], env=env)
    assert exited.value.code == 126
    assert "zbak serve: refused: zfs destroy is not allowed" in capsys.readouterr().err
    (line,) = log.read_text().splitlines()
    assert "REFUSED from 192.0.2.7: zfs destroy is not allowed" in line
    assert f"request: 'zfs destroy -r {ROOT}'" in line
    assert log.stat().st_mode & 0o777 == 0o600


def test_zbak_serve_with_an_invalid_root_is_a_usage_error(tmp_path):
    from zrepl_py.cli import main
    from zrepl_py.errors import ExitStatus

    env = {"SSH_ORIGINAL_COMMAND": "zfs list -H backup"}
    assert main(["serve", "--root", "back up!/x"], env=env) == ExitStatus.USAGE
    assert main(["serve"], env=env) == ExitStatus.USAGE


# -- drills: a copy on this host, the scratch, the digest verb (docs/drills.md) --------------

DRILLER = dataclasses.replace(POLICY, allow_drill=True)
SCRATCH = f"{ROOT}/zbak-drill-0a1b2c3d"



def test_a_drill_creates_destroys_and_reads_its_scratch_with_commands_serve_allows():
    """What ``drill.scratch`` and ``zfs.teardown`` issue for a scratch inside the root is
    allowed with --allow-drill: create (marked, unmounted), the sweep's depth-1 listing, and
    the destroy of each snapshot and dataset, one name at a time."""
    from zrepl_py.drill import scratch

    argvs = issued(lambda z, r: scratch.create(z, SCRATCH))
    argvs += issued(lambda z, r: z.dataset_properties(ROOT, [scratch.MARK], recursive=False,
                                                      children=True))
    argvs += issued(lambda z, r: z.destroy_snapshot(f"{SCRATCH}/d0@some-name"))
    argvs += issued(lambda z, r: z.destroy_filesystem(f"{SCRATCH}/d0"))
    argvs += issued(lambda z, r: z.destroy_filesystem(SCRATCH))
    assert [a[1] for a in argvs] == ["create", "get", "destroy", "destroy", "destroy"]
    assert "-o" in argvs[0] and f"{scratch.MARK}=" in " ".join(argvs[0])
    for argv in argvs:
        assert allowed(request(argv), DRILLER).argvs == (tuple(argv),)
    for argv in argvs[2:]:  # without the flag a dataset (or a foreign snapshot) is never destroyed
        assert "not allowed" in refused(request(argv), POLICY)


def test_a_copy_of_a_replica_into_its_hosts_scratch_runs_as_one_allowed_pipeline():
    """``zfs send | zfs receive`` inside the root (restore.execute on the replica's own
    host), exactly as the ssh client sends it; no flag needed: it is what a send request and a
    receive request already allow."""
    ds = f"{ROOT}/tank"
    a, b = SnapRef("a", 1, 10), SnapRef("b", 2, 20)
    for step in (Full(a), Incremental(a, b, True)):
        send = send_argv(step, source_dataset=ds, caps=OPENZFS, raw=False)
        receive = receive_argv(f"{SCRATCH}/d0", caps=OPENZFS, resumable=False)
        text = remote_pipeline([send, receive], sudo=False)
        assert allowed(text).argvs == (tuple(send), tuple(receive))


@pytest.mark.parametrize("text, reason", [
    (f"zfs send backup/other@s | zfs receive -u {SCRATCH}/d0", "outside the allowed root"),
    (f"zfs send {ROOT}/x@s | zfs receive -u -F {ROOT}/x", "-F is not allowed"),
    (f"zfs send {ROOT}/x@s | zfs receive -A {ROOT}/x", "may only feed zfs receive"),
    (f"zfs list -H {ROOT} | zfs receive -u {SCRATCH}/d0", "must be zfs send | zfs receive"),
    (f"zfs send {ROOT}/x@s | zfs receive {SCRATCH}/d0", "without -u is not allowed"),
    (f"zfs send {ROOT}/x@s | zfs send {ROOT}/y@s", "may only feed zfs receive"),
])
def test_a_local_copy_pipeline_is_refused_outside_its_one_shape(text, reason):
    """docs/reliability.md#r36-forced-command."""
    assert reason in refused(text, DRILLER)


@pytest.mark.parametrize("argv, reason", [
    (["zfs", "destroy", f"{ROOT}/tank"], "not allowed"),  # a replica, not a scratch
    (["zfs", "destroy", f"{ROOT}/tank@mine"], "not allowed"),
    (["zfs", "destroy", "-r", SCRATCH], "not allowed"),
    (["zfs", "destroy", "backup/zbak-drill-0a1b2c3d"], "not allowed"),  # outside the root
    (["zfs", "destroy", f"{ROOT}/zbak-drill-nothex00"], "not allowed"),
    (["zfs", "create", "-o", "mountpoint=/etc", f"{ROOT}/zbak-drill-0a1b2c3d"],
     "takes exactly -o canmount=off"),
    (["zfs", "create", "-o", "canmount=off", "-o", "mountpoint=none", "-o", "zbak:drill=x",
      "-o", "sharenfs=on", SCRATCH], "takes exactly -o canmount=off"),
    (["zfs", "create", "-o", "canmount=off", f"{ROOT}/tank"], "only for a drill's scratch"),
    (["zfs", "create", "-p", "-o", "canmount=off", "-o", "mountpoint=none", "-o",
      "zbak:drill=x", SCRATCH], "only for a drill's scratch"),
    (["zbak", "digest", "backup/other@s"], "outside the allowed root"),
    (["zbak", "digest", f"{ROOT}/tank"], "one snapshot"),
    (["zbak", "digest", "--zfs", "/bin/sh", f"{ROOT}/x@s", "more"], "one snapshot"),
    (["zbak", "serve", "--root", "backup"], "failover verbs are not allowed"),
    (["/tmp/zbak", "restore", "x"], "zbak restore is not allowed"),
    (["zbak-evil", "digest", f"{ROOT}/x@s"], "program 'zbak-evil' is not allowed"),
])
def test_drill_shapes_beyond_their_exact_form_are_refused_even_with_allow_drill(argv, reason):
    """docs/reliability.md#r36-forced-command."""
    assert reason in refused(request(argv), DRILLER)


def test_the_digest_verb_is_served_in_process_only_with_allow_drill():
    text = request(["zbak", "digest", "--zfs", "/sbin/zfs", f"{ROOT}/tank@s 1"])
    approved = allowed(text, DRILLER)
    assert approved.argvs == () and approved.digest == f"{ROOT}/tank@s 1"
    assert "--allow-drill" in refused(text, POLICY)
    assert "not in a pipeline" in refused(f"zbak digest {ROOT}/x@s | zfs receive -u {ROOT}/y",
                                          DRILLER)


def test_a_floor_lets_a_drill_destroy_its_young_scratch_but_nothing_else():
    """With --keep-newer-than the floor checks every snapshot destroy (serve.floor); a scratch
    copy is no replica: its destroy carries no floor action."""
    from zrepl_py.serve.floor import floor_action

    assert floor_action(["zfs", "destroy", f"{SCRATCH}/d0@{OWN}"]) is None
    assert floor_action(["zfs", "destroy", f"{ROOT}/tank@{OWN}"]) is not None
