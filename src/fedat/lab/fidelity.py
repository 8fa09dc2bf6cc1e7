"""Real run against simulation: the same numbers read from two runs' `events.jsonl`, on a common time axis.

Pure functions of the event lines the recorder writes (`fedat.lab.recorder`): `global` lines carry `time`, `version`,
`tier_counts` and `tier_weights`; `evaluation` lines carry `time`, `version` and `accuracy`. Times are seconds since the
profiling pass began, in both `fedat run` and `fedat simulate`. `aligned` moves a run's clock so that 0 is its first
global model (version 1): then two runs whose profiling passes took different times are compared round for round.
The fidelity test (tests/integration/test_fidelity.py) asserts tolerances on what `compare` returns.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


def read_events(run_dir: str | Path) -> list[dict]:
    """The lines of a run folder's events.jsonl."""
    text = (Path(run_dir) / "events.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def global_models(events: Sequence[dict]) -> list[dict]:
    """The `global` lines in version order (a version recorded twice counts once)."""
    return sorted({e["version"]: e for e in events if e.get("event") == "global"}.values(), key=lambda e: e["version"])


def evaluations(events: Sequence[dict]) -> list[tuple[float, float]]:
    """(time, accuracy) of every evaluation, in time order, each at the time its version was made.

    An evaluator that falls behind scores a model after it was made (a real run on a loaded machine); the simulator
    scores it at once. Either way the accuracy is that model's, so it belongs where the model appeared. A version
    counts as made no later than any newer one: a real run's seed job can publish w0 after the first rounds have
    merged (a cold TensorFlow start on a busy machine), yet w0 is the model the run started from. An evaluation
    whose version has no `global` line keeps its own time.
    """
    made: dict[int, float] = {}
    newer = float("inf")
    for g in reversed(global_models(events)):
        newer = min(newer, g["time"])
        made[g["version"]] = newer
    scored = sorted(
        (made.get(e.get("version"), e["time"]), e.get("version", -1), e["accuracy"])
        for e in events
        if e.get("event") == "evaluation"
    )
    return [(t, a) for t, _, a in scored]


def first_round_time(events: Sequence[dict]) -> float | None:
    """When the first global model after the seed (version 1) was made: the end of the profiling pass plus a
    round; None if there was none."""
    return next((e["time"] for e in global_models(events) if e["version"] >= 1), None)


def aligned(events: Sequence[dict], zero: float) -> list[dict]:
    """The events with `zero` subtracted from every time."""
    return [{**e, "time": e["time"] - zero} if "time" in e else dict(e) for e in events]


def tier_rounds_at(events: Sequence[dict], t: float) -> list[int]:
    """Rounds merged per tier by time `t`: `tier_counts` of the newest version made at or before `t`."""
    made = [e for e in global_models(events) if e["time"] <= t]
    if not made:
        tiers = max((len(e["tier_counts"]) for e in global_models(events)), default=0)
        return [0] * tiers
    return list(made[-1]["tier_counts"])


def mean_tier_weights(events: Sequence[dict], start: float = float("-inf"), end: float = float("inf")) -> list[float]:
    """Each tier's cross-tier weight averaged over the global versions (after the seed) made in [start, end]."""
    lines = [e for e in global_models(events) if e["version"] >= 1 and start <= e["time"] <= end]
    if not lines:
        return []
    n = len(lines[0]["tier_weights"])
    return [sum(e["tier_weights"][m] for e in lines) / len(lines) for m in range(n)]


def accuracy_at(curve: Sequence[tuple[float, float]], t: float) -> float | None:
    """The accuracy curve at `t`: linear between evaluations, the last value after the last one, None before the
    first."""
    if not curve or t < curve[0][0]:
        return None
    for (t0, a0), (t1, a1) in zip(curve, curve[1:], strict=False):
        if t0 <= t <= t1:
            return a0 if t1 == t0 else a0 + (a1 - a0) * (t - t0) / (t1 - t0)
    return curve[-1][1]


def best_accuracy(curve: Sequence[tuple[float, float]], end: float = float("inf")) -> float | None:
    """The best accuracy evaluated at or before `end`."""
    scores = [a for t, a in curve if t <= end]
    return max(scores) if scores else None


@dataclass(frozen=True)
class Comparison:
    """Two runs side by side (real first, simulated second) on the aligned axis (0 = each run's first global model).

    `horizon` is the aligned time both runs cover; `rounds` are rounds per tier at the horizon; `weights` the mean
    cross-tier weights over [0, horizon]; `accuracy` the accuracy curves at `times`; `best` the best accuracy up to
    the horizon; `offset` how much later the simulation's first global model came than the real one's.
    """

    horizon: float
    offset: float
    rounds: tuple[list[int], list[int]]
    weights: tuple[list[float], list[float]]
    times: tuple[float, ...]
    accuracy: tuple[list[float | None], list[float | None]]
    best: tuple[float | None, float | None]

    def round_differences(self) -> list[int]:
        """Simulated minus real rounds, per tier."""
        return [s - r for r, s in zip(*self.rounds, strict=True)]

    def weight_differences(self) -> list[float]:
        """Simulated minus real mean weight, per tier."""
        return [s - r for r, s in zip(*self.weights, strict=True)]

    def accuracy_differences(self) -> list[float | None]:
        """Simulated minus real accuracy at each of `times` (None where a curve has no value yet)."""
        return [None if r is None or s is None else s - r for r, s in zip(*self.accuracy, strict=True)]


def compare(real: Sequence[dict], sim: Sequence[dict], duration: float, points: int = 4) -> Comparison:
    """Compare two runs of `duration` seconds (since profiling began) on the aligned axis, sampling the accuracy
    curves at `points` evenly spaced times in (0, horizon]. ValueError if a run made no global model."""
    zero_real, zero_sim = first_round_time(real), first_round_time(sim)
    if zero_real is None or zero_sim is None:
        raise ValueError(f"a run made no global model (first at: real {zero_real}, simulated {zero_sim})")
    horizon = duration - max(zero_real, zero_sim)
    if horizon <= 0:
        raise ValueError(f"no common time: the first global models came at {zero_real} and {zero_sim} of {duration}")
    a, b = aligned(real, zero_real), aligned(sim, zero_sim)
    times = tuple(horizon * (i + 1) / points for i in range(points))
    curves = evaluations(a), evaluations(b)
    return Comparison(
        horizon=horizon,
        offset=zero_sim - zero_real,
        rounds=(tier_rounds_at(a, horizon), tier_rounds_at(b, horizon)),
        weights=(mean_tier_weights(a, 0.0, horizon), mean_tier_weights(b, 0.0, horizon)),
        times=times,
        accuracy=tuple([accuracy_at(c, t) for t in times] for c in curves),
        best=(best_accuracy(curves[0], horizon), best_accuracy(curves[1], horizon)),
    )
