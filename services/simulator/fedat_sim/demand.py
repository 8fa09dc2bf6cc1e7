"""`python -m fedat_sim.demand`: what an experiment's latency model asks of this machine's worker processes, measured in
virtual time.

Reads {"experiment": {name, workers, minutes, settings}, "train_samples": [...], "measured_step_seconds": s} on stdin,
and optionally "evaluation_seconds" (what one evaluation takes from the workers' cores, 0 when the evaluator has a
core of its own), "stop_after_rounds" (end once every tier has merged that many rounds) and "max_trainings"; runs the
production services in virtual time with numpy stand-ins for the data and the trainer (each client keeps its real
number of training samples, so its steps and its modelled latency are the real ones) for at most `minutes`; prints
one JSON line (`Outcome`).

Unlike `fedat simulate`, where every client has a core of its own, the training here queues for the experiment's
`workers` processes, first come first served, each training taking its steps × `measured_step_seconds` (and each
evaluation its `evaluation_seconds`): an answer becomes visible at its `not_before`, or when its training ends if
that is later, i.e. late, as on the real machine. So the profiling pass, the tiers and the rounds are those of a run
whose workers are as fast as the probe said. `fedat run` reads from it whether the workers keep up and how soon
every tier has merged a round (`fedat.lab.plan`). No TensorFlow, a few seconds.
"""

from __future__ import annotations

import json
import logging
import random
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

import msgpack
import numpy as np
import pika

from fedat.deploy.experiment import Experiment
from fedat.fl.latency import client_profiles
from fedat.lab import calibrate as cal
from fedat.lab.plan import Plan, Refusal, Trial, plan
from fedat.lab.recorder import RunState
from fedat.protocol import topology
from fedat.protocol.system import BY_NAME
from fedat.runtime import config
from fedat_profiler import main as profiler_main
from fedat_sim.clients import Parts
from fedat_sim.clock import Clock
from fedat_sim.fakes import SHAPES, FakeTrainer
from fedat_sim.memory import MemoryBroker, MemoryChannel, MemoryConnection
from fedat_sim.system import System
from fedat_worker.datasets import ClientData
from fedat_worker.training import TrainResult

# A trial runs until every tier has merged this many rounds (enough to see whether the workers keep up, a second or
# two of computing), or this many answers, or this much virtual time.
STOP_AFTER_ROUNDS = 5
MAX_TRAININGS = 2000
HORIZON_MINUTES = 60.0


