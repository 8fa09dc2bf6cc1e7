"""Least-privilege broker roles: which queues each service may read, which exchanges (and topic keys) it may write.

Every name comes from `fedat.protocol.topology`; nothing here retypes a queue or exchange name. `roles(num_tiers)`
gives one
`Role` per service (`worker`, `barrier`, `aggregator`, `profiler`, `evaluator`, `seed`, `recorder`) plus `admin`,
the provisioner (`fedat.deploy.provision`), the only role that may configure (declare, bind, delete) anything.
`client_role(k)` is the role of one real client, made for it when it is enrolled (`fedat.deploy.enroll`).

What RabbitMQ 3.10 checks for each AMQP 0-9-1 operation (measured on the 3.10.8 broker here; it matches the table in
rabbitmq.com/access-control.html). A refused operation closes the channel with 403 ACCESS_REFUSED.

- exchange.declare / queue.declare, passive: nothing (even on a resource the user has no permission on).
- exchange.declare / queue.declare, not passive: configure on it, even when it already exists with equal
  arguments; a server-named queue (`amq.gen-...`) too. exchange.delete / queue.delete: configure.
- queue.bind: write on the queue and read on the exchange (plus the topic read permission on the key, for a
  topic exchange); exchange.bind: write on the destination, read on the source.
- basic.qos, confirm.select, basic.ack / nack / reject: nothing.
- basic.publish: write on the exchange (the default exchange is checked as `amq.default`); on a *topic* exchange
  also the topic write permission on the routing key. Topic permissions on direct and fanout exchanges are
  ignored, so the keys of `fedat.train` (direct) cannot be restricted.
- basic.get, basic.consume, queue.purge: read on the queue.
- Dead-lettering by the broker (nack without requeue, `x-delivery-limit`, `x-max-length`): nothing from the
  consumer; only the declarer of a queue with `x-dead-letter-exchange` needs write on the DLX and read on the
  queue, and that is `admin`. Dead-lettering by the service shell is a basic.publish: write on `fedat.dlx`.

So a service running as one of these users must not declare the topology (`BrokerConfig.declare = False`); it may
passive-declare to check that the topology exists. Write regexes name only exchanges and read regexes only queues
(no name is both), so no service role can bind anything (queue.bind needs write on a queue, exchange.bind read on
an exchange). Topic permissions only
restrict a user once it has one for that exchange: every service role gets one per topic exchange (write only its
own keys, `^$` on the others; read `^$`, since only `admin` binds).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from fedat.protocol import system, topology

NOTHING = "^$"  # matches no resource name (the default exchange is checked as "amq.default")
EVERYTHING = ".*"

SERVICE_ROLES = system.ROLES
ADMIN = "admin"
ROLES = (*SERVICE_ROLES, ADMIN)


def exact(names: Iterable[str]) -> str:
    """An anchored regex matching exactly `names` (escaped), or nothing if there are none."""
    unique = sorted(set(names))
    if not unique:
        return NOTHING
    return "^(" + "|".join(re.escape(n) for n in unique) + ")$"


@dataclass(frozen=True)
class TopicPermission:
    """A topic permission: on a topic exchange, the routing keys the user may publish with (write) or bind (read)."""

    exchange: str
    write: str
    read: str


@dataclass(frozen=True)
class Role:
    """One broker role: the RabbitMQ permission regexes, topic permissions and management tags of its users."""

    name: str
    configure: str
    write: str
    read: str
    topic: tuple[TopicPermission, ...] = ()
    tags: tuple[str, ...] = ()
    # What the regexes were built from (documentation and tests); empty for admin, whose regexes are ".*".
    consumes: tuple[str, ...] = ()
    publishes: tuple[str, ...] = ()
    topic_keys: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def permissions(self) -> dict[str, str]:
        """The body of PUT /api/permissions/{vhost}/{user}."""
        return {"configure": self.configure, "write": self.write, "read": self.read}


def _service_role(
    name: str,
    num_tiers: int,
    consumes: Iterable[str],
    publishes: Iterable[str],
    topic_keys: dict[str, Iterable[str]] | None = None,
    tags: tuple[str, ...] = (),
) -> Role:
    consumes, publishes = tuple(consumes), tuple(publishes)
    keys = {x: tuple(k) for x, k in (topic_keys or {}).items()}
    kinds = topology.EXCHANGES
    known_queues = {q.name for q in topology.queues(num_tiers)}
    for q in consumes:
        if q not in known_queues:
            raise ValueError(f"role {name}: {q} is not a queue of the topology")
    for x in (*publishes, *keys):
        if x not in kinds:
            raise ValueError(f"role {name}: {x} is not an exchange of the topology")
    for x in keys:
        if kinds[x] != "topic" or x not in publishes:
            raise ValueError(f"role {name}: topic keys for {x}, which is not a topic exchange it publishes to")
    topic = tuple(
        TopicPermission(x, exact(keys.get(x, ())), NOTHING) for x, kind in sorted(kinds.items()) if kind == "topic"
    )
    return Role(
        name=name,
        configure=NOTHING,
        write=exact(publishes),
        read=exact(consumes),
        topic=topic,
        tags=tags,
        consumes=consumes,
        publishes=publishes,
        topic_keys=tuple(sorted(keys.items())),
    )


def _state_queues(service: str) -> list[str]:
    # a stateful service reads back its own checkpoints: the state queue and both journal queues
    t = topology
    return [t.state_queue(service), *(t.journal_queue(service, side) for side in t.JOURNAL_SIDES)]


def _state_keys(service: str) -> list[str]:
    # ... and writes them, on the state exchange, under its own keys only
    t = topology
    return [service, *(t.journal_key(service, side) for side in t.JOURNAL_SIDES)]


def roles(num_tiers: int) -> dict[str, Role]:
    """Every role of a deployment with `num_tiers` tiers, by name."""
    if num_tiers < 1:
        raise ValueError(f"num_tiers must be at least 1, not {num_tiers}")
    tiers = range(1, num_tiers + 1)
    tier_keys = [topology.tier_key(m) for m in tiers]
    t = topology
    out = [
        _service_role(
            "worker",
            num_tiers,
            consumes=[*(t.train_queue(m) for m in tiers), t.PROFILE_QUEUE],
            publishes=[t.RESULTS, t.DLX],
            topic_keys={t.RESULTS: [*tier_keys, t.PROFILE_KEY]},
        ),
        _service_role(
            "barrier",
            num_tiers,
            consumes=[
                *(t.barrier_queue(m) for m in tiers),
                t.BARRIER_GLOBAL,
                t.BARRIER_ASSIGNMENTS,
                t.BARRIER_EVALUATIONS,
                *_state_queues("barrier"),
            ],
            # fedat.train is a direct exchange: RabbitMQ cannot restrict its keys, so the barrier could also
            # publish with key "profile" there.
            publishes=[t.TRAIN, t.TIER_MODELS, t.EVENTS, t.DLX, t.STATE],
            topic_keys={t.EVENTS: [t.ROUND_REPORT_KEY], t.STATE: _state_keys("barrier")},
        ),
        _service_role(
            "aggregator",
            num_tiers,
            consumes=[
                t.AGGREGATOR_TIER_MODELS,
                t.AGGREGATOR_GLOBAL,
                *_state_queues("aggregator"),
            ],
            publishes=[t.GLOBAL, t.DLX, t.STATE],
            topic_keys={t.STATE: _state_keys("aggregator")},
        ),
        _service_role(
            "profiler",
            num_tiers,
            consumes=[
                t.PROFILER_RESULTS,
                t.PROFILER_REPORTS,
                t.PROFILER_MEMBERS,
                *_state_queues("profiler"),
            ],
            publishes=[t.TRAIN, t.CONTROL, t.DLX, t.STATE],
            topic_keys={t.STATE: _state_keys("profiler")},
        ),
        _service_role(
            "evaluator",
            num_tiers,
            consumes=[t.EVALUATOR_GLOBAL],
            publishes=[t.EVENTS, t.DLX],
            topic_keys={t.EVENTS: [t.EVALUATION_KEY]},
        ),
        _service_role(
            "collector",
            num_tiers,
            consumes=[t.COLLECTOR_GLOBAL, t.COLLECTOR_EVALUATIONS, t.COLLECTOR_ASSIGNMENTS],
            publishes=[t.EVALUATE, t.EVENTS, t.DLX],
            topic_keys={t.EVENTS: [t.EVALUATION_KEY]},
        ),
        _service_role("seed", num_tiers, consumes=[], publishes=[t.GLOBAL]),
        # management: KEDA's HTTP scaler reads the train queues' depths through the management API as this user.
        _service_role(
            "recorder",
            num_tiers,
            consumes=[t.RECORDER_GLOBAL, t.RECORDER_EVENTS],
            publishes=[t.DLX],
            tags=("management",),
        ),
        Role(name=ADMIN, configure=EVERYTHING, write=EVERYTHING, read=EVERYTHING, tags=("administrator",)),
    ]
    return {r.name: r for r in out}


# Every routing key a real client may publish with on the results exchange: its answers (by tier, or to profiling),
# its joins, leaves and scores, each ending in its own name.
CLIENT_KEYS = (
    "tier-[0-9]+",
    topology.PROFILE_KEY,
    topology.JOIN_KEY,
    topology.LEAVE_KEY,
    topology.CLIENT_EVALUATION_KEY,
)


def client_role(client: int) -> Role:
    """The role of real client `client`: its own two queues to read, the results and dead-letter exchanges to write,
    and on the results exchange only keys that name it (`<key>.client-<k>`), so that the broker refuses an answer,
    a join or a score published with another client's key. It configures nothing: its queues are made by `admin`."""
    if client < 0:
        raise ValueError(f"a client id is an integer >= 0, not {client}")
    t = topology
    name = t.client_key(client)
    queues = [q.name for q in t.client_queues(client)]
    publishes = (t.RESULTS, t.DLX)
    keys = "^(" + "|".join(CLIENT_KEYS) + r")\." + name + "$"  # client-<k>: nothing in it to escape
    topic = tuple(
        TopicPermission(x, keys if x == t.RESULTS else NOTHING, NOTHING)
        for x, kind in sorted(t.EXCHANGES.items())
        if kind == "topic"
    )
    return Role(
        name=name,
        configure=NOTHING,
        write=exact(publishes),
        read=exact(queues),
        topic=topic,
        consumes=tuple(queues),
        publishes=publishes,
        topic_keys=((t.RESULTS, tuple(f"{k}.{name}" for k in CLIENT_KEYS)),),
    )
