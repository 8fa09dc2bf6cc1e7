"""The guarantees, watched live and checked at the end, over the same records `fedat.ops.capture` keeps of a real run.

The monitor sees every message the broker routes where `fedat.ops.capture`'s queues are bound (global and tier models,
every result, round reports and evaluations) and keeps the same small records. After every event it can say whether
something already went wrong that no later event can undo: a global version published with two contents, a version
published before the one below it, a round merged by two versions, a tier model published twice differently, a
delivery settled twice. At the end, `verdict` runs `fedat.ops.invariants.check` over everything (no update merged twice
or lost, versions without gaps, every round closed once) and the broker's ledger audit (every message copy acked,
dead-lettered or dropped exactly once, or still in a queue).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import pika

from fedat.ops.capture import CAPTURE_QUEUES, Records, dead_letter, digest
from fedat.ops.invariants import Verdict, check
from fedat.protocol import topology, wire
from fedat_sim.memory import MemoryBroker, topic_matches

# Kinds only durable services publish (barrier, aggregator, profiler, and the seed's g0): write-ahead checkpointing
# means a copy of one of these is a re-sent outbox, byte for byte; a second body under one id is a re-decision.
# Updates and evaluations come from stateless services that may redo their work (new timestamps): not checked.
DECIDED_KINDS = frozenset({"train", "tier-model", "global-model", "tier-assignment", "round-report"})


class Violation(AssertionError):
    """A guarantee broke; the message says which and when (virtual time and event number)."""


def _captured(exchange: str, routing_key: str) -> bool:
    """Whether one of `fedat.ops.capture`'s queues would get a copy of this publish."""
    for bindings in CAPTURE_QUEUES.values():
        for ex, key in bindings:
            if ex == exchange and (key in ("", "#") or key == routing_key or topic_matches(key, routing_key)):
                return True
    return False


class Monitor:
    """Records the captured streams as they are routed and checks what can be checked at once."""

    def __init__(self, broker: MemoryBroker):
        self.broker = broker
        self.records = Records()
        self.problems: list[str] = []
        self._versions: dict[int, tuple[tuple[tuple[int, int], ...], str]] = {}
        self._merged_by: dict[tuple[int, int], int] = {}
        self._tier_models: dict[str, tuple[tuple[int, ...], str]] = {}
        self._top = -1
        self._bodies: dict[str, bytes] = {}
        self._trace = hashlib.sha256()  # every routed publish, in order: two runs that agree here did the same
        broker.taps.append(self.tap)

    def tap(self, exchange: str, routing_key: str, body: bytes, properties: pika.BasicProperties) -> None:
        """Keep the record of one routed message and check it against what came before."""
        self._trace.update(f"{exchange}\0{routing_key}\0{len(body)}\0".encode())
        self._trace.update(body)
        captured = _captured(exchange, routing_key)
        decided = properties.type in DECIDED_KINDS and exchange != topology.STATE
        if not (captured or decided):
            return
        try:
            msg = wire.decode(body)
        except wire.WireError:
            self.records.undecodable += captured
            return
        if decided:
            body_digest = hashlib.sha256(body).digest()
            if self._bodies.setdefault(msg.id, body_digest) != body_digest:
                self.problems.append(f"{msg.kind} {msg.id} published with two different bodies: a decision was redone")
        if not captured:
            return
        self.records.add(msg)
        if isinstance(msg, wire.GlobalModel):
            self._global(msg)
        elif isinstance(msg, wire.TierModel):
            content = (tuple(msg.clients), digest(msg.layers))
            if self._tier_models.setdefault(msg.id, content) != content:
                self.problems.append(f"tier model {msg.id} published with two contents: the round closed twice")

    def _global(self, g: wire.GlobalModel) -> None:
        merged = tuple((int(t), int(r)) for t, r in g.merged)
        content = (merged, digest(g.layers))
        if self._versions.setdefault(g.version, content) != content:
            self.problems.append(f"version {g.version} published with two contents")
        if g.version > self._top + 1:
            self.problems.append(f"version {g.version} published before version {self._top + 1}")
        self._top = max(self._top, g.version)
        for key in merged:
            first = self._merged_by.setdefault(key, g.version)
            if first != g.version:
                self.problems.append(f"tier {key[0]} round {key[1]} merged by versions {first} and {g.version}")

    def fingerprint(self) -> str:
        """A digest of every message routed so far, in routing order (equal for equal runs)."""
        return self._trace.hexdigest()

    def now_broken(self) -> list[str]:
        """Everything broken so far (monitor and broker ledger)."""
        return [*self.problems, *self.broker.violations]

    def verdict(
        self, queued_from: Iterable[str], one_round_per_tier: bool, absorbed: Iterable[str] = ()
    ) -> tuple[Verdict, list[str]]:
        """At the end, with every process stopped: `fedat.ops.invariants.check` and the ledger audit.

        `queued_from`: the work queues whose messages are in flight; `absorbed`: tier-model ids a buffering strategy
        holds in the aggregator's saved state, to be listed in the next version's `merged` (also in flight).
        """
        r = self.records
        r.dead_letters = [dead_letter(e.properties, e.body) for e in self.broker.ready_messages(topology.DEAD_LETTERS)]
        r.queued = [e.properties.message_id or "" for q in queued_from for e in self.broker.ready_messages(q)]
        r.queued += list(absorbed)
        verdict = check(
            r.updates,
            r.tier_models,
            r.globals,
            r.reports,
            r.dead_letters,
            r.queued,
            one_round_per_tier=one_round_per_tier,
        )
        return verdict, [*self.problems, *self.broker.audit()]
