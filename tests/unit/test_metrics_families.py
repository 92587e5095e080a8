"""The metrics the alert rules and the dashboard need beyond ``zbak status``'s own figures
(zrepl_py/status/metrics.py): a finished run's duration (the dashboard's rate is bytes over
it) and the bytes replication cursors pin (what ``protection_budget.max_bytes`` limits).
Pure: ``families`` over a hand-built JobStatus."""

from __future__ import annotations

import datetime as dt

from zrepl_py.catalog.rows import RunRow
from zrepl_py.status.metrics import families
from zrepl_py.status.report import JobStatus

T0 = dt.datetime(2026, 11, 28, 3, 0, tzinfo=dt.UTC)


def run(id: int, action: str, target: str | None, seconds: float | None, result: str) -> RunRow:
    ended = None if seconds is None else T0 + dt.timedelta(seconds=seconds)
    return RunRow(id, "j", action, target, T0, ended, result, 1000, None)


def state(**changes) -> JobStatus:
    base = dict(job="j", source="localhost:tank/data", snapshots=0, newest=None,
                newest_time=None, last_runs=[], last_success=[], targets=[], chains=[],
                held_bytes=None, held_snapshots=None, held_error=None, running=[],
                next_runs={})
    return JobStatus(**{**base, **changes})


def samples(states) -> dict[tuple[str, tuple[str, ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in families(states) for s in family.samples}


def test_the_newest_finished_runs_duration_is_its_end_minus_its_start():
    found = samples([state(last_runs=[run(1, "replicate", "b:tank/r", 95.5, "ok"),
                                      run(2, "archive", "cold:tank/data", 12, "failed"),
                                      run(3, "snapshot", None, None, "running")])])
    durations = {labels: v for (name, labels), v in found.items()
                 if name == "zbak_last_run_duration_seconds"}
    assert durations == {
        (("action", "replicate"), ("job", "j"), ("target", "b:tank/r")): 95.5,
        (("action", "archive"), ("job", "j"), ("target", "cold:tank/data")): 12.0,
    }, "a running run has no duration yet"


def test_the_replication_part_of_the_held_bytes_is_exported_beside_the_total():
    found = samples([state(held_bytes=700, held_replication_bytes=400)])
    assert found[("zbak_held_bytes", (("job", "j"),))] == 700
    assert found[("zbak_replication_held_bytes", (("job", "j"),))] == 400


def test_held_bytes_not_read_have_no_sample():
    found = samples([state()])
    assert not [k for k in found if k[0] in ("zbak_held_bytes", "zbak_replication_held_bytes")]
