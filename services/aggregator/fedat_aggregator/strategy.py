"""Algorithms behind one narrow interface: one verb per phase, registered by name in a plain dict."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

import numpy as np

from fedat.aggregate import (
    STALENESS,
    Weights,
    accumulate_delta,
    apply_buffer,
    copies_average,
    fedasync_mix,
    fedat_tier_weights,
    replace_copy,
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
    base_model: Weights | None = None  # the global model the arrival was trained from (None: unknown, too old)
    clients: tuple[int, ...] = ()  # clients whose updates make the arriving tier model
    n_samples: int = 0  # samples behind the arriving tier model
    state: object = None  # what the strategy's last GlobalMerge returned as state
    pending: int = 0  # arrivals absorbed since the last published global model, this one included


@dataclass(frozen=True)
class GlobalMerge:
    """What merge_global decided; the strategy keeps no state of its own, so the aggregator holds and returns it."""

    model: Weights | None  # the new global model; None: the arrival is absorbed and nothing is published yet
    tier_weights: np.ndarray  # the weight each tier's model got in this merge
    state: object = None  # handed back in the next view's `state`


@dataclass(frozen=True)
class TierStats:
    """What the barrier knows about each tier (index 0 = fastest) when it decides which tiers run next."""

    rounds: tuple[int, ...]  # rounds closed so far
    losses: tuple[float, ...]  # sample-weighted training loss of the last closed round (inf: never ran)
    open: tuple[int, ...] = ()  # rounds still waiting for answers (busy also counts closed, unmerged ones)
    accuracies: tuple[float, ...] = ()  # mean test accuracy of the tier's clients at the last evaluation (nan: none)


class Strategy(Protocol):
    """Schedule tiers, select clients for a round, merge a tier's round, merge the tiers into the global model."""

    name: str
    history: int  # global versions the aggregator keeps (and persists) so that arrivals find their base model

    def schedule(self, busy: Mapping[int, int], stats: TierStats, rng: np.random.Generator) -> list[int]:
        """Tiers (1 = fastest; repeated to open several) that start a round now, given each tier's unmerged rounds."""
        ...

    def select_clients(self, candidates: Sequence[int], k: int, rng: np.random.Generator) -> list[int]:
        """Pick the clients of one tier round."""
        ...

    def merge_tier(self, models: Sequence[Weights], n_samples: Sequence[int]) -> Weights:
        """Synchronous merge of one round's client models."""
        ...

    def merge_global(self, view: CrossTier) -> GlobalMerge:
        """The new global model (or None: not yet), each tier's weight in it, and the state for the next view."""
        ...


def _top_up(counts: Mapping[int, int], concurrency: int) -> list[int]:
    """Each tier repeated as many times as it is short of `concurrency` rounds."""
    return [m for m, n in counts.items() for _ in range(max(0, concurrency - n))]


def _seed_from_first(view: CrossTier) -> GlobalMerge:
    """No seed model seen: the first arrival becomes the global model."""
    w = np.zeros(len(view.tier_models))
    w[view.arrived] = 1.0
    return GlobalMerge([a.copy() for a in view.tier_models[view.arrived]], w)


def _random_subset(candidates: Sequence[int], k: int, rng: np.random.Generator) -> list[int]:
    k = min(k, len(candidates))
    return sorted(int(c) for c in rng.choice(np.asarray(candidates, dtype=np.int64), size=k, replace=False))


@dataclass(frozen=True)
class TierWeighted:
    """FedAT: random clients per tier, sample-weighted tier merge, cross-tier weights from update counts."""

    history = 0  # no base models needed

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

    def merge_global(self, view: CrossTier) -> GlobalMerge:
        """Weighted average of the reported tiers' models."""
        w = self.weigh(view.counts) * np.array([m is not None for m in view.tier_models])
        if w.sum() <= 0:
            raise ValueError("merge_global: no tier has reported")
        w = w / w.sum()
        present = np.flatnonzero(w > 0)
        return GlobalMerge(weighted_average([view.tier_models[i] for i in present], w[present]), w)


