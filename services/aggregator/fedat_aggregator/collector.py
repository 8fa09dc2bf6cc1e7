"""Federated evaluation: real clients score chosen global versions on their own test data; the collector merges
their reports into the `evaluation` the central evaluator would publish.

The server holds no data. The collector follows the global models (an observer queue), picks the versions to score
by the evaluator's rule (`fedat.fl.evaluation.due`), and publishes an `evaluate` request; the fanout exchange copies
it to every enrolled client. A request carries the model's layers as they came (sent whole), and clients keep the
newest such model; the next ones go against it, losslessly (`wire.encode_against`), at 0.40-0.45 of the bytes on the
paper's CNN, as long as every client of the latest tier assignment is known to keep it (its reports say so) and for
at most `whole_every` - 1 requests. A client whose queue dropped the request sent whole (it keeps only the newest)
thus gets another whole one next. It folds the clients' `client-evaluation`s per version and publishes the
version's `evaluation` once every client of the latest tier assignment has answered, or when the version's window
closes (a timer): accuracy and loss weighted by the clients' test samples, the variance of their accuracies over
clients (each counting once), the accuracy of each. Numpy only. Not durable: a restart forgets the versions in
flight and the model sent whole, and sends its next request whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from fedat.fl.evaluation import EvalSchedule, due
from fedat.fl.tiering import tier_of
from fedat.protocol import ids, topology
from fedat.protocol.service import NOTHING, Effects, Inbound, Observation, Outgoing, Reject, Subscription, done
from fedat.protocol.wire import (
    ClientEvaluation,
    Evaluation,
    EvaluationRequest,
    GlobalModel,
    TierAssignment,
    decode_model,
    encode_against,
    model_bytes,
    on_grid,
)

# Observation names (mapped to Prometheus by fedat_aggregator.metrics).
REQUESTED, REPORTED, WAITED, TIER_ACCURACY = "requested", "reported", "waited", "tier_accuracy"
SENT_WHOLE, SENT_AGAINST = "sent_whole", "sent_against"  # a request's model bytes (one copy), by how it went
EVALUATED, VARIANCE, VERSION = "accuracy", "variance", "version"  # of each evaluation published
# Reports acked and ignored, by why (the metric's label): a version never requested, one published already (its
# window was too short for this client), a client outside the latest assignment, a second report.
UNREQUESTED, LATE, UNASSIGNED, DUPLICATE = "unrequested", "late", "unassigned", "duplicate"
IGNORED = (UNREQUESTED, LATE, UNASSIGNED, DUPLICATE)
DONE_MEMORY = 64  # versions published most recently, to tell a late report from one never asked for


@dataclass(frozen=True)
class CollectorConfig:
    """Which versions to score, and how long a version waits for its clients."""

    schedule: EvalSchedule = EvalSchedule()
    window: float = 20.0  # seconds from a request to its evaluation, whoever has answered by then
    max_pending: int = 8  # versions waiting at once; a newer request closes the oldest with what it has
    # At most `whole_every` - 1 requests in a row go against the one sent whole (1: every request whole), so a client
    # that lost it (its state folder with it) skips at most that many.
    whole_every: int = 4

    def __post_init__(self) -> None:
        if self.whole_every < 1:
            raise ValueError(f"whole_every must be >= 1, got {self.whole_every}")


@dataclass(frozen=True)
class Whole:
    """The newest model a request carried whole, as clients decode it: the base of the requests after it."""

    version: int
    arrays: tuple[np.ndarray, ...]
    against: int = 0  # requests sent against it so far
    # Clients known to keep it: they scored it, or a request sent against it. A client's evaluate queue keeps only
    # the newest request, so one busy training can miss the request sent whole and could not decode the next.
    holders: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Score:
    """One client's report on one version."""

    loss: float
    accuracy: float
    n_samples: int


@dataclass(frozen=True)
class Pending:
    """A requested version and the reports that came in for it."""

    version: int
    requested_at: float
    scores: Mapping[int, Score] = field(default_factory=dict)


@dataclass(frozen=True)
class CollectorState:
    """The last version requested, who is expected to answer, and the versions still collecting."""

    last: tuple[int, float] | None = None  # (version, time) of the last request, for `due`
    epoch: int = 0  # of the tier assignment below
    tiers: Mapping[int, int] = field(default_factory=dict)  # client -> tier, of the latest assignment
    pending: Mapping[int, Pending] = field(default_factory=dict)  # by version
    done: tuple[int, ...] = ()  # versions published most recently
    whole: Whole | None = None


