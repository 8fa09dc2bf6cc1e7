"""Tests for fedat.fl.aggregate: averaging, FedAT cross-tier weights, staleness and asynchronous server steps."""

from __future__ import annotations

import numpy as np
import pytest

from fedat.fl.aggregate import (
    STALENESS,
    accumulate_delta,
    apply_buffer,
    constant_staleness,
    copies_average,
    decayed_step,
    delta_step,
    fedasync_mix,
    fedat_tier_weights,
    hinge_staleness,
    polynomial_staleness,
    replace_copy,
    sample_weighted_average,
    tier_balance,
    uniform_tier_weights,
    weighted_average,
)


def f32(*values) -> np.ndarray:
    return np.array(values, dtype=np.float32)


# --- weighted_average / sample_weighted_average --------------------------------------------------------------


def test_sample_weighted_average_hand_computed():
    out = sample_weighted_average([[f32(1, 2)], [f32(3, 4)]], [1, 3])
    np.testing.assert_allclose(out[0], [2.5, 3.5])


def test_weighted_average_returns_float32_list():
    out = weighted_average([[f32(1, 2)], [f32(3, 4)]], [1, 3])
    assert isinstance(out, list) and out[0].dtype == np.float32


def test_weighted_average_normalises_coefficients():
    a = weighted_average([[f32(0, 10)], [f32(10, 0)]], [0.2, 0.8])
    b = weighted_average([[f32(0, 10)], [f32(10, 0)]], [2, 8])
    np.testing.assert_allclose(a[0], [8.0, 2.0])
    np.testing.assert_array_equal(a[0], b[0])


def test_weighted_average_multi_layer():
    m1 = [f32(1, 1), np.full((2, 2), 2.0, dtype=np.float32)]
    m2 = [f32(4, 7), np.full((2, 2), 5.0, dtype=np.float32)]
    out = weighted_average([m1, m2], [2, 1])
    np.testing.assert_allclose(out[0], [2.0, 3.0])
    np.testing.assert_allclose(out[1], np.full((2, 2), 3.0))


def test_weighted_average_three_models():
    out = weighted_average([[f32(3)], [f32(6)], [f32(9)]], [1, 1, 1])
    np.testing.assert_allclose(out[0], [6.0])


def test_weighted_average_single_model_is_identity():
    out = weighted_average([[f32(1.5, -2)]], [7])
    np.testing.assert_array_equal(out[0], f32(1.5, -2))


def test_zero_coefficient_model_does_not_contribute():
    out = weighted_average([[f32(1, 2)], [f32(np.nan, np.inf)]], [1, 0])
    np.testing.assert_array_equal(out[0], f32(1, 2))


def test_weighted_average_does_not_modify_inputs():
    a, b = f32(1, 2), f32(3, 4)
    weighted_average([[a], [b]], [1, 1])
    np.testing.assert_array_equal(a, f32(1, 2))
    np.testing.assert_array_equal(b, f32(3, 4))


def test_weighted_average_no_models():
    with pytest.raises(ValueError, match="no models"):
        weighted_average([], [])


def test_weighted_average_count_mismatch():
    with pytest.raises(ValueError, match="2 models but 1 coefficients"):
        weighted_average([[f32(1)], [f32(2)]], [1])


@pytest.mark.parametrize("coefficients", [[-1, 2], [0, 0], [np.nan, 1], [np.inf, 1]])
def test_weighted_average_bad_coefficients(coefficients):
    with pytest.raises(ValueError, match="coefficients must be finite"):
        weighted_average([[f32(1)], [f32(2)]], coefficients)


def test_weighted_average_layer_count_mismatch():
    with pytest.raises(ValueError, match="model 1 has 1 layers"):
        weighted_average([[f32(1), f32(2)], [f32(1)]], [1, 1])


def test_weighted_average_shape_mismatch():
    with pytest.raises(ValueError, match="layer 0 of model 1 has shape"):
        weighted_average([[f32(1, 2)], [f32(1, 2, 3)]], [1, 1])


def test_sample_weighted_average_all_zero_samples():
    with pytest.raises(ValueError):
        sample_weighted_average([[f32(1)], [f32(2)]], [0, 0])


# --- fedat_tier_weights ------------------------------------------------------------------------------------


def test_fedat_weights_all_tiers_reported():
    w = fedat_tier_weights([5, 4, 3, 2, 1])
    np.testing.assert_allclose(w, np.array([1, 2, 3, 4, 5]) / 15)


def test_fedat_weights_mirror_counts():
    # tier m gets T_(M+1-m) / T: [10, 6, 4] -> [4, 6, 10] / 20
    np.testing.assert_allclose(fedat_tier_weights([10, 6, 4]), [0.2, 0.3, 0.5])


