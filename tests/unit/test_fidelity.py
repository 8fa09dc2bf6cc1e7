"""`fedat.lab.fidelity`: rounds, weights and accuracy of two runs' events.jsonl on a common (aligned) time axis."""

from __future__ import annotations

import json

import pytest

from fedat.lab import fidelity


def g(time: float, version: int, counts: list[int], weights: list[float]) -> dict:
    return {"event": "global", "time": time, "version": version, "tier_counts": counts, "tier_weights": weights}


def ev(time: float, accuracy: float, version: int) -> dict:
    return {"event": "evaluation", "time": time, "version": version, "accuracy": accuracy}


SEED = g(0.0, 0, [0, 0], [0.0, 0.0])
# A run whose profiling pass ended at 10 s: rounds of tier 1 at 10, 12, 14, 16 s and of tier 2 at 15 s.
RUN = [
    SEED,
    ev(1.0, 0.1, 0),
    g(10.0, 1, [1, 0], [1.0, 0.0]),
    ev(10.0, 0.3, 1),
    g(12.0, 2, [2, 0], [1.0, 0.0]),
    g(14.0, 3, [3, 0], [1.0, 0.0]),
    g(15.0, 4, [3, 1], [0.25, 0.75]),
    ev(15.0, 0.5, 4),
    g(16.0, 5, [4, 1], [0.2, 0.8]),
    ev(20.0, 0.4, 5),  # a late evaluation: version 5 was made at 16 s
]


def test_the_first_round_time_is_the_first_global_model_after_the_seed():
    assert fidelity.first_round_time(RUN) == 10.0
    assert fidelity.first_round_time([SEED, ev(1.0, 0.1, 0)]) is None


def test_rounds_per_tier_at_a_time_are_those_of_the_newest_version_made_by_then():
    assert fidelity.tier_rounds_at(RUN, 9.9) == [0, 0]
    assert fidelity.tier_rounds_at(RUN, 14.0) == [3, 0]
    assert fidelity.tier_rounds_at(RUN, 100.0) == [4, 1]
    assert fidelity.tier_rounds_at(RUN, -1.0) == [0, 0]  # before the seed: nothing, with the run's tier count
    shuffled = [RUN[i] for i in (8, 2, 6, 0, 4)]  # versions in any order, as observers may see them
    assert fidelity.tier_rounds_at(shuffled, 15.5) == [3, 1]


def test_a_version_recorded_twice_counts_once():
    assert [e["version"] for e in fidelity.global_models([*RUN, RUN[4]])] == [0, 1, 2, 3, 4, 5]


def test_mean_weights_average_the_versions_after_the_seed_in_the_window():
    assert fidelity.mean_tier_weights(RUN) == pytest.approx([(3 * 1.0 + 0.25 + 0.2) / 5, (0.75 + 0.8) / 5])
    assert fidelity.mean_tier_weights(RUN, 14.5, 15.5) == pytest.approx([0.25, 0.75])
    assert fidelity.mean_tier_weights(RUN, 100.0) == []


def test_an_evaluation_counts_when_its_model_was_made_however_late_it_was_scored():
    # The seed's score (evaluated at 1 s) belongs at 0 s, version 5's (evaluated at 20 s) at 16 s.
    assert fidelity.evaluations(RUN) == [(0.0, 0.1), (10.0, 0.3), (15.0, 0.5), (16.0, 0.4)]
    # A version with no global line (not recorded) keeps the evaluation's own time.
    assert fidelity.evaluations([SEED, ev(3.0, 0.2, 7)]) == [(3.0, 0.2)]
    # A seed published after the first round (a slow seed job) is still the model the run started from.
    late_seed = [g(12.0, 0, [0, 0], [0.0, 0.0]), ev(12.5, 0.05, 0), g(10.0, 1, [1, 0], [1.0, 0.0]), ev(10.2, 0.3, 1)]
    assert fidelity.evaluations(late_seed) == [(10.0, 0.05), (10.0, 0.3)]
    assert fidelity.accuracy_at(fidelity.evaluations(late_seed), 11.0) == 0.3


def test_accuracy_is_interpolated_between_evaluations_and_held_after_the_last():
    curve = fidelity.evaluations(RUN)
    assert fidelity.accuracy_at(curve, -0.5) is None  # nothing evaluated yet
    assert fidelity.accuracy_at(curve, 12.5) == pytest.approx(0.4)
    assert fidelity.accuracy_at(curve, 15.0) == pytest.approx(0.5)
    assert fidelity.accuracy_at(curve, 30.0) == pytest.approx(0.4)
    assert fidelity.accuracy_at([], 1.0) is None
    assert fidelity.best_accuracy(curve) == 0.5 and fidelity.best_accuracy(curve, 12.0) == 0.3


def test_aligning_moves_every_time_and_nothing_else():
    moved = fidelity.aligned(RUN, 10.0)
    assert [e["time"] for e in moved] == [e["time"] - 10.0 for e in RUN]
    assert [{k: v for k, v in e.items() if k != "time"} for e in moved] == [
        {k: v for k, v in e.items() if k != "time"} for e in RUN
    ]
    assert RUN[2]["time"] == 10.0  # the input is not changed


def test_compare_puts_two_runs_with_different_profiling_passes_round_for_round():
    # The same run with a profiling pass 3 s longer: on the aligned axis it is the same run.
    later = [{**e, "time": e["time"] + 3.0} if e["time"] >= 10.0 else e for e in RUN]
    c = fidelity.compare(RUN, later, duration=20.0, points=2)
    assert c.offset == pytest.approx(3.0) and c.horizon == pytest.approx(7.0)
    assert c.times == pytest.approx((3.5, 7.0))
    assert c.rounds == ([4, 1], [4, 1]) and c.round_differences() == [0, 0]
    assert c.weight_differences() == pytest.approx([0.0, 0.0])
    assert c.accuracy_differences() == pytest.approx([0.0, 0.0])
    assert c.best == (0.5, 0.5)


def test_compare_reports_what_differs():
    # The second run: tier 2 never ran and the model learnt less.
    other = [
        SEED,
        g(10.0, 1, [1, 0], [1.0, 0.0]),
        ev(10.0, 0.2, 1),
        g(12.0, 2, [2, 0], [1.0, 0.0]),
        ev(15.0, 0.3, 2),
    ]
    c = fidelity.compare(RUN, other, duration=20.0, points=2)
    assert c.offset == 0.0 and c.horizon == 10.0
    assert c.rounds == ([4, 1], [2, 0]) and c.round_differences() == [-2, -1]
    assert c.weight_differences() == pytest.approx([1.0 - 0.69, 0.0 - 0.31])
    # At aligned 5 s (= 15 s): 0.5 real, 0.3 simulated (version 2's, made at 12 s); at 10 s: 0.4 and 0.3, held.
    assert c.accuracy_differences() == pytest.approx([-0.2, -0.1])
    assert c.best == (0.5, 0.3)


def test_compare_needs_a_global_model_in_both_runs_and_a_common_window():
    with pytest.raises(ValueError, match="no global model"):
        fidelity.compare(RUN, [SEED], duration=20.0)
    with pytest.raises(ValueError, match="no common time"):
        fidelity.compare(RUN, RUN, duration=10.0)


def test_events_are_read_from_a_run_folder(tmp_path):
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in RUN) + "\n")
    assert fidelity.read_events(tmp_path) == RUN
