"""Tests for fedat.fl.tiering: latency tiers, tier lookup, drift, EWMA and TiFL's tier probabilities."""

from __future__ import annotations

import numpy as np
import pytest

from fedat.fl.tiering import assign_tiers, ewma, moved_clients, tier_of, tifl_probabilities

LATENCIES = {0: 3.0, 1: 1.0, 2: 2.0, 3: 1.0, 4: 5.0, 5: 0.5, 6: 4.0}


# --- assign_tiers --------------------------------------------------------------------------------------------


def test_assign_tiers_seven_into_three():
    # by (latency, id): 5, 1, 3, 2, 0, 6, 4 -> sizes 3, 2, 2
    assert assign_tiers(LATENCIES, 3) == ((5, 1, 3), (2, 0), (6, 4))


def test_assign_tiers_ties_broken_by_client_id():
    assert assign_tiers({9: 1.0, 2: 1.0, 5: 1.0, 7: 1.0}, 2) == ((2, 5), (7, 9))


def test_assign_tiers_even_split():
    lat = {c: float(10 - c) for c in range(6)}
    assert assign_tiers(lat, 3) == ((5, 4), (3, 2), (1, 0))


def test_assign_tiers_sizes_differ_by_at_most_one():
    lat = {c: float((c * 37) % 101) for c in range(23)}
    sizes = [len(t) for t in assign_tiers(lat, 5)]
    assert sizes == [5, 5, 5, 4, 4]


def test_assign_tiers_one_tier_holds_everyone_sorted():
    assert assign_tiers(LATENCIES, 1) == ((5, 1, 3, 2, 0, 6, 4),)


def test_assign_tiers_one_client_per_tier():
    assert assign_tiers({0: 2.0, 1: 1.0}, 2) == ((1,), (0,))


def test_assign_tiers_returns_python_ints():
    tiers = assign_tiers(LATENCIES, 3)
    assert all(type(c) is int for t in tiers for c in t)


def test_assign_tiers_every_client_once():
    tiers = assign_tiers(LATENCIES, 3)
    assert sorted(c for t in tiers for c in t) == sorted(LATENCIES)


@pytest.mark.parametrize("num_tiers", [0, -1])
def test_assign_tiers_needs_a_tier(num_tiers):
    with pytest.raises(ValueError, match="num_tiers must be >= 1"):
        assign_tiers(LATENCIES, num_tiers)


def test_assign_tiers_in_proportion_to_shares():
    lat = {c: float(c) for c in range(500)}
    sizes = [len(t) for t in assign_tiers(lat, 5, (50, 50, 100, 100, 200))]
    assert sizes == [50, 50, 100, 100, 200]
    assert assign_tiers({c: float(c) for c in range(6)}, 3, (1, 1, 4)) == ((0,), (1,), (2, 3, 4, 5))


def test_assign_tiers_shares_keep_a_client_in_every_tier():
    assert assign_tiers({c: float(c) for c in range(3)}, 3, (1, 1, 100)) == ((0,), (1,), (2,))
    assert assign_tiers({c: float(c) for c in range(4)}, 3, (100, 1, 1)) == ((0, 1), (2,), (3,))


def test_assign_tiers_shares_must_fit_the_tiers():
    with pytest.raises(ValueError, match="need 3 positive numbers"):
        assign_tiers(LATENCIES, 3, (1, 2))
    with pytest.raises(ValueError, match="need 3 positive numbers"):
        assign_tiers(LATENCIES, 3, (1, 0, 2))


def test_assign_tiers_more_tiers_than_clients():
    with pytest.raises(ValueError, match="cannot split 2 clients into 3 tiers"):
        assign_tiers({0: 1.0, 1: 2.0}, 3)


# --- tier_of / moved_clients ---------------------------------------------------------------------------------


def test_tier_of_numbers_from_one():
    assert tier_of(((5, 1), (2,), (7, 8))) == {5: 1, 1: 1, 2: 2, 7: 3, 8: 3}


def test_tier_of_empty():
    assert tier_of(()) == {}


def test_moved_clients_identical():
    assert moved_clients(((1, 2), (3,)), ((2, 1), (3,))) == set()


def test_moved_clients_changed_tier():
    assert moved_clients(((1, 2), (3, 4)), ((1, 3), (2, 4))) == {2, 3}


def test_moved_clients_added_and_removed_count():
    assert moved_clients(((1, 2), (3,)), ((1,), (2, 4))) == {2, 3, 4}


# --- ewma ----------------------------------------------------------------------------------------------------


def test_ewma_first_sample_taken_as_is():
    assert ewma(None, 5.0, 0.3) == 5.0


def test_ewma_hand_computed():
    assert ewma(10.0, 20.0, 0.25) == pytest.approx(12.5)


@pytest.mark.parametrize(("alpha", "expected"), [(0.0, 10.0), (1.0, 20.0)])
def test_ewma_extremes(alpha, expected):
    assert ewma(10.0, 20.0, alpha) == pytest.approx(expected)


# --- tifl_probabilities ----------------------------------------------------------------------------------------


def test_tifl_least_accurate_gets_most_weight():
    # accuracies 0.9, 0.5, 0.7 -> ranks 2, 0, 1 -> weights 1, 3, 2 over 6
    np.testing.assert_allclose(tifl_probabilities([0.9, 0.5, 0.7], [1, 1, 1]), [1 / 6, 3 / 6, 2 / 6])


def test_tifl_zero_credits_get_zero():
    # weights 1, 3, 2 with tier 2 out of credits -> 1, 0, 2 over 3
    np.testing.assert_allclose(tifl_probabilities([0.9, 0.5, 0.7], [4, 0, 2]), [1 / 3, 0.0, 2 / 3])


def test_tifl_credit_amount_does_not_matter():
    np.testing.assert_array_equal(
        tifl_probabilities([0.9, 0.5, 0.7], [1, 1, 1]), tifl_probabilities([0.9, 0.5, 0.7], [50, 2, 9])
    )


def test_tifl_all_out_of_credits():
    np.testing.assert_array_equal(tifl_probabilities([0.9, 0.5, 0.7], [0, 0, 0]), [0.0, 0.0, 0.0])


def test_tifl_sums_to_one():
    p = tifl_probabilities([0.1, 0.4, 0.3, 0.2], [1, 1, 0, 3])
    assert p.sum() == pytest.approx(1.0)


def test_tifl_ties_ranked_stably():
    np.testing.assert_allclose(tifl_probabilities([0.5, 0.5], [1, 1]), [2 / 3, 1 / 3])


def test_tifl_shape_mismatch():
    with pytest.raises(ValueError, match="tifl_probabilities"):
        tifl_probabilities([0.5, 0.6], [1])
