"""The run invariants (fedat.ops.invariants) on hand-made message streams: clean runs pass, each violation is caught."""

from __future__ import annotations

from fedat.ops.invariants import (
    VIOLATIONS,
    DeadLetter,
    GlobalSeen,
    ReportSeen,
    TierModelSeen,
    UpdateSeen,
    Verdict,
    check,
)


def upd(tier: int, rnd: int, client: int, version: int = 0) -> UpdateSeen:
    return UpdateSeen(f"u-t{tier}-r{rnd}-c{client}-v{version}", tier, rnd, client)


def tm(tier: int, rnd: int, clients: tuple[int, ...], digest: str = "") -> TierModelSeen:
    return TierModelSeen(f"tm{tier}-r{rnd}", tier, rnd, clients, digest or f"d-tm{tier}-{rnd}")


def g(version: int, *merged: tuple[int, int], digest: str = "") -> GlobalSeen:
    return GlobalSeen(f"g{version}", version, tuple(merged), digest or f"d-g{version}")


def rr(tier: int, rnd: int, answered: tuple[int, ...], missing: tuple[int, ...] = ()) -> ReportSeen:
    return ReportSeen(f"rr{tier}-r{rnd}", tier, rnd, answered, missing)


def clean_streams():
    """Two tiers; tier 1 ran two merged rounds and has a third in flight; tier 2 one merged round."""
    updates = [
        upd(1, 1, 0),
        upd(1, 1, 1),
        upd(1, 1, 2),  # answered, but its not_before lay after the close: in the report, not merged
        upd(1, 2, 3, 2),
        upd(1, 2, 4, 2),
        upd(1, 2, 5, 2),  # a straggler: missing at the close, answered later (late-<id> report)
        upd(2, 1, 6),
        upd(2, 1, 7),
        upd(1, 3, 0, 3),  # round 3 has no tier model yet: in flight
    ]
    tier_models = [tm(1, 1, (0, 1)), tm(1, 2, (3, 4)), tm(2, 1, (6, 7))]
    globals_ = [g(0), g(1, (1, 1)), g(2, (1, 2)), g(3, (2, 1))]
    reports = [
        rr(1, 1, (0, 1, 2)),
        rr(1, 2, (3, 4), missing=(5,)),
        ReportSeen("late-u-t1-r2-c5-v2", 1, 2, (5,), ()),
        rr(2, 1, (6, 7)),
    ]
    return updates, tier_models, globals_, reports, []


def run(updates=(), tier_models=(), globals_=(), reports=(), dead=(), **kw) -> Verdict:
    return check(updates, tier_models, globals_, reports, dead, **kw)


def test_a_clean_run_passes_and_accounts_for_every_update():
    v = run(*clean_streams())
    assert v.ok, (v.violated(), v.examples)
    assert set(v.counts) == set(VIOLATIONS)
    assert v.info["updates"] == 9
    assert v.info["updates_merged"] == 6
    assert v.info["updates_answered_after_close"] == 2
    assert v.info["updates_in_flight"] == 1
    assert v.info["versions"] == 4


def test_redelivered_copies_are_not_violations():
    updates, tms, globals_, reports, _ = clean_streams()
    # A worker killed after publishing re-sends the same update; the aggregator and barrier re-publish after a crash.
    v = run(updates + updates[:3], tms + tms[:1], globals_ + [g(1, (1, 1)), g(2, (1, 2))], reports + reports)
    assert v.ok, (v.violated(), v.examples)
    assert v.info["global_messages"] == 6 and v.info["versions"] == 4


def test_an_update_answered_after_the_close_is_fine():
    # Client 2's answer reached the barrier before the close, but counts only after it: reported, not merged.
    v = run([upd(1, 1, 0), upd(1, 1, 2)], [tm(1, 1, (0,))], [g(0), g(1, (1, 1))], [rr(1, 1, (0, 2))])
    assert v.ok, v.examples
    assert v.info["updates_answered_after_close"] == 1


