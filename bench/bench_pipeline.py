"""Pipeline benchmarks, side by side in one run: training through the broker vs the bare trainer, and the
aggregator side (barrier + global aggregator) merge rate for the paper's CNN through RabbitMQ vs the same services on
the simulator's in-memory broker. Uses a fresh vhost, deleted after."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fedat.ops import broker_admin  # noqa: E402
from fedat.protocol import topology  # noqa: E402
from fedat.protocol.wire import TierAssignment, TrainTask, Update, encode_model  # noqa: E402
from tests.factories import seed  # noqa: E402
from tests.integration.broker import fetch, fetch_n, publish, running, tap  # noqa: E402

N_TASKS = 16
EPOCHS = 1
# The aggregator side through RabbitMQ against the same services in memory: at half the in-memory rate, the transport
# (confirmed publishes, persistent checkpoints, pika's framing of ~0.25 MB bodies) costs as much as the services' own
# decoding and merging; more than that and the broker path, not the math, is what to make faster.
AGGREGATOR_TARGET = 0.5
CNN_SHAPES = [(3, 3, 1, 32), (32,), (3, 3, 32, 64), (64,), (3, 3, 64, 64), (64,), (576, 64), (64,), (64, 10), (10,)]
ENV = {
    "FEDAT_NUM_CLIENTS": "100",
    "FEDAT_MODEL": "cnn",
    "FEDAT_TIME_SCALE": "0",
    "FEDAT_NUM_TIERS": "1",
    "FEDAT_METRICS_PORT": "0",
    "FEDAT_PROFILE_QUEUE": "0",
    "FEDAT_SIGNING": "off",  # the tasks are published unsigned, as the broker tests publish them
    "TF_CPP_MIN_LOG_LEVEL": "2",
}


def bare() -> None:
    """Subprocess mode: time N_TASKS trainings with the bare trainer (after one warm-up)."""
    from fedat_worker.workload import build, workload_from_env

    clients, model, trainer = build(workload_from_env({**os.environ}), 1)
    w = model.get_weights()
    c = clients[0]
    trainer.train(w, c.x_train, c.y_train, epochs=EPOCHS, prox_lambda=0.4, seed=0)
    t0 = time.perf_counter()
    for i in range(N_TASKS):
        trainer.train(w, clients[i].x_train, clients[i].y_train, epochs=EPOCHS, prox_lambda=0.4, seed=i)
    print(N_TASKS * EPOCHS / (time.perf_counter() - t0))


def cnn_layers(rng, codec="polyline"):
    weights = [rng.normal(0, 0.05, s).astype(np.float32) for s in CNN_SHAPES]
    return encode_model(weights, [f"l{i}" for i in range(len(weights))], codec, 4)


def through_pipeline(url: str) -> float:
    """Client-epochs/s of one worker process fed N_TASKS tasks through the broker (after one warm-up task)."""
    layers = cnn_layers(np.random.default_rng(0))
    env = {**os.environ, **ENV, "FEDAT_AMQP_URL": url}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedat_worker.worker_main"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def task(i):
            return TrainTask(
                id=f"t1-r{i}-c{i}-v0",
                client=i,
                tier=1,
                round=i,
                version=0,
                epochs=EPOCHS,
                batch_size=10,
                learning_rate=1e-3,
                prox_lambda=0.4,
                codec="polyline",
                precision=4,
                sent_at=time.time(),
                layers=layers,
            )

        publish(url, topology.TRAIN, topology.tier_key(1), task(N_TASKS), 1)  # warm-up: start-up and tracing
        deadline = time.monotonic() + 300
        while fetch(url, topology.barrier_queue(1), timeout=1.0) is None:
            if proc.poll() is not None or time.monotonic() > deadline:  # a worker that died fails the bench at once
                raise RuntimeError(f"the worker answered no task (exit code {proc.poll()}); run it by hand to see why")
        for i in range(N_TASKS):
            publish(url, topology.TRAIN, topology.tier_key(1), task(i), 1)
        t0 = time.perf_counter()
        fetch_n(url, topology.barrier_queue(1), N_TASKS, timeout=600)
        return N_TASKS * EPOCHS / (time.perf_counter() - t0)
    finally:
        proc.terminate()
        proc.wait()


def _answer(t: TrainTask, tier: int, payload, finished_at: float) -> Update:
    """A fake client's answer to task `t`: the same CNN-sized update every time, trained in no time."""
    return Update(
        id=f"u-{t.id}",
        task_id=t.id,
        client=t.client,
        tier=tier,
        round=t.round,
        base_version=t.version,
        n_samples=480,
        loss=0.1,
        dispatched_at=t.sent_at,
        started_at=t.sent_at,
        finished_at=finished_at,
        train_seconds=0.0,
        not_before=0.0,
        late=False,
        layers=payload,
    )


