"""Tests for fedat.fl.latency: deterministic client profiles, the response-latency model and per-task draws."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedat.fl.latency import (
    PAPER_DELAYS,
    ClientProfile,
    StragglerProfile,
    client_profiles,
    response_latency,
    round_draw,
    training_seconds,
)


def test_profiles_deterministic_by_seed():
    p = StragglerProfile(device_factor=(0.5, 2.0), unstable_clients=5)
    assert client_profiles(50, p, seed=3) == client_profiles(50, p, seed=3)


def test_profiles_differ_across_seeds():
    p = StragglerProfile(device_factor=(0.5, 2.0))
    assert client_profiles(50, p, seed=3) != client_profiles(50, p, seed=4)


def test_profiles_one_per_client_in_order():
    profiles = client_profiles(10, StragglerProfile(), seed=0)
    assert [c.client for c in profiles] == list(range(10))


def test_groups_evenly_spread():
    profiles = client_profiles(100, StragglerProfile(), seed=1)
    assert Counter(c.group for c in profiles) == {g: 20 for g in range(5)}


def test_groups_uneven_split_differs_by_one():
    profiles = client_profiles(7, StragglerProfile(), seed=1)
    assert sorted(Counter(c.group for c in profiles).values()) == [1, 1, 1, 2, 2]


def test_groups_are_shuffled_not_by_id():
    profiles = client_profiles(100, StragglerProfile(), seed=1)
    assert [c.group for c in profiles] != sorted(c.group for c in profiles)


def test_delay_matches_group():
    for c in client_profiles(30, StragglerProfile(), seed=2):
        assert c.delay == PAPER_DELAYS[c.group]


def test_unstable_count():
    p = StragglerProfile(unstable_clients=7, drop_window=(60.0, 600.0))
    drops = [c.drops_at for c in client_profiles(40, p, seed=5) if c.drops_at is not None]
    assert len(drops) == 7
    assert all(60.0 <= d <= 600.0 for d in drops)


def test_no_unstable_clients_by_default():
    assert all(c.drops_at is None for c in client_profiles(40, StragglerProfile(), seed=5))


def test_unstable_count_capped_by_clients():
    p = StragglerProfile(unstable_clients=10)
    assert all(c.drops_at is not None for c in client_profiles(4, p, seed=5))


def test_device_factors_within_range():
    factors = [c.device_factor for c in client_profiles(200, StragglerProfile(device_factor=(0.5, 3.0)), seed=9)]
    assert all(0.5 <= f <= 3.0 for f in factors)
    assert len(set(factors)) > 1


def test_device_factor_default_is_one():
    assert {c.device_factor for c in client_profiles(20, StragglerProfile(), seed=9)} == {1.0}


def _client(delay=(6.0, 10.0), factor=2.0) -> ClientProfile:
    return ClientProfile(client=0, group=2, delay=delay, device_factor=factor, drops_at=None)


def test_response_latency_hand_computed():
    # (3 s * 2 + 6 + 0.5 * (10 - 6)) * 0.1 = 1.4
    assert response_latency(3.0, _client(), time_scale=0.1, u=0.5) == pytest.approx(1.4)


def test_response_latency_u_zero_is_lower_bound():
    assert response_latency(1.0, _client(delay=(20.0, 30.0), factor=1.0), time_scale=1.0, u=0.0) == 21.0


def test_response_latency_zero_delay_group():
    assert response_latency(2.5, _client(delay=(0.0, 0.0), factor=1.0), time_scale=0.5, u=0.9) == 1.25


def test_round_draw_deterministic():
    assert round_draw(7, "task-42") == round_draw(7, "task-42")


def test_round_draw_depends_on_task_and_seed():
    assert round_draw(7, "task-42") != round_draw(7, "task-43")
    assert round_draw(7, "task-42") != round_draw(8, "task-42")


@settings(max_examples=100, deadline=None, database=None)
@given(st.integers(0, 2**32 - 1), st.text(max_size=40))
def test_round_draw_in_unit_interval(seed, task_id):
    u = round_draw(seed, task_id)
    assert isinstance(u, float) and 0.0 <= u < 1.0


def test_group_sizes_set_how_many_clients_each_delay_group_gets():
    profiles = client_profiles(500, StragglerProfile(group_sizes=(50, 50, 100, 100, 200)), seed=0)
    assert Counter(c.group for c in profiles) == {0: 50, 1: 50, 2: 100, 3: 100, 4: 200}


def test_group_sizes_that_do_not_fit_the_clients_are_refused():
    with pytest.raises(ValueError, match="summing to the 10 clients"):
        client_profiles(10, StragglerProfile(group_sizes=(5, 5, 5, 5, 5)), seed=0)


def test_training_seconds_is_nominal_when_a_step_cost_is_set():
    assert training_seconds(9.9, steps=144, step_seconds=0.005) == pytest.approx(0.72)
    assert training_seconds(9.9, steps=144, step_seconds=0.0) == 9.9
