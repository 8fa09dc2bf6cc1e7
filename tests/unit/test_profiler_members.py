"""The profiler with real clients: membership by join and leave, driven directly (no broker), crashes included."""

from __future__ import annotations

import pytest

from fedat.fl.tiering import tier_of
from fedat.protocol import ids, topology
from fedat.protocol.service import Effects, Reject
from fedat.protocol.wire import Join, Leave, RoundReport, TierAssignment, TrainTask, Update
from fedat_profiler.profiler import Profiler, ProfilerConfig, Stage

from ..driver import Driver

MEMBERS, RESULTS, REPORTS = topology.PROFILER_MEMBERS, topology.PROFILER_RESULTS, topology.PROFILER_REPORTS


def profiler(**kw) -> Driver:
    cfg = dict(real_clients=True, num_clients=0, num_tiers=2, concurrency=4, profile_deadline=60.0, regroup_delay=2.0)
    return Driver(Profiler(ProfilerConfig(**{**cfg, **kw})))


def join(client: int, at: float = 0.0) -> Join:
    return Join(id=ids.join(client, int(at * 1000)), client=client, n_samples=100, sent_at=at)


def leave(client: int, reason: str = "stopped") -> Leave:
    return Leave(id=ids.leave(client, 1), client=client, reason=reason, sent_at=0.0)


def answer(task: TrainTask, client_says: float = 0.0) -> Update:
    """A real client's profiling answer; its own time fields say whatever it likes (`client_says`)."""
    return Update(
        id=ids.update(task.id),
        task_id=task.id,
        client=task.client,
        tier=0,
        round=0,
        base_version=0,
        n_samples=100,
        loss=0.5,
        dispatched_at=client_says,
        started_at=client_says,
        finished_at=client_says,
        train_seconds=0.0,
        not_before=0.0,
        late=False,
        layers=(),
    )


def tasks(fx: Effects) -> dict[int, TrainTask]:
    return {o.message.client: o.message for o in fx.publish if isinstance(o.message, TrainTask)}


def assignments(fx: Effects) -> list[TierAssignment]:
    return [o.message for o in fx.publish if isinstance(o.message, TierAssignment)]


def profiled(p: Driver, latencies: dict[int, float], at: float = 0.0) -> list[TierAssignment]:
    """Each client joins at `at` and answers its profiling task after its latency; the assignments published."""
    out, sent = [], {}
    for c in latencies:
        fx = p.deliver(MEMBERS, join(c, at), at)
        sent.update(tasks(fx))
        out += assignments(fx)
    for c in sorted(latencies, key=latencies.get):
        fx = p.deliver(RESULTS, answer(sent[c]), at + latencies[c])
        sent.update(tasks(fx))
        out += assignments(fx)
    return out


def members(a: TierAssignment) -> set[int]:
    return {c for tier in a.tiers for c in tier}


def test_nobody_is_profiled_before_joining_and_a_join_sends_the_task_to_the_client_s_own_queue():
    p = profiler()
    fx = p.start(0.0)
    assert p.state.queue == () and tasks(fx) == {}
    assert fx.timers == ((60.0, ids.PROFILE_DEADLINE),)
    fx = p.deliver(MEMBERS, join(7), 1.0)
    (out,) = fx.publish
    assert out.exchange == topology.TRAIN and out.routing_key == "client-7"
    assert out.message.id == "p-c7" and out.message.tier == 0 and out.message.layers == ()
    assert (60.0, ids.expire_timer(7)) in fx.timers and fx.ack == (1,)


def test_latency_is_the_profiler_s_own_clock_from_sending_to_receiving():
    p = profiler()
    p.start(0.0)
    task = tasks(p.deliver(MEMBERS, join(3), 10.0))[3]
    p.deliver(RESULTS, answer(task, client_says=10.0e9), 14.5)  # a client's clock proves nothing
    assert p.state.latency == {3: 4.5}
    p.deliver(RESULTS, answer(task), 20.0)  # a copy
    assert p.state.latency == {3: 4.5}


def test_the_first_pass_ends_at_the_deadline_with_enough_clients_or_waits_another():
    p = profiler(num_tiers=3)
    p.start(0.0)
    profiled(p, {0: 1.0, 1: 2.0})
    fx = p.timer(ids.PROFILE_DEADLINE, 60.0)
    assert assignments(fx) == [] and fx.timers == ((60.0, ids.PROFILE_DEADLINE),)
    profiled(p, {2: 3.0}, at=61.0)
    (a,) = assignments(p.timer(ids.PROFILE_DEADLINE, 120.0))
    assert a.tiers == ((0,), (1,), (2,)) and p.state.stage is Stage.ASSIGNED


def test_num_clients_ends_the_first_pass_as_soon_as_that_many_answered():
    p = profiler(num_clients=4)
    p.start(0.0)
    published = profiled(p, {0: 4.0, 1: 1.0, 2: 3.0, 3: 2.0})
    (a,) = published
    assert a.epoch == 1 and a.tiers == ((1, 3), (2, 0)) and a.created_at == 4.0


def test_a_thousand_joins_after_the_first_pass_make_one_assignment_not_a_thousand():
    p = profiler(num_clients=2, concurrency=2000)
    p.start(0.0)
    assert len(profiled(p, {0: 1.0, 1: 2.0})) == 1
    late = profiled(p, {c: 1.0 + c / 1000 for c in range(2, 1002)}, at=10.0)
    assert late == [] and p.state.regroup_at == pytest.approx(13.002)
    (a,) = assignments(p.timer(ids.REGROUP, 13.002))
    assert a.epoch == 2 and len(members(a)) == 1002 and p.state.regroup_at == 0.0
    assert p.timer(ids.REGROUP, 14.0).publish == ()  # a second firing (after a restart) does nothing