def fake_clients(url: str, payload, tiers: int, stop) -> None:
    """Answer every train task at once with the same CNN-sized update (a separate process). Deliveries are pushed
    and answers are not confirmed one by one: the clients of a deployment are many processes, and this one must not
    be what the services wait for."""
    import pika

    from fedat.protocol import wire

    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=100)

    def answer(channel, method, _props, body: bytes) -> None:
        t = wire.decode(body)
        u = _answer(t, t.tier, payload, time.time())
        channel.basic_publish(topology.RESULTS, topology.tier_key(t.tier), wire.encode(u), mandatory=True)
        channel.basic_ack(method.delivery_tag)

    for m in range(1, tiers + 1):
        ch.basic_consume(topology.train_queue(m), answer)
    while not stop.is_set():
        conn.process_data_events(time_limit=0.1)
    conn.close()


def _services(tiers: int, per_round: int):
    """The barrier and the aggregator as the main job runs them (FedAT, `tiers` tiers, `per_round` clients a round)."""
    from fedat.fl.strategies import build_strategy
    from fedat_aggregator.aggregator import Aggregator, AggregatorConfig
    from fedat_aggregator.barrier import Barrier, BarrierConfig

    cfg = BarrierConfig(
        tiers=tuple(range(1, tiers + 1)), clients_per_round=per_round, min_clients=per_round, min_deadline=60
    )
    return Barrier(cfg, build_strategy("fedat")), Aggregator(AggregatorConfig(num_tiers=tiers), build_strategy("fedat"))


def _assignment(tiers: int) -> TierAssignment:
    groups = tuple(tuple(range(m * 20, (m + 1) * 20)) for m in range(tiers))
    return TierAssignment(
        id="a1", epoch=1, tiers=groups, latencies={c: 0.1 for g in groups for c in g}, created_at=time.time()
    )


def aggregator_side(url: str, versions: int = 60, tiers: int = 5, per_round: int = 10, persist: bool = True) -> float:
    """Updates/s merged by barrier + aggregator (5 tiers, as in the main job) for CNN-sized polyline updates.

    With `persist`, both save a checkpoint before each output leaves (as deployed); without, state is memory only.
    """
    payload = cnn_layers(np.random.default_rng(1))
    b, a = _services(tiers, per_round)
    stop = multiprocessing.Event()
    # The clients run in their own process, as they would in a deployment, so they do not share our GIL.
    clients = multiprocessing.Process(target=fake_clients, args=(url, payload, tiers, stop), daemon=True)
    with running(b, url, tiers, prefetch=400, persist=persist), running(a, url, tiers, persist=persist):
        clients.start()
        publish(url, topology.CONTROL, "", _assignment(tiers), num_tiers=tiers)
        publish(url, topology.GLOBAL, "", seed(tiers, CNN_SHAPES, time.time()), num_tiers=tiers)
        first = last = None
        with tap(url, topology.GLOBAL) as models:  # one connection: the services share this process's interpreter
            while last is None or last.version < versions:
                g = models(timeout=120)
                assert g is not None, "aggregator produced nothing"
                if g.version >= 1 and first is None:
                    first = g
                last = g
        stop.set()
        clients.join(timeout=10)
    return (last.updates - first.updates) / (last.created_at - first.created_at)


