"""``zbak status --watch`` in a real terminal (tmux) while a real ``zbak replicate`` moves a
256 MiB full under a bandwidth limit (zfs-fuse: the full's expected size is its snapshot's
``referenced``, docs/design.md#running-transfers): the transfer's row shows an ETA that falls,
the figures the pane shows are the ones ``zbak status --json`` gives, and once the run ended
the pane's last run is the catalog's. Off a terminal, ``--watch`` prints a block per refresh
and ``--watch --json`` a JSON line per refresh; an incremental on zfs-fuse has no expected
size, so its ETA is "unknown".
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import textwrap
import time

import pytest
from support.cli import ZBAK_TIMEOUT, run_zbak, start_zbak, zbak_argv, zfs

from zrepl_py.observe.progress import format_size

pytestmark = [pytest.mark.zfs, pytest.mark.slow]

MiB = 1024 * 1024
SIZE = 256 * MiB
LIMIT = 32 * MiB
"""8 s for the full at the limit: 16 refreshes of the pane, also while the test asks
``zbak status --json`` (a few seconds on a loaded host)."""
ETA = re.compile(r"\b(\d+:\d\d:\d\d)\b")


def _config(tmp_path, data, target, limit=LIMIT):
    """One dataset at a time: its pv starts at the whole limit (with more, at the limit over
    the concurrency until a ``pv -R`` raises it, which a loaded host can miss)."""
    config = tmp_path / "zbak.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n' + textwrap.dedent(f"""
        [jobs.big]
        dataset = "{data}"
        [jobs.big.replicate]
        targets = ["local:{target}"]
        bandwidth_limit = {limit}
        concurrency = 1
    """))
    assert run_zbak("--config", str(config), "init", "--no-checks")[0] == 0
    return config


def _interruptible(config, *args):
    """Start ``zbak ARGS`` with SIGINT at its default, as Ctrl-C finds it in a terminal: a
    shell that runs the suite in the background starts it with SIGINT ignored, which every
    child keeps (seen: the watchers ignored the test's SIGINT and ran on)."""
    return subprocess.Popen(zbak_argv("--config", str(config), *args), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _fill(path, size):
    with open(path, "wb") as handle:
        for _ in range(size // MiB):
            handle.write(os.urandom(MiB))


class Tmux:
    """A tmux server of its own (its socket under the test's directory), one window."""

    def __init__(self, socket, command, width=160, height=48):
        self.base = ["tmux", "-S", str(socket)]
        # A tmux server started by a process without a terminal (pytest) hands its windows
        # COLUMNS=80 LINES=24, which rich obeys before the pane's real size (seen: every
        # table squeezed into 80 columns of the 160): the pane's size is what is tested.
        subprocess.run([*self.base, "new-session", "-d", "-x", str(width), "-y", str(height),
                        f"env -u COLUMNS -u LINES {command}"], check=True, timeout=30)

    def capture(self) -> str:
        return subprocess.run([*self.base, "capture-pane", "-p"], check=True, timeout=30,
                              capture_output=True, text=True).stdout

    def close(self):
        subprocess.run([*self.base, "kill-server"], timeout=30, check=False)


def _seconds(eta: str) -> int:
    hours, minutes, seconds = (int(p) for p in eta.split(":"))
    return hours * 3600 + minutes * 60 + seconds


def _row(screen: str, dataset: str) -> str | None:
    return next((line for line in screen.splitlines() if f"{dataset}@" in line
                 and "replicate" in line), None)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_watch_in_a_terminal_shows_a_falling_eta_and_the_figures_of_status_json(
        make_pool, tmp_path):
    src, bak = make_pool("768M"), make_pool("768M")
    data = f"{src.name}/data"
    zfs("create", data)
    _fill(src.mountpoint / "data" / "random.bin", SIZE)
    zfs("snapshot", f"{data}@s1")
    config = _config(tmp_path, data, f"{bak.name}/replica")
    watch = shlex.join(zbak_argv("--config", str(config), "status", "--watch", "--interval", "0.5"))
    tmux = Tmux(tmp_path / "tmux.sock", f"{watch} 2>{tmp_path / 'watch.err'}")
    try:
        proc = start_zbak("--config", str(config), "replicate", text=True)
        etas: list[int] = []
        shown_expected = json_expected = None
        deadline = time.monotonic() + ZBAK_TIMEOUT
        screens = []
        while proc.poll() is None and time.monotonic() < deadline:
            screens.append(tmux.capture())
            row = _row(screens[-1], data)
            found = ETA.search(row or "")
            if found and (not etas or _seconds(found[1]) != etas[-1]):
                etas.append(_seconds(found[1]))
                if json_expected is None:
                    status, out, err = run_zbak("--config", str(config), "status", "--json", "--offline")
                    assert status == 0, out + err
                    (job,) = json.loads(out)
                    (transfer,) = job["transfers"]
                    json_expected = transfer["expected_bytes"]
                    assert transfer["expected_source"] == "referenced"
                    assert transfer["rate_limit"] == LIMIT
                    shown_expected = row
            time.sleep(0.2)  # the pane redraws every 0.5 s: sample it between
        out, err = proc.communicate(timeout=ZBAK_TIMEOUT)
        assert proc.returncode == 0, out + err
        rows = [_row(screen, data) for screen in screens]
        print("ETAs seen:", etas, "rows:", [r for i, r in enumerate(rows) if r and rows[i - 1] != r])
        assert len(etas) >= 3, f"the ETA was shown in at most {len(etas)} refreshes: {etas}"
        assert etas[-1] < etas[0], f"the ETA did not fall: {etas}"
        assert json_expected is not None and json_expected >= SIZE
        assert format_size(json_expected) in shown_expected, (shown_expected, json_expected)
        assert "33.6 MB/s" in shown_expected, "the limit in force is shown"

        status, out, err = run_zbak("--config", str(config), "status", "--json", "--offline")
        (job,) = json.loads(out)
        (run,) = [r for r in job["last_runs"] if r["action"] == "replicate"]
        assert run["result"] == "ok" and run["bytes"] >= SIZE
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the next refresh shows the run's end
            screen = tmux.capture()
            final = next((line for line in screen.splitlines()
                          if "replicate" in line and " ok " in line), None)
            if final is not None and _row(screen, data) is None:
                break
            time.sleep(0.2)
        print(screen)
        assert final is not None and str(run["bytes"]) in final, final
        assert run["ended_at"][:19].replace("T", " ") in final
    finally:
        tmux.close()
    assert (tmp_path / "watch.err").read_text() == ""


def test_watch_off_a_terminal_prints_blocks_and_json_lines_and_an_incremental_eta_is_unknown(
        make_pool, tmp_path):
    src, bak = make_pool(), make_pool()
    data = f"{src.name}/data"
    zfs("create", data)
    zfs("snapshot", f"{data}@s0")
    config = _config(tmp_path, data, f"{bak.name}/replica", limit=4 * MiB)
    assert run_zbak("--config", str(config), "replicate")[0] == 0
    _fill(src.mountpoint / "data" / "random.bin", 16 * MiB)  # 4 s at the limit
    zfs("snapshot", f"{data}@s1")
    proc = start_zbak("--config", str(config), "replicate", text=True)
    plain = _interruptible(config, "status", "--watch", "--interval", "0.5")
    lines = _interruptible(config, "status", "--watch", "--json", "--interval", "0.5")
    try:
        out, err = proc.communicate(timeout=ZBAK_TIMEOUT)
        assert proc.returncode == 0, out + err
    finally:
        for watcher in (plain, lines):
            watcher.send_signal(signal.SIGINT)
    try:
        text, err = plain.communicate(timeout=60)
        docs, json_err = lines.communicate(timeout=60)
    finally:  # one that ignored the SIGINT is not left running
        for watcher in (plain, lines):
            watcher.kill()
    assert plain.returncode == 0, err
    assert text.count("transfers at ") >= 2, "one block per refresh"
    running = [line for line in text.splitlines() if f"{data}@s0 -> @s1" in line]
    assert running, text
    assert all(" unknown " in line for line in running), running
    assert lines.returncode == 0, json_err
    views = [json.loads(line) for line in docs.splitlines()]
    moving = [t for v in views for t in v["transfers"]]
    assert moving and all(t["expected_bytes"] is None and t["eta_seconds"] is None
                          and t["from_snapshot"] == "s0" for t in moving), moving
    queues = [q for v in views for q in v["queues"]]
    assert queues and all((q["job"], q["kind"], q["where"]) == ("big", "replicate",
                          f"local:{bak.name}/replica") for q in queues), queues
    assert any(q["running"] == 1 and q["waiting"] == 0 and q["done"] == 0 for q in queues)
    assert all(q["rate_limit"] == 4 * MiB for q in queues)
    assert all(v["bandwidth_limits"] == {"big": {"replicate": {
        "limit": 4 * MiB, "window": None, "until": None}}} for v in views)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_progress_bars_on_a_terminal_show_the_eta(make_pool, tmp_path):
    """``zbak replicate`` and ``zbak archive`` typed in a terminal draw a progress bar whose
    ETA falls (a zfs-fuse full: its expected size is the snapshot's ``referenced``)."""
    src, bak = make_pool(), make_pool()
    data = f"{src.name}/data"
    zfs("create", data)
    _fill(src.mountpoint / "data" / "random.bin", 48 * MiB)  # 6 s at the limit
    zfs("snapshot", f"{data}@s1")
    config = _config(tmp_path, data, f"{bak.name}/replica", limit=8 * MiB)
    store = tmp_path / "store"
    store.mkdir(mode=0o700)
    with open(config, "a") as handle:
        handle.write(textwrap.dedent(f"""
            [stores.cold]
            url = "file://{store}"
            bandwidth_limit = "8MiB"
            [jobs.big.archive]
            store = "cold"
        """))
    for action in ("replicate", "archive"):
        done = tmp_path / f"{action}.done"
        command = shlex.join(zbak_argv("--config", str(config), action))
        tmux = Tmux(tmp_path / f"{action}.sock", f"sh -c '{command}; touch {done}; sleep 60'")
        etas: list[int] = []
        try:
            deadline = time.monotonic() + ZBAK_TIMEOUT
            while not done.exists() and time.monotonic() < deadline:
                bar = next((line for line in tmux.capture().splitlines()
                            if f"{data}@s1 ->" in line and "ETA" in line), "")
                found = re.search(r"ETA (\d+:\d\d:\d\d)", bar)
                if found and (not etas or _seconds(found[1]) != etas[-1]):
                    etas.append(_seconds(found[1]))
                time.sleep(0.2)
        finally:
            tmux.close()
        print(action, "ETAs on the bar:", etas)
        assert len(etas) >= 2 and etas[-1] < etas[0], f"{action}: {etas}"
