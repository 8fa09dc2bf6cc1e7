"""The global aggregator and the profiler, driven directly (no broker)."""

from __future__ import annotations

import numpy as np
import pytest

from fedat.fl.strategies import STRATEGIES, FedBuff, build_strategy
from fedat.fl.tiering import tier_of
from fedat.protocol import topology
from fedat.protocol.service import Inbound, Reject
from fedat.protocol.wire import (
    GlobalModel,
    RoundReport,
    TierModel,
    TrainTask,
    Update,
    decode_model,
    encode_model,
    seed_model,
)
from fedat_aggregator.aggregator import Aggregator, AggregatorConfig
from fedat_profiler.profiler import Profiler, ProfilerConfig

from ..driver import Driver


def inbound(msg, tag=1, queue="q"):
    return Inbound(queue, msg, tag, False, 0)


class Run(Driver):
    """The service under a driver, fed the old way: by message (its queue is the one expecting that kind)."""

    def handle(self, ib: Inbound, now: float):
        queue = next(q for q, s in self.service.subscriptions().items() if s.expects is type(ib.message))
        return self.deliver(queue, ib.message, now)

    def on_start(self, now: float):
        return self.start(now)

    def on_timer(self, key: str, now: float):
        return self.timer(key, now)

    def arrive(self, update: Update, tag: int = 1):
        """An answer delivered at its modelled arrival, as the simulator delivers it."""
        return self.handle(inbound(update, tag=tag), update.not_before)

    def __getattr__(self, name: str):
        return getattr(self.state, name)


def tier_model(tier: int, rnd: int, value: float, shape=(2,), base_version=0, clients=(1, 2)) -> TierModel:
    return TierModel(
        id=f"tm{tier}-r{rnd}",
        tier=tier,
        round=rnd,
        base_version=base_version,
        n_samples=10,
        clients=clients,
        bytes_up=100,
        bytes_down=200,
        late=1,
        closed_at=0.0,
        layers=encode_model([np.full(shape, value, np.float32)], ["w"], "raw"),
    )


FEDAT = build_strategy("fedat")


def aggregator(tiers=3, strategy=FEDAT) -> Aggregator:
    return Run(Aggregator(AggregatorConfig(num_tiers=tiers, codec="raw"), strategy))


def test_each_tier_model_yields_a_global_model_with_fedat_weights():
    a = aggregator()
    outs = []
    for i, (tier, rnd, value) in enumerate([(1, 1, 1.0), (1, 2, 2.0), (3, 1, 8.0)]):
        fx = a.handle(inbound(tier_model(tier, rnd, value), tag=i + 1), 0.0)
        assert fx.ack == (i + 1,)
        outs.append(fx.publish[0].message)
    assert [g.version for g in outs] == [1, 2, 3]
    assert [g.merged for g in outs] == [((1, 1),), ((1, 2),), ((3, 1),)]
    last = outs[-1]
    # counts [2, 0, 1]: reported tiers 1 and 3 mirror each other: tier 1 gets 1/3, tier 3 gets 2/3
    assert last.tier_counts == (2, 0, 1) and last.tier_rounds == (2, 0, 1)
    np.testing.assert_allclose(last.tier_weights, [1 / 3, 0, 2 / 3])
    np.testing.assert_allclose(decode_model(last.layers)[0], 2.0 / 3 + 8.0 * 2 / 3, rtol=1e-6)
    assert last.bytes_up == 300 and last.bytes_down == 600 and last.late == 3 and last.updates == 6


def test_a_redelivered_tier_model_is_merged_once():
    a = aggregator()
    a.handle(inbound(tier_model(2, 1, 1.0)), 0.0)
    fx = a.handle(inbound(tier_model(2, 1, 1.0), tag=2), 0.0)
    assert fx.publish == () and fx.ack == (2,)
    assert a.counts == (0, 1, 0)


def test_foreign_and_misshapen_tier_models_are_rejected_out_of_order_rounds_are_not():
    a = aggregator()
    a.handle(inbound(tier_model(1, 2, 1.0)), 0.0)
    late = a.handle(inbound(tier_model(1, 1, 3.0), tag=2), 0.0)  # concurrent rounds may finish out of order
    assert late.publish[0].message.tier_rounds == (2, 0, 0) and late.publish[0].message.tier_counts == (2, 0, 0)
    with pytest.raises(Reject, match="outside 1..3"):
        a.handle(inbound(tier_model(4, 1, 1.0)), 0.0)
    with pytest.raises(Reject, match="shapes"):
        a.handle(inbound(tier_model(2, 1, 1.0, shape=(3,))), 0.0)