def test_fedat_weights_slowest_tier_weighs_most_when_fastest_updates_most():
    w = fedat_tier_weights([9, 1])
    assert w[1] > w[0]
    np.testing.assert_allclose(w, [0.1, 0.9])


def test_fedat_weights_nothing_reported():
    w = fedat_tier_weights([0, 0, 0, 0, 0])
    np.testing.assert_array_equal(w, np.zeros(5))


def test_fedat_weights_only_one_tier_reported():
    np.testing.assert_array_equal(fedat_tier_weights([0, 3, 0, 0, 0]), [0, 1, 0, 0, 0])


def test_fedat_weights_tiers_one_and_three_reported():
    np.testing.assert_allclose(fedat_tier_weights([3, 0, 1]), [0.25, 0.0, 0.75])


def test_fedat_weights_three_of_five_reported():
    # reported tiers 1, 2, 4 with counts 6, 3, 1 pair with 1, 3, 6 over 10
    np.testing.assert_allclose(fedat_tier_weights([6, 3, 0, 1, 0]), [0.1, 0.3, 0.0, 0.6, 0.0])


@pytest.mark.parametrize("counts", [[1], [1, 1], [7, 0, 2], [0, 0, 5, 1], [100, 1, 0, 0, 3], [1, 2, 3, 4, 5]])
def test_fedat_weights_reported_tiers_positive_and_sum_to_one(counts):
    w = fedat_tier_weights(counts)
    reported = np.asarray(counts) > 0
    assert np.all(w[reported] > 0)
    assert np.all(w[~reported] == 0)
    assert w.sum() == pytest.approx(1.0)


def test_fedat_weights_negative_count():
    with pytest.raises(ValueError):
        fedat_tier_weights([1, -1])


def test_fedat_weights_not_1d():
    with pytest.raises(ValueError):
        fedat_tier_weights([[1, 2], [3, 4]])


# --- uniform_tier_weights ------------------------------------------------------------------------------------


def test_uniform_weights_all_reported():
    np.testing.assert_allclose(uniform_tier_weights([5, 1, 2, 9]), [0.25] * 4)


def test_uniform_weights_ignores_unreported():
    np.testing.assert_allclose(uniform_tier_weights([3, 0, 1]), [0.5, 0.0, 0.5])


def test_uniform_weights_nothing_reported():
    np.testing.assert_array_equal(uniform_tier_weights([0, 0]), [0.0, 0.0])


# --- staleness ---------------------------------------------------------------------------------------------------


def test_constant_staleness():
    assert constant_staleness(0) == constant_staleness(100) == 1.0


@pytest.mark.parametrize(
    ("staleness", "a", "expected"), [(0, 0.5, 1.0), (3, 0.5, 0.5), (8, 1.0, 1 / 9), (1, 2.0, 0.25)]
)
def test_polynomial_staleness(staleness, a, expected):
    assert polynomial_staleness(staleness, a) == pytest.approx(expected)


def test_polynomial_staleness_default_exponent():
    assert polynomial_staleness(15) == pytest.approx(0.25)


@pytest.mark.parametrize(
    ("staleness", "a", "b", "expected"),
    [(0, 10.0, 4, 1.0), (4, 10.0, 4, 1.0), (5, 10.0, 4, 1 / 11), (6, 10.0, 4, 1 / 21), (3, 2.0, 0, 1 / 7)],
)
def test_hinge_staleness(staleness, a, b, expected):
    assert hinge_staleness(staleness, a, b) == pytest.approx(expected)


@pytest.mark.parametrize("fn", [polynomial_staleness, hinge_staleness])
def test_negative_staleness_rejected(fn):
    with pytest.raises(ValueError, match="staleness must be >= 0"):
        fn(-1)


def test_staleness_registry():
    assert STALENESS == {"constant": constant_staleness, "polynomial": polynomial_staleness, "hinge": hinge_staleness}


# --- fedasync_mix ------------------------------------------------------------------------------------------------


def test_fedasync_mix_hand_computed():
    # α·s = 0.5 · 0.5 = 0.25: 0.75·[0, 4] + 0.25·[2, 0] = [0.5, 3.0]
    out = fedasync_mix([f32(0, 4)], [f32(2, 0)], alpha=0.5, staleness_factor=0.5)
    np.testing.assert_allclose(out[0], [0.5, 3.0])


def test_fedasync_mix_zero_keeps_global():
    out = fedasync_mix([f32(1, 2)], [f32(9, 9)], alpha=0.0, staleness_factor=1.0)
    np.testing.assert_array_equal(out[0], f32(1, 2))


def test_fedasync_mix_one_takes_local_copy():
    local = [f32(9, 8)]
    out = fedasync_mix([f32(1, 2)], local, alpha=1.0, staleness_factor=1.0)
    np.testing.assert_array_equal(out[0], f32(9, 8))
    assert out[0] is not local[0]


