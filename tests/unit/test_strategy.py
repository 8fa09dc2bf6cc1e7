"""Tests for the aggregator's strategies: client selection and the tier and cross-tier merges."""

from __future__ import annotations

import numpy as np
import pytest

from fedat.fl.strategies import (
    STRATEGIES,
    ASOFed,
    Buffer,
    CrossTier,
    FedAsync,
    FedATDelta,
    FedBuff,
    GlobalMerge,
    TierStats,
    TierWeighted,
    TiFL,
    build_strategy,
)
from fedat.runtime.config import ConfigError
from fedat.runtime.config import strategy as strategy_from_env

FEDAT = build_strategy("fedat")
UNIFORM = build_strategy("fedat-uniform")


def f32(*values) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def test_registry_names():
    assert {"fedat", "fedat-uniform", "fedat-delta"} <= set(STRATEGIES)
    assert FEDAT.name == "fedat" and UNIFORM.name == "fedat-uniform"
    assert isinstance(FEDAT, TierWeighted)
    assert all(build_strategy(name).name == name for name in STRATEGIES)


def test_every_strategy_shares_client_selection_and_the_tier_merge():
    strategies = [build_strategy(name) for name in STRATEGIES]
    assert len({type(s).select_clients for s in strategies}) == 1
    assert len({type(s).merge_tier for s in strategies}) == 1


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
    out = strategy.merge_global(CrossTier(None, tuple(models), tuple(counts), arrived=0, staleness=0))
    assert isinstance(out, GlobalMerge) and out.state is None
    return out.model, out.tier_weights


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
    tifl = build_strategy("tifl")
    rng = np.random.default_rng(0)
    assert tifl.schedule({1: 0, 2: 1, 3: 0}, stats([1, 1, 1], [0.5] * 3), rng) == []
    assert len(tifl.schedule({1: 0, 2: 0, 3: 0}, stats([0, 0, 0], [float("inf")] * 3), rng)) == 1


def test_tifl_favours_the_worst_tier_and_respects_credits():
    rng = np.random.default_rng(0)
    tifl = TiFL(tifl_credits=2)
    idle = {1: 0, 2: 0, 3: 0}
    # losses: tier 3 is worst (highest loss) -> weight 3/6; tier 1 best -> 1/6
    picks = [tifl.schedule(idle, stats([0, 0, 0], [0.1, 0.5, 0.9]), rng)[0] for _ in range(600)]
    share = np.bincount(picks, minlength=4)[1:] / 600
    np.testing.assert_allclose(share, [1 / 6, 2 / 6, 3 / 6], atol=0.06)
    # tier 3 has spent its 2 credits: only tiers 1 and 2 remain
    assert {tifl.schedule(idle, stats([0, 0, 2], [0.1, 0.5, 0.9]), rng)[0] for _ in range(50)} <= {1, 2}
    assert tifl.schedule(idle, stats([2, 2, 2], [0.1, 0.5, 0.9]), rng) == []


def test_tifl_ranks_by_tier_test_accuracy_once_every_tier_has_one():
    rng = np.random.default_rng(0)
    idle = {1: 0, 2: 0, 3: 0}
    # training losses say tier 3 is worst, test accuracies say tier 1 is: the accuracies win
    measured = TierStats((1, 1, 1), (0.1, 0.5, 0.9), accuracies=(0.2, 0.6, 0.9))
    picks = [TiFL().schedule(idle, measured, rng)[0] for _ in range(600)]
    np.testing.assert_allclose(np.bincount(picks, minlength=4)[1:] / 600, [3 / 6, 2 / 6, 1 / 6], atol=0.06)
    # one tier not evaluated yet: the losses rank all three
    partial = TierStats((1, 1, 1), (0.1, 0.5, 0.9), accuracies=(0.2, float("nan"), 0.9))
    picks = [TiFL().schedule(idle, partial, rng)[0] for _ in range(600)]
    np.testing.assert_allclose(np.bincount(picks, minlength=4)[1:] / 600, [1 / 6, 2 / 6, 3 / 6], atol=0.06)


def test_fedasync_keeps_each_tier_topped_up_to_its_concurrency():
    assert FedAsync(concurrency=3).schedule({1: 1}, stats([0], [0.0]), np.random.default_rng(0)) == [1, 1]


def test_fedasync_mixes_with_staleness():
    fa = FedAsync(async_alpha=0.5, staleness="polynomial")
    g = [f32(0, 0)]
    # staleness 3: s = (3 + 1) ** -0.5 = 0.5, so a = 0.25: 0.75 * 0 + 0.25 * [4, 8] = [1, 2]
    out = fa.merge_global(CrossTier(g, ([f32(4, 8)],), (1,), 0, 3))
    model, w = out.model, out.tier_weights
    np.testing.assert_allclose(model[0], [1.0, 2.0])
    np.testing.assert_allclose(w, [0.25])
    fresh = fa.merge_global(CrossTier(g, ([f32(4, 8)],), (1,), 0, 0)).model
    np.testing.assert_allclose(fresh[0], [2.0, 4.0])


def test_tifl_global_model_is_the_arriving_tier_model():
    out = build_strategy("tifl").merge_global(CrossTier(None, ([f32(1, 2)], [f32(5, 6)]), (3, 1), 1, 0))
    model, w = out.model, out.tier_weights
    np.testing.assert_array_equal(model[0], f32(5, 6))
    np.testing.assert_array_equal(w, [0.0, 1.0])


# --- FedBuff ------------------------------------------------------------------------------------------------------


def test_registry_has_the_async_baselines():
    assert isinstance(build_strategy("fedbuff"), FedBuff) and build_strategy("fedbuff").name == "fedbuff"
    assert isinstance(build_strategy("aso-fed"), ASOFed) and build_strategy("aso-fed").name == "aso-fed"


def test_fedbuff_tops_tiers_up_to_concurrency_open_rounds():
    fb = FedBuff(concurrency=20)
    rng = np.random.default_rng(0)
    # 25 unmerged rounds but only 18 still open: restart 2 clients (FedAsync would start none)
    assert fb.schedule({1: 25}, TierStats((0,), (0.0,), open=(18,)), rng) == [1, 1]
    # a tier missing from `open` counts as having none open
    assert FedBuff(concurrency=2).schedule({1: 5, 2: 0}, TierStats((0, 0), (0.0, 0.0), open=(1,)), rng) == [1, 2, 2]


def arrive(strategy, model, base, state=None, staleness=0, g=None, pending=1):
    """One single-tier arrival: global model g (default [0, 0]), trained from `base`."""
    g = [f32(0, 0)] if g is None else g
    return strategy.merge_global(CrossTier(g, ([model],), (1,), 0, staleness, base, (7,), 10, state, pending))


def test_fedbuff_buffers_until_k_arrivals_then_steps():
    fb = FedBuff(buffer_size=3, server_lr=0.5, staleness="constant")
    g = [f32(1, 1)]
    first = arrive(fb, f32(3, 1), [f32(1, 1)], g=g)  # Δ = [2, 0]
    assert first.model is None and isinstance(first.state, Buffer) and first.state.count == 1
    np.testing.assert_array_equal(first.tier_weights, [1.0])
    second = arrive(fb, f32(1, 5), [f32(1, 1)], first.state, g=g, pending=2)  # Δ = [0, 4]
    assert second.model is None and second.state.count == 2
    np.testing.assert_allclose(second.state.total[0], [2.0, 4.0])
    third = arrive(fb, f32(2, 3), [f32(0, 0)], second.state, g=g, pending=3)  # Δ = [2, 3] from an older base
    # Σ Δ = [4, 7]; w = [1, 1] + 0.5 · [4, 7] / 3 = [5/3, 13/6]
    assert third.state is None
    np.testing.assert_allclose(third.model[0], [5 / 3, 13 / 6], rtol=1e-6)
    assert third.model[0].dtype == np.float32


def test_fedbuff_weighs_deltas_by_staleness():
    fb = FedBuff(buffer_size=2, server_lr=1.0, staleness="polynomial")
    # staleness 3: s = 4 ** -0.5 = 0.5, Δ = [4, 8] -> [2, 4]; staleness 0: s = 1, Δ = [2, 0]
    first = arrive(fb, f32(4, 8), [f32(0, 0)], staleness=3)
    np.testing.assert_allclose(first.tier_weights, [0.5])
    second = arrive(fb, f32(2, 0), [f32(0, 0)], first.state)
    # [0, 0] + ([2, 4] + [2, 0]) / 2 = [2, 2]
    np.testing.assert_allclose(second.model[0], [2.0, 2.0])


def test_fedbuff_arrival_with_unknown_base_counts_but_adds_nothing():
    fb = FedBuff(buffer_size=2, server_lr=1.0, staleness="constant")
    first = arrive(fb, f32(100, 100), None)  # its base left the history
    assert first.model is None and first.state.count == 1
    np.testing.assert_array_equal(first.tier_weights, [0.0])
    second = arrive(fb, f32(4, 2), [f32(0, 0)], first.state)
    # ([0, 0] + [4, 2]) / 2 = [2, 1]
    np.testing.assert_allclose(second.model[0], [2.0, 1.0])


def test_fedbuff_first_arrival_without_a_seed_becomes_the_model():
    out = FedBuff(buffer_size=5).merge_global(CrossTier(None, (None, [f32(3, 4)]), (0, 1), 1, 0))
    np.testing.assert_array_equal(out.model[0], f32(3, 4))
    np.testing.assert_array_equal(out.tier_weights, [0.0, 1.0])
    assert out.state is None


# --- ASO-Fed ------------------------------------------------------------------------------------------------------


def aso(model, client, n, state=None, tiers=1, arrived=0):
    tier_models = tuple(model if m == arrived else None for m in range(tiers))
    view = CrossTier(None, tier_models, (1,) * tiers, arrived, 0, clients=(client,), n_samples=n, state=state)
    return ASOFed().merge_global(view)


def test_aso_fed_schedule_tops_up_unmerged_rounds():
    rng = np.random.default_rng(0)
    assert ASOFed(concurrency=3).schedule({1: 1, 2: 3}, TierStats((0, 0), (0.0, 0.0), open=(0, 0)), rng) == [1, 1]


def test_aso_fed_global_is_the_sample_weighted_average_of_the_copies():
    a = aso([f32(2, 0)], client=1, n=10)
    np.testing.assert_allclose(a.model[0], [2.0, 0.0])  # one copy: itself
    b = aso([f32(0, 4)], client=2, n=30, state=a.state, tiers=2, arrived=1)
    # (10 [2, 0] + 30 [0, 4]) / 40 = [0.5, 3]; the arrival holds 30 / 40 of the samples
    np.testing.assert_allclose(b.model[0], [0.5, 3.0])
    np.testing.assert_allclose(b.tier_weights, [0.0, 0.75])
    assert set(b.state.models) == {1, 2} and b.state.total_n == 40


def test_aso_fed_second_arrival_of_a_client_replaces_its_copy():
    a = aso([f32(2, 0)], client=1, n=10)
    b = aso([f32(0, 4)], client=2, n=10, state=a.state)
    c = aso([f32(6, 0)], client=1, n=30, state=b.state)
    # copies: client 1 -> 30 · [6, 0], client 2 -> 10 · [0, 4]: (180, 40) / 40 = [4.5, 1]
    np.testing.assert_allclose(c.model[0], [4.5, 1.0])
    assert c.state.total_n == 40 and c.state.models[1][1] == 30
    assert b.state.models[1][1] == 10  # the earlier state is left as it was


def test_aso_fed_round_of_several_clients_splits_its_samples():
    view = CrossTier(None, ([f32(4)],), (1,), 0, 0, clients=(1, 2), n_samples=20)
    a = ASOFed().merge_global(view)
    assert a.state.models[1][1] == 10 and a.state.models[2][1] == 10
    b = aso([f32(1)], client=2, n=30, state=a.state)
    # client 1 -> 10 · [4], client 2 -> 30 · [1]: 70 / 40 = 1.75
    np.testing.assert_allclose(b.model[0], [1.75])


def test_aso_fed_needs_the_arrivals_clients():
    with pytest.raises(ValueError, match="names no client"):
        ASOFed().merge_global(CrossTier(None, ([f32(1)],), (1,), 0, 0, n_samples=5))


# --- hyper-parameters from the experiment's settings ------------------------------------------------------------


def test_without_settings_every_strategy_is_built_with_todays_constants():
    assert strategy_from_env({}) == FEDAT
    assert build_strategy("fedasync") == FedAsync(concurrency=20, async_alpha=0.6, staleness="polynomial")
    assert build_strategy("fedbuff") == FedBuff(concurrency=20, buffer_size=10, server_lr=1.0, history=16)
    assert build_strategy("tifl") == TiFL(tifl_credits=0) and build_strategy("aso-fed") == ASOFed(concurrency=20)
    assert build_strategy("fedat-delta") == FedATDelta(
        server_lr=1.0, staleness="polynomial", tier_balance=0.0, history=32
    )


def test_settings_reach_the_strategies_that_use_them_and_are_ignored_by_the_rest():
    env = {
        "FEDAT_ASYNC_ALPHA": "0.3",
        "FEDAT_STALENESS": "hinge",
        "FEDAT_CONCURRENCY": "4",
        "FEDAT_BUFFER_SIZE": "5",
        "FEDAT_SERVER_LR": "0.5",
        "FEDAT_TIFL_CREDITS": "7",
        "FEDAT_TIER_BALANCE": "1",
        "FEDAT_SERVER_LR_DECAY": "250",
        "FEDAT_HISTORY": "8",
    }
    assert strategy_from_env({**env, "FEDAT_STRATEGY": "fedasync"}) == FedAsync(
        concurrency=4, async_alpha=0.3, staleness="hinge"
    )
    assert strategy_from_env({**env, "FEDAT_STRATEGY": "fedbuff"}) == FedBuff(
        concurrency=4, buffer_size=5, server_lr=0.5, staleness="hinge", history=8
    )
    assert strategy_from_env({**env, "FEDAT_STRATEGY": "tifl"}) == TiFL(tifl_credits=7)
    assert strategy_from_env({**env, "FEDAT_STRATEGY": "aso-fed"}) == ASOFed(concurrency=4)
    assert strategy_from_env({**env, "FEDAT_STRATEGY": "fedat-delta"}) == FedATDelta(
        server_lr=0.5, staleness="hinge", tier_balance=1.0, server_lr_decay=250.0, history=8
    )
    assert strategy_from_env({**env, "FEDAT_STRATEGY": "fedat"}) == FEDAT


@pytest.mark.parametrize(
    "name, value",
    [
        ("FEDAT_STRATEGY", "fedavg2"),
        ("FEDAT_ASYNC_ALPHA", "0"),
        ("FEDAT_ASYNC_ALPHA", "1.5"),
        ("FEDAT_ASYNC_ALPHA", "high"),
        ("FEDAT_STALENESS", "linear"),
        ("FEDAT_CONCURRENCY", "0"),
        ("FEDAT_BUFFER_SIZE", "2.5"),
        ("FEDAT_SERVER_LR", "0"),
        ("FEDAT_SERVER_LR", "nan"),
        ("FEDAT_TIFL_CREDITS", "-1"),
        ("FEDAT_TIER_BALANCE", "-0.5"),
        ("FEDAT_SERVER_LR_DECAY", "-1"),
        ("FEDAT_SERVER_LR_DECAY", "inf"),
        ("FEDAT_HISTORY", "0"),
    ],
)
def test_a_bad_setting_is_a_config_error_naming_its_variable(name, value):
    with pytest.raises(ConfigError, match=name):
        strategy_from_env({"FEDAT_STRATEGY": "fedat", name: value})


def test_build_strategy_rejects_an_unknown_name():
    with pytest.raises(ValueError, match="unknown strategy 'fedavg2'"):
        build_strategy("fedavg2")


# --- fedat-delta --------------------------------------------------------------------------------------------------


def delta(strategy, model, base, staleness=0, g=None, counts=(1,), arrived=0):
    """One arrival of tier `arrived`'s model (a list of layers), trained from `base`, onto global model g."""
    g = [f32(0, 0)] if g is None else g
    tiers = tuple(model if m == arrived else None for m in range(len(counts)))
    return strategy.merge_global(CrossTier(g, tiers, tuple(counts), arrived, staleness, base, (7,), 10))


def test_fedat_delta_schedules_and_selects_as_fedat():
    d = FedATDelta()
    rng = np.random.default_rng(0)
    assert d.schedule({1: 0, 2: 1, 3: 0}, stats([1, 1, 1], [0.5] * 3), rng) == [1, 3]
    assert d.select_clients(list(range(100)), 5, np.random.default_rng(3)) == FEDAT.select_clients(
        list(range(100)), 5, np.random.default_rng(3)
    )


def test_fedat_delta_fresh_arrival_becomes_the_global_model():
    g = [f32(1, 2), f32(3)]
    out = delta(FedATDelta(), [f32(4, -1), f32(0.5)], g, g=g)
    np.testing.assert_array_equal(out.model[0], f32(4, -1))
    np.testing.assert_array_equal(out.model[1], f32(0.5))
    np.testing.assert_array_equal(out.tier_weights, [1.0])
    assert out.state is None


def test_fedat_delta_steps_by_the_staleness_discounted_delta_from_its_base():
    # staleness 3, polynomial: s = 0.5; η = 0.8: [1, 1] + 0.4 · ([4, 0] − [0, 2]) = [2.6, 0.2]
    out = delta(FedATDelta(server_lr=0.8), [f32(4, 0)], [f32(0, 2)], staleness=3, g=[f32(1, 1)])
    np.testing.assert_allclose(out.model[0], [2.6, 0.2], rtol=1e-6)
    np.testing.assert_allclose(out.tier_weights, [0.4])


