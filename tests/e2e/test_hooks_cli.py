"""Pre and post hooks (``[jobs.NAME.hooks.ACTION]``) driven through ``zbak snapshot``,
``replicate`` and ``archive`` on real zfs-fuse pools: the hooks are real processes (a script
that records its arguments and environment), a failing pre aborts or not, a hanging hook is
stopped at its timeout with its children, post runs after a failed action and after a failed
pre, no secret reaches a hook, and each hook is a recorded run whose failure is alerted."""

from __future__ import annotations

import json
import os
import textwrap

import pytest
from support.cli import Zbak, content_of, file_archive_config, snapshots, zfs
from support.hookscript import HookScript
from support.receiver import Receiver

from zrepl_py.errors import ExitStatus

pytestmark = pytest.mark.zfs
HOSTILE = 'x"; touch /tmp/zbak-pwned; $(id) `id` \\ \n*'
SECRET = "s3cr3t-hook-test-0a9f7c"


@pytest.fixture
def rig(make_pool, tmp_path, capsys, monkeypatch):
    """Pools SRC (dataset ``data``) and BAK, a file store, a hook script, a webhook receiver
    for alerts; ``rig.config(hooks)`` writes the config with ``hooks`` (TOML after
    ``[jobs.data]``) and initialises the catalog. zbak's own environment holds what it may
    hold: AWS keys, a libpq password, the webhook URL the config names (a variable name
    without a secret word: the config's reference makes it secret)."""
    src, bak = make_pool(), make_pool()
    data = f"{src.name}/data"
    zfs("create", data)
    script = HookScript(tmp_path)
    receiver = Receiver("/alerts")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("PGPASSWORD", SECRET)
    monkeypatch.setenv("ZBAK_TEST_ALERTS_AT", receiver.url + "?k=" + SECRET)

    class Rig:
        hook, dataset, replica, mount = script, data, f"{bak.name}/replica", src.mountpoint / "data"
        alerts = receiver

        def config(self, hooks: str, *, target: str | None = None) -> Zbak:
            path, _ = file_archive_config(tmp_path, data, extra="\n".join([
                "[alerts.webhook]", 'url = { env = "ZBAK_TEST_ALERTS_AT" }',
                "[jobs.data.replicate]", f'targets = ["local:{target or self.replica}"]',
            ]) + textwrap.dedent(hooks))
            run = Zbak(path, capsys)
            status, out, err = run("init", "--no-checks")
            assert status == ExitStatus.OK, out + err
            return run

    yield Rig()
    receiver.close()


def zbak_vars(call: dict) -> dict:
    """The hook's ``ZBAK_*`` variables (the test run's own ``ZBAK_TEST_*`` left out)."""
    return {k: v for k, v in call["env"].items()
            if k.startswith("ZBAK_") and not k.startswith("ZBAK_TEST_")}


def hook_runs(run) -> list[tuple[str, str, str | None]]:
    """(target, result, error) of every hook run in ``zbak status --json``."""
    status, out, _ = run("status", "--json", "--offline")
    assert status == ExitStatus.OK
    return sorted((r["target"], r["result"], r["error"]) for job in json.loads(out)
                  for r in job["last_runs"] if r["action"] == "hook")


def test_pre_runs_before_the_snapshot_and_post_after_it_with_the_facts_in_the_environment(rig):
    run = rig.config(f"""
        [jobs.data.hooks.snapshot]
        pre = {rig.hook.toml("pre", HOSTILE, touch=rig.mount / "quiesced.txt")}
        post = {rig.hook.toml("post", touch=rig.mount / "thawed.txt")}
    """)
    status, out, err = run("snapshot")
    assert status == ExitStatus.OK, out + err
    (taken,) = snapshots(rig.dataset)
    pre, post = rig.hook.calls()
    assert pre["argv"] == ["pre", HOSTILE], "arguments arrive byte for byte, no shell"
    assert not os.path.exists("/tmp/zbak-pwned")
    assert zbak_vars(pre) == {
        "ZBAK_HOOK": "pre", "ZBAK_ACTION": "snapshot", "ZBAK_JOB": "data", "ZBAK_HOST": "local",
        "ZBAK_DATASET": rig.dataset, "ZBAK_TARGETS": "", "ZBAK_TIMEOUT": "30"}
    assert zbak_vars(post) == {
        "ZBAK_HOOK": "post", "ZBAK_ACTION": "snapshot", "ZBAK_JOB": "data", "ZBAK_HOST": "local",
        "ZBAK_DATASET": rig.dataset, "ZBAK_TARGETS": "", "ZBAK_TIMEOUT": "30",
        "ZBAK_RESULT": "ok", "ZBAK_PRE_RESULT": "ok", "ZBAK_ERROR": "", "ZBAK_BYTES": "0",
        "ZBAK_DATASETS": rig.dataset, "ZBAK_SNAPSHOT": taken}
    files = content_of(f"{rig.dataset}@{taken}", rig.dataset.split("/")[0], "hooks")
    assert "quiesced.txt" in files and "thawed.txt" not in files, \
        "pre ran before the snapshot, post after it"
    assert "pre-snapshot hook of job data: hook says: pre snapshot" in err, "output is logged"
    assert hook_runs(run) == [("post-snapshot", "ok", None), ("pre-snapshot", "ok", None)]


