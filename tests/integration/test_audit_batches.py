"""``zbak audit`` reads a large job in batches of whole datasets 
(docs/decisions.md#catalog-commands-stay-fast-at-100000-streams: memory bounded by
the batch, not the catalog) and finds exactly what one batch over the whole job finds, in
the same order: a missing volume, a volume of the wrong size, stray stream directories of a
dataset the catalog knows, of one it does not know (also below a catalogued dataset), and
a stray file at the job's root. Real SQLite catalog and ``file://`` or S3 (moto) store,
generated as ``zbak archive`` writes them (tests/support/generated.py); no ZFS is needed (the job
selects no property, so its source is never listed). How little memory a batch takes is
the benchmark's matter (benchmarks/catalog.py), not a test's."""

from __future__ import annotations

import json
import shutil

import pytest
from support.cli import InProcessZbak
from support.generated import Generated, archive_config
from support.postgres import migrated_engine

from zrepl_py.audit import job as audit_job_module
from zrepl_py.audit.job import plan_batches
from zrepl_py.catalog.rows import DatasetStreams
from zrepl_py.errors import ExitStatus
from zrepl_py.objects.layout import stream_prefix

ROOT = "tank/st"


@pytest.fixture(params=["file", "s3"])
def damaged(request, tmp_path, capsys):
    """Five datasets of 2 chains x 5 streams, one more nested in the second, each defect
    of the module docstring, in a ``file://`` store or copied to S3 (moto); the catalog
    file is saved so each audit starts from it."""
    state, store = tmp_path / "state", tmp_path / "store"
    state.mkdir(mode=0o700)
    store.mkdir()
    config = archive_config(tmp_path / "zbak.toml", state=state, store=store, root=ROOT)
    catalog = state / "catalog.sqlite"
    with migrated_engine(f"sqlite:///{catalog}") as engine:
        first = Generated(engine, store, ROOT, chains=2, chain_length=5)
        first.datasets(5)
        nested = Generated(engine, store, f"{ROOT}/ds00002", chains=2, chain_length=5)
        nested.ids = dict(first.ids)  # go on numbering the rows after the first five
        nested.datasets(1)
    local = store / "local"
    volumes = sorted((local / ROOT / "ds00001").rglob("vol-*.zst"))
    volumes[4].unlink()
    wrong = sorted((local / ROOT / "ds00003").rglob("vol-*.zst"))[2]
    with open(wrong, "r+b") as handle:
        handle.truncate(wrong.stat().st_size + 1)
    for dataset, leaves in ((f"{ROOT}/ds09999", ("vol-000000.zst",)),
                            (f"{ROOT}/ds00004", ("vol-000000.zst", "progress.json")),
                            (f"{ROOT}/ds00005/child", ("vol-000000.zst",))):
        prefix = stream_prefix("local", dataset, to_createtxg=7, to_guid=1, from_guid=None)
        for leaf in leaves:
            path = store / (prefix + leaf)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x")
    (local / ROOT / "junk.txt").write_text("not zbak's\n")
    if request.param == "s3":
        server, bucket = (request.getfixturevalue(f) for f in ("s3_server", "s3_bucket"))
        client = server.client()
        for path in sorted(p for p in store.rglob("*") if p.is_file()):
            client.put_object(Bucket=bucket, Key=f"zbak/{path.relative_to(store)}",
                              Body=path.read_bytes())
        text = config.read_text().replace(
            f'url = "file://{store}"', f'url = "s3://{bucket}/zbak"\nendpoint ='
            f' "{server.endpoint_url}"\nregion = "us-east-1"')
        assert "s3://" in text
        config.write_text(text)
    shutil.copy2(catalog, tmp_path / "catalog.saved")
    return InProcessZbak(config, capsys), catalog, tmp_path / "catalog.saved"


def audited(run, catalog, saved) -> dict:
    shutil.copy2(saved, catalog)
    status, out, err = run("audit", "--json")
    assert status == ExitStatus.AUDIT_FINDINGS, (out, err)
    return json.loads(out)


@pytest.mark.parametrize("limit", [10, 25])
def test_an_audit_in_batches_of_datasets_finds_what_one_batch_finds_in_the_same_order(
        damaged, monkeypatch, limit):
    run, catalog, saved = damaged
    whole = audited(run, catalog, saved)
    batches = []
    real = audit_job_module.plan_batches
    # In-process (docs/reliability.md#in-process-hooks-kept): a batch is 10,000 streams, so
    # the test shrinks BATCH_STREAMS to batch a catalog of 60 and records the batches.
    monkeypatch.setattr(audit_job_module, "BATCH_STREAMS", limit)
    monkeypatch.setattr(audit_job_module, "plan_batches",
                        lambda *a, **k: batches.append(real(*a, **k)) or batches[-1])
    parts = audited(run, catalog, saved)

    assert len(batches[0]) > 2  # the job was read in several batches
    assert parts["findings"] == whole["findings"]
    assert parts["jobs"] == whole["jobs"]
    problems = [(f["severity"], f["problem"]) for f in whole["findings"]]
    assert sum("is missing from store" in p for _, p in problems) == 1
    assert sum("bytes in the store, the catalog records" in p for _, p in problems) == 1
    assert len(whole["jobs"][0]["bad"]) == 2
    assert any(f["key"] == f"local/{ROOT}/" and "junk.txt" in f["problem"]
               for f in whole["findings"])
    for dataset in ("ds09999", "ds00005/child"):
        assert any(s == "error" and f"local:{ROOT}/{dataset} in store cold" in p
                   for s, p in problems), dataset
    assert any("partial upload" in p and "ds00004" in p for _, p in problems)
    assert whole["jobs"][0]["streams"] == 6 * 10


def counts(*streams: int) -> list[DatasetStreams]:
    return [DatasetStreams(i + 1, "local", f"tank/d{i}", {"cold": n} if n else {})
            for i, n in enumerate(streams)]


def test_batches_hold_whole_datasets_in_name_order_up_to_the_limit():
    found = plan_batches(counts(4, 4, 0, 3, 9, 2, 1), 8)
    assert [[d.name for d in batch] for batch in found] == [
        ["tank/d0", "tank/d1", "tank/d2"], ["tank/d3"], ["tank/d4"], ["tank/d5", "tank/d6"]]


def test_a_dataset_larger_than_the_limit_is_a_batch_of_its_own_never_split():
    found = plan_batches(counts(2, 50, 2), 10)
    assert [[d.name for d in batch] for batch in found] == [["tank/d0"], ["tank/d1"],
                                                            ["tank/d2"]]


def test_batches_hold_at_most_max_datasets_even_when_they_are_empty():
    found = plan_batches(counts(*[0] * 7), 100, max_datasets=3)
    assert [len(batch) for batch in found] == [3, 3, 1]