@dataclass(frozen=True)
class TiFL:
    """TiFL (Chai et al., HPDC '20): one tier at a time, picked by adaptive probabilities, FedAvg inside.

    The adaptive rule ranks tiers by test accuracy (the mean over each tier's clients, from the latest
    evaluation) and favours the worst. Until every tier has an accuracy, the tiers' last-round training losses
    rank them instead (a tier that never ran counts as the worst). `credits` caps each tier's rounds (0 = none).
    """

    history = 0  # no base models needed

    name: str = "tifl"
    credits: int = 0

    def schedule(self, busy: Mapping[int, int], stats: TierStats, rng: np.random.Generator) -> list[int]:
        """One tier, only when none is running, drawn with TiFL's probabilities."""
        if any(busy.values()) or not busy:
            return []
        tiers = sorted(busy)
        accuracy = [stats.accuracies[m - 1] if m <= len(stats.accuracies) else np.nan for m in tiers]
        if np.isnan(accuracy).any():
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

    def merge_global(self, view: CrossTier) -> GlobalMerge:
        """Synchronous: the round started from the current global model, so its merge is the new global model."""
        w = np.zeros(len(view.tier_models))
        w[view.arrived] = 1.0
        return GlobalMerge([a.copy() for a in view.tier_models[view.arrived]], w)


@dataclass(frozen=True)
class FedAsync:
    """FedAsync (Xie et al., 2019): clients train concurrently; each update is mixed in as it arrives.

    Every round is one client (configure clients_per_round 1); `concurrency` rounds per tier run at once, each
    restarting from the newest global model once its update is merged. The server step is
    w <- (1 - a_t) w + a_t w_new with a_t = alpha * s(t - tau), s the staleness function.
    """

    history = 0  # no base models needed

    name: str = "fedasync"
    concurrency: int = 20
    alpha: float = 0.6
    staleness: str = "polynomial"

    def schedule(self, busy: Mapping[int, int], stats: TierStats, rng: np.random.Generator) -> list[int]:
        """Top every tier up to `concurrency` unmerged rounds."""
        return _top_up(busy, self.concurrency)

    def select_clients(self, candidates: Sequence[int], k: int, rng: np.random.Generator) -> list[int]:
        """Uniformly random idle clients."""
        return _random_subset(candidates, k, rng)

    def merge_tier(self, models: Sequence[Weights], n_samples: Sequence[int]) -> Weights:
        """Sample-weighted average (a single client in FedAsync proper)."""
        return sample_weighted_average(models, n_samples)

    def merge_global(self, view: CrossTier) -> GlobalMerge:
        """Mix the arriving model into the current global model, discounted by its staleness."""
        if view.global_model is None:
            return _seed_from_first(view)
        new = view.tier_models[view.arrived]
        w = np.zeros(len(view.tier_models))
        s = STALENESS[self.staleness](view.staleness)
        w[view.arrived] = self.alpha * s
        return GlobalMerge(fedasync_mix(view.global_model, new, self.alpha, s), w)


@dataclass(frozen=True)
class Buffer:
    """FedBuff's state between server steps: Σ s_k · Δ_k over the buffered arrivals (float64) and their number."""

    total: Weights
    count: int


@dataclass(frozen=True)
class FedBuff:
    """FedBuff (Nguyen et al., AISTATS 2022): asynchronous clients, their deltas buffered and applied K at a time.

    Every round is one client (configure clients_per_round 1); `concurrency` rounds per tier are open at once, a
    client restarting as soon as its round closes, not when it is merged. Each arrival adds s(t − τ) · Δ to the
    buffer, Δ its model minus the global version it was trained from; after `buffer_size` (K) arrivals the server
    steps w <- w + server_lr · Σ s·Δ / K and publishes. In between nothing is published, so the clients keep
    training from the same global version.
    """

    name: str = "fedbuff"
    concurrency: int = 20
    buffer_size: int = 10
    server_lr: float = 1.0
    staleness: str = "polynomial"
    # Versions kept to find an arrival's base (its delta); an older base counts as unknown (weight 0). Each is a
    # whole model in every checkpoint, so this is a cost per arrival: bases rarely lag more than a few versions.
    history: int = 16

    def schedule(self, busy: Mapping[int, int], stats: TierStats, rng: np.random.Generator) -> list[int]:
        """Top every tier up to `concurrency` open rounds (closed, unmerged ones sit in the buffer, not in a client)."""
        # a tier the barrier reports no open count for has none open
        open_rounds = {m: stats.open[m - 1] if m <= len(stats.open) else 0 for m in busy}
        return _top_up(open_rounds, self.concurrency)

    def select_clients(self, candidates: Sequence[int], k: int, rng: np.random.Generator) -> list[int]:
        """Uniformly random idle clients."""
        return _random_subset(candidates, k, rng)

    def merge_tier(self, models: Sequence[Weights], n_samples: Sequence[int]) -> Weights:
        """Sample-weighted average (a single client in FedBuff proper)."""
        return sample_weighted_average(models, n_samples)

    def merge_global(self, view: CrossTier) -> GlobalMerge:
        """Buffer the arrival's staleness-weighted delta; every `buffer_size` arrivals, step the global model."""
        if view.global_model is None:
            return _seed_from_first(view)
        new = view.tier_models[view.arrived]
        w = np.zeros(len(view.tier_models))
        s = STALENESS[self.staleness](view.staleness)
        # an arrival whose base version is unknown adds nothing (see accumulate_delta), so it weighs 0
        w[view.arrived] = s if view.base_model is not None else 0.0
        buffer = cast(Buffer | None, view.state)
        total = accumulate_delta(buffer.total if buffer else None, new, view.base_model, s)
        count = (buffer.count if buffer else 0) + 1
        if count < self.buffer_size:
            return GlobalMerge(None, w, Buffer(total, count))
        return GlobalMerge(apply_buffer(view.global_model, total, count, self.server_lr), w)


