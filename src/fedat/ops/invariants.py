"""What a run must never do, checked over small records of its message streams (no I/O here).

`fedat.ops.capture` records every client update, tier model, global model, round report and dead letter of a run;
`check` says whether anything was lost or counted twice. The definitions (also in the chaos report):

- **versions_repeated**: one global version published with two different contents (digest of its layers, or its
  `merged` list). An identical copy is a redelivery or a re-publication after a crash, not a repeat.
- **versions_skipped**: a version missing from 0..max.
- **rounds_merged_twice**: a (tier, round) listed in `merged` by two different global models (two versions, or
  two different contents of one version).
- **tier_models_conflicting**: one tier-model id published with two different client sets or digests: the
  barrier closed one round twice, differently.
- **updates_counted_twice**: a client update, identified by (tier, round, client), merged by more than one
  distinct global model (through its round's tier model).
- **updates_lost**: an update accounted for nowhere: its client is not in a merged tier model of its round, it
  was not reported as answered after the close (in its round report's latencies without being merged, or in a
  `late-<update id>` report), it was not dead-lettered by a service for a stated reason (`x-fedat-reason`), and
  it is not in flight at the end (still queued for the barrier, or its round has no tier model yet, or its tier
  model is in flight). An update the broker dead-lettered counts as lost unless it was merged or reported after
  the close anyway (a copy of it got through); in-flight and service reasons do not excuse it.
- **updates_dead_lettered_by_broker**: updates the broker itself dead-lettered (`x-death`, e.g. reason
  `delivery_limit`: a consumer failed on it again and again); listed, and a violation in itself.
- **tier_models_lost**: a tier model that no global model merged, that is not queued for the aggregator at the
  end, and that is not its tier's most recent unmerged one (FedAT runs one round per tier at a time, so only the
  newest can legitimately still be on its way).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

Round = tuple[int, int]  # (tier, round)
UpdateKey = tuple[int, int, int]  # (tier, round, client)

VIOLATIONS = (
    "versions_repeated",
    "versions_skipped",
    "rounds_merged_twice",
    "tier_models_conflicting",
    "updates_counted_twice",
    "updates_lost",
    "updates_dead_lettered_by_broker",
    "tier_models_lost",
)
MAX_EXAMPLES = 10
# Reasons for which a service may refuse an update in a healthy run: a straggler of a round that is closed and
# forgotten, a client re-tiering removed, a malformed update. Not among them: "was not given task" and "trained on
# version", which mean the barrier no longer knows the round it handed out (it lost or rewrote its state).
LEGITIMATE_REASONS = (
    "stale round",
    "unknown client",
    "n_samples must be",
    "layer shapes",
    "contains NaN",
    "field '",
    "message:",
    "layers[",
)


@dataclass(frozen=True)
class UpdateSeen:
    """A client update a worker published (tier >= 1)."""

    id: str
    tier: int
    round: int
    client: int


@dataclass(frozen=True)
class TierModelSeen:
    """A tier model the barrier published; `digest` is the sha256 of its layers' data."""

    id: str
    tier: int
    round: int
    clients: tuple[int, ...]
    digest: str


@dataclass(frozen=True)
class GlobalSeen:
    """A global model the aggregator (or the seed) published; `digest` is the sha256 of its layers' data."""

    id: str
    version: int
    merged: tuple[Round, ...]
    digest: str
    created_at: float = field(default=0.0, compare=False)  # publisher's clock; not part of the identity


@dataclass(frozen=True)
class ReportSeen:
    """A round report: `latencies` = clients that answered (merged or after the close), `missing` = never answered."""

    id: str
    tier: int
    round: int
    latencies: tuple[int, ...]
    missing: tuple[int, ...]


@dataclass(frozen=True)
class DeadLetter:
    """A message found in `fedat.dead-letters`.

    `source` is "service" when a service dead-lettered it with `x-fedat-reason` (a stated, deliberate refusal),
    "broker" when the broker did (`x-death`: `delivery_limit`, `rejected`, `expired`, ...).
    """

    message_id: str
    kind: str
    reason: str
    queue: str
    source: str = "service"


