"""The broker topology: every exchange, queue, argument and binding, in one place.

The names are a public contract (Helm chart, dashboards, clients in other languages rely on them); see
`docs/architecture.md`. Declaring is idempotent: every service declares the whole topology at start-up.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from fedat.protocol import system

TRAIN = "fedat.train"  # direct: routing key tier-<m> or "profile"
RESULTS = "fedat.results"  # topic: routing key tier-<m> or "profile"
TIER_MODELS = "fedat.tier-models"  # fanout
GLOBAL = "fedat.global"  # fanout
CONTROL = "fedat.control"  # fanout: tier assignments
EVENTS = "fedat.events"  # topic: routing key "evaluation" or "round-report"
DLX = "fedat.dlx"  # fanout: dead letters
STATE = "fedat.state"  # topic: routing key = the stateful service's name (its snapshot) or `<name>.journal`
EVALUATE = "fedat.evaluate"  # fanout: federated evaluation requests, one copy per real client

# Services whose state must survive a restart; each keeps it in its own queue `fedat.state.<service>`.
STATEFUL = system.DURABLE

DEAD_LETTERS = "fedat.dead-letters"
PROFILE_KEY = "profile"
PROFILE_QUEUE = "fedat.train.profile"
PROFILER_RESULTS = "fedat.profiler.results"
PROFILER_REPORTS = "fedat.profiler.round-reports"
EVALUATION_KEY = "evaluation"
ROUND_REPORT_KEY = "round-report"
AGGREGATOR_TIER_MODELS = "fedat.aggregator.tier-models"
AGGREGATOR_GLOBAL = "fedat.aggregator.global"
BARRIER_GLOBAL = "fedat.barrier.global"
BARRIER_ASSIGNMENTS = "fedat.barrier.assignments"
BARRIER_EVALUATIONS = "fedat.barrier.evaluations"  # TiFL ranks tiers by their clients' test accuracy
EVALUATOR_GLOBAL = "fedat.evaluator.global"
RECORDER_GLOBAL = "fedat.recorder.global"
RECORDER_EVENTS = "fedat.recorder.events"
# Real clients (`fedat-client`): they publish to fedat.results with `<key>.client-<k>`, so that the broker can hold
# each client's user to its own keys; the queues of a client are made when it is enrolled (`client_queues`).
JOIN_KEY, LEAVE_KEY, CLIENT_EVALUATION_KEY = "join", "leave", "evaluation"
PROFILER_MEMBERS = "fedat.profiler.members"  # joins and leaves of real clients
COLLECTOR_GLOBAL = "fedat.collector.global"  # the collector picks the versions real clients score
COLLECTOR_EVALUATIONS = "fedat.collector.evaluations"  # their scores
COLLECTOR_ASSIGNMENTS = "fedat.collector.assignments"  # who is expected to score
# A real client's task queue holds what it has not trained yet; a client that was away trains the newest few only.
CLIENT_QUEUE_MAX_LENGTH = 16

# Observers only need recent models; bounding them keeps an absent observer from filling the broker.
OBSERVER_MAX_LENGTH = 8
# A message that crashes its consumer this many times is dead-lettered by the broker (reason delivery_limit).
DELIVERY_LIMIT = 5
# The barrier holds a round's updates unacked, and RabbitMQ 3.x counts every return of a held message (its consumer
# restarted or reconnected) as a delivery: a valid update must survive many barrier restarts, so its limit is higher.
HELD_DELIVERY_LIMIT = 50
DEAD_LETTER_MAX_LENGTH = 10_000
# A restore reads a service's checkpoints and gives them back (nack, requeue), which a quorum queue counts as a
# delivery; with a delivery limit (RabbitMQ 4.0-4.2 default every quorum queue to 20, and a blanket policy may set
# one) the checkpoints would be dropped after that many restarts. The state queues' policy lifts it out of reach.
STATE_DELIVERY_LIMIT = 1_000_000_000

HEADER_REASON = "x-fedat-reason"
HEADER_SOURCE_QUEUE = "x-fedat-queue"


def client_key(client: int) -> str:
    """Routing key of a real client's own tasks on the train exchange."""
    return f"client-{client}"


def from_client(key: str, client: int) -> str:
    """The routing key a real client publishes with on the results exchange (its user may use no other)."""
    return f"{key}.{client_key(client)}"


