"""The tier barrier: runs each tier's synchronous rounds and emits one tier-model event per closed round.

A round opens when the strategy schedules it (FedAT: when the tier's previous round has been merged into a new
global model, or at the seed model; FedBuff: as soon as a round closes). The strategy picks clients of the tier;
the barrier publishes their train tasks carrying the compressed global model, and holds every update unacked
(the broker is the round's durable store) until the round closes — when every selected client has answered, or
at the deadline with at least `min_clients`. Below that minimum the
missing slots are re-issued to fresh clients of the tier. An update counts from max(received, not_before).
An answer that comes after its round closed is acked and reported to the profiler with its real latency: it is
a straggler, not a malformed message.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from fedat import topology
from fedat.service import NOTHING, Effects, Inbound, Outgoing, Reject, done
from fedat.wire import (
    Evaluation,
    GlobalModel,
    RoundReport,
    TierAssignment,
    TierModel,
    TrainTask,
    Update,
    WireError,
    decode_model,
    encode_model,
    model_bytes,
)
from fedat_aggregator.strategy import Strategy, TierStats

MERGED_MEMORY = 10_000


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


@dataclass
class _Arrival:
    update: Update
    weights: list[np.ndarray]
    tag: int
    effective: float


@dataclass
class _Round:
    tier: int
    number: int
    base_version: int
    opened_at: float
    deadline: float
    tasks: dict[int, str]  # client -> task id
    arrivals: dict[int, _Arrival] = field(default_factory=dict)
    extra_tags: list[int] = field(default_factory=list)  # duplicates and late answers, acked at close
    target: int = 0  # answers wanted: the number of clients first selected
    bytes_down: int = 0
    reissues: int = 0


class Barrier:
    """Intra-tier synchronous rounds for a set of tiers."""

    name = "barrier"

    def __init__(self, cfg: BarrierConfig, strategy: Strategy, metrics=None):
        self.cfg, self.strategy, self.metrics = cfg, strategy, metrics
        self.rng = np.random.default_rng([cfg.seed, 0xBA77])
        self._reset()

    def _reset(self) -> None:
        self.assignment: TierAssignment | None = None
        self.model: GlobalModel | None = None
        self.next_round: dict[int, int] = {}  # number of each tier's next round
        self.closed: dict[int, int] = {}  # rounds of each tier this barrier closed
        self.tier_loss: dict[int, float] = {}  # training loss of each tier's last closed round
        self.tier_accuracy: dict[int, float] = {}  # mean test accuracy of each tier's clients, latest evaluation
        # Open rounds, and closed ones whose tier model is not merged yet, by (tier, round); a strategy may run
        # several rounds of one tier at once (e.g. FedAsync's concurrent single-client rounds).
        self.rounds: dict[tuple[int, int], _Round] = {}
        self.waiting: list[Inbound] = []  # updates seen before their round was opened
        # Ids of recently merged or late-acked updates: a copy redelivered after its round closed is acked, not
        # rejected, and counted nowhere.
        self.handled: OrderedDict[str, None] = OrderedDict()
        # Task ids of clients that had not answered when their round closed: their answer is a late one.
        self.awaited: OrderedDict[str, None] = OrderedDict()

    def subscriptions(self) -> dict[str, type]:
        """Updates of our tiers, global models, tier assignments."""
        subs: dict[str, type] = {topology.barrier_queue(m): Update for m in self.cfg.tiers}
        subs[topology.BARRIER_GLOBAL] = GlobalModel
        subs[topology.BARRIER_ASSIGNMENTS] = TierAssignment
        subs[topology.BARRIER_EVALUATIONS] = Evaluation
        return subs

    def on_start(self, now: float) -> Effects:
        """After a reconnect: forget held deliveries (the broker redelivers them), keep rounds, re-arm deadlines.

        The assignment and the global model are acked on receipt and kept in memory, since holding them unacked
        for a whole run would trip the broker's consumer_timeout. Recovering them after a process restart is the
        job of the fault-tolerance work, not of reconnects.
        """
        self.waiting = []
        timers = []
        for rnd in self.rounds.values():
            if rnd.tasks is not None:
                rnd.arrivals.clear()
                rnd.extra_tags.clear()
                timers.append((max(0.0, rnd.deadline - now), f"deadline:{rnd.tier}:{rnd.number}"))
        return Effects(timers=tuple(timers))

    # --- inputs -------------------------------------------------------------------------------------------
    def handle(self, inbound: Inbound, now: float) -> Effects:
        """Dispatch by message kind."""
        msg = inbound.message
        if isinstance(msg, TierAssignment):
            return self._on_assignment(inbound, msg, now)
        if isinstance(msg, GlobalModel):
            return self._on_global(inbound, msg, now)
        if isinstance(msg, Evaluation):
            return self._on_evaluation(inbound, msg)
        return self._on_update(inbound, msg, now)

    def _on_evaluation(self, inbound: Inbound, ev: Evaluation) -> Effects:
        if self.assignment is not None:
            for m, clients in enumerate(self.assignment.tiers, start=1):
                scores = [ev.accuracies[c] for c in clients if c < len(ev.accuracies)]
                if scores:
                    self.tier_accuracy[m] = float(np.mean(scores))
        return done(inbound)

    def _on_assignment(self, inbound: Inbound, msg: TierAssignment, now: float) -> Effects:
        if self.assignment is not None and msg.epoch <= self.assignment.epoch:
            return done(inbound)
        if len(msg.tiers) < max(self.cfg.tiers):
            raise Reject(f"tier assignment {msg.epoch} has {len(msg.tiers)} tiers, this barrier runs {self.cfg.tiers}")
        self.assignment = msg
        self.tier_accuracy = {}  # the tiers' members changed: rank by training loss until the next evaluation
        return done(inbound) + self._open_idle_tiers(now)

    def _on_global(self, inbound: Inbound, msg: GlobalModel, now: float) -> Effects:
        if self.model is not None and msg.version <= self.model.version:
            return done(inbound)
        self.model = msg
        for m, r in enumerate(msg.tier_rounds, start=1):
            self.next_round[m] = max(self.next_round.get(m, 1), r + 1)
        effects = done(inbound)
        for key in msg.merged:  # merged: those tiers loop on with the new model
            rnd = self.rounds.pop(key, None)
            if rnd is not None and rnd.tasks is not None:  # superseded after a restart: the merge counted these
                effects = effects + Effects(ack=tuple(a.tag for a in rnd.arrivals.values()) + tuple(rnd.extra_tags))
        return effects + self._open_idle_tiers(now)

    def _on_update(self, inbound: Inbound, u: Update, now: float) -> Effects:
        rnd = self.rounds.get((u.tier, u.round))
        if u.id in self.handled:
            if self.metrics:
                self.metrics.duplicates.labels(str(u.tier)).inc()
            return done(inbound)  # a redelivered copy of an update already merged: idempotent, not stale
        closed = rnd is None or rnd.tasks is None
        if closed and u.task_id in self.awaited:
            return self._late(inbound, u, now)  # even from a client re-tiering dropped since: it did answer
        if self.assignment is not None and not any(u.client in t for t in self.assignment.tiers):
            raise Reject(f"unknown client {u.client}: not in tier assignment {self.assignment.epoch}")
        if rnd is None and u.round >= self.next_round.get(u.tier, 1):
            self.waiting.append(inbound)  # its round is not (re)opened yet, e.g. after a restart
            return NOTHING
        if closed:
            raise Reject(f"stale round: tier {u.tier} round {u.round} is already closed")
        if rnd.tasks.get(u.client) != u.task_id:
            raise Reject(f"client {u.client} was not given task {u.task_id} in tier {u.tier} round {u.round}")
        if u.base_version != rnd.base_version:
            raise Reject(
                f"update {u.id} trained on version {u.base_version}, round {rnd.number} used {rnd.base_version}"
            )
        if u.n_samples < 1:
            raise Reject(f"update {u.id}: n_samples must be >= 1, got {u.n_samples}")
        if u.client in rnd.arrivals:
            rnd.extra_tags.append(inbound.tag)  # a redelivered duplicate: counted once, acked at close
            if self.metrics:
                self.metrics.duplicates.labels(str(u.tier)).inc()
            return NOTHING
        rnd.arrivals[u.client] = _Arrival(u, self._decode_checked(u), inbound.tag, max(now, u.not_before))
        if len(rnd.arrivals) >= rnd.target:
            last = max(a.effective for a in rnd.arrivals.values())
            return (
                self._close(rnd, now)
                if last <= now
                else Effects(timers=((last - now, f"close:{rnd.tier}:{rnd.number}"),))
            )
        return NOTHING

    def _late(self, inbound: Inbound, u: Update, now: float) -> Effects:
        del self.awaited[u.task_id]
        self.handled[u.id] = None
        if self.metrics:
            self.metrics.late_answers.labels(str(u.tier)).inc()
        report = RoundReport(
            id=f"late-{u.id}",
            tier=u.tier,
            round=u.round,
            latencies={u.client: max(now, u.not_before) - u.dispatched_at},
            missing=(),
            waited=0.0,
            closed_at=now,
        )
        return done(inbound, Outgoing(topology.EVENTS, topology.ROUND_REPORT_KEY, report))

    def _decode_checked(self, u: Update) -> list[np.ndarray]:
        want = [layer.shape for layer in self.model.layers]
        got = [layer.shape for layer in u.layers]
        if got != want:
            raise Reject(f"update {u.id}: layer shapes {got} do not match the global model's {want}")
        try:
            weights = decode_model(u.layers)
        except WireError as exc:
            raise Reject(f"update {u.id}: {exc}") from None
        for layer, w in zip(u.layers, weights, strict=True):
            if not np.isfinite(w).all():
                raise Reject(f"update {u.id}: layer '{layer.name}' contains NaN or inf")
        return weights

    def on_timer(self, key: str, now: float) -> Effects:
        """Round deadlines and deferred closes (key 'deadline:<tier>:<round>' or 'close:<tier>:<round>')."""
        what, tier, number = key.split(":")
        rnd = self.rounds.get((int(tier), int(number)))
        if rnd is None or rnd.tasks is None:  # closed or superseded
            return NOTHING
        if what == "close":  # timers may fire a hair early: the round closes at its last arrival
            return self._close(rnd, max([now] + [a.effective for a in rnd.arrivals.values()]))
        arrived = [a for a in rnd.arrivals.values() if a.effective <= now]
        if len(arrived) >= min(self.cfg.min_clients, rnd.target):
            return self._close(rnd, now)
        return self._reissue(rnd, now)

    # --- rounds -------------------------------------------------------------------------------------------
    def _open_idle_tiers(self, now: float) -> Effects:
        effects = NOTHING
        if self.assignment is None or self.model is None:
            return effects
        busy = {m: sum(1 for t, _ in self.rounds if t == m) for m in self.cfg.tiers}
        open_rounds = [t for (t, _), r in self.rounds.items() if r.tasks is not None]
        n = len(self.assignment.tiers)
        stats = TierStats(
            rounds=tuple(self.closed.get(m, 0) for m in range(1, n + 1)),
            losses=tuple(self.tier_loss.get(m, float("inf")) for m in range(1, n + 1)),
            open=tuple(open_rounds.count(m) for m in range(1, n + 1)),
            accuracies=tuple(self.tier_accuracy.get(m, float("nan")) for m in range(1, n + 1)),
        )
        for m in self.strategy.schedule(busy, stats, self.rng):
            effects = effects + self._open(m, now)
        # Updates that came before their round opened (after a restart) are replayed once every round is open;
        # a replay may close a round, which schedules again, but never inside the loop above.
        pending, self.waiting = self.waiting, []
        for inbound in pending:
            effects = effects + self._replay(inbound, now)
        return effects

    def _open(self, tier: int, now: float) -> Effects:
        candidates = [c for c in self.assignment.tiers[tier - 1] if c not in self._training(tier)]
        if not candidates:
            return NOTHING
        number = self.next_round.get(tier, 1)
        self.next_round[tier] = number + 1
        clients = self.strategy.select_clients(candidates, self.cfg.clients_per_round, self.rng)
        rnd = _Round(tier, number, self.model.version, now, 0.0, {}, target=len(clients))
        self.rounds[(tier, number)] = rnd
        effects = self._dispatch(rnd, clients, now)
        if self.metrics:
            self.metrics.rounds_opened.labels(str(tier)).inc()
        return effects

    def _training(self, tier: int) -> set[int]:
        return {c for (t, _), r in self.rounds.items() if t == tier and r.tasks for c in r.tasks}

    def _replay(self, inbound: Inbound, now: float) -> Effects:
        try:
            return self._on_update(inbound, inbound.message, now)
        except Reject as exc:
            return Effects(dead_letter=((inbound.tag, exc.reason),))

    def _dispatch(self, rnd: _Round, clients: list[int], now: float) -> Effects:
        latencies = self.assignment.latencies
        slowest = max((latencies.get(c, 0.0) for c in clients), default=0.0)
        rnd.deadline = now + max(self.cfg.min_deadline, self.cfg.deadline_factor * slowest)
        epochs = self._local_epochs(clients, latencies)
        tasks = []
        for c in clients:
            task = self._task(rnd, c, epochs[c], now)
            rnd.tasks[c] = task.id
            rnd.bytes_down += model_bytes(task.layers)
            tasks.append(Outgoing(topology.TRAIN, topology.tier_key(rnd.tier), task))
        return Effects(publish=tuple(tasks), timers=((rnd.deadline - now, f"deadline:{rnd.tier}:{rnd.number}"),))

    def _local_epochs(self, clients: list[int], latencies) -> dict[int, int]:
        # FedProx's partial work: its stragglers send what fewer epochs give instead of holding the round up.
        epochs = {c: self.cfg.epochs for c in clients}
        n = int(np.ceil(self.cfg.straggler_fraction * len(clients)))
        if n and self.cfg.epochs > 1:
            for c in sorted(clients, key=lambda c: latencies.get(c, 0.0))[-n:]:
                epochs[c] = int(self.rng.integers(1, self.cfg.epochs))
        return epochs

    def _task(self, rnd: _Round, client: int, epochs: int, now: float) -> TrainTask:
        c = self.cfg
        return TrainTask(
            id=f"t{rnd.tier}-r{rnd.number}-c{client}-v{rnd.base_version}",
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
            layers=self.model.layers,
        )

    def _reissue(self, rnd: _Round, now: float) -> Effects:
        # The stragglers keep their tasks: an answer from them still counts while the round is open.
        need = rnd.target - len(rnd.arrivals)
        busy = self._training(rnd.tier)  # this round's clients, and those of the tier's other open rounds
        fresh = [c for c in self.assignment.tiers[rnd.tier - 1] if c not in busy]
        rnd.reissues += 1
        if self.metrics:
            self.metrics.reissues.labels(str(rnd.tier)).inc()
        replacements = self.strategy.select_clients(fresh, need, self.rng) if fresh else []
        if not replacements:
            # Nobody left to ask: wait another deadline for the stragglers.
            rnd.deadline = now + self.cfg.min_deadline
            return Effects(timers=((self.cfg.min_deadline, f"deadline:{rnd.tier}:{rnd.number}"),))
        return self._dispatch(rnd, replacements, now)

    def _close(self, rnd: _Round, now: float) -> Effects:
        included = sorted((a for a in rnd.arrivals.values() if a.effective <= now), key=lambda a: a.update.client)
        late_tags = [a.tag for a in rnd.arrivals.values() if a.effective > now]
        models = [a.weights for a in included]
        merged = self.strategy.merge_tier(models, [a.update.n_samples for a in included])
        names = [layer.name for layer in included[0].update.layers]
        tier_model = TierModel(
            id=f"tm{rnd.tier}-r{rnd.number}",
            tier=rnd.tier,
            round=rnd.number,
            base_version=rnd.base_version,
            n_samples=sum(a.update.n_samples for a in included),
            clients=tuple(a.update.client for a in included),
            bytes_up=sum(model_bytes(a.update.layers) for a in included),
            bytes_down=rnd.bytes_down,
            late=sum(a.update.late for a in included),
            closed_at=now,
            layers=encode_model(merged, names, self.cfg.tier_codec, self.cfg.precision),
        )
        n = sum(a.update.n_samples for a in included)
        self.tier_loss[rnd.tier] = sum(a.update.loss * a.update.n_samples for a in included) / n
        missing = tuple(sorted(c for c in rnd.tasks if c not in rnd.arrivals))
        for c in missing:
            self.awaited[rnd.tasks[c]] = None
        rnd.tasks = None  # closed: further timers and updates for it are stale
        for a in rnd.arrivals.values():  # merged, or acked now as counting only after the close
            self.handled[a.update.id] = None
        for memory in (self.handled, self.awaited):
            while len(memory) > MERGED_MEMORY:
                memory.popitem(last=False)
        self.closed[rnd.tier] = self.closed.get(rnd.tier, 0) + 1
        if self.metrics:
            self.metrics.rounds_closed.labels(str(rnd.tier)).inc()
            self.metrics.round_seconds.labels(str(rnd.tier)).observe(now - rnd.opened_at)
            self.metrics.updates_merged.labels(str(rnd.tier)).inc(len(included))
        report = RoundReport(
            id=f"rr{rnd.tier}-r{rnd.number}",
            tier=rnd.tier,
            round=rnd.number,
            # Answers that came in but count only later (not_before past the close) are real latencies too.
            latencies={a.update.client: a.effective - a.update.dispatched_at for a in rnd.arrivals.values()},
            missing=missing,
            waited=now - rnd.opened_at,
            closed_at=now,
        )
        acks = tuple(a.tag for a in included) + tuple(late_tags) + tuple(rnd.extra_tags)
        closed = Effects(
            publish=(
                Outgoing(topology.TIER_MODELS, "", tier_model),
                Outgoing(topology.EVENTS, topology.ROUND_REPORT_KEY, report),
            ),
            ack=acks,
        )
        return closed + self._open_idle_tiers(now)  # a strategy may restart clients on close (FedBuff)