@dataclass(frozen=True)
class Copies:
    """ASO-Fed's state: each heard-from client's latest model and sample count, and their running Σ n·w and Σ n.

    A new Copies is built per arrival (a shallow copy of `models`, no model copies), so a held state never changes.
    """

    models: Mapping[int, tuple[Weights, float]]
    total: Weights  # Σ n·w over the copies, float64
    total_n: float  # Σ n over the copies


@dataclass(frozen=True)
class ASOFed:
    """ASO-Fed (Chen et al., 2020), as the project states it: one model copy per client, global = their average.

    The paper's local constraint term is the worker's proximal term, set by config. Every round is one client (configure
    clients_per_round 1); `concurrency` rounds per tier run at once, as in FedAsync. The global model is the
    sample-weighted average of the latest model of every client heard from; clients never heard from do not
    count. The running sums make an arrival cost O(model), not O(clients × model).
    """

    history = 0  # no base models needed

    name: str = "aso-fed"
    concurrency: int = 20

    def schedule(self, busy: Mapping[int, int], stats: TierStats, rng: np.random.Generator) -> list[int]:
        """Top every tier up to `concurrency` unmerged rounds."""
        return _top_up(busy, self.concurrency)

    def select_clients(self, candidates: Sequence[int], k: int, rng: np.random.Generator) -> list[int]:
        """Uniformly random idle clients."""
        return _random_subset(candidates, k, rng)

    def merge_tier(self, models: Sequence[Weights], n_samples: Sequence[int]) -> Weights:
        """Sample-weighted average (a single client in ASO-Fed proper)."""
        return sample_weighted_average(models, n_samples)

    def merge_global(self, view: CrossTier) -> GlobalMerge:
        """Replace the arriving clients' copies; the global model is the sample-weighted average of all copies."""
        if not view.clients:
            raise ValueError("aso-fed: the arriving tier model names no client")
        new = view.tier_models[view.arrived]
        held = cast(Copies | None, view.state)
        models = dict(held.models) if held else {}
        total, total_n = (held.total, held.total_n) if held else (None, 0.0)
        # A round of several clients has only their merge: it stands in for each of them, its samples split evenly
        # so that the round weighs n_samples in all.
        n = view.n_samples / len(view.clients)
        for c in view.clients:
            old, old_n = models.get(c, (None, 0.0))
            total, total_n = replace_copy(total, total_n, old, old_n, new, n)
            models[c] = (new, n)
        model = copies_average(total, total_n)
        w = np.zeros(len(view.tier_models))
        w[view.arrived] = view.n_samples / total_n  # the arrival's share of the average
        return GlobalMerge(model, w, Copies(models, total, total_n))


# Classes of strategy state the aggregator persists (registered with its state codec).
STATE_TYPES: tuple[type, ...] = (Buffer, Copies)

STRATEGIES: dict[str, Strategy] = {
    "fedat": TierWeighted("fedat", fedat_tier_weights),
    "fedat-uniform": TierWeighted("fedat-uniform", uniform_tier_weights),
    "tifl": TiFL(),
    "fedasync": FedAsync(),
    "fedbuff": FedBuff(),
    "aso-fed": ASOFed(),
}
