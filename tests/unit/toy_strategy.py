"""A toy strategy, the way a new one is added: this one file, plus one line in the registry (see test_toy_strategy)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from fedat.fl.aggregate import fedasync_mix
from fedat.fl.strategies.base import (
    Basics,
    CrossTier,
    GlobalMerge,
    TierStats,
    arrival_only,
    each_tier_loops,
    seed_from_first,
    setting,
)


@dataclass(frozen=True)
class HalfWay(Basics):
    """Every tier loops on its own; each arriving tier model pulls the global model `toy_step` of the way to it."""

    name: str = "toy"
    toy_step: float = setting(0.5, "share of the way to an arriving tier model", gt=0.0, le=1.0)

    def schedule(self, busy: Mapping[int, int], stats: TierStats, rng: np.random.Generator) -> list[int]:
        """As FedAT: each tier whose last round is merged starts the next."""
        return each_tier_loops(busy)

    def merge_global(self, view: CrossTier[None]) -> GlobalMerge[None]:
        """w <- (1 − toy_step) w + toy_step w_m."""
        if view.global_model is None:
            return seed_from_first(view)
        mixed = fedasync_mix(view.global_model, view.tier_models[view.arrived], self.toy_step, 1.0)
        return GlobalMerge(mixed, arrival_only(view, self.toy_step))
