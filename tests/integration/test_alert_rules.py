"""The shipped Prometheus alert rules (monitoring/prometheus/zbak-rules.yml, installed as
share/zbak/prometheus/zbak-rules.yml) under Debian's real ``promtool``: ``check rules``
passes, and ``test rules`` (its input written here from ``CASES``) sees every alert fire
where it should and stay quiet where it should not (docs/monitoring.md#alert-rules).

The limits are input series as Prometheus stores what zbak exports (``zbak_stale_after_seconds``
with the scrape job's ``job``, ``zbak_protection_budget_*``), kept small so the evaluation
windows stay short; each case has a second daemon (``instance`` h2) or a second job whose
figures must not fire, which fails a rule that matches limits across daemons or jobs.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from support.common import need_binary

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "monitoring" / "prometheus" / "zbak-rules.yml"

HOUR = 3600


def stale_case(alert: str, metric: str, action: str, who: dict[str, str],
               summary: str, description: str) -> dict:
    """h1's newest success is from time 0 and its limit one hour; h2 has the same success
    but a limit of 100 h, and h1's second series keeps succeeding (its timestamp follows the
    clock); where the metric has an ``action``, another action's equally old success must
    not fire either. Fires for h1's old series only, once ``for: 5m`` has passed."""
    old = {"instance": "h1", "job": "a", **who}
    fresh = {**old, "job": "b"}
    other = {**old, "instance": "h2"}
    decoys = [{**old, "action": "snapshot", "target": ""}] if "action" in who else []
    # A limit has no zbak job label, so with honor_labels it carries the scrape job's.
    limit = {"job": "zbak", "action": action}
    return {
        "interval": "1m",
        "input_series": [
            {"series": series(metric, old), "values": "0x80"},
            {"series": series(metric, fresh), "values": "0+60x80"},
            {"series": series(metric, other), "values": "0x80"},
            *({"series": series(metric, decoy), "values": "0x80"} for decoy in decoys),
            {"series": series("zbak_stale_after_seconds", {**limit, "instance": "h1"}),
             "values": f"{HOUR}x80"},
            {"series": series("zbak_stale_after_seconds", {**limit, "instance": "h2"}),
             "values": f"{100 * HOUR}x80"},
        ],
        "alert_rule_test": [
            {"eval_time": "59m", "alertname": alert, "exp_alerts": []},
            {"eval_time": "63m", "alertname": alert, "exp_alerts": []},  # pending (for: 5m)
            {"eval_time": "70m", "alertname": alert, "exp_alerts": [
                {"exp_labels": {**old, "severity": "critical" if action != "drill" else "warning"},
                 "exp_annotations": {"summary": summary, "description": description}}]},
        ],
    }


def flag_case(alert: str, metric: str, bad: dict[str, str], good: dict[str, str],
              summary: str, description: str) -> dict:
    """``metric`` is 0 for ``bad`` and 1 for ``good``: fires at once, for ``bad`` only."""
    return {
        "interval": "1m",
        "input_series": [{"series": series(metric, bad), "values": "0x10"},
                         {"series": series(metric, good), "values": "1x10"}],
        "alert_rule_test": [{"eval_time": "1m", "alertname": alert, "exp_alerts": [
            {"exp_labels": {**bad, "severity": "critical"},
             "exp_annotations": {"summary": summary, "description": description}}]}],
    }


