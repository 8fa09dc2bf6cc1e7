"""Algorithms behind one narrow interface: one verb per phase, registered by name in a plain dict."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from fedat.aggregate import Weights, fedat_tier_weights, sample_weighted_average, uniform_tier_weights, weighted_average


@dataclass(frozen=True)
class CrossTier:
    """What the aggregator knows when a tier model arrives (already stored and counted)."""

    global_model: Weights | None
    tier_models: tuple[Weights | None, ...]
    counts: tuple[int, ...]
    arrived: int  # index of the tier that just reported (0 = fastest)
    staleness: int  # global versions published since the arrival's base version


class Strategy(Protocol):
    """Select clients for a round, merge a tier's round, merge the tiers into the global model."""

    name: str

    def select_clients(self, candidates: Sequence[int], k: int, rng: np.random.Generator) -> list[int]:
        """Pick the clients of one tier round."""
        ...

    def merge_tier(self, models: Sequence[Weights], n_samples: Sequence[int]) -> Weights:
        """Synchronous merge of one round's client models."""
        ...

    def merge_global(self, view: CrossTier) -> tuple[Weights, np.ndarray]:
        """The new global model and the weight each tier's model got in it."""
        ...


def _random_subset(candidates: Sequence[int], k: int, rng: np.random.Generator) -> list[int]:
    k = min(k, len(candidates))
    return sorted(int(c) for c in rng.choice(np.asarray(candidates, dtype=np.int64), size=k, replace=False))


@dataclass(frozen=True)
class TierWeighted:
    """FedAT: random clients per tier, sample-weighted tier merge, cross-tier weights from update counts."""

    name: str
    weigh: Callable[[Sequence[int]], np.ndarray]

    def select_clients(self, candidates: Sequence[int], k: int, rng: np.random.Generator) -> list[int]:
        """Uniformly random k of the tier's clients."""
        return _random_subset(candidates, k, rng)

    def merge_tier(self, models: Sequence[Weights], n_samples: Sequence[int]) -> Weights:
        """Sample-weighted average."""
        return sample_weighted_average(models, n_samples)

    def merge_global(self, view: CrossTier) -> tuple[Weights, np.ndarray]:
        """Weighted average of the reported tiers' models."""
        w = self.weigh(view.counts) * np.array([m is not None for m in view.tier_models])
        if w.sum() <= 0:
            raise ValueError("merge_global: no tier has reported")
        w = w / w.sum()
        present = np.flatnonzero(w > 0)
        return weighted_average([view.tier_models[i] for i in present], w[present]), w


STRATEGIES: dict[str, Strategy] = {
    "fedat": TierWeighted("fedat", fedat_tier_weights),
    "fedat-uniform": TierWeighted("fedat-uniform", uniform_tier_weights),
}
