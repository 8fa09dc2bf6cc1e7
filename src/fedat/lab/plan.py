"""The plan of a `fedat run` on this machine: the time scale at which its worker processes keep up with the latency
model while every tier still merges a round early in the budget, or why no time scale does.

A smaller time scale means more rounds in the budget but more work per second; below some scale the workers fall
behind and updates come later than the model says (`late`). Every modelled latency scales with the time scale, so
how soon every tier has merged a first round (profiling, then the slowest tier's round) grows with it. The plan is
the smallest scale at which the workers keep up; it is a plan only if every tier merges a round within the first
fifth of the budget there. Otherwise the profiling pass is tried with every client at once (a shorter pass), and if
that does not fit either, the run is refused with the shortest budget that would fit. A run whose workers fall
behind all the same (other work on the machine took their cores after the probe) moves to a larger time scale
(`slower_time_scale`).

Whether the workers keep up, and when each tier first merges, come from trials of the demand model
(`fedat_sim.demand`: the services in virtual time, their training queued on the worker processes at the measured
cost). Time scales are tried on a lattice of steps of 2^(1/4) around the closed-form guess (`fedat.lab.calibrate`),
then half a step below the one found, so a search is a few trials. Pure: `search` calls the `measure` it is given
and nothing else.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

LATE_LIMIT = 0.10  # what a run promises: at most this share of its updates late
PLANNED_LATE = 0.03  # what a plan allows the model: a third of the promise (the other services take CPU too, and
# the machine's other work varies)
EARLY_SHARE = 0.2  # every tier merges a round within this share of the budget
STEP = 2**0.25  # neighbouring time scales tried differ by ~19 %
MAX_STEPS = 20  # at most 2^5 = 32x either way from the first guess
MIN_UPDATES = 20  # fewer modelled updates than this say nothing about keeping up
RUN_MIN_UPDATES = 30  # nor do fewer real ones (a run's first minutes)
MAX_CHANGE = 4.0  # a run falling behind multiplies its time scale by at most this at once


@dataclass(frozen=True)
class Trial:
    """What the demand model saw at one time scale; times are seconds from the start of the profiling pass."""

    time_scale: float
    profile_concurrency: int
    horizon: float  # how long the model ran
    first_merge: tuple[float | None, ...]  # per tier: when a global version first held one of its rounds
    update_times: tuple[float, ...]  # when each round answer arrived
    late_times: tuple[float, ...]  # when each late one arrived
    busy_seconds: float  # worker seconds of training and evaluation
    workers: int

    def every_tier_at(self) -> float | None:
        """When every tier had merged a round, or None if some never did within the horizon."""
        return None if any(t is None for t in self.first_merge) else max(self.first_merge)  # type: ignore[type-var]

    def late_fraction(self, within: float) -> float:
        """Share of the round answers that arrived by `within` seconds and were late."""
        n = sum(t <= within for t in self.update_times)
        return sum(t <= within for t in self.late_times) / n if n else 0.0

    def busy(self) -> float:
        """Share of the worker processes' time taken by training and evaluation."""
        return self.busy_seconds / (self.workers * self.horizon) if self.horizon > 0 else 0.0


@dataclass(frozen=True)
class Plan:
    """The chosen time scale and profiling, and what the model expects of the run."""

    time_scale: float
    profile_concurrency: int
    every_tier_at: float  # seconds from the start
    late_fraction: float  # modelled, over the budget (or as far as the model ran)
    busy: float  # modelled share of the workers' time
    reason: str


@dataclass(frozen=True)
class Refusal:
    """No time scale fits this budget here: why, and the shortest budget that would fit (minutes; None: none)."""

    minimum_minutes: int | None
    reason: str


def keeps_up(trial: Trial, budget_seconds: float, target: float) -> bool:
    """Few enough late answers over the budget and the workers' busy share within `target`."""
    window = min(budget_seconds, trial.horizon)
    answered = sum(t <= window for t in trial.update_times)
    if answered < MIN_UPDATES and trial.every_tier_at() is None:
        return False  # nothing came back: no sign that the workers keep up
    return trial.late_fraction(window) <= PLANNED_LATE and trial.busy() <= target


def fits(trial: Trial, budget_seconds: float) -> bool:
    """Every tier merged a round within the early share of the budget."""
    at = trial.every_tier_at()
    return at is not None and at <= EARLY_SHARE * budget_seconds


def minimum_minutes(trial: Trial) -> int | None:
    """The shortest whole-minute budget whose early share holds the trial's first round of every tier."""
    at = trial.every_tier_at()
    return None if at is None else max(1, math.ceil(at / EARLY_SHARE / 60.0 - 1e-9))


def lattice(guess: float, k: float) -> float:
    """The k-th time scale from the guess (rounded, so that plans are stable and easy to read)."""
    return float(f"{guess * STEP**k:.4g}")