def series(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


REPLICA = {"target": "backup:tank/r"}
CASES: dict[str, list[dict]] = {
    "ZbakReplicationStale": [stale_case(
        "ZbakReplicationStale", "zbak_last_success_timestamp_seconds", "replicate",
        {"action": "replicate", **REPLICA},
        "zbak job a: no successful replication to backup:tank/r for 1h 10m 0s",
        "Longer than [alerts] stale_after.replicate. Run `zbak status a` and"
        " `zbak replicate a` on the source host.")],
    "ZbakArchiveStale": [stale_case(
        "ZbakArchiveStale", "zbak_last_success_timestamp_seconds", "archive",
        {"action": "archive", "target": "cold:tank/data"},
        "zbak job a: no successful archive to cold:tank/data for 1h 10m 0s",
        "Longer than [alerts] stale_after.archive. Run `zbak status a` and `zbak archive a`.")],
    "ZbakCopyStale": [stale_case(
        "ZbakCopyStale", "zbak_last_success_timestamp_seconds", "copy",
        {"action": "copy", "target": "offsite:tank/data"},
        "zbak job a: no successful copy to offsite:tank/data for 1h 10m 0s",
        "Longer than [alerts] stale_after.copy. Run `zbak status a` and `zbak copy a`.")],
    "ZbakDrillStale": [stale_case(
        "ZbakDrillStale", "zbak_drill_last_success_timestamp_seconds", "drill",
        {"source": "cold"},
        "zbak job a: no successful restore drill from cold for 1h 10m 0s",
        "Longer than [alerts] stale_after.drill. Check [jobs.a.drill] schedule, or run"
        " `zbak drill a`.")],
    "ZbakAuditFailed": [flag_case(
        "ZbakAuditFailed", "zbak_audit_ok", {"instance": "h1", "job": "a"},
        {"instance": "h1", "job": "b"},
        "zbak job a: the newest audit found problems", "Run `zbak audit a` to see them.")],
    "ZbakDrillFailed": [flag_case(
        "ZbakDrillFailed", "zbak_drill_ok", {"instance": "h1", "job": "a", "source": "cold"},
        {"instance": "h1", "job": "a", "source": "backup:tank/r"},
        "zbak job a: the newest restore drill from cold failed",
        "A restore from this source did not give back the source's data."
        " Run `zbak drill a --from cold`.")],
    "ZbakProtectionBudgetBytesExceeded": [{
        # Job a pins 2 GB over its 1 GB; job b pins 2 GB within its 3 GB; job c has no budget.
        "interval": "1m",
        "input_series": [
            {"series": series("zbak_replication_held_bytes", {"instance": "h1", "job": j}),
             "values": "2000000000x10"} for j in ("a", "b", "c")] + [
            {"series": series("zbak_protection_budget_max_bytes", {"instance": "h1", "job": j}),
             "values": f"{limit}x10"} for j, limit in (("a", 10**9), ("b", 3 * 10**9))],
        "alert_rule_test": [{"eval_time": "1m", "alertname": "ZbakProtectionBudgetBytesExceeded",
                             "exp_alerts": [{
            "exp_labels": {"instance": "h1", "job": "a", "severity": "warning"},
            "exp_annotations": {
                "summary": "zbak job a: replication bases pin 1.863GiB, over"
                           " protection_budget.max_bytes",
                "description": "The source pool cannot free them until the targets catch up:"
                               " is a target offline?"}}]}],
    }],
    "ZbakProtectionBudgetAgeExceeded": [{
        # Job a's cursor snapshot is from time 0, over its 1 h; job b's follows the clock.
        "interval": "1m",
        "input_series": [
            {"series": series("zbak_replication_cursor_timestamp_seconds",
                              {"instance": "h1", "job": "a", **REPLICA, "dataset": "tank/data"}),
             "values": "0x130"},
            {"series": series("zbak_replication_cursor_timestamp_seconds",
                              {"instance": "h1", "job": "b", **REPLICA, "dataset": "tank/data"}),
             "values": "0+60x130"}] + [
            {"series": series("zbak_protection_budget_max_age_seconds",
                              {"instance": "h1", "job": j}), "values": f"{HOUR}x130"}
            for j in ("a", "b")],
        "alert_rule_test": [
            {"eval_time": "50m", "alertname": "ZbakProtectionBudgetAgeExceeded", "exp_alerts": []},
            {"eval_time": "2h", "alertname": "ZbakProtectionBudgetAgeExceeded", "exp_alerts": [{
                "exp_labels": {"instance": "h1", "job": "a", **REPLICA, "dataset": "tank/data",
                               "severity": "warning"},
                "exp_annotations": {
                    "summary": "zbak job a: the replication base of tank/data for"
                               " backup:tank/r is 2h 0m 0s old, over protection_budget.max_age",
                    "description": "The target has not caught up since: is it offline?"}}]}],
    }],
    "ZbakCopyLagging": [{
        # Job a's copy in store off lags 2 h, over its 1 h; job b's 10 min, within it; job a
        # on daemon h2 lags as long with 100 h allowed; job c's copy has no limit.
        "interval": "1m",
        "input_series": [
            {"series": series("zbak_copy_lag_seconds", {"instance": h, "job": j, "store": "off"}),
             "values": f"{lag}x10"}
            for h, j, lag in (("h1", "a", 2 * HOUR), ("h1", "b", 600), ("h2", "a", 2 * HOUR),
                              ("h1", "c", 2 * HOUR))] + [
            {"series": series("zbak_copy_max_lag_seconds",
                              {"instance": h, "job": j, "store": "off"}),
             "values": f"{limit}x10"}
            for h, j, limit in (("h1", "a", HOUR), ("h1", "b", HOUR), ("h2", "a", 100 * HOUR))],
        "alert_rule_test": [{"eval_time": "1m", "alertname": "ZbakCopyLagging", "exp_alerts": [{
            "exp_labels": {"instance": "h1", "job": "a", "store": "off", "severity": "warning"},
            "exp_annotations": {
                "summary": "zbak job a: the copy in store off lags 2h 0m 0s, over its max_lag",
                "description": "A stream has waited that long to be copied there. Run"
                               " `zbak status a` and `zbak copy a --to off`."}}]}],
    }],
    "ZbakDaemonDown": [{
        # h1 stops answering at 0; h2 keeps answering; an unrelated scrape job is down too.
        "interval": "1m",
        "input_series": [{"series": 'up{job="zbak", instance="h1"}', "values": "0x10"},
                         {"series": 'up{job="zbak", instance="h2"}', "values": "1x10"},
                         {"series": 'up{job="node", instance="h1"}', "values": "0x10"}],
        "alert_rule_test": [
            {"eval_time": "4m", "alertname": "ZbakDaemonDown", "exp_alerts": []},
            {"eval_time": "6m", "alertname": "ZbakDaemonDown", "exp_alerts": [{
                "exp_labels": {"job": "zbak", "instance": "h1", "severity": "critical"},
                "exp_annotations": {
                    "summary": "zbak daemon h1 does not answer scrapes",
                    "description": "Nothing is snapshotted, replicated or archived while it is"
                                   " down. Check `systemctl status zbak`."}}]}],
    }],
}


@pytest.fixture
def promtool():
    """Run Debian's ``promtool`` (package prometheus); skipped without it, failed in CI."""
    path = need_binary("promtool", "promtool")
    return lambda *args: subprocess.run([path, *map(str, args)], capture_output=True,
                                        text=True, timeout=60)


def test_promtool_check_rules_passes(promtool):
    done = promtool("check", "rules", RULES)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 10 rules found" in done.stdout


def test_every_alert_of_the_rules_file_has_a_case():
    rules = yaml.safe_load(RULES.read_text())
    alerts = {r["alert"] for group in rules["groups"] for r in group["rules"]}
    assert alerts == set(CASES)


def test_promtool_sees_each_alert_fire_where_it_should_and_nowhere_else(promtool, tmp_path):
    spec = tmp_path / "zbak-rules-test.yml"
    spec.write_text(yaml.safe_dump({
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [case for cases in CASES.values() for case in cases],
    }, sort_keys=False))
    done = promtool("test", "rules", spec)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout
