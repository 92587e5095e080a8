"""Rate, ETA and size arithmetic of the progress reporter, its two outputs, and its sink (the
running-transfer file ``zbak status`` reads)."""

from __future__ import annotations

import io
import json
import logging
import os
import time

import pytest

from zrepl_py.observe.progress import (
    Estimate,
    MeteredReader,
    ProgressReporter,
    RateMeter,
    eta,
    format_eta,
    format_rate,
    format_size,
    window_rate,
)
from zrepl_py.observe.transfers import Slot, progress_callback, read_running

KiB, MiB, GiB = 1024, 1024**2, 1024**3


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (85 * MiB + 300 * KiB, "85 MiB"),
        (int(1.2 * GiB), "1.2 GiB"),
        (int(9.96 * MiB), "10 MiB"),
        (5 * 1024**4, "5.0 TiB"),
        (3 * 1024**7, "3072 EiB"),
    ],
)
def test_sizes_are_shown_in_binary_units_with_one_decimal_below_ten(size, text):
    assert format_size(size) == text


def test_rates_and_etas_read_like_a_clock_and_say_so_when_unknown():
    assert format_rate(85 * MiB) == "85 MiB/s"
    assert format_rate(None) == "? B/s"
    assert format_eta(40) == "0:00:40"
    assert format_eta(3725.4) == "1:02:05"
    assert format_eta(90000) == "1 day, 1:00:00"
    assert format_eta(None) == "?"
    assert format_eta(-3) == "0:00:00"


@pytest.mark.parametrize(
    ("samples", "window", "rate"),
    [
        ([], 10, None),
        ([(1.0, 100)], 10, None),
        ([(0.0, 0), (2.0, 200)], 10, 100.0),
        # only the last 10 s count: from the newest sample at or before 20 - 10 = 10 s
        ([(0.0, 0), (5.0, 5000), (10.0, 6000), (15.0, 7000), (20.0, 8000)], 10, 200.0),
        # no sample at 10 s: the anchor is the one at 5 s, so 3000 B over 15 s
        ([(0.0, 0), (5.0, 5000), (12.0, 6000), (20.0, 8000)], 10, 200.0),
        ([(3.0, 10), (3.0, 20)], 10, None),  # no time between the ends
        ([(0.0, 50), (1.0, 40)], 10, 0.0),  # a count never makes a negative rate
    ],
)
def test_the_rate_is_taken_over_the_last_window_of_samples(samples, window, rate):
    assert window_rate(samples, window) == rate


@pytest.mark.parametrize(
    ("done", "total", "rate", "left"),
    [
        (0, 1000, 100.0, 10.0),
        (400, 1000, 200.0, 3.0),
        (1000, 1000, None, 0.0),
        (10, None, 100.0, None),  # no total
        (10, 1000, None, None),  # no rate yet
        (10, 1000, 0.0, None),  # stalled
        (1200, 1000, 100.0, None),  # past a low estimate
    ],
)
def test_eta_is_the_bytes_left_over_the_rate_or_unknown(done, total, rate, left):
    assert eta(done, total, rate) == left


def test_the_meter_starts_from_zero_and_forgets_samples_older_than_its_window():
    meter = RateMeter(total=10_000, window=4)
    first = meter.add(1000, 1.0)
    assert first == Estimate(1000, 1.0, 1000.0, 9.0, 10_000)
    for second in range(2, 9):
        latest = meter.add(1000 + (second - 1) * 500, float(second))
    # 1 s at 1000 B/s then 500 B/s: the 4 s window only sees the slower part
    assert latest.rate == 500.0
    assert latest.eta == pytest.approx((10_000 - 4500) / 500)


def test_a_log_line_names_the_stream_size_rate_and_eta():
    line = Estimate(int(1.2 * GiB), 14.0, 85 * MiB, 40.0, 3 * GiB).describe("tank/data@x -> b")
    assert line == "tank/data@x -> b: 1.2 GiB of 3.0 GiB, 85 MiB/s, ETA 0:00:40"
    assert Estimate(512, 1.0, None, None, None).describe("x") == "x: 512 B, ? B/s"


def test_off_a_terminal_the_reporter_logs_one_info_line_every_n_seconds(caplog, tmp_path):
    with open(tmp_path / "not-a-tty", "w") as stream, caplog.at_level(logging.INFO):
        reporter = ProgressReporter("pool/a@s -> backup", total=30 * MiB, stream=stream,
                                    log_every=10)  # fmt: skip
        for second in range(1, 26):
            reporter(second * MiB, float(second))
        reporter.finish(30 * MiB, 30.0)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "pool/a@s -> backup: 10 MiB of 30 MiB, 1.0 MiB/s, ETA 0:00:20",
        "pool/a@s -> backup: 20 MiB of 30 MiB, 1.0 MiB/s, ETA 0:00:10",
        "pool/a@s -> backup: 30 MiB in 0:00:30, 1.0 MiB/s",
    ]
    assert (tmp_path / "not-a-tty").read_text() == ""


