"""The tiering module: profiles every client's response latency, assigns tiers, re-tiers on drift.

Latency is measured the same way for the profiling pass and for every completed task: from the task's dispatch
to the update's arrival, where an update counts as arriving at max(received, not_before). A profiling answer that
comes before its `not_before` (a real worker publishes at once) counts only from then: its client's slot frees, the
next profiling task goes out and the pass may end at that instant, as in the latency model. Profiling answers come
as (model-less) updates; round latencies come from the barrier's small round reports, including the reports the
barrier sends for answers that came after their round closed. A client missing from a round only counts a miss:
its real latency arrives with its late answer, and a client that never answers is dropped after `max_misses`.
The whole memory is one `ProfilerState` value, saved by the transport before any assignment leaves.

Real clients (`real_clients`) have no fixed list: a verified `Join` queues its client for profiling (its task goes to
the client's own queue), the latency is the profiler's own clock from sending the task to receiving the answer, and
after the first pass every change of membership (a newly profiled client, a `Leave`, an eviction) re-assigns the
tiers after a short `regroup_delay`, so that a burst of joins makes one assignment. A `Leave` for a revoked client
also refuses its later joins.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from fedat.fl.tiering import Tiers, assign_tiers, ewma, moved_clients, tier_of
from fedat.protocol import ids, topology
from fedat.protocol.service import NOTHING, Effects, Inbound, Observation, Outgoing, Reject, Subscription, done
from fedat.protocol.statecodec import StateCodec
from fedat.protocol.wire import Join, Leave, RoundReport, TierAssignment, TrainTask, Update

REPORT_MEMORY = 512  # round-report ids remembered, so that a redelivered copy is not counted twice

LATENCY, ASSIGNED_OBS, EVICTED = "latency", "assignment", "evicted"  # observation names
JOINED, LEFT, REVOKED, REFUSED = "joined", "left", "revoked", "refused"  # real clients' membership
LEAVE_REASONS = ("stopped", "revoked")


@dataclass(frozen=True)
class ProfilerConfig:
    """Profiling pass and re-tiering settings."""

    num_clients: int = 100
    num_tiers: int = 5
    tier_sizes: tuple[float, ...] = ()  # relative tier sizes, fastest first (e.g. 50,50,100,100,200); () = equal
    profile_epochs: int = 1
    batch_size: int = 10
    learning_rate: float = 1e-3
    concurrency: int = 32
    profile_deadline: float = 300.0
    retier_every: int = 50
    drift_fraction: float = 0.1
    ewma_alpha: float = 0.3
    max_misses: int = 3  # consecutive unanswered rounds before a client is dropped from the tiers (0: never)
    codec: str = "polyline"
    precision: int = 4
    real_clients: bool = False  # members come and go by Join and Leave; num_clients > 0 ends the first pass early
    regroup_delay: float = 2.0  # real clients: membership changes this close together make one assignment


class Stage(enum.Enum):
    """The profiler's life: it profiles once, then keeps the assignment up to date."""

    IDLE = "idle"  # never started
    PROFILING = "profiling"  # tasks out, latencies coming in, until everyone answered or the deadline
    ASSIGNED = "assigned"  # tiers published; round reports refine them


@dataclass(frozen=True)
class ProfilerState:
    """Latencies, the profiling pass's progress, the current tiers."""

    stage: Stage = Stage.IDLE
    started_at: float = 0.0  # when profiling began: the run's origin, sent in every task and assignment
    latency: Mapping[int, float] = field(default_factory=dict)
    queue: tuple[int, ...] = ()  # clients still to profile
    outstanding: frozenset[int] = frozenset()  # profiling tasks out whose answers do not count yet
    arriving: Mapping[int, tuple[float, float]] = field(default_factory=dict)  # answered early: (counts at, latency)
    deadline: float = 0.0  # of the profiling pass
    epoch: int = 0
    tiers: Tiers = ()
    samples_since: int = 0  # latency samples since the last re-tiering check
    misses: Mapping[int, int] = field(default_factory=dict)  # consecutive rounds asked and unanswered, per client
    reports: tuple[str, ...] = ()  # ids of the round reports folded in most recently
    # Real clients only (added last, with defaults, so that a state saved before them still reads):
    sent: Mapping[int, float] = field(default_factory=dict)  # when each one's profiling task went out
    joins: Mapping[int, str] = field(default_factory=dict)  # id of each one's latest join (a copy changes nothing)
    left: frozenset[int] = frozenset()  # said goodbye: a straggler's late answer does not bring it back
    revoked: frozenset[int] = frozenset()  # refused for good
    regroup_at: float = 0.0  # a re-assignment is due then (0: none pending)


