"""FedBuff (Nguyen et al., AISTATS 2022): asynchronous clients, their deltas buffered and applied K at a time."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from fedat.fl.aggregate import STALENESS, Weights, accumulate_delta, apply_buffer
from fedat.fl.strategies.base import (
    Basics,
    CrossTier,
    GlobalMerge,
    TierStats,
    arrival_only,
    concurrency,
    history,
    seed_from_first,
    server_lr,
    setting,
    staleness,
    top_up,
)


@dataclass(frozen=True)
class Buffer:
    """FedBuff's state between server steps: Σ s_k · Δ_k over the buffered arrivals (float64) and their number."""

    total: Weights
    count: int


@dataclass(frozen=True)
class FedBuff(Basics):
    """FedBuff: each arrival's staleness-weighted delta is buffered; every K arrivals the server steps.

    Every round is one client (configure clients_per_round 1); `concurrency` rounds per tier are open at once, a
    client restarting as soon as its round closes, not when it is merged. Each arrival adds s(t − τ) · Δ to the
    buffer, Δ its model minus the global version it was trained from; after `buffer_size` (K) arrivals the server
    steps w <- w + server_lr · Σ s·Δ / K and publishes. In between nothing is published, so the clients keep
    training from the same global version.
    """

    state_type = Buffer
    reads_every_tier = False  # merge_global reads the arriving tier's model only

    name: str = "fedbuff"
    concurrency: int = concurrency()
    buffer_size: int = setting(10, "FedBuff's K: arrivals per server step", ge=1)
    server_lr: float = server_lr()
    staleness: str = staleness()
    # Versions kept to find an arrival's base (its delta); an older base counts as unknown (weight 0). Each is a
    # whole model in every checkpoint, so this is a cost per arrival: bases rarely lag more than a few versions.
    history: int = history(16)

    def schedule(self, busy: Mapping[int, int], stats: TierStats, rng: np.random.Generator) -> list[int]:
        """Top every tier up to `concurrency` open rounds (closed, unmerged ones sit in the buffer, not in a client)."""
        # a tier the barrier reports no open count for has none open
        open_rounds = {m: stats.open[m - 1] if m <= len(stats.open) else 0 for m in busy}
        return top_up(open_rounds, self.concurrency)

    def merge_global(self, view: CrossTier[Buffer]) -> GlobalMerge[Buffer]:
        """Buffer the arrival's staleness-weighted delta; every `buffer_size` arrivals, step the global model."""
        if view.global_model is None:
            return seed_from_first(view)
        new = view.tier_models[view.arrived]
        s = STALENESS[self.staleness](view.staleness)
        # an arrival whose base version is unknown adds nothing (see accumulate_delta), so it weighs 0
        w = arrival_only(view, s if view.base_model is not None else 0.0)
        buffer = view.state
        total = accumulate_delta(buffer.total if buffer else None, new, view.base_model, s)
        count = (buffer.count if buffer else 0) + 1
        if count < self.buffer_size:
            return GlobalMerge(None, w, Buffer(total, count))
        return GlobalMerge(apply_buffer(view.global_model, total, count, self.server_lr), w)
