"""The archive chain policy (archive/planner.py), table-driven on plain data."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from zrepl_py.archive.planner import ChainPolicy, plan_archive
from zrepl_py.catalog.chains import current_chain
from zrepl_py.catalog.rows import StreamRow
from zrepl_py.objects.manifest import CarriedSnapshot

NOW = dt.datetime(2026, 11, 21, 12, tzinfo=dt.UTC)
POLICY = ChainPolicy(full_every=dt.timedelta(days=30), max_chain_length=5, max_chain_bytes=None)


def snaps(*names: str) -> list[CarriedSnapshot]:
    return [CarriedSnapshot(n, 1000 + i, 10 * (i + 1)) for i, n in enumerate(names)]


def stream(id, kind, to: CarriedSnapshot, parent=None, frm=None, state="uploaded", age_days=1,
           stored=100) -> StreamRow:
    return StreamRow(
        id=id, host="local", dataset="tank/d", store="s", kind=kind, parent_id=parent,
        from_guid=frm.guid if frm else None, to_guid=to.guid, from_name=frm.name if frm else None,
        to_name=to.name, to_createtxg=to.createtxg, raw_bytes=stored, stored_bytes=stored,
        object_prefix=f"p{id}/", storage_class="STANDARD", compression="zstd", state=state,
        created_at=NOW - dt.timedelta(days=age_days), uploaded_at=None, verified_at=None)


def kinds(plan) -> list[tuple[str, str | None, str]]:
    return [(p.kind, p.from_snap.name if p.from_snap else None, p.to_snap.name)
            for p in plan.streams]


def test_the_first_chain_is_a_full_of_the_oldest_snapshot_then_one_incremental_to_the_newest():
    s = snaps("0", "1", "2", "3")
    plan = plan_archive(s, [], POLICY, NOW)
    assert kinds(plan) == [("full", None, "0"), ("incremental", "0", "3")]
    assert [c.name for c in plan.streams[1].carried] == ["1", "2", "3"]


def test_a_single_snapshot_gets_only_a_full():
    assert kinds(plan_archive(snaps("0"), [], POLICY, NOW)) == [("full", None, "0")]


def test_no_snapshots_plans_nothing_and_says_to_snapshot_first():
    plan = plan_archive([], [], POLICY, NOW)
    assert plan.streams == () and "zbak snapshot" in plan.note


def test_an_existing_chain_continues_with_an_incremental_from_its_tip_carrying_every_newer_snapshot():
    s = snaps("0", "1", "2", "3")
    chain = [stream(1, "full", s[0]), stream(2, "incremental", s[1], parent=1, frm=s[0])]
    plan = plan_archive(s, chain, POLICY, NOW)
    assert kinds(plan) == [("incremental", "1", "3")]
    assert plan.streams[0].parent_id == 2
    assert [c.name for c in plan.streams[0].carried] == ["2", "3"]


def test_a_chain_whose_tip_is_the_newest_snapshot_is_up_to_date_even_when_a_full_is_due():
    s = snaps("0", "1")
    chain = [stream(1, "full", s[0], age_days=90), stream(2, "incremental", s[1], 1, s[0])]
    plan = plan_archive(s, chain, POLICY, NOW)
    assert plan.streams == () and "up to date" in plan.note


@pytest.mark.parametrize("chain_len, age, stored, limit, force, expect_full", [
    (2, 1, 10, None, False, False),
    (2, 30, 10, None, False, True),      # full_every reached
    (5, 1, 10, None, False, True),       # max_chain_length reached
    (4, 1, 10, None, False, False),
    (2, 1, 600, 1000, False, True),      # 2 x 600 >= max_chain_bytes
    (2, 1, 10, 1000, False, False),
    (2, 1, 10, None, True, True),        # --full
])
def test_a_new_full_of_the_newest_snapshot_starts_when_the_policy_says_so(
        chain_len, age, stored, limit, force, expect_full):
    names = [str(i) for i in range(chain_len + 1)]
    s = snaps(*names)
    chain = [stream(1, "full", s[0], age_days=age, stored=stored)]
    for i in range(1, chain_len):
        chain.append(stream(i + 1, "incremental", s[i], parent=i, frm=s[i - 1], stored=stored))
    policy = ChainPolicy(dt.timedelta(days=30), 5, limit)
    plan = plan_archive(s, chain, policy, NOW, force_full=force)
    newest = names[-1]
    if expect_full:
        assert kinds(plan) == [("full", None, newest)]
    else:
        assert kinds(plan) == [("incremental", names[chain_len - 1], newest)]


def test_a_tip_destroyed_on_the_source_starts_a_new_full_and_says_why():
    s = snaps("0", "1", "2")
    chain = [stream(1, "full", s[0]), stream(2, "incremental", s[1], 1, s[0])]
    plan = plan_archive([s[0], s[2]], chain, POLICY, NOW)
    assert kinds(plan) == [("full", None, "2")]
    assert "gone from the source" in plan.streams[0].reason


def test_a_bad_stream_in_the_chain_starts_a_new_full():
    s = snaps("0", "1", "2")
    chain = [stream(1, "full", s[0], state="bad"), stream(2, "incremental", s[1], 1, s[0])]
    plan = plan_archive(s, chain, POLICY, NOW)
    assert kinds(plan) == [("full", None, "2")] and "bad" in plan.streams[0].reason


def test_the_current_chain_is_the_newest_full_and_its_descendants_ignoring_condemned_streams():
    s = snaps("0", "1", "2", "3")
    old = [stream(1, "full", s[0]), stream(2, "incremental", s[1], 1, s[0])]
    new = [stream(3, "full", s[2]), stream(4, "incremental", s[3], 3, s[2])]
    assert [x.id for x in current_chain(old + new)] == [3, 4]
    condemned = [stream(3, "full", s[2], state="condemned")]
    assert [x.id for x in current_chain(old + condemned)] == [1, 2]


def test_forcing_a_full_when_the_chain_already_starts_with_the_newest_snapshot_does_nothing_saying_so():
    s = snaps("0")
    plan = plan_archive(s, [stream(1, "full", s[0])], POLICY, NOW, force_full=True)
    assert plan.streams == ()
    assert "already starts with a full of @0" in plan.note


def up_to_date_chain(**states) -> tuple[list[CarriedSnapshot], list[StreamRow]]:
    """@0..@3 archived as full @0 and incrementals to @1, @2, @3 (tip = newest snapshot);
    ``states`` maps a stream's to-name ("s0".."s3") to its state."""
    s = snaps("0", "1", "2", "3")
    chain = [stream(1, "full", s[0], state=states.get("s0", "uploaded"))]
    for i in range(1, 4):
        chain.append(stream(i + 1, "incremental", s[i], parent=i, frm=s[i - 1],
                            state=states.get(f"s{i}", "uploaded")))
    return s, chain


