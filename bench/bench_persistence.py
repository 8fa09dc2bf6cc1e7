"""What checkpoints cost, per strategy: the aggregator through the real transport with persistence on vs off, the
checkpoint bytes it writes per arrival, what a restart reads and how long it restores; and the barrier's checkpoint
when it opens a round, with polyline and with the delta codec; and a snapshot larger than a message, in parts.

"Off" is the service's real per-arrival work through the transport, as `run_service` does it: consume the tier model
from its queue, decode and verify it, run the handler, encode and sign the global model, publish it with a confirm,
ack, and take its own global model back off `fedat.aggregator.global` (it adopts only the seed's). "On" is the same
plus the checkpoint written ahead of the publish (the state, the models it holds, the outbox) and confirmed. Both run
the same arrivals from the same queue, interleaved, on the paper's CNN (93,322 weights): 5 tiers, 10 clients per
tier model, 100 clients, signed as a deployment signs.
"""

from __future__ import annotations

import statistics
import sys
import time
import uuid
from dataclasses import replace

import numpy as np
from prometheus_client import CollectorRegistry

from fedat.fl.strategies import REGISTRY, build_strategy
from fedat.ops import broker_admin
from fedat.protocol import checkpoint, journal, signing, system, topology, wire
from fedat.protocol.checkpoint import Checkpoint
from fedat.protocol.modelstore import Models, Stored
from fedat.protocol.service import Held, Inbound, Observation, Outgoing
from fedat.protocol.wire import TierAssignment, TierModel, encode_model, seed_model
from fedat.runtime import brokerstore, bus, publishing
from fedat.runtime.metrics import transport_metrics
from fedat_aggregator.aggregator import MERGES, Aggregator, AggregatorConfig
from fedat_aggregator.barrier import Barrier, BarrierConfig

SHAPES = [(3, 3, 1, 32), (32,), (3, 3, 32, 64), (64,), (3, 3, 64, 64), (64,), (576, 64), (64,), (64, 10), (10,)]
NAMES = [f"layer{i}" for i in range(len(SHAPES))]
TIERS = 5
CLIENTS = 100
PER_ROUND = 10
ARRIVALS = 60
REPEATS = 5
PREFETCH = system.BY_NAME["aggregator"].prefetch  # as deployed
KEYRING = signing.Keyring.from_secret(bytes(range(32)))


def tier_models(rng: np.random.Generator, w0: list[np.ndarray]) -> list[TierModel]:
    """ARRIVALS tier models, round-robin over the tiers (base versions are set per strategy, see `based`)."""
    out = []
    for k in range(ARRIVALS):
        tier, number = 1 + k % TIERS, 1 + k // TIERS
        weights = [(w + rng.normal(0, 0.01, w.shape)).astype(np.float32) for w in w0]
        clients = tuple(sorted(int(c) for c in rng.choice(CLIENTS, PER_ROUND, replace=False)))
        layers = encode_model(weights, NAMES, "raw", 4)
        out.append(TierModel(f"tm{tier}-r{number}", tier, number, 0, 10 * PER_ROUND, clients, 0, 0, 0, 0.0, layers))
    return out


def based(strategy: str, arrivals: list[TierModel], g0: wire.GlobalModel) -> list[TierModel]:
    """The arrivals, each trained from the version before the newest the aggregator has when it comes (a dry run)."""
    a = Aggregator(AggregatorConfig(num_tiers=TIERS), build_strategy(strategy))
    state, _ = a.on_global(a.initial(), Inbound("q", g0, 0, False, 0, 0.0), 0.0, {})
    out = []
    for seq, tm in enumerate(arrivals, start=1):
        tm = replace(tm, base_version=max(0, state.version - 1))
        state, _ = a.on_tier_model(state, Inbound("q", tm, seq, False, 0, 0.0), 0.0, {})
        out.append(tm)
    return out


