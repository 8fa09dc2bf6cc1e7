"""Algorithms behind one narrow interface: one verb per phase, registered by name in a plain dict."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from fedat.aggregate import (
    STALENESS,
    Weights,
    fedasync_mix,
    fedat_tier_weights,
    sample_weighted_average,
    uniform_tier_weights,
    weighted_average,
)
from fedat.tiering import tifl_probabilities


@dataclass(frozen=True)
class CrossTier:
    """What the aggregator knows when a tier model arrives (already stored and counted)."""

    global_model: Weights | None
    tier_models: tuple[Weights | None, ...]
    counts: tuple[int, ...]
    arrived: int  # index of the tier that just reported (0 = fastest)
    staleness: int  # global versions published since the arrival's base version


@dataclass(frozen=True)
class TierStats:
    """What the barrier knows about each tier (index 0 = fastest) when it decides which tiers run next."""

    rounds: tuple[int, ...]  # rounds closed so far
    losses: tuple[float, ...]  # sample-weighted training loss of the last closed round (inf: never ran)
    open: tuple[int, ...] = ()  # rounds still waiting for answers (busy also counts closed, unmerged ones)


class Strategy(Protocol):
    """Schedule tiers, select clients for a round, merge a tier's round, merge the tiers into the global model."""

    name: str

    def schedule(self, busy: Mapping[int, int], stats: TierStats, rng: np.random.Generator) -> list[int]:
        """Tiers (1 = fastest; repeated to open several) that start a round now, given each tier's unmerged rounds."""
        ...

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

    def schedule(self, busy: Mapping[int, int], stats: TierStats, rng: np.random.Generator) -> list[int]:
        """Every tier loops on its own (Algorithm 2): each tier whose last round is merged starts the next."""
        return [m for m, n in busy.items() if n == 0]

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


@dataclass(frozen=True)
class TiFL:
    """TiFL (Chai et al., HPDC '20): one tier at a time, picked by adaptive probabilities, FedAvg inside.

    The adaptive rule ranks tiers by accuracy and favours the worst; the barrier has no per-tier test accuracy,
    so the tier's last-round training loss stands in for it (a tier that never ran counts as the worst).
    `credits` caps how many rounds each tier may run (0 = no cap).
    """

    name: str = "tifl"
    credits: int = 0

    def schedule(self, busy: Mapping[int, int], stats: TierStats, rng: np.random.Generator) -> list[int]:
        """One tier, only when none is running, drawn with TiFL's probabilities."""
        if any(busy.values()) or not busy:
            return []
        tiers = sorted(busy)
        accuracy = [-stats.losses[m - 1] for m in tiers]
        left = [1 if not self.credits else self.credits - stats.rounds[m - 1] for m in tiers]
        p = tifl_probabilities(accuracy, left)
        if p.sum() <= 0:
            return []  # every tier has spent its credits
        return [int(rng.choice(tiers, p=p))]

    def select_clients(self, candidates: Sequence[int], k: int, rng: np.random.Generator) -> list[int]:
        """Uniformly random k of the tier's clients."""
        return _random_subset(candidates, k, rng)

    def merge_tier(self, models: Sequence[Weights], n_samples: Sequence[int]) -> Weights:
        """Sample-weighted average."""
        return sample_weighted_average(models, n_samples)

    def merge_global(self, view: CrossTier) -> tuple[Weights, np.ndarray]:
        """Synchronous: the round started from the current global model, so its merge is the new global model."""
        w = np.zeros(len(view.tier_models))
        w[view.arrived] = 1.0
        return [a.copy() for a in view.tier_models[view.arrived]], w


@dataclass(frozen=True)
class FedAsync:
    """FedAsync (Xie et al., 2019): clients train concurrently; each update is mixed in as it arrives.

    Every round is one client (configure clients_per_round 1); `concurrency` rounds per tier run at once, each
    restarting from the newest global model once its update is merged. The server step is
    w <- (1 - a_t) w + a_t w_new with a_t = alpha * s(t - tau), s the staleness function.
    """

    name: str = "fedasync"
    concurrency: int = 20
    alpha: float = 0.6
    staleness: str = "polynomial"

    def schedule(self, busy: Mapping[int, int], stats: TierStats, rng: np.random.Generator) -> list[int]:
        """Top every tier up to `concurrency` unmerged rounds."""
        return [m for m, n in busy.items() for _ in range(max(0, self.concurrency - n))]

    def select_clients(self, candidates: Sequence[int], k: int, rng: np.random.Generator) -> list[int]:
        """Uniformly random idle clients."""
        return _random_subset(candidates, k, rng)

    def merge_tier(self, models: Sequence[Weights], n_samples: Sequence[int]) -> Weights:
        """Sample-weighted average (a single client in FedAsync proper)."""
        return sample_weighted_average(models, n_samples)

    def merge_global(self, view: CrossTier) -> tuple[Weights, np.ndarray]:
        """Mix the arriving model into the current global model, discounted by its staleness."""
        new = view.tier_models[view.arrived]
        w = np.zeros(len(view.tier_models))
        if view.global_model is None:  # no seed model seen: the first arrival becomes the model
            w[view.arrived] = 1.0
            return [a.copy() for a in new], w
        s = STALENESS[self.staleness](view.staleness)
        w[view.arrived] = self.alpha * s
        return fedasync_mix(view.global_model, new, self.alpha, s), w


STRATEGIES: dict[str, Strategy] = {
    "fedat": TierWeighted("fedat", fedat_tier_weights),
    "fedat-uniform": TierWeighted("fedat-uniform", uniform_tier_weights),
    "tifl": TiFL(),
    "fedasync": FedAsync(),
}
