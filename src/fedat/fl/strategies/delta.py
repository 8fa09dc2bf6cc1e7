"""Tier rounds as steps: each arriving tier round moves the global model by its own delta from its base."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from fedat.fl.aggregate import STALENESS, decayed_step, delta_step, fedasync_mix, fedat_tier_weights, tier_balance
from fedat.fl.strategies.base import (
    Basics,
    CrossTier,
    GlobalMerge,
    TierStats,
    arrival_only,
    each_tier_loops,
    history,
    seed_from_first,
    server_lr,
    setting,
    staleness,
)


@dataclass(frozen=True)
class FedATDelta(Basics):
    """fedat-delta: FedAT's tier loops and tier merge, but each arriving tier round steps the global model by its delta.

    The paper's cross-tier merge re-averages every tier's latest model at each arrival, so stale tier models are
    mixed into every global version again, and its mirrored counts give the slowest tier's old model the largest
    weight. Here tier m's round model w_m, trained from global version b, moves the global model once, by its own
    delta: w <- w + η_T · c_m · s(staleness) · (w_m − w_b), s the staleness function, c_m =
    `tier_balance(counts, m, tier_balance)` (0: c_m = 1; > 0 favours the tiers that report less) and
    η_T = `decayed_step(server_lr, T, server_lr_decay)` after T tier rounds merged (decay 0: η = server_lr). A fresh
    arrival with η 1 and c_m 1 makes the tier's model the global model, as FedAsync with α 1 would.

    With `paper_weight` (strategy `fedat-step`) c_m is the paper's cross-tier weight T_(M+1−m)/T instead: the rule
    the paper's appendix analyses, w^(t+1) = w^t − (T_(M+1−m)/T) η ḡ_m, with −η ḡ_m the tier round's delta.
    """

    reads_every_tier = False  # merge_global reads the arriving tier's model only
    name: str = "fedat-delta"
    server_lr: float = server_lr()
    staleness: str = staleness()
    tier_balance: float = setting(0.0, "exponent of fedat-delta's tier factor c_m (0: every tier alike)", ge=0.0)
    server_lr_decay: float = setting(
        0.0, "τ, tier rounds over which the step shrinks as 1/sqrt(1 + T/τ) (0: constant)", ge=0.0
    )
    # Versions kept to find an arrival's base. With 5 tiers 10x apart in speed the slowest tier's base is some 15-20
    # versions old, so 32 leaves room; each kept version is a whole model in every checkpoint (twice FedBuff's 16).
    history: int = history(32)
    paper_weight: bool = False

    def schedule(self, busy: Mapping[int, int], stats: TierStats, rng: np.random.Generator) -> list[int]:
        """Every tier loops on its own, as in FedAT."""
        return each_tier_loops(busy)

    def merge_global(self, view: CrossTier[None]) -> GlobalMerge[None]:
        """Step the global model by the arrival's delta from its base, scaled by η_T · c_m · s(staleness).

        No global model yet: the first arrival becomes it. An arrival whose base has left the history has no known
        delta; dropping it would silently lose a tier's round (the slowest tier's, most likely), so it is mixed in
        FedAsync-style instead, w <- (1 − a) w + a w_m with a = min(1, η_T · c_m · s): its staleness already
        keeps an old model's share small.
        """
        if view.global_model is None:
            return seed_from_first(view)
        new = view.tier_models[view.arrived]
        s = STALENESS[self.staleness](view.staleness)
        step = decayed_step(self.server_lr, sum(view.counts), self.server_lr_decay)
        if self.paper_weight:
            c = float(fedat_tier_weights(view.counts)[view.arrived])
        else:
            c = tier_balance(view.counts, view.arrived, self.tier_balance)
        scale = step * c * s
        if view.base_model is None:
            a = min(1.0, scale)
            return GlobalMerge(fedasync_mix(view.global_model, new, 1.0, a), arrival_only(view, a))
        return GlobalMerge(delta_step(view.global_model, new, view.base_model, scale), arrival_only(view, scale))
