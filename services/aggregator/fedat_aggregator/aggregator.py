"""The global aggregator: merges every tier-model event, as it arrives, into a new global model (or buffers it).

Its whole memory is one `AggregatorState` value (models, counts, versions, the strategy's state), which the
transport saves before each new version leaves: a restarted aggregator continues the same version sequence.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from fedat.fl.aggregate import Weights
from fedat.fl.strategies import STATE_TYPES, CrossTier, Strategy
from fedat.protocol import ids, topology
from fedat.protocol.service import Effects, Inbound, Observation, Outgoing, Reactive, Reject, Subscription, done
from fedat.protocol.statecodec import StateCodec
from fedat.protocol.wire import GlobalModel, TierModel, decode_model, encode_model

# Rounds of one tier remembered individually above the all-merged watermark; beyond that the oldest gap is given up.
MERGED_MEMORY = 1024

# Observation names (mapped to Prometheus by fedat_aggregator.metrics).
MERGES, DUPLICATES, WEIGHT, VERSION, CREATED = "merge", "duplicate", "weight", "version", "created"
STALENESS, BYTES_UP, BYTES_DOWN = "staleness", "bytes_up", "bytes_down"


@dataclass(frozen=True)
class AggregatorConfig:
    """Cross-tier merge settings."""

    num_tiers: int = 5
    codec: str = "polyline"
    precision: int = 4


@dataclass(frozen=True)
class Merged:
    """The rounds of one tier merged so far: every round below `below`, and those in `above`."""

    below: int = 1
    above: frozenset[int] = frozenset()

    def __contains__(self, number: int) -> bool:
        return number < self.below or number in self.above

    def add(self, number: int) -> Merged:
        """With `number` merged too (rounds may finish out of order; the watermark rises over every closed gap)."""
        above, below = self.above | {number}, self.below
        while below in above:
            above, below = above - {below}, below + 1
        if len(above) > MERGED_MEMORY:  # a round that never came: stop waiting for it
            below = sorted(above)[len(above) - MERGED_MEMORY]
            above = frozenset(r for r in above if r >= below)
        return Merged(below, frozenset(above))


@dataclass(frozen=True)
class Totals:
    """Running totals over every merged tier model (published with each global version)."""

    bytes_up: int = 0
    bytes_down: int = 0
    late: int = 0
    updates: int = 0


@dataclass(frozen=True)
class AggregatorState:
    """Everything the aggregator must not forget."""

    tier_models: tuple[Weights | None, ...]  # each tier's latest model (index 0 = fastest), if the strategy reads them
    counts: tuple[int, ...]  # T_m: tier models merged per tier
    rounds: tuple[int, ...]  # highest merged round per tier
    merged: tuple[Merged, ...]  # which rounds of each tier are merged (a copy is never merged twice)
    version: int = 0
    names: tuple[str, ...] = ()  # layer names, from the seed model
    global_model: Weights | None = None  # the current version's; None until the seed or the first arrival
    history: Mapping[int, Weights] = field(default_factory=dict)  # recent versions, for strategies that need bases
    strategy_state: object = None  # the strategy's, from its last merge
    pending: tuple[tuple[int, int], ...] = ()  # (tier, round) absorbed since the last published version
    totals: Totals = Totals()


class Aggregator(Reactive):
    """Asynchronous cross-tier merge; a tier round is merged at most once."""

    name = "aggregator"
    codec = StateCodec(1, (AggregatorState, Merged, Totals, *STATE_TYPES))

    def __init__(self, cfg: AggregatorConfig, strategy: Strategy):
        self.cfg, self.strategy = cfg, strategy

    def initial(self) -> AggregatorState:
        """No model, no count."""
        m = self.cfg.num_tiers
        return AggregatorState((None,) * m, (0,) * m, (0,) * m, (Merged(),) * m)

    def subscriptions(self) -> dict[str, Subscription]:
        """Tier models to merge; global models to adopt the seed (version 0)."""
        return {
            topology.AGGREGATOR_TIER_MODELS: Subscription(TierModel, self.on_tier_model),
            topology.AGGREGATOR_GLOBAL: Subscription(GlobalModel, self.on_global),
        }

    def on_global(self, state: AggregatorState, inbound: Inbound, now: float, held) -> tuple[AggregatorState, Effects]:
        """Adopt the seed model's layer names and weights; our own versions come back here too and are ignored."""
        g: GlobalModel = inbound.message
        if g.version != 0 or state.names:
            return state, done(inbound)
        model = decode_model(g.layers)
        state = replace(
            state,
            names=tuple(layer.name for layer in g.layers),
            global_model=model,
            history=self._remember(state.history, 0, model),
        )
        return state, done(inbound)

    def on_tier_model(
        self, state: AggregatorState, inbound: Inbound, now: float, held
    ) -> tuple[AggregatorState, Effects]:
        """Merge a tier model (or absorb it, for buffering strategies) and publish the next version."""
        tm: TierModel = inbound.message
        if not 1 <= tm.tier <= self.cfg.num_tiers:
            raise Reject(f"tier-model {tm.id}: tier {tm.tier} outside 1..{self.cfg.num_tiers}")
        i = tm.tier - 1
        if tm.round in state.merged[i]:
            return state, done(inbound) + Effects(observe=(Observation(DUPLICATES, tm.tier),))
        model = decode_model(tm.layers)
        reference = state.global_model or next((w for w in state.tier_models if w is not None), None)
        if reference is not None and [a.shape for a in model] != [a.shape for a in reference]:
            raise Reject(f"tier-model {tm.id}: layer shapes differ from the global model's")
        # A strategy that reads only the arrival gets only the arrival, and the state keeps no tier model for it.
        kept = state.tier_models if self.strategy.reads_every_tier else (None,) * len(state.tier_models)
        tier_models = _set(kept, i, model)
        counts = _set(state.counts, i, state.counts[i] + 1)
        pending = (*state.pending, (tm.tier, tm.round))
        view = CrossTier(
            state.global_model,
            tier_models,
            counts,
            i,
            state.version - tm.base_version,
            base_model=state.history.get(tm.base_version),
            clients=tm.clients,
            n_samples=tm.n_samples,
            state=state.strategy_state,
            pending=len(pending),
        )
        result = self.strategy.merge_global(view)
        t = state.totals
        state = replace(
            state,
            tier_models=tier_models if self.strategy.reads_every_tier else kept,
            counts=counts,
            # concurrent rounds of one tier may finish out of order
            rounds=_set(state.rounds, i, max(state.rounds[i], tm.round)),
            merged=_set(state.merged, i, state.merged[i].add(tm.round)),
            strategy_state=result.state,
            totals=Totals(
                t.bytes_up + tm.bytes_up, t.bytes_down + tm.bytes_down, t.late + tm.late, t.updates + len(tm.clients)
            ),
        )
        observed = (
            Observation(MERGES, tm.tier),
            Observation(STALENESS, tm.tier, state.version - tm.base_version),
            Observation(BYTES_UP, tm.tier, tm.bytes_up),
            Observation(BYTES_DOWN, tm.tier, tm.bytes_down),
        ) + tuple(Observation(WEIGHT, m, float(w)) for m, w in enumerate(result.tier_weights, start=1))
        if result.model is None:  # absorbed (e.g. FedBuff's buffer): published with the next version
            return replace(state, pending=pending), done(inbound) + Effects(observe=observed)
        version = state.version + 1
        state = replace(
            state,
            version=version,
            global_model=result.model,
            history=self._remember(state.history, version, result.model),
            pending=(),
        )
        out = GlobalModel(
            id=ids.global_model(version),
            version=version,
            tier=tm.tier,
            tier_round=tm.round,
            merged=pending,
            tier_rounds=state.rounds,
            tier_counts=state.counts,
            tier_weights=tuple(float(w) for w in result.tier_weights),
            created_at=now,
            layers=encode_model(
                result.model,
                list(state.names or [layer.name for layer in tm.layers]),
                self.cfg.codec,
                self.cfg.precision,
            ),
            bytes_up=state.totals.bytes_up,
            bytes_down=state.totals.bytes_down,
            late=state.totals.late,
            updates=state.totals.updates,
        )
        observed += (Observation(VERSION, 0, version), Observation(CREATED, 0, now))
        return state, done(inbound, Outgoing(topology.GLOBAL, "", out)) + Effects(observe=observed)

    def _remember(self, history: Mapping[int, Weights], version: int, model: Weights) -> dict[int, Weights]:
        """The versions a strategy may still need as an arrival's base (its `history`, newest kept)."""
        keep = self.strategy.history
        if keep <= 0:
            return {}
        kept = {v: w for v, w in history.items() if v > version - keep}
        kept[version] = model
        return kept


def _set(values: tuple, i: int, value) -> tuple:
    return (*values[:i], value, *values[i + 1 :])
