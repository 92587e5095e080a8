"""Archive chain retention (pruning/chain_plan.py), table-driven on plain catalog rows."""

from __future__ import annotations

import datetime as dt
import random

import pytest

from zrepl_py.catalog.chains import build_chains
from zrepl_py.catalog.rows import ManifestLock, StreamRow, VolumeRow
from zrepl_py.config.archive import ArchiveConfig
from zrepl_py.pruning.chain_plan import ChainRetention, locked_until, plan_chain_retention

NOW = dt.datetime(2026, 11, 21, 12, tzinfo=dt.UTC)
S3_MIN = ArchiveConfig(store="s").min_storage_durations()
FEE = "(early-delete fee): pass --accept-early-delete-fee"


def row(id, txg, parent: StreamRow | None = None, *, state="uploaded", age=10.0,
        cls="STANDARD", verified_days_ago: float | None = 1.0) -> StreamRow:
    """Stream ``id`` ending at snapshot @TXG (guid TXG*7); a full without ``parent``; a
    ``verified`` one was verified ``verified_days_ago`` days before NOW (None: unknown)."""
    verified_at = (NOW - dt.timedelta(days=verified_days_ago)
                   if state == "verified" and verified_days_ago is not None else None)
    return StreamRow(
        id=id, host="local", dataset="tank/d", store="s",
        kind="full" if parent is None else "incremental",
        parent_id=parent.id if parent else None, from_guid=parent.to_guid if parent else None,
        to_guid=txg * 7, from_name=parent.to_name if parent else None, to_name=str(txg),
        to_createtxg=txg, raw_bytes=100, stored_bytes=50, object_prefix=f"p{id}/",
        storage_class=cls, compression="zstd", state=state,
        created_at=NOW - dt.timedelta(days=age), uploaded_at=None, verified_at=verified_at,
        bad_reason=f"volume 0 (p{id}/vol-000000.zst) is missing" if state == "bad" else None)


def chain(first_id, txg, *, n=2, state="uploaded", full_state=None, age=100.0, step=10.0,
          cls="STANDARD", inc_cls=None) -> list[StreamRow]:
    """A full (id ``first_id``, @TXG) and ``n - 1`` incrementals, each ``step`` days younger."""
    rows = [row(first_id, txg, state=full_state or state, age=age, cls=cls)]
    for i in range(1, n):
        rows.append(row(first_id + i, txg + i * 10, rows[-1], state=state, age=age - i * step,
                        cls=inc_cls or cls))
    return rows


A = chain(1, 10)                                    # streams 1 (@10), 2 (@10->@20); 100 / 90 days
A_VERIFIED = chain(1, 10, state="verified")
B = chain(3, 30, age=60)                            # 3 (@30), 4 (@30->@40); 60 / 50 days
B_VERIFIED = chain(3, 30, age=60, state="verified")
C_VERIFIED = chain(5, 50, n=1, age=5, state="verified")   # 5 (@50)
KEEP1, KEEP2 = ChainRetention(1), ChainRetention(2)

NEWEST = ("newest chain",)
DEL1 = ("beyond keep_chains = 1 (chain 2 from the newest)",)


def released(txg, id):
    return (f"released by the verified chain @{txg} (stream {id}), re-checked against the"
            " catalog before the first delete")


R3, R5 = released(30, 3), released(50, 5)
BAD3 = ("bad: the newer full @30 (stream 3) is marked bad (volume 0 (p3/vol-000000.zst) is"
        " missing) and releases nothing: zbak audit tells what is wrong")
STALE3 = ("the newer full @30 (stream 3) was verified 31d ago, longer than reverify_after 30d:"
          " zbak audit --deep re-verifies it")
STALE5 = STALE3.replace("@30 (stream 3) was verified 31d", "@50 (stream 5) was verified 45d")
UNKNOWN3 = ("the newer full @30 (stream 3) was verified at an unknown time, longer than"
            " reverify_after 30d: zbak audit --deep re-verifies it")


def refused(*ids):
    """The reason every sound chain of a dataset with damaged streams ``ids`` is kept."""
    return (f"the store is inconsistent: {len(ids)} stream(s) of this dataset have missing or"
            f" resized objects (streams {sorted(ids)}); prune deletes nothing of this dataset;"
            " run zbak audit")


def keep(*reasons):
    return ("keep", tuple(reasons))


def delete(*reasons):
    return ("delete", tuple(reasons))


