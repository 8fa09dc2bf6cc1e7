"""A real client: one process, one client, its own data; it trains only its own tasks and answers in real time.

It consumes its own queues (`fedat.client.<k>`: train and profiling tasks routed with key `client-<k>`;
`fedat.client.<k>.evaluate`: the newest federated evaluation request) and publishes on `fedat.results` with keys
that name it (`tier-<m>.client-<k>`, `profile.client-<k>`, `join.client-<k>`, `evaluation.client-<k>`), signed with
its own key. Unlike the pool's worker it has no latency model: its update carries `not_before` = 0 and is never
`late`, so the barrier and the profiler count its real response time, from dispatch to arrival.

It announces itself with a `join` on every connection to the broker (a start, a restart after a crash, a reconnect
after an outage: it cannot know whether the server saw the last one), so the profiler profiles and tiers it.
`delay` holds each answer back for that many seconds: on one machine every client is equally fast, so a
demonstration stands in for a slow site with it. It is off by default and has no place in a real deployment.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from fedat.protocol import ids, topology
from fedat.protocol.service import NOTHING, Effects, Held, Inbound, Observation, Outgoing, Reject, Subscription, done
from fedat.protocol.statecodec import StateCodec
from fedat.protocol.wire import ClientEvaluation, EvaluationRequest, Join, TrainTask, model_bytes
from fedat_worker import local
from fedat_worker.datasets import ClientData
from fedat_worker.training import Trainer
from fedat_worker.tuned import overrides_of

ANSWER = "answer"  # timer kind: a delayed answer is due
# What its transitions observe (`fedat_worker.metrics.ClientMetrics` counts them, by tier, never by client).
JOINED, TRAINED, EPOCHS, EVALUATED = "joined", "trained", "epochs", "evaluated"
RECEIVED_WHOLE, RECEIVED_AGAINST = "received_whole", "received_against"  # a task's model bytes, by how they came
ASKED_WHOLE, ASKED_AGAINST = "asked_whole", "asked_against"  # an evaluation request's model bytes, likewise
UNSCORABLE = "unscorable"  # a request sent against a model this client does not keep: skipped


@dataclass(frozen=True)
class ClientConfig:
    """Who this client is and how it answers."""

    client: int
    app: str  # the app's `package.module:attr`, to name it in errors
    delay: float = 0.0  # seconds added before each answer, for demonstrations only (a slow site on one machine)


@dataclass(frozen=True)
class ClientState:
    """What a client remembers; saved in its state folder, if it has one, so a restart keeps its task models."""

    joins: int = 0  # joins sent, one per connection
    answered: int = 0  # tasks answered
    evaluated: int = -1  # the newest global version scored; a copy of an older request is not scored again
    # The global models of its newest tasks, by version, as decoded: the barrier sends a task against the version
    # of the client's newest answer rather than whole (TrainTask.relative_to).
    models: Mapping[int, tuple[np.ndarray, ...]] = field(default_factory=dict)
    # The model of the newest evaluation request sent whole, by version (one at most): the collector sends the
    # requests after it against it.
    evaluation_model: Mapping[int, tuple[np.ndarray, ...]] = field(default_factory=dict)


# Task models kept: the barrier names the base of the client's newest answer that reached it, and a client answers
# at most one task a round, so a few cover an answer that was lost or is still on its way.
KEPT_MODELS = 4


def answer_timer(tag: int) -> str:
    """The key of the timer that releases the delayed answer to the delivery `tag` (connection-scoped, as tags are)."""
    return f"{ANSWER}:{tag}"


def parse_answer_timer(key: str) -> int:
    """The delivery tag an answer timer names; ValueError for any other key."""
    return ids.parse_keyed_timer(ANSWER, key)


class Client:
    """Trains its own tasks, answers profiling tasks, scores global models on its own test split."""

    name = "client"
    codec = StateCodec(1, (ClientState,))

    def __init__(
        self,
        cfg: ClientConfig,
        data: ClientData,
        trainer: Trainer,
        names: list[str],
        initial: list[np.ndarray],
        clock: Callable[[], float],
    ):
        self.cfg, self.data, self.trainer, self.names, self.clock = cfg, data, trainer, names, clock
        self.initial_weights = initial
        self.shapes = [a.shape for a in initial]
        self.model = f"app {cfg.app}'s model"  # named in a refusal of a model of other shapes

    def initial(self) -> ClientState:
        """Nothing joined, answered or scored yet."""
        return ClientState()

    def subscriptions(self) -> dict[str, Subscription]:
        """Its own task queue and its own evaluation queue."""
        k = self.cfg.client
        return {
            topology.client_queue(k): Subscription(TrainTask, self.on_task),
            topology.client_evaluate_queue(k): Subscription(EvaluationRequest, self.on_evaluate),
        }

    def on_start(self, state: ClientState, now: float) -> tuple[ClientState, Effects]:
        """Announce itself: a join, on every connection."""
        k = self.cfg.client
        join = Join(id=ids.join(k, int(now * 1000)), client=k, n_samples=self.data.n_train, sent_at=now)
        out = Outgoing(topology.RESULTS, topology.from_client(topology.JOIN_KEY, k), join)
        return replace(state, joins=state.joins + 1), Effects(publish=(out,), observe=(Observation(JOINED),))

    def on_task(
        self, state: ClientState, inbound: Inbound, now: float, held: Mapping[int, Held]
    ) -> tuple[ClientState, Effects]:
        """Train its own task (a profiling task is only timed) and answer, after the demonstration delay if any."""
        task: TrainTask = inbound.message
        k = self.cfg.client
        if task.client != k:
            # Never routed here by the barrier or the profiler; refusing it keeps another client's work undone
            # rather than done on the wrong data, and the dead letter says why.
            raise Reject(
                f"task {task.id} is for client {task.client}, but this is client {k}: a client trains only its own"
            )
        weights = local.start_weights(task, self.initial_weights, self.shapes, self.model, state.models)
        if task.layers:
            state = replace(state, models=_keep(state.models, task.version, weights))
        started = self.clock()
        result = local.train(self.trainer, task, weights, self.data)  # with the app's own settings, where it has them
        finished = self.clock()
        update = local.update(task, result, weights, self.names, started, finished, not_before=0.0, late=False)
        out = Outgoing(topology.RESULTS, topology.from_client(local.answer_key(task), k), update)
        seen = (
            Observation(TRAINED, task.tier, result.seconds),
            Observation(EPOCHS, task.tier, overrides_of(self.trainer).epochs_of(task)),
        )
        if task.layers:
            how = RECEIVED_WHOLE if task.relative_to < 0 else RECEIVED_AGAINST
            seen += (Observation(how, task.tier, model_bytes(task.layers)),)
        state = replace(state, answered=state.answered + 1)
        if self.cfg.delay > 0:
            # Hold the task (unacked) with its answer; the timer sends it. A lost connection loses both, and the
            # broker gives the task back: trained again, answered again.
            timers = ((self.cfg.delay, answer_timer(inbound.tag)),)
            return state, Effects(hold=((inbound.tag, out),), timers=timers, observe=seen)
        return state, replace(done(inbound, out), observe=seen)

    def on_timer(
        self, state: ClientState, key: str, now: float, held: Mapping[int, Held]
    ) -> tuple[ClientState, Effects]:
        """A delayed answer is due: send it and ack its task."""
        tag = parse_answer_timer(key)
        h = held.get(tag)
        if h is None:
            return state, NOTHING  # its connection is gone, and the task with it: it comes back and is trained again
        return state, Effects(publish=(h.note,), ack=(tag,))

    def on_evaluate(
        self, state: ClientState, inbound: Inbound, now: float, held: Mapping[int, Held]
    ) -> tuple[ClientState, Effects]:
        """Score the requested global model on its own test split and report (loss, accuracy, samples)."""
        req: EvaluationRequest = inbound.message
        if req.version <= state.evaluated:
            return state, done(inbound)  # already scored (a copy, or an older request)
        bases = None
        if req.relative_to >= 0:
            bases = state.evaluation_model.get(req.relative_to, state.models.get(req.relative_to))
            if bases is None:
                # Its state was lost, or it missed the request sent whole: it scores again from the next whole one.
                return state, replace(done(inbound), observe=(Observation(UNSCORABLE),))
        weights = local.checked_weights(req.layers, f"evaluation request {req.id}", self.shapes, self.model, bases)
        if req.relative_to < 0:
            state = replace(state, evaluation_model={req.version: tuple(weights)})
        asked = Observation(ASKED_WHOLE if req.relative_to < 0 else ASKED_AGAINST, 0, model_bytes(req.layers))
        if not len(self.data.y_test):
            return state, replace(done(inbound), observe=(asked,))  # nothing to score on: a report needs a sample
        k = self.cfg.client
        loss, accuracy, n = self.trainer.evaluate_per_client(weights, [(self.data.x_test, self.data.y_test)])[0]
        score = ClientEvaluation(
            id=ids.client_evaluation(req.version, k),
            client=k,
            version=req.version,
            loss=float(loss),
            accuracy=float(accuracy),
            n_samples=int(n),
            evaluated_at=self.clock(),
        )
        out = Outgoing(topology.RESULTS, topology.from_client(topology.CLIENT_EVALUATION_KEY, k), score)
        fx = replace(done(inbound, out), observe=(asked, Observation(EVALUATED, 0, float(accuracy))))
        return replace(state, evaluated=req.version), fx


def _keep(models: Mapping[int, tuple[np.ndarray, ...]], version: int, weights: list[np.ndarray]) -> dict:
    """`models` with `version` added, the newest KEPT_MODELS versions only."""
    kept = {**models, version: tuple(weights)}
    return {v: kept[v] for v in sorted(kept)[-KEPT_MODELS:]}
