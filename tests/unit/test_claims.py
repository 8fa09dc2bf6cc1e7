"""The verdict rules: records in, a verdict per claim out, seed by seed at the budget both methods ran."""

from __future__ import annotations

import pytest

from fedat.lab import claims as cl


def rec(method: str, seed: int, points: list[tuple[float, float]], minutes: float = 4.0, **summary) -> dict:
    """A record with an evaluation every `points` (virtual s, accuracy), cut-able to any shorter budget."""
    curve = [[t, a, int(t * 1e6), int(t * 1e6)] for t, a in points]
    at_eval = [[0.01, i, [i, i], [0.5, 0.5], i + 1] for i in range(len(points))]
    best = max(a for _, a in points)
    return {
        "comparison": "cmp",
        "method": method,
        "seed": seed,
        "virtual_minutes": minutes,
        "settings": {"learning_rate": 0.001},
        "summary": {"best_accuracy": best, "best_accuracy_variance": 0.01, **summary},
        "curve": curve,
        "at_eval": at_eval,
    }


def flat(method: str, seed: int, level: float, minutes: float = 4.0, **summary) -> dict:
    """A curve that rises to `level` in the first minute and stays there (last-quarter rise 0)."""
    points = [(30.0, level - 0.2)] + [(60.0 * k, level) for k in range(1, int(minutes) + 1)]
    return rec(method, seed, points, minutes, **summary)


def records(*recs: dict) -> dict:
    out: dict = {}
    for r in recs:
        out.setdefault(r["comparison"], {}).setdefault(r["method"], []).append(r)
    return out


CLAIM = cl.Claim("x1", "a beats b", "1 vs 0", "cmp", "a", ("b",))


def test_a_claim_holds_when_every_seed_is_won_and_fails_when_every_seed_is_lost():
    won = cl.judge(CLAIM, records(*(flat("a", s, 0.8) for s in range(3)), *(flat("b", s, 0.7) for s in range(3))))
    assert won.verdict == cl.HOLDS and won.pairs[0].scores == [1, 1, 1] and won.pairs[0].flat
    lost = cl.judge(CLAIM, records(*(flat("a", s, 0.6) for s in range(3)), *(flat("b", s, 0.7) for s in range(3))))
    assert lost.verdict == cl.FAILS


def test_a_seed_ahead_in_best_accuracy_but_behind_in_the_last_quarter_is_split():
    # a peaks at 0.9 early and ends at 0.6; b holds 0.7: a wins the best, loses the last quarter
    a = rec("a", 0, [(30.0, 0.9), (60.0, 0.6), (120.0, 0.6), (180.0, 0.6), (240.0, 0.6)])
    judged = cl.judge(CLAIM, records(a, flat("b", 0, 0.7), flat("a", 1, 0.8), flat("b", 1, 0.7)))
    assert judged.pairs[0].scores == [0, 1] and judged.verdict == cl.PARTLY


def test_pairs_use_the_seeds_both_ran_at_the_longest_budget_all_of_them_reach():
    a = [flat("a", 0, 0.8, minutes=4.0), flat("a", 1, 0.8, minutes=2.0), flat("a", 2, 0.8, minutes=4.0)]
    b = [flat("b", 0, 0.7, minutes=3.0), flat("b", 1, 0.7, minutes=4.0)]  # no seed 2
    p = cl.judge(CLAIM, records(*a, *b)).pairs[0]
    assert p.budgets == (2.0, 2.0) and p.common and [s.seed for s in p.subject] == [0, 1]
    assert all(r["virtual_minutes"] == 2.0 for rs in p.records for r in rs)


def test_a_comparator_without_records_leaves_the_claim_pending_unless_another_already_fails():
    two = cl.Claim("x2", "a beats b and c", "—", "cmp", "a", ("b", "c"))
    only_b_beaten = cl.judge(two, records(flat("a", 0, 0.8), flat("b", 0, 0.7)))
    assert only_b_beaten.verdict == cl.PENDING and only_b_beaten.missing == ["c"]
    b_wins = cl.judge(two, records(flat("a", 0, 0.6), flat("b", 0, 0.7)))
    assert b_wins.verdict == cl.FAILS and b_wins.missing == ["c"]
    nothing = cl.judge(CLAIM, records(flat("b", 0, 0.7)))
    assert nothing.verdict == cl.PENDING and nothing.missing == ["a"] and not nothing.pairs


