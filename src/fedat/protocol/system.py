"""The system, described once: which services exist, what each is, and how a deployment starts them.

Every runner reads this table and nothing else: the local launcher (`fedat run`), the chaos tool, the simulator,
provisioning (one broker user per role), signing (each role's keys), the topology (one state queue per durable
service), and the Helm chart's tests (its Deployments must match it). Adding a service is one row here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Kind(Enum):
    """How many copies of a service run and for how long."""

    SINGLETON = "singleton"  # exactly one: it keeps a checkpoint or must see every message once
    SCALED = "scaled"  # any number of interchangeable replicas
    JOB = "job"  # runs once to completion (a clean exit is its job done)
    EMBEDDED = "embedded"  # a thread inside the launcher that started the run, not a process of its own


class Phase(Enum):
    """When a launcher starts a service; a phase starts only once the previous one's services are connected."""

    EARLY = 0  # a one-shot job started first, so its cold start overlaps everyone else's
    SERVE = 1  # the services that consume work
    PROFILE = 2  # started last: its first tasks time the clients, so the workers must already be listening


class Mode(Enum):
    """Which deployments run a service: where the clients are is the one thing that changes the set."""

    ANY = "any"
    POOL = "pool"  # logical clients: worker processes train any client of the experiment (FEDAT_CLIENTS=pool)
    REAL = "real"  # real clients: each `fedat-client` process is one client with its own data (FEDAT_CLIENTS=real)


def clients_mode(text: str) -> Mode:
    """The Mode a deployment's `clients` setting (FEDAT_CLIENTS: `pool` or `real`) names; ValueError otherwise."""
    modes = {m.value: m for m in (Mode.POOL, Mode.REAL)}
    if text not in modes:
        raise ValueError(f"FEDAT_CLIENTS={text!r} is not one of {sorted(modes)}")
    return modes[text]


# Signers whose keys exist: a service signs with its own, `clients` derives each client's key.
SIGNERS = ("barrier", "aggregator", "profiler", "evaluator", "seed", "clients")


@dataclass(frozen=True)
class Service:
    """One service of the system."""

    name: str  # also its broker role, its signing role and its log/metrics name
    module: str  # `python -m` entry point (a container's command)
    script: str  # console script
    kind: Kind
    phase: Phase
    durable: bool  # keeps its state in `fedat.state.<name>` and restores it on every start
    prefetch: int  # basic.qos per consumer (the barrier raises its own to cover every open round)
    metrics_port: int  # default /metrics, /healthz, /readyz port (0: none)
    keys: tuple[str, ...]  # the signing keys its role holds: its own, then the signers it must verify
    tensorflow: bool = False  # imports TensorFlow (a larger image, a slower start)
    mode: Mode = Mode.ANY  # the deployments that run it


SERVICES: tuple[Service, ...] = (
    Service(
        "worker", "fedat_worker.worker_main", "fedat-worker", Kind.SCALED, Phase.SERVE, False, 1, 9104,
        ("clients",), tensorflow=True, mode=Mode.POOL,
    ),
    # The barrier verifies tier assignments and evaluations too: it is trusted with the profiler's and the
    # evaluator's keys, so nobody else can steer its tiers or TiFL's ranking.
    Service(
        "barrier", "fedat_aggregator.barrier_main", "fedat-barrier", Kind.SINGLETON, Phase.SERVE, True, 64, 9101,
        ("barrier", "clients", "aggregator", "seed", "profiler", "evaluator"),
    ),
    Service(
        "aggregator", "fedat_aggregator.aggregator_main", "fedat-aggregator", Kind.SINGLETON, Phase.SERVE, True, 16,
        9102, ("aggregator", "barrier", "seed"),
    ),
    Service(
        "profiler", "fedat_profiler.main", "fedat-profiler", Kind.SINGLETON, Phase.PROFILE, True, 64, 9103,
        ("profiler", "clients"),
    ),
    Service(
        "evaluator", "fedat_worker.evaluator_main", "fedat-evaluator", Kind.SINGLETON, Phase.SERVE, False, 1, 9105,
        ("evaluator", "aggregator", "seed"), tensorflow=True, mode=Mode.POOL,
    ),
    # Federated evaluation for real clients: asks them to score chosen global versions on their own test data and
    # merges their scores into the evaluations the central evaluator would publish (it signs them as the evaluator).
    Service(
        "collector", "fedat_aggregator.collector_main", "fedat-collector", Kind.SINGLETON, Phase.SERVE, False, 256,
        9106, ("evaluator", "clients", "aggregator", "seed"), mode=Mode.REAL,
    ),
    Service(
        "seed", "fedat_worker.seed_main", "fedat-seed", Kind.JOB, Phase.EARLY, False, 1, 0, ("seed",),
        tensorflow=True,
    ),
    # Writes events.jsonl for a local run; publishes nothing, so it only verifies.
    Service(
        "recorder", "fedat.lab.recorder", "", Kind.EMBEDDED, Phase.SERVE, False, 16, 0,
        ("aggregator", "seed", "evaluator"),
    ),
)  # fmt: skip

BY_NAME = {s.name: s for s in SERVICES}
ROLES = tuple(s.name for s in SERVICES)  # one broker user and one keyring per service
DURABLE = tuple(s.name for s in SERVICES if s.durable)
PROCESSES = tuple(s for s in SERVICES if s.kind is not Kind.EMBEDDED)  # what a launcher starts as a process


def processes(mode: Mode) -> tuple[Service, ...]:
    """The processes a deployment whose clients are `mode` (POOL or REAL) runs."""
    return tuple(s for s in PROCESSES if s.mode in (Mode.ANY, mode))


def service(name: str) -> Service:
    """The row of `name` (a process name such as `worker-3` names its service `worker`)."""
    base = name.split("-")[0]
    if base not in BY_NAME:
        raise KeyError(f"no service {name!r}; services: {', '.join(ROLES)}")
    return BY_NAME[base]


def start_order(names: list[str]) -> list[list[str]]:
    """Process names grouped by start phase, in phase order (within a phase, in the order given)."""
    phases = sorted({service(n).phase.value for n in names})
    return [[n for n in names if service(n).phase.value == p] for p in phases]