class Profiler:
    """Latency bookkeeping and tier assignment."""

    name = "profiler"
    codec = StateCodec(2, (ProfilerState, Stage))

    def __init__(self, cfg: ProfilerConfig):
        self.cfg = cfg

    def initial(self) -> ProfilerState:
        """Nobody profiled yet (real clients: nobody joined yet)."""
        return ProfilerState(queue=() if self.cfg.real_clients else tuple(range(self.cfg.num_clients)))

    def subscriptions(self) -> dict[str, Subscription]:
        """Profiling answers and round reports; with real clients also their joins and leaves (one queue, in order)."""
        subs = {
            topology.PROFILER_RESULTS: Subscription(Update, self.on_answer),
            topology.PROFILER_REPORTS: Subscription(RoundReport, self.on_report),
        }
        if self.cfg.real_clients:
            subs[topology.PROFILER_MEMBERS] = Subscription(Join, self.on_join, more=((Leave, self.on_leave),))
        return subs

    def on_start(self, state: ProfilerState, now: float) -> tuple[ProfilerState, Effects]:
        """Start the profiling pass once; after a restart re-arm its deadline and early answers' arrivals only."""
        if state.stage is Stage.IDLE:
            state = replace(state, stage=Stage.PROFILING, started_at=now, deadline=now + self.cfg.profile_deadline)
            state, effects = self._dispatch(state, now)
            return state, effects + Effects(timers=((self.cfg.profile_deadline, ids.PROFILE_DEADLINE),))
        timers: tuple[tuple[float, str], ...] = ()
        if state.stage is Stage.PROFILING:
            timers = ((max(0.0, state.deadline - now), ids.PROFILE_DEADLINE),) + tuple(
                (max(0.0, at - now), ids.arrival_timer(c)) for c, (at, _) in state.arriving.items()
            )
        timers += tuple(
            (max(0.0, sent + self.cfg.profile_deadline - now), ids.expire_timer(c))
            for c, sent in state.sent.items()
            if c in state.outstanding
        )
        if state.regroup_at:
            timers += ((max(0.0, state.regroup_at - now), ids.REGROUP),)
        return state, Effects(timers=timers)

    def on_timer(self, state: ProfilerState, key: str, now: float, held) -> tuple[ProfilerState, Effects]:
        """The profiling deadline assigns tiers among the clients that answered; an early answer's arrival counts it."""
        if key == ids.PROFILE_DEADLINE:
            if state.stage is Stage.PROFILING and now >= state.deadline:
                return self._assign(state, now)
            return state, NOTHING
        if key == ids.REGROUP:
            return self._regroup(state, now)
        if ids.timer_kind(key) == ids.EXPIRE:
            return self._expire(state, ids.parse_keyed_timer(ids.EXPIRE, key), now)
        client = ids.parse_arrival_timer(key)
        if client not in state.arriving:
            return state, NOTHING  # counted already (the deadline came first, or a restart re-armed it twice)
        at, latency = state.arriving[client]
        if at > now:  # timers may fire a hair early: wait for the modelled arrival
            return state, Effects(timers=((at - now, key),))
        state = replace(state, arriving={c: a for c, a in state.arriving.items() if c != client})
        return self._count(state, client, latency, now)

    def on_answer(self, state: ProfilerState, inbound: Inbound, now: float, held) -> tuple[ProfilerState, Effects]:
        """A profiling answer: its latency, then the next profiling task (and the tiers once everyone answered)."""
        msg: Update = inbound.message
        if msg.tier != 0:
            raise Reject(f"update {msg.id}: the profiler only takes profiling answers (tier 0), got tier {msg.tier}")
        if self.cfg.real_clients:
            if msg.client not in state.sent:
                return state, done(inbound)  # a copy of an answer counted already, or one from before a leave
            # Measured on this clock alone, from sending the task: a client cannot make itself look faster.
            sent = {c: t for c, t in state.sent.items() if c != msg.client}
            state, effects = self._count(replace(state, sent=sent), msg.client, now - state.sent[msg.client], now)
            return state, done(inbound) + effects
        awaited = msg.client in state.outstanding
        # After the pass, a client that missed its deadline still gets a latency: it joins at the next re-tiering.
        unknown = state.stage is Stage.ASSIGNED and msg.client not in state.latency
        if not (awaited or unknown) or msg.client in state.arriving:
            return state, done(inbound)  # a copy of an answer already counted
        latency = max(now, msg.not_before) - msg.dispatched_at
        if awaited and msg.not_before > now:
            # Early: it counts at its modelled arrival. Acked now: the state remembers it.
            arriving = {**state.arriving, msg.client: (msg.not_before, latency)}
            timer = (msg.not_before - now, ids.arrival_timer(msg.client))
            return replace(state, arriving=arriving), done(inbound) + Effects(timers=(timer,))
        state, effects = self._count(state, msg.client, latency, now)
        return state, done(inbound) + effects

    def on_report(self, state: ProfilerState, inbound: Inbound, now: float, held) -> tuple[ProfilerState, Effects]:
        """Fold a round's latencies into the clients' EWMA; count misses; re-tier on drift or drop-outs."""
        report: RoundReport = inbound.message
        if report.id in state.reports:
            return state, done(inbound)  # redelivered: already folded in
        misses = {c: n for c, n in state.misses.items() if c not in report.latencies}
        latency = dict(state.latency)
        evicted = []
        for c in report.missing:  # no answer yet: its latency comes with the late answer, if one ever comes
            misses[c] = misses.get(c, 0) + 1
            if self.cfg.max_misses and misses[c] >= self.cfg.max_misses and c in latency:
                evicted.append(c)  # gone for good (the paper's unstable clients): stop asking it
                del latency[c]
        observed = [Observation(EVICTED)] * len(evicted)
        for client, sample in report.latencies.items():
            observed.append(Observation(LATENCY, report.tier, sample))
            if client in state.left or client in state.revoked:
                continue  # a real client that said goodbye comes back only by joining again
            latency[client] = ewma(latency.get(client), sample, self.cfg.ewma_alpha)
        state = replace(
            state,
            latency=latency,
            misses=misses,
            samples_since=state.samples_since + len(report.latencies),
            reports=(*state.reports, report.id)[-REPORT_MEMORY:],
        )
        effects = done(inbound) + Effects(observe=tuple(observed))
        if state.stage is not Stage.ASSIGNED:
            return state, effects
        if self.cfg.real_clients and latency.keys() != tier_of(state.tiers).keys():
            state, regroup = self._changed(replace(state, samples_since=0), now)  # evicted, or a straggler is back
            return state, effects + regroup
        if evicted and len(latency) >= self.cfg.num_tiers:
            state, published = self._publish(replace(state, samples_since=0), self._tiers(state), now)
            return state, effects + published
        if state.samples_since >= self.cfg.retier_every:
            state, retiered = self._retier(replace(state, samples_since=0), now)
            return state, effects + retiered
        return state, effects

    def on_join(self, state: ProfilerState, inbound: Inbound, now: float, held) -> tuple[ProfilerState, Effects]:
        """A real client is online: profile it (again, if it is a member that restarted); refuse a revoked one."""
        msg: Join = inbound.message
        c = msg.client
        if c in state.revoked:
            return state, done(inbound) + Effects(observe=(Observation(REFUSED),))
        if state.joins.get(c) == msg.id:
            return state, done(inbound)  # a copy of a join already taken
        state = replace(
            state,
            joins={**state.joins, c: msg.id},
            left=state.left - {c},
            misses={k: n for k, n in state.misses.items() if k != c},
        )
        if c not in state.queue and c not in state.outstanding:
            state = replace(state, queue=(*state.queue, c))
        state, effects = self._dispatch(state, now)
        return state, done(inbound) + effects + Effects(observe=(Observation(JOINED),))

    def on_leave(self, state: ProfilerState, inbound: Inbound, now: float, held) -> tuple[ProfilerState, Effects]:
        """A real client has gone (stopped, or revoked: then refused from now on): the tiers drop it."""
        msg: Leave = inbound.message
        if msg.reason not in LEAVE_REASONS:
            raise Reject(f"leave {msg.id}: reason must be one of {list(LEAVE_REASONS)}, got {msg.reason!r}")
        c = msg.client
        revoked = msg.reason == "revoked"
        if c in state.left and not revoked or c in state.revoked:
            return state, done(inbound)  # said already
        state = replace(
            state,
            latency={k: v for k, v in state.latency.items() if k != c},
            queue=tuple(k for k in state.queue if k != c),
            outstanding=state.outstanding - {c},
            sent={k: v for k, v in state.sent.items() if k != c},
            misses={k: n for k, n in state.misses.items() if k != c},
            left=state.left | {c},
            revoked=state.revoked | {c} if revoked else state.revoked,
        )
        state, effects = self._dispatch(state, now)  # its profiling slot, if it held one
        observed = Effects(observe=(Observation(REVOKED if revoked else LEFT),))
        if state.stage is not Stage.ASSIGNED:
            return state, done(inbound) + effects + observed
        state, regroup = self._changed(state, now)
        return state, done(inbound) + effects + regroup + observed

    def _expire(self, state: ProfilerState, client: int, now: float) -> tuple[ProfilerState, Effects]:
        """A real client's profiling task went unanswered for a whole deadline: free its slot for the next client.

        Its answer still counts if it comes (`sent` keeps when its task went out)."""
        sent = state.sent.get(client)
        if client not in state.outstanding or sent is None:
            return state, NOTHING  # answered, or gone
        if sent + self.cfg.profile_deadline > now:
            return state, Effects(timers=((sent + self.cfg.profile_deadline - now, ids.expire_timer(client)),))
        return self._dispatch(replace(state, outstanding=state.outstanding - {client}), now)

    def _changed(self, state: ProfilerState, now: float) -> tuple[ProfilerState, Effects]:
        """Membership or a member's latency changed after the first pass: re-assign soon, with what else comes."""
        if state.regroup_at:
            return state, NOTHING  # one is due already: it will see this change too
        delay = self.cfg.regroup_delay
        return replace(state, regroup_at=now + delay), Effects(timers=((delay, ids.REGROUP),))

    def _regroup(self, state: ProfilerState, now: float) -> tuple[ProfilerState, Effects]:
        """The coalesced re-assignment: publish the tiers of the members now, if they differ from the last ones."""
        if not state.regroup_at:
            return state, NOTHING  # done already (a restart re-armed it)
        if state.regroup_at > now:  # timers may fire a hair early
            return state, Effects(timers=((state.regroup_at - now, ids.REGROUP),))
        state = replace(state, regroup_at=0.0, samples_since=0)
        tiers = self._tiers(state)
        if tiers == state.tiers:
            return state, NOTHING
        return self._publish(state, tiers, now)

    def _count(self, state: ProfilerState, client: int, latency: float, now: float) -> tuple[ProfilerState, Effects]:
        """A profiling answer has arrived: keep its latency, free its slot, end the pass once everyone answered."""
        state = replace(state, latency={**state.latency, client: latency}, outstanding=state.outstanding - {client})
        state, effects = self._dispatch(state, now)
        if state.stage is Stage.ASSIGNED and self.cfg.real_clients:
            state, regroup = self._changed(state, now)
            return state, effects + regroup
        if state.stage is Stage.PROFILING and self._pass_complete(state):
            state, assigned = self._assign(state, now)
            effects = effects + assigned
        return state, effects

    def _pass_complete(self, state: ProfilerState) -> bool:
        """Every client answered: the fixed list, or (real clients) as many as FEDAT_NUM_CLIENTS when it is set."""
        if self.cfg.real_clients:
            return 0 < self.cfg.num_clients <= len(state.latency)
        return not state.queue and not state.outstanding

    def _dispatch(self, state: ProfilerState, now: float) -> tuple[ProfilerState, Effects]:
        room = max(0, self.cfg.concurrency - len(state.outstanding))
        clients, queue = state.queue[:room], state.queue[room:]
        if not clients:
            return state, NOTHING
        real = self.cfg.real_clients
        tasks = tuple(
            Outgoing(
                topology.TRAIN,
                topology.client_key(c) if real else topology.PROFILE_KEY,  # a real client's own queue
                TrainTask(
                    id=ids.profile_task(c),
                    client=c,
                    tier=0,
                    round=0,
                    version=0,
                    epochs=self.cfg.profile_epochs,
                    batch_size=self.cfg.batch_size,
                    learning_rate=self.cfg.learning_rate,
                    prox_lambda=0.0,
                    codec=self.cfg.codec,
                    precision=self.cfg.precision,
                    sent_at=now,
                    layers=(),
                    run_started_at=state.started_at,
                ),
            )
            for c in clients
        )
        state = replace(state, queue=queue, outstanding=state.outstanding | set(clients))
        if not real:
            return state, Effects(publish=tasks)
        expiry = tuple((self.cfg.profile_deadline, ids.expire_timer(c)) for c in clients)
        return replace(state, sent={**state.sent, **dict.fromkeys(clients, now)}), Effects(publish=tasks, timers=expiry)

    def _assign(self, state: ProfilerState, now: float) -> tuple[ProfilerState, Effects]:
        if len(state.latency) < self.cfg.num_tiers:
            state = replace(state, deadline=now + self.cfg.profile_deadline)
            return state, Effects(timers=((self.cfg.profile_deadline, ids.PROFILE_DEADLINE),))
        if self.cfg.real_clients:  # those still joining or answering are tiered as they come
            state = replace(state, stage=Stage.ASSIGNED, regroup_at=0.0)
        else:
            state = replace(state, stage=Stage.ASSIGNED, queue=(), outstanding=frozenset())
        return self._publish(state, self._tiers(state), now)

    def _retier(self, state: ProfilerState, now: float) -> tuple[ProfilerState, Effects]:
        new = self._tiers(state)
        if len(moved_clients(state.tiers, new)) < self.cfg.drift_fraction * len(state.latency):
            return state, NOTHING
        return self._publish(state, new, now)

    def _tiers(self, state: ProfilerState) -> Tiers:
        if self.cfg.real_clients and len(state.latency) < self.cfg.num_tiers:  # fewer members than tiers, after leaves
            ordered = sorted(state.latency, key=lambda c: (state.latency[c], c))
            return tuple((c,) for c in ordered) + ((),) * (self.cfg.num_tiers - len(ordered))
        return assign_tiers(state.latency, self.cfg.num_tiers, self.cfg.tier_sizes)

    def _publish(self, state: ProfilerState, tiers: Tiers, now: float) -> tuple[ProfilerState, Effects]:
        epoch = state.epoch + 1
        state = replace(state, epoch=epoch, tiers=tiers)
        msg = TierAssignment(
            id=ids.assignment(epoch),
            epoch=epoch,
            tiers=tiers,
            latencies=dict(state.latency),
            created_at=now,
            run_started_at=state.started_at,
        )
        observed = (Observation(ASSIGNED_OBS),) + tuple(
            Observation("tier_size", m, len(group)) for m, group in enumerate(tiers, start=1)
        )
        return state, Effects(publish=(Outgoing(topology.CONTROL, "", msg),), observe=observed)