def aggregator_side_in_memory(versions: int = 60, tiers: int = 5, per_round: int = 10) -> float:
    """The same merge rate with the same services, transport code and checkpoints on the simulator's in-memory broker,
    timed on the wall clock: what the two services cost without RabbitMQ, its confirms and its sockets."""
    import pika

    from fedat.protocol import wire
    from fedat.runtime.bus import BrokerConfig
    from fedat.runtime.publishing import properties
    from fedat_sim.clock import Clock
    from fedat_sim.memory import MemoryBroker
    from fedat_sim.shell import Process

    payload = cnn_layers(np.random.default_rng(1))
    clock = Clock()
    broker = MemoryBroker(clock)
    broker.declare_topology(tiers)
    merged: list[tuple[int, float]] = []  # (updates, wall seconds) of each global model from version 1 on

    def answer(exchange: str, key: str, body: bytes, props: pika.BasicProperties) -> None:
        if exchange == topology.TRAIN and props.type == TrainTask.kind:
            t = wire.decode(body)  # a client decodes its task, as fake_clients does
            u = _answer(t, t.tier, payload, clock.now)
            reply = (topology.RESULTS, topology.tier_key(t.tier), wire.encode(u), properties("update", u.id))
            clock.after(0.001, lambda: broker.publish(*reply))
        elif exchange == topology.GLOBAL and props.type == "global-model":
            g = wire.decode(body)
            if g.version >= 1:
                merged.append((g.updates, time.perf_counter()))

    broker.taps.append(answer)
    b, a = _services(tiers, per_round)
    for name, service, prefetch in (("barrier", b, 400), ("aggregator", a, 1)):
        Process(name, service, broker, clock, BrokerConfig(url="memory", num_tiers=tiers, prefetch=prefetch)).start()
    for exchange, msg in ((topology.CONTROL, _assignment(tiers)), (topology.GLOBAL, seed(tiers, CNN_SHAPES, 0.0))):
        broker.publish(exchange, "", wire.encode(msg), properties(msg.kind, msg.id))
    while not merged or merged[-1][0] < merged[0][0] + (versions - 1) * per_round:
        if clock.step() is None:
            raise RuntimeError("the in-memory aggregator side stopped before it merged enough")
    (u0, t0), (u1, t1) = merged[0], merged[-1]
    return (u1 - u0) / (t1 - t0)


def aggregator_rates(repeats: int = 3) -> tuple[float, float]:
    """Medians of `repeats` interleaved runs of both aggregator-side rates: through RabbitMQ (each on a fresh vhost,
    whose services start from no checkpoint), and in memory."""
    through, in_memory = [], []
    for _ in range(repeats):
        name = f"fedat-bench-{uuid.uuid4().hex[:8]}"
        try:
            through.append(aggregator_side(broker_admin.create_vhost(name)))
        finally:
            broker_admin.delete_vhost(name)
        in_memory.append(aggregator_side_in_memory())
    return float(np.median(through)), float(np.median(in_memory))


def main() -> None:
    """Print both tables."""
    if len(sys.argv) > 1 and sys.argv[1] == "bare":
        bare()
        return
    name = f"fedat-bench-{uuid.uuid4().hex[:8]}"
    url = broker_admin.create_vhost(name)
    only_aggregator = sys.argv[1:] == ["aggregator"]
    try:
        if only_aggregator:
            agg, mem = aggregator_rates()
            print(f"aggregator side: {agg:.0f} updates merged/s through RabbitMQ, {mem:.0f} in memory", end="")
            print(f" ({agg / mem:.0%})")
            return
        env = {**os.environ, **ENV}
        bare_rate = float(
            subprocess.run([sys.executable, __file__, "bare"], env=env, capture_output=True, text=True, check=True)
            .stdout.strip()
            .splitlines()[-1]
        )
        pipe_rate = through_pipeline(url)
        print("\n## Training throughput, CNN, 480 samples, batch 10, E=1, one process, 1 thread\n")
        print("| path | client-epochs/s |\n|---|---:|")
        print(f"| bare LocalTrainer | {bare_rate:.2f} |\n| through the broker (worker process) | {pipe_rate:.2f} |")
        print(f"| **ratio pipeline / bare** | **{pipe_rate / bare_rate:.0%}** (target >= 85%) |")
        agg, mem = aggregator_rates()
        print("\n## Aggregator side (barrier + global aggregator, 5 tiers x 10 clients), CNN updates, polyline p=4\n")
        print("| path | updates merged/s |\n|---|---:|")
        print(f"| in memory (the same services, transport code and checkpoints) | {mem:.0f} |")
        print(f"| through RabbitMQ (confirmed checkpoints, each outbox one transaction) | {agg:.0f} |")
        print(f"| **ratio RabbitMQ / in memory** | **{agg / mem:.0%}** (target >= {AGGREGATOR_TARGET:.0%}) |")
    finally:
        broker_admin.delete_vhost(name)


if __name__ == "__main__":
    main()
