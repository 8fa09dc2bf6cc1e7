"""What one more real client costs the server side, against today's pool of logical clients, in one run.

For 10, 100 and 1,000 clients, each mode runs the real server-side processes (barrier, aggregator, profiler, and the
collector for real clients) on a fresh provisioned vhost, with the same settings (5 tiers, 10 clients a round, an
evaluation every 5 s), and is measured over WINDOW seconds once every client is tiered:

- pool: one worker and one central evaluator, each the production service (`fedat_worker.worker.Worker`,
  `fedat_worker.evaluator.Evaluator`) with a numpy stand-in for training (the received model plus noise), serving
  every logical client; the latency model gives the clients the delays below.
- real: at 10 clients, 10 `fedat-client` processes (TensorFlow, the paper's CNN on 100 Fashion-MNIST images each,
  enrolled with `fedat.deploy.enroll`); beyond that, a light protocol-level client: the production
  `fedat_worker.client.Client` of every client, with the same numpy stand-in, multiplexed on one connection that
  signs each answer with its client's key (derived from the `clients` master), and the same delays as `--delay`.

Per closed tier round: messages and bytes the server side published, and what the clients published to it; the
broker's queues and their memory; the resident memory (VmRSS, and the peak VmHWM) of the barrier, the aggregator and
the profiler. Then the ratio real / pool at each size. `make bench` runs it (a few minutes); not part of `make test`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pika
import scrape  # bench/scrape.py: the management API and /metrics
from prometheus_client import CollectorRegistry

from fedat.deploy import enroll as enroll_mod
from fedat.deploy.launch import launch, metrics_ports
from fedat.deploy.ports import free_ports
from fedat.deploy.supervisor import Supervisor
from fedat.deploy.vhost import Vhost
from fedat.fl.latency import client_profiles
from fedat.protocol import ids, signing, topology
from fedat.protocol.service import NOTHING, Outgoing, Subscription, done
from fedat.protocol.system import Mode
from fedat.protocol.wire import ClientEvaluation, seed_model
from fedat.runtime import config
from fedat.runtime.bus import BrokerConfig, publish_once, run_service
from fedat.runtime.metrics import transport_metrics
from fedat_worker.client import Client, ClientConfig, parse_answer_timer
from fedat_worker.datasets import ClientData
from fedat_worker.evaluator import Evaluator, EvaluatorConfig
from fedat_worker.training import TrainResult
from fedat_worker.worker import Worker, WorkerConfig

ROOT = Path(__file__).resolve().parents[1]
SIZES = (10, 100, 1000)
WINDOW = float(os.environ.get("FEDAT_BENCH_CLIENTS_WINDOW", "30"))  # seconds measured per mode and size
REAL_PROCESSES = 10  # up to this many clients, real `fedat-client` processes (TensorFlow: ~0.5 GB each)
FLEET = 100  # light clients per connection (and thread)
NUM_TIERS = 5
DELAYS = (0.0, 0.0, 0.5, 1.0, 1.0, 1.5, 1.5, 2.0, 2.0, 2.5)  # lo, hi per delay group: what the clients add, seconds
SETTINGS = {
    "FEDAT_NUM_TIERS": str(NUM_TIERS),
    "FEDAT_CLIENTS_PER_ROUND": "10",
    "FEDAT_MIN_CLIENTS": "5",
    "FEDAT_EPOCHS": "1",
    "FEDAT_BATCH_SIZE": "10",
    "FEDAT_LEARNING_RATE": "0.001",
    "FEDAT_CODEC": "polyline",
    "FEDAT_PRECISION": "4",
    "FEDAT_MIN_DEADLINE": "4",
    "FEDAT_PROFILE_DEADLINE": "30",
    "FEDAT_PROFILE_CONCURRENCY": "200",
    "FEDAT_EVAL_EVERY": "0",
    "FEDAT_EVAL_INTERVAL": "5",
    "FEDAT_EVAL_WINDOW": "4",
    "FEDAT_DELAYS": ",".join(map(str, DELAYS)),
    "FEDAT_DEVICE_FACTOR": "1,1",
    "FEDAT_TIME_SCALE": "1",
    "FEDAT_SEED": "0",
    "FEDAT_SAMPLES_PER_CLIENT": "100",
    "FEDAT_LOG_LEVEL": "WARNING",
    "TF_CPP_MIN_LOG_LEVEL": "2",
}


class Noise:
    """Training stand-in: the received model plus a little noise; scoring: a constant. No TensorFlow."""

    def train(self, weights, x, y, *, epochs, prox_lambda, seed, learning_rate=None, batch_size=None) -> TrainResult:
        rng = np.random.default_rng(seed)
        out = [(w + rng.normal(0.0, 0.01, w.shape)).astype(np.float32) for w in weights]
        return TrainResult(out, len(x), 1.0, 0.001)

    def evaluate_per_client(self, weights, clients, batch_size=1000):
        return [(1.0, 0.5, len(y)) for _, y in clients]


def cnn() -> tuple[list[str], list[np.ndarray]]:
    """The paper's CNN's weight names and initial weights (built once with TensorFlow, in a child process)."""
    cache = ROOT / "results" / "bench-cache" / "cnn-w0.npz"
    if not cache.exists():
        cache.parent.mkdir(parents=True, exist_ok=True)
        code = (
            "import numpy as np, json, sys\n"
            "from fedat_worker.models import build_model, weight_names\n"
            "m = build_model('cnn', (28, 28, 1), 10, seed=0)\n"
            f"np.savez({str(cache)!r}, names=np.array(weight_names(m)), *m.get_weights())\n"
        )
        subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    with np.load(cache) as f:
        names = [str(n) for n in f["names"]]
        return names, [f[f"arr_{i}"] for i in range(len(names))]


def data(n: int = 100) -> ClientData:
    """A client's data as the stand-in sees it: only its size matters."""
    return ClientData(np.zeros((n, 1), np.float32), np.zeros(n, np.int64), np.zeros((20, 1), np.float32),
                      np.zeros(20, np.int64))  # fmt: skip


