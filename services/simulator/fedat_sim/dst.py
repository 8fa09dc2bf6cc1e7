"""Deterministic simulation testing: the production services, injected faults from one seed, the guarantees checked.

One seed fixes everything: the experiment's seed (partition, client selection, delays), the clock's tie-breaking and
every fault (`fedat_sim.faults`). The services are the real barrier, aggregator, profiler, evaluator, worker and
recorder over the memory broker; only the trainer is the numpy stand-in of `fedat_sim.fakes`, so that hundreds of
seeds run in a minute. After every event the monitor checks what cannot be undone later (a version published with
two contents or out of order, a round merged twice, a round closed twice differently, a delivery settled twice);
at the end, with faults off, workers and profiler stopped and the rest drained (as `make chaos` does),
`fedat.ops.invariants.check` and the broker's ledger audit check the rest, and every durable service's checkpoints
on the broker must restore. Every state a service saves must be a value: a part of it changed in place after a save
fails the seed (`StateCodec.verify`). Every other turn of the strategies writes the aggregator's checkpoints in as
many parts as they allow (`fedat_sim.parted`), so crashes land between the parts of a checkpoint too. A failing
seed replays exactly:

    python -m fedat_sim.dst --seed N [--minutes M] [--strategy S]   (a range: --seeds A B --jobs 2)
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import random
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from fedat.deploy.experiment import Experiment
from fedat.errors import CheckpointError
from fedat.lab.recorder import RunState
from fedat.protocol import ids, journal, topology
from fedat.protocol.checkpoint import Checkpoint
from fedat.protocol.statecodec import StateCodec
from fedat.protocol.system import DURABLE
from fedat.runtime import brokerstore
from fedat_sim.clock import Clock, Event
from fedat_sim.fakes import fake_parts
from fedat_sim.faults import FaultPlan, Injector
from fedat_sim.memory import MemoryBroker
from fedat_sim.monitor import Monitor, Violation
from fedat_sim.shell import ServiceDied
from fedat_sim.system import System, secret_for

MINUTES = 3.0  # virtual minutes of faults per seed, by default
DRAIN_SECONDS = 60.0  # virtual seconds the remaining services get to settle once workers and profiler stop
STRATEGIES = ("fedat", "fedat-uniform", "tifl", "fedasync", "fedbuff", "fedat-delta")  # names in the registry
ONE_ROUND_PER_TIER = frozenset({"fedat", "fedat-uniform", "fedat-delta", "tifl"})  # see fedat.ops.invariants.check
NUM_CLIENTS = 10
PARTED = ("aggregator",)  # the one service whose state holds models, written in parts on the seeds `parts_for` picks


def experiment(seed: int, strategy: str) -> Experiment:
    """A small deployment in the paper's regime (time scale 1, delays of seconds), fast enough for many seeds."""
    settings: dict = {
        "strategy": strategy,
        "num_clients": NUM_CLIENTS,
        "num_tiers": 3,
        "clients_per_round": 3,
        "min_clients": 2,
        "epochs": 2,
        "batch_size": 10,
        "codec": "polyline",
        "precision": 4,
        "time_scale": 1.0,
        "delays": [0, 0, 2, 6, 10, 20],
        "device_factor": [1, 3],
        "step_seconds": 0.5,  # 20 samples, batch 10, 2 epochs: 2 s of nominal compute before the device factor
        "unstable_clients": 1,
        "drop_window": [30, 240],
        "eval_every": 0,
        "eval_interval": 15,
        "profile_concurrency": 5,
        "profile_deadline": 60,
        "min_deadline": 5,
        "retier_every": 10,
        "max_misses": 2,
        "seed": seed,
    }
    if strategy not in ONE_ROUND_PER_TIER:  # the asynchronous methods run with one tier, one client per round
        settings.update(num_tiers=1, clients_per_round=1, min_clients=1)
    return Experiment(f"dst-{strategy}", 2, 0, settings)


