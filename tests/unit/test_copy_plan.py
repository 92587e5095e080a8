"""What ``zbak copy`` copies (copying/plan.py), on plain catalog rows: every stream the target
lacks, oldest first; never a stream that is not complete or is marked bad, nor anything that
applies on it (docs/copies.md#what-is-copied)."""

from __future__ import annotations

import dataclasses
import datetime as dt

from zrepl_py.catalog.rows import StreamRow
from zrepl_py.copying.plan import plan_copy

NOW = dt.datetime(2026, 11, 28, 12, tzinfo=dt.UTC)


def row(id: int, txg: int, parent: StreamRow | None = None, *, store: str = "a",
        state: str = "uploaded", dataset: str = "tank/d") -> StreamRow:
    """Stream ``id`` of ``dataset`` in ``store`` ending at @TXG (guid TXG*7); its prefix is a
    function of the stream only, as in every store (objects.layout)."""
    kind = "full" if parent is None else "incremental"
    prefix = (f"local/{dataset}/{txg:020d}-full-{txg * 7:016x}/" if parent is None else
              f"local/{dataset}/{txg:020d}-incr-{parent.to_guid:016x}-{txg * 7:016x}/")
    return StreamRow(
        id=id, host="local", dataset=dataset, store=store, kind=kind,
        parent_id=parent.id if parent else None, from_guid=parent.to_guid if parent else None,
        to_guid=txg * 7, from_name=parent.to_name if parent else None, to_name=str(txg),
        to_createtxg=txg, raw_bytes=100, stored_bytes=50, object_prefix=prefix,
        storage_class="STANDARD", compression="zstd", state=state, created_at=NOW,
        uploaded_at=NOW, verified_at=None,
        bad_reason="volume 0 is missing" if state == "bad" else None)


def in_b(stream: StreamRow, id: int, **changes: object) -> StreamRow:
    """``stream``'s copy in store b as catalog row ``id``."""
    return dataclasses.replace(stream, id=id, store="b", **changes)


FULL = row(1, 10)
INC1 = row(2, 20, FULL)
INC2 = row(3, 30, INC1)
CHAIN = [FULL, INC1, INC2]


def test_an_empty_target_gets_every_stream_oldest_first():
    plan = plan_copy(CHAIN, [])
    assert [s.id for s in plan.copy] == [1, 2, 3]
    assert (plan.present, plan.skipped) == (0, ())


def test_only_what_the_target_lacks_is_copied_and_a_full_copy_is_a_no_op():
    plan = plan_copy(CHAIN, [in_b(FULL, 11)])
    assert [s.id for s in plan.copy] == [2, 3] and plan.present == 1
    done = plan_copy(CHAIN, [in_b(s, 10 + s.id) for s in CHAIN])
    assert (done.copy, done.present, done.skipped) == ((), 3, ())


def test_a_bad_stream_and_everything_applying_on_it_are_never_copied_with_the_reason():
    bad = dataclasses.replace(INC1, state="bad", bad_reason="volume 0 is missing")
    plan = plan_copy([FULL, bad, INC2], [])
    assert [s.id for s in plan.copy] == [1]
    assert [(s.stream.id, s.reason) for s in plan.skipped] == [
        (2, "marked bad in store a: volume 0 is missing"),
        (3, "applies on stream 2, which is not copied")]


def test_streams_not_complete_in_the_source_are_not_copied():
    for state in ("uploading", "condemned"):
        plan = plan_copy([dataclasses.replace(FULL, state=state), INC1], [])
        assert plan.copy == ()
        assert [s.reason for s in plan.skipped] == [
            f"{state} in store a", "applies on stream 1, which is not copied"]


def test_a_condemned_copy_in_the_target_blocks_the_stream_until_it_is_pruned():
    plan = plan_copy(CHAIN, [in_b(FULL, 11, state="condemned")])
    assert plan.copy == ()
    assert "store b has it condemned (stream 11)" in plan.skipped[0].reason


def test_a_new_chain_is_copied_beside_an_old_one_and_datasets_are_planned_apart():
    new_full = row(4, 40)
    child = row(5, 10, dataset="tank/d/child")
    plan = plan_copy([*CHAIN, new_full, child], [in_b(s, 10 + s.id) for s in CHAIN])
    assert [s.id for s in plan.copy] == [4, 5] and plan.present == 3
