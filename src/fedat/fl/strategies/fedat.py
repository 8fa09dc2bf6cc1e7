"""FedAT's cross-tier rule (Algorithm 1): the global model re-averages every reported tier's latest model."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fedat.fl.aggregate import weighted_average
from fedat.fl.strategies.base import Basics, CrossTier, GlobalMerge, TierStats, each_tier_loops


@dataclass(frozen=True)
class TierWeighted(Basics):
    """FedAT: random clients per tier, sample-weighted tier merge, cross-tier weights from update counts."""

    name: str
    weigh: Callable[[Sequence[int]], np.ndarray]

    def schedule(self, busy: Mapping[int, int], stats: TierStats, rng: np.random.Generator) -> list[int]:
        """Every tier loops on its own (Algorithm 2): each tier whose last round is merged starts the next."""
        return each_tier_loops(busy)

    def merge_global(self, view: CrossTier[None]) -> GlobalMerge[None]:
        """Weighted average of the reported tiers' models."""
        w = self.weigh(view.counts) * np.array([m is not None for m in view.tier_models])
        if w.sum() <= 0:
            raise ValueError("merge_global: no tier has reported")
        w = w / w.sum()
        present = np.flatnonzero(w > 0)
        return GlobalMerge(weighted_average([view.tier_models[i] for i in present], w[present]), w)
