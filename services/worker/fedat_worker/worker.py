"""The worker: trains whichever logical client a task names and publishes its compressed update at once.

Response time follows the latency model (fedat.latency): the update carries `not_before`, the moment the
simulated client would have answered, and the barrier counts it from then. So a delay never keeps this process
from training the next client; an update already past its `not_before` when training ends is flagged `late`.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fedat import topology
from fedat.latency import ClientProfile, StragglerProfile, response_latency, round_draw, training_seconds
from fedat.service import Effects, Inbound, Outgoing, Reactive, Reject, Subscription, done
from fedat.wire import TrainTask, Update, WireError, decode_model, encode_model


@dataclass(frozen=True)
class WorkerConfig:
    """Which queues to serve and how simulated clients behave."""

    tiers: tuple[int, ...] = (1, 2, 3, 4, 5)
    profile_queue: bool = True
    straggler: StragglerProfile = StragglerProfile()
    seed: int = 0


class Worker(Reactive):
    """Serves train tasks for any client of the experiment."""

    name = "worker"

    def __init__(
        self,
        cfg: WorkerConfig,
        clients,
        trainer,
        names: list[str],
        initial: list[np.ndarray],
        profiles: tuple[ClientProfile, ...],
        clock: Callable[[], float],
        metrics=None,
    ):
        self.cfg, self.clients, self.trainer, self.names = cfg, clients, trainer, names
        self.initial_weights, self.profiles, self.clock, self.metrics = initial, profiles, clock, metrics
        self.shapes = [a.shape for a in initial]

    def initial(self) -> None:
        """Stateless: any worker can train any client."""
        return None

    def subscriptions(self) -> dict[str, Subscription]:
        """The train queues of the configured tiers (and the profiling queue)."""
        subs = {topology.train_queue(m): Subscription(TrainTask, self.on_task) for m in self.cfg.tiers}
        if self.cfg.profile_queue:
            subs[topology.PROFILE_QUEUE] = Subscription(TrainTask, self.on_task)
        return subs

    def on_task(self, state: None, inbound: Inbound, now: float, held) -> tuple[None, Effects]:
        """Train one task and publish the update."""
        return state, self._train(inbound, now)

    def _train(self, inbound: Inbound, now: float) -> Effects:
        task: TrainTask = inbound.message
        if not 0 <= task.client < len(self.clients):
            raise Reject(f"unknown client {task.client}: this experiment has {len(self.clients)} clients")
        profile = self.profiles[task.client]
        # Drop-out times count from the run's start, which every task carries (no pod's own clock or environment).
        started = task.run_started_at
        if profile.drops_at is not None and started and now - started >= profile.drops_at:
            if self.metrics:
                self.metrics.dropped.inc()
            return done(inbound)  # the client has left for good: no answer, as in the paper's unstable clients
        weights = self._weights(task)
        data = self.clients[task.client]
        started = self.clock()
        result = self.trainer.train(
            weights,
            data.x_train,
            data.y_train,
            epochs=task.epochs,
            prox_lambda=task.prox_lambda,
            seed=zlib.crc32(task.id.encode()),
            learning_rate=task.learning_rate,
            batch_size=task.batch_size,
        )
        finished = self.clock()
        st = self.cfg.straggler
        steps = task.epochs * -(-result.n_samples // task.batch_size)
        seconds = training_seconds(result.seconds, steps, st.step_seconds)
        draw = round_draw(self.cfg.seed, task.id)
        not_before = task.sent_at + response_latency(seconds, profile, st.time_scale, draw)
        update = Update(
            id=f"u-{task.id}",
            task_id=task.id,
            client=task.client,
            tier=task.tier,
            round=task.round,
            base_version=task.version,
            n_samples=result.n_samples,
            loss=result.loss,
            dispatched_at=task.sent_at,
            started_at=started,
            finished_at=finished,
            train_seconds=result.seconds,
            not_before=not_before,
            late=finished > not_before,
            # A profiling answer is only timed: its model would be thrown away, so it is not sent.
            layers=encode_model(result.weights, self.names, task.codec, task.precision) if task.tier else (),
        )
        if self.metrics:
            tier = str(task.tier)
            self.metrics.trained.labels(tier).inc()
            self.metrics.train_seconds.labels(tier).observe(result.seconds)
            self.metrics.epochs.labels(tier).inc(task.epochs)
            if update.late:
                self.metrics.late.labels(tier).inc()
        key = topology.tier_key(task.tier) if task.tier else topology.PROFILE_KEY
        return done(inbound, Outgoing(topology.RESULTS, key, update))

    def _weights(self, task: TrainTask) -> list[np.ndarray]:
        if not task.layers:
            return self.initial_weights  # a profiling task: train from the initial model
        try:
            weights = decode_model(task.layers)
        except WireError as exc:
            raise Reject(f"task {task.id}: {exc}") from None
        if [w.shape for w in weights] != self.shapes:
            raise Reject(
                f"task {task.id}: layer shapes {[w.shape for w in weights]} do not match the model's {self.shapes}"
            )
        return weights