class Counting:
    """Counts the bytes published to the state exchange on a channel (the checkpoints) and the bytes got from queues
    (what a restore reads), passing everything on."""

    def __init__(self, channel):
        self.channel, self.state_bytes, self.got_bytes = channel, 0, 0
        self._publish, self._get = channel.basic_publish, channel.basic_get
        channel.basic_publish, channel.basic_get = self.basic_publish, self.basic_get

    def basic_publish(self, exchange, routing_key, body, properties=None, mandatory=False):
        if exchange == topology.STATE:
            self.state_bytes += len(body)
        return self._publish(exchange, routing_key, body, properties, mandatory=mandatory)

    def basic_get(self, queue, auto_ack=False):
        method, props, body = self._get(queue, auto_ack=auto_ack)
        self.got_bytes += len(body or b"")
        return method, props, body


def run(strategy: str, arrivals: list[TierModel], g0: wire.GlobalModel, persist: bool) -> dict[str, float]:
    """One run on a fresh vhost: seconds from the first arrival to the last merge; with `persist`, the checkpoint
    bytes written, what the store holds at the end, and the restore a restarted process does."""
    name = f"fedat-bench-{uuid.uuid4().hex[:8]}"
    url = broker_admin.create_vhost(name)
    cfg = bus.BrokerConfig(url=url, num_tiers=TIERS, prefetch=PREFETCH, keyring=KEYRING)
    try:
        conn = bus.connect(cfg)
        ch = bus.confirm_channel(conn, cfg)
        publishing.publish_sent(ch, bus.encode_all([Outgoing(topology.GLOBAL, "", g0)], cfg))
        publishing.publish_sent(ch, bus.encode_all([Outgoing(topology.TIER_MODELS, "", tm) for tm in arrivals], cfg))
        conn.close()

        service = Aggregator(AggregatorConfig(num_tiers=TIERS), build_strategy(strategy))
        merged = []
        stamps: list[float] = []

        def observe(o: Observation) -> None:
            if o.name == MERGES:
                merged.append(o)
                stamps.append(time.perf_counter())

        conn = bus.connect(cfg)
        ch = bus.confirm_channel(conn, cfg)
        ch.basic_qos(prefetch_count=PREFETCH)
        counting = Counting(ch)
        metrics = transport_metrics(CollectorRegistry(), "aggregator")
        runner = bus.Runner(service, cfg, metrics, time.time, persist, observe)
        session = bus.Session(conn, ch, runner, group=True)  # as run_service runs it
        session.start()
        started = time.perf_counter()
        while len(merged) < len(arrivals):
            if time.perf_counter() - started > 600:
                raise RuntimeError(f"{strategy}: {len(merged)} of {len(arrivals)} arrivals merged in 10 minutes")
            conn.process_data_events(time_limit=0.05)
            session.flush()
        out = {"seconds": stamps[-1] - started, "written": float(counting.state_bytes)}
        conn.close()  # the process is gone: what is left is on the broker
        if persist:
            conn = bus.connect(cfg)
            ch = bus.confirm_channel(conn, cfg)
            counting = Counting(ch)
            fresh = bus.Runner(service, cfg, transport_metrics(CollectorRegistry(), "a"), time.time, True)
            began = time.perf_counter()
            fresh.restore(ch)
            out["restore"] = time.perf_counter() - began
            out["held"] = float(counting.got_bytes)
            # the alternative: a checkpoint that holds the whole state (every model inline) and the outbox
            latest = fresh.store.load(ch)
            whole = Checkpoint(service.name, latest.seq, 0.0, service.codec.encode(fresh.state), latest.outbox)
            out["whole"] = float(len(checkpoint.encode(whole)))
            conn.close()
        return out
    finally:
        broker_admin.delete_vhost(name)


