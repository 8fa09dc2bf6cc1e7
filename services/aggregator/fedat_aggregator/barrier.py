"""The tier barrier: runs each tier's synchronous rounds and emits one tier-model event per closed round.

A round's life is explicit (`Phase`): it is COLLECTING from when its tasks go out until it closes — when every
selected client has answered, or at the deadline with at least `min_clients` answers (below that, the missing slots
are re-issued to fresh clients of the tier); it is then CLOSED (its tier model is out) until a global model lists
it as merged, and MERGED after that, remembered for a while only to recognise copies and late answers.

The round's updates are held unacked while it collects (the broker is their durable store); they are deliveries,
so the transport keeps them and hands them in as `held`. Everything else is the `BarrierState` value, saved by the
transport before any task or tier model leaves, so a restarted barrier knows every round it ever opened. An update
counts from max(received, not_before). An answer after its round closed is acked and reported to the profiler
with its real latency: it is a straggler, not a malformed message.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from fedat.errors import ConfigError
from fedat.fl.strategies import Strategy, TierStats
from fedat.protocol import ids, topology
from fedat.protocol.codec import CODECS
from fedat.protocol.service import NOTHING, Effects, Held, Inbound, Observation, Outgoing, Reject, Subscription, done
from fedat.protocol.statecodec import StateCodec
from fedat.protocol.wire import (
    Evaluation,
    GlobalModel,
    Layer,
    RoundReport,
    TierAssignment,
    TierModel,
    TrainTask,
    Update,
    WireError,
    decode_model,
    encode_against,
    encode_model,
    model_bytes,
    relative,
)

# Merged rounds remembered per tier, to ack copies and late answers of them; older ones are "stale".
MERGED_MEMORY = 64

# Observation names (mapped to Prometheus by fedat_aggregator.metrics).
OPENED, CLOSED_OBS, ROUND_SECONDS, MERGED_UPDATES, DUPLICATES, REISSUES, LATE = (
    "opened",
    "closed",
    "round_seconds",
    "merged_updates",
    "duplicate",
    "reissue",
    "late",
)


@dataclass(frozen=True)
class BarrierConfig:
    """Round parameters of the tiers this barrier runs."""

    tiers: tuple[int, ...] = (1, 2, 3, 4, 5)
    clients_per_round: int = 10
    min_clients: int = 5
    deadline_factor: float = 3.0
    min_deadline: float = 5.0
    epochs: int = 3
    batch_size: int = 10
    learning_rate: float = 1e-3
    prox_lambda: float = 0.4
    straggler_fraction: float = 0.0  # FedProx: the slowest share of a round's clients run 1..epochs-1 epochs
    codec: str = "polyline"
    precision: int = 4
    tier_codec: str = "raw"
    seed: int = 0
    # After a (re)connect the broker redelivers held updates at once; a deadline that passed meanwhile waits this
    # long for them instead of re-issuing the round to fresh clients.
    redelivery_grace: float = 2.0
    # Real clients (FEDAT_CLIENTS=real): each task goes to its client's own queue (key `client-<k>`), not to the
    # tier's queue that a pool of workers shares. Who is selected does not change.
    real_clients: bool = False
    # Real clients only: a task goes against the global version the client is known to keep (the base of its last
    # answer), losslessly (`wire.encode_against`), rather than whole; the barrier keeps the `download_bases` newest
    # such versions. A pool worker keeps no model, so its tasks always carry the model whole.
    relative_downloads: bool = True
    download_bases: int = 6


class Phase(enum.Enum):
    """Where a round is in its life."""

    COLLECTING = "collecting"  # tasks are out; answers are held until it closes
    CLOSED = "closed"  # its tier model is published; waiting for a global model that merges it
    MERGED = "merged"  # a global model merged it; remembered only to recognise copies and late answers


@dataclass(frozen=True)
class Round:
    """One tier round. `tasks` holds every client asked (re-issues add to it)."""

    tier: int
    number: int
    base_version: int
    opened_at: float
    deadline: float
    tasks: Mapping[int, str]  # client -> task id
    target: int  # answers wanted: the number of clients first selected
    bytes_down: int = 0
    reissues: int = 0
    phase: Phase = Phase.COLLECTING
    included: tuple[int, ...] = ()  # clients merged into its tier model
    answered: tuple[int, ...] = ()  # clients whose answer came but counted only after the close

    def awaited(self) -> tuple[int, ...]:
        """Clients asked that have not answered (after the close: whose answer would be a late one)."""
        return tuple(sorted(c for c in self.tasks if c not in self.included and c not in self.answered))


@dataclass(frozen=True)
class BarrierState:
    """Everything the barrier must not forget; the deliveries it holds are the transport's."""

    assignment: TierAssignment | None = None
    model: GlobalModel | None = None
    rounds: Mapping[tuple[int, int], Round] = field(default_factory=dict)
    next_round: Mapping[int, int] = field(default_factory=dict)  # number of each tier's next round
    closed: Mapping[int, int] = field(default_factory=dict)  # rounds of each tier closed so far
    tier_loss: Mapping[int, float] = field(default_factory=dict)  # training loss of each tier's last closed round
    tier_accuracy: Mapping[int, float] = field(default_factory=dict)  # mean test accuracy of each tier's clients
    # With a relative codec: the older global models that collecting rounds started from, by version. Their tasks
    # carry them and their answers are decoded against them; `model` itself is never repeated here. (Added last
    # with a default, so a state saved before it existed still reads.)
    bases: Mapping[int, GlobalModel] = field(default_factory=dict)
    # Real clients: the global version each is known to keep, the base of its newest answer; forgotten when it
    # leaves a task unanswered (it may have restarted and kept nothing). Tasks are sent against it.
    keeps: Mapping[int, int] = field(default_factory=dict)
    # Real clients: the global models they may keep, by version, decoded (arrays: a checkpoint carries each once).
    kept: Mapping[int, tuple[np.ndarray, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class _Arrival:
    update: Update
    tag: int
    effective: float
    weights: list[np.ndarray]


def _with(mapping: Mapping, key, value) -> dict:
    return {**mapping, key: value}


class Barrier:
    """Intra-tier synchronous rounds for a set of tiers."""

    name = "barrier"
    codec = StateCodec(1, (BarrierState, Round, Phase))

    def __init__(self, cfg: BarrierConfig, strategy: Strategy):
        self.cfg, self.strategy = cfg, strategy
        if cfg.codec not in CODECS:
            raise ConfigError(f"FEDAT_CODEC={cfg.codec!r} is not one of {sorted(CODECS)}")
        self.relative = CODECS[cfg.codec].relative
        self.downloads = cfg.real_clients and cfg.relative_downloads
        # Decoded base models by version: derived from the state (and checked against it), so only a cache.
        self._decoded: dict[int, tuple[tuple[Layer, ...], list[np.ndarray]]] = {}
        # A model sent against a kept version, by (version, kept version): many clients keep the same one.
        self._against: dict[tuple[int, int], tuple[Layer, ...] | None] = {}

    def initial(self) -> BarrierState:
        """No assignment, no model, no round."""
        return BarrierState()

    def subscriptions(self) -> dict[str, Subscription]:
        """Updates of our tiers, global models, tier assignments, evaluations (TiFL)."""
        subs: dict[str, Subscription] = {
            topology.barrier_queue(m): Subscription(Update, self.on_update) for m in self.cfg.tiers
        }
        subs[topology.BARRIER_GLOBAL] = Subscription(GlobalModel, self.on_global)
        subs[topology.BARRIER_ASSIGNMENTS] = Subscription(TierAssignment, self.on_assignment)
        subs[topology.BARRIER_EVALUATIONS] = Subscription(Evaluation, self.on_evaluation)
        return subs

    def on_start(self, state: BarrierState, now: float) -> tuple[BarrierState, Effects]:
        """After a (re)start: re-arm collecting rounds' deadlines (their updates come back), schedule idle tiers."""
        grace = self.cfg.redelivery_grace
        timers = tuple(
            (max(r.deadline - now, grace), ids.round_timer(ids.DEADLINE, r.tier, r.number))
            for r in state.rounds.values()
            if r.phase is Phase.COLLECTING
        )
        state, effects = self._schedule(state, now)
        return state, Effects(timers=timers) + effects

    # --- inputs -------------------------------------------------------------------------------------------------
    def on_evaluation(self, state: BarrierState, inbound: Inbound, now: float, held) -> tuple[BarrierState, Effects]:
        """Keep each tier's mean test accuracy (TiFL ranks tiers by it)."""
        ev: Evaluation = inbound.message
        if state.assignment is None:
            return state, done(inbound)
        accuracy = dict(state.tier_accuracy)
        for m, clients in enumerate(state.assignment.tiers, start=1):
            scores = [ev.accuracies[c] for c in clients if c < len(ev.accuracies)]
            if scores:
                accuracy[m] = float(np.mean(scores))
        return replace(state, tier_accuracy=accuracy), done(inbound)

    def on_assignment(self, state: BarrierState, inbound: Inbound, now: float, held) -> tuple[BarrierState, Effects]:
        """Adopt a newer tier assignment for the rounds opened from now on."""
        msg: TierAssignment = inbound.message
        if state.assignment is not None and msg.epoch <= state.assignment.epoch:
            return state, done(inbound)
        if len(msg.tiers) < max(self.cfg.tiers):
            raise Reject(f"tier assignment {msg.epoch} has {len(msg.tiers)} tiers, this barrier runs {self.cfg.tiers}")
        # The tiers' members changed: rank them by training loss until the next evaluation.
        state = replace(state, assignment=msg, tier_accuracy={})
        state, effects = self._schedule(state, now)
        return state, done(inbound) + effects

    def on_global(self, state: BarrierState, inbound: Inbound, now: float, held) -> tuple[BarrierState, Effects]:
        """Adopt a newer global model; the rounds it merged are done, and their tiers may start the next."""
        msg: GlobalModel = inbound.message
        if state.model is not None and msg.version <= state.model.version:
            return state, done(inbound)
        next_round = dict(state.next_round)
        for m, r in enumerate(msg.tier_rounds, start=1):
            next_round[m] = max(next_round.get(m, 1), r + 1)
        rounds = dict(state.rounds)
        for key in msg.merged:
            if key in rounds and rounds[key].phase is Phase.CLOSED:
                rounds[key] = replace(rounds[key], phase=Phase.MERGED)
        bases, kept = state.bases, state.kept
        if self.relative and state.model is not None:
            # Rounds still collecting from the model being replaced need it to decode their answers.
            bases = {**bases, state.model.version: state.model}
        if self.downloads and state.model is not None and state.model.version not in kept:
            # Real clients that answer a round of it keep it, and get their next task against it.
            decoded = self._decoded_model(state.model)
            if decoded is not None:
                kept = {**kept, state.model.version: tuple(decoded)}
        state = replace(state, model=msg, rounds=_forget_old(rounds), next_round=next_round, kept=kept)
        state = self._keep_bases(replace(state, bases=bases))
        state, effects = self._schedule(state, now)
        return state, done(inbound) + effects

    def on_update(self, state: BarrierState, inbound: Inbound, now: float, held) -> tuple[BarrierState, Effects]:
        """Hold a round's answer until the round closes; ack copies; report late answers."""
        u: Update = inbound.message
        rnd = state.rounds.get((u.tier, u.round))
        if rnd is None:
            if u.round < state.next_round.get(u.tier, 1):
                raise Reject(f"stale round: tier {u.tier} round {u.round} closed long ago")
            raise Reject(f"update {u.id}: tier {u.tier} has no round {u.round}")
        if rnd.tasks.get(u.client) != u.task_id:
            raise Reject(f"client {u.client} was not given task {u.task_id} in tier {u.tier} round {u.round}")
        if rnd.phase is not Phase.COLLECTING:
            if u.client in rnd.included or u.client in rnd.answered:
                return state, done(inbound) + _observe(DUPLICATES, u.tier)  # a copy of an answer already counted
            return self._late(state, rnd, inbound, u, now)
        if u.base_version != rnd.base_version:
            raise Reject(
                f"update {u.id} trained on version {u.base_version}, round {rnd.number} used {rnd.base_version}"
            )
        if u.n_samples < 1:
            raise Reject(f"update {u.id}: n_samples must be >= 1, got {u.n_samples}")
        arrivals = _arrivals(rnd, held)
        if u.client in arrivals:
            return state, done(inbound) + _observe(DUPLICATES, u.tier)  # a redelivered copy: counted once
        weights = self._decode_checked(state, rnd, u)
        arrivals[u.client] = _Arrival(u, inbound.tag, max(inbound.received, u.not_before), weights)
        effects = Effects(hold=((inbound.tag, weights),))
        if len(arrivals) < rnd.target:
            return state, effects
        last = max(a.effective for a in arrivals.values())
        if last > now:
            return state, effects + Effects(timers=((last - now, ids.round_timer(ids.CLOSE, rnd.tier, rnd.number)),))
        state, closing = self._close(state, rnd, arrivals, now)
        return state, effects + closing

    def on_timer(self, state: BarrierState, key: str, now: float, held) -> tuple[BarrierState, Effects]:
        """Round deadlines and deferred closes."""
        t = ids.parse_round_timer(key)
        rnd = state.rounds.get((t.tier, t.round))
        if rnd is None or rnd.phase is not Phase.COLLECTING:
            return state, NOTHING  # closed meanwhile: the timer is stale
        arrivals = _arrivals(rnd, held)
        if t.kind == ids.CLOSE:
            if len(arrivals) < rnd.target:
                return state, NOTHING  # reconnected meanwhile: the redelivered answers re-arm it
            # Timers may fire a hair early: the round closes at its last arrival.
            return self._close(state, rnd, arrivals, max([now] + [a.effective for a in arrivals.values()]))
        if now < rnd.deadline:
            return state, NOTHING  # a timer of an earlier deadline (re-issues move it)
        arrived = [a for a in arrivals.values() if a.effective <= now]
        if len(arrived) >= min(self.cfg.min_clients, rnd.target):
            return self._close(state, rnd, arrivals, now)
        return self._reissue(state, rnd, len(arrivals), now)

    # --- rounds -------------------------------------------------------------------------------------------------
    def _schedule(self, state: BarrierState, now: float) -> tuple[BarrierState, Effects]:
        """Ask the strategy which tiers start a round now, and open them."""
        if state.assignment is None or state.model is None:
            return state, NOTHING
        unmerged = [r for r in state.rounds.values() if r.phase is not Phase.MERGED]
        busy = {m: sum(1 for r in unmerged if r.tier == m) for m in self.cfg.tiers}
        collecting = [r.tier for r in unmerged if r.phase is Phase.COLLECTING]
        n = len(state.assignment.tiers)
        stats = TierStats(
            rounds=tuple(state.closed.get(m, 0) for m in range(1, n + 1)),
            losses=tuple(state.tier_loss.get(m, float("inf")) for m in range(1, n + 1)),
            open=tuple(collecting.count(m) for m in range(1, n + 1)),
            accuracies=tuple(state.tier_accuracy.get(m, float("nan")) for m in range(1, n + 1)),
        )
        effects = NOTHING
        for m in self.strategy.schedule(busy, stats, self._rng("schedule", sum(state.next_round.values()))):
            state, opened = self._open(state, m, now)
            effects = effects + opened
        return state, effects

    def _open(self, state: BarrierState, tier: int, now: float) -> tuple[BarrierState, Effects]:
        busy = _training(state, tier)
        candidates = [c for c in state.assignment.tiers[tier - 1] if c not in busy]
        if not candidates:
            return state, NOTHING
        number = state.next_round.get(tier, 1)
        clients = self.strategy.select_clients(
            candidates, self.cfg.clients_per_round, self._rng("select", tier, number)
        )
        rnd = Round(tier, number, state.model.version, now, 0.0, {}, target=len(clients))
        state = replace(state, next_round=_with(state.next_round, tier, number + 1))
        state, effects = self._dispatch(state, rnd, clients, now)
        return state, effects + _observe(OPENED, tier)

    def _dispatch(
        self, state: BarrierState, rnd: Round, clients: list[int], now: float
    ) -> tuple[BarrierState, Effects]:
        latencies = state.assignment.latencies
        slowest = max((latencies.get(c, 0.0) for c in clients), default=0.0)
        deadline = now + max(self.cfg.min_deadline, self.cfg.deadline_factor * slowest)
        epochs = self._local_epochs(rnd, clients, latencies)
        tasks = [self._task(state, rnd, c, epochs[c], now) for c in clients]
        rnd = replace(
            rnd,
            deadline=deadline,
            tasks={**rnd.tasks, **{t.client: t.id for t in tasks}},
            bytes_down=rnd.bytes_down + sum(model_bytes(t.layers) for t in tasks),
        )
        state = replace(state, rounds=_with(state.rounds, (rnd.tier, rnd.number), rnd))
        return state, Effects(
            publish=tuple(Outgoing(topology.TRAIN, self._route(t), t) for t in tasks),
            timers=((deadline - now, ids.round_timer(ids.DEADLINE, rnd.tier, rnd.number)),),
        )

    def _route(self, task: TrainTask) -> str:
        """The routing key of a task on the train exchange: its client's own queue, or its tier's shared one."""
        return topology.client_key(task.client) if self.cfg.real_clients else topology.tier_key(task.tier)

    def _local_epochs(self, rnd: Round, clients: list[int], latencies) -> dict[int, int]:
        # FedProx's partial work: its stragglers send what fewer epochs give instead of holding the round up.
        epochs = {c: self.cfg.epochs for c in clients}
        n = int(np.ceil(self.cfg.straggler_fraction * len(clients)))
        if n and self.cfg.epochs > 1:
            rng = self._rng("epochs", rnd.tier, rnd.number, rnd.reissues)
            for c in sorted(clients, key=lambda c: latencies.get(c, 0.0))[-n:]:
                epochs[c] = int(rng.integers(1, self.cfg.epochs))
        return epochs

    def _task(self, state: BarrierState, rnd: Round, client: int, epochs: int, now: float) -> TrainTask:
        c = self.cfg
        # A relative codec's answer is decoded against the round's model, so a re-issue must carry that model.
        model = _round_model(state, rnd.base_version)
        version_kept = state.keeps.get(client, -1) if self.downloads else -1
        layers = self._sent_against(state, model, version_kept) if version_kept >= 0 else None
        return TrainTask(
            id=ids.task(rnd.tier, rnd.number, client, rnd.base_version),
            client=client,
            tier=rnd.tier,
            round=rnd.number,
            version=rnd.base_version,
            epochs=epochs,
            batch_size=c.batch_size,
            learning_rate=c.learning_rate,
            prox_lambda=c.prox_lambda,
            codec=c.codec,
            precision=c.precision,
            sent_at=now,
            layers=model.layers if layers is None else layers,
            run_started_at=state.assignment.run_started_at,
            relative_to=-1 if layers is None else version_kept,
        )

    def _sent_against(self, state: BarrierState, model: GlobalModel, version_kept: int) -> tuple[Layer, ...] | None:
        """`model` as its client gets it against `version_kept`, the version it keeps; None: send it whole."""
        if state.model is not None and state.model.version == version_kept:
            base = self._decoded_model(state.model)
        else:
            base = state.kept.get(version_kept)
        if base is None:
            return None  # no longer kept here
        key = (model.version, version_kept)
        if key not in self._against:
            whole = self._decoded_model(model)
            try:
                layers = None if whole is None else encode_against(model.layers, whole, base)
            except WireError:
                layers = None  # a model this barrier cannot re-encode goes whole
            if len(self._against) >= 16:
                self._against.pop(next(iter(self._against)))
            self._against[key] = layers
        layers = self._against[key]
        if layers is None or model_bytes(layers) >= model_bytes(model.layers):
            return None
        return layers

    def _keep_bases(self, state: BarrierState) -> BarrierState:
        """Drop the older models that no collecting round started from (the current one is `model`); for real
        clients, keep the decoded models of those rounds and of the `download_bases` newest versions clients keep."""
        wanted = {r.base_version for r in state.rounds.values() if r.phase is Phase.COLLECTING}
        wanted.discard(state.model.version if state.model is not None else -1)
        if not wanted >= state.bases.keys():
            state = replace(state, bases={v: m for v, m in state.bases.items() if v in wanted})
        if self.downloads:
            wanted |= set(sorted(set(state.keeps.values()))[-self.cfg.download_bases :])
            if not wanted >= state.kept.keys():
                state = replace(state, kept={v: m for v, m in state.kept.items() if v in wanted})
        return state

    def _decoded_model(self, model: GlobalModel) -> list[np.ndarray] | None:
        """A global model as its receivers decode it; None if it cannot be (then it is only ever sent whole)."""
        try:
            return self._decoded_base(model)
        except Reject:
            return None

    def _reissue(self, state: BarrierState, rnd: Round, answers: int, now: float) -> tuple[BarrierState, Effects]:
        # The stragglers keep their tasks: an answer from them still counts while the round collects.
        busy = _training(state, rnd.tier)  # this round's clients, and those of the tier's other collecting rounds
        fresh = [c for c in state.assignment.tiers[rnd.tier - 1] if c not in busy]
        rnd = replace(rnd, reissues=rnd.reissues + 1)
        missing = rnd.target - answers
        replacements = (
            self.strategy.select_clients(fresh, missing, self._rng("select", rnd.tier, rnd.number, rnd.reissues))
            if fresh and missing > 0
            else []
        )
        if not replacements:
            # Nobody left to ask: wait another deadline for the stragglers.
            rnd = replace(rnd, deadline=now + self.cfg.min_deadline)
            state = replace(state, rounds=_with(state.rounds, (rnd.tier, rnd.number), rnd))
            timer = (self.cfg.min_deadline, ids.round_timer(ids.DEADLINE, rnd.tier, rnd.number))
            return state, Effects(timers=(timer,)) + _observe(REISSUES, rnd.tier)
        state, effects = self._dispatch(state, rnd, replacements, now)
        return state, effects + _observe(REISSUES, rnd.tier)

    def _close(
        self, state: BarrierState, rnd: Round, arrivals: Mapping[int, _Arrival], now: float
    ) -> tuple[BarrierState, Effects]:
        included = sorted((a for a in arrivals.values() if a.effective <= now), key=lambda a: a.update.client)
        after = sorted(c for c, a in arrivals.items() if a.effective > now)
        merged = self.strategy.merge_tier([a.weights for a in included], [a.update.n_samples for a in included])
        names = [layer.name for layer in included[0].update.layers]
        n = sum(a.update.n_samples for a in included)
        tier_model = TierModel(
            id=ids.tier_model(rnd.tier, rnd.number),
            tier=rnd.tier,
            round=rnd.number,
            base_version=rnd.base_version,
            n_samples=n,
            clients=tuple(a.update.client for a in included),
            bytes_up=sum(model_bytes(a.update.layers) for a in included),
            bytes_down=rnd.bytes_down,
            late=sum(a.update.late for a in included),
            closed_at=now,
            layers=encode_model(merged, names, self.cfg.tier_codec, self.cfg.precision),
        )
        closed = replace(rnd, phase=Phase.CLOSED, included=tier_model.clients, answered=tuple(after))
        report = RoundReport(
            id=ids.round_report(rnd.tier, rnd.number),
            tier=rnd.tier,
            round=rnd.number,
            # Answers that came in but count only later (not_before past the close) are real latencies too.
            latencies={a.update.client: a.effective - a.update.dispatched_at for a in arrivals.values()},
            missing=closed.awaited(),
            waited=now - rnd.opened_at,
            closed_at=now,
        )
        state = replace(
            state,
            rounds=_with(state.rounds, (rnd.tier, rnd.number), closed),
            closed=_with(state.closed, rnd.tier, state.closed.get(rnd.tier, 0) + 1),
            tier_loss=_with(state.tier_loss, rnd.tier, sum(a.update.loss * a.update.n_samples for a in included) / n),
        )
        state = self._note_keeps(state, {c: rnd.base_version for c in arrivals}, closed.awaited())
        state = self._keep_bases(state)
        effects = Effects(
            publish=(
                Outgoing(topology.TIER_MODELS, "", tier_model),
                Outgoing(topology.EVENTS, topology.ROUND_REPORT_KEY, report),
            ),
            ack=tuple(a.tag for a in arrivals.values()),
            observe=(
                Observation(CLOSED_OBS, rnd.tier),
                Observation(ROUND_SECONDS, rnd.tier, now - rnd.opened_at),
                Observation(MERGED_UPDATES, rnd.tier, len(included)),
            ),
        )
        state, opened = self._schedule(state, now)  # a strategy may restart clients on close (FedBuff)
        return state, effects + opened

    def _late(
        self, state: BarrierState, rnd: Round, inbound: Inbound, u: Update, now: float
    ) -> tuple[BarrierState, Effects]:
        rnd = replace(rnd, answered=(*rnd.answered, u.client))
        state = self._note_keeps(state, {u.client: rnd.base_version}, ())
        report = RoundReport(
            id=ids.late_report(u.id),
            tier=u.tier,
            round=u.round,
            latencies={u.client: max(now, u.not_before) - u.dispatched_at},
            missing=(),
            waited=0.0,
            closed_at=now,
        )
        state = replace(state, rounds=_with(state.rounds, (rnd.tier, rnd.number), rnd))
        return state, done(inbound, Outgoing(topology.EVENTS, topology.ROUND_REPORT_KEY, report)) + _observe(
            LATE, u.tier
        )

    def _note_keeps(self, state: BarrierState, answered: Mapping[int, int], silent: tuple[int, ...]) -> BarrierState:
        """Real clients that answered keep their task's version (the newest they answered); silent ones, none known."""
        if not self.downloads:
            return state
        keeps = {c: v for c, v in state.keeps.items() if c not in silent}
        for c, v in answered.items():
            keeps[c] = max(v, keeps.get(c, -1))
        return replace(state, keeps=keeps)

    def _decode_checked(self, state: BarrierState, rnd: Round, u: Update) -> list[np.ndarray]:
        base = _round_model(state, rnd.base_version)
        want = [layer.shape for layer in base.layers]
        got = [layer.shape for layer in u.layers]
        # Shapes first: a layer that claims more values than the model has is refused before it is inflated.
        if got != want:
            raise Reject(f"update {u.id}: layer shapes {got} do not match the global model's {want}")
        bases = None
        if relative(u.layers):
            if base.version != rnd.base_version:
                raise Reject(f"update {u.id}: the barrier no longer holds version {rnd.base_version}, its base")
            bases = self._decoded_base(base)
        try:
            weights = decode_model(u.layers, bases)
        except WireError as exc:
            raise Reject(f"update {u.id}: {exc}") from None
        for layer, w in zip(u.layers, weights, strict=True):
            if not np.isfinite(w).all():
                raise Reject(f"update {u.id}: layer '{layer.name}' contains NaN or inf")
        return weights

    def _decoded_base(self, model: GlobalModel) -> list[np.ndarray]:
        """The model exactly as the round's workers decoded it: the base their deltas were computed against."""
        hit = self._decoded.get(model.version)
        if hit is not None and hit[0] == model.layers:
            return hit[1]
        try:
            arrays = decode_model(model.layers)
        except WireError as exc:  # a model this barrier accepted earlier: not the update's fault, but say so
            raise Reject(f"base model version {model.version} cannot be decoded: {exc}") from None
        if len(self._decoded) >= 8:
            self._decoded.pop(next(iter(self._decoded)))
        self._decoded[model.version] = (model.layers, arrays)
        return arrays

    def _rng(self, *key) -> np.random.Generator:
        # Every random choice is drawn from its own seed (round, re-issue, purpose): a restored barrier, or a replay,
        # draws exactly the same clients, and the state needs no generator.
        words = [self.cfg.seed, 0xBA77] + [
            int.from_bytes(k.encode(), "little") if isinstance(k, str) else k for k in key
        ]
        return np.random.default_rng(words)


def _arrivals(rnd: Round, held: Mapping[int, Held]) -> dict[int, _Arrival]:
    """The round's held answers by client (the first delivery of each)."""
    out: dict[int, _Arrival] = {}
    for h in held.values():
        u = h.inbound.message
        if isinstance(u, Update) and (u.tier, u.round) == (rnd.tier, rnd.number) and u.client not in out:
            out[u.client] = _Arrival(u, h.inbound.tag, max(h.inbound.received, u.not_before), h.note)
    return out


def _round_model(state: BarrierState, version: int) -> GlobalModel:
    """The global model a round started from, when the barrier keeps it; else the newest (without a relative codec
    the barrier keeps no older model, and a re-issue carries the newest)."""
    return state.bases.get(version, state.model)


def _training(state: BarrierState, tier: int) -> set[int]:
    """Clients of `tier` with a task in one of its collecting rounds."""
    return {c for r in state.rounds.values() if r.tier == tier and r.phase is Phase.COLLECTING for c in r.tasks}


def _forget_old(rounds: dict[tuple[int, int], Round]) -> dict[tuple[int, int], Round]:
    """Keep the newest MERGED_MEMORY merged rounds of each tier."""
    merged: dict[int, list[int]] = {}
    for (tier, number), r in rounds.items():
        if r.phase is Phase.MERGED:
            merged.setdefault(tier, []).append(number)
    drop = {(t, n) for t, numbers in merged.items() for n in sorted(numbers)[:-MERGED_MEMORY]}
    return {k: r for k, r in rounds.items() if k not in drop} if drop else rounds


def _observe(name: str, tier: int) -> Effects:
    return Effects(observe=(Observation(name, tier),))