def test_against_several_comparators_a_claim_holds_only_against_all_and_fails_against_any():
    two = cl.Claim("x2", "a beats b and c", "—", "cmp", "a", ("b", "c"))
    assert cl.judge(two, records(flat("a", 0, 0.8), flat("b", 0, 0.7), flat("c", 0, 0.7))).verdict == cl.HOLDS
    split = rec("a", 1, [(30.0, 0.9), (60.0, 0.6), (120.0, 0.6), (180.0, 0.6), (240.0, 0.6)])
    mixed = records(flat("a", 0, 0.8), split, flat("b", 0, 0.7), flat("b", 1, 0.7), flat("c", 0, 0.7))
    assert cl.judge(two, mixed).verdict == cl.PARTLY  # b: won and split; c: won
    assert cl.judge(two, records(flat("a", 0, 0.8), flat("b", 0, 0.7), flat("c", 0, 0.9))).verdict == cl.FAILS


def test_a_claim_that_the_subject_trails_scores_each_seed_the_other_way_round():
    trails = cl.Claim("x3", "a behind b", "—", "cmp", "a", ("b",), beaten=True)
    assert cl.judge(trails, records(flat("a", 0, 0.6), flat("b", 0, 0.7))).verdict == cl.HOLDS
    assert cl.judge(trails, records(flat("a", 0, 0.8), flat("b", 0, 0.7))).verdict == cl.FAILS


def test_a_still_rising_curve_is_not_flat():
    rising = rec("a", 0, [(60.0, 0.5), (120.0, 0.6), (150.0, 0.7), (200.0, 0.8), (230.0, 0.85)])
    p = cl.judge(CLAIM, records(rising, flat("b", 0, 0.7))).pairs[0]
    assert p.subject[0].rise == pytest.approx((0.8 + 0.85) / 2 - (0.6 + 0.7) / 2) and not p.flat


def rising_then_flat(method: str, seed: int, minutes: float, top: float = 0.8) -> dict:
    """Rises by 0.05 a minute from 0.4 to `top`, then stays there (its last quarter flat once it has for a quarter)."""
    points = [(60.0 * k, min(0.4 + 0.05 * k, top)) for k in range(int(minutes) + 1)]
    return rec(method, seed, points, minutes)


def test_a_pair_rising_at_the_shared_budget_is_judged_where_each_has_converged_if_less_time_won():
    # b still rises at 4 minutes, where a's runs end; its 16-minute runs flatten at 0.65, below a's 0.7
    a = [flat("a", s, 0.7, minutes=4.0) for s in range(2)]
    p = cl.judge(CLAIM, records(*a, *(rising_then_flat("b", s, 16.0, top=0.65) for s in range(2)))).pairs[0]
    assert p.budgets == (4.0, 16.0) and not p.common and p.flat and p.scores == [1, 1]
    assert [r["virtual_minutes"] for r in p.records[1]] == [16.0, 16.0]
    # the comparator with less time winning every seed is as telling: a rises for 16 minutes to 0.65, b holds 0.7
    b = [flat("b", s, 0.7, minutes=4.0) for s in range(2)]
    q = cl.judge(CLAIM, records(*(rising_then_flat("a", s, 16.0, top=0.65) for s in range(2)), *b)).pairs[0]
    assert q.budgets == (16.0, 4.0) and q.flat and q.scores == [-1, -1]


def test_more_time_that_won_leaves_the_pair_at_the_shared_budget():
    # b's 16-minute runs flatten at 0.8, above a's 0.7: b had four times a's time, so that says nothing of a's claim
    a = [flat("a", s, 0.7, minutes=4.0) for s in range(2)]
    p = cl.judge(CLAIM, records(*a, *(rising_then_flat("b", s, 16.0) for s in range(2)))).pairs[0]
    assert p.budgets == (4.0, 4.0) and not p.flat and p.scores == [1, 1]  # at 4 minutes a leads, b still rising
    assert p.outrun == (4.0, 16.0)  # where both have flattened, but b had the time


def test_each_method_at_its_own_budget_only_where_both_have_converged_there():
    # b's one long seed does not count: its runs on both seeds reach only 5 minutes, still rising
    a = [flat("a", s, 0.7, minutes=4.0) for s in range(2)]
    b = [rising_then_flat("b", 0, 16.0, top=0.65), rising_then_flat("b", 1, 5.0, top=0.65)]
    p = cl.judge(CLAIM, records(*a, *b)).pairs[0]
    assert p.budgets == (4.0, 4.0) and not p.flat
    # a pair flat at the shared budget stays there, though one method ran on further
    level = cl.judge(CLAIM, records(flat("a", 0, 0.8, minutes=4.0), flat("b", 0, 0.7, minutes=16.0))).pairs[0]
    assert level.budgets == (4.0, 4.0) and level.flat


