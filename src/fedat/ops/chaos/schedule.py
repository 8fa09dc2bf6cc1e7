"""A seeded schedule of disruptions: SIGKILLs of every kind of service and broker restarts, spread over a run."""

from __future__ import annotations

import random
from dataclasses import dataclass

CATEGORIES = ("barrier", "aggregator", "profiler", "evaluator", "worker")
EXTRA = ("barrier", "aggregator", "profiler", "worker")  # kills beyond one each: the evaluator keeps no state
MAX_PAUSE = 3.0  # seconds between a kill and the restart, drawn uniformly in [0, MAX_PAUSE]
PROFILING_KILL = (1.5, 3.5)  # the profiler's first kill, seconds after it started: during the profiling pass
FIRST_EVENT, LAST_MARGIN = 10.0, 8.0  # the other events fall in [FIRST_EVENT, run length - LAST_MARGIN]


@dataclass(frozen=True)
class Event:
    """One disruption: `at` seconds after the profiler started."""

    at: float
    action: str  # "kill" or "broker-restart"
    target: str  # a service name ("barrier", "worker-1", ...) or "broker"
    pause: float = 0.0  # kill only: seconds until the restart


def make_schedule(seed: int, seconds: float, kills: int, restarts: int, workers: int) -> list[Event]:
    """A seeded schedule: `kills` SIGKILLs covering every kind of service (when kills >= 5; one profiler kill during
    profiling), and `restarts` broker restarts, spread over the run in equal slots at random moments within them."""
    rng = random.Random(seed)
    if kills >= len(CATEGORIES):
        kinds = list(CATEGORIES) + [rng.choice(EXTRA) for _ in range(kills - len(CATEGORIES))]
    else:
        kinds = rng.sample(CATEGORIES, kills)
    events: list[Event] = []
    if "profiler" in kinds:
        kinds.remove("profiler")
        at = round(rng.uniform(*PROFILING_KILL), 2)
        events.append(Event(at, "kill", "profiler", round(rng.uniform(0, MAX_PAUSE), 2)))
    rest = kinds + ["broker"] * restarts
    rng.shuffle(rest)
    lo = FIRST_EVENT
    hi = max(lo + 1.0, seconds - LAST_MARGIN)
    width = (hi - lo) / max(1, len(rest))
    for i, kind in enumerate(rest):
        at = round(lo + width * (i + rng.uniform(0.1, 0.9)), 2)
        if kind == "broker":
            events.append(Event(at, "broker-restart", "broker"))
        else:
            target = f"worker-{rng.randrange(workers)}" if kind == "worker" else kind
            events.append(Event(at, "kill", target, round(rng.uniform(0, MAX_PAUSE), 2)))
    return sorted(events, key=lambda e: e.at)