@pytest.mark.parametrize(("alpha", "s"), [(1.5, 1.0), (-0.1, 1.0), (0.8, 2.0)])
def test_fedasync_mix_out_of_range(alpha, s):
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        fedasync_mix([f32(1)], [f32(2)], alpha=alpha, staleness_factor=s)


# --- FedBuff: accumulate_delta / apply_buffer -------------------------------------------------------------------


def test_accumulate_delta_into_an_empty_buffer():
    # 0.5 · ([5, 3] − [1, 1]) = [2, 1]
    out = accumulate_delta(None, [f32(5, 3)], [f32(1, 1)], 0.5)
    np.testing.assert_allclose(out[0], [2.0, 1.0])
    assert out[0].dtype == np.float64


def test_accumulate_delta_adds_to_the_buffer_without_changing_it():
    buffer = [np.array([1.0, 1.0])]
    out = accumulate_delta(buffer, [f32(4, 2)], [f32(2, 2)], 1.0)  # + [2, 0]
    np.testing.assert_allclose(out[0], [3.0, 1.0])
    np.testing.assert_array_equal(buffer[0], [1.0, 1.0])


def test_accumulate_delta_unknown_base_adds_nothing():
    np.testing.assert_array_equal(accumulate_delta(None, [f32(5, 3)], None, 1.0)[0], [0.0, 0.0])
    np.testing.assert_array_equal(accumulate_delta([np.array([1.0, 2.0])], [f32(5, 3)], None, 1.0)[0], [1.0, 2.0])


def test_accumulate_delta_shape_mismatch():
    with pytest.raises(ValueError, match="shape"):
        accumulate_delta(None, [f32(1, 2)], [f32(1, 2, 3)], 1.0)
    with pytest.raises(ValueError, match="layers"):
        accumulate_delta([np.zeros(2)], [f32(1, 2), f32(1)], None, 1.0)


def test_apply_buffer_hand_computed():
    # buffer = 1·[4, 2] + 0.5·[2, 8] = [5, 6]; /K=2 -> [2.5, 3]; ·η=0.4 -> [1.0, 1.2]; + [1, 2] -> [2.0, 3.2]
    buffer = accumulate_delta(accumulate_delta(None, [f32(4, 2)], [f32(0, 0)], 1.0), [f32(2, 8)], [f32(0, 0)], 0.5)
    out = apply_buffer([f32(1, 2)], buffer, 2, server_lr=0.4)
    np.testing.assert_allclose(out[0], [2.0, 3.2], rtol=1e-6)
    assert out[0].dtype == np.float32


def test_apply_buffer_multi_layer():
    out = apply_buffer([f32(0), f32(10, 10)], [np.array([2.0]), np.array([-4.0, 4.0])], 1, server_lr=1.0)
    np.testing.assert_allclose(out[0], [2.0])
    np.testing.assert_allclose(out[1], [6.0, 14.0])


def test_apply_buffer_empty_buffer():
    with pytest.raises(ValueError, match="empty buffer"):
        apply_buffer([f32(1)], [np.zeros(1)], 0, server_lr=1.0)


# --- ASO-Fed: replace_copy / copies_average ----------------------------------------------------------------------


def test_replace_copy_adds_a_new_client():
    total, n = replace_copy(None, 0.0, None, 0.0, [f32(1, 2)], 3)
    np.testing.assert_allclose(total[0], [3.0, 6.0])
    assert n == 3 and total[0].dtype == np.float64
    total, n = replace_copy(total, n, None, 0.0, [f32(5, 0)], 1)  # + 1 · [5, 0]
    np.testing.assert_allclose(total[0], [8.0, 6.0])
    assert n == 4


def test_replace_copy_swaps_a_clients_copy():
    # Σ = 3 · [1, 2] + 1 · [5, 0] = [8, 6]; client 2's [5, 0] (n 1) becomes [0, 4] (n 2): [3, 6] + [0, 8] = [3, 14]
    total, n = replace_copy([np.array([8.0, 6.0])], 4.0, [f32(5, 0)], 1, [f32(0, 4)], 2)
    np.testing.assert_allclose(total[0], [3.0, 14.0])
    assert n == 5


def test_replace_copy_rejects_negative_or_orphan_counts():
    with pytest.raises(ValueError, match=">= 0"):
        replace_copy(None, 0.0, None, 0.0, [f32(1)], -1)
    with pytest.raises(ValueError, match="no old copy"):
        replace_copy([np.zeros(1)], 2.0, None, 2.0, [f32(1)], 1)


def test_copies_average_hand_computed():
    out = copies_average([np.array([3.0, 14.0])], 5.0)
    np.testing.assert_allclose(out[0], [0.6, 2.8], rtol=1e-6)
    assert out[0].dtype == np.float32


