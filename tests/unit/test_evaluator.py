"""When the evaluator scores a global version (pure; no model involved)."""

from __future__ import annotations

import pytest

from fedat.runtime import config
from fedat_worker.evaluator import due
from fedat_worker.evaluator_main import settings


def test_the_first_version_seen_is_always_scored():
    assert due(7, 0.0, None, every=5, interval=0.0)


def test_every_n_versions():
    assert not due(9, 100.0, (5, 0.0), every=5, interval=0.0)
    assert due(10, 100.0, (5, 0.0), every=5, interval=0.0)


def test_by_time_only_when_the_count_is_off():
    assert not due(6, 14.9, (5, 0.0), every=0, interval=15.0)
    assert due(6, 15.0, (5, 0.0), every=0, interval=15.0)
    assert not due(5, 99.0, (5, 0.0), every=0, interval=15.0)  # nothing new to score


def test_whichever_comes_first():
    assert due(6, 20.0, (5, 0.0), every=100, interval=15.0)
    assert due(105, 1.0, (5, 0.0), every=100, interval=15.0)


def test_by_time_counts_from_the_last_scored_version_by_default():
    # scored at 16 s: the next slot opens at 31 s, so an arrival at 30 s waits
    assert not due(6, 30.0, (5, 16.0), every=0, interval=15.0)
    assert due(6, 31.0, (5, 16.0), every=0, interval=15.0)


def test_on_a_grid_the_first_version_of_each_later_slot_is_scored():
    # scored at 16 s (slot [15, 30)): the next slot opens at 30 s whenever the last score fell in its slot
    assert not due(6, 29.9, (5, 16.0), every=0, interval=15.0, grid=True)
    assert due(6, 30.0, (5, 16.0), every=0, interval=15.0, grid=True)
    assert due(6, 30.0, (5, 29.0), every=0, interval=15.0, grid=True)  # 1 s later, but a new slot
    assert due(6, 200.0, (5, 29.0), every=0, interval=15.0, grid=True)  # skipped slots: scored once
    assert not due(6, 40.0, (5, 30.0), every=0, interval=0.0, grid=True)  # time off


def _scored_share(grid: bool) -> tuple[float, float]:
    """Four tiers with periods 17, 23, 29 and 37 s, 15-s slots: tier A's share of arrivals and of scored versions."""
    periods = {"A": (17.0, 0.0), "B": (23.0, 3.1), "C": (29.0, 7.3), "D": (37.0, 11.9)}
    arrivals = sorted((p * k + off, tier) for tier, (p, off) in periods.items() for k in range(int(3000 / p)))
    last, scored = None, []
    for v, (t, tier) in enumerate(arrivals):
        if due(v, t, last, every=0, interval=15.0, grid=grid):
            last = (v, t)
            scored.append(tier)
    return sum(tier == "A" for _, tier in arrivals) / len(arrivals), scored.count("A") / len(scored)


def test_counted_from_the_last_score_the_clock_phase_locks_on_a_tier_just_slower_than_the_interval():
    made, scored = _scored_share(grid=False)
    assert made < 0.4 and scored > 0.7  # the device regime's seed 0: 31 % of the time, 75 % of the scores


def test_a_grid_samples_the_tiers_about_as_often_as_they_publish():
    made, scored = _scored_share(grid=True)
    assert abs(scored - made) < 0.1


def test_the_anchor_setting():
    assert not settings({}).grid
    assert settings({"FEDAT_EVAL_ANCHOR": "grid", "FEDAT_EVAL_INTERVAL": "15"}).grid
    with pytest.raises(config.ConfigError, match="FEDAT_EVAL_ANCHOR='lsat'"):
        settings({"FEDAT_EVAL_ANCHOR": "lsat"})
