"""The shipped dashboard and alert rules against a real Prometheus (Debian's package) that
scrapes a real ``zbak daemon`` after real snapshot, replicate, archive, audit and drill runs on
zfs-fuse pools with a file:// store (docs/monitoring.md).

Grafana is not in Debian, so what is checked is the PromQL: every query of every panel of
monitoring/grafana/zbak.json, its variables substituted as Grafana would, returns at least one
series through Prometheus's HTTP API; every rule of monitoring/prometheus/zbak-rules.yml
evaluates without error on the real series, and the one alert the world is built to trip
(``protection_budget.max_bytes`` far below what the replication base pins) fires.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
import yaml
from support.cli import initialised, write_synced, zfs
from support.common import free_port, need_binary

from zrepl_py.errors import ExitStatus

pytestmark = pytest.mark.zfs

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "monitoring" / "grafana" / "zbak.json"
RULES = ROOT / "monitoring" / "prometheus" / "zbak-rules.yml"
NEVER = "0 0 1 1 *"
T = TypeVar("T")
DEADLINE = 45.0
"""Seconds for the daemon's first run and Prometheus's scrapes and evaluations to show up
(each 1 s apart; a loaded 2-CPU host is slow)."""


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def until(check: Callable[[], T], what: Callable[[], str]) -> T:
    """Poll ``check()`` until it returns something true; at DEADLINE fail with ``what()``."""
    deadline = time.monotonic() + DEADLINE
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"no {what()} within {DEADLINE} s")
        time.sleep(0.25)


def panel_queries(job: str) -> dict[str, str]:
    """``panel title / refId`` -> its PromQL with the dashboard's variables as Grafana
    substitutes them for one selected job (a regex matcher gets the value itself)."""
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert variables == {"datasource", "job"}, "a new variable needs a value here"
    found = {}
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"].replace("${job}", job).replace("$job", job)
            assert "$" not in expr, (panel["title"], expr)
            found[f"{panel['title']} / {target['refId']}"] = expr
    return found


class Prometheus:
    """``prometheus`` on 127.0.0.1 (free port), its TSDB in ``tmp``, scraping ``metrics`` as
    scrape job "zbak" with zbak's own labels kept (``honor_labels``), every second."""

    def __init__(self, binary: str, tmp: Path, metrics: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = tmp / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": "zbak", "honor_labels": True,
                                "static_configs": [{"targets": [metrics]}]}],
        }))
        self.log = tmp / "prometheus.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        until(self.ready, lambda: "answer of prometheus at /-/ready")

    def ready(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=5) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError):
            return False

    def query(self, expr: str) -> list[dict]:
        answer = get(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def rules(self) -> list[dict]:
        groups = get(self.url + "/api/v1/rules")["data"]["groups"]
        return [rule for group in groups for rule in group["rules"]]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


@pytest.fixture
def watched(make_pool, tmp_path, capsys):
    """Job j: a.bin (400 kB) only in s1, the replica's cursor; b.bin (200 kB) only in s2, the
    archive chain's tip; both gone from the live data; then a real daemon (snapshots every
    2 s, so it runs and reads the held bytes) serving /metrics, and Prometheus scraping it."""
    prometheus_bin = need_binary("prometheus", "prometheus")
    src, bak = make_pool(), make_pool()
    data, replica = f"{src.name}/data", f"{bak.name}/replica"
    zfs("create", data)
    zfs("create", f"{bak.name}/scratch")
    (tmp_path / "store").mkdir()
    listen = f"127.0.0.1:{free_port()}"
    run = initialised(tmp_path, f"""
        [daemon]
        log_format = "json"
        prune_schedule = "{NEVER}"
        audit_schedule = "{NEVER}"
        every = {{ snapshot = "2s" }}
        [metrics]
        listen = "{listen}"
        [stores.cold]
        url = "file://{tmp_path / 'store'}"
        [restore]
        scratch = "{bak.name}/scratch"
        [jobs.j]
        dataset = "{data}"
        [jobs.j.snapshot]
        schedule = "{NEVER}"
        retention = {{ keep_last = 100 }}
        [jobs.j.replicate]
        targets = ["local:{replica}"]
        schedule = "{NEVER}"
        protection_budget = {{ max_bytes = "100K", max_age = "7d" }}
        [jobs.j.archive]
        store = "cold"
        schedule = "{NEVER}"
        [jobs.j.drill]
        schedule = "{NEVER}"
    """, capsys)
    live = src.mountpoint / "data"

    def ok(*args: str) -> None:
        status, out, err = run(*args)
        assert status == ExitStatus.OK, (args, out, err)

    write_synced(live / "a.bin", os.urandom(400_000))
    ok("snapshot")
    ok("replicate")
    (live / "a.bin").unlink()
    write_synced(live / "b.bin", os.urandom(200_000))
    time.sleep(1.1)  # snapshot names have one-second resolution
    ok("snapshot")
    ok("archive")
    (live / "b.bin").unlink()
    os.sync()
    ok("audit")
    ok("drill")
    with open(tmp_path / "daemon.log", "w") as log:
        daemon = subprocess.Popen([sys.executable, "-m", "zrepl_py", "--config",
                                   str(run.config), "daemon"],
                                  stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    prometheus = None
    try:
        prometheus = Prometheus(prometheus_bin, tmp_path, listen)
        yield prometheus, replica
    finally:
        if prometheus is not None:
            prometheus.stop()
        daemon.send_signal(signal.SIGTERM)
        try:
            assert daemon.wait(60) == 0, (tmp_path / "daemon.log").read_text()
        finally:
            if daemon.poll() is None:
                daemon.kill()


def test_every_dashboard_query_returns_series_and_every_rule_evaluates(watched):
    prometheus, replica = watched
    queries = panel_queries("j")

    def empty() -> list[str]:
        return [name for name, expr in queries.items() if not prometheus.query(expr)]

    until(lambda: not empty(), lambda: f"series for every panel (still empty: {empty()})")

    # The replication base (s1, a.bin) pins about 400 kB; with the archive's tip (s2, b.bin)
    # the holds pin about 200 kB more: the budget's figure counts the cursors alone.
    (held,) = prometheus.query('zbak_held_bytes{job="j"}')
    (base,) = prometheus.query('zbak_replication_held_bytes{job="j"}')
    assert 400_000 <= float(base["value"][1]) <= float(held["value"][1]) - 150_000, (base, held)
    assert base["metric"]["instance"] == held["metric"]["instance"]

    def firing() -> list[dict]:
        return [a for r in prometheus.rules() for a in r.get("alerts", [])
                if a["state"] == "firing"]

    alerts = until(firing, lambda: f"alert firing (rules: {prometheus.rules()})")
    assert [(a["labels"]["alertname"], a["labels"]["job"]) for a in alerts] == \
        [("ZbakProtectionBudgetBytesExceeded", "j")]
    rules = prometheus.rules()
    shipped = [rule for group in yaml.safe_load(RULES.read_text())["groups"]
               for rule in group["rules"]]
    assert len(rules) == len(shipped), "every shipped rule is loaded"
    assert [(r["name"], r["lastError"]) for r in rules if r["health"] != "ok"] == []
    (target,) = prometheus.query('zbak_replication_lag_snapshots{job="j"}')
    assert target["metric"]["target"] == f"local:{replica}", "zbak's labels kept"
