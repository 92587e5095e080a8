"""The replication planner: guids decide what is common, tokens are checked before use, a
diverged target is never overwritten (docs/design.md#replication;
docs/reliability.md#r3-stale-token, docs/reliability.md#r4-token-for-another-operation-is-rejected,
docs/reliability.md#r21-replication-safety-in-pruning)."""

from __future__ import annotations

import pytest

from zrepl_py.replication.planner import (
    NO_COMMON,
    Plan,
    ResumeToken,
    SourceState,
    TargetState,
    plan_replication,
)
from zrepl_py.zfs.steps import (
    AbortResume,
    BookmarkRef,
    Full,
    Incremental,
    Resume,
    Rollback,
    SnapRef,
)

SRC = "tank/data"
DST = "backup/data"


def s(name: str, txg: int, guid: int | None = None) -> SnapRef:
    """A snapshot; the guid defaults to 1000 + txg so equal names on both sides share it."""
    return SnapRef(name, 1000 + txg if guid is None else guid, txg)


def t(name: str, txg: int, guid: int) -> SnapRef:
    """A target snapshot (its own createtxg, the source's guid)."""
    return SnapRef(name, guid, txg)


def bm(name: str, txg: int) -> BookmarkRef:
    return BookmarkRef(name, 1000 + txg, txg)


A, B, C, D = s("a", 10), s("b", 20), s("c", 30), s("d", 40)
# On the target the same snapshots have other createtxgs but the same guids.
TA, TB, TC, TD = t("a", 5, A.guid), t("b", 6, B.guid), t("c", 7, C.guid), t("d", 8, D.guid)


def token(to: SnapRef, *, base: SnapRef | BookmarkRef | None = None, dataset: str = SRC,
          raw: bool = False) -> ResumeToken:
    return ResumeToken(token="1-abc-12-789c", toguid=to.guid, toname=f"{dataset}@{to.name}",
                       fromguid=None if base is None else base.guid, raw=raw, compressed=False,
                       bytes=4096)


def source(*snaps, bookmarks=(), encrypted=False) -> SourceState:
    return SourceState(SRC, tuple(snaps), tuple(bookmarks), encrypted)


def target(*snaps, exists=True, tok=None, foreign=()) -> TargetState:
    return TargetState(DST, exists, tuple(snaps), tok, frozenset(foreign))


MISSING = TargetState(DST, False, (), None)