def test_copies_average_without_samples():
    with pytest.raises(ValueError, match="no samples"):
        copies_average([np.zeros(1)], 0.0)


# --- fedat-delta: delta_step / tier_balance -----------------------------------------------------------------------


def test_delta_step_hand_computed():
    # [1, 2] + 0.5 · ([5, 2] − [1, 4]) = [1, 2] + [2, −1] = [3, 1]
    out = delta_step([f32(1, 2)], [f32(5, 2)], [f32(1, 4)], 0.5)
    np.testing.assert_allclose(out[0], [3.0, 1.0])
    assert out[0].dtype == np.float32


def test_delta_step_from_the_current_model_with_scale_one_is_the_model():
    g, w = [f32(0.1, -3.7), f32(1e-3)], [f32(0.3, 2.9), f32(-7.25)]
    out = delta_step(g, w, g, 1.0)
    for a, b in zip(out, w, strict=True):
        np.testing.assert_array_equal(a, b)


def test_delta_step_leaves_its_inputs_alone_and_checks_shapes():
    g = [f32(1, 1)]
    delta_step(g, [f32(2, 2)], [f32(0, 0)], 1.0)
    np.testing.assert_array_equal(g[0], [1.0, 1.0])
    with pytest.raises(ValueError, match="shape"):
        delta_step([f32(1, 2)], [f32(1, 2)], [f32(1, 2, 3)], 1.0)
    with pytest.raises(ValueError, match="finite"):
        delta_step([f32(1)], [f32(1)], [f32(1)], float("nan"))


def test_tier_balance_exponent_zero_is_one():
    assert tier_balance([50, 10, 5], 0, 0.0) == 1.0 == tier_balance([50, 10, 5], 2, 0.0)


def test_tier_balance_favours_the_rarer_tier():
    # T = 60, M = 3, T/M = 20: tier 0 (40 updates) 0.5, tier 2 (5 updates) 4 -> clipped to M = 3
    assert tier_balance([40, 15, 5], 0, 1.0) == pytest.approx(0.5)
    assert tier_balance([40, 15, 5], 1, 1.0) == pytest.approx(20 / 15)
    assert tier_balance([40, 15, 5], 2, 1.0) == 3.0
    assert tier_balance([40, 15, 5], 2, 0.5) == pytest.approx(2.0)  # sqrt(4)


def test_tier_balance_clips_to_one_over_m():
    # T = 1000, M = 2, T/M = 500, tier 0: 500 / 990 ≈ 0.505 ** 3 ≈ 0.129 -> 1/2
    assert tier_balance([990, 10], 0, 3.0) == 0.5


def test_tier_balance_counts_only_reported_tiers():
    assert tier_balance([7, 0, 0], 0, 1.0) == 1.0  # alone: nothing to balance against
    # reported [6, 2]: T/M = 4, tier 2 -> 4 / 2 = 2 (the silent tier does not count)
    assert tier_balance([6, 0, 2], 2, 1.0) == pytest.approx(2.0)


def test_tier_balance_rejects_bad_input():
    with pytest.raises(ValueError, match="no counted update"):
        tier_balance([3, 0], 1, 1.0)
    with pytest.raises(ValueError, match="no counted update"):
        tier_balance([3, 1], 2, 1.0)
    with pytest.raises(ValueError, match="non-negative"):
        tier_balance([3, -1], 0, 1.0)
    with pytest.raises(ValueError, match="finite"):
        tier_balance([3, 1], 0, float("inf"))


# --- fedat-delta: decayed_step ------------------------------------------------------------------------------------


def test_decayed_step_hand_computed():
    # η / sqrt(1 + T/τ): T = 0 gives η; T = 3τ halves it; T = 8τ gives a third
    assert decayed_step(1.0, 0, 100.0) == 1.0
    assert decayed_step(1.0, 300, 100.0) == pytest.approx(0.5)
    assert decayed_step(0.6, 800, 100.0) == pytest.approx(0.2)


def test_decayed_step_shrinks_with_rounds_and_decay_zero_keeps_it():
    steps = [decayed_step(1.0, t, 50.0) for t in range(0, 2000, 100)]
    assert all(a > b > 0 for a, b in zip(steps[:-1], steps[1:], strict=True))
    assert decayed_step(0.7, 10**6, 0.0) == 0.7


def test_decayed_step_rejects_bad_input():
    with pytest.raises(ValueError, match="merged"):
        decayed_step(1.0, -1, 10.0)
    with pytest.raises(ValueError, match="decay"):
        decayed_step(1.0, 5, -1.0)
    with pytest.raises(ValueError, match="finite"):
        decayed_step(float("nan"), 5, 10.0)
