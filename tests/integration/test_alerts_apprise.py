"""The apprise alert sink (``[alerts.apprise]``, ``zbak[apprise]``) against a real local HTTP
endpoint: apprise's ``json://`` POSTs to a receiver on 127.0.0.1, raised by real recorded runs
against a real SQLite catalog; the token in the URL never reaches a log or an error."""

from __future__ import annotations

import datetime as dt
import logging
import socket

import pytest
import tenacity
from support.cli import run_zbak
from support.receiver import Receiver

from zrepl_py import alerts
from zrepl_py.alerts.apprise_sink import AppriseSink
from zrepl_py.clock import FixedClock
from zrepl_py.config.schema import Config
from zrepl_py.config.secret import Secret
from zrepl_py.errors import AlertDeliveryFailed, ZbakError
from zrepl_py.observe import events
from zrepl_py.observe.runlog import recorded_run
from zrepl_py.runtime.logsetup import pin_wire_loggers

UTC = dt.UTC
T0 = dt.datetime(2026, 3, 1, 2, 0, tzinfo=UTC)
TOKEN = "apprise-tok-5b1e9c0d7a"
SEGMENT = "seg-8d2f4a61c3"


@pytest.fixture
def receiver():
    r = Receiver(f"/notify/{SEGMENT}")
    yield r
    r.close()


def json_url(address: str) -> str:
    """An apprise ``json://`` URL with the token as its password and in its path."""
    return f"json://zbak:{TOKEN}@{address}/notify/{SEGMENT}"


@pytest.fixture(autouse=True)
def _zbak_logging(caplog):
    """Every record at DEBUG, with the wire libraries pinned as zbak's logging set-up does."""
    caplog.set_level(logging.DEBUG)
    pin_wire_loggers()


def _reaches_zbaks_log(name: str) -> bool:
    """True when a record of logger ``name`` propagates to the root logger, where zbak's
    handlers are (pytest's caplog also listens on loggers that do not propagate)."""
    logger: logging.Logger | None = logging.getLogger(name)
    while logger is not None:
        if not logger.propagate:
            return False
        logger = logger.parent
    return True


def every_log_line(caplog) -> str:
    """Every line zbak's log would show."""
    return "\n".join(f"{r.name} {r.getMessage()}" for r in caplog.records
                     if _reaches_zbaks_log(r.name))


@pytest.fixture
def installed(receiver, tmp_path, monkeypatch, caplog):
    """``[alerts.apprise]`` with the URL from the environment, installed as zbak does."""
    monkeypatch.setenv("ZBAK_APPRISE_URL", json_url(receiver.address))
    config = Config.model_validate({
        "state_dir": str(tmp_path / "state"),
        "alerts": {"apprise": {"urls": [{"env": "ZBAK_APPRISE_URL"}]}},
    })
    dispatcher = alerts.install(config.alerts, host="backup-host")
    receiver._flush = lambda: dispatcher.flush(30)
    yield dispatcher
    dispatcher.close()


def fail_run(catalog, message="cannot open ssh to backup: connection refused"):
    with pytest.raises(ZbakError):
        with recorded_run(catalog, FixedClock(T0), "nightly", "replicate", "local:bak/r1"):
            raise ZbakError(message)


def test_a_failed_run_reaches_the_service_through_apprise_without_the_url_in_any_log(
    installed, catalog, receiver, caplog
):
    fail_run(catalog)
    ((path, headers, body),) = receiver.posts
    assert path == f"/notify/{SEGMENT}" and headers["Authorization"].startswith("Basic ")
    assert body["type"] == "failure"
    assert body["title"] == "zbak@backup-host: replicate of job nightly to local:bak/r1 FAILED"
    assert "cannot open ssh to backup: connection refused" in body["message"]
    assert "job: nightly" in body["message"] and "host: backup-host" in body["message"]
    logs = every_log_line(caplog)
    assert "alert failure sent to apprise url 1 (json://)" in logs
    assert TOKEN not in logs and SEGMENT not in logs, "apprise's own DEBUG lines stay out"


def test_repeats_are_held_back_and_a_recovery_goes_out_as_a_success(installed, catalog, receiver):
    fail_run(catalog)
    fail_run(catalog)
    with recorded_run(catalog, FixedClock(T0 + dt.timedelta(hours=1)), "nightly", "replicate",
                      "local:bak/r1"):
        pass
    assert [b["type"] for _, _, b in receiver.posts] == ["failure", "success"]


def test_a_token_inside_an_error_message_is_redacted_before_it_is_sent(
    installed, catalog, receiver
):
    fail_run(catalog, message=f"server said: bad token {TOKEN}")
    body = receiver.posts[0][2]
    assert TOKEN not in body["message"] and "bad token <redacted>" in body["message"]


def test_a_service_answering_503_is_retried_and_the_alert_still_arrives(receiver, caplog):
    receiver.fail_first = 2
    sink = AppriseSink(Secret(json_url(receiver.address)), "h", attempts=3,
                       wait=tenacity.wait_none())
    sink(events.Event("failure", "j", "snapshot", None, "boom", T0))
    assert ["boom" in b["message"] for _, _, b in receiver.posts] == [True]
    logs = every_log_line(caplog)
    assert logs.count("apprise url 1 (json://): ") == 2, logs
    assert "503" in logs and TOKEN not in logs and SEGMENT not in logs


def test_an_unreachable_service_fails_after_its_retries_naming_only_the_scheme(caplog):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    sink = AppriseSink(Secret(json_url(f"127.0.0.1:{port}")), "h", index=2, attempts=2,
                       wait=tenacity.wait_none())
    with pytest.raises(AlertDeliveryFailed) as failure:
        sink(events.Event("failure", "j", "snapshot", None, "boom", T0))
    assert str(failure.value).startswith("apprise url 2 (json://): ")
    assert "2 tries" in str(failure.value)
    text = str(failure.value) + every_log_line(caplog)
    assert TOKEN not in text and SEGMENT not in text


def test_a_url_apprise_does_not_know_is_refused_without_showing_it(caplog):
    sink = AppriseSink(Secret(f"nosuchservice://{TOKEN}/x"), "h")
    with pytest.raises(AlertDeliveryFailed, match=r"apprise url 1 \(nosuchservice://\): apprise"
                       " does not accept this URL") as failure:
        sink(events.Event("failure", "j", "snapshot", None, "boom", T0))
    assert TOKEN not in str(failure.value) + every_log_line(caplog)


def test_a_plain_url_in_the_config_is_refused_naming_the_key(tmp_path):
    config = tmp_path / "zbak.toml"
    config.write_text(f'state_dir = "{tmp_path}"\n[alerts.apprise]\n'
                      f'urls = ["tgram://{TOKEN}/123"]\n')
    status, _, err = run_zbak("--config", str(config), "config", "check")
    assert status == 2 and "alerts.apprise.urls" in err and str(config) in err
    assert TOKEN not in err