def test_a_leave_drops_the_client_at_once_and_a_straggler_s_late_answer_does_not_bring_it_back():
    p = profiler(num_clients=4)
    p.start(0.0)
    profiled(p, {0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0})
    fx = p.deliver(MEMBERS, leave(2), 10.0)
    assert fx.timers == ((2.0, ids.REGROUP),)
    (a,) = assignments(p.timer(ids.REGROUP, 12.0))
    assert members(a) == {0, 1, 3}
    straggler = RoundReport(id="late-x", tier=2, round=1, latencies={2: 3.0}, missing=(), waited=0.0, closed_at=0.0)
    assert assignments(p.deliver(REPORTS, straggler, 13.0)) == [] and 2 not in p.state.latency
    assert p.state.regroup_at == 0.0
    profiled(p, {2: 1.5}, at=20.0)  # it comes back: it joins again
    (a,) = assignments(p.timer(ids.REGROUP, 21.5 + 2.0))
    assert members(a) == {0, 1, 2, 3}


def test_a_revoked_client_is_refused_from_then_on_even_after_a_restart():
    p = profiler(num_clients=3)
    p.start(0.0)
    profiled(p, {0: 1.0, 1: 2.0, 2: 3.0})
    p.deliver(MEMBERS, leave(1, "revoked"), 5.0)
    p.crash()
    p.start(6.0)
    assert p.state.revoked == {1}
    fx = p.deliver(MEMBERS, join(1, 7.0), 7.0)
    assert tasks(fx) == {} and fx.ack and fx.observe[0].name == "refused"
    (a,) = assignments(p.timer(ids.REGROUP, 7.0))
    assert members(a) == {0, 2}


def test_a_leave_with_an_unknown_reason_is_refused():
    p = profiler()
    p.start(0.0)
    with pytest.raises(Reject, match="reason must be one of"):
        p.deliver(MEMBERS, leave(1, "bored"), 1.0)


def test_a_member_that_joins_again_is_profiled_again_but_a_copy_of_its_join_changes_nothing():
    p = profiler(num_clients=2)
    p.start(0.0)
    (first,) = profiled(p, {0: 1.0, 1: 2.0})
    assert tier_of(first.tiers) == {0: 1, 1: 2}
    assert tasks(p.deliver(MEMBERS, join(0, 0.0), 5.0)) == {}  # the same join, redelivered
    again = tasks(p.deliver(MEMBERS, join(0, 5.0), 5.0))  # it restarted: a new join
    assert set(again) == {0}
    p.deliver(RESULTS, answer(again[0]), 10.0)  # slower now
    (a,) = assignments(p.timer(ids.REGROUP, 12.0))
    assert tier_of(a.tiers) == {1: 1, 0: 2}


def test_an_unanswered_profiling_task_frees_its_slot_and_its_answer_still_counts_later():
    p = profiler(num_clients=2, concurrency=1)
    p.start(0.0)
    first = tasks(p.deliver(MEMBERS, join(0), 0.0))[0]
    assert tasks(p.deliver(MEMBERS, join(1), 0.0)) == {}  # no slot
    p.crash()
    assert (59.0, ids.expire_timer(0)) in p.start(1.0).timers  # re-armed after a restart
    second = tasks(p.timer(ids.expire_timer(0), 60.0))[1]
    p.deliver(RESULTS, answer(second), 61.0)
    (a,) = assignments(p.deliver(RESULTS, answer(first), 90.0))
    assert a.latencies == {1: 1.0, 0: 90.0}


def test_an_evicted_client_leaves_the_tiers_with_the_next_regroup_and_its_late_answer_brings_it_back():
    p = profiler(num_clients=3, max_misses=2)
    p.start(0.0)
    profiled(p, {0: 1.0, 1: 2.0, 2: 3.0})
    for n in (1, 2):
        p.deliver(REPORTS, RoundReport(f"rr1-r{n}", 1, n, {0: 1.0}, (2,), 9.0, 0.0), 10.0 * n)
    assert 2 not in p.state.latency and p.state.regroup_at == 22.0
    (a,) = assignments(p.timer(ids.REGROUP, 22.0))
    assert members(a) == {0, 1}
    back = RoundReport("late-u-t1-r2-c2-v0", 1, 2, {2: 30.0}, (), 0.0, 0.0)
    p.deliver(REPORTS, back, 30.0)
    (a,) = assignments(p.timer(ids.REGROUP, 32.0))
    assert members(a) == {0, 1, 2}


def test_with_fewer_members_than_tiers_each_gets_a_tier_of_its_own_and_the_slowest_stay_empty():
    p = profiler(num_clients=3, num_tiers=3)
    p.start(0.0)
    profiled(p, {0: 1.0, 1: 2.0, 2: 3.0})
    p.deliver(MEMBERS, leave(0), 5.0)
    p.deliver(MEMBERS, leave(1), 5.5)
    (a,) = assignments(p.timer(ids.REGROUP, 7.0))
    assert a.tiers == ((2,), (), ())


def test_a_pending_regroup_survives_a_restart():
    p = profiler(num_clients=2)
    p.start(0.0)
    profiled(p, {0: 1.0, 1: 2.0})
    p.deliver(MEMBERS, leave(1), 5.0)
    p.crash()
    fx = p.start(6.0)
    assert (1.0, ids.REGROUP) in fx.timers
    assert p.timer(ids.REGROUP, 6.5).timers == ((0.5, ids.REGROUP),)  # a hair early: waits
    (a,) = assignments(p.timer(ids.REGROUP, 7.0))
    assert members(a) == {0}
