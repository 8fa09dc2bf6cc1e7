"""The worker: trains whichever logical client a task names and publishes its compressed update at once.

Response time follows the latency model (fedat.fl.latency): the update carries `not_before`, the moment the
simulated client would have answered, and the barrier counts it from then. So a delay never keeps this process
from training the next client; an update already past its `not_before` when training ends is flagged `late`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from fedat.fl.latency import ClientProfile, StragglerProfile, response_latency, round_draw, training_seconds
from fedat.protocol import topology
from fedat.protocol.service import Effects, Inbound, Outgoing, Reactive, Reject, Subscription, done
from fedat.protocol.wire import TrainTask
from fedat_worker import local
from fedat_worker.datasets import ClientData
from fedat_worker.training import Trainer
from fedat_worker.tuned import overrides_of


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
        clients: Sequence[ClientData],
        trainer: Trainer,
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
        weights = local.start_weights(task, self.initial_weights, self.shapes)
        started = self.clock()
        result = local.train(self.trainer, task, weights, self.clients[task.client])
        finished = self.clock()
        st = self.cfg.straggler
        tune = overrides_of(self.trainer)  # the app's own epochs and batch size, where it sets them
        steps = tune.epochs_of(task) * -(-result.n_samples // tune.batch_size_of(task))
        seconds = training_seconds(result.seconds, steps, st.step_seconds)
        draw = round_draw(self.cfg.seed, task.id)
        not_before = task.sent_at + response_latency(seconds, profile, st.time_scale, draw)
        update = local.update(task, result, weights, self.names, started, finished, not_before, finished > not_before)
        if self.metrics:
            tier = str(task.tier)
            self.metrics.trained.labels(tier).inc()
            self.metrics.train_seconds.labels(tier).observe(result.seconds)
            self.metrics.epochs.labels(tier).inc(tune.epochs_of(task))
            if update.late:
                self.metrics.late.labels(tier).inc()
        return done(inbound, Outgoing(topology.RESULTS, local.answer_key(task), update))