class Collector:
    """Federated evaluation for real clients; signs its requests and evaluations as the evaluator."""

    name = "collector"

    def __init__(self, cfg: CollectorConfig):
        self.cfg = cfg

    def initial(self) -> CollectorState:
        """Nothing requested, nobody expected."""
        return CollectorState()

    def subscriptions(self) -> dict[str, Subscription]:
        """Global models and tier assignments (observer queues: only the latest matter), the clients' reports."""
        return {
            topology.COLLECTOR_GLOBAL: Subscription(GlobalModel, self.on_global),
            topology.COLLECTOR_ASSIGNMENTS: Subscription(TierAssignment, self.on_assignment),
            topology.COLLECTOR_EVALUATIONS: Subscription(ClientEvaluation, self.on_report),
        }

    def on_start(self, state: CollectorState, now: float) -> tuple[CollectorState, Effects]:
        """After a reconnect, re-arm the windows of the versions still collecting (a restart has none)."""
        timers = tuple(
            (max(0.0, p.requested_at + self.cfg.window - now), ids.window_timer(v)) for v, p in state.pending.items()
        )
        return state, Effects(timers=timers)

    def on_global(self, state: CollectorState, inbound: Inbound, now: float, held) -> tuple[CollectorState, Effects]:
        """Ask every client to score this version when the evaluation rule says it is due."""
        g: GlobalModel = inbound.message
        s = self.cfg.schedule
        if g.version in state.pending or not due(g.version, now, state.last, s.every, s.interval, s.grid):
            return state, done(inbound)
        state, request = self._request(state, g, now)
        state = replace(state, last=(g.version, now), pending={**state.pending, g.version: Pending(g.version, now)})
        how = SENT_WHOLE if request.relative_to < 0 else SENT_AGAINST
        effects = done(inbound, Outgoing(topology.EVALUATE, "", request)) + Effects(
            timers=((self.cfg.window, ids.window_timer(g.version)),),
            observe=(Observation(REQUESTED), Observation(how, 0, model_bytes(request.layers))),
        )
        while len(state.pending) > self.cfg.max_pending:  # clients fall behind: close the oldest with what it has
            state, closed = self._publish(state, min(state.pending), now)
            effects = effects + closed
        return state, effects

    def _request(self, state: CollectorState, g: GlobalModel, now: float) -> tuple[CollectorState, EvaluationRequest]:
        """The request for `g`: against the model last sent whole while every client of the latest assignment is
        known to keep it and fewer than `whole_every` - 1 requests went against it, else whole (and then the base of
        the next ones, if its layers lie on a grid)."""
        rid, w = ids.evaluation_request(g.version), state.whole
        if self.cfg.whole_every == 1 or not on_grid(g.layers):
            return replace(state, whole=None), EvaluationRequest(rid, g.version, now, g.layers)
        arrays = decode_model(g.layers)  # a global model is always whole; a WireError dead-letters a bad one
        kept = w is not None and bool(state.tiers) and state.tiers.keys() <= w.holders
        if kept and w.against + 1 < self.cfg.whole_every:
            layers = encode_against(g.layers, arrays, w.arrays)
            if layers is not None:
                request = EvaluationRequest(rid, g.version, now, layers, relative_to=w.version)
                return replace(state, whole=replace(w, against=w.against + 1)), request
        return replace(state, whole=Whole(g.version, tuple(arrays))), EvaluationRequest(rid, g.version, now, g.layers)

    def on_assignment(
        self, state: CollectorState, inbound: Inbound, now: float, held
    ) -> tuple[CollectorState, Effects]:
        """A newer tier assignment names who is expected to score; versions it completes are published."""
        a: TierAssignment = inbound.message
        if a.epoch <= state.epoch:
            return state, done(inbound)
        state = replace(state, epoch=a.epoch, tiers=tier_of(a.tiers))
        effects = done(inbound)
        for v in sorted(state.pending):
            if self._complete(state, state.pending[v]):
                state, published = self._publish(state, v, now)
                effects = effects + published
        return state, effects

    def on_report(self, state: CollectorState, inbound: Inbound, now: float, held) -> tuple[CollectorState, Effects]:
        """Fold one client's score; publish the version once every expected client has scored it."""
        r: ClientEvaluation = inbound.message
        if r.accuracy > 1.0:
            raise Reject(f"client-evaluation {r.id}: accuracy must be within 0..1, got {r.accuracy}")
        if r.n_samples < 1:
            raise Reject(f"client-evaluation {r.id}: n_samples must be >= 1, got {r.n_samples}")
        w = state.whole
        requested = r.version in state.pending or r.version in state.done
        if w is not None and requested and r.version >= w.version and r.client not in w.holders:
            # every version requested since the one sent whole went whole or against it: the client keeps it
            state = replace(state, whole=replace(w, holders=w.holders | {r.client}))
        pending = state.pending.get(r.version)
        ignored = (
            (LATE if r.version in state.done else UNREQUESTED)
            if pending is None
            else UNASSIGNED
            if r.client not in state.tiers
            else DUPLICATE
            if r.client in pending.scores
            else None
        )
        if ignored is not None:
            return state, done(inbound) + Effects(observe=(Observation(ignored),))
        pending = replace(pending, scores={**pending.scores, r.client: Score(r.loss, r.accuracy, r.n_samples)})
        state = replace(state, pending={**state.pending, r.version: pending})
        effects = done(inbound) + Effects(observe=(Observation(REPORTED, state.tiers[r.client]),))
        if not self._complete(state, pending):
            return state, effects
        state, published = self._publish(state, r.version, now)
        return state, effects + published

    def on_timer(self, state: CollectorState, key: str, now: float, held) -> tuple[CollectorState, Effects]:
        """A version's window closed: publish what its clients reported by now."""
        version = ids.parse_keyed_timer(ids.WINDOW, key)
        if version not in state.pending:
            return state, NOTHING  # published already (everyone answered)
        return self._publish(state, version, now)

    def _complete(self, state: CollectorState, pending: Pending) -> bool:
        return bool(state.tiers) and state.tiers.keys() <= pending.scores.keys()

    def _publish(self, state: CollectorState, version: int, now: float) -> tuple[CollectorState, Effects]:
        """Merge a version's reports into its `evaluation` and forget the version (nothing if nobody answered)."""
        pending = state.pending[version]
        state = replace(
            state,
            pending={v: p for v, p in state.pending.items() if v != version},
            done=(*state.done, version)[-DONE_MEMORY:],
        )
        if not pending.scores:
            return state, NOTHING
        ev = merge(version, pending.scores, now)
        per_tier: dict[int, list[float]] = {}
        for c, s in pending.scores.items():
            if c in state.tiers:
                per_tier.setdefault(state.tiers[c], []).append(s.accuracy)
        observed = (
            Observation(EVALUATED, 0, ev.accuracy),
            Observation(VARIANCE, 0, ev.variance),
            Observation(VERSION, 0, version),
            Observation(WAITED, 0, now - pending.requested_at),
            *(Observation(TIER_ACCURACY, m, float(np.mean(a))) for m, a in sorted(per_tier.items())),
        )
        return state, Effects(publish=(Outgoing(topology.EVENTS, topology.EVALUATION_KEY, ev),), observe=observed)


def merge(version: int, scores: Mapping[int, Score], now: float) -> Evaluation:
    """The `evaluation` of a version from its clients' reports: accuracy and loss weighted by test samples, the
    variance of the accuracies over clients, and each client's accuracy by id (the weighted mean for a client that
    did not report, so that a tier's mean, as TiFL reads it, is not pulled towards 0 by an absent client)."""
    clients = sorted(scores)
    n = np.array([scores[c].n_samples for c in clients], dtype=np.float64)
    acc = np.array([scores[c].accuracy for c in clients], dtype=np.float64)
    loss = np.array([scores[c].loss for c in clients], dtype=np.float64)
    accuracy = float(np.dot(n, acc) / n.sum())
    accuracies = [accuracy] * (clients[-1] + 1)
    for c, a in zip(clients, acc, strict=True):
        accuracies[c] = float(a)
    return Evaluation(
        id=ids.evaluation(version),
        version=version,
        accuracy=accuracy,
        loss=float(np.dot(n, loss) / n.sum()),
        variance=float(acc.var()),
        n_clients=len(clients),
        evaluated_at=now,
        accuracies=tuple(accuracies),
    )