def test_forcing_a_full_on_an_up_to_date_chain_writes_a_full_of_the_newest_snapshot():
    s, chain = up_to_date_chain()
    assert plan_archive(s, chain, POLICY, NOW).streams == ()
    plan = plan_archive(s, chain, POLICY, NOW, force_full=True)
    assert kinds(plan) == [("full", None, "3")] and plan.streams[0].reason == "--full"


def test_a_bad_stream_in_an_up_to_date_chain_starts_a_new_full_at_once():
    s, chain = up_to_date_chain(s2="bad")
    plan = plan_archive(s, chain, POLICY, NOW)
    assert kinds(plan) == [("full", None, "3")]
    assert "stream 3 (@2) of the current chain is bad" in plan.streams[0].reason


def test_the_new_full_after_a_bad_stream_gives_the_reason_the_stream_was_marked_bad_for():
    s, chain = up_to_date_chain(s2="bad")
    chain = [dataclasses.replace(c, bad_reason="volume 0 (p3/vol-000000.zst) is missing")
             if c.state == "bad" else c for c in chain]
    plan = plan_archive(s, chain, POLICY, NOW)
    assert plan.streams[0].reason.endswith(
        "stream 3 (@2) of the current chain is bad: volume 0 (p3/vol-000000.zst) is missing")