def test_level_allows_a_small_shortfall_in_both_measures():
    level = cl.Claim("x4", "a loses none against b", "—", "cmp", "a", ("b",), rule="level")
    assert cl.judge(level, records(flat("a", 0, 0.795), flat("b", 0, 0.8))).verdict == cl.HOLDS
    assert cl.judge(level, records(flat("a", 0, 0.78), flat("b", 0, 0.8))).verdict == cl.FAILS


def test_variance_time_and_traffic_rules_count_a_target_never_reached_as_infinitely_late():
    low = cl.Claim("x5", "lower variance", "—", "cmp", "a", ("b",), rule="lower-variance")
    calm, noisy = flat("a", 0, 0.8, best_accuracy_variance=0.01), flat("b", 0, 0.8, best_accuracy_variance=0.02)
    assert cl.judge(low, records(calm, noisy)).verdict == cl.HOLDS
    sooner = cl.Claim("x6", "sooner to 0.75", "—", "cmp", "a", ("b",), rule="sooner", target=0.75)
    assert cl.judge(sooner, records(flat("a", 0, 0.8), flat("b", 0, 0.7))).verdict == cl.HOLDS  # b never
    assert cl.judge(sooner, records(flat("a", 0, 0.7), flat("b", 0, 0.7))).verdict == cl.PARTLY  # neither: a tie
    late = rec("a", 0, [(30.0, 0.5), (120.0, 0.8), (240.0, 0.8)])
    cheaper = cl.Claim("x7", "fewer MB to 0.75", "—", "cmp", "a", ("b",), rule="cheaper", target=0.75)
    assert cl.judge(cheaper, records(late, flat("b", 0, 0.8))).verdict == cl.FAILS  # b reached it at 60 s


def test_a_tuned_comparator_is_the_learning_rate_with_the_highest_mean_best_accuracy():
    tuned = cl.Claim("x8", "a beats b at its best rate", "—", "cmp", "a", ("b-slow", "b", "b-fast"), tuned=True)
    recs = [flat("a", s, 0.8) for s in range(2)]
    recs += [flat("b-slow", s, 0.6) for s in range(2)] + [flat("b", s, 0.7) for s in range(2)]
    recs += [flat("b-fast", 0, 0.85), flat("b-fast", 1, 0.75)]  # best on average though not on every seed
    judged = cl.judge(tuned, records(*recs))
    assert judged.chosen == "b-fast" and [p.against for p in judged.pairs] == ["b-fast"]
    assert judged.pairs[0].scores == [-1, 1] and judged.verdict == cl.PARTLY
    assert cl.judge(tuned, records(*recs[:6])).verdict == cl.PENDING  # a learning rate not run yet


def test_a_row_at_the_tuned_rate_reads_every_methods_runs_at_the_rate_fedavg_ranks_first():
    at_rate = cl.Claim(
        "x9", "a beats b and FedAvg at the tuned rate", "—", "cmp", "a", ("b", "fedavg"), at_tuned_rate=True
    )
    sweep = [flat("fedavg-lr3e-4", 0, 0.6), flat("fedavg", 0, 0.7)]
    assert cl.judge(at_rate, records(*sweep)).missing == ["fedavg-lr3e-3"]  # pending until the sweep is complete
    at_1e3 = [flat("a", 0, 0.8), flat("b", 0, 0.75)]
    at_3e3 = [flat("a-lr3e-3", 0, 0.7), flat("b-lr3e-3", 0, 0.9)]
    judged = cl.judge(at_rate, records(*sweep, flat("fedavg-lr3e-3", 0, 0.65), *at_1e3, *at_3e3))
    assert judged.chosen == "fedavg" and [p.against for p in judged.pairs] == ["b", "fedavg"]
    assert judged.verdict == cl.HOLDS and judged.claim.subject == "a" and judged.claim.at_tuned_rate
    judged = cl.judge(at_rate, records(*sweep, flat("fedavg-lr3e-3", 0, 0.72), *at_1e3, *at_3e3))
    assert judged.chosen == "fedavg-lr3e-3" and judged.claim.subject == "a-lr3e-3"
    assert [p.against for p in judged.pairs] == ["b-lr3e-3", "fedavg-lr3e-3"] and judged.verdict == cl.FAILS
    judged = cl.judge(at_rate, records(*sweep, flat("fedavg-lr3e-3", 0, 0.72), *at_1e3))
    assert judged.verdict == cl.PENDING and judged.missing == ["a-lr3e-3", "b-lr3e-3"]
    assert (
        cl.label("a-lr3e-3") == "a"
        and cl.label("fedat-lr3e-3") == "FedAT"
        and cl.label("fedat-delta-lr05") != "full step"
    )


