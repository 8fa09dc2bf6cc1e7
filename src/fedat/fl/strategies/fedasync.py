"""FedAsync (Xie et al., 2019): clients train concurrently; each update is mixed in as it arrives."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from fedat.fl.aggregate import STALENESS, fedasync_mix
from fedat.fl.strategies.base import (
    Basics,
    CrossTier,
    GlobalMerge,
    TierStats,
    arrival_only,
    concurrency,
    seed_from_first,
    setting,
    staleness,
    top_up,
)


@dataclass(frozen=True)
class FedAsync(Basics):
    """FedAsync: every update mixed into the global model as it arrives, discounted by its staleness.

    Every round is one client (configure clients_per_round 1); `concurrency` rounds per tier run at once, each
    restarting from the newest global model once its update is merged. The server step is
    w <- (1 - a_t) w + a_t w_new with a_t = async_alpha * s(t - tau), s the staleness function.
    """

    reads_every_tier = False  # merge_global reads the arriving tier's model only
    name: str = "fedasync"
    concurrency: int = concurrency()
    async_alpha: float = setting(0.6, "FedAsync's mixing weight α", gt=0.0, le=1.0)
    staleness: str = staleness()

    def schedule(self, busy: Mapping[int, int], stats: TierStats, rng: np.random.Generator) -> list[int]:
        """Top every tier up to `concurrency` unmerged rounds."""
        return top_up(busy, self.concurrency)

    def merge_global(self, view: CrossTier[None]) -> GlobalMerge[None]:
        """Mix the arriving model into the current global model, discounted by its staleness."""
        if view.global_model is None:
            return seed_from_first(view)
        new = view.tier_models[view.arrived]
        s = STALENESS[self.staleness](view.staleness)
        mixed = fedasync_mix(view.global_model, new, self.async_alpha, s)
        return GlobalMerge(mixed, arrival_only(view, self.async_alpha * s))