class Fleet:
    """Many light real clients on one connection: each client's own `Client`, its state kept under its id."""

    name = "client"

    def __init__(self, members: dict[int, Client]):
        self.members = members

    def initial(self) -> dict[int, object]:
        return {k: c.initial() for k, c in self.members.items()}

    def subscriptions(self) -> dict[str, Subscription]:
        subs = {}
        for k, c in self.members.items():
            for queue, sub in c.subscriptions().items():
                subs[queue] = Subscription(sub.expects, self._member(k, sub.handler))
        return subs

    def _member(self, k, handler):
        def handle(state, inbound, now, held):
            mine, fx = handler(state[k], inbound, now, held)
            return {**state, k: mine}, fx

        return handle

    def on_start(self, state, now):
        fx, after = NOTHING, {}
        for k, c in self.members.items():
            after[k], more = c.on_start(state[k], now)
            fx = fx + more
        return after, fx

    def on_timer(self, state, key, now, held):
        tag = parse_answer_timer(key)
        if tag not in held:
            return state, NOTHING
        k = int(held[tag].inbound.queue.split(".")[2])  # fedat.client.<k>
        mine, fx = self.members[k].on_timer(state[k], key, now, held)
        return {**state, k: mine}, fx


def delay_of(k: int, n: int) -> float:
    """The delay client k adds, as the pool's latency model would draw it for its delay group (the midpoint)."""
    profile = client_profiles(n, config.latency(SETTINGS), 0)[k]
    lo, hi = profile.delay
    return (lo + hi) / 2


def in_thread(service, cfg: BrokerConfig, stop: threading.Event):
    metrics = transport_metrics(CollectorRegistry(), service.name)
    t = threading.Thread(target=run_service, args=(service, cfg, metrics, stop), daemon=True)
    t.start()
    return t, metrics


SAMPLE = re.compile(
    r'^(fedat_messages_published_total|fedat_published_bytes_total)\{kind="([^"]+)"\} ([0-9.eE+-]+)$', re.M
)


def by_kind(texts: list[str], registries: list) -> dict[str, list[float]]:
    """kind -> [messages, bytes] published, from /metrics texts and in-process registries."""
    out: dict[str, list[float]] = {}
    for text in texts:
        for name, kind, value in SAMPLE.findall(text):
            out.setdefault(kind, [0.0, 0.0])[name == "fedat_published_bytes_total"] += float(value)
    for m in registries:
        for metric in m.registry.collect():
            for sample in metric.samples:
                if sample.name in ("fedat_messages_published_total", "fedat_published_bytes_total"):
                    kind = sample.labels["kind"]
                    out.setdefault(kind, [0.0, 0.0])[sample.name == "fedat_published_bytes_total"] += sample.value
    return out


