"""Algorithms behind one narrow interface: one verb per phase, registered by name in a plain dict."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

import numpy as np

from fedat import config
from fedat.aggregate import (
    STALENESS,
    Weights,
    accumulate_delta,
    apply_buffer,
    copies_average,
    decayed_step,
    delta_step,
    fedasync_mix,
    fedat_tier_weights,
    replace_copy,
    sample_weighted_average,
    tier_balance,
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


class Basics:
    """What every strategy does alike, written once: uniformly random clients and a sample-weighted tier merge."""

    history = 0  # global versions kept for arrivals' bases; only the delta-based strategies need any

    def select_clients(self, candidates: Sequence[int], k: int, rng: np.random.Generator) -> list[int]:
        """Uniformly random k of the tier's idle clients."""
        k = min(k, len(candidates))
        return sorted(int(c) for c in rng.choice(np.asarray(candidates, dtype=np.int64), size=k, replace=False))

    def merge_tier(self, models: Sequence[Weights], n_samples: Sequence[int]) -> Weights:
        """Sample-weighted average (FedAvg; a single client's model when the round has one client)."""
        return sample_weighted_average(models, n_samples)


def _each_tier_loops(busy: Mapping[int, int]) -> list[int]:
    """FedAT's Algorithm 2: each tier whose last round is merged starts the next."""
    return [m for m, n in busy.items() if n == 0]


def _top_up(counts: Mapping[int, int], concurrency: int) -> list[int]:
    """Each tier repeated as many times as it is short of `concurrency` rounds."""
    return [m for m, n in counts.items() for _ in range(max(0, concurrency - n))]


def _seed_from_first(view: CrossTier) -> GlobalMerge:
    """No seed model seen: the first arrival becomes the global model."""
    w = np.zeros(len(view.tier_models))
    w[view.arrived] = 1.0
    return GlobalMerge([a.copy() for a in view.tier_models[view.arrived]], w)


@dataclass(frozen=True)
class TierWeighted(Basics):
    """FedAT: random clients per tier, sample-weighted tier merge, cross-tier weights from update counts."""

    name: str
    weigh: Callable[[Sequence[int]], np.ndarray]

    def schedule(self, busy: Mapping[int, int], stats: TierStats, rng: np.random.Generator) -> list[int]:
        """Every tier loops on its own (Algorithm 2): each tier whose last round is merged starts the next."""
        return _each_tier_loops(busy)

    def merge_global(self, view: CrossTier) -> GlobalMerge:
        """Weighted average of the reported tiers' models."""
        w = self.weigh(view.counts) * np.array([m is not None for m in view.tier_models])
        if w.sum() <= 0:
            raise ValueError("merge_global: no tier has reported")
        w = w / w.sum()
        present = np.flatnonzero(w > 0)
        return GlobalMerge(weighted_average([view.tier_models[i] for i in present], w[present]), w)


@dataclass(frozen=True)
class FedATDelta(Basics):
    """fedat-delta: FedAT's tier loops and tier merge, but each arriving tier round steps the global model by its delta.

    The paper's cross-tier merge re-averages every tier's latest model at each arrival, so stale tier models are
    mixed into every global version again, and its mirrored counts give the slowest tier's old model the largest
    weight. Here tier m's round model w_m, trained from global version b, moves the global model once, by its own
    delta: w <- w + η_T · c_m · s(staleness) · (w_m − w_b), s the staleness function, c_m =
    `tier_balance(counts, m, balance)` (balance 0: c_m = 1; balance > 0 favours the tiers that report less) and
    η_T = `decayed_step(server_lr, T, decay)` after T tier rounds merged (decay 0: η = server_lr). A fresh
    arrival with η 1 and c_m 1 makes the tier's model the global model, as FedAsync with α 1 would.
    """

    name: str = "fedat-delta"
    server_lr: float = 1.0
    staleness: str = "polynomial"
    balance: float = 0.0
    decay: float = 0.0  # tier rounds over which the step shrinks (η_T = server_lr / sqrt(1 + T / decay)); 0: constant
    # Versions kept to find an arrival's base. With 5 tiers 10x apart in speed the slowest tier's base is some 15-20
    # versions old, so 32 leaves room; each kept version is a whole model in every checkpoint (twice FedBuff's 16).
    history: int = 32

    def schedule(self, busy: Mapping[int, int], stats: TierStats, rng: np.random.Generator) -> list[int]:
        """Every tier loops on its own, as in FedAT."""
        return _each_tier_loops(busy)

    def merge_global(self, view: CrossTier) -> GlobalMerge:
        """Step the global model by the arrival's delta from its base, scaled by η_T · c_m · s(staleness).

        No global model yet: the first arrival becomes it. An arrival whose base has left the history has no known
        delta; dropping it would silently lose a tier's round (the slowest tier's, most likely), so it is mixed in
        FedAsync-style instead, w <- (1 − a) w + a w_m with a = min(1, η_T · c_m · s): its staleness already
        keeps an old model's share small.
        """
        if view.global_model is None:
            return _seed_from_first(view)
        new = view.tier_models[view.arrived]
        s = STALENESS[self.staleness](view.staleness)
        step = decayed_step(self.server_lr, sum(view.counts), self.decay)
        scale = step * tier_balance(view.counts, view.arrived, self.balance) * s
        w = np.zeros(len(view.tier_models))
        if view.base_model is None:
            w[view.arrived] = min(1.0, scale)
            return GlobalMerge(fedasync_mix(view.global_model, new, 1.0, w[view.arrived]), w)
        w[view.arrived] = scale
        return GlobalMerge(delta_step(view.global_model, new, view.base_model, scale), w)