def test_fedat_delta_balance_favours_the_rarer_tier():
    # counts [9, 3]: T/M = 6; tier 1 (9 updates) c = 2/3, tier 2 (3 updates) c = 2
    counts, base = (9, 3), [f32(0, 0)]
    fast = delta(FedATDelta(tier_balance=1.0), [f32(3, 3)], base, counts=counts, arrived=0)
    slow = delta(FedATDelta(tier_balance=1.0), [f32(3, 3)], base, counts=counts, arrived=1)
    np.testing.assert_allclose(fast.tier_weights, [2 / 3, 0.0])
    np.testing.assert_allclose(slow.tier_weights, [0.0, 2.0])
    np.testing.assert_allclose(fast.model[0], [2.0, 2.0], rtol=1e-6)
    np.testing.assert_allclose(slow.model[0], [6.0, 6.0], rtol=1e-6)
    # balance 0 (the default): both step alike
    plain = delta(FedATDelta(), [f32(3, 3)], base, counts=counts, arrived=1)
    np.testing.assert_allclose(plain.tier_weights, [0.0, 1.0])


def test_fedat_delta_step_decays_with_the_tier_rounds_merged():
    # counts (20, 7, 3): T = 30 rounds merged; τ = 10: η = 1 / sqrt(1 + 3) = 0.5, a fresh round moves halfway
    counts, g = (20, 7, 3), [f32(2, 2)]
    out = delta(FedATDelta(server_lr_decay=10.0), [f32(6, 0)], g, g=g, counts=counts, arrived=2)
    np.testing.assert_allclose(out.tier_weights, [0.0, 0.0, 0.5])
    np.testing.assert_allclose(out.model[0], [4.0, 1.0], rtol=1e-6)
    # the same arrival with the step constant (decay 0) replaces the model
    plain = delta(FedATDelta(), [f32(6, 0)], g, g=g, counts=counts, arrived=2)
    np.testing.assert_array_equal(plain.model[0], f32(6, 0))
    # an unknown base is mixed in with the decayed step too: a = min(1, 0.5 · s(3) = 0.25)
    old = delta(FedATDelta(server_lr_decay=10.0), [f32(6, 0)], None, staleness=3, g=g, counts=counts, arrived=2)
    np.testing.assert_allclose(old.model[0], [3.0, 1.5], rtol=1e-6)


def test_fedat_delta_unknown_base_falls_back_to_a_fedasync_mix():
    # base left the history; staleness 3: a = 0.5: 0.5 · [2, 2] + 0.5 · [6, 0] = [4, 1]
    out = delta(FedATDelta(), [f32(6, 0)], None, staleness=3, g=[f32(2, 2)])
    np.testing.assert_allclose(out.model[0], [4.0, 1.0])
    np.testing.assert_allclose(out.tier_weights, [0.5])
    # a scale above 1 mixes in the whole model, never beyond it
    big = delta(FedATDelta(server_lr=3.0), [f32(6, 0)], None, staleness=3, g=[f32(2, 2)])
    np.testing.assert_array_equal(big.model[0], f32(6, 0))
    np.testing.assert_allclose(big.tier_weights, [1.0])


def test_fedat_delta_first_arrival_without_a_seed_becomes_the_model():
    out = FedATDelta().merge_global(CrossTier(None, (None, [f32(3, 4)]), (0, 1), 1, 0))
    np.testing.assert_array_equal(out.model[0], f32(3, 4))
    np.testing.assert_array_equal(out.tier_weights, [0.0, 1.0])


def test_fedat_step_is_the_appendix_rule_a_delta_scaled_by_the_papers_weight():
    # counts (6, 3, 1): weights T_(M+1-m)/T = (1, 3, 6) / 10; staleness is not discounted, the step is 1
    step = build_strategy("fedat-step")
    counts, g, base = (6, 3, 1), [f32(1, 1)], [f32(0, 2)]
    out = delta(step, [f32(10, 2)], base, staleness=7, g=g, counts=counts, arrived=2)
    np.testing.assert_allclose(out.tier_weights, [0.0, 0.0, 0.6])
    np.testing.assert_allclose(out.model[0], [7.0, 1.0], rtol=1e-6)  # [1, 1] + 0.6 · ([10, 2] − [0, 2])
    fast = delta(step, [f32(10, 2)], base, staleness=7, g=g, counts=counts, arrived=0)
    np.testing.assert_allclose(fast.model[0], [2.0, 1.0], rtol=1e-6)  # the fastest tier weighs 0.1
    # the settings fedat-delta reads do not change the appendix's rule
    env = {"FEDAT_STRATEGY": "fedat-step", "FEDAT_SERVER_LR": "0.5", "FEDAT_STALENESS": "hinge"}
    assert strategy_from_env(env) == step
