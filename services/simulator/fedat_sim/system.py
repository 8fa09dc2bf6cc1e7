"""The whole deployment of one experiment on the memory broker: every service of the system table, as processes.

Which services exist, their roles and keys, which keep a checkpoint, their prefetch and their start phases come from
`fedat.protocol.system`, as for `fedat run`. Each service is configured exactly as its `main()` configures it, from
the experiment's `FEDAT_*` variables (the same `settings(env)` functions, so prefetch rules and validation are the
production ones), and each role signs and verifies with its own keyring (`fedat.protocol.signing.keys_for_role`),
derived from a secret. Three things differ from `fedat run`, on purpose: the worker consumes without a prefetch
limit and its updates become visible at their `not_before` (`fedat_sim.clients`); the seed job publishes from
inside the simulation, once every process has started (virtual time stands still during start-up, so starting it
first, as `fedat run` does to hide TensorFlow's start, would gain nothing); and the recorder is a process like the
others.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import replace
from functools import partial
from typing import IO

from fedat.deploy.experiment import Experiment
from fedat.fl.latency import client_profiles
from fedat.lab.recorder import Recorder, RunState
from fedat.protocol import signing, topology
from fedat.protocol.service import Observation, Outgoing
from fedat.protocol.system import BY_NAME, SERVICES, Mode, Phase, service
from fedat.protocol.wire import seed_model
from fedat.runtime import bus, config, publishing
from fedat_aggregator import aggregator_main, barrier_main
from fedat_aggregator.aggregator import Aggregator
from fedat_aggregator.barrier import Barrier
from fedat_profiler import main as profiler_main
from fedat_profiler.profiler import Profiler
from fedat_sim.clients import Parts, answer_at_not_before, simulated_worker
from fedat_sim.clock import Clock
from fedat_sim.memory import MemoryBroker
from fedat_sim.parted import PartedStore
from fedat_sim.pool import Finisher, PoolTrainer, answer_finished
from fedat_sim.shell import Process
from fedat_worker import evaluator_main, worker_main
from fedat_worker.evaluator import Evaluator
from fedat_worker.worker import WorkerConfig


def secret_for(seed: int) -> bytes:
    """A deterministic 32-byte signing secret for a simulation (a replay must sign identically)."""
    return hashlib.sha256(f"fedat-sim/{seed}".encode()).digest()


class System:
    """The processes of one run on one memory broker, started in `fedat run`'s order."""

    def __init__(
        self,
        exp: Experiment,
        parts: Parts,
        clock: Clock,
        broker: MemoryBroker,
        run_state: RunState,
        events: IO[str],
        workers: int = 1,
        secret: bytes | None = None,
        durable: bool = True,
        parted: Collection[str] = (),
    ):
        self.exp, self.parts, self.clock, self.broker = exp, parts, clock, broker
        self.durable = durable
        self.parted = frozenset(parted)  # services whose checkpoints go in parts wherever they can (`PartedStore`)
        self.env = {**exp.env(), "FEDAT_SIGNING": "off"}  # keys are given per role below, not through files
        self.num_tiers = config.get_int(self.env, "FEDAT_NUM_TIERS", 5)
        self.secret = secret
        self.observed: Counter[tuple[str, str, int]] = Counter()
        broker.declare_topology(self.num_tiers)
        self.processes: dict[str, Process] = {}
        self._add("recorder", Recorder(run_state, events), self._broker_cfg("recorder"))
        worker = worker_main.settings(self.env)
        wcfg = WorkerConfig(worker.tiers, worker.profile_queue, worker.straggler, worker.workload.seed)
        profiles = client_profiles(worker.workload.num_clients, worker.straggler, worker.workload.seed)
        wbroker = self._broker_cfg("worker", 0)  # no prefetch limit: every client trains on its own (virtual) core
        configure = answer_at_not_before
        if isinstance(parts.trainer, PoolTrainer):  # trained in other processes, finished when visible
            configure = answer_finished(Finisher(parts.trainer, list(parts.names), wbroker))
        for i in range(workers):
            self._add(f"worker-{i}", simulated_worker(wcfg, parts, profiles, clock), wbroker, configure=configure)
        evaluator = Evaluator(evaluator_main.settings(self.env), parts.clients, parts.trainer, clock)
        self._add("evaluator", evaluator, self._broker_cfg("evaluator"))
        agg = aggregator_main.settings(self.env)
        self._add("aggregator", Aggregator(agg.aggregator, agg.strategy), self._keyed(agg.broker, "aggregator"))
        bar = barrier_main.settings(self.env)
        self._add("barrier", Barrier(bar.barrier, bar.strategy), self._keyed(bar.broker, "barrier"))
        prof = profiler_main.settings(self.env)
        self._add("profiler", Profiler(prof.profiler), self._keyed(prof.broker, "profiler"))

    # --- configuration ------------------------------------------------------------------------------------------
    def _keyring(self, role: str) -> signing.Keyring | None:
        if self.secret is None:
            return None
        return signing.Keyring.from_mapping(signing.keys_for_role(self.secret, role))

    def _broker_cfg(self, role: str, prefetch: int | None = None) -> bus.BrokerConfig:
        """`config.broker(env, prefetch)` as the role's `main()` builds it, with the role's keys."""
        return self._keyed(config.broker(self.env, prefetch if prefetch is not None else BY_NAME[role].prefetch), role)

    def _keyed(self, cfg: bus.BrokerConfig, role: str) -> bus.BrokerConfig:
        return replace(cfg, keyring=self._keyring(role))

    def _add(self, name: str, service, cfg: bus.BrokerConfig, configure=None) -> None:
        def observe(o: Observation, name: str = name) -> None:
            self.observed[(name.split("-")[0], o.name, o.tier)] += o.value

        # as its process does: a checkpoint before every effect (a run that only counts its schedule can skip them)
        persist = self.durable and BY_NAME[service.name].durable
        store = partial(PartedStore, service.name) if service.name in self.parted else None
        self.processes[name] = Process(name, service, self.broker, self.clock, cfg, persist, observe, configure, store)

    # --- life -----------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start phase by phase as the system table says (the profiler last); then the seed publishes w0."""
        built = {service(n).name for n in self.processes} | {"seed"}
        pool = {s.name for s in SERVICES if s.mode in (Mode.ANY, Mode.POOL)}  # logical clients, as simulated
        if built != pool:
            raise RuntimeError(f"the simulator builds {sorted(built)}, the system has {sorted(pool)}")
        for phase in (Phase.SERVE, Phase.PROFILE):
            if phase is Phase.PROFILE and self.broker.consumer_count(topology.PROFILE_QUEUE) < 1:
                raise RuntimeError("no worker consumes the profiling queue: the profiler would wait forever")
            for name, p in self.processes.items():
                if service(name).phase is phase:
                    p.start()
        self.publish_seed()

    def publish_seed(self) -> None:
        """`fedat-seed`: w0 from the experiment's model, published once (encode and sign first, as publish_once)."""
        cfg = self._broker_cfg("seed")
        msg = seed_model(
            list(self.parts.initial),
            list(self.parts.names),
            self.num_tiers,
            config.get_str(self.env, "FEDAT_CODEC", "polyline"),
            config.get_int(self.env, "FEDAT_PRECISION", 4),
            self.clock.now,
        )
        sent = bus.encode_all([Outgoing(topology.GLOBAL, "", msg)], cfg)
        conn = self.broker.connect("seed")
        channel = conn.channel()
        channel.confirm_delivery()
        if cfg.declare:
            topology.declare(channel, cfg.num_tiers)
        publishing.publish_sent(channel, sent)
        conn.close()

    def stop(self, names: list[str] | None = None) -> None:
        """Stop these processes (all by default) for good."""
        for name in names if names is not None else list(self.processes):
            self.processes[name].stop()

    def workers(self) -> list[str]:
        """Names of the worker processes."""
        return [n for n in self.processes if n.startswith("worker-")]

    def counts(self) -> Mapping[str, int]:
        """Crashes, reconnects and handler errors over every process."""
        ps = self.processes.values()
        return {
            "crashes": sum(p.crashes for p in ps),
            "reconnects": sum(p.reconnects for p in ps),
            "handler_errors": sum(p.handler_errors() for p in ps),
        }
