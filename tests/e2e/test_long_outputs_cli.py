"""Long outputs of ``zbak list streams``, ``prune --dry-run``, ``audit`` and ``status`` on a
terminal are counts, not a row per stream
(docs/decisions.md#long-outputs-become-counts-on-a-terminal); ``--all`` prints every row and
``--json`` carries every row. The catalog and the ``file://`` store are generated
(tests/support/generated.py: 3 datasets x 2 chains x 20 streams, past the 100-row limit)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import Zbak, zfs
from support.generated import Generated, archive_config
from support.postgres import migrated_engine

from zrepl_py.cli.summary import LIMIT
from zrepl_py.errors import ExitStatus
from zrepl_py.objects.layout import volume_key

DATASETS, CHAINS, LENGTH = 3, 2, 20
STREAMS = DATASETS * CHAINS * LENGTH


def generate(tmp: Path, root: str, *, datasets: int = DATASETS, chains: int = CHAINS,
             length: int = LENGTH, keep_chains: int = 1) -> tuple[Path, Path]:
    """A generated catalog and store under ``tmp`` and a config for them; (config, store)."""
    state, store = tmp / "state", tmp / "store"
    state.mkdir(mode=0o700)
    store.mkdir()
    config = archive_config(tmp / "zbak.toml", state=state, store=store, root=root,
                            keep_chains=keep_chains)
    with migrated_engine(f"sqlite:///{state / 'catalog.sqlite'}") as engine:
        Generated(engine, store, root, chains=chains, chain_length=length).datasets(datasets)
    return config, store


@pytest.fixture
def generated(tmp_path, capsys):
    config, store = generate(tmp_path, "tank/gen")
    return Zbak(config, capsys), store


def stream_labels(out: str) -> int:
    """How many per-stream labels (``full @x`` / ``incremental @x -> @y``) ``out`` holds."""
    return out.count("full @zbak_") + out.count("incremental @zbak_")


def test_list_streams_counts_streams_per_store_kind_and_state_past_the_limit(generated):
    run, _ = generated
    assert STREAMS > LIMIT
    status, out, err = run("list", "streams")
    assert status == ExitStatus.OK, err
    assert f"streams: {STREAMS} streams, counted (--all lists each" in out
    rows = [line for line in out.splitlines() if line.startswith("data ")]
    assert len(rows) == 4, out  # full/incremental x uploaded/verified, not 120 streams
    assert all("tank/gen/ds00001, tank/gen/ds00002, tank/gen/ds00003" in r for r in rows), out
    for kind, state, count in (("full", "verified", DATASETS), ("full", "uploaded", DATASETS),
                               ("incremental", "verified", DATASETS * (LENGTH - 1)),
                               ("incremental", "uploaded", DATASETS * (LENGTH - 1))):
        assert any(line.split()[2:5] == [kind, state, str(count)] for line in rows), (
            kind, state, count, out)


def test_list_streams_all_prints_every_stream_on_its_own_line(generated):
    run, _ = generated
    status, out, err = run("list", "streams", "--all")
    assert status == ExitStatus.OK, err
    lines = [line for line in out.splitlines() if " tank/gen/ds" in line]
    assert len(lines) == STREAMS
    assert len({line.split()[3] for line in lines}) == STREAMS  # the id column


def test_list_streams_json_carries_every_stream(generated):
    run, _ = generated
    status, out, err = run("list", "streams", "--json")
    assert status == ExitStatus.OK, err
    rows = json.loads(out)
    assert len(rows) == STREAMS and {r["job"] for r in rows} == {"data"}
    assert {r["dataset"] for r in rows} == {f"tank/gen/ds{d:05d}" for d in (1, 2, 3)}


def test_a_short_list_is_still_a_table_of_every_stream(tmp_path, capsys):
    config, _ = generate(tmp_path, "tank/few", datasets=1, chains=1, length=5)
    status, out, err = Zbak(config, capsys)("list", "streams")
    assert status == ExitStatus.OK, err
    assert "counted" not in out and stream_labels(out) == 0
    assert out.count("zbak_") >= 5  # every stream's to-snapshot in the table


def test_prune_dry_run_counts_streams_per_action_and_reason_and_all_lists_each(
        zpool, tmp_path, capsys):
    """The plan of 180 streams in 3 datasets of 3 chains, keep_chains 1: the oldest chain
    of each dataset goes, released by the verified middle one (the newest is not verified
    yet, so the middle one stays). The table counts streams, chains and datasets per action
    and reason (names and numbers left out); --all lists each stream; --json has every
    stream with its chain."""
    root = f"{zpool.name}/gen"
    zfs("create", root)
    zfs("snapshot", f"{root}@zbak_00000")
    config, _ = generate(tmp_path, root, chains=3)
    run = Zbak(config, capsys)
    streams = DATASETS * 3 * LENGTH
    status, out, err = run("prune", "--dry-run")
    assert status == ExitStatus.OK, err
    assert f"archive chains (dry run: nothing deleted): {streams} streams, counted" in out
    assert stream_labels(out) == 0
    words = " ".join(out.replace("│", " ").split())  # the table's cells, in reading order
    assert words.count(" delete ") == 1 and words.count(" keep ") == 3, out  # one is the source's
    for why in ("newest chain", "is not verified yet", "released by the verified chain @..."):
        assert why in words, out
    # each archive row counts a third of the streams, one chain per dataset, 3 datasets
    assert words.count(f" {LENGTH * DATASETS} {DATASETS} {root}/ds00001,") == 3, out
    status, out, err = run("prune", "--dry-run", "--all")
    assert status == ExitStatus.OK, err
    rows = [line for line in out.splitlines() if line.startswith(f"data  cold   {root}/ds")]
    assert len(rows) == streams, out
    status, out, err = run("prune", "--dry-run", "--json")
    assert status == ExitStatus.OK, err
    rows = json.loads(out)["streams"]
    assert len(rows) == streams and len({r["stream_id"] for r in rows}) == streams
    assert sum(r["action"] == "delete" for r in rows) == LENGTH * DATASETS
    assert len({(r["dataset"], r["chain"]) for r in rows}) == DATASETS * 3


def test_audit_counts_findings_past_the_limit_and_all_shows_each(generated):
    """105 volumes gone: 105 errors, counted in one row (the keys and numbers left out);
    --all prints each finding's block."""
    run, store = generated
    gone = sorted(store.rglob("vol-000000.zst"))[:105]
    for path in gone:
        path.unlink()
    status, out, err = run("audit")
    assert status == ExitStatus.AUDIT_FINDINGS, err
    assert "findings, counted (--all shows each" in out
    assert any("is missing from store cold: ..." in line and " 105 " in line
               for line in out.splitlines()), out
    assert out.count("what to do:") == 0
    status, out, err = run("audit", "--all")
    assert status == ExitStatus.AUDIT_FINDINGS, err
    assert out.count("is missing from store cold") >= 105
    assert volume_key("x/", 0).endswith("vol-000000.zst")


def test_status_counts_chains_per_job_and_store_past_the_limit(tmp_path, capsys):
    config, _ = generate(tmp_path, "tank/many", datasets=LIMIT + 5, chains=1, length=1)
    run = Zbak(config, capsys)
    status, out, err = run("status", "--offline")
    assert status == ExitStatus.OK, err
    assert f"archive chains: {LIMIT + 5} datasets, counted" in out
    assert f"last runs: {LIMIT + 5} runs, counted" in out
    assert "tank/many/ds00050" not in out
    status, out, err = run("status", "--offline", "--all")
    assert status == ExitStatus.OK, err
    assert "tank/many/ds00050" in out
