"""docs/reliability.md#r32-clock-goes-backwards across runs: a Context's clock never reads earlier
than the newest run the catalog holds, even when the wall clock was set back between two zbak
runs."""

from __future__ import annotations

import datetime as dt

from zrepl_py.catalog import db
from zrepl_py.clock import UTC, FixedClock, MonotonicClock
from zrepl_py.config.loading import load_config
from zrepl_py.invocation.context import Context

LATER = dt.datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


def test_runs_recorded_after_the_wall_clock_went_back_still_sort_after_the_earlier_ones(tmp_path):
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    engine = db.make_engine(url)
    db.upgrade(engine)
    engine.dispose()
    config = tmp_path / "zbak.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n[catalog]\nurl = "{url}"\n')

    with Context(config=load_config(config), config_path=config,
                 clock=MonotonicClock(FixedClock(LATER))) as first:  # fmt: skip
        run = first.catalog().start_run("j", "replicate", None, first.clock.now())
        first.catalog().finish_run(run, result="ok", now=first.clock.now(), bytes=0)

    back = LATER - dt.timedelta(hours=1)  # NTP stepped the clock back between the runs
    with Context(config=load_config(config), config_path=config,
                 clock=MonotonicClock(FixedClock(back))) as second:  # fmt: skip
        catalog = second.catalog()
        run = catalog.start_run("j", "replicate", None, second.clock.now())
        catalog.finish_run(run, result="ok", now=second.clock.now(), bytes=0)
        (latest,) = catalog.last_runs("j")
    assert latest.id == run, "the newest run is the one recorded last"
    assert latest.started_at > LATER


def test_the_default_clock_of_a_context_is_monotonic(tmp_path):
    config = tmp_path / "zbak.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n')
    assert isinstance(Context(config=load_config(config), config_path=config).clock,
                      MonotonicClock)
