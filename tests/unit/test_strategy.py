"""Tests for the aggregator's strategies: client selection and the tier and cross-tier merges."""

from __future__ import annotations

import numpy as np
import pytest

from fedat_aggregator.strategy import STRATEGIES, CrossTier, FedAsync, TierStats, TierWeighted, TiFL

FEDAT = STRATEGIES["fedat"]
UNIFORM = STRATEGIES["fedat-uniform"]


def f32(*values) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def test_registry_names():
    assert {"fedat", "fedat-uniform"} <= set(STRATEGIES)
    assert FEDAT.name == "fedat" and UNIFORM.name == "fedat-uniform"
    assert isinstance(FEDAT, TierWeighted)


def test_select_clients_k_distinct_candidates():
    picked = FEDAT.select_clients([10, 20, 30, 40, 50], 3, np.random.default_rng(0))
    assert len(picked) == 3 == len(set(picked))
    assert set(picked) <= {10, 20, 30, 40, 50}


def test_select_clients_sorted_python_ints():
    picked = FEDAT.select_clients([50, 40, 30, 20, 10], 4, np.random.default_rng(1))
    assert picked == sorted(picked) and all(type(c) is int for c in picked)


def test_select_clients_k_capped_by_candidates():
    assert FEDAT.select_clients([3, 1, 2], 10, np.random.default_rng(0)) == [1, 2, 3]


def test_select_clients_deterministic_for_rng_seed():
    cands = list(range(100))
    assert FEDAT.select_clients(cands, 5, np.random.default_rng(42)) == FEDAT.select_clients(
        cands, 5, np.random.default_rng(42)
    )


def test_select_clients_varies_with_rng():
    cands = list(range(100))
    picks = {tuple(FEDAT.select_clients(cands, 5, np.random.default_rng(s))) for s in range(5)}
    assert len(picks) > 1


def test_merge_tier_sample_weighted():
    out = FEDAT.merge_tier([[f32(1, 2)], [f32(3, 4)]], [1, 3])
    np.testing.assert_allclose(out[0], [2.5, 3.5])


def merge(strategy, models, counts):
    return strategy.merge_global(CrossTier(None, tuple(models), tuple(counts), arrived=0, staleness=0))


def test_merge_global_fedat_weights():
    # counts [3, 2, 1] -> weights [1, 2, 3] / 6; ([1,2] + 2[3,4] + 3[5,6]) / 6 = [22, 28] / 6
    model, w = merge(FEDAT, [[f32(1, 2)], [f32(3, 4)], [f32(5, 6)]], [3, 2, 1])
    np.testing.assert_allclose(w, [1 / 6, 2 / 6, 3 / 6])
    np.testing.assert_allclose(model[0], [22 / 6, 28 / 6], rtol=1e-6)


def test_merge_global_startup_single_tier():
    model, w = merge(FEDAT, [None, [f32(7, 8)], None], [0, 2, 0])
    np.testing.assert_array_equal(w, [0.0, 1.0, 0.0])
    np.testing.assert_array_equal(model[0], f32(7, 8))


def test_merge_global_two_of_three_reported():
    # counts [3, 0, 1] -> weights [1/4, 0, 3/4]: 0.25[0, 4] + 0.75[4, 8] = [3, 7]
    model, w = merge(FEDAT, [[f32(0, 4)], None, [f32(4, 8)]], [3, 0, 1])
    np.testing.assert_allclose(w, [0.25, 0.0, 0.75])
    np.testing.assert_allclose(model[0], [3.0, 7.0])


def test_merge_global_multi_layer():
    model, _ = merge(FEDAT, [[f32(0), f32(1, 1)], [f32(6), f32(4, 7)]], [2, 1])
    # weights [1/3, 2/3]
    np.testing.assert_allclose(model[0], [4.0])
    np.testing.assert_allclose(model[1], [3.0, 5.0])


def test_merge_global_nothing_reported():
    with pytest.raises(ValueError, match="no tier has reported"):
        merge(FEDAT, [None, None], [0, 0])


def test_merge_global_uniform():
    model, w = merge(UNIFORM, [[f32(0, 0)], None, [f32(4, 8)]], [3, 0, 1])
    np.testing.assert_allclose(w, [0.5, 0.0, 0.5])
    np.testing.assert_allclose(model[0], [2.0, 4.0])


def stats(rounds, losses):
    return TierStats(tuple(rounds), tuple(losses))


def test_fedat_schedules_every_tier_whose_round_is_merged():
    assert FEDAT.schedule({1: 0, 2: 1, 3: 0}, stats([1, 1, 1], [0.5] * 3), np.random.default_rng(0)) == [1, 3]


def test_tifl_runs_one_tier_at_a_time():
    tifl = STRATEGIES["tifl"]
    rng = np.random.default_rng(0)
    assert tifl.schedule({1: 0, 2: 1, 3: 0}, stats([1, 1, 1], [0.5] * 3), rng) == []
    assert len(tifl.schedule({1: 0, 2: 0, 3: 0}, stats([0, 0, 0], [float("inf")] * 3), rng)) == 1


def test_tifl_favours_the_worst_tier_and_respects_credits():
    rng = np.random.default_rng(0)
    tifl = TiFL(credits=2)
    idle = {1: 0, 2: 0, 3: 0}
    # losses: tier 3 is worst (highest loss) -> weight 3/6; tier 1 best -> 1/6
    picks = [tifl.schedule(idle, stats([0, 0, 0], [0.1, 0.5, 0.9]), rng)[0] for _ in range(600)]
    share = np.bincount(picks, minlength=4)[1:] / 600
    np.testing.assert_allclose(share, [1 / 6, 2 / 6, 3 / 6], atol=0.06)
    # tier 3 has spent its 2 credits: only tiers 1 and 2 remain
    assert {tifl.schedule(idle, stats([0, 0, 2], [0.1, 0.5, 0.9]), rng)[0] for _ in range(50)} <= {1, 2}
    assert tifl.schedule(idle, stats([2, 2, 2], [0.1, 0.5, 0.9]), rng) == []


def test_fedasync_keeps_each_tier_topped_up_to_its_concurrency():
    assert FedAsync(concurrency=3).schedule({1: 1}, stats([0], [0.0]), np.random.default_rng(0)) == [1, 1]


def test_fedasync_mixes_with_staleness():
    fa = FedAsync(alpha=0.5, staleness="polynomial")
    g = [f32(0, 0)]
    # staleness 3: s = (3 + 1) ** -0.5 = 0.5, so a = 0.25: 0.75 * 0 + 0.25 * [4, 8] = [1, 2]
    model, w = fa.merge_global(CrossTier(g, ([f32(4, 8)],), (1,), 0, 3))
    np.testing.assert_allclose(model[0], [1.0, 2.0])
    np.testing.assert_allclose(w, [0.25])
    fresh, _ = fa.merge_global(CrossTier(g, ([f32(4, 8)],), (1,), 0, 0))
    np.testing.assert_allclose(fresh[0], [2.0, 4.0])


def test_tifl_global_model_is_the_arriving_tier_model():
    model, w = STRATEGIES["tifl"].merge_global(CrossTier(None, ([f32(1, 2)], [f32(5, 6)]), (3, 1), 1, 0))
    np.testing.assert_array_equal(model[0], f32(5, 6))
    np.testing.assert_array_equal(w, [0.0, 1.0])
