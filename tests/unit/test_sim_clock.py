"""The virtual clock: events run in time order, ties by a seeded draw then by scheduling order; time never goes back."""

from __future__ import annotations

import random

import pytest

from fedat_sim.clock import ORIGIN, Clock


def test_events_run_in_time_order_and_the_clock_stands_at_each_event():
    clock, seen = Clock(), []
    for t in (3.0, 1.0, 2.0):
        clock.at(ORIGIN + t, lambda t=t: seen.append((t, clock.now - ORIGIN)))
    assert clock.run(ORIGIN + 10) == 3
    assert seen == [(1.0, 1.0), (2.0, 2.0), (3.0, 3.0)]
    assert clock.now == ORIGIN + 10  # stands at the end of the window


def test_without_a_generator_ties_keep_scheduling_order():
    clock, seen = Clock(), []
    for i in range(5):
        clock.after(1.0, lambda i=i: seen.append(i))
    clock.run(ORIGIN + 1)
    assert seen == [0, 1, 2, 3, 4]


def test_seeded_ties_are_shuffled_the_same_way_for_the_same_seed():
    def order(seed: int) -> list[int]:
        clock, seen = Clock(rng=random.Random(seed)), []
        for i in range(8):
            clock.after(1.0, lambda i=i: seen.append(i))
        clock.run(ORIGIN + 1)
        return seen

    assert order(7) == order(7)
    assert sorted(order(7)) == list(range(8))
    assert any(order(s) != list(range(8)) for s in range(5))  # ties really are explored


def test_cancelled_events_do_not_run_and_the_past_is_clamped_to_now():
    clock, seen = Clock(), []
    event = clock.after(1.0, lambda: seen.append("cancelled"))
    event.cancel()
    clock.after(2.0, lambda: clock.at(ORIGIN, lambda: seen.append(clock.now - ORIGIN)))
    clock.run(ORIGIN + 5)
    assert seen == [2.0]  # scheduled "in the past" at t=2: runs at once, at t=2


def test_events_scheduled_beyond_the_window_wait_for_the_next_run():
    clock, seen = Clock(), []
    clock.after(5.0, lambda: seen.append(clock.now - ORIGIN))
    clock.run(ORIGIN + 4)
    assert seen == [] and clock.next_time() == ORIGIN + 5
    clock.run(ORIGIN + 6)
    assert seen == [5.0]


def test_a_model_that_answers_in_zero_time_is_a_livelock_error_not_a_hang(monkeypatch):
    from fedat_sim import clock as clock_module

    monkeypatch.setattr(clock_module, "MAX_EVENTS_AT_ONE_INSTANT", 50)
    c = clock_module.Clock()

    def again() -> None:
        c.after(0.0, again, "answer")

    c.after(1.0, again, "answer")
    with pytest.raises(clock_module.Livelock, match="more than 50 events at virtual time .* 'answer'"):
        c.run(c.now + 10.0)