def smallest_keeping_up(
    guess: float, budget_seconds: float, target: float, measure: Callable[[float], Trial]
) -> tuple[Trial | None, Trial]:
    """(the trial at the smallest time scale of the lattice, refined by a half step, at which the workers keep up, or
    None; the last trial)."""
    k = 0
    best = measure(lattice(guess, k))
    if keeps_up(best, budget_seconds, target):
        while k > -MAX_STEPS:
            lower = measure(lattice(guess, k - 1))
            if not keeps_up(lower, budget_seconds, target):
                break
            best, k = lower, k - 1
        else:
            return best, best
    else:
        while k < MAX_STEPS:
            k += 1
            best = measure(lattice(guess, k))
            if keeps_up(best, budget_seconds, target):
                break
        else:
            return None, best
    # The late share jumps within a step near the threshold: half a step lower may still keep up.
    half = measure(lattice(guess, k - 0.5))
    return (half, half) if keeps_up(half, budget_seconds, target) else (best, half)


def search(
    guess: float,
    budget_seconds: float,
    target: float,
    concurrencies: Sequence[int],
    measure: Callable[[float, int], Trial],
) -> Plan | Refusal:
    """The plan for this budget, trying the profiling concurrencies in order (the experiment's, then all at once)."""
    if not guess > 0 or not budget_seconds > 0:
        raise ValueError(f"need a time scale guess and a budget > 0, got {guess} and {budget_seconds}")
    shortest: tuple[int, Trial] | None = None
    last: Trial | None = None
    for concurrency in dict.fromkeys(concurrencies):
        best, last = smallest_keeping_up(guess, budget_seconds, target, lambda ts, c=concurrency: measure(ts, c))
        if best is None:
            continue
        if fits(best, budget_seconds):
            return _plan(best, budget_seconds, concurrency != concurrencies[0])
        minutes = minimum_minutes(best)
        if minutes is not None and (shortest is None or minutes < shortest[0]):
            shortest = (minutes, best)
    if shortest is None:
        assert last is not None
        return Refusal(
            None,
            f"the workers cannot keep up with this latency model at any time scale up to {last.time_scale:g} "
            f"({last.late_fraction(min(budget_seconds, last.horizon)):.0%} of updates late there)",
        )
    minutes, best = shortest
    return Refusal(
        minutes,
        f"the workers keep up only from time scale {best.time_scale:g}, where every tier has merged a first round "
        f"by {clock(best.every_tier_at() or 0.0)}: later than the first fifth of {clock(budget_seconds)}",
    )


def plan(
    guess: float,
    budget_seconds: float,
    target: float,
    concurrencies: Sequence[int],
    measure: Callable[[float, int], Trial],
    confirmations: int = 4,
) -> tuple[Plan | Refusal, list[Trial]]:
    """`search`, each trial measured once; a refusal's shortest budget is searched again until it plans (or as far
    as `confirmations` go); with every trial measured, in order."""
    trials: dict[tuple[float, int], Trial] = {}

    def once(ts: float, concurrency: int) -> Trial:
        if (ts, concurrency) not in trials:
            trials[(ts, concurrency)] = measure(ts, concurrency)
        return trials[(ts, concurrency)]

    decision = search(guess, budget_seconds, target, concurrencies, once)
    if isinstance(decision, Refusal) and decision.minimum_minutes is not None:
        # Over a longer budget the start weighs less in the late share, so the workers may keep up at a smaller
        # scale, where every tier merges sooner: the minimum is searched again until a budget plans, then as short
        # as one still does.
        minutes = decision.minimum_minutes

        def plans(m: int) -> bool:
            return isinstance(search(guess, m * 60.0, target, concurrencies, once), Plan)

        for _ in range(confirmations):
            there = search(guess, minutes * 60.0, target, concurrencies, once)
            if isinstance(there, Plan):
                while minutes - 1 > budget_seconds / 60.0 and plans(minutes - 1):
                    minutes -= 1
                break
            if there.minimum_minutes is None or there.minimum_minutes <= minutes:
                minutes += 1
            else:
                minutes = there.minimum_minutes
        decision = Refusal(minutes, decision.reason)
    return decision, list(trials.values())


def _plan(trial: Trial, budget_seconds: float, shorter_profiling: bool) -> Plan:
    at = trial.every_tier_at()
    assert at is not None
    late = trial.late_fraction(min(budget_seconds, trial.horizon))
    why = (
        f"the smallest time scale at which the workers keep up ({late:.0%} of updates late, "
        f"{trial.busy():.0%} busy in the model); every tier merges a first round by {clock(at)}, "
        f"within the first fifth of {clock(budget_seconds)}"
    )
    if shorter_profiling:
        why += f"; every client profiled at once ({trial.profile_concurrency}), as the experiment's pass took too long"
    return Plan(trial.time_scale, trial.profile_concurrency, at, late, trial.busy(), why)


def slower_time_scale(
    time_scale: float, late: int, updates: int, probe_share: float | None, run_share: float | None
) -> float | None:
    """The larger time scale for a run whose workers fell behind since its last change (None: they keep up, or too
    few updates to say). The shares are the CPU a training got per second of it, at the probe and in the run: other
    work on the machine lowers the second, and the scale grows by as much (two lattice steps at least, 4x at most)."""
    if updates < RUN_MIN_UPDATES or late <= LATE_LIMIT * updates:
        return None
    factor = STEP**2
    if probe_share and run_share:
        factor = max(factor, probe_share / run_share)
    return float(f"{time_scale * min(factor, MAX_CHANGE):.4g}")


def clock(seconds: float) -> str:
    """m:ss (h:mm:ss from an hour)."""
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