def test_a_version_published_twice_with_different_contents_is_repeated():
    _, tms, _, _, _ = clean_streams()
    v = run(tier_models=tms, globals_=[g(0), g(1, (1, 1)), g(1, (1, 1), digest="other")])
    assert v.counts["versions_repeated"] == 1
    assert v.examples["versions_repeated"] == ("g1: 2 different contents",)
    # Both contents merged tier 1's round 1: that round counts twice too.
    assert v.counts["rounds_merged_twice"] == 1


def test_a_version_with_a_different_merged_list_is_repeated():
    v = run(globals_=[g(0), g(1, (1, 1)), g(1, (2, 1))])
    assert v.counts["versions_repeated"] == 1
    assert v.counts["rounds_merged_twice"] == 0


def test_a_gap_in_the_versions_is_skipped():
    v = run(globals_=[g(0), g(1, (1, 1)), g(4, (1, 2))])
    assert v.counts["versions_skipped"] == 2
    assert v.examples["versions_skipped"] == ("g2", "g3")


def test_no_global_at_all_skips_nothing():
    assert run().ok


def test_a_round_merged_by_two_versions_counts_its_updates_twice():
    # A restarted aggregator that forgot it had merged tm1-r1 merges the redelivered copy again.
    v = run(
        [upd(1, 1, 0), upd(1, 1, 1)],
        [tm(1, 1, (0, 1))],
        [g(0), g(1, (1, 1)), g(2, (1, 1))],
        [rr(1, 1, (0, 1))],
    )
    assert v.counts["rounds_merged_twice"] == 1
    assert v.examples["rounds_merged_twice"] == ("tier 1 round 1: in versions [1, 2]",)
    assert v.counts["updates_counted_twice"] == 2
    assert v.counts["updates_lost"] == 0


def test_a_round_closed_twice_differently_conflicts():
    # A restarted barrier closed round 1 again with other clients (and so another digest).
    v = run(
        [upd(1, 1, 0), upd(1, 1, 1), upd(1, 1, 2)],
        [tm(1, 1, (0, 1), "a"), tm(1, 1, (0, 2), "b")],
        [g(0), g(1, (1, 1))],
        [rr(1, 1, (0, 1)), rr(1, 1, (0, 2))],
    )
    assert v.counts["tier_models_conflicting"] == 1
    assert v.examples["tier_models_conflicting"] == ("tm1-r1: clients [(0, 1), (0, 2)], 2 digests",)


def test_an_update_accounted_for_nowhere_is_lost():
    # Client 2 answered round 1, which closed and merged without it; no report, no dead letter.
    v = run([upd(1, 1, 0), upd(1, 1, 2)], [tm(1, 1, (0,))], [g(0), g(1, (1, 1))], [rr(1, 1, (0,))])
    assert v.counts["updates_lost"] == 1
    assert "u-t1-r1-c2-v0" in v.examples["updates_lost"][0]
    assert not v.ok


def test_an_update_still_queued_for_the_barrier_is_in_flight():
    u = upd(1, 1, 2)
    v = run([upd(1, 1, 0), u], [tm(1, 1, (0,))], [g(0), g(1, (1, 1))], [rr(1, 1, (0,))], queued=[u.id])
    assert v.ok, v.examples
    assert v.info["updates_in_flight"] == 1


def test_a_legitimate_dead_letter_accounts_for_an_update_and_a_forgetful_one_does_not():
    stale = DeadLetter(
        "u-t1-r1-c2-v0", "update", "stale round: tier 1 round 1 is already closed", "fedat.barrier.tier-1"
    )
    base = ([upd(1, 1, 0), upd(1, 1, 2)], [tm(1, 1, (0,))], [g(0), g(1, (1, 1))], [rr(1, 1, (0,))])
    assert run(*base, [stale]).ok
    forgot = DeadLetter(
        "u-t1-r1-c2-v0", "update", "client 2 was not given task u-t1-r1-c2-v0 in tier 1 round 1", "fedat.barrier.tier-1"
    )
    v = run(*base, [forgot])
    assert v.counts["updates_lost"] == 1
    assert "refused by a service" in v.examples["updates_lost"][0]