def barrier_checkpoint(codec: str, w0: list[np.ndarray]) -> tuple[int, int, int]:
    """State and outbox bytes of the barrier's checkpoint when a global model opens one round in each tier, and the
    checkpoint as saved (one zstd frame)."""
    b = Barrier(
        BarrierConfig(tiers=tuple(range(1, TIERS + 1)), clients_per_round=PER_ROUND, codec=codec, min_deadline=60),
        build_strategy("fedat"),
    )
    groups = tuple(tuple(range(m * 20, (m + 1) * 20)) for m in range(TIERS))
    state = b.initial()
    assignment = TierAssignment("a1", 1, groups, {c: 0.1 for g in groups for c in g}, 0.0)
    state, _ = b.on_assignment(state, Inbound("q", assignment, 1, False, 0, 0.0), 0.0, {})
    state, fx = b.on_global(state, Inbound("q", seed_model(w0, NAMES, TIERS, codec, 4, 0.0), 2, False, 0, 0.0), 0.0, {})
    sent = bus.encode_all(fx.publish, bus.BrokerConfig(num_tiers=TIERS))
    encoded = b.codec.encode(state)
    saved = checkpoint.encode(Checkpoint(b.name, 1, 0.0, encoded, sent))
    return len(encoded), sum(len(s.body) for s in sent), len(saved)


