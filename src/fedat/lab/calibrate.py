"""Calibrating the latency model to the machine: the time scale at which the workers are busy a target share of time.

With FedAT every tier loops on its own: a round sends its k clients their tasks at once and closes when the slowest
answers, so tier m releases k_m trainings every T_m seconds, T_m = E[max of k_m modelled latencies]. Each training
costs the worker processes its real seconds (this machine's seconds per step, measured at start, × steps). So the
demand is Σ_m k_m · c̄_m / T_m busy seconds per second, and the workers' modelled utilisation is that over their
capacity, min(worker processes, cores).

Every modelled latency is (training × device factor + delay) × time scale: scaling the time scale by α scales every
T_m by α, so the tiers keep their speed ratios (and compute keeps its ratio to the delays, i.e. the regime), while
the demand scales by 1/α. The calibrated time scale is the reference one × modelled utilisation / target.
This closed form ignores queueing (a tier's k tasks arrive at once and wait for the workers), drop-outs (a round
missing one waits for its deadline) and the profiling pass: `fedat run` takes it as the first guess of its plan
(`fedat.lab.plan`), which the demand model (`fedat_sim.demand`) then checks. Pure functions: the probe that
measures the step cost lives with the trainer (`fedat_worker.probe`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedat.fl.latency import ClientProfile, training_seconds
from fedat.fl.tiering import Tiers, assign_tiers

# Strategies whose tiers each run one round at a time, back to back (the demand model above).
TIER_LOOPS = frozenset({"fedat", "fedat-uniform", "fedat-delta"})
DRAWS = 4096  # Monte Carlo draws of a round per tier: E[max] to well under 1 %


@dataclass(frozen=True)
class Calibration:
    """The chosen time scale and what the model expects of it (seconds are wall seconds of this machine)."""

    target: float  # modelled worker utilisation aimed at
    capacity: float  # cores the workers can use: min(worker processes, cores)
    measured_step_seconds: float  # wall seconds per mini-batch step with every worker busy (the probe)
    reference_time_scale: float  # the experiment's
    time_scale: float  # the calibrated one
    reference_utilisation: float  # modelled utilisation at the experiment's own time scale
    round_seconds: tuple[float, ...]  # modelled mean round duration per tier, at the calibrated scale
    trainings_per_second: float  # modelled, at the calibrated scale

    @property
    def factor(self) -> float:
        """Calibrated over reference time scale: every modelled latency is multiplied by it."""
        return self.time_scale / self.reference_time_scale


def expected_tiers(latencies: Sequence[float], num_tiers: int, tier_sizes: Sequence[float] = ()) -> Tiers:
    """Tiers by expected round latency, as re-tiering converges to (the profiling pass draws one noisy sample)."""
    return assign_tiers(dict(enumerate(latencies)), num_tiers, tier_sizes)


def client_latency_bounds(
    profiles: Sequence[ClientProfile], train_seconds: Sequence[float], time_scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """Each client's lowest and highest modelled round latency (its delay group's range drawn uniformly between)."""
    train = np.asarray(train_seconds, dtype=np.float64)
    factor = np.array([p.device_factor for p in profiles])
    lo = np.array([p.delay[0] for p in profiles])
    hi = np.array([p.delay[1] for p in profiles])
    return (train * factor + lo) * time_scale, (train * factor + hi) * time_scale


def tier_round_seconds(
    low: np.ndarray, high: np.ndarray, tiers: Tiers, clients_per_round: int, draws: int = DRAWS, seed: int = 0
) -> tuple[float, ...]:
    """Mean duration of each tier's round: E[max latency] over k random clients of the tier, each with a fresh draw."""
    rng = np.random.default_rng([seed, 0xCA1])
    out = []
    for members in tiers:
        idx = np.asarray(members, dtype=np.int64)
        k = min(clients_per_round, len(idx))
        chosen = idx[np.argsort(rng.random((draws, len(idx))), axis=1)[:, :k]]  # k distinct clients per draw
        u = rng.random(chosen.shape)
        out.append(float(np.max(low[chosen] + u * (high[chosen] - low[chosen]), axis=1).mean()))
    return tuple(out)


def worker_demand(
    round_seconds: Sequence[float], tiers: Tiers, clients_per_round: int, cost_seconds: Sequence[float]
) -> tuple[float, float]:
    """(trainings per second, busy worker-seconds per second) the tier loops release; cost: real s per training."""
    cost = np.asarray(cost_seconds, dtype=np.float64)
    rate = busy = 0.0
    for members, t in zip(tiers, round_seconds, strict=True):
        k = min(clients_per_round, len(members))
        rate += k / t
        busy += k * float(cost[list(members)].mean()) / t  # clients are chosen uniformly within the tier
    return rate, busy


def calibrate(
    profiles: Sequence[ClientProfile],
    steps: Sequence[int],
    measured_step_seconds: float,
    *,
    step_seconds: float,
    time_scale: float,
    capacity: float,
    num_tiers: int,
    clients_per_round: int,
    target: float,
    tier_sizes: Sequence[float] = (),
) -> Calibration:
    """The time scale at which the tier loops keep the workers' `capacity` (cores) `target` busy; steps: per client."""
    if not measured_step_seconds > 0:
        raise ValueError(f"measured seconds per step must be > 0, got {measured_step_seconds}")
    if not 0 < target <= 2:
        raise ValueError(f"target utilisation must be in (0, 2], got {target}")
    if not time_scale > 0:
        raise ValueError(f"the experiment's time_scale must be > 0 to be rescaled, got {time_scale}")
    if not capacity > 0 or clients_per_round < 1:
        raise ValueError(f"need capacity > 0 and clients_per_round >= 1, got {capacity} and {clients_per_round}")
    if len(steps) != len(profiles):
        raise ValueError(f"{len(steps)} step counts for {len(profiles)} clients")
    # The latency model's training seconds: nominal steps × step_seconds, or (step_seconds 0) this machine's own.
    train = [training_seconds(s * measured_step_seconds, s, step_seconds) for s in steps]
    cost = [s * measured_step_seconds for s in steps]
    low, high = client_latency_bounds(profiles, train, time_scale)
    tiers = expected_tiers((low + high) / 2, num_tiers, tier_sizes)
    rounds = tier_round_seconds(low, high, tiers, clients_per_round)
    rate, busy = worker_demand(rounds, tiers, clients_per_round, cost)
    reference = busy / capacity
    factor = reference / target  # demand ∝ 1 / time scale
    return Calibration(
        target=target,
        capacity=capacity,
        measured_step_seconds=measured_step_seconds,
        reference_time_scale=time_scale,
        time_scale=time_scale * factor,
        reference_utilisation=reference,
        round_seconds=tuple(t * factor for t in rounds),
        trainings_per_second=rate / factor,
    )


def worker_capacity(workers: int, cores: int) -> float:
    """Cores the worker processes can keep busy: one each (one TensorFlow thread), at most the machine's."""
    return float(max(1, min(workers, cores)))