def test_the_seed_model_is_adopted_and_the_aggregators_own_outputs_ignored():
    a = aggregator(1)
    seed = GlobalModel(
        id="g0",
        version=0,
        tier=0,
        tier_round=0,
        merged=(),
        tier_rounds=(0,),
        tier_counts=(0,),
        tier_weights=(0.0,),
        bytes_up=0,
        bytes_down=0,
        late=0,
        updates=0,
        created_at=0.0,
        layers=encode_model([np.zeros(2, np.float32)], ["dense/kernel"], "raw"),
    )
    assert a.handle(inbound(seed), 0.0).publish == ()
    out = a.handle(inbound(tier_model(1, 1, 1.0), tag=2), 0.0).publish[0].message
    assert [layer.name for layer in out.layers] == ["dense/kernel"]


def seeded(strategy, tiers=2, value=1.0) -> Aggregator:
    a = aggregator(tiers, strategy)
    seed = seed_model([np.full(2, value, np.float32)], ["w"], tiers, "raw", 4, 0.0)
    assert a.handle(inbound(seed), 0.0).publish == ()
    return a


def test_fedbuff_publishes_one_global_model_per_buffer_of_arrivals():
    a = seeded(FedBuff(buffer_size=2, server_lr=1.0))  # w0 = [1, 1]
    first = a.handle(inbound(tier_model(1, 1, 3.0), tag=1), 0.0)
    assert first.publish == () and first.ack == (a.tag,)
    assert a.version == 0 and a.counts == (1, 0) and a.pending == ((1, 1),)
    assert a.handle(inbound(tier_model(1, 1, 3.0), tag=2), 0.0).ack == (a.tag,)  # redelivered: absorbed once
    (out,) = a.handle(inbound(tier_model(2, 1, 5.0), tag=3), 0.0).publish
    g1 = out.message
    # both fresh (s = 1): Δ = [2, 2] and [4, 4]; w1 = [1, 1] + ([2, 2] + [4, 4]) / 2 = [4, 4]
    assert g1.version == 1 and g1.merged == ((1, 1), (2, 1)) and (g1.tier, g1.tier_round) == (2, 1)
    assert g1.tier_counts == (1, 1) and g1.bytes_up == 200 and g1.updates == 4
    np.testing.assert_allclose(decode_model(g1.layers)[0], [4.0, 4.0])
    assert a.pending == () and a.strategy_state is None


def test_fedbuff_takes_each_arrivals_delta_from_the_version_it_was_trained_from():
    a = seeded(FedBuff(buffer_size=2, server_lr=1.0))
    a.handle(inbound(tier_model(1, 1, 3.0)), 0.0)
    a.handle(inbound(tier_model(2, 1, 5.0)), 0.0)  # w1 = [4, 4]
    assert a.handle(inbound(tier_model(1, 2, 6.0, base_version=1)), 0.0).publish == ()  # Δ = 6 − 4, s = 1
    # trained from w0 = [1, 1], one version stale: Δ = 9 − 1 = 8, s = 2 ** -0.5
    (out,) = a.handle(inbound(tier_model(2, 2, 9.0, base_version=0)), 0.0).publish
    g2 = out.message
    assert g2.version == 2 and g2.merged == ((1, 2), (2, 2))
    # w2 = [4, 4] + (2 + 8 / √2) / 2 = 5 + 2√2
    np.testing.assert_allclose(decode_model(g2.layers)[0], [5 + 2 * np.sqrt(2)] * 2, rtol=1e-6)
    np.testing.assert_allclose(g2.tier_weights, [0.0, 2**-0.5])


def test_fedbuff_arrival_whose_base_left_the_history_counts_but_adds_nothing():
    a = seeded(FedBuff(buffer_size=1, server_lr=1.0, staleness="constant", history=1))
    (out,) = a.handle(inbound(tier_model(1, 1, 3.0)), 0.0).publish  # w1 = [3, 3]; w0 leaves the history
    assert list(a.history) == [1]
    (out,) = a.handle(inbound(tier_model(1, 2, 9.0, base_version=0)), 0.0).publish
    assert out.message.version == 2 and out.message.merged == ((1, 2),)
    np.testing.assert_allclose(decode_model(out.message.layers)[0], [3.0, 3.0])