def real_barrier_checkpoints(codec: str, w0: list[np.ndarray], downloads: bool, versions: int = 40) -> dict:
    """Real clients: what the barrier's checkpoints write over `versions` global models (each merging the oldest
    round; every client answers), with tasks sent against the versions clients keep or whole, saved as the
    transport saves them (snapshot and journal). Per round over the second half."""
    cfg = BarrierConfig(
        tiers=tuple(range(1, TIERS + 1)),
        clients_per_round=PER_ROUND,
        codec=codec,
        min_deadline=60,
        real_clients=True,
        relative_downloads=downloads,
    )
    b = Barrier(cfg, build_strategy("fedat"))
    groups = tuple(tuple(range(m * 20, (m + 1) * 20)) for m in range(TIERS))
    state, tag, held = b.initial(), 0, {}
    models, book = Models(), journal.Journal()
    written: list[int] = []

    def feed(handler, msg, now):
        nonlocal state, tag
        tag += 1
        inbound = Inbound("q", msg, tag, False, 0, now)
        before = state
        state, fx = handler(state, inbound, now, dict(held))
        for t, note in fx.hold:
            held[t] = Held(inbound, note)
        for t in fx.ack:
            held.pop(t, None)
        if state is not before or fx.publish:  # what the transport saves (bus.Durable.save)
            models.begin()
            encoded = b.codec.encode(state, models.reference)
            sent = bus.encode_all(fx.publish, bus.BrokerConfig(num_tiers=TIERS))
            c = book.record(Checkpoint(b.name, len(written) + 1, now, encoded, sent), models.end())
            written.append(len(checkpoint.encode(c)))
            book.saved(c)
        return fx

    feed(b.on_assignment, TierAssignment("a1", 1, groups, {c: 0.1 for g in groups for c in g}, 0.0), 0.0)
    rng = np.random.default_rng(1)
    w = [a.copy() for a in w0]
    fx = feed(b.on_global, seed_model(w0, NAMES, TIERS, codec, 4, 0.0), 0.0)
    tasks: list[wire.TrainTask] = []
    per_task: list[float] = []
    marks: list[int] = []
    for v in range(1, versions + 1):
        now = float(v)
        new = [o.message for o in fx.publish if isinstance(o.message, wire.TrainTask)]
        per_task += [wire.model_bytes(t.layers) for t in new]
        tasks += new
        marks.append(len(written))
        # The oldest collecting round's clients answer, and the next global model merges it.
        first = tasks[0]
        mine = [t for t in tasks if (t.tier, t.round) == (first.tier, first.round)]
        tasks = [t for t in tasks if (t.tier, t.round) != (first.tier, first.round)]
        for t in mine:
            feed(b.on_update, answer(t, encode_model(w, NAMES, codec, 4)), now)
        w = [(a + rng.normal(0, 0.002, a.shape)).astype(np.float32) for a in w]
        rounds = tuple(state.closed.get(m, 0) for m in range(1, TIERS + 1))
        g = wire.GlobalModel(
            f"g{v}", v, first.tier, first.round, ((first.tier, first.round),), rounds, rounds, (0.2,) * TIERS,
            0, 0, 0, 0, now, encode_model(w, NAMES, codec, 4),
        )  # fmt: skip
        fx = feed(b.on_global, g, now)
    half = versions // 2
    rounds_measured = versions - half
    return {
        "written": sum(written[marks[half] :]) / rounds_measured,
        "per_task": statistics.median(per_task[len(per_task) // 2 :]),
        "kept": len(state.kept) + len(state.bases),
    }


def parts_vs_whole(copies: int, part_bytes: int) -> dict[str, list[float]]:
    """ASO-Fed's snapshot of `copies` client models (CNN) saved and restored through the broker, in one message and
    in parts of at most `part_bytes`, interleaved over REPEATS: seconds of each save and each restore."""
    rng = np.random.default_rng(3)
    models = Models()
    models.begin()
    for _ in range(copies):
        for s in SHAPES:
            models.reference(rng.normal(0, 0.05, s).astype(np.float32))
    live = models.end()
    snapshot = Checkpoint("aggregator", 1, 0.0, b"state", (), {}, {d: Stored.of(d, a) for d, a in live.items()})
    whole = len(checkpoint.encode(snapshot)) + (1 << 20)
    out: dict[str, list[float]] = {k: [] for k in ("save whole", "save parts", "restore whole", "restore parts")}
    name = f"fedat-bench-{uuid.uuid4().hex[:8]}"
    url = broker_admin.create_vhost(name)
    cfg = bus.BrokerConfig(url=url, num_tiers=1)
    try:
        conn = bus.connect(cfg)
        ch = bus.confirm_channel(conn, cfg)
        for _ in range(REPEATS):
            for how, limit in (("whole", whole), ("parts", part_bytes)):
                t0 = time.perf_counter()
                brokerstore.BrokerStore("aggregator", limit).save(ch, snapshot)
                out[f"save {how}"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                restored = brokerstore.BrokerStore("aggregator", limit).restore(ch)
                out[f"restore {how}"].append(time.perf_counter() - t0)
                assert restored is not None and set(restored.checkpoint.models) == set(live)
        conn.close()
    finally:
        broker_admin.delete_vhost(name)
    return out


def answer(task: wire.TrainTask, layers: tuple[wire.Layer, ...]) -> wire.Update:
    """A client's answer to `task` (its weights do not matter here: the barrier only averages them)."""
    return wire.Update(
        f"u-{task.id}", task.id, task.client, task.tier, task.round, task.version, 10, 0.5,
        task.sent_at, task.sent_at, task.sent_at, 0.01, 0.0, False, layers,
    )  # fmt: skip


def main() -> None:
    """Print the persistence tables."""
    rng = np.random.default_rng(0)
    w0 = [rng.normal(0, 0.05, s).astype(np.float32) for s in SHAPES]
    g0 = seed_model(w0, NAMES, TIERS, "polyline", 4, 0.0)
    arrivals = tier_models(rng, w0)
    rows = []
    for strategy in sys.argv[1:] or sorted(REGISTRY):  # a few names: only those
        mine = based(strategy, arrivals, g0)
        off, on = [], []
        for _ in range(REPEATS):  # interleaved, so that drift of the machine hits both alike
            off.append(run(strategy, mine, g0, persist=False))
            on.append(run(strategy, mine, g0, persist=True))
        rows.append((strategy, off, on))

    updates = ARRIVALS * PER_ROUND
    print(f"\n## Persistence per strategy: the aggregator, {ARRIVALS} tier models of {PER_ROUND} clients (CNN)\n")
    print(
        "Merged client updates per second through the transport (median of "
        f"{REPEATS} runs each, interleaved), with checkpoints on and off; on / off is the median over the pairs of "
        "runs made one after the other; written = bytes published to "
        "`fedat.state` per arrival; whole state = one checkpoint holding the whole state after the last arrival "
        "(every model inline) and its outbox, what each arrival would write without the journal; "
        "read = the checkpoint bytes a restarted process reads from the broker; "
        "restore = load, decode and re-send the outbox after the process is gone.\n"
    )
    print(
        "| strategy | written per arrival | whole state | off (updates/s) | on (updates/s) | on / off | read "
        "| restore (s) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    ratios = []
    for strategy, off, on in rows:
        t_off = statistics.median(r["seconds"] for r in off)
        t_on = statistics.median(r["seconds"] for r in on)
        # each on run against the off run just before it: the machine's drift hits both of a pair alike
        ratio = statistics.median(a["seconds"] / b["seconds"] for a, b in zip(off, on, strict=True))
        written = statistics.median(r["written"] for r in on) / ARRIVALS
        held = statistics.median(r["held"] for r in on)
        restore = statistics.median(r["restore"] for r in on)
        whole = statistics.median(r["whole"] for r in on)
        ratios.append(ratio)
        print(
            f"| {strategy} | {written / 1e6:.2f} MB | {whole / 1e6:.2f} MB | {updates / t_off:.0f} "
            f"| {updates / t_on:.0f} | {ratio:.0%} | {held / 1e6:.1f} MB | {restore:.3f} |"
        )
    print(f"\nMedian on / off: {statistics.median(ratios):.0%} (target >= 80 % each).")

    print(f"\n## The barrier's checkpoint when a global model opens a round in each of {TIERS} tiers\n")
    print(
        f"{TIERS * PER_ROUND} tasks, each carrying the model: the outbox holds one copy per task, the state the model "
        "once (and, with the delta codec, the older models that rounds still collecting started from); saved, the "
        "checkpoint is one zstd frame whose window spans it, so the tasks' copies become back-references.\n"
    )
    print("| global model codec | state bytes | outbox bytes | per task | saved |")
    print("|---|---:|---:|---:|---:|")
    for codec in ("polyline", "delta"):
        state_bytes, outbox_bytes, size = barrier_checkpoint(codec, w0)
        print(
            f"| {codec} | {state_bytes / 1e6:.2f} MB | {outbox_bytes / 1e6:.2f} MB "
            f"| {outbox_bytes / (TIERS * PER_ROUND) / 1e3:.0f} kB | {size / 1e6:.2f} MB |"
        )

    print(
        "\n## The barrier's checkpoint with real clients, tasks against the versions clients keep or whole\n\n"
        f"{TIERS} tiers of 20 clients, {PER_ROUND} a round, every client answering; 40 global models, each merging "
        "the oldest round and opening the next; every transition saved as the transport saves it (a snapshot, or "
        "a journal entry with the arrays no earlier record carried), bytes per round over the last 20. With tasks "
        "sent against kept versions the state holds, decoded, the global models clients keep (the newest "
        f"{BarrierConfig().download_bases}) and those collecting rounds started from; per task: the median task's "
        "model bytes.\n"
    )
    print("| global model codec | tasks | per task | checkpoints written per round | older models kept |")
    print("|---|---|---:|---:|---:|")
    for codec in ("polyline", "delta"):
        for downloads in (False, True):
            r = real_barrier_checkpoints(codec, w0, downloads)
            how = "against kept versions" if downloads else "whole"
            print(f"| {codec} | {how} | {r['per_task'] / 1e3:.0f} kB | {r['written'] / 1e6:.2f} MB | {r['kept']} |")

    copies, part = 160, 16 << 20
    t = parts_vs_whole(copies, part)
    print(
        f"\n## A snapshot larger than a message: ASO-Fed's copies of {copies} clients' CNNs, in parts\n\n"
        f"The snapshot ({copies * 4 * sum(int(np.prod(s)) for s in SHAPES) / 1e6:.0f} MB of arrays) saved and "
        "restored through the broker as one message (under the broker's 128 MiB limit) and in parts of at most "
        f"{part >> 20} MiB (RabbitMQ 4.x's default limit), interleaved, median of {REPEATS}. Restore = read both "
        "journal queues and the state queue, decode, check every array's digest.\n"
    )
    print("| | one message (s) | in parts (s) | parts / one |\n|---|---:|---:|---:|")
    for what in ("save", "restore"):
        one, parts = statistics.median(t[f"{what} whole"]), statistics.median(t[f"{what} parts"])
        print(f"| {what} | {one:.2f} | {parts:.2f} | {parts / one:.0%} |")
    print("\nTarget: parts / one <= 120 % each way.")


if __name__ == "__main__":
    main()
