"""Alerts delivered to a real local webhook receiver (http.server) and SMTP sink (aiosmtpd),
raised by real recorded runs and staleness checks against a real SQLite catalog."""

from __future__ import annotations

import datetime as dt
import email
import email.policy
import json
import logging
import socket
import time

import pytest
import tenacity
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword
from support.receiver import Receiver

from zrepl_py import alerts
from zrepl_py.alerts.webhook import WebhookSink
from zrepl_py.clock import FixedClock
from zrepl_py.config.replicate import ProtectionBudget
from zrepl_py.config.schema import Config
from zrepl_py.config.secret import Secret
from zrepl_py.errors import AlertDeliveryFailed, SecretUnavailable, ZbakError
from zrepl_py.observe import events
from zrepl_py.observe.runlog import recorded_run
from zrepl_py.replication.job import budget_warnings

UTC = dt.UTC
T0 = dt.datetime(2026, 3, 1, 2, 0, tzinfo=UTC)
TOKEN = "tok-3f9a1c77e2b4d0"
PASSWORD = "pw-91c2e7aa0b"
_dispatchers: list = []  # installed in this test; flushed before anything received is read


def _flush_all() -> None:
    for dispatcher in _dispatchers:
        assert dispatcher.flush(30), "alerts delivered within 30 s"


class MailSink:
    """An SMTP server on 127.0.0.1 (aiosmtpd) that requires AUTH as zbak/PASSWORD."""

    def __init__(self):
        self._mails: list[email.message.EmailMessage] = []
        self.logins: list[bytes] = []
        sink = self

        class Handler:
            async def handle_DATA(self, server, session, envelope):
                sink._mails.append(email.message_from_bytes(envelope.content,
                                                           policy=email.policy.default))
                return "250 OK"

        def authenticator(server, session, envelope, mechanism, auth_data):
            ok = (isinstance(auth_data, LoginPassword) and auth_data.login == b"zbak"
                  and auth_data.password == PASSWORD.encode())
            sink.logins.append(auth_data.login if ok else b"refused")
            return AuthResult(success=ok, handled=False)

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port,
                                     authenticator=authenticator, auth_require_tls=False)
        self.controller.start()

    @property
    def mails(self) -> list[email.message.EmailMessage]:
        """Every mail received, once queued alerts are out."""
        _flush_all()
        return self._mails

    def close(self):
        self.controller.stop()


@pytest.fixture
def receiver():
    r = Receiver(f"/hooks/{TOKEN}", flush=_flush_all)
    yield r
    r.close()


@pytest.fixture
def mailsink():
    # aiosmtpd logs every SMTP line from its own thread; keep that out of the root handlers
    # (an earlier CLI test may have left one on a closed stream).
    server_log = logging.getLogger("mail.log")
    level, server_log.level = server_log.level, logging.WARNING
    m = MailSink()
    yield m
    m.close()
    server_log.setLevel(level)


def config_for(receiver, mailsink, tmp_path, **alerts_extra) -> Config:
    table = {
        "webhook": {"url": {"env": "ZBAK_HOOK_URL"},
                    "headers": {"Authorization": {"file": str(tmp_path / "hook-auth")}}},
        "email": {"host": "127.0.0.1", "port": mailsink.port, "starttls": False,
                  "from": "zbak@backup.example", "to": ["ops@example.org"],
                  "username": "zbak", "password": {"env": "ZBAK_SMTP_PASSWORD"}},
        **alerts_extra,
    }
    return Config.model_validate({
        "state_dir": str(tmp_path / "state"),
        "jobs": {"nightly": {"dataset": "tank/data",
                             "replicate": {"targets": ["local:bak/r1", "local:bak/r2"]},
                             "archive": {"store": "cold"}}},
        "stores": {"cold": {"url": f"file://{tmp_path / 'store'}"}},
        "alerts": table,
    })


@pytest.fixture
def installed(receiver, mailsink, tmp_path, monkeypatch, caplog):
    """Alerts installed from a config whose secrets come from the environment and a file."""
    monkeypatch.setenv("ZBAK_HOOK_URL", receiver.url)
    monkeypatch.setenv("ZBAK_SMTP_PASSWORD", PASSWORD)
    (tmp_path / "hook-auth").write_text(f"Bearer {TOKEN}\n")
    caplog.set_level(logging.DEBUG)
    config = config_for(receiver, mailsink, tmp_path)
    dispatcher = alerts.install(config.alerts, host="backup-host")
    _dispatchers.append(dispatcher)
    yield config
    dispatcher.close()
    _dispatchers.remove(dispatcher)