@dataclass(frozen=True)
class TiFL(Basics):
    """TiFL (Chai et al., HPDC '20): one tier at a time, picked by adaptive probabilities, FedAvg inside.

    The adaptive rule ranks tiers by test accuracy (the mean over each tier's clients, from the latest
    evaluation) and favours the worst. Until every tier has an accuracy, the tiers' last-round training losses
    rank them instead (a tier that never ran counts as the worst). `credits` caps each tier's rounds (0 = none).
    """

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

    def merge_global(self, view: CrossTier) -> GlobalMerge:
        """Synchronous: the round started from the current global model, so its merge is the new global model."""
        w = np.zeros(len(view.tier_models))
        w[view.arrived] = 1.0
        return GlobalMerge([a.copy() for a in view.tier_models[view.arrived]], w)


@dataclass(frozen=True)
class FedAsync(Basics):
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
        return _top_up(busy, self.concurrency)

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
class FedBuff(Basics):
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
class ASOFed(Basics):
    """ASO-Fed (Chen et al., 2020), as the project states it: one model copy per client, global = their average.

    The paper's local constraint term is the worker's proximal term, set by config. Every round is one client (configure
    clients_per_round 1); `concurrency` rounds per tier run at once, as in FedAsync. The global model is the
    sample-weighted average of the latest model of every client heard from; clients never heard from do not
    count. The running sums make an arrival cost O(model), not O(clients × model).
    """

    name: str = "aso-fed"
    concurrency: int = 20

    def schedule(self, busy: Mapping[int, int], stats: TierStats, rng: np.random.Generator) -> list[int]:
        """Top every tier up to `concurrency` unmerged rounds."""
        return _top_up(busy, self.concurrency)

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


@dataclass(frozen=True)
class Params:
    """The strategies' hyper-parameters, experiment settings; each strategy takes the ones it uses, ignores the rest."""

    async_alpha: float = 0.6  # FedAsync's α
    staleness: str = "polynomial"  # s(t − τ) of FedAsync, FedBuff and fedat-delta: a key of fedat.aggregate.STALENESS
    concurrency: int = 20  # FedAsync, FedBuff, ASO-Fed: rounds open at once per tier
    buffer_size: int = 10  # FedBuff's K
    server_lr: float = 1.0  # FedBuff's and fedat-delta's η
    tifl_credits: int = 0  # TiFL's rounds per tier (0: no cap)
    tier_balance: float = 0.0  # fedat-delta's exponent of the tier-balance factor c_m
    server_lr_decay: float = 0.0  # fedat-delta's step decay, in tier rounds (0: constant step)
    history: int | None = None  # versions kept for arrivals' bases (FedBuff, fedat-delta); None: the strategy's own


def _history(p: Params, default: int) -> int:
    return default if p.history is None else p.history


