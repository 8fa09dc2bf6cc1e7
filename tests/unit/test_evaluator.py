"""When the evaluator scores a global version (pure; no model involved)."""

from __future__ import annotations

from fedat_worker.evaluator import due


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