def test_a_stream_the_caller_found_damaged_starts_a_new_full_and_the_reason_says_what_is_missing():
    s, chain = up_to_date_chain()
    s.append(CarriedSnapshot("4", 2000, 50))
    plan = plan_archive(s, chain, POLICY, NOW, damaged={3: "volume 0 of stream 3 is missing"})
    assert kinds(plan) == [("full", None, "4")]
    assert "volume 0 of stream 3 is missing" in plan.streams[0].reason


def test_a_bad_stream_of_an_older_chain_does_not_stop_the_current_one():
    s = snaps("0", "1", "2", "3")
    old = [stream(1, "full", s[0]), stream(2, "incremental", s[1], 1, s[0], state="bad")]
    new = [stream(3, "full", s[2])]
    assert kinds(plan_archive(s, old + new, POLICY, NOW)) == [("incremental", "2", "3")]


def test_a_bad_full_of_the_newest_snapshot_is_not_written_again_at_its_taken_place():
    s = snaps("0", "1")
    streams = [stream(1, "full", s[0]), stream(2, "full", s[1], state="bad")]
    plan = plan_archive(s, streams, POLICY, NOW, force_full=True)
    assert plan.streams == ()
    assert "stream 2" in plan.note and "next snapshot starts the new chain" in plan.note


def test_a_callers_reason_for_a_new_chain_is_acted_on_even_when_the_chain_is_up_to_date():
    s, chain = up_to_date_chain()
    plan = plan_archive(s, chain, POLICY, NOW, new_chain="archived decrypted")
    assert kinds(plan) == [("full", None, "3")] and plan.streams[0].reason == "archived decrypted"


A, B, C = "age1" + "a" * 58, "age1" + "b" * 58, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIC"


def sealed_chain(*keys: tuple[str, ...] | None) -> tuple[list[CarriedSnapshot], list[StreamRow]]:
    """An up-to-date chain whose streams, in order, were sealed to ``keys`` (None: plain or
    not known), and one snapshot after its tip."""
    s, chain = up_to_date_chain()
    chain = [dataclasses.replace(row, sealed_to=k, compression="zstd+age" if k else "zstd")
             for row, k in zip(chain, keys, strict=True)]
    return [*s, CarriedSnapshot("4", 1004, 50)], chain


def test_a_recipient_added_since_a_stream_of_the_chain_was_sealed_starts_a_new_chain_at_once():
    """docs/sealed.md#changing-the-recipients: the added key's identity could not open the
    chain's earlier streams; the reason names the key and the stream."""
    s, chain = sealed_chain((A,), (A,), (A, B), (A, B))
    plan = plan_archive(s[:4], chain, POLICY, NOW, sealed_to=(A, B))
    assert kinds(plan) == [("full", None, "3")]
    reason = plan.streams[0].reason
    assert f"recipient(s) {B[:16]}... added" in reason and "stream 1 (@0)" in reason, reason
    plan = plan_archive(s, chain, POLICY, NOW, sealed_to=(B,))
    assert kinds(plan) == [("full", None, "4")]


def test_a_chain_continues_while_every_recipient_now_opens_every_stream_of_it():
    """A removed recipient keeps the chain (the others open all of it); so do the same keys,
    a plain chain that the store now seals, and sealed streams whose keys are not known."""
    cases = [((A, B), (A, B), (A, B), (A, B), (A,)), ((A, C), (A, C), (C,), (C,), (C,)),
             (None, None, None, None, (A,)), ((A, B), None, (A, B), None, (B,))]
    for *keys, now in cases:
        s, chain = sealed_chain(*keys)
        plan = plan_archive(s, chain, POLICY, NOW, sealed_to=now)
        assert kinds(plan) == [("incremental", "3", "4")], (keys, now, plan)


def test_a_sealed_chain_on_a_store_no_longer_sealed_starts_a_new_chain():
    s, chain = sealed_chain((A,), (A,), (A,), (A,))
    plan = plan_archive(s, chain, POLICY, NOW)
    assert kinds(plan) == [("full", None, "4")]
    assert "no longer sealed, but stream 1 (@0)" in plan.streams[0].reason
