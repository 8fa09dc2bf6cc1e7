"""Which global versions to score: one rule for the central evaluator and for the federated one (the collector)."""

from __future__ import annotations

import math
from dataclasses import dataclass

ANCHORS = ("last", "grid")  # FEDAT_EVAL_ANCHOR: time slots counted from the last scored version, or a fixed grid


@dataclass(frozen=True)
class EvalSchedule:
    """Every `every` versions (0: never by count) or `interval` seconds (0: never by time); `grid`: by time on a
    fixed grid (the first version in each `interval`-long slot) instead of `interval` s after the last scored one."""

    every: int = 5
    interval: float = 0.0
    grid: bool = False


def due(
    version: int, now: float, last: tuple[int, float] | None, every: int, interval: float, grid: bool = False
) -> bool:
    """Whether to score `version`: the first one seen, or `every` versions or `interval` s after the last scored
    (with `grid`, the first version of each later slot [k·interval, (k+1)·interval))."""
    if last is None:
        return True
    last_version, last_time = last
    if version <= last_version:
        return False
    by_count = every > 0 and version >= last_version + every
    # Anchored on the last scored version, the clock restarts at an arrival; a tier whose rounds take a little
    # longer than `interval` then keeps being the one scored (phase-locking). A fixed grid does not restart.
    if grid:
        by_time = interval > 0 and math.floor(now / interval) > math.floor(last_time / interval)
    else:
        by_time = interval > 0 and now - last_time >= interval
    return by_count or by_time