def test_no_secret_of_zbaks_environment_reaches_a_hook(rig):
    run = rig.config(f"""
        [jobs.data.hooks.snapshot]
        pre = {rig.hook.toml()}
    """)
    assert run("snapshot")[0] == ExitStatus.OK
    (call,) = rig.hook.calls()
    assert "PATH" in call["env"]
    assert not {"AWS_SECRET_ACCESS_KEY", "PGPASSWORD", "ZBAK_TEST_ALERTS_AT"} & set(call["env"])
    assert SECRET not in json.dumps(call)


@pytest.mark.parametrize(("policy", "then", "result"), [
    ("abort", "snapshot not run", "aborted"),
    ("continue", "snapshot ran anyway", "ok"),
])
def test_a_failing_pre_aborts_the_snapshot_or_not_and_post_runs_either_way(rig, policy, then,
                                                                           result):
    run = rig.config(f"""
        [jobs.data.hooks.snapshot]
        pre = {rig.hook.toml("pre", exit_code=3)}
        post = {rig.hook.toml("post")}
        on_pre_failure = "{policy}"
    """)
    status, _, err = run("snapshot")
    assert status == ExitStatus.FAILED
    assert ("zbak: job data: the pre-snapshot hook of job data failed: exited 3: hook says: pre"
            f" snapshot; {then} (on_pre_failure = {policy})") in err
    taken = snapshots(rig.dataset)
    assert len(taken) == (policy == "continue")
    post = zbak_vars(rig.hook.calls()[1])
    assert (post["ZBAK_RESULT"], post["ZBAK_PRE_RESULT"], post["ZBAK_SNAPSHOT"]) == \
        (result, "failed", "".join(taken))
    if policy == "abort":
        assert post["ZBAK_ERROR"].startswith("not run: the pre-snapshot hook of job data failed")
    assert hook_runs(run) == [("post-snapshot", "ok", None),
                              ("pre-snapshot", "failed", "exited 3: hook says: pre snapshot")]
    (alert,) = [b for _, _, b in rig.alerts.posts]
    assert (alert["kind"], alert["action"], alert["target"]) == ("failure", "hook", "pre-snapshot")
    assert SECRET not in json.dumps(alert)


def test_a_hanging_pre_is_stopped_at_its_timeout_with_its_children_and_post_runs(rig, tmp_path):
    pidfile = tmp_path / "sleeper.pid"
    run = rig.config(f"""
        [jobs.data.hooks.snapshot]
        pre = ["/bin/sh", "-c", "sleep 3001 & echo $! > {pidfile}; echo waiting; wait"]
        post = {rig.hook.toml("post")}
        timeout = "2s"
        on_pre_failure = "abort"
    """)
    status, _, err = run("snapshot")
    assert status == ExitStatus.FAILED
    assert "pre-snapshot hook of job data failed: timed out after 2s: stopped: waiting" in err
    sleeper = int(pidfile.read_text())
    assert not os.path.exists(f"/proc/{sleeper}") or \
        open(f"/proc/{sleeper}/stat").read().split()[2] == "Z", "the hook's child was stopped"
    assert snapshots(rig.dataset) == []
    assert zbak_vars(rig.hook.calls()[0])["ZBAK_RESULT"] == "aborted"