# Each name builds its strategy from the experiment's settings.
STRATEGIES: dict[str, Callable[[Params], Strategy]] = {
    "fedat": lambda p: TierWeighted("fedat", fedat_tier_weights),
    "fedat-uniform": lambda p: TierWeighted("fedat-uniform", uniform_tier_weights),
    "fedat-delta": lambda p: FedATDelta(
        server_lr=p.server_lr,
        staleness=p.staleness,
        balance=p.tier_balance,
        decay=p.server_lr_decay,
        history=_history(p, FedATDelta.history),
    ),
    "tifl": lambda p: TiFL(credits=p.tifl_credits),
    "fedasync": lambda p: FedAsync(concurrency=p.concurrency, alpha=p.async_alpha, staleness=p.staleness),
    "fedbuff": lambda p: FedBuff(
        concurrency=p.concurrency,
        buffer_size=p.buffer_size,
        server_lr=p.server_lr,
        staleness=p.staleness,
        history=_history(p, FedBuff.history),
    ),
    "aso-fed": lambda p: ASOFed(concurrency=p.concurrency),
}


def build_strategy(name: str, params: Params = Params()) -> Strategy:
    """The strategy registered as `name`, with the given hyper-parameters (by default today's)."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; known: {sorted(STRATEGIES)}")
    return STRATEGIES[name](params)


def params_from_env(env: Mapping[str, str]) -> Params:
    """The strategies' hyper-parameters from FEDAT_* variables; a bad value is a ConfigError naming its variable."""
    d = Params()
    given = env.get("FEDAT_HISTORY", "").strip() != ""  # unset: each strategy keeps its own
    p = Params(
        async_alpha=config.get_float(env, "FEDAT_ASYNC_ALPHA", d.async_alpha),
        staleness=config.get_str(env, "FEDAT_STALENESS", d.staleness),
        concurrency=config.get_int(env, "FEDAT_CONCURRENCY", d.concurrency),
        buffer_size=config.get_int(env, "FEDAT_BUFFER_SIZE", d.buffer_size),
        server_lr=config.get_float(env, "FEDAT_SERVER_LR", d.server_lr),
        tifl_credits=config.get_int(env, "FEDAT_TIFL_CREDITS", d.tifl_credits),
        tier_balance=config.get_float(env, "FEDAT_TIER_BALANCE", d.tier_balance),
        server_lr_decay=config.get_float(env, "FEDAT_SERVER_LR_DECAY", d.server_lr_decay),
        history=config.get_int(env, "FEDAT_HISTORY", 0) if given else None,
    )
    # Every value is checked, whichever strategy runs: a typo in an unused one is still a typo.
    problems = [
        (not 0.0 < p.async_alpha <= 1.0, f"FEDAT_ASYNC_ALPHA={p.async_alpha} must be within (0, 1]"),
        (p.staleness not in STALENESS, f"FEDAT_STALENESS={p.staleness!r} is not one of {sorted(STALENESS)}"),
        (p.concurrency < 1, f"FEDAT_CONCURRENCY={p.concurrency} must be >= 1"),
        (p.buffer_size < 1, f"FEDAT_BUFFER_SIZE={p.buffer_size} must be >= 1"),
        (not 0.0 < p.server_lr < float("inf"), f"FEDAT_SERVER_LR={p.server_lr} must be a number > 0"),
        (p.tifl_credits < 0, f"FEDAT_TIFL_CREDITS={p.tifl_credits} must be >= 0 (0: no cap)"),
        (not 0.0 <= p.tier_balance < float("inf"), f"FEDAT_TIER_BALANCE={p.tier_balance} must be a number >= 0"),
        (
            not 0.0 <= p.server_lr_decay < float("inf"),
            f"FEDAT_SERVER_LR_DECAY={p.server_lr_decay} must be a number >= 0 (0: constant step)",
        ),
        (p.history is not None and p.history < 1, f"FEDAT_HISTORY={p.history} must be >= 1"),
    ]
    for bad, message in problems:
        if bad:
            raise config.ConfigError(message)
    return p


def strategy_from_env(env: Mapping[str, str]) -> Strategy:
    """The strategy FEDAT_STRATEGY names, built with the hyper-parameters the FEDAT_* variables set."""
    name = config.get_str(env, "FEDAT_STRATEGY", "fedat")
    if name not in STRATEGIES:
        raise config.ConfigError(f"FEDAT_STRATEGY={name!r} is not one of {sorted(STRATEGIES)}")
    return build_strategy(name, params_from_env(env))