def test_every_claim_names_a_known_rule_and_a_unique_key():
    every = cl.CLAIMS + cl.BEYOND
    assert all(c.rule in cl.RULES for c in every)
    assert len({c.key for c in every}) == len(every)
    assert all(c.target is not None for c in every if c.rule in ("sooner", "cheaper", "cheaper-upload"))


def test_a_method_that_wins_with_less_time_while_still_rising_settles_the_pair_once_the_other_has_flattened():
    # b rises at 4 minutes to 0.9; a's 16-minute runs flatten at 0.8: a had four times the time and still lost
    b = [rec("b", s, [(60.0, 0.5), (120.0, 0.7), (180.0, 0.8), (240.0, 0.9)]) for s in range(2)]
    a = [flat("a", s, 0.8, minutes=16.0) for s in range(2)]
    judged = cl.judge(CLAIM, records(*a, *b))
    p = judged.pairs[0]
    assert p.budgets == (16.0, 4.0) and not p.flat and p.settled and judged.settled and judged.verdict == cl.FAILS
    # a winner with less time that is still rising does not settle the variance rule: a later best may be noisier
    low = cl.Claim("x5", "lower variance", "—", "cmp", "a", ("b",), rule="lower-variance")
    noisy = [flat("a", s, 0.8, minutes=16.0, best_accuracy_variance=0.05) for s in range(2)]
    q = cl.judge(low, records(*noisy, *b)).pairs[0]
    assert q.budgets == (4.0, 4.0) and not q.settled and q.ahead is None


def test_a_claim_is_settled_by_a_settled_pair_that_fails_it_though_another_still_rises():
    two = cl.Claim("x2", "a beats b and c", "—", "cmp", "a", ("b", "c"))
    rising = rec("c", 0, [(60.0, 0.5), (120.0, 0.6), (180.0, 0.7), (240.0, 0.75)])
    judged = cl.judge(two, records(flat("a", 0, 0.7), flat("b", 0, 0.8), rising))
    assert judged.verdict == cl.FAILS and judged.settled and not judged.pairs[1].settled
    held = cl.judge(two, records(flat("a", 0, 0.8), flat("b", 0, 0.7), rising))
    assert held.verdict == cl.HOLDS and not held.settled  # c may yet catch up


def test_a_target_reached_by_both_or_by_one_before_the_other_ended_settles_time_and_traffic_rules():
    sooner = cl.Claim("x6", "sooner to 0.75", "—", "cmp", "a", ("b",), rule="sooner", target=0.75)
    cheaper = cl.Claim("x7", "fewer MB to 0.75", "—", "cmp", "a", ("b",), rule="cheaper", target=0.75)
    fast = rec("a", 0, [(60.0, 0.5), (120.0, 0.8), (180.0, 0.85), (240.0, 0.9)])  # still rising, reached at 120 s
    slow = rec("b", 0, [(60.0, 0.4), (120.0, 0.5), (180.0, 0.6), (240.0, 0.7)])  # still rising, not reached
    for claim in (sooner, cheaper):
        p = cl.judge(claim, records(fast, slow)).pairs[0]
        assert p.scores == [1] and not p.flat and p.final and p.settled
    # neither reached: a tie that either could break with more time
    assert not cl.judge(sooner, records(slow, {**slow, "method": "b"})).settled
    # a reached at 180 s, b had not by its end at 120 s: b may yet reach it sooner, or later
    late = rec("a", 0, [(60.0, 0.5), (120.0, 0.6), (180.0, 0.8), (240.0, 0.9)])
    short = rec("b", 0, [(60.0, 0.4), (120.0, 0.6)], minutes=2.0)
    p = cl.judge(sooner, records(late, short)).pairs[0]
    assert p.budgets == (2.0, 2.0) and not p.settled
    behind = cl.judge(sooner, records({**short, "method": "a"}, {**late, "method": "b"})).pairs[0]
    assert behind.budgets == (2.0, 2.0) and not behind.settled  # the same the other way round
    # with traffic, a reach settles against the other's bytes at its end: b had sent more by then
    wasteful = rec("b", 0, [(60.0, 0.4), (120.0, 0.6)], minutes=2.0)
    wasteful["curve"] = [[t, acc, up * 100, down * 100] for t, acc, up, down in wasteful["curve"]]
    q = cl.judge(cheaper, records(late, wasteful)).pairs[0]
    assert q.scores == [1] and q.final and q.budgets == (4.0, 2.0)
