"""The global aggregator: merges every tier-model event, as it arrives, into a new global model (or buffers it)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from fedat import topology
from fedat.aggregate import Weights
from fedat.service import Effects, Inbound, Outgoing, Reactive, Reject, done
from fedat.wire import GlobalModel, TierModel, decode_model, encode_model
from fedat_aggregator.strategy import CrossTier, Strategy

# Global versions kept to find an arrival's base model (FedBuff's delta); an arrival trained from an older one
# counts as unknown-base. Concurrent rounds are rarely more than a few dozen versions behind.
HISTORY = 64


@dataclass(frozen=True)
class AggregatorConfig:
    """Cross-tier merge settings."""

    num_tiers: int = 5
    codec: str = "polyline"
    precision: int = 4


class Aggregator(Reactive):
    """Asynchronous cross-tier merge; idempotent on tier-model ids."""

    name = "aggregator"

    def __init__(self, cfg: AggregatorConfig, strategy: Strategy, clock_metrics=None):
        self.cfg, self.strategy, self.metrics = cfg, strategy, clock_metrics
        m = cfg.num_tiers
        self.version = 0
        self.names: list[str] | None = None
        self.tier_models: list[Weights | None] = [None] * m
        self.global_model: Weights | None = None  # the current version's
        self.history: OrderedDict[int, Weights] = OrderedDict()  # recent versions, oldest first
        self.strategy_state: object = None  # the strategy's, from its last merge
        self.pending: list[tuple[int, int]] = []  # (tier, round) absorbed since the last published version
        self.counts = [0] * m
        self.rounds = [0] * m
        self.seen: set[str] = set()
        self.totals = {"bytes_up": 0, "bytes_down": 0, "late": 0, "updates": 0}

    def subscriptions(self) -> dict[str, type]:
        """Tier models to merge; global models to adopt the seed (version 0)."""
        return {topology.AGGREGATOR_TIER_MODELS: TierModel, topology.AGGREGATOR_GLOBAL: GlobalModel}

    def handle(self, inbound: Inbound, now: float) -> Effects:
        """Adopt the seed model, or merge a tier model."""
        msg = inbound.message
        if isinstance(msg, GlobalModel):
            if msg.version == 0 and self.names is None:
                self.names = [layer.name for layer in msg.layers]
                self.global_model = decode_model(msg.layers)
                self._remember(0, self.global_model)
            return done(inbound)  # our own outputs come back here too: nothing to do
        return self._merge(inbound, msg, now)

    def _merge(self, inbound: Inbound, tm: TierModel, now: float) -> Effects:
        if tm.id in self.seen:
            if self.metrics:
                self.metrics.duplicates.inc()
            return done(inbound)
        if not 1 <= tm.tier <= self.cfg.num_tiers:
            raise Reject(f"tier-model {tm.id}: tier {tm.tier} outside 1..{self.cfg.num_tiers}")
        model = decode_model(tm.layers)
        reference = next((w for w in self.tier_models if w is not None), None)
        if reference is not None and [a.shape for a in model] != [a.shape for a in reference]:
            raise Reject(f"tier-model {tm.id}: layer shapes differ from the other tiers'")
        i = tm.tier - 1
        # Build the view from copies and commit only once the strategy has merged, so a failing merge changes nothing.
        tier_models = list(self.tier_models)
        tier_models[i] = model
        counts = list(self.counts)
        counts[i] += 1
        pending = [*self.pending, (tm.tier, tm.round)]
        view = CrossTier(
            self.global_model,
            tuple(tier_models),
            tuple(counts),
            i,
            self.version - tm.base_version,
            base_model=self.history.get(tm.base_version),
            clients=tm.clients,
            n_samples=tm.n_samples,
            state=self.strategy_state,
            pending=len(pending),
        )
        result = self.strategy.merge_global(view)
        self.tier_models, self.counts, self.strategy_state = tier_models, counts, result.state
        self.rounds[i] = max(self.rounds[i], tm.round)  # concurrent rounds of one tier may finish out of order
        self.seen.add(tm.id)
        for key in ("bytes_up", "bytes_down", "late"):
            self.totals[key] += getattr(tm, key)
        self.totals["updates"] += len(tm.clients)
        if self.metrics:
            self.metrics.merges.labels(str(tm.tier)).inc()
            for m, w in enumerate(result.tier_weights, start=1):
                self.metrics.tier_weight.labels(str(m)).set(float(w))
        if result.model is None:  # absorbed (e.g. FedBuff's buffer): published with the next version
            self.pending = pending
            return done(inbound)
        self.pending = []
        self.global_model = result.model
        self.version += 1
        self._remember(self.version, result.model)
        names = self.names or [layer.name for layer in tm.layers]
        out = GlobalModel(
            id=f"g{self.version}",
            version=self.version,
            tier=tm.tier,
            tier_round=tm.round,
            merged=tuple(pending),
            tier_rounds=tuple(self.rounds),
            tier_counts=tuple(self.counts),
            tier_weights=tuple(float(w) for w in result.tier_weights),
            created_at=now,
            layers=encode_model(result.model, names, self.cfg.codec, self.cfg.precision),
            **self.totals,
        )
        if self.metrics:
            self.metrics.version.set(self.version)
        return done(inbound, Outgoing(topology.GLOBAL, "", out))

    def _remember(self, version: int, model: Weights) -> None:
        self.history[version] = model
        while len(self.history) > HISTORY:
            self.history.popitem(last=False)