def zbak_log(caplog) -> str:
    return "\n".join(f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in caplog.records
                     if r.name.startswith("zrepl_py"))


def wait_for(predicate, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def fail_run(catalog, clock, job="nightly", action="replicate", target="local:bak/r1",
             message="cannot open ssh to backup: connection refused"):
    with pytest.raises(ZbakError):
        with recorded_run(catalog, clock, job, action, target):
            raise ZbakError(message)


def test_a_failed_run_posts_a_failure_alert_and_mails_it_without_showing_any_secret(
    installed, catalog, receiver, mailsink, caplog
):
    fail_run(catalog, FixedClock(T0))
    assert len(receiver.posts) == 1 and len(mailsink.mails) == 1
    path, headers, body = receiver.posts[0]
    assert path == f"/hooks/{TOKEN}" and headers["Authorization"] == f"Bearer {TOKEN}"
    assert headers["Content-Type"] == "application/json"
    assert {k: body[k] for k in ("source", "host", "kind", "job", "action", "target", "time")} == {
        "source": "zbak", "host": "backup-host", "kind": "failure", "job": "nightly",
        "action": "replicate", "target": "local:bak/r1", "time": T0.isoformat()}
    assert body["message"] == ("replicate of job nightly to local:bak/r1 failed: "
                               "cannot open ssh to backup: connection refused")
    assert body["text"].startswith("zbak@backup-host: replicate of job nightly to local:bak/r1 FAILED")
    mail = mailsink.mails[0]
    assert mail["Subject"] == "[zbak] zbak@backup-host: replicate of job nightly to local:bak/r1 FAILED"
    assert mail["To"] == "ops@example.org" and mail["From"] == "zbak@backup.example"
    text = mail.get_content()
    assert "connection refused" in text and "job: nightly" in text and "kind: failure" in text
    assert mailsink.logins == [b"zbak"], "logged in with the password from the environment"
    logs = zbak_log(caplog)
    assert "event failure" in logs and "127.0.0.1" in logs
    for secret in (TOKEN, PASSWORD):
        assert secret not in logs
        assert secret not in json.dumps(body) and secret not in mail.as_string()


def test_the_first_success_after_a_failure_sends_one_recovery_per_job_action_and_target(
    installed, catalog, receiver, mailsink
):
    clock = FixedClock(T0)
    fail_run(catalog, clock)
    clock.advance(dt.timedelta(hours=1))
    with recorded_run(catalog, clock, "nightly", "replicate", "local:bak/r2"):
        pass  # another target, never failed: no recovery
    with recorded_run(catalog, clock, "nightly", "replicate", "local:bak/r1") as record:
        record.bytes = 4096
    clock.advance(dt.timedelta(hours=1))
    with recorded_run(catalog, clock, "nightly", "replicate", "local:bak/r1"):
        pass  # a second success is not a recovery
    kinds = [(b["kind"], b["target"]) for _, _, b in receiver.posts]
    assert kinds == [("failure", "local:bak/r1"), ("recovery", "local:bak/r1")]
    recovery = receiver.posts[1][2]
    assert recovery["message"] == ("replicate of job nightly to local:bak/r1 succeeded again "
                                   "(the previous run had failed)")
    assert recovery["time"] == (T0 + dt.timedelta(hours=1)).isoformat()
    assert [m["Subject"].split(": ", 1)[1] for m in mailsink.mails] == [
        "replicate of job nightly to local:bak/r1 FAILED",
        "replicate of job nightly to local:bak/r1 recovered"]


def test_a_repeated_failure_is_held_back_until_repeat_after_and_a_recovery_rearms_it(
    installed, catalog, receiver
):
    clock = FixedClock(T0)
    fail_run(catalog, clock)
    clock.advance(dt.timedelta(hours=1))
    fail_run(catalog, clock)  # within repeat_after (24h): held back
    clock.advance(dt.timedelta(hours=24))
    fail_run(catalog, clock)  # 25 h after the first: sent again
    with recorded_run(catalog, clock, "nightly", "replicate", "local:bak/r1"):
        pass
    fail_run(catalog, clock)  # the recovery re-armed the failure alert
    assert [b["kind"] for _, _, b in receiver.posts] == [
        "failure", "failure", "recovery", "failure"]


def test_staleness_alerts_name_the_target_and_store_without_a_success_inside_stale_after(
    installed, catalog, receiver, mailsink
):
    clock = FixedClock(T0)
    with recorded_run(catalog, clock, "nightly", "replicate", "local:bak/r1"):
        pass
    with recorded_run(catalog, clock, "nightly", "archive", "cold:tank/data"):
        pass
    clock.advance(dt.timedelta(hours=25))
    with recorded_run(catalog, clock, "nightly", "replicate", "local:bak/r2"):
        pass
    clock.advance(dt.timedelta(hours=2))  # r1: 27 h (> 26 h); r2: 2 h; archive: 27 h (< 50 h)
    found = alerts.check_staleness(catalog, installed, clock.now())
    assert [(e.kind, e.action, e.target) for e in found] == [("stale", "replicate", "local:bak/r1")]
    (_, _, body), = receiver.posts
    assert body["kind"] == "stale" and body["target"] == "local:bak/r1"
    assert body["message"] == ("no successful replicate of job nightly to local:bak/r1 since "
                               "2026-03-01 02:00Z (27h ago; stale_after 26h)")
    assert mailsink.mails[0]["Subject"].endswith("replicate of job nightly to local:bak/r1 STALE")

    clock.advance(dt.timedelta(hours=24))  # archive 51 h old; r2 26 h (not over); r1 again
    found = alerts.check_staleness(catalog, installed, clock.now())
    assert {(e.action, e.target) for e in found} == {
        ("replicate", "local:bak/r1"), ("archive", "cold")}
    assert len(receiver.posts) == 3, "r1 is alerted again once repeat_after (24 h) has passed"
    archive = next(b for _, _, b in receiver.posts if b["action"] == "archive")
    assert archive["message"].startswith("no successful archive of job nightly to store cold since")


def test_a_job_that_never_succeeded_is_stale_only_counted_from_when_watching_started(
    installed, catalog, receiver
):
    since = T0
    assert alerts.check_staleness(catalog, installed, T0 + dt.timedelta(hours=20), since=since) == []
    assert alerts.check_staleness(catalog, installed, T0 + dt.timedelta(hours=30)) == [], \
        "without a start time, a job that never ran is not stale"
    found = alerts.check_staleness(catalog, installed, T0 + dt.timedelta(hours=30), since=since)
    assert {(e.action, e.target) for e in found} == {("replicate", "local:bak/r1"),
                                                     ("replicate", "local:bak/r2")}
    assert "has not succeeded since zbak started watching at 2026-03-01 02:00Z" in found[0].message
    assert len(receiver.posts) == 2


def test_protection_budget_warnings_of_a_replication_run_arrive_as_a_budget_alert(
    installed, catalog, receiver, mailsink
):
    clock = FixedClock(T0)
    held = [("tank/data@zbak_20260220T000000Z", T0 - dt.timedelta(days=9), 7 * 2**30)]
    warnings = budget_warnings(ProtectionBudget(max_age=dt.timedelta(days=7), max_bytes=2**30),
                               held, clock.now())
    assert len(warnings) == 2
    with recorded_run(catalog, clock, "nightly", "replicate", "local:bak/r1") as record:
        record.budget = warnings
        record.error = "; ".join(warnings)
    (_, _, body), = receiver.posts
    assert body["kind"] == "budget" and body["target"] == "local:bak/r1"
    assert body["message"] == "; ".join(warnings)
    assert "tank/data@zbak_20260220T000000Z is held since 2026-02-20 02:00Z" in body["message"]
    assert "pin 7516192768 bytes, over max_bytes 1073741824" in body["message"]
    assert mailsink.mails[0]["Subject"].endswith("over protection budget")
    assert catalog.last_runs("nightly")[0].result == "ok", "a budget warning is not a failure"


def test_degraded_events_from_other_producers_reach_both_channels(installed, receiver, mailsink):
    events.emit(events.Event("degraded", None, "health", "tank",
                             "pool tank is DEGRADED: sdb FAULTED", T0))
    assert receiver.posts[0][2]["message"] == "pool tank is DEGRADED: sdb FAULTED"
    assert mailsink.mails[0]["Subject"] == "[zbak] zbak@backup-host: health (tank) DEGRADED"


def test_a_secret_inside_an_error_message_is_redacted_in_every_alert(
    installed, catalog, receiver, mailsink, caplog
):
    fail_run(catalog, FixedClock(T0), message=f"server said: bad password {PASSWORD}")
    body = receiver.posts[0][2]
    assert PASSWORD not in json.dumps(body) and "bad password <redacted>" in body["message"]
    assert PASSWORD not in mailsink.mails[0].as_string()


def test_a_webhook_answering_503_is_retried_and_the_alert_still_arrives(receiver, caplog):
    receiver.fail_first = 2
    caplog.set_level(logging.DEBUG)
    sink = WebhookSink(Secret(receiver.url), {}, "h", attempts=3, wait=tenacity.wait_none())
    sink(events.Event("failure", "j", "snapshot", None, "boom", T0))
    assert [b["message"] for _, _, b in receiver.posts] == ["boom"]
    assert zbak_log(caplog).count("answered HTTP 503") == 2
    assert TOKEN not in zbak_log(caplog), "only the server, never the URL path, is logged"


def test_an_unreachable_webhook_fails_after_its_retries_naming_only_the_server(caplog):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    sink = WebhookSink(Secret(f"http://127.0.0.1:{port}/x/{TOKEN}"), {"X-Key": Secret(TOKEN)}, "h",
                       attempts=2, wait=tenacity.wait_none())
    with pytest.raises(AlertDeliveryFailed) as failure:
        sink(events.Event("failure", "j", "snapshot", None, "boom", T0))
    assert f"webhook http://127.0.0.1:{port}" in str(failure.value) and "2 tries" in str(failure.value)
    assert TOKEN not in str(failure.value) and TOKEN not in zbak_log(caplog)


def test_a_refused_smtp_login_is_logged_without_the_password_and_the_webhook_still_gets_it(
    receiver, mailsink, tmp_path, monkeypatch, caplog, catalog
):
    monkeypatch.setenv("ZBAK_HOOK_URL", receiver.url)
    monkeypatch.setenv("ZBAK_SMTP_PASSWORD", "wrong-" + PASSWORD)
    (tmp_path / "hook-auth").write_text(TOKEN)
    caplog.set_level(logging.DEBUG)
    dispatcher = alerts.install(config_for(receiver, mailsink, tmp_path).alerts, host="h")
    try:
        fail_run(catalog, FixedClock(T0))
    finally:
        dispatcher.close()
    assert len(receiver.posts) == 1 and mailsink.mails == []
    logs = zbak_log(caplog)
    assert "login as zbak refused (535)" in logs
    assert PASSWORD not in logs and TOKEN not in logs


def test_an_unset_secret_variable_is_named_when_alerts_are_installed(receiver, mailsink, tmp_path):
    (tmp_path / "hook-auth").write_text(TOKEN)
    config = config_for(receiver, mailsink, tmp_path)
    with pytest.raises(SecretUnavailable, match="ZBAK_HOOK_URL is not set"):
        alerts.install(config.alerts)
    assert "tok-" not in repr(config.alerts.webhook), "the config holds references, not values"


def test_events_are_only_logged_when_no_channel_is_configured(catalog, caplog, receiver):
    """A failure that raises is logged at DEBUG: its error goes on up and the command prints
    it, one line on stderr (docs/decisions.md#cli-frictions-a-first-time-admin-met)."""
    caplog.set_level(logging.DEBUG)
    dispatcher = alerts.install(Config().alerts)
    fail_run(catalog, FixedClock(T0))
    dispatcher.close()
    assert receiver.posts == [] and "event failure: job=nightly" in zbak_log(caplog)
    (record,) = [r for r in caplog.records if r.getMessage().startswith("event failure")]
    assert record.levelno == logging.DEBUG


def test_a_slow_webhook_never_delays_the_run_that_raised_the_alert(installed, catalog, receiver):
    receiver.release.clear()  # the webhook answers nothing until the run has returned
    try:
        fail_run(catalog, FixedClock(T0))
        assert not receiver.arrived.is_set(), "delivery runs in the background"
    finally:
        receiver.release.set()
    assert [b["kind"] for _, _, b in receiver.posts] == ["failure"]


def test_a_drill_source_is_stale_after_stale_after_without_an_ok_drill_and_skipped_ones_are_not(
    receiver, mailsink, tmp_path, catalog
):
    """Drills are stale per source (the drills table, not the runs: a skipped or pending drill
    is a run that ended ok); a source skipped by design is never stale; before any drill the
    job as a whole counts from when watching started."""
    from zrepl_py.catalog.rows import DrillRow

    config = Config.model_validate({
        **config_for(receiver, mailsink, tmp_path).model_dump(exclude={"jobs", "alerts"}),
        "restore": {"scratch": "tank/scratch"},
        "jobs": {"nightly": {"dataset": "tank/data", "archive": {"store": "cold"},
                             "drill": {"schedule": "0 6 * * 0"}}},
    })
    assert config.alerts.stale_after["drill"] == dt.timedelta(days=8)

    def stale(days: int) -> list:
        return [e for e in alerts.staleness.stale_events(
            catalog, config, T0 + dt.timedelta(days=days), since=T0) if e.action == "drill"]

    found = stale(9)
    assert [(e.action, e.target) for e in found] == [("drill", None)]
    assert found[0].message.startswith("drill of job nightly has not succeeded since")

    def drill(source: str, days: int, result: str) -> None:
        at = T0 + dt.timedelta(days=days)
        catalog.record_drill(DrillRow(job="nightly", source=source, kind="store",
                                      started_at=at, ended_at=at, result=result))

    drill("cold", 0, "ok")
    drill("backup:tank/r", 0, "ok")
    drill("glacier", 0, "skipped")
    drill("backup:tank/r", 5, "pending")  # a run that ended ok, not a drill that restored
    assert stale(7) == []
    found = stale(9)
    assert sorted((e.action, e.target) for e in found) == [("drill", "backup:tank/r"),
                                                           ("drill", "cold")]
    assert any(e.message.startswith("no successful drill of job nightly from cold since"
                                    " 2026-03-01 02:00Z") for e in found)


def test_a_scheduled_copy_is_stale_per_store_without_an_ok_copy_to_it(
    receiver, mailsink, tmp_path, catalog
):
    """docs/copies.md#the-copy-schedule: each store with a scheduled copy is stale on its own
    after ``stale_after.copy`` (50 h by default) without an ok ``copy`` run to it (targets
    ``STORE:DATASET``); a copy store without a schedule is not watched."""
    config = Config.model_validate({
        **config_for(receiver, mailsink, tmp_path).model_dump(exclude={"jobs", "alerts"}),
        "stores": {n: {"url": f"file://{tmp_path / n}"} for n in ("cold", "offsite", "box", "usb")},
        "jobs": {"nightly": {"dataset": "tank/data", "archive": {"store": "cold"},
                             "copy": {"offsite": {"schedule": "0 3 * * *"},
                                      "box": {"schedule": "0 4 * * *"}, "usb": {}}}},
    })
    assert config.alerts.stale_after["copy"] == dt.timedelta(hours=50)
    clock = FixedClock(T0)
    for target in ("offsite:tank/data", "usb:tank/data"):
        with recorded_run(catalog, clock, "nightly", "copy", target):
            pass
    clock.advance(dt.timedelta(hours=40))
    with recorded_run(catalog, clock, "nightly", "copy", "box:tank/data"):
        pass

    def stale(hours: int) -> list[tuple[str | None, str]]:
        return [(e.target, e.message) for e in alerts.staleness.stale_events(
            catalog, config, T0 + dt.timedelta(hours=hours), since=T0) if e.action == "copy"]

    assert stale(49) == []
    assert stale(51) == [("offsite", "no successful copy of job nightly to store offsite since"
                                     " 2026-03-01 02:00Z (51h ago; stale_after 50h)")]
    assert [target for target, _ in stale(91)] == ["box", "offsite"]
