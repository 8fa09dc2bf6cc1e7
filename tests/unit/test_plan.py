"""The run's plan (`fedat.lab.plan`): the rule on made-up trials, then the rule on the demand model across machines
from fast to ten times slower and budgets from 2 to 60 minutes: each either plans a time scale at which the workers
keep up and every tier has merged a round within the first fifth of the budget, or refuses, naming a budget that
plans."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fedat.deploy.experiment import Experiment, load_experiment
from fedat.lab import plan as pl
from fedat.lab.plan import Plan, Refusal, Trial

# One worker for the module: its tests share the demand model's trials (`trials`), measured once per worker.
pytestmark = pytest.mark.xdist_group("plan")
ROOT = Path(__file__).resolve().parents[2]
FMNIST2 = load_experiment(ROOT / "experiments" / "fmnist2-fedat.yaml")


def made_up(time_scale: float, concurrency: int = 32, *, late: float = 0.0, busy: float = 0.5, every: float = 650.0):
    """A trial of 200 answers over 2000 × time scale seconds; every tier first merges at `every` × time scale."""
    horizon = 2000.0 * time_scale
    times = tuple(horizon * (i + 1) / 200 for i in range(200))
    return Trial(
        time_scale=time_scale,
        profile_concurrency=concurrency,
        horizon=horizon,
        first_merge=(every * time_scale / 2, every * time_scale),
        update_times=times,
        late_times=times[: int(late * 200)],
        busy_seconds=busy * 2 * horizon,
        workers=2,
    )


def test_a_trial_keeps_up_with_few_late_answers_within_the_budget_and_the_target():
    assert pl.keeps_up(made_up(0.1, late=0.02), 3600, 0.9)
    assert not pl.keeps_up(made_up(0.1, late=0.2), 3600, 0.9)
    assert not pl.keeps_up(made_up(0.1, busy=0.95), 3600, 0.9)
    # the late answers all came first: over a budget that ends early they are most of what it sees
    assert not pl.keeps_up(made_up(0.1, late=0.02), 10.0, 0.9)
    silent = Trial(0.1, 32, 100.0, (None, None), (), (), 0.0, 2)
    assert not pl.keeps_up(silent, 3600, 0.9)


def test_every_tier_must_merge_within_the_first_fifth():
    t = made_up(0.1)  # every tier by 65 s
    assert pl.fits(t, 325.0) and not pl.fits(t, 324.0)
    assert not pl.fits(Trial(0.1, 32, 100.0, (5.0, None), (), (), 0.0, 2), 3600)
    assert pl.minimum_minutes(t) == 6  # 65 s / 0.2 = 5.4 min
    assert pl.minimum_minutes(made_up(0.12)) == 7  # 78 / 0.2 = 390 s: 6.5 min, rounded up
    assert pl.minimum_minutes(Trial(0.1, 32, 100.0, (None,), (), (), 0.0, 2)) is None


def test_the_lattice_steps_by_a_fixed_ratio_and_reads_well():
    assert pl.lattice(0.05, 0) == 0.05 and pl.lattice(0.05, 4) == 0.1
    assert pl.lattice(0.0123456, 1) == 0.01468
    assert pl.lattice(0.05, -4) == 0.025


def machine(threshold: float, own_every: float = 650.0, all_every: float = 480.0):
    """Made-up trials: the workers keep up from `threshold` on; every tier merges at `every` × time scale, sooner
    when every client is profiled at once. Counts the trials."""
    calls: list[tuple[float, int]] = []

    def measure(time_scale: float, concurrency: int) -> Trial:
        calls.append((time_scale, concurrency))
        late = 0.0 if time_scale >= threshold else 0.5
        return made_up(time_scale, concurrency, late=late, every=own_every if concurrency == 32 else all_every)

    return measure, calls


def test_the_plan_is_the_smallest_lattice_scale_that_keeps_up():
    measure, calls = machine(threshold=0.055)
    decision = pl.search(0.05, 600.0, 0.9, (32, 100), measure)
    assert isinstance(decision, Plan) and decision.profile_concurrency == 32
    assert decision.time_scale == pl.lattice(0.05, 1) >= 0.055 > pl.lattice(0.05, 0)
    assert "keep up" in decision.reason and "first fifth of 10:00" in decision.reason
    # half a step lower is tried too
    measure, _ = machine(threshold=0.053)
    assert pl.search(0.05, 600.0, 0.9, (32, 100), measure).time_scale == pl.lattice(0.05, 0.5) == 0.05453
    # from a guess above the threshold it walks down to the same scale
    measure, _ = machine(threshold=0.055)
    assert pl.search(0.2, 600.0, 0.9, (32, 100), measure).time_scale == pytest.approx(
        min(t for t in (pl.lattice(0.2, k / 2) for k in range(-24, 1)) if t >= 0.055)
    )


def test_a_long_profiling_pass_gives_way_to_profiling_every_client_at_once():
    measure, _ = machine(threshold=0.055)
    # at 0.05946 every tier merges by 38.6 s with the experiment's pass, 28.5 s with every client at once
    decision = pl.search(0.05, 150.0, 0.9, (32, 100), measure)
    assert isinstance(decision, Plan) and decision.profile_concurrency == 100
    assert "profiled at once" in decision.reason


def test_a_budget_too_short_is_refused_with_the_shortest_that_plans():
    measure, _ = machine(threshold=0.055)
    decision, trials = pl.plan(0.05, 120.0, 0.9, (32, 100), measure)
    assert isinstance(decision, Refusal) and decision.minimum_minutes == 3  # 28.5 s / 0.2 = 143 s
    assert "first fifth of 2:00" in decision.reason
    assert isinstance(pl.search(0.05, decision.minimum_minutes * 60.0, 0.9, (32, 100), measure), Plan)
    assert isinstance(pl.search(0.05, (decision.minimum_minutes - 1) * 60.0, 0.9, (32, 100), measure), Refusal)
    assert len(trials) == len({(t.time_scale, t.profile_concurrency) for t in trials})  # each measured once


def test_workers_that_never_keep_up_are_refused_without_a_budget():
    measure, calls = machine(threshold=math.inf)
    decision, _ = pl.plan(0.05, 3600.0, 0.9, (32, 100), measure)
    assert isinstance(decision, Refusal) and decision.minimum_minutes is None
    assert "cannot keep up" in decision.reason
    assert max(t for t, _ in calls) == pl.lattice(0.05, pl.MAX_STEPS)


def test_impossible_inputs_are_named():
    measure, _ = machine(threshold=0.055)
    with pytest.raises(ValueError, match="budget > 0"):
        pl.search(0.05, 0.0, 0.9, (32,), measure)
    with pytest.raises(ValueError, match="time scale guess"):
        pl.search(0.0, 60.0, 0.9, (32,), measure)


def test_clock():
    assert pl.clock(0) == "0:00" and pl.clock(125.4) == "2:05" and pl.clock(3600) == "1:00:00"


# --- the rule on the demand model (virtual time, numpy stand-in trainer: a second or two per trial) --------------

# Seconds per training step as the probe measures them, both workers busy. A machine of this kind with AVX-512
# (`bench/bench_trainer.py`: 0.074 s a client-epoch alone, without the proximal term) measures ~0.0037; one with
# AVX2 only (0.564 s) ~7.6 times that. FAST is a machine 2.5 times faster than the first.
FAST = 0.0015
COSTS = (FAST, 0.0037, 0.0074, 10 * FAST, 7.6 * 0.0037, 10 * 0.0037)
BUDGETS = (2, 5, 10, 20, 60)
SIZES = [480] * 100  # FMNIST #2's shards: 480 training samples per client
EVALUATION = 250  # an evaluation of every client's test split costs about this many training steps


@pytest.fixture(scope="module")
def trials():
    """Trials of the demand model, each measured once for the whole module."""
    from fedat_sim.demand import trial_at

    cache: dict[tuple[float, float, int], Trial] = {}

    def measured(cost: float):
        def measure(time_scale: float, concurrency: int) -> Trial:
            key = (cost, time_scale, concurrency)
            if key not in cache:
                cache[key] = trial_at(FMNIST2, SIZES, cost, cost * EVALUATION, time_scale, concurrency)
            return cache[key]

        return measure

    return measured


@pytest.mark.slow
@pytest.mark.parametrize("cost", COSTS, ids=lambda c: f"{c * 1e3:g}ms")
def test_every_budget_either_plans_every_tier_early_or_names_a_budget_that_does(trials, cost):
    from fedat_sim.demand import first_guess, profile_concurrencies

    guess = first_guess(FMNIST2, SIZES, cost, FMNIST2.calibrate)
    concurrencies = profile_concurrencies(FMNIST2, len(SIZES))
    measure = trials(cost)
    outcomes = {}
    for minutes in BUDGETS:
        budget = minutes * 60.0
        decision, _ = pl.plan(guess, budget, FMNIST2.calibrate, concurrencies, measure)
        outcomes[minutes] = decision
        if isinstance(decision, Plan):
            there = measure(decision.time_scale, decision.profile_concurrency)
            assert pl.fits(there, budget) and pl.keeps_up(there, budget, FMNIST2.calibrate)
            assert all(t is not None and t <= budget / 5 for t in there.first_merge)
            assert there.late_fraction(min(budget, there.horizon)) <= pl.PLANNED_LATE
        else:
            assert decision.minimum_minutes is not None and decision.minimum_minutes > minutes, decision
            assert "first fifth" in decision.reason
            later, _ = pl.plan(guess, decision.minimum_minutes * 60.0, FMNIST2.calibrate, concurrencies, measure)
            assert isinstance(later, Plan), (minutes, decision, later)
            if decision.minimum_minutes - 1 > minutes:  # and it is the shortest (in whole minutes)
                sooner = pl.search(guess, (decision.minimum_minutes - 1) * 60.0, 0.9, concurrencies, measure)
                assert isinstance(sooner, Refusal), (minutes, decision, sooner)
    # once a budget plans every longer one does, and an hour is enough on every machine of this kind
    planned = [m for m in BUDGETS if isinstance(outcomes[m], Plan)]
    assert planned == list(BUDGETS[len(BUDGETS) - len(planned) :]) and 60 in planned


def test_the_fastest_machine_plans_two_minutes_and_the_slowest_refuses_them(trials):
    from fedat_sim.demand import first_guess, profile_concurrencies

    concurrencies = profile_concurrencies(FMNIST2, len(SIZES))
    fast, _ = pl.plan(first_guess(FMNIST2, SIZES, FAST, 0.9), 120.0, 0.9, concurrencies, trials(FAST))
    slow, _ = pl.plan(first_guess(FMNIST2, SIZES, 10 * FAST, 0.9), 120.0, 0.9, concurrencies, trials(10 * FAST))
    assert isinstance(fast, Plan) and isinstance(slow, Refusal)
    assert slow.minimum_minutes > 2


@pytest.mark.parametrize("cost", (FAST, 0.0037), ids=("1.5ms", "3.7ms"))
def test_a_plan_holds_over_the_whole_of_a_short_budget(trials, cost):
    """The trials stop once every tier has merged five rounds; a run goes on to its budget: so does this check."""
    from fedat_sim.demand import first_guess, measure, profile_concurrencies

    budget = 300.0
    decision, _ = pl.plan(
        first_guess(FMNIST2, SIZES, cost, 0.9), budget, 0.9, profile_concurrencies(FMNIST2, len(SIZES)), trials(cost)
    )
    assert isinstance(decision, Plan)
    settings = {
        **FMNIST2.settings,
        "time_scale": decision.time_scale,
        "profile_concurrency": decision.profile_concurrency,
    }
    run = measure(Experiment("check", 2, budget / 60, settings), SIZES, cost, evaluation_seconds=cost * EVALUATION)
    assert all(t is not None and t <= budget / 5 for t in run.first_merge), run.first_merge
    assert len(run.late_times) <= pl.LATE_LIMIT * len(run.update_times)
    assert run.horizon_seconds == budget and min(run.rounds) >= 5


# --- a run that falls behind all the same ---------------------------------------------------------------------------


def test_a_run_falling_behind_grows_its_time_scale_by_what_its_workers_lost():
    assert pl.slower_time_scale(0.1, 2, 100, 0.9, 0.3) is None  # 2 % late: it keeps up
    assert pl.slower_time_scale(0.1, 20, 29, 0.9, 0.3) is None  # too few updates to say
    assert pl.slower_time_scale(0.1, 20, 100, 0.9, 0.3) == pytest.approx(0.3)  # a third of the CPU it had
    assert pl.slower_time_scale(0.1, 20, 100, 0.9, 0.85) == pytest.approx(0.1 * pl.STEP**2, rel=1e-3)  # at least
    assert pl.slower_time_scale(0.1, 20, 100, 0.9, 0.1) == pytest.approx(0.1 * pl.MAX_CHANGE)  # at most
    assert pl.slower_time_scale(0.1, 20, 100, None, None) == pytest.approx(0.1 * pl.STEP**2, rel=1e-3)