class TimedTrainer(FakeTrainer):
    """The stand-in trainer, reporting the seconds the measured step cost gives (latency with step_seconds 0)."""

    def __init__(self, step_seconds: float):
        self.step_seconds = step_seconds

    def train(self, weights, x, y, *, epochs, batch_size=None, **kw) -> TrainResult:
        """FakeTrainer's step, timed as this machine would take."""
        r = super().train(weights, x, y, epochs=epochs, batch_size=batch_size, **kw)
        return TrainResult(
            r.weights, r.n_samples, r.loss, epochs * -(-len(x) // (batch_size or 10)) * self.step_seconds
        )


def parts(train_samples: list[int], step_seconds: float, seed: int = 0) -> Parts:
    """Stand-in clients with the real sizes (constant targets, as `fakes.fake_parts`) and a timed trainer."""
    rng = np.random.default_rng([seed, 0xFA4E])
    clients = []
    for n in train_samples:
        x = np.full((n, 2), np.float32(rng.uniform(-1.0, 1.0)), np.float32)
        y = rng.integers(0, 2, n)
        clients.append(ClientData(x, y, x[: max(1, n // 4)], y[: max(1, n // 4)]))
    initial = tuple(np.zeros(s, np.float32) for s in SHAPES)
    return Parts(tuple(clients), TimedTrainer(step_seconds), tuple(f"layer{i}" for i in range(len(SHAPES))), initial)


class BusyChannel(MemoryChannel):
    """A worker process's channel: one delivery at a time, each held (unacked) until its training has ended."""

    def __init__(self, connection: MemoryConnection, pool: WorkerPool, index: int):
        super().__init__(connection)
        self.pool, self.index = pool, index

    def _handle_next(self) -> None:
        free = self.pool.free[self.index]
        if self._inbox and not self.is_closed and free > self.broker.clock.now:
            self.broker.clock.at(free, self._handle_next, "busy")  # still training: the inbox keeps its order
            return
        super()._handle_next()

    def basic_ack(self, delivery_tag: int) -> None:
        """Ack when the training ends: until then the prefetch slot stays taken, as on RabbitMQ."""
        free = self.pool.free[self.index]
        if free <= self.broker.clock.now:
            super().basic_ack(delivery_tag)
            return

        def ack() -> None:
            if not self.is_closed:
                super(BusyChannel, self).basic_ack(delivery_tag)

        self.broker.clock.at(free, ack, "ack")


class WorkerPool:
    """The worker processes: when each is next idle, and the worker seconds queued so far."""

    def __init__(self, workers: int, now: float):
        self.free = [now] * max(1, workers)
        self.busy = 0.0

    def train(self, index: int, now: float, seconds: float) -> float:
        """Worker `index` trains for `seconds` from `now` (it is idle: its channel waited); when it ends."""
        self.free[index] = max(self.free[index], now) + seconds
        self.busy += seconds
        return self.free[index]

    def share(self, now: float, seconds: float) -> None:
        """Another process (the evaluator) takes `seconds` of the workers' cores: each loses its share."""
        for i in range(len(self.free)):
            self.free[i] = max(self.free[i], now) + seconds / len(self.free)
        self.busy += seconds


@dataclass
class Outcome:
    """What the demand model saw; times are virtual seconds from the start of the profiling pass."""

    horizon_seconds: float = 0.0  # how long it ran: `minutes`, or less once it had seen enough
    window_seconds: float = 0.0  # from the first global update to the end
    steps: int = 0  # mini-batch steps of round trainings in that window
    trainings: int = 0  # round trainings in that window
    profiled_at: float | None = None  # the first tier assignment
    first_merge: list[float | None] = field(default_factory=list)  # per tier: the first global version with its round
    rounds: list[int] = field(default_factory=list)  # per tier, merged by the end
    versions: int = 0
    evaluations: int = 0
    update_times: list[float] = field(default_factory=list)  # every round answer, when it became visible
    late_times: list[float] = field(default_factory=list)  # those of them whose training ended after `not_before`
    busy_seconds: float = 0.0  # worker seconds of training and evaluation queued


def measure(
    exp: Experiment,
    train_samples: list[int],
    step_seconds: float,
    *,
    evaluation_seconds: float = 0.0,
    stop_after_rounds: int = 0,
    max_trainings: int = 0,
) -> Outcome:
    """Run the services in virtual time on `exp.workers` busy worker processes for up to `exp.minutes`."""
    seed = int(exp.settings.get("seed", 0))
    batch, epochs = int(exp.settings.get("batch_size", 10)), int(exp.settings.get("epochs", 3))
    steps_per_client = [epochs * -(-n // batch) for n in train_samples]
    num_tiers = int(exp.settings.get("num_tiers", 5))
    clock = Clock(rng=random.Random(seed))
    broker = MemoryBroker(clock)
    origin = clock.now
    pool = WorkerPool(exp.workers, origin)
    out = Outcome(first_merge=[None] * num_tiers, rounds=[0] * num_tiers)
    first_global: list[float] = []

    def busy_worker(index: int) -> Callable[[MemoryConnection], None]:
        def visible(exchange: str, routing_key: str, body: bytes, properties: pika.BasicProperties) -> float | None:
            # The stand-in trains in no time; the worker process is busy for the measured seconds instead.
            if properties.type != "update":
                return None
            u = msgpack.unpackb(body, raw=False)
            ends = pool.train(index, clock.now, float(u["train_seconds"]))
            at = max(float(u["not_before"]), ends)
            if u["tier"]:
                out.update_times.append(round(at - origin, 4))
                if ends > u["not_before"]:
                    out.late_times.append(round(at - origin, 4))
            return at

        def configure(conn: MemoryConnection) -> None:
            conn.visible_at = visible
            conn.channel = lambda: _opened(conn, BusyChannel(conn, pool, index))

        return configure

    def tap(exchange: str, routing_key: str, body: bytes, properties: pika.BasicProperties) -> None:
        t = clock.now - origin
        if exchange == topology.GLOBAL:
            g = msgpack.unpackb(body, raw=False)
            if g.get("version", 0) < 1:
                return
            if not first_global:
                first_global.append(clock.now)
            out.versions = max(out.versions, g["version"])
            out.rounds = [max(a, b) for a, b in zip(out.rounds, g["tier_counts"], strict=True)]
            merged = zip(out.first_merge, out.rounds, strict=True)
            out.first_merge = [f if f is not None or not n else t for f, n in merged]
        elif exchange == topology.CONTROL and out.profiled_at is None:
            out.profiled_at = t
        elif exchange == topology.EVENTS and routing_key == topology.EVALUATION_KEY:
            out.evaluations += 1
            if evaluation_seconds > 0:
                pool.share(clock.now, evaluation_seconds)
        elif exchange == topology.RESULTS and routing_key != topology.PROFILE_KEY and first_global:
            out.trainings += 1
            out.steps += steps_per_client[msgpack.unpackb(body, raw=False)["client"]]

    def enough() -> bool:
        if max_trainings and len(out.update_times) >= max_trainings:
            return True
        return bool(stop_after_rounds) and min(out.rounds) >= stop_after_rounds

    broker.taps.append(tap)
    end = origin + exp.minutes * 60.0
    with tempfile.TemporaryFile("w") as events:
        parts_ = parts(train_samples, step_seconds, seed)
        # no checkpoints: they take no virtual time, so the run's events are the same without them
        system = System(exp, parts_, clock, broker, RunState(clock.now), events, exp.workers, durable=False)
        for index, name in enumerate(system.workers()):
            process = system.processes[name]
            process.configure = busy_worker(index)
            process.cfg = replace(process.cfg, prefetch=BY_NAME["worker"].prefetch)  # as the real worker: one task
        system.start()
        try:
            while (due := clock.next_time()) is not None and due <= end and not enough():
                clock.step()
        finally:
            system.stop()
    stop = clock.now if enough() else end
    out.horizon_seconds = stop - origin
    out.window_seconds = stop - (first_global[0] if first_global else stop)
    out.busy_seconds = pool.busy
    return out


def _opened(conn: MemoryConnection, channel: MemoryChannel) -> MemoryChannel:
    """Register a channel made outside `MemoryConnection.channel`, as that method does."""
    conn.channels.append(channel)
    return channel


def trial(outcome: Outcome, time_scale: float, profile_concurrency: int, workers: int) -> Trial:
    """The planner's view of one measurement."""
    return Trial(
        time_scale=time_scale,
        profile_concurrency=profile_concurrency,
        horizon=outcome.horizon_seconds,
        first_merge=tuple(outcome.first_merge),
        update_times=tuple(outcome.update_times),
        late_times=tuple(outcome.late_times),
        busy_seconds=outcome.busy_seconds,
        workers=workers,
    )


def first_guess(exp: Experiment, train_samples: list[int], step_seconds: float, target: float) -> float:
    """The closed form's time scale (`fedat.lab.calibrate`): the workers `target` busy, queueing ignored."""
    profile = config.latency(exp.env())
    seed = int(exp.settings.get("seed", 0))
    batch, epochs = int(exp.settings.get("batch_size", 10)), int(exp.settings.get("epochs", 3))
    return cal.calibrate(
        client_profiles(len(train_samples), profile, seed),
        [epochs * -(-n // batch) for n in train_samples],
        step_seconds,
        step_seconds=profile.step_seconds,
        time_scale=profile.time_scale,
        capacity=float(exp.workers),  # the probe's cost is per worker process with every one of them busy
        num_tiers=int(exp.settings.get("num_tiers", 5)),
        clients_per_round=int(exp.settings.get("clients_per_round", 10)),
        target=target,
        tier_sizes=tuple(float(x) for x in exp.settings.get("tier_sizes", ()) or ()),
    ).time_scale


def trial_at(
    exp: Experiment,
    train_samples: list[int],
    step_seconds: float,
    evaluation_seconds: float,
    time_scale: float,
    profile_concurrency: int,
) -> Trial:
    """One trial of the plan: the demand model at this time scale and profiling concurrency, until it saw enough."""
    # Models travel raw: no time passes for coding in the model, so the trial's times are the same with any codec
    # (test_calibrate), and a trial takes a third less CPU without polyline.
    settings = {**exp.settings, "time_scale": time_scale, "profile_concurrency": profile_concurrency, "codec": "raw"}
    outcome = measure(
        replace(exp, minutes=HORIZON_MINUTES, settings=settings),
        train_samples,
        step_seconds,
        evaluation_seconds=evaluation_seconds,
        stop_after_rounds=STOP_AFTER_ROUNDS,
        max_trainings=MAX_TRAININGS,
    )
    return trial(outcome, time_scale, profile_concurrency, exp.workers)


def profile_concurrencies(exp: Experiment, num_clients: int) -> tuple[int, int]:
    """The experiment's profiling concurrency, then every client at once (a shorter pass, if the first is too long)."""
    own = profiler_main.settings({**exp.env(), "FEDAT_SIGNING": "off"}).profiler.concurrency  # as the simulator
    return own, max(own, num_clients)


def plan_run(
    exp: Experiment,
    train_samples: list[int],
    step_seconds: float,
    evaluation_seconds: float,
    budget_seconds: float,
    target: float,
) -> tuple[float, Plan | Refusal, list[Trial]]:
    """(the first guess, the plan or refusal for this budget, every trial) on this machine (`fedat.lab.plan`)."""
    guess = first_guess(exp, train_samples, step_seconds, target)

    def measured(time_scale: float, concurrency: int) -> Trial:
        return trial_at(exp, train_samples, step_seconds, evaluation_seconds, time_scale, concurrency)

    decision, trials = plan(guess, budget_seconds, target, profile_concurrencies(exp, len(train_samples)), measured)
    return guess, decision, trials


def main() -> None:
    """Read the request on stdin, print the plan (or the refusal) and the trials."""
    logging.basicConfig(level=logging.ERROR)
    req = json.load(sys.stdin)
    e = req["experiment"]
    exp = Experiment(str(e["name"]), int(e["workers"]), float(e["minutes"]), dict(e["settings"]))
    guess, decision, trials = plan_run(
        exp,
        list(req["train_samples"]),
        float(req["step_seconds"]),
        float(req.get("evaluation_seconds", 0.0)),
        float(req["budget_seconds"]),
        float(req["target"]),
    )
    print(json.dumps(report(guess, decision, trials)), flush=True)


def report(guess: float, decision: Plan | Refusal, trials: list[Trial]) -> dict:
    """The plan as JSON: the decision, and each trial in brief (`fedat run` records it)."""
    return {
        "guess": guess,
        "plan": asdict(decision) if isinstance(decision, Plan) else None,
        "refusal": asdict(decision) if isinstance(decision, Refusal) else None,
        "trials": [
            {
                "time_scale": t.time_scale,
                "profile_concurrency": t.profile_concurrency,
                "every_tier_at": t.every_tier_at(),
                "late_fraction": round(t.late_fraction(t.horizon), 4),
                "busy": round(t.busy(), 4),
                "updates": len(t.update_times),
                "horizon_seconds": round(t.horizon, 1),
            }
            for t in trials
        ],
    }


if __name__ == "__main__":
    main()
