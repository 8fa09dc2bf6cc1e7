"""Pure tiering math: tiers from latencies, drift detection, TiFL's adaptive tier probabilities."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

Tiers = tuple[tuple[int, ...], ...]


def assign_tiers(latencies: Mapping[int, float], num_tiers: int, shares: Sequence[float] = ()) -> Tiers:
    """Sort clients by latency (ties by id), cut into tiers fastest first: near-equal, or in proportion to shares."""
    if num_tiers < 1:
        raise ValueError(f"num_tiers must be >= 1, got {num_tiers}")
    if len(latencies) < num_tiers:
        raise ValueError(f"cannot split {len(latencies)} clients into {num_tiers} tiers")
    if shares and (len(shares) != num_tiers or min(shares) <= 0):
        raise ValueError(f"tier shares {list(shares)}: need {num_tiers} positive numbers, one per tier")
    ordered = np.array(sorted(latencies, key=lambda c: (latencies[c], c)), dtype=np.int64)
    if not shares:
        return tuple(tuple(int(c) for c in group) for group in np.array_split(ordered, num_tiers))
    n, cuts = len(ordered), []
    for i, ideal in enumerate(np.rint(np.cumsum(shares)[:-1] / sum(shares) * n).astype(int)):
        # Every tier keeps at least one client, however few are left after drop-outs.
        cuts.append(min(max(int(ideal), (cuts[-1] if cuts else 0) + 1), n - (num_tiers - 1 - i)))
    return tuple(tuple(int(c) for c in group) for group in np.split(ordered, cuts))


def tier_of(tiers: Tiers) -> dict[int, int]:
    """Map each client to its tier number (1 = fastest)."""
    return {c: m for m, group in enumerate(tiers, start=1) for c in group}


def moved_clients(old: Tiers, new: Tiers) -> set[int]:
    """Clients whose tier differs between two assignments (new or removed clients count as moved)."""
    a, b = tier_of(old), tier_of(new)
    return {c for c in a.keys() | b.keys() if a.get(c) != b.get(c)}


def ewma(previous: float | None, sample: float, alpha: float) -> float:
    """Exponentially weighted moving average; the first sample is taken as is."""
    return sample if previous is None else (1.0 - alpha) * previous + alpha * sample


def tifl_probabilities(accuracies: Sequence[float], credits: Sequence[int]) -> np.ndarray:
    """TiFL adaptive selection: rank tiers by accuracy, the least accurate gets the most weight; no credit, no chance.

    Tier with the i-th lowest accuracy (i = 0..M−1) gets weight M − i, tiers with zero credits get 0, then
    normalised. If every tier is out of credits the result is all zeros.
    """
    acc = np.asarray(accuracies, dtype=np.float64)
    cred = np.asarray(credits, dtype=np.int64)
    if acc.shape != cred.shape or acc.ndim != 1:
        raise ValueError(f"tifl_probabilities: {acc.shape} accuracies vs {cred.shape} credits")
    m = acc.size
    rank = np.empty(m, dtype=np.int64)
    rank[np.argsort(acc, kind="stable")] = np.arange(m)
    w = (m - rank).astype(np.float64) * (cred > 0)
    return w / w.sum() if w.sum() > 0 else w