def test_updates_dead_lettered_by_the_broker_are_lost_and_listed():
    dl = DeadLetter("u-t1-r2-c3-v1", "update", "delivery_limit", "fedat.barrier.tier-1", source="broker")
    # Round 2 is still open (no tier model): in flight would excuse it, but the broker gave up on it.
    v = run([upd(1, 1, 0), upd(1, 2, 3, 1)], [tm(1, 1, (0,))], [g(0), g(1, (1, 1))], [rr(1, 1, (0,))], [dl])
    assert v.counts["updates_dead_lettered_by_broker"] == 1
    assert v.examples["updates_dead_lettered_by_broker"] == ("u-t1-r2-c3-v1 (delivery_limit, fedat.barrier.tier-1)",)
    assert v.counts["updates_lost"] == 1


def test_a_broker_dead_letter_of_a_copy_that_was_merged_loses_nothing():
    dl = DeadLetter("u-t1-r1-c0-v0", "update", "delivery_limit", "fedat.barrier.tier-1", source="broker")
    v = run([upd(1, 1, 0)], [tm(1, 1, (0,))], [g(0), g(1, (1, 1))], [rr(1, 1, (0,))], [dl])
    assert v.counts["updates_lost"] == 0
    assert v.counts["updates_dead_lettered_by_broker"] == 1  # still a violation: the broker gave up on a message


def test_a_tier_model_never_merged_is_lost_unless_it_is_the_newest():
    # tm1-r1 was published but the aggregator never merged it, while round 2 was merged: lost.
    v = run(
        [upd(1, 1, 0), upd(1, 2, 1, 1)],
        [tm(1, 1, (0,)), tm(1, 2, (1,))],
        [g(0), g(1, (1, 2))],
        [rr(1, 1, (0,)), rr(1, 2, (1,))],
    )
    assert v.counts["tier_models_lost"] == 1
    assert v.examples["tier_models_lost"] == ("tm1-r1",)
    assert v.counts["updates_lost"] == 1  # its update went nowhere either
    # The newest unmerged tier model of a tier is still on its way to the aggregator at the end: in flight.
    v = run([upd(1, 1, 0)], [tm(1, 1, (0,))], [g(0)], [rr(1, 1, (0,))])
    assert v.ok, v.examples
    assert v.info["tier_models_in_flight"] == 1


def test_a_tier_model_queued_for_the_aggregator_is_in_flight():
    v = run(
        [upd(1, 1, 0), upd(1, 2, 1, 1)],
        [tm(1, 1, (0,)), tm(1, 2, (1,))],
        [g(0), g(1, (1, 2))],
        [rr(1, 1, (0,)), rr(1, 2, (1,))],
        queued=["tm1-r1"],
        one_round_per_tier=False,
    )
    assert v.ok, v.examples


def test_a_round_abandoned_while_a_later_round_merged_loses_its_updates():
    # A restarted barrier forgot round 2 and opened round 3: round 2's updates can never be merged.
    v = run(
        [upd(1, 1, 0), upd(1, 2, 1, 1), upd(1, 3, 2, 1)],
        [tm(1, 1, (0,)), tm(1, 3, (2,))],
        [g(0), g(1, (1, 1)), g(2, (1, 3))],
        [rr(1, 1, (0,)), rr(1, 3, (2,))],
    )
    assert v.counts["updates_lost"] == 1
    assert "never closed" in v.examples["updates_lost"][0]
    # With concurrent rounds per tier (FedAsync, FedBuff) an older open round may still close: in flight.
    assert run(
        [upd(1, 1, 0), upd(1, 2, 1, 1), upd(1, 3, 2, 1)],
        [tm(1, 1, (0,)), tm(1, 3, (2,))],
        [g(0), g(1, (1, 1)), g(2, (1, 3))],
        [rr(1, 1, (0,)), rr(1, 3, (2,))],
        one_round_per_tier=False,
    ).ok


def test_profiling_answers_are_not_round_updates():
    assert run([UpdateSeen("u-p-c3", 0, 0, 3)], globals_=[g(0)]).ok