CASES = [
    # (id, streams, policy, damaged, {stream id: (action, reasons)})
    ("a single full is kept as the newest chain",
     [row(1, 10, age=400)], KEEP1, {}, {1: keep("newest chain")}),
    ("a new full that is not verified yet does not release the old chain",
     A + [row(3, 30, age=1)], KEEP1, {},
     {1: keep("the newer full @30 (stream 3) is not verified yet: zbak audit --deep verifies it"),
      2: keep("the newer full @30 (stream 3) is not verified yet: zbak audit --deep verifies it"),
      3: keep(*NEWEST)}),
    ("a verified newer full releases the whole old chain",
     A + [row(3, 30, age=1, state="verified")], KEEP1, {},
     {1: delete(*DEL1, R3), 2: delete(*DEL1, R3), 3: keep(*NEWEST)}),
    ("only the newer FULL must be verified, not its incrementals",
     A + chain(3, 30, full_state="verified", state="uploaded"), KEEP1, {},
     {1: delete(*DEL1, R3), 2: delete(*DEL1, R3), 3: keep(*NEWEST), 4: keep(*NEWEST)}),
    ("keep_chains keeps that many newest chains",
     A + B_VERIFIED + C_VERIFIED, KEEP2, {},
     {1: delete("beyond keep_chains = 2 (chain 3 from the newest)", R3),
      2: delete("beyond keep_chains = 2 (chain 3 from the newest)", R3),
      3: keep("within keep_chains (2 of 2)"), 4: keep("within keep_chains (2 of 2)"),
      5: keep(*NEWEST)}),
    ("an older verified chain justifies deleting everything before it, unverified or not",
     A + B + C_VERIFIED, KEEP1, {},
     {1: delete("beyond keep_chains = 1 (chain 3 from the newest)", R5),
      2: delete("beyond keep_chains = 1 (chain 3 from the newest)", R5),
      3: delete(*DEL1, R5), 4: delete(*DEL1, R5), 5: keep(*NEWEST)}),
    ("the newest verified chain stays while the chain after it is unverified",
     A + B_VERIFIED + chain(5, 50, n=1, age=5), KEEP1, {},
     {1: delete("beyond keep_chains = 1 (chain 3 from the newest)", R3),
      2: delete("beyond keep_chains = 1 (chain 3 from the newest)", R3),
      3: keep("the newer full @50 (stream 5) is not verified yet: zbak audit --deep verifies it"),
      4: keep("the newer full @50 (stream 5) is not verified yet: zbak audit --deep verifies it"),
      5: keep(*NEWEST)}),
    ("a damaged stream makes prune refuse to touch its chain",
     A + B_VERIFIED, KEEP1, {2: "vol-000000.zst missing"},
     {1: keep("chain has a damaged stream @10->@20 (stream 2) (vol-000000.zst missing): prune"
              " refuses to touch it; run zbak audit"),
      2: keep("chain has a damaged stream @10->@20 (stream 2) (vol-000000.zst missing): prune"
              " refuses to touch it; run zbak audit"),
      3: keep(refused(2), *NEWEST), 4: keep(refused(2), *NEWEST)}),
    ("a damaged newer chain does not release the old one",
     A + B_VERIFIED, KEEP1, [4],
     {1: keep(refused(4), "the newer full @30 (stream 3) has a damaged or bad stream in its chain"),
      2: keep(refused(4), "the newer full @30 (stream 3) has a damaged or bad stream in its chain"),
      3: keep("chain has a damaged stream @30->@40 (stream 4): prune refuses to touch it; run"
              " zbak audit", *NEWEST),
      4: keep("chain has a damaged stream @30->@40 (stream 4): prune refuses to touch it; run"
              " zbak audit", *NEWEST)}),
    ("a bad stream in the newer chain does not release the old one either",
     A + [B_VERIFIED[0], row(4, 40, B_VERIFIED[0], state="bad", age=50)], KEEP1, {},
     {1: keep("the newer full @30 (stream 3) has a damaged or bad stream in its chain"),
      2: keep("the newer full @30 (stream 3) has a damaged or bad stream in its chain"),
      3: keep("chain has a bad stream @30->@40 (stream 4, volume 0 (p4/vol-000000.zst) is"
              " missing): prune refuses to touch it; run zbak audit", *NEWEST),
      4: keep("chain has a bad stream @30->@40 (stream 4, volume 0 (p4/vol-000000.zst) is"
              " missing): prune refuses to touch it; run zbak audit", *NEWEST)}),
    ("a newer full marked bad keeps the old chain with the reason 'bad', not 'not verified'",
     A + [row(3, 30, age=1, state="bad")], KEEP1, {},
     {1: keep(BAD3), 2: keep(BAD3),
      3: keep("chain has a bad stream @30 (stream 3, volume 0 (p3/vol-000000.zst) is"
              " missing): prune refuses to touch it; run zbak audit", *NEWEST)}),
    ("a verified mark older than reverify_after (30 days by default) releases nothing",
     A + [row(3, 30, age=40, state="verified", verified_days_ago=31)], KEEP1, {},
     {1: keep(STALE3), 2: keep(STALE3), 3: keep(*NEWEST)}),
    ("a verified mark of unknown age releases nothing",
     A + [row(3, 30, age=40, state="verified", verified_days_ago=None)], KEEP1, {},
     {1: keep(UNKNOWN3), 2: keep(UNKNOWN3), 3: keep(*NEWEST)}),
    ("a verified mark exactly reverify_after old still releases",
     A + [row(3, 30, age=40, state="verified", verified_days_ago=30)], KEEP1, {},
     {1: delete(*DEL1, R3), 2: delete(*DEL1, R3), 3: keep(*NEWEST)}),
    ("reverify_after is the policy's: one hour makes a two-hour-old mark stale",
     A + [row(3, 30, age=1, state="verified", verified_days_ago=2 / 24)],
     ChainRetention(1, reverify_after=dt.timedelta(hours=1)), {},
     {1: keep("the newer full @30 (stream 3) was verified 7200s ago, longer than reverify_after"
              " 1:00:00: zbak audit --deep re-verifies it"),
      2: keep("the newer full @30 (stream 3) was verified 7200s ago, longer than reverify_after"
              " 1:00:00: zbak audit --deep re-verifies it"),
      3: keep(*NEWEST)}),
    ("a stale newest full lets an older, freshly verified chain release what is before it",
     A + B_VERIFIED + [row(5, 50, age=40, state="verified", verified_days_ago=45)], KEEP1, {},
     {1: delete("beyond keep_chains = 1 (chain 3 from the newest)", R3),
      2: delete("beyond keep_chains = 1 (chain 3 from the newest)", R3),
      3: keep(STALE5), 4: keep(STALE5), 5: keep(*NEWEST)}),
    ("the releaser is the oldest newer chain that is verified and kept, not one deleted too",
     A_VERIFIED + B_VERIFIED + C_VERIFIED, KEEP1, {},
     {1: delete("beyond keep_chains = 1 (chain 3 from the newest)", R5),
      2: delete("beyond keep_chains = 1 (chain 3 from the newest)", R5),
      3: delete(*DEL1, R5), 4: delete(*DEL1, R5), 5: keep(*NEWEST)}),
    ("max_age lets a chain within keep_chains go once its newest stream is older",
     A + B_VERIFIED + C_VERIFIED, ChainRetention(3, max_age=dt.timedelta(days=70)), {},
     {1: delete("its newest stream is older than max_age 70d", R3),
      2: delete("its newest stream is older than max_age 70d", R3),
      3: keep("within keep_chains (2 of 3)"), 4: keep("within keep_chains (2 of 3)"),
      5: keep(*NEWEST)}),
    ("max_age never deletes the newest verified chain",
     A_VERIFIED + B, ChainRetention(2, max_age=dt.timedelta(days=30)), {},
     {1: keep("the newer full @30 (stream 3) is not verified yet: zbak audit --deep verifies it"),
      2: keep("the newer full @30 (stream 3) is not verified yet: zbak audit --deep verifies it"),
      3: keep(*NEWEST), 4: keep(*NEWEST)}),
    ("max_age never deletes the newest chain",
     A_VERIFIED, ChainRetention(1, max_age=dt.timedelta(days=1)), {},
     {1: keep(*NEWEST), 2: keep(*NEWEST)}),
    ("a stream younger than GLACIER's 90-day minimum keeps its whole chain",
     chain(1, 10, inc_cls="GLACIER", age=100, step=70) + [row(3, 30, age=1, state="verified")],
     ChainRetention(1, min_storage=S3_MIN), {},
     {1: keep(f"kept with its chain: @10->@20 is younger than GLACIER's 90-day minimum {FEE}"),
      2: keep(f"younger than GLACIER's 90-day minimum {FEE}"),
      3: keep(*NEWEST)}),
    ("--accept-early-delete-fee deletes it anyway and says so",
     chain(1, 10, inc_cls="GLACIER", age=100, step=70) + [row(3, 30, age=1, state="verified")],
     ChainRetention(1, min_storage=S3_MIN, accept_early_delete_fee=True), {},
     {1: delete(*DEL1, R3),
      2: delete(*DEL1, "early-delete fee accepted: younger than GLACIER's 90-day minimum", R3),
      3: keep(*NEWEST)}),
    ("DEEP_ARCHIVE's minimum is 180 days",
     [row(1, 10, cls="DEEP_ARCHIVE", age=179), row(3, 30, age=1, state="verified")],
     ChainRetention(1, min_storage=S3_MIN), {},
     {1: keep(f"younger than DEEP_ARCHIVE's 180-day minimum {FEE}"), 3: keep(*NEWEST)}),
    ("a stream older than its class's minimum goes without a fee",
     [row(1, 10, cls="DEEP_ARCHIVE", age=181), row(3, 30, age=1, state="verified")],
     ChainRetention(1, min_storage=S3_MIN), {},
     {1: delete(*DEL1, R3), 3: keep(*NEWEST)}),
    ("an overridden minimum wins over S3's default",
     [row(1, 10, cls="GLACIER", age=20), row(3, 30, age=1, state="verified")],
     ChainRetention(1, min_storage=ArchiveConfig(
         store="s", min_storage_duration={"GLACIER": "14d"}).min_storage_durations()), {},
     {1: delete(*DEL1, R3), 3: keep(*NEWEST)}),
    ("STANDARD and INTELLIGENT_TIERING have no minimum",
     [row(1, 10, cls="INTELLIGENT_TIERING", age=0.5), row(2, 20, cls="STANDARD", age=0.2),
      row(3, 30, age=0.1, state="verified")],
     ChainRetention(1, min_storage=S3_MIN), {},
     {1: delete("beyond keep_chains = 1 (chain 3 from the newest)", R3),
      2: delete(*DEL1, R3),
      3: keep(*NEWEST)}),
]