def test_aso_fed_averages_the_latest_copy_of_each_client():
    a = seeded(build_strategy("aso-fed"))
    a.handle(inbound(tier_model(1, 1, 2.0, clients=(1, 2))), 0.0)  # clients 1, 2 hold [2, 2] with 5 samples each
    (out,) = a.handle(inbound(tier_model(2, 1, 8.0, clients=(3,))), 0.0).publish
    # (5·2 + 5·2 + 10·8) / 20 = 5
    np.testing.assert_allclose(decode_model(out.message.layers)[0], [5.0, 5.0])
    (out,) = a.handle(inbound(tier_model(1, 2, 0.0, clients=(1,)), tag=3), 0.0).publish
    # client 1 now holds [0, 0] with 10 samples: (10·0 + 5·2 + 10·8) / 25 = 3.6
    np.testing.assert_allclose(decode_model(out.message.layers)[0], [3.6, 3.6], rtol=1e-6)
    assert out.message.version == 3 and out.message.merged == ((1, 2),)


def answer(task: TrainTask, latency: float, tier=0, rnd=0) -> Update:
    return Update(
        id=f"u-{task.id}-{rnd}",
        task_id=task.id,
        client=task.client,
        tier=tier,
        round=rnd,
        base_version=0,
        n_samples=1,
        loss=0.0,
        dispatched_at=task.sent_at,
        started_at=0.0,
        finished_at=0.0,
        train_seconds=0.0,
        not_before=task.sent_at + latency,
        late=False,
        layers=(),
    )


def test_profiling_is_rate_limited_and_ends_in_an_assignment():
    p = Run(Profiler(ProfilerConfig(num_clients=4, num_tiers=2, concurrency=2, retier_every=100)))
    fx = p.on_start(0.0)
    first = [o.message for o in fx.publish]
    assert [t.client for t in first] == [0, 1] and all(o.routing_key == topology.PROFILE_KEY for o in fx.publish)
    assert fx.timers == ((300.0, "profile-deadline"),)
    latencies = {0: 9.0, 1: 1.0, 2: 5.0, 3: 2.0}
    tasks = list(first)
    assignment = None
    for i in range(4):
        fx = p.arrive(answer(tasks[i], latencies[tasks[i].client]), tag=i)
        tasks += [o.message for o in fx.publish if isinstance(o.message, TrainTask)]
        assignment = next((o.message for o in fx.publish if o.exchange == topology.CONTROL), assignment)
    assert assignment is not None and assignment.tiers == ((1, 3), (2, 0))
    assert assignment.latencies == latencies


def test_profiling_deadline_assigns_the_clients_that_answered():
    p = Run(Profiler(ProfilerConfig(num_clients=5, num_tiers=2, concurrency=5)))
    tasks = [o.message for o in p.on_start(0.0).publish]
    for t in tasks[:3]:
        p.arrive(answer(t, float(t.client + 1)))
    fx = p.on_timer("profile-deadline", 300.0)
    (out,) = fx.publish
    assert sorted(c for tier in out.message.tiers for c in tier) == [0, 1, 2]


def report(rnd: int, latencies: dict[int, float], missing=(), waited=0.0) -> RoundReport:
    return RoundReport(
        id=f"rr1-r{rnd}", tier=1, round=rnd, latencies=latencies, missing=tuple(missing), waited=waited, closed_at=0.0
    )


def test_a_client_that_slows_down_is_moved_to_a_slower_tier():
    p = Run(
        Profiler(
            ProfilerConfig(
                num_clients=4, num_tiers=2, concurrency=4, retier_every=2, drift_fraction=0.2, ewma_alpha=1.0
            )
        )
    )
    tasks = [o.message for o in p.on_start(0.0).publish]
    for t in tasks:
        p.arrive(answer(t, [1.0, 2.0, 8.0, 9.0][t.client]))
    assert tier_of(p.tiers)[0] == 1
    fx = p.handle(inbound(report(1, {0: 50.0, 1: 2.0})), 0.0)
    (out,) = fx.publish
    assert out.message.epoch == 2 and tier_of(out.message.tiers)[0] == 2


def test_a_missing_client_keeps_its_latency_until_its_late_answer_reports_the_real_one():
    p = Run(Profiler(ProfilerConfig(num_clients=4, num_tiers=2, concurrency=4, retier_every=1, ewma_alpha=1.0)))
    tasks = [o.message for o in p.on_start(0.0).publish]
    for t in tasks:
        p.arrive(answer(t, [1.0, 2.0, 8.0, 9.0][t.client]))
    p.handle(inbound(report(1, {0: 1.0}, missing=(1,), waited=30.0)), 0.0)
    assert p.latency[1] == 2.0 and tier_of(p.tiers)[1] == 1 and p.misses[1] == 1
    late = RoundReport(id="late-u1", tier=1, round=1, latencies={1: 12.0}, missing=(), waited=0.0, closed_at=0.0)
    p.handle(inbound(late), 0.0)
    assert p.latency[1] == 12.0 and tier_of(p.tiers)[1] == 2 and 1 not in p.misses