def total(text: str, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.eE+-]+)$", text, re.M))


def rss_kib(pid: int) -> tuple[int, int]:
    text = Path(f"/proc/{pid}/status").read_text()
    get = lambda key: int(re.search(rf"{key}:\s+(\d+) kB", text).group(1))  # noqa: E731
    return get("VmRSS"), get("VmHWM")


EVAL_KINDS = ("evaluate", "client-evaluation", "evaluation")  # federated (or central) evaluation's traffic


@dataclass
class Row:
    clients: int
    mode: str
    seconds: float = 0.0
    rounds: float = 0.0
    evaluations: float = 0.0
    server_round: tuple[float, float] = (0.0, 0.0)  # per round: messages, bytes the server side published
    client_round: tuple[float, float] = (0.0, 0.0)  # per round: what the clients published
    server_eval: tuple[float, float] = (0.0, 0.0)  # per evaluation
    client_eval: tuple[float, float] = (0.0, 0.0)
    deliveries: float = 0.0  # per second, by the broker
    broker_bytes: float = 0.0  # per second, sent by the broker
    queues: int = 0
    queue_mib: float = 0.0
    rss: dict | None = None
    note: str = ""


def split(before: dict, after: dict, per_round: float, per_eval: float) -> tuple[tuple, tuple]:
    """((messages, bytes) per round of the round traffic, (messages, bytes) per evaluation of the evaluation's)."""
    d = {k: [after[k][i] - before.get(k, [0.0, 0.0])[i] for i in (0, 1)] for k in after}
    rnd = [sum(v[i] for k, v in d.items() if k not in EVAL_KINDS) / max(per_round, 1.0) for i in (0, 1)]
    ev = [sum(v[i] for k, v in d.items() if k in EVAL_KINDS) / max(per_eval, 1.0) for i in (0, 1)]
    return tuple(rnd), tuple(ev)


def broker_stats(vhost: str) -> tuple[float, float]:
    """(messages delivered, bytes sent) by the broker on `vhost` so far (its statistics, refreshed every 5 s)."""
    v = json.loads(scrape.get(f"{scrape.API}/vhosts/{urllib.parse.quote(vhost, safe='')}", auth=True))
    return float(v.get("message_stats", {}).get("deliver_get", 0)), float(v.get("send_oct", 0))


def tiered(port: int) -> int:
    return int(total(scrape.metrics(port), "fedat_tier_clients"))


class LightClient(Client):
    """The production client, but it reports a constant score without decoding the model it is asked about: what
    a client computes is not the server's cost, and one process cannot decode a model for a thousand clients."""

    def on_evaluate(self, state, inbound, now, held):
        req = inbound.message
        k = self.cfg.client
        score = ClientEvaluation(ids.client_evaluation(req.version, k), k, req.version, 1.0, 0.5, 20, now)
        out = Outgoing(topology.RESULTS, topology.from_client(topology.CLIENT_EVALUATION_KEY, k), score)
        return state, done(inbound, out)