@dataclass
class Outcome:
    """What one seed did and whether every guarantee held."""

    seed: int
    strategy: str
    minutes: float
    plan: FaultPlan = field(default_factory=FaultPlan)
    problems: list[str] = field(default_factory=list)
    info: dict = field(default_factory=dict)
    faults: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing broke."""
        return not self.problems

    def replay(self) -> str:
        """The one-line command that replays this seed exactly."""
        args = f"--seed {self.seed} --minutes {self.minutes:g} --strategy {self.strategy}"
        custom = "" if self.plan == FaultPlan() else f"  # and plan={self.plan} (run_seed's `plan`)"
        return f"{sys.executable} -m fedat_sim.dst {args}{custom}"

    def report(self) -> str:
        """A few lines for a failure message."""
        head = f"seed {self.seed} ({self.strategy}, {self.minutes:g} virtual min): " + ("ok" if self.ok else "FAILED")
        lines = [head, *("  " + p for p in self.problems[:10]), f"  {self.info}"]
        if not self.ok:
            lines += ["  last faults:", *("    " + f for f in self.faults[-15:]), f"  replay: {self.replay()}"]
        return "\n".join(lines)


def strategy_for(seed: int) -> str:
    """Seeds take the strategies in turn."""
    return STRATEGIES[seed % len(STRATEGIES)]


def parts_for(seed: int) -> bool:
    """Every other turn of the strategies writes the aggregator's checkpoints in parts (`fedat_sim.parted`)."""
    return (seed // len(STRATEGIES)) % 2 == 1


def run_seed(
    seed: int, minutes: float = MINUTES, strategy: str | None = None, plan: FaultPlan | None = None
) -> Outcome:
    """Run one seed with faults (default `FaultPlan()`) for `minutes` of virtual time, drain, check every guarantee."""
    verify, StateCodec.verify = StateCodec.verify, True  # a state changed in place after it was saved fails the seed
    try:
        return _run_seed(seed, minutes, strategy, plan)
    finally:
        StateCodec.verify = verify


def _run_seed(seed: int, minutes: float, strategy: str | None, plan: FaultPlan | None) -> Outcome:
    strategy = strategy or strategy_for(seed)
    plan = plan or FaultPlan()
    exp = experiment(seed, strategy)
    clock = Clock(rng=random.Random(seed))
    injector = Injector(plan, random.Random(f"fedat-sim-faults/{seed}"), clock)
    broker = MemoryBroker(clock, injector)
    monitor = Monitor(broker)
    out = Outcome(seed, strategy, minutes, plan, faults=injector.log)
    events = io.StringIO()
    parted = PARTED if parts_for(seed) else ()
    system = System(
        exp,
        fake_parts(NUM_CLIENTS, seed=seed),
        clock,
        broker,
        RunState(clock.now),
        events,
        2,
        secret_for(seed),
        parted=parted,
    )
    parts_written = [0]

    def count_parts(exchange: str, _key: str, _body: bytes, props) -> None:
        if exchange == topology.STATE and brokerstore.PART_ID in (props.message_id or ""):
            parts_written[0] += 1

    broker.taps.append(count_parts)

    def after_each(event: Event) -> None:
        broken = monitor.now_broken()
        if broken:
            raise Violation(f"after event {clock.events_run} ({event.label}) at t={clock.now - start:.3f}: {broken}")

    start = clock.now
    end = start + minutes * 60.0
    try:
        system.start()
        injector.arm({n: p for n, p in system.processes.items() if n != "recorder"}, start, end)
        clock.run(end, after_each)
        injector.stop(system.processes)
        system.stop([*system.workers(), "profiler"])  # nothing new comes in; the rest settles
        clock.run(end + DRAIN_SECONDS, after_each)
    except (Violation, ServiceDied) as exc:
        out.problems.append(f"{type(exc).__name__}: {exc}")
    system.stop()
    queues = [topology.barrier_queue(m) for m in range(1, system.num_tiers + 1)] + [topology.AGGREGATOR_TIER_MODELS]
    out.problems += unrestorable(broker)
    try:
        pending = absorbed(broker, system)
    except CheckpointError:
        pending = []  # reported just above
    verdict, audit = monitor.verdict(queues, strategy in ONE_ROUND_PER_TIER, pending)
    out.problems += [f"{k}: {n} ({', '.join(verdict.examples.get(k, ()))})" for k, n in verdict.violated().items()]
    out.problems += audit
    counts = system.counts()
    if counts["handler_errors"]:
        out.problems.append(f"{counts['handler_errors']} handler errors (requeued or logged by the shell)")
    versions = max((g.version for g in monitor.records.globals), default=0)
    out.info = {
        "versions": versions,
        "events": clock.events_run,
        **counts,
        "updates_merged": verdict.info.get("updates_merged", 0),
        "dead_letters": verdict.info.get("dead_letters", 0),
        "fingerprint": monitor.fingerprint()[:16],
        "parted": ",".join(sorted(parted)),
        "parts_written": parts_written[0],
        # Known, reported, not (yet) a failure: fedat.lab.recorder writes a second `evaluation` line when an evaluator
        # that restarted scores a redelivered version again.
        "recorder_duplicate_evaluations": duplicate_evaluation_lines(events.getvalue()),
    }
    if versions == 0:
        out.problems.append("no global version beyond the seed: the pipeline never made progress")
    return out


def duplicate_evaluation_lines(events_jsonl: str) -> int:
    """Evaluation lines of events.jsonl beyond the first for their version."""
    lines = [json.loads(line) for line in events_jsonl.splitlines() if line.strip()]
    versions = [e["version"] for e in lines if e["event"] == "evaluation"]
    return len(versions) - len(set(versions))


def latest(broker: MemoryBroker, service: str) -> Checkpoint | None:
    """The checkpoint a restart of `service` would restore from what the broker holds (CheckpointError if none can)."""
    saved = broker.ready_messages(topology.state_queue(service))
    if not saved:
        return None
    queues = [topology.journal_queue(service, side) for side in topology.JOURNAL_SIDES]
    journals = [[e.body for e in broker.ready_messages(q)] for q in queues]
    return journal.latest(service, saved[-1].body, journals).checkpoint


def unrestorable(broker: MemoryBroker) -> list[str]:
    """A problem for each durable service whose checkpoints on the broker would not restore."""
    problems = []
    for service in DURABLE:
        try:
            latest(broker, service)
        except CheckpointError as exc:
            problems.append(f"{service} would not restore: {exc}")
    return problems


def absorbed(broker: MemoryBroker, system: System) -> list[str]:
    """Tier models the aggregator's last checkpoint holds as pending (FedBuff's buffer): merged by the next version."""
    last = latest(broker, "aggregator")
    if last is None:
        return []
    state = system.processes["aggregator"].service.codec.decode(last.state, last.models)
    return [ids.tier_model(t, r) for t, r in state.pending]


def run_seeds(seeds: Sequence[int], minutes: float = MINUTES, jobs: int = 1) -> list[Outcome]:
    """Several seeds, in `jobs` processes (spawned: a forked TensorFlow or pytest process is not safe to reuse)."""
    if jobs <= 1:
        return [run_seed(s, minutes) for s in seeds]
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(run_seed, seeds, [minutes] * len(seeds), chunksize=4))


def main(argv: list[str] | None = None) -> None:
    """`python -m fedat_sim.dst --seed N` replays one seed; `--seeds A B` runs a range."""
    p = argparse.ArgumentParser(prog="python -m fedat_sim.dst", description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--seeds", type=int, nargs=2, metavar=("FIRST", "LAST"), default=None)
    p.add_argument("--minutes", type=float, default=MINUTES, help="virtual minutes with faults, per seed")
    p.add_argument("--strategy", choices=STRATEGIES, default=None, help="default: by seed")
    p.add_argument("--jobs", type=int, default=1, help="processes for a range of seeds")
    args = p.parse_args(argv)
    if args.seed is not None:
        outcomes = [run_seed(args.seed, args.minutes, args.strategy)]
    else:
        first, last = args.seeds or (0, 0)
        outcomes = run_seeds(range(first, last + 1), args.minutes, args.jobs)
    for outcome in outcomes:
        print(outcome.report(), flush=True)
    failed = [o.seed for o in outcomes if not o.ok]
    print(f"{len(outcomes) - len(failed)} of {len(outcomes)} seeds ok" + (f"; failing: {failed}" if failed else ""))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