def test_the_profiler_rejects_round_updates():
    p = Run(Profiler(ProfilerConfig(num_clients=2, num_tiers=1)))
    (task, _) = [o.message for o in p.on_start(0.0).publish]
    with pytest.raises(Reject, match="only takes profiling answers"):
        p.handle(inbound(answer(task, 1.0, tier=1, rnd=1)), 0.0)


def test_a_client_that_misses_too_many_rounds_is_dropped_from_the_tiers():
    p = Run(Profiler(ProfilerConfig(num_clients=5, num_tiers=2, concurrency=5, retier_every=1000, max_misses=2)))
    tasks = [o.message for o in p.on_start(0.0).publish]
    for t in tasks:
        p.arrive(answer(t, float(t.client + 1)))
    assert p.handle(inbound(report(1, {0: 1.0}, missing=(4,), waited=9.0)), 0.0).publish == ()
    p.handle(inbound(report(2, {4: 1.0}, missing=(), waited=9.0)), 0.0)  # an answer resets the count
    assert p.handle(inbound(report(3, {}, missing=(4,), waited=9.0)), 0.0).publish == ()
    (out,) = p.handle(inbound(report(4, {}, missing=(4,), waited=9.0)), 0.0).publish
    assert 4 not in {c for tier in out.message.tiers for c in tier} and out.message.epoch == 2


def test_an_early_profiling_answer_counts_at_its_modelled_arrival_even_across_a_restart():
    # A real worker publishes at once; the latency model says the client answers at not_before. The slot, the next
    # task and the end of the pass follow the model, as in the simulator (which delivers at not_before).
    p = Run(Profiler(ProfilerConfig(num_clients=2, num_tiers=2, concurrency=1)))
    (first,) = [o.message for o in p.on_start(0.0).publish]
    fx = p.handle(inbound(answer(first, 5.0)), 1.0)
    assert fx.publish == () and fx.ack and fx.timers == ((4.0, "arrival:0"),)
    p.crash()
    assert ("arrival:0" in [k for _, k in p.on_start(2.0).timers]) and p.latency == {}
    assert p.on_timer("arrival:0", 4.99).timers == ((pytest.approx(0.01), "arrival:0"),)  # fired a hair early
    (second,) = [o.message for o in p.on_timer("arrival:0", 5.0).publish]
    assert second.client == 1 and second.sent_at == 5.0 and p.latency == {0: 5.0}
    assert p.on_timer("arrival:0", 6.0).publish == ()  # a second firing (re-armed by the restart) counts nothing
    p.handle(inbound(answer(second, 3.0)), 5.5)
    assert p.handle(inbound(answer(second, 3.0)), 5.6).publish == ()  # a copy while it is arriving
    (out,) = p.on_timer("arrival:1", 8.0).publish
    assert out.message.created_at == 8.0 and out.message.latencies == {0: 5.0, 1: 3.0}


def test_the_deadline_assigns_without_the_answers_still_arriving_which_join_later():
    p = Run(Profiler(ProfilerConfig(num_clients=3, num_tiers=2, concurrency=3, profile_deadline=10.0)))
    tasks = [o.message for o in p.on_start(0.0).publish]
    for t, latency in zip(tasks, (1.0, 2.0, 30.0), strict=True):
        p.handle(inbound(answer(t, latency)), 0.5)
    p.on_timer("arrival:0", 1.0)
    p.on_timer("arrival:1", 2.0)
    (out,) = p.on_timer("profile-deadline", 10.0).publish
    assert sorted(out.message.latencies) == [0, 1]
    assert p.on_timer("arrival:2", 30.0).publish == () and p.latency[2] == 30.0  # joins at the next re-tiering


class KeepsEveryTier:
    """A strategy as it is, except that the aggregator keeps every tier's model for it."""

    reads_every_tier = True

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_only_strategies_that_read_every_tier_keep_every_tiers_model(name):
    strategy = build_strategy(name)
    arrivals = [(1 + k % 3, 1 + k // 3, 0.5 + k) for k in range(24)]
    published = []
    for s in (strategy, KeepsEveryTier(strategy)):
        a = seeded(s, tiers=3)
        outs = []
        for tag, (tier, rnd, value) in enumerate(arrivals, start=2):
            base = max(0, a.state.version - 1)  # trained from the version before the newest
            fx = a.handle(inbound(tier_model(tier, rnd, value, base_version=base), tag=tag), 0.0)
            outs += [(o.message.version, [x.tobytes() for x in decode_model(o.message.layers)]) for o in fx.publish]
        published.append(outs)
        kept = [m is not None for m in a.state.tier_models]
        assert kept == [s.reads_every_tier] * 3, name
    assert published[0] and published[0] == published[1], f"{name}: keeping fewer tier models changed its versions"