def enroll_queues(url: str, n: int) -> None:
    """Client k's two queues for k < n, declared as the administrator, as enrollment does (no user per client)."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    for k in range(n):
        for q in topology.client_queues(k):
            ch.queue_declare(q.name, durable=True, arguments=q.arguments)
            for exchange, key in q.bindings:
                ch.queue_bind(q.name, exchange, key)
    conn.close()


def one(n: int, mode: Mode, names: list[str], w0: list[np.ndarray], logdir: Path) -> Row:
    """Run one mode with n clients: start, wait until every client is tiered, measure WINDOW seconds, stop."""
    vhost = Vhost(None, NUM_TIERS)
    vhost.open()
    stop = threading.Event()
    env = {**os.environ, **SETTINGS, "FEDAT_NUM_CLIENTS": str(n), "FEDAT_CLIENTS": mode.value}
    folder = logdir / f"{mode.value}-{n}"
    sup = Supervisor(env, folder)
    procs: list[subprocess.Popen] = []
    servers = ["barrier", "aggregator", "profiler"] + (["collector"] if mode is Mode.REAL else [])
    ports = metrics_ports(servers)
    row = Row(n, mode.value, note="pool")
    client_ports: list[int] = []
    client_registries: list = []
    server_registries: list = []
    try:
        profiles = client_profiles(n, config.latency(SETTINGS), 0)
        if mode is Mode.POOL:
            clients = [data() for _ in range(n)]
            wcfg = WorkerConfig(tuple(range(1, NUM_TIERS + 1)), True, config.latency(SETTINGS), 0)
            worker = Worker(wcfg, clients, Noise(), names, w0, profiles, time.time)
            client_registries.append(in_thread(worker, config.broker({**SETTINGS, **vhost.env("worker")}, 1), stop)[1])
            evaluator = Evaluator(EvaluatorConfig(0, 5.0), clients, Noise(), time.time)
            cfg = config.broker({**SETTINGS, **vhost.env("evaluator")}, 1)
            server_registries.append(in_thread(evaluator, cfg, stop)[1])  # the pool's evaluator is server side
        elif n <= REAL_PROCESSES:
            row.note = f"{n} fedat-client processes"
            client_ports = free_ports(n)
            for k in range(n):
                home = folder / f"client-{k}"
                enroll_mod.enroll(*vhost.management, vhost.name, k, vhost.secret, home, num_tiers=NUM_TIERS)
                cmd = [sys.executable, "-m", "fedat_worker.client_main", "--env", str(home / "client.env")]
                cmd += ["--delay", str(delay_of(k, n))] if delay_of(k, n) else []
                log = open(home / "client.log", "w")  # noqa: SIM115 — the process keeps it
                cenv = {**env, "FEDAT_METRICS_PORT": str(client_ports[k])}
                procs.append(subprocess.Popen(cmd, env=cenv, stdout=log, stderr=subprocess.STDOUT))
        else:
            row.note = f"light clients, {FLEET} per connection"
            url = f"amqp://guest:guest@127.0.0.1:5672/{urllib.parse.quote(vhost.name, safe='')}"
            enroll_queues(url, n)
            keys = signing.Keyring({"clients": signing.derive(vhost.secret, "clients")})  # signs as any client
            cfg = BrokerConfig(url=url, num_tiers=NUM_TIERS, prefetch=1, declare=False, keyring=keys)
            for lo in range(0, n, FLEET):
                members = {
                    k: LightClient(ClientConfig(k, "bench", delay_of(k, n)), data(), Noise(), names, w0, time.time)
                    for k in range(lo, min(n, lo + FLEET))
                }
                client_registries.append(in_thread(Fleet(members), cfg, stop)[1])

        def side(texts: list[str], registries: list) -> dict[str, list[float]]:
            return by_kind(texts, registries)

        def snapshot():
            texts = {name: scrape.metrics(ports[name]) for name in servers}
            server = side(list(texts.values()), server_registries)
            client = side([scrape.metrics(p) for p in client_ports], client_registries)
            evals = server.get("evaluation", [0.0])[0]
            return total(texts["barrier"], "fedat_tier_rounds_closed_total"), evals, server, client

        launch(sup, vhost, servers, ports)
        seed = BrokerConfig(url=vhost.url("seed"), num_tiers=NUM_TIERS, declare=False, keyring=vhost.keyring("seed"))
        publish_once(
            seed, [Outgoing(topology.GLOBAL, "", seed_model(w0, names, NUM_TIERS, "polyline", 4, time.time()))]
        )
        deadline = time.time() + 300
        while tiered(ports["profiler"]) < n:
            if time.time() > deadline:
                raise RuntimeError(f"{mode.value} {n}: only {tiered(ports['profiler'])} clients tiered after 300 s")
            time.sleep(1)
        time.sleep(5)  # every tier's first rounds under way

        a, ba, t0 = snapshot(), broker_stats(vhost.name), time.time()
        time.sleep(WINDOW)
        b, bb, t1 = snapshot(), broker_stats(vhost.name), time.time()
        row.seconds, row.rounds, row.evaluations = t1 - t0, b[0] - a[0], b[1] - a[1]
        row.server_round, row.server_eval = split(a[2], b[2], row.rounds, row.evaluations)
        row.client_round, row.client_eval = split(a[3], b[3], row.rounds, row.evaluations)
        row.deliveries, row.broker_bytes = ((bb[i] - ba[i]) / row.seconds for i in (0, 1))
        queues = json.loads(scrape.get(f"{scrape.API}/queues/{urllib.parse.quote(vhost.name, safe='')}", auth=True))
        row.queues = len(queues)
        row.queue_mib = sum(q.get("memory", 0) for q in queues) / 2**20
        pids = sup.pids()
        row.rss = {name: rss_kib(pids[name]) for name in ("barrier", "aggregator", "profiler")}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        stop.set()
        sup.close()
        time.sleep(1)
        vhost.close()
    return row


def mib(kib: int) -> str:
    return f"{kib / 1024:.0f}"


def pair(v: tuple[float, float]) -> str:
    return f"{v[0]:.1f}, {v[1] / 1e3:.0f}"


def table(rows: list[Row]) -> str:
    out = [
        "| clients | mode | rounds/s | per round: server msgs, KB | clients msgs, KB | evaluations | per evaluation: "
        "server msgs, KB | clients msgs, KB | broker deliveries/s, MB/s | queues, MiB | RSS MiB barrier / aggregator / "
        "profiler (peak) |",
        "|" + "---|" * 11,
    ]
    for r in rows:
        rss = " / ".join(f"{mib(now)} ({mib(peak)})" for now, peak in r.rss.values())
        out.append(
            f"| {r.clients} | {r.mode} | {r.rounds / r.seconds:.1f} | {pair(r.server_round)} | "
            f"{pair(r.client_round)} | {r.evaluations:.0f} | {pair(r.server_eval)} | {pair(r.client_eval)} | "
            f"{r.deliveries:.0f}, {r.broker_bytes / 1e6:.1f} | {r.queues}, {r.queue_mib:.1f} | {rss} |"
        )
    out += [
        "",
        "| clients | real / pool: per round server bytes | per evaluation server bytes | per evaluation clients "
        "bytes | broker MB/s | queues | RSS barrier | aggregator | profiler |",
        "|" + "---|" * 9,
    ]
    by = {(r.clients, r.mode): r for r in rows}
    ratio = lambda a, b: f"{a / b:.2f}" if b else "-"  # noqa: E731
    for n in sorted({r.clients for r in rows}):
        p, q = by.get((n, "pool")), by.get((n, "real"))
        if p is None or q is None:
            continue
        rss = [ratio(q.rss[s][0], p.rss[s][0]) for s in ("barrier", "aggregator", "profiler")]
        out.append(
            f"| {n} | {ratio(q.server_round[1], p.server_round[1])} | {ratio(q.server_eval[1], p.server_eval[1])} | "
            f"{ratio(q.client_eval[1], p.client_eval[1])} | {ratio(q.broker_bytes, p.broker_bytes)} | "
            f"{ratio(q.queues, p.queues)} | {' | '.join(rss)} |"
        )
    return "\n".join(out)


def main() -> None:
    names, w0 = cnn()
    logdir = ROOT / "results" / f"bench-clients-{time.strftime('%Y%m%d-%H%M%S')}"
    sizes = tuple(int(s) for s in os.environ.get("FEDAT_BENCH_CLIENTS_SIZES", ",".join(map(str, SIZES))).split(","))
    rows = []
    for n in sizes:
        for mode in (Mode.POOL, Mode.REAL):
            started = time.time()
            row = one(n, mode, names, w0, logdir)
            rows.append(row)
            took = time.time() - started
            print(f"[bench_clients] {n} clients, {mode.value}: {row.rounds:.0f} rounds, {row.evaluations:.0f} "
                  f"evaluations in {WINDOW:.0f} s ({row.note}; {took:.0f} s in all)", flush=True)  # fmt: skip
    print(f"\n## What a real client costs the server side (each mode measured {WINDOW:.0f} s once every client "
          "is tiered; the paper's CNN, 5 tiers, 10 clients a round, an evaluation every 5 s)\n")  # fmt: skip
    print(table(rows))
    print(
        "\nserver = barrier, aggregator, profiler and the evaluator (pool) or the collector (real); clients = the "
        "worker (pool) or the clients (real). Per round: what the round's kinds (tasks, updates, tier and global "
        "models, reports, assignments, joins) published in the window over the tier rounds closed in it; per "
        "evaluation: the evaluation's kinds (request, the clients' scores, the evaluation) over the evaluations "
        "published. The broker's deliveries and bytes sent (its statistics, refreshed every 5 s) count every copy "
        "a fanout makes, such as an evaluation request to each client's queue. Checkpoints are not counted "
        "(bench_persistence)."
    )


if __name__ == "__main__":
    main()