def client_queue(client: int) -> str:
    """The queue a real client consumes its own train tasks from."""
    return f"fedat.client.{client}"


def client_evaluate_queue(client: int) -> str:
    """The queue a real client consumes federated evaluation requests from (the newest only)."""
    return f"{client_queue(client)}.evaluate"


def may_be_unroutable(exchange: str, key: str) -> bool:
    """Whether a publish may find no queue without anything being wrong: a task for a real client whose queues
    were deleted (revoked and purged), or an evaluation request while no client is enrolled."""
    if exchange == EVALUATE:
        return True
    return exchange == TRAIN and key.startswith("client-") and key[len("client-") :].isdigit()


def tier_key(tier: int) -> str:
    """Routing key of tier m (1 = fastest) on the train and results exchanges."""
    return f"tier-{tier}"


def train_queue(tier: int) -> str:
    """Queue that workers of tier m consume train tasks from."""
    return f"{TRAIN}.{tier_key(tier)}"


def state_queue(service: str) -> str:
    """The queue that holds `service`'s persisted state (written and read only by that service)."""
    return f"{STATE}.{service}"


JOURNAL_SIDES = (0, 1)  # a service's two journal queues, used in turn (`fedat.protocol.journal`)


def journal_key(service: str, side: int = 0) -> str:
    """Routing key on the state exchange of one of `service`'s journal queues (`fedat.protocol.journal`)."""
    return f"{service}.journal" + _side_suffix(side)


def journal_queue(service: str, side: int = 0) -> str:
    """One of the queues that hold `service`'s checkpoints since its latest snapshot (written and read only by it)."""
    return f"{state_queue(service)}.journal" + _side_suffix(side)


def _side_suffix(side: int) -> str:
    if side not in JOURNAL_SIDES:
        raise ValueError(f"journal side {side!r}: a service has journal queues {JOURNAL_SIDES}")
    return "" if side == 0 else f"-{side + 1}"


def barrier_queue(tier: int) -> str:
    """Queue holding tier m's client updates until the barrier closes the round."""
    return f"fedat.barrier.{tier_key(tier)}"


@dataclass(frozen=True)
class Queue:
    """One queue with its arguments and bindings (exchange, routing key)."""

    name: str
    bindings: tuple[tuple[str, str], ...]
    arguments: dict[str, Any] = field(default_factory=dict)


def _work_queue(name: str, *bindings: tuple[str, str], delivery_limit: int = DELIVERY_LIMIT) -> Queue:
    # Quorum: survives broker restarts even for transient messages, counts deliveries, dead-letters poison.
    return Queue(
        name,
        bindings,
        {"x-queue-type": "quorum", "x-dead-letter-exchange": DLX, "x-delivery-limit": delivery_limit},
    )


def _observer_queue(name: str, *bindings: tuple[str, str]) -> Queue:
    return Queue(
        name, bindings, {"x-queue-type": "quorum", "x-max-length": OBSERVER_MAX_LENGTH, "x-overflow": "drop-head"}
    )


EXCHANGES: dict[str, str] = {
    TRAIN: "direct",
    RESULTS: "topic",
    TIER_MODELS: "fanout",
    GLOBAL: "fanout",
    CONTROL: "fanout",
    EVALUATE: "fanout",
    EVENTS: "topic",
    DLX: "fanout",
    STATE: "topic",
}


def _state_queue(service: str) -> Queue:
    # One message: the latest checkpoint; a new one drops the old. No dead-letter exchange, or every save would
    # dead-letter the checkpoint it replaces.
    return Queue(
        state_queue(service),
        ((STATE, service),),
        {"x-queue-type": "quorum", "x-max-length": 1, "x-overflow": "drop-head"},
    )


def _journal_queue(service: str, side: int) -> Queue:
    # Every record since the snapshot in the state queue: no length limit (the service purges it after each
    # snapshot), no dead-letter exchange (nothing in it is ever rejected).
    return Queue(journal_queue(service, side), ((STATE, journal_key(service, side)),), {"x-queue-type": "quorum"})


@dataclass(frozen=True)
class Policy:
    """A policy of the vhost: what RabbitMQ applies to the queues whose names match `pattern`."""

    name: str
    pattern: str
    definition: dict[str, Any]
    priority: int
    apply_to: str = "queues"