@dataclass(frozen=True)
class Verdict:
    """Violation counts with a few examples each, and what was accounted for (for the report)."""

    counts: Mapping[str, int]
    examples: Mapping[str, tuple[str, ...]]
    info: Mapping[str, int]

    @property
    def ok(self) -> bool:
        """True when nothing was lost or counted twice."""
        return not any(self.counts.values())

    def violated(self) -> dict[str, int]:
        """The violations that occurred, with their counts."""
        return {k: v for k, v in self.counts.items() if v}


def _examples(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(items))[:MAX_EXAMPLES]


def check(
    updates: Iterable[UpdateSeen],
    tier_models: Iterable[TierModelSeen],
    globals: Iterable[GlobalSeen],
    reports: Iterable[ReportSeen],
    dead_letters: Iterable[DeadLetter],
    queued: Iterable[str] = (),
    legitimate: tuple[str, ...] = LEGITIMATE_REASONS,
    one_round_per_tier: bool = True,
) -> Verdict:
    """Check a run's streams.

    `queued`: ids of updates and tier models still queued for their consumer when the run was stopped (in flight).
    `legitimate`: substrings of a service's dead-letter reason that make it a deliberate refusal of an update.
    `one_round_per_tier`: the strategy runs one round per tier at a time (FedAT, TiFL), so a round without a tier
    model whose tier has a later round merged was abandoned, and its updates are lost, not in flight.
    """
    updates, tier_models, globals, reports = list(updates), list(tier_models), list(globals), list(reports)
    dead_letters, queued_ids = list(dead_letters), set(queued)
    counts: dict[str, int] = dict.fromkeys(VIOLATIONS, 0)
    examples: dict[str, tuple[str, ...]] = {}

    # --- global versions ---------------------------------------------------------------------------------
    contents: dict[int, set[tuple[tuple[Round, ...], str]]] = defaultdict(set)
    for g in globals:
        contents[g.version].add((tuple(tuple(p) for p in g.merged), g.digest))
    repeated = {v: c for v, c in contents.items() if len(c) > 1}
    counts["versions_repeated"] = len(repeated)
    examples["versions_repeated"] = _examples(f"g{v}: {len(c)} different contents" for v, c in repeated.items())
    top = max(contents, default=-1)
    skipped = sorted(set(range(top + 1)) - contents.keys())
    counts["versions_skipped"] = len(skipped)
    examples["versions_skipped"] = tuple(f"g{v}" for v in skipped[:MAX_EXAMPLES])

    merged_by: dict[Round, set[tuple[int, tuple[Round, ...], str]]] = defaultdict(set)
    for v, cs in contents.items():
        for merged, digest in cs:
            for key in merged:
                merged_by[key].add((v, merged, digest))
    twice = {k: s for k, s in merged_by.items() if len(s) > 1}
    counts["rounds_merged_twice"] = len(twice)
    examples["rounds_merged_twice"] = _examples(
        f"tier {t} round {r}: in versions {sorted({v for v, _, _ in s})}" for (t, r), s in twice.items()
    )

    # --- tier models -------------------------------------------------------------------------------------
    variants: dict[str, set[tuple[tuple[int, ...], str]]] = defaultdict(set)
    round_of: dict[str, Round] = {}
    clients_of: dict[Round, set[int]] = defaultdict(set)  # union over the variants: who the round merged
    for tm in tier_models:
        variants[tm.id].add((tuple(tm.clients), tm.digest))
        round_of[tm.id] = (tm.tier, tm.round)
        clients_of[(tm.tier, tm.round)].update(tm.clients)
    conflicting = {i: v for i, v in variants.items() if len(v) > 1}
    counts["tier_models_conflicting"] = len(conflicting)
    examples["tier_models_conflicting"] = _examples(
        f"{i}: clients {sorted({c for c, _ in v})}, {len({d for _, d in v})} digests" for i, v in conflicting.items()
    )
    unmerged = {i: k for i, k in round_of.items() if k not in merged_by}
    newest_unmerged: dict[int, int] = {}
    for t, r in unmerged.values():
        newest_unmerged[t] = max(newest_unmerged.get(t, r), r)
    last_merged: dict[int, int] = {}
    for t, r in merged_by:
        last_merged[t] = max(last_merged.get(t, r), r)
    # Rounds whose tier model may still be merged: queued for the aggregator, or its tier's newest (and, with one
    # round per tier, newer than the tier's last merged round: the aggregator does not skip one and merge the next).
    tm_in_flight = {
        k
        for i, k in unmerged.items()
        if i in queued_ids
        or (newest_unmerged.get(k[0]) == k[1] and (not one_round_per_tier or k[1] > last_merged.get(k[0], 0)))
    }
    tm_dead = {d.message_id for d in dead_letters if d.source != "service"} & unmerged.keys()
    lost_tms = sorted(i for i, k in unmerged.items() if k not in tm_in_flight or i in tm_dead)
    counts["tier_models_lost"] = len(lost_tms)
    examples["tier_models_lost"] = _examples(lost_tms)

    # --- client updates ----------------------------------------------------------------------------------
    ids_of: dict[UpdateKey, set[str]] = defaultdict(set)
    for u in updates:
        if u.tier >= 1:
            ids_of[(u.tier, u.round, u.client)].add(u.id)
    late_ids = {r.id.removeprefix("late-") for r in reports if r.id.startswith("late-")}
    answered: dict[Round, set[int]] = defaultdict(set)  # clients each round report lists as having answered
    for r in reports:
        answered[(r.tier, r.round)].update(r.latencies)
    by_service = {
        d.message_id for d in dead_letters if d.source == "service" and any(x in d.reason for x in legitimate)
    }
    refused = {d.message_id: d.reason for d in dead_letters if d.source == "service"}
    by_broker = {d.message_id: d for d in dead_letters if d.source != "service"}

    merged_keys = after_close = dead = in_flight = 0
    lost: list[str] = []
    counted_twice: list[str] = []
    broker_dead: list[str] = []
    for key, ids in ids_of.items():
        t, r, c = key
        rnd = (t, r)
        name = min(ids)
        merged = c in clients_of.get(rnd, ()) and rnd in merged_by
        if merged and len(merged_by[rnd]) > 1:
            counted_twice.append(f"{name}: merged by {len(merged_by[rnd])} global models")
        late = bool(ids & late_ids) or (c in answered.get(rnd, ()) and c not in clients_of.get(rnd, ()))
        broker = sorted(i for i in ids if i in by_broker)
        if broker:
            broker_dead.extend(f"{i} ({by_broker[i].reason}, {by_broker[i].queue})" for i in broker)
        if merged:
            merged_keys += 1
        elif late:
            after_close += 1
        elif broker:
            lost.append(f"{name}: dead-lettered by the broker ({by_broker[broker[0]].reason})")
        elif ids & by_service:
            dead += 1
        elif ids & refused.keys():
            lost.append(f"{name}: refused by a service ({refused[min(ids & refused.keys())]})")
        elif ids & queued_ids:
            in_flight += 1
        elif rnd not in clients_of and one_round_per_tier and last_merged.get(t, 0) > r:
            lost.append(f"{name}: tier {t} round {r} never closed, but round {last_merged[t]} was merged")
        elif rnd not in clients_of or (rnd in tm_in_flight and c in clients_of[rnd]):
            in_flight += 1
        elif c in clients_of[rnd]:
            lost.append(f"{name}: its tier model tm{t}-r{r} was never merged")
        else:
            lost.append(f"{name}: not among tier {t} round {r}'s merged clients, nor reported, nor dead-lettered")
    counts["updates_lost"] = len(lost)
    examples["updates_lost"] = _examples(lost)
    counts["updates_counted_twice"] = len(counted_twice)
    examples["updates_counted_twice"] = _examples(counted_twice)
    counts["updates_dead_lettered_by_broker"] = len(broker_dead)
    examples["updates_dead_lettered_by_broker"] = tuple(sorted(broker_dead))  # all of them: the brief lists them

    info = {
        "updates": len(ids_of),
        "update_messages": len({i for ids in ids_of.values() for i in ids}),
        "updates_merged": merged_keys,
        "updates_answered_after_close": after_close,
        "updates_dead_lettered_by_service": dead,
        "updates_in_flight": in_flight,
        "tier_models": len(variants),
        "tier_models_in_flight": sum(1 for k in unmerged.values() if k in tm_in_flight),
        "versions": top + 1,
        "global_messages": len(globals),
        "dead_letters": len(dead_letters),
        "dead_letters_by_broker": sum(1 for d in dead_letters if d.source != "service"),
    }
    return Verdict(counts=counts, examples={k: v for k, v in examples.items() if v}, info=info)