@pytest.mark.parametrize("streams, policy, damaged, expected",
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_chain_retention_decides_every_stream_with_its_reasons(streams, policy, damaged, expected):
    """docs/reliability.md#r19-prune-refuses-on-an-inconsistent-store,
    docs/reliability.md#r20-chain-validity: whole chains only (a full with live incrementals goes
    only with them), an unverified newer full keeps the old chain, a damaged or bad chain is never
    touched, every kept stream says why."""
    plan = plan_chain_retention(streams, policy, NOW, damaged=damaged)
    got = {d.stream.id: ("delete" if d.delete else "keep", d.reasons) for d in plan.decisions}
    assert got == expected


def test_condemned_streams_are_listed_unfinished_leaf_first_and_never_replanned():
    condemned = chain(1, 10, n=3, state="condemned")
    plan = plan_chain_retention(condemned + B_VERIFIED, KEEP1, NOW)
    assert [s.id for s in plan.unfinished] == [3, 2, 1]
    assert {d.stream.id for d in plan.decisions} == {3, 4}
    assert plan.to_delete == ()


def test_a_deleted_chain_lists_every_stream_leaf_first():
    """docs/reliability.md#r20-chain-validity: a full is deleted only after every incremental
    applying on it."""
    plan = plan_chain_retention(chain(1, 10, n=4) + C_VERIFIED, KEEP1, NOW)
    (doomed,) = plan.to_delete
    assert [s.id for s in doomed.leaf_first] == [4, 3, 2, 1]


def test_a_released_chain_waits_for_its_latest_volume_lock_then_goes():
    """docs/security.md#prune-on-a-lock-store: the latest retain-until of any volume of any
    stream of the chain holds the whole chain; a lapsed lock holds nothing; a chain retention
    keeps anyway is told its own reason, not the lock."""
    def volume(id, stream, until):
        return VolumeRow(id, stream, 0, f"p{stream}/vol-000000.zst", 1, 1, "0" * 64, f"v{id}",
                         until)

    later = NOW + dt.timedelta(days=2, seconds=1)
    volumes = {1: [volume(1, 1, NOW - dt.timedelta(days=1))],
               2: [volume(2, 2, later), volume(3, 2, NOW + dt.timedelta(hours=1))],
               3: [volume(4, 3, later)], 4: [volume(5, 4, None)]}
    locked = locked_until(volumes, A + B_VERIFIED)
    assert locked == {1: NOW - dt.timedelta(days=1), 2: later, 3: later}
    plan = plan_chain_retention(A + B_VERIFIED, KEEP1, NOW, locked=locked)
    wait = ("expired, locked until 2026-11-23 12:00:01 UTC (Object Lock): its versions are"
            " deleted by id once the lock lapses")
    got = {d.stream.id: ("delete" if d.delete else "keep", d.reasons) for d in plan.decisions}
    assert got == {1: keep(wait), 2: keep(wait), 3: keep(*NEWEST), 4: keep(*NEWEST)}
    assert plan.to_delete == () and plan.releasers == ()
    lapsed = plan_chain_retention(A + B_VERIFIED, KEEP1, later, locked=locked)
    assert [s.id for c in lapsed.to_delete for s in c.leaf_first] == [2, 1]


def test_a_manifest_locked_after_its_volumes_holds_its_stream_until_it_lapses():
    """A manifest is written, so locked, after the stream's volumes: its recorded lock
    (``Catalog.manifest_locks``) holds the stream when it is the later one."""
    volumes = {1: [VolumeRow(1, 1, 0, "p1/vol-000000.zst", 1, 1, "0" * 64, "v1", NOW)]}
    manifest = ManifestLock(1, "m1", "c1", NOW + dt.timedelta(seconds=2))
    assert locked_until(volumes, A, [manifest]) == {1: manifest.retain_until}
    assert locked_until({}, A, [manifest]) == {1: manifest.retain_until}
    assert locked_until(volumes, A) == {1: NOW}


def test_a_branching_chain_is_one_chain_deleted_whole():
    full = row(1, 10)
    branch_a = row(2, 20, full)
    branch_b = row(3, 25, full)
    chains, orphans = build_chains([full, branch_a, branch_b, row(4, 30, branch_a)])
    assert [[s.id for s in c] for c in chains] == [[1, 2, 3, 4]] and orphans == []
    plan = plan_chain_retention([full, branch_a, branch_b] + C_VERIFIED, KEEP1, NOW)
    assert {s.id for c in plan.to_delete for s in c.leaf_first} == {1, 2, 3}


def test_streams_of_two_datasets_or_a_naive_now_are_refused():
    other = StreamRow(**{**row(9, 90).__dict__, "dataset": "tank/e"})
    with pytest.raises(ValueError, match="one dataset"):
        plan_chain_retention(A + [other], KEEP1, NOW)
    with pytest.raises(ValueError, match="naive"):
        plan_chain_retention(A, KEEP1, NOW.replace(tzinfo=None))


def test_keep_chains_below_one_is_refused():
    with pytest.raises(ValueError):
        ChainRetention(0)


def test_a_reverify_after_of_zero_or_less_is_refused():
    with pytest.raises(ValueError, match="reverify_after"):
        ChainRetention(1, reverify_after=dt.timedelta(0))


def test_releasers_lists_each_releasing_chain_once_oldest_first():
    plan = plan_chain_retention(A + B + C_VERIFIED, KEEP1, NOW)
    assert [[s.id for s in r] for r in plan.releasers] == [[5]]
    assert plan_chain_retention(A + B, KEEP1, NOW).releasers == ()


SEEDS = range(300)


def _random_catalog(rng: random.Random) -> tuple[list[StreamRow], set[int]]:
    """One dataset's chains as archive runs leave them: 1 to 7 chains, oldest first and each
    younger than the one before, of a full and 0 to 3 incrementals; most fulls verified (most
    in the last days, some long ago or at an unknown time), a few streams bad (more often an
    incremental, as when a volume is lost), now and then
    one damaged in the store, mostly STANDARD class with some cold classes whose minimum
    storage duration may not be over yet. Drawn so that retention deletes a chain in most
    seeds (the share is asserted below): a catalog where nothing can go proves nothing about
    what is deleted."""
    rows: list[StreamRow] = []
    txg, age = 10, rng.uniform(100, 400)

    def draw_state(verified: float, bad: float) -> str:
        roll = rng.random()
        return "bad" if roll < bad else "verified" if roll < bad + verified else "uploaded"

    def cls() -> str:
        return "STANDARD" if rng.random() < 0.7 else rng.choice(sorted(S3_MIN))

    for _ in range(rng.choice([1, 2, 3, 3, 4, 4, 5, 6, 7])):
        fresh = rng.uniform(0, min(age, 4))
        rows.append(row(len(rows) + 1, txg, state=draw_state(0.9, 0.02), age=age, cls=cls(),
                        verified_days_ago=rng.choice([fresh, fresh, fresh, None,
                                                      rng.uniform(0, age)])))
        for _ in range(rng.randint(0, 3)):
            txg += 10
            age = max(0.0, age - rng.uniform(0, 5))
            rows.append(row(len(rows) + 1, txg, rows[-1], age=age, cls=cls(),
                            state=draw_state(0.3, 0.08)))
        txg += 10
        age = max(0.0, age - rng.uniform(5, 60))
    damaged = {rng.choice(rows).id} if rng.random() < 0.1 else set()
    return rows, damaged


def _random_case(seed: int):
    """The catalog, damaged ids, policy and plan of one seed."""
    rng = random.Random(seed)
    streams, damaged = _random_catalog(rng)
    policy = ChainRetention(rng.choice([1, 1, 1, 2, 3]),
                            max_age=rng.choice([None, dt.timedelta(days=rng.randint(1, 300))]),
                            min_storage=S3_MIN, accept_early_delete_fee=rng.random() < 0.5,
                            reverify_after=dt.timedelta(days=rng.choice([5, 30, 365])))
    return streams, damaged, policy, plan_chain_retention(streams, policy, NOW, damaged=damaged)


def test_the_random_catalogs_make_retention_delete_in_most_seeds_and_meet_every_hazard():
    """The safety test below checks deletions only where there are some: at least 60 % of
    the seeds must delete a chain (189 of 300 do, 465 chains in all; the earlier generator
    made 21), while an inconsistent store, bad, unverified and stale-verified chains and the
    early-delete fee still keep chains in at least 5 % of the seeds each (19 to 121). A
    releaser allowed a bad stream fails the safety test on 11 seeds, a stale verification
    on 63."""
    cases = [_random_case(seed) for seed in SEEDS]
    deleting = sum(bool(plan.to_delete) for *_, plan in cases)
    assert deleting >= 0.6 * len(SEEDS), f"only {deleting} of {len(SEEDS)} seeds delete"
    reasons = [" ".join(r for d in plan.decisions if not d.delete for r in d.reasons)
               for *_, plan in cases]
    for word in ("inconsistent", "bad", "not verified yet", "longer than reverify_after",
                 "early-delete fee"):
        seen = sum(word in text for text in reasons)
        assert seen >= 0.05 * len(SEEDS), f"{word!r}: {seen} seeds"


@pytest.mark.parametrize("seed", SEEDS)
def test_on_random_catalogs_every_deleted_chain_leaves_a_newer_kept_verified_sound_chain(seed):
    """docs/reliability.md#r20-chain-validity: on random catalogs no deletion leaves a snapshot
    without a verified, sound newer chain."""
    streams, damaged, policy, plan = _random_case(seed)
    assert plan.chains[-1].delete is False, "the newest chain is never deleted"
    for c in plan.chains:
        assert all(d.delete == c.delete for d in c.streams), "whole chains only"
        if not c.delete:
            assert all(d.reasons for d in c.streams), "every kept stream says why"
    for i, c in enumerate(plan.chains):
        if not c.delete:
            continue
        ids = {d.stream.id for d in c.streams}
        assert not ids & damaged and all(d.stream.state != "bad" for d in c.streams)
        assert any(not n.delete and n.full.state == "verified"
                   and not {d.stream.id for d in n.streams} & damaged
                   and all(d.stream.state != "bad" for d in n.streams)
                   for n in plan.chains[i + 1:]), "a newer verified, sound chain stays"
        (releaser,) = [n for n in plan.chains[i + 1:] if n.full.id == c.released_by[0].id]
        assert not releaser.delete and releaser.full.state == "verified"
        assert NOW - releaser.full.verified_at <= policy.reverify_after
        assert tuple(d.stream for d in releaser.streams) == c.released_by
        assert not {s.id for s in c.released_by} & damaged, "the releaser is sound"
    assert {r[0].id for r in plan.releasers} == {c.released_by[0].id for c in plan.to_delete}