# Above any blanket policy (one policy applies to a queue: the highest priority), for the state queues only.
POLICIES = (
    Policy("fedat-state", "^" + re.escape(f"{STATE}."), {"delivery-limit": STATE_DELIVERY_LIMIT}, priority=100),
)


def queues(num_tiers: int) -> tuple[Queue, ...]:
    """Every queue of a deployment with num_tiers tiers."""
    per_tier = []
    for m in range(1, num_tiers + 1):
        per_tier.append(_work_queue(train_queue(m), (TRAIN, tier_key(m))))
        # `tier-<m>` from the pool's workers, `tier-<m>.client-<k>` from real clients
        per_tier.append(
            _work_queue(
                barrier_queue(m),
                (RESULTS, tier_key(m)),
                (RESULTS, f"{tier_key(m)}.*"),
                delivery_limit=HELD_DELIVERY_LIMIT,
            )
        )
    return (
        *per_tier,
        _work_queue(PROFILE_QUEUE, (TRAIN, PROFILE_KEY)),
        # Only profiling answers: round latencies come as small round reports, never as model updates.
        _work_queue(PROFILER_RESULTS, (RESULTS, PROFILE_KEY), (RESULTS, f"{PROFILE_KEY}.*")),
        _work_queue(PROFILER_MEMBERS, (RESULTS, f"{JOIN_KEY}.*"), (RESULTS, f"{LEAVE_KEY}.*")),
        _work_queue(PROFILER_REPORTS, (EVENTS, ROUND_REPORT_KEY)),
        _work_queue(AGGREGATOR_TIER_MODELS, (TIER_MODELS, "")),
        _work_queue(AGGREGATOR_GLOBAL, (GLOBAL, "")),
        _work_queue(BARRIER_GLOBAL, (GLOBAL, "")),
        _work_queue(BARRIER_ASSIGNMENTS, (CONTROL, "")),
        _observer_queue(EVALUATOR_GLOBAL, (GLOBAL, "")),
        _observer_queue(BARRIER_EVALUATIONS, (EVENTS, EVALUATION_KEY)),
        _observer_queue(RECORDER_GLOBAL, (GLOBAL, "")),
        _work_queue(RECORDER_EVENTS, (EVENTS, EVALUATION_KEY)),
        _observer_queue(COLLECTOR_GLOBAL, (GLOBAL, "")),
        _work_queue(COLLECTOR_EVALUATIONS, (RESULTS, f"{CLIENT_EVALUATION_KEY}.*")),
        _observer_queue(COLLECTOR_ASSIGNMENTS, (CONTROL, "")),
        # Bounded so that a long run's stale stragglers cannot fill the disk; the oldest go first.
        Queue(DEAD_LETTERS, ((DLX, ""),), {"x-queue-type": "quorum", "x-max-length": DEAD_LETTER_MAX_LENGTH}),
        *(_state_queue(s) for s in STATEFUL),
        *(_journal_queue(s, side) for s in STATEFUL for side in JOURNAL_SIDES),
    )


def client_queues(client: int) -> tuple[Queue, ...]:
    """A real client's two queues: its tasks (bounded, dead-lettered) and its evaluation requests (the newest)."""
    return (
        Queue(
            client_queue(client),
            ((TRAIN, client_key(client)),),
            {
                "x-queue-type": "classic",  # one per client: cheap enough for thousands, durable for its tasks
                "x-dead-letter-exchange": DLX,
                "x-max-length": CLIENT_QUEUE_MAX_LENGTH,
                "x-overflow": "drop-head",
            },
        ),
        Queue(
            client_evaluate_queue(client),
            ((EVALUATE, ""),),
            {"x-queue-type": "classic", "x-max-length": 1, "x-overflow": "drop-head"},
        ),
    )


def declare(channel: Any, num_tiers: int) -> None:
    """Declare all exchanges, queues and bindings on a pika channel (idempotent)."""
    for name, kind in EXCHANGES.items():
        channel.exchange_declare(exchange=name, exchange_type=kind, durable=True)
    for q in queues(num_tiers):
        channel.queue_declare(queue=q.name, durable=True, arguments=q.arguments)
        for exchange, key in q.bindings:
            channel.queue_bind(queue=q.name, exchange=exchange, routing_key=key)
