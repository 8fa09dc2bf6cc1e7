"""The straggler profile and latency model of simulated clients; pure functions of seed and inputs.

A client's response time is (its training time × its device-speed factor + its delay group's delay) × time
scale, counted from the moment its task was dispatched. The paper's five groups add 0, 0–5, 6–10, 11–15 and
20–30 s per round; a few "unstable" clients drop out permanently at random times. Training time is either the
measured seconds or, with `step_seconds` set, a nominal cost per mini-batch step: then a client's latency does
not depend on how loaded the shared machine was, and runs of different methods see the same clients.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PAPER_DELAYS: tuple[tuple[float, float], ...] = ((0.0, 0.0), (0.0, 5.0), (6.0, 10.0), (11.0, 15.0), (20.0, 30.0))


@dataclass(frozen=True)
class StragglerProfile:
    """Experiment-wide latency settings."""

    time_scale: float = 0.1
    delays: tuple[tuple[float, float], ...] = PAPER_DELAYS
    device_factor: tuple[float, float] = (1.0, 1.0)
    unstable_clients: int = 0
    drop_window: tuple[float, float] = (60.0, 600.0)
    step_seconds: float = 0.0  # nominal seconds per mini-batch step; 0 = use the measured training time
    group_sizes: tuple[int, ...] = ()  # clients per delay group (must sum to num_clients); () = an even split


@dataclass(frozen=True)
class ClientProfile:
    """One simulated client's speed: delay group, device factor, and when (if ever) it drops out."""

    client: int
    group: int
    delay: tuple[float, float]
    device_factor: float
    drops_at: float | None


def client_profiles(num_clients: int, profile: StragglerProfile, seed: int) -> tuple[ClientProfile, ...]:
    """Spread clients randomly over the delay groups (evenly, or by group_sizes); draw factors and drop-outs."""
    rng = np.random.default_rng([seed, 0x57A6])
    sizes = profile.group_sizes
    if sizes and (len(sizes) != len(profile.delays) or sum(sizes) != num_clients):
        raise ValueError(
            f"group_sizes {list(sizes)} must give each of the {len(profile.delays)} delay groups "
            f"a size, summing to the {num_clients} clients"
        )
    order = rng.permutation(num_clients)
    groups = np.split(order, np.cumsum(sizes)[:-1]) if sizes else np.array_split(order, len(profile.delays))
    group_of = np.empty(num_clients, dtype=np.int64)
    for g, members in enumerate(groups):
        group_of[members] = g
    lo, hi = profile.device_factor
    factors = np.exp(rng.uniform(np.log(lo), np.log(hi), size=num_clients))
    unstable = set(rng.choice(num_clients, size=min(profile.unstable_clients, num_clients), replace=False).tolist())
    drops = rng.uniform(*profile.drop_window, size=num_clients)
    return tuple(
        ClientProfile(
            client=c,
            group=int(group_of[c]),
            delay=profile.delays[group_of[c]],
            device_factor=float(factors[c]),
            drops_at=float(drops[c]) if c in unstable else None,
        )
        for c in range(num_clients)
    )


def training_seconds(measured: float, steps: int, step_seconds: float) -> float:
    """The training time the latency model uses: nominal steps × step_seconds if set, else the measured time."""
    return steps * step_seconds if step_seconds > 0 else measured


def response_latency(train_seconds: float, client: ClientProfile, time_scale: float, u: float) -> float:
    """Modelled seconds from dispatch to answer; u in [0, 1) picks this round's delay within the group's range."""
    lo, hi = client.delay
    return (train_seconds * client.device_factor + lo + u * (hi - lo)) * time_scale


def round_draw(seed: int, task_id: str) -> float:
    """Deterministic u in [0, 1) for one task, so a redelivered task gets the same delay."""
    digest = np.frombuffer(task_id.encode(), dtype=np.uint8)
    return float(np.random.default_rng([seed, *digest.tolist()]).random())
