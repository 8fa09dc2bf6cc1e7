"""TiFL (Chai et al., HPDC '20): one tier at a time, picked by adaptive probabilities, FedAvg inside."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from fedat.fl.strategies.base import Basics, CrossTier, GlobalMerge, TierStats, arrival_only, setting
from fedat.fl.tiering import tifl_probabilities


@dataclass(frozen=True)
class TiFL(Basics):
    """TiFL: one tier at a time, drawn with adaptive probabilities that favour the tier doing worst.

    The adaptive rule ranks tiers by test accuracy (the mean over each tier's clients, from the latest
    evaluation) and favours the worst. Until every tier has an accuracy, the tiers' last-round training losses
    rank them instead (a tier that never ran counts as the worst). `tifl_credits` caps each tier's rounds (0: none).
    """

    reads_every_tier = False  # merge_global reads the arriving tier's model only
    name: str = "tifl"
    tifl_credits: int = setting(0, "TiFL's rounds per tier (0: no cap)", ge=0)

    def schedule(self, busy: Mapping[int, int], stats: TierStats, rng: np.random.Generator) -> list[int]:
        """One tier, only when none is running, drawn with TiFL's probabilities."""
        if any(busy.values()) or not busy:
            return []
        tiers = sorted(busy)
        accuracy = [stats.accuracies[m - 1] if m <= len(stats.accuracies) else np.nan for m in tiers]
        if np.isnan(accuracy).any():
            accuracy = [-stats.losses[m - 1] for m in tiers]
        left = [1 if not self.tifl_credits else self.tifl_credits - stats.rounds[m - 1] for m in tiers]
        p = tifl_probabilities(accuracy, left)
        if p.sum() <= 0:
            return []  # every tier has spent its credits
        return [int(rng.choice(tiers, p=p))]

    def merge_global(self, view: CrossTier[None]) -> GlobalMerge[None]:
        """Synchronous: the round started from the current global model, so its merge is the new global model."""
        return GlobalMerge([a.copy() for a in view.tier_models[view.arrived]], arrival_only(view, 1.0))
