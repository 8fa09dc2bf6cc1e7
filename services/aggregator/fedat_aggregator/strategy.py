"""Algorithms behind one narrow interface: one verb per phase, registered by name in a plain dict."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from fedat.aggregate import Weights, fedat_tier_weights, sample_weighted_average, uniform_tier_weights, weighted_average


class Strategy(Protocol):
    """Select clients for a round, merge a tier's round, merge the tiers into the global model."""

    name: str

    def select_clients(self, candidates: Sequence[int], k: int, rng: np.random.Generator) -> list[int]:
        """Pick the clients of one tier round."""
        ...

    def merge_tier(self, models: Sequence[Weights], n_samples: Sequence[int]) -> Weights:
        """Synchronous merge of one round's client models."""
        ...

    def merge_global(self, tier_models: Sequence[Weights | None], counts: Sequence[int]) -> tuple[Weights, np.ndarray]:
        """Cross-tier merge of the latest tier models given each tier's update count; returns (model, weights)."""
        ...


def _random_subset(candidates: Sequence[int], k: int, rng: np.random.Generator) -> list[int]:
    k = min(k, len(candidates))
    return sorted(int(c) for c in rng.choice(np.asarray(candidates, dtype=np.int64), size=k, replace=False))


@dataclass(frozen=True)
class TierWeighted:
    """FedAT: random clients per tier, sample-weighted tier merge, cross-tier weights from update counts."""

    name: str
    weigh: object  # Callable[[Sequence[int]], np.ndarray]

    def select_clients(self, candidates: Sequence[int], k: int, rng: np.random.Generator) -> list[int]:
        """Uniformly random k of the tier's clients."""
        return _random_subset(candidates, k, rng)

    def merge_tier(self, models: Sequence[Weights], n_samples: Sequence[int]) -> Weights:
        """Sample-weighted average."""
        return sample_weighted_average(models, n_samples)

    def merge_global(self, tier_models: Sequence[Weights | None], counts: Sequence[int]) -> tuple[Weights, np.ndarray]:
        """Weighted average of the reported tiers' models."""
        w = self.weigh(counts)
        present = [i for i, m in enumerate(tier_models) if m is not None and w[i] > 0]
        if not present:
            raise ValueError("merge_global: no tier has reported")
        return weighted_average([tier_models[i] for i in present], [w[i] for i in present]), w


STRATEGIES: dict[str, Strategy] = {
    "fedat": TierWeighted("fedat", fedat_tier_weights),
    "fedat-uniform": TierWeighted("fedat-uniform", uniform_tier_weights),
}