def test_post_runs_after_a_failed_replication_and_gets_the_error(rig):
    run = rig.config(f"""
        [jobs.data.hooks.replicate]
        pre = {rig.hook.toml("pre")}
        post = {rig.hook.toml("post")}
    """, target="nosuchpool/replica")
    assert run("snapshot")[0] == ExitStatus.OK
    status, _, _ = run("replicate")
    assert status == ExitStatus.FAILED
    pre, post = (zbak_vars(c) for c in rig.hook.calls())
    assert pre["ZBAK_TARGETS"] == "local:nosuchpool/replica"
    assert (post["ZBAK_RESULT"], post["ZBAK_PRE_RESULT"]) == ("failed", "ok")
    assert post["ZBAK_ERROR"].startswith("local:nosuchpool/replica: ")
    assert hook_runs(run) == [("post-replicate", "ok", None), ("pre-replicate", "ok", None)]


def test_replicate_and_archive_tell_post_the_bytes_and_the_newest_snapshot(rig):
    run = rig.config(f"""
        [jobs.data.hooks.replicate]
        post = {rig.hook.toml("post")}
        [jobs.data.hooks.archive]
        post = {rig.hook.toml("post")}
    """)
    with open(rig.mount / "file.bin", "wb") as f:  # zfs-fuse sees FUSE writes once flushed
        f.write(os.urandom(200_000))
        os.fsync(f.fileno())
    assert run("snapshot")[0] == ExitStatus.OK
    (taken,) = snapshots(rig.dataset)
    assert run("replicate")[0] == ExitStatus.OK
    assert run("archive")[0] == ExitStatus.OK
    replicated, archived = (zbak_vars(c) for c in rig.hook.calls())
    assert (replicated["ZBAK_RESULT"], replicated["ZBAK_SNAPSHOT"]) == ("ok", taken)
    assert (archived["ZBAK_RESULT"], archived["ZBAK_SNAPSHOT"]) == ("ok", taken)
    assert archived["ZBAK_TARGETS"] == "cold" and archived["ZBAK_DATASETS"] == rig.dataset
    recorded = {r["action"]: r["bytes"] for job in json.loads(run("status", "--json")[1])
                for r in job["last_runs"]}
    assert int(replicated["ZBAK_BYTES"]) == recorded["replicate"] > 0
    assert int(archived["ZBAK_BYTES"]) == recorded["archive"] > 200_000
    assert replicated["ZBAK_PRE_RESULT"] == "none"


def test_a_failing_post_after_a_good_snapshot_is_a_recorded_alerted_failure(rig):
    run = rig.config(f"""
        [jobs.data.hooks.snapshot]
        post = {rig.hook.toml("post", exit_code=5)}
    """)
    status, _, err = run("snapshot")
    assert status == ExitStatus.FAILED and len(snapshots(rig.dataset)) == 1
    assert "the post-snapshot hook of job data failed: exited 5" in err
    assert hook_runs(run) == [("post-snapshot", "failed", "exited 5: hook says: post snapshot")]
    (alert,) = [b for _, _, b in rig.alerts.posts]
    assert alert["message"] == ("hook of job data for post-snapshot ended failed: exited 5:"
                                " hook says: post snapshot")


def test_dry_runs_run_no_hook_and_prune_and_audit_run_theirs_audit_findings_as_failed(
    rig, tmp_path
):
    run = rig.config(f"""
        [jobs.data.hooks.replicate]
        pre = {rig.hook.toml("pre")}
        post = {rig.hook.toml("post")}
        [jobs.data.hooks.prune]
        pre = {rig.hook.toml("pre")}
        post = {rig.hook.toml("post")}
        [jobs.data.hooks.audit]
        post = {rig.hook.toml("post")}
    """)
    assert run("snapshot")[0] == ExitStatus.OK
    for action in ("replicate", "archive", "prune"):
        assert run(action, "--dry-run")[0] == ExitStatus.OK
    assert rig.hook.calls() == [], "a dry run changes nothing: no hook runs"
    assert run("archive")[0] == ExitStatus.OK
    assert run("prune")[0] == ExitStatus.OK
    next((tmp_path / "store").rglob("vol-000000.zst")).unlink()
    assert run("audit")[0] == ExitStatus.AUDIT_FINDINGS
    pre, post, audited = (zbak_vars(c) for c in rig.hook.calls())
    assert (pre["ZBAK_ACTION"], pre["ZBAK_TARGETS"]) == ("prune", "cold")
    assert (post["ZBAK_RESULT"], post["ZBAK_DATASETS"]) == ("ok", rig.dataset)
    assert (audited["ZBAK_ACTION"], audited["ZBAK_RESULT"]) == ("audit", "failed")
    assert "error(s)" in audited["ZBAK_ERROR"]