def _drawn(label: str, level: int, caplog) -> tuple[bool, str]:
    """Run a reporter on a pseudo-terminal with the log at ``level``: (drew a bar, output)."""
    master, slave = os.openpty()
    os.set_blocking(master, False)
    try:
        with os.fdopen(slave, "w") as stream, caplog.at_level(level):
            with ProgressReporter(label, total=4 * MiB, stream=stream) as rep:
                for second in range(1, 4):
                    rep(second * MiB, float(second))
                rep.finish(4 * MiB, 4.0)
        chunks = []  # a pty may hand over what was written in several reads
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # all read: EIO (or EAGAIN) once the terminal's side is closed
                break
            if not chunk:
                break
            chunks.append(chunk)
        return rep.tty, b"".join(chunks).decode(errors="replace")
    finally:
        os.close(master)


def test_on_a_terminal_the_reporter_draws_a_bar_and_logs_only_the_summary(caplog):
    tty, drawn = _drawn("pool/a@s -> backup", logging.INFO, caplog)
    assert tty and "pool/a@s -> backup" in drawn
    assert "MiB/s" in drawn and "ETA" in drawn
    assert [r.getMessage() for r in caplog.records] == [
        "pool/a@s -> backup: 4.0 MiB in 0:00:04, 1.0 MiB/s"
    ]


def test_a_label_with_brackets_is_drawn_as_written_not_read_as_rich_markup(caplog):
    """docs/decisions.md#cli-frictions-a-first-time-admin-met: ``[backup]`` would vanish and
    ``[/x]`` raise MarkupError as markup."""
    tty, drawn = _drawn("pool/a@s -> [backup] [/x]", logging.INFO, caplog)
    assert tty and "pool/a@s -> [backup] [/x]" in drawn


def test_with_info_lines_off_as_under_zbak_q_no_bar_is_drawn_on_a_terminal(caplog):
    tty, drawn = _drawn("pool/a@s -> backup", logging.WARNING, caplog)
    assert not tty and drawn == ""


def test_progress_callback_gives_a_reporter_on_stderr_for_the_label():
    reporter = progress_callback("tank/a@s -> backup", total=10)
    assert isinstance(reporter, ProgressReporter)
    assert reporter.label == "tank/a@s -> backup" and reporter.meter.total == 10


class ListSink:
    """A plain-data sink: keeps what it is given."""

    def __init__(self):
        self.estimates, self.closed = [], 0

    def update(self, estimate):
        self.estimates.append(estimate)

    def close(self):
        self.closed += 1


def test_a_reporter_hands_every_estimate_to_its_sink_and_closes_it_when_it_closes(tmp_path):
    sink = ListSink()
    with open(tmp_path / "log", "w") as stream:
        reporter = ProgressReporter("a -> b", total=4 * MiB, stream=stream, sink=sink)
        reporter(1 * MiB, 1.0)
        reporter(2 * MiB, 2.0)
        assert [e.bytes for e in sink.estimates] == [1 * MiB, 2 * MiB] and sink.closed == 0
        assert sink.estimates[-1].rate == MiB and sink.estimates[-1].eta == 2.0
        reporter.finish(4 * MiB, 4.0)
    assert sink.closed >= 1, "finish closes the sink: the transfer ended"


def test_progress_callback_with_a_slot_publishes_what_is_sent_until_the_reporter_closes(tmp_path):
    slot = Slot(tmp_path, "replicate", "j", "local:bak/r")
    reporter = progress_callback("src/d@b -> bak/r/d", total=8 * MiB, dataset="src/d",
                                 from_snap="a", to_snap="b", publish=slot)
    (shown,), stale = read_running(tmp_path)
    assert stale == []
    assert (shown.dataset, shown.from_snapshot, shown.to_snapshot) == ("src/d", "a", "b")
    assert (shown.bytes, shown.expected_bytes, shown.pid) == (0, 8 * MiB, os.getpid())
    reporter.sink.every = 0  # written at most once a second: not within this test
    reporter(2 * MiB, 1.0)
    record = json.loads(slot.path.read_bytes())
    assert record["bytes"] == 2 * MiB and record["rate"] == 2 * MiB and record["eta_seconds"] == 3
    reporter.close()
    assert not slot.path.exists() and read_running(tmp_path) == ([], [])


def test_a_metered_reader_passes_the_bytes_through_and_samples_them_once_per_interval():
    samples = []
    reader = MeteredReader(io.BytesIO(b"x" * 5000), lambda done, s: samples.append(done),
                           interval=0.05)
    got = [reader.read(1000)]
    time.sleep(0.06)
    got += [reader.read(1000), reader.read(1000)]
    time.sleep(0.06)
    while chunk := reader.read(1000):
        got.append(chunk)
    assert b"".join(got) == b"x" * 5000 and reader.sampler.bytes == 5000
    assert samples == [2000, 4000], "one sample per interval, counting every byte read so far"