# (id, source, target, on_divergence, expected steps, up_to_date, common)
CASES = [
    ("a missing target gets a full of the oldest snapshot then -I to the newest",
     source(A, B, C), MISSING, "stop",
     (Full(A), Incremental(A, C, True)), False, None),
    ("a missing target with one source snapshot gets only the full",
     source(A), MISSING, "stop", (Full(A),), False, None),
    ("source snapshots are ordered by createtxg, not by the order given or by name",
     source(C, s("zz", 5), A), MISSING, "stop",
     (Full(s("zz", 5)), Incremental(s("zz", 5), C, True)), False, None),
    ("a target holding the newest source snapshot is up to date",
     source(A, B), target(TA, TB), "stop", (), True, TB),
    ("a target behind gets one -I from the newest common snapshot to the newest",
     source(A, B, C, D), target(TA, TB), "stop", (Incremental(B, D, True),), False, TB),
    ("common is decided by guid: a same-named target snapshot with another guid is not common",
     source(A, B, C), target(TA, t("b", 6, 999_999), foreign={"b"}), "stop",
     None, False, TA),  # diverged: target's @b is newer than the common @a
    ("common is decided by guid: a renamed target snapshot still counts",
     source(A, B, C), target(TA, t("renamed", 6, B.guid)), "stop",
     (Incremental(B, C, True),), False, t("renamed", 6, B.guid)),
    ("common is the newest target snapshot by the target's createtxg",
     source(A, B, C), target(t("b", 3, B.guid), t("a", 9, A.guid)), "stop",
     (Incremental(A, C, True),), False, t("a", 9, A.guid)),
    ("a target snapshot older than the common one that the source pruned is no divergence",
     source(B, C), target(TA, TB), "stop", (Incremental(B, C, True),), False, TB),
    ("a common snapshot pruned on the source but bookmarked: -i from the bookmark, then -I",
     source(A, C, D, bookmarks=[bm("b", 20)]), target(TA, TB), "stop",
     (Incremental(bm("b", 20), C, False), Incremental(C, D, True)), False, TB),
    ("from a bookmark with one newer snapshot there is a single -i",
     source(A, C, bookmarks=[bm("b", 20)]), target(TA, TB), "stop",
     (Incremental(bm("b", 20), C, False),), False, TB),
    ("a snapshot base is preferred to a bookmark of the same guid",
     source(A, B, C, bookmarks=[bm("b", 20)]), target(TA, TB), "stop",
     (Incremental(B, C, True),), False, TB),
    ("a bookmark common with nothing newer on the source is up to date",
     source(A, bookmarks=[bm("b", 20)]), target(TA, TB), "stop", (), True, TB),
    ("an encrypted source is planned the same way",
     source(A, B, C, encrypted=True), target(TA), "stop",
     (Incremental(A, C, True),), False, TA),
    ("newer target snapshots are rolled back when the user opted in",
     source(A, B, C), target(TA, TB, t("x", 9, 77), t("y", 10, 78)), "rollback",
     (Rollback(TB, ("y", "x")), Incremental(B, C, True)), False, TB),
    ("a rollback onto the newest source snapshot sends nothing after it",
     source(A, B), target(TA, TB, t("x", 9, 77)), "rollback",
     (Rollback(TB, ("x",)),), False, TB),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_plans(case):
    _, src, dst, on_div, steps, up_to_date, common = case
    plan = plan_replication(src, dst, on_divergence=on_div)
    if steps is None:
        assert plan.diverged and plan.steps == ()
    else:
        assert plan.diverged is None
        assert plan.steps == steps
    assert plan.up_to_date is up_to_date
    assert plan.common == common


def test_a_target_without_a_common_snapshot_is_diverged_and_never_gets_a_full():
    plan = plan_replication(source(A, B), target(t("other", 3, 55)))
    assert plan.steps == () and not plan.up_to_date and plan.common is None
    assert NO_COMMON in plan.diverged and DST in plan.diverged


def test_an_existing_target_without_any_snapshot_is_diverged():
    plan = plan_replication(source(A), target())
    assert plan.steps == () and NO_COMMON in plan.diverged


def test_an_existing_target_without_a_common_snapshot_stays_diverged_with_rollback():
    plan = plan_replication(source(A), target(t("other", 3, 55)), on_divergence="rollback")
    assert plan.steps == () and NO_COMMON in plan.diverged


def test_newer_target_snapshots_make_a_diverged_plan_naming_them():
    plan = plan_replication(source(A, B, C), target(TA, TB, t("x", 9, 77), t("y", 10, 78)))
    assert plan.steps == () and not plan.up_to_date and plan.common == TB
    assert "@x, @y" in plan.diverged and "@b" in plan.diverged
    assert 'on_divergence = "rollback"' in plan.diverged


def test_a_target_holding_the_newest_snapshot_plus_newer_ones_is_diverged_not_up_to_date():
    plan = plan_replication(source(A, B), target(TA, TB, t("x", 9, 77)))
    assert plan.diverged and not plan.up_to_date


def test_rollback_never_destroys_a_target_snapshot_zbak_did_not_create():
    dst = target(TA, TB, t("zbak_1", 9, 77), t("admin-copy", 10, 78), foreign={"admin-copy"})
    plan = plan_replication(source(A, B, C), dst, on_divergence="rollback")
    assert plan.steps == ()
    assert "not rolling back" in plan.diverged and "@admin-copy" in plan.diverged


def test_a_foreign_snapshot_older_than_the_common_one_does_not_block_anything():
    plan = plan_replication(source(B, C), target(t("mine", 1, 5), TB, foreign={"mine"}))
    assert plan.steps == (Incremental(B, C, True),)


def test_a_source_without_snapshots_plans_nothing_and_says_why():
    plan = plan_replication(source(), MISSING)
    assert plan == Plan((), False, None, None, plan.note)
    assert "no snapshots" in plan.note


def test_an_unknown_divergence_policy_is_refused():
    with pytest.raises(ValueError):
        plan_replication(source(A), MISSING, on_divergence="force")


def test_an_incremental_from_a_bookmark_with_intermediates_cannot_be_built():
    with pytest.raises(ValueError):
        Incremental(bm("b", 20), C, True)


def test_a_resume_token_on_a_missing_target_is_refused():
    with pytest.raises(ValueError):
        TargetState(DST, False, (), token(A))


# -- resume tokens ---------------------------------------------------------------------


def test_a_valid_full_stream_token_resumes_then_sends_the_rest():
    tok = token(A)
    plan = plan_replication(source(A, B, C), target(tok=tok))
    assert plan.steps == (Resume(tok, A), Incremental(A, C, True))
    assert plan.diverged is None and not plan.up_to_date


def test_a_valid_incremental_token_resumes_to_its_snapshot_then_sends_the_rest():
    tok = token(B, base=A)  # e.g. -I @a @d interrupted inside @a -> @b
    plan = plan_replication(source(A, B, C, D), target(TA, tok=tok))
    assert plan.steps == (Resume(tok, B), Incremental(B, D, True))


def test_a_token_to_the_newest_snapshot_is_resumed_alone():
    tok = token(C, base=B)
    plan = plan_replication(source(A, B, C), target(TA, TB, tok=tok))
    assert plan.steps == (Resume(tok, C),)


def test_a_token_based_on_a_bookmark_resumes():
    tok = token(C, base=bm("b", 20))
    plan = plan_replication(source(A, C, bookmarks=[bm("b", 20)]), target(TA, TB, tok=tok))
    assert plan.steps == (Resume(tok, C),)


def test_a_raw_token_resumes_for_an_encrypted_source():
    tok = token(B, base=A, raw=True)
    plan = plan_replication(source(A, B, encrypted=True), target(TA, tok=tok))
    assert plan.steps == (Resume(tok, B),)


STALE = [
    # (id, source, target, expected words in the abort reason, steps after the abort)
    # docs/reliability.md#r3-stale-token
    ("a token whose snapshot was destroyed on the source is aborted",
     source(A, C), target(TA, tok=token(B, base=A)), "no longer exists on the source",
     (Incremental(A, C, True),)),
    # docs/reliability.md#r4-token-for-another-operation-is-rejected
    ("a token of another filesystem is aborted",
     source(A, B), target(TA, tok=token(B, base=A, dataset="tank/other")),
     "tank/other@b, not for a snapshot of tank/data", (Incremental(A, B, True),)),
    # docs/reliability.md#r4-token-for-another-operation-is-rejected
    ("a non-raw token for an encrypted source is aborted",
     source(A, B, encrypted=True), target(TA, tok=token(B, base=A)),
     "non-raw stream but the source is encrypted", (Incremental(A, B, True),)),
    ("a raw token for a source that is not encrypted is aborted",
     source(A, B), target(TA, tok=token(B, base=A, raw=True)),
     "raw stream but the source is not encrypted", (Incremental(A, B, True),)),
    ("a token whose base is not the common snapshot is aborted",
     source(A, B, C), target(TA, TB, tok=token(C, base=A)),
     "is not the common snapshot", (Incremental(B, C, True),)),
    ("an incremental token on a target with no common snapshot left is aborted, then diverged",
     source(B, C), target(t("gone", 4, 4242), tok=token(C, base=s("gone", 4, 4242))),
     None, None),
    ("a full-stream token on a target that already has snapshots is aborted",
     source(A, B), target(TA, tok=token(B)), "full stream but the target already has",
     (Incremental(A, B, True),)),
]


@pytest.mark.parametrize("case", STALE, ids=[c[0] for c in STALE])
def test_invalid_tokens_are_aborted_first_and_the_plan_continues_without_them(case):
    """docs/reliability.md#r3-stale-token,
    docs/reliability.md#r4-token-for-another-operation-is-rejected."""
    _, src, dst, words, rest = case
    plan = plan_replication(src, dst)
    if rest is None:
        assert plan.diverged and plan.steps == ()
        return
    assert isinstance(plan.steps[0], AbortResume) and words in plan.steps[0].reason
    assert plan.steps[1:] == rest
    assert plan.diverged is None and not plan.up_to_date


def test_an_aborted_full_stream_token_is_followed_by_a_new_full_send():
    # zfs receive -A destroys a partially received new dataset, so the target is gone.
    plan = plan_replication(source(A, C), target(tok=token(B)))
    assert isinstance(plan.steps[0], AbortResume)
    assert plan.steps[1:] == (Full(A), Incremental(A, C, True))
    assert plan.diverged is None and plan.common is None


def test_a_stale_token_with_nothing_left_to_send_plans_only_the_abort():
    """docs/reliability.md#r3-stale-token."""
    plan = plan_replication(source(A), target(TA, tok=token(B, base=A)))
    assert [type(step) for step in plan.steps] == [AbortResume]
    assert not plan.up_to_date


def test_a_token_on_a_target_with_newer_snapshots_is_aborted_before_the_rollback():
    dst = target(TA, t("x", 9, 77), tok=token(B, base=A))
    plan = plan_replication(source(A, B), dst, on_divergence="rollback")
    assert isinstance(plan.steps[0], AbortResume) and "newer" in plan.steps[0].reason
    assert plan.steps[1:] == (Rollback(TA, ("x",)), Incremental(A, B, True))


def test_a_diverged_target_keeps_its_token_untouched():
    plan = plan_replication(source(A, B), target(TA, t("x", 9, 77), tok=token(B, base=A)))
    assert plan.steps == () and plan.diverged


def test_replanning_after_the_abort_does_not_loop():
    """docs/reliability.md#r3-stale-token."""
    src = source(A, C)
    first = plan_replication(src, target(TA, tok=token(B, base=A)))
    assert isinstance(first.steps[0], AbortResume)
    again = plan_replication(src, target(TA))  # what the target looks like after the abort
    assert again.steps == first.steps[1:]


def test_a_source_snapshot_re_created_under_a_name_the_target_has_is_diverged_naming_both_guids():
    """docs/decisions.md#divergence-messages-say-what-happened: @b destroyed and re-created on the
    source after @c was replicated; zfs receive -I would fail "destination already exists" on every
    run."""
    b2 = s("b", 50)
    plan = plan_replication(source(A, C, b2), target(TA, TB, TC))
    assert plan.steps == () and plan.common == TC
    assert f"@b (source guid {b2.guid}, target guid {TB.guid})" in plan.diverged
    assert f"zfs rename {DST}@b {DST}@b-stale" in plan.diverged


def test_a_re_created_newest_snapshot_is_named_as_such_among_the_newer_target_snapshots():
    b2 = s("b", 50)
    plan = plan_replication(source(A, b2), target(TA, TB))
    assert plan.steps == () and "@b on the source is another snapshot of the same name" in plan.diverged
    rolled = plan_replication(source(A, b2), target(TA, TB), on_divergence="rollback")
    assert rolled.steps == (Rollback(TA, ("b",)), Incremental(A, b2, intermediates=True))


def test_a_name_reused_only_for_a_snapshot_not_sent_does_not_block():
    plan = plan_replication(source(A, s("b", 15), C), target(TA, t("b", 4, 999), TC))
    assert plan.diverged is None and plan.up_to_date
