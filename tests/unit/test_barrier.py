"""The barrier's round logic, driven directly (no broker): what it publishes, holds, acks and dead-letters."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from fedat.fl.strategies import build_strategy
from fedat.protocol import topology
from fedat.protocol.service import Reject
from fedat.protocol.wire import GlobalModel, TierAssignment, TrainTask, Update, decode_model, encode_model, model_bytes
from fedat_aggregator.barrier import Barrier, BarrierConfig, Phase

from ..driver import Driver
from ..factories import answer, seed

SHAPES = [(2,)]


class Feed(Driver):
    """Hands the barrier messages with increasing delivery tags."""

    def __call__(self, queue: str, msg, now: float = 0.0):
        return self.deliver(queue, msg, now)

    def on_timer(self, key: str, now: float):
        return self.timer(key, now)


def global_model(version: int, tier: int, tier_round: int, rounds: tuple[int, ...]) -> GlobalModel:
    return replace(
        seed(1, SHAPES),
        id=f"g{version}",
        version=version,
        tier=tier,
        tier_round=tier_round,
        merged=((tier, tier_round),),
        tier_rounds=rounds,
        tier_counts=rounds,
    )


def update(task: TrainTask, value: float, n: int = 1, not_before: float = 0.0) -> Update:
    return answer(task, value, n, not_before)


def opened(k=3, min_clients=2, clients=(0, 1, 2, 3)):
    b = Barrier(
        BarrierConfig(tiers=(1,), clients_per_round=k, min_clients=min_clients, codec="raw", min_deadline=5.0),
        build_strategy("fedat"),
    )
    feed = b = Feed(b)
    feed(topology.BARRIER_ASSIGNMENTS, TierAssignment("a1", 1, (clients,), {c: 1.0 for c in clients}, 0.0))
    fx = feed(topology.BARRIER_GLOBAL, seed(1, SHAPES))
    tasks = [o.message for o in fx.publish]
    return b, feed, fx, tasks


def test_the_seed_opens_a_round_with_k_tasks_and_a_deadline():
    _, _, fx, tasks = opened()
    assert len(tasks) == 3 and all(isinstance(t, TrainTask) and t.round == 1 and t.version == 0 for t in tasks)
    assert fx.timers == ((5.0, "deadline:1:1"),)
    assert fx.ack == (2,)  # the model is acked on receipt (held for a run it would trip consumer_timeout)


def test_updates_are_held_until_the_round_closes_then_acked_together():
    _, feed, _, tasks = opened()
    held = [feed(topology.barrier_queue(1), update(t, float(i), n=i + 1)) for i, t in enumerate(tasks[:2])]
    assert all(fx.ack == () and fx.publish == () for fx in held)
    fx = feed(topology.barrier_queue(1), update(tasks[2], 2.0, n=3))
    out, report = fx.publish
    assert out.exchange == topology.TIER_MODELS and sorted(fx.ack) == [3, 4, 5]
    np.testing.assert_allclose(decode_model(out.message.layers)[0], (0 * 1 + 1 * 2 + 2 * 3) / 6)
    assert report.routing_key == topology.ROUND_REPORT_KEY
    assert set(report.message.latencies) == {t.client for t in tasks} and report.message.missing == ()


def test_a_duplicate_is_counted_once():
    _, feed, _, tasks = opened()
    feed(topology.barrier_queue(1), update(tasks[0], 1.0))
    dup = feed(topology.barrier_queue(1), update(tasks[0], 50.0))
    assert dup.publish == () and dup.ack == (feed.tag,)  # acked at once: its first copy is held
    feed(topology.barrier_queue(1), update(tasks[1], 1.0))
    fx = feed(topology.barrier_queue(1), update(tasks[2], 1.0))
    assert fx.publish[0].message.clients == tuple(sorted(t.client for t in tasks))
    assert 4 not in fx.ack and len(fx.ack) == 3
    np.testing.assert_allclose(decode_model(fx.publish[0].message.layers)[0], 1.0)


def test_a_round_closes_at_the_last_not_before():
    b, feed, _, tasks = opened(k=1, min_clients=1)
    fx = feed(topology.barrier_queue(1), update(tasks[0], 1.0, not_before=7.5), now=1.0)
    assert fx.publish == () and fx.timers == ((6.5, "close:1:1"),)
    assert feed.on_timer("close:1:1", 7.5).publish


def test_deadline_closes_with_the_minimum_and_reissues_below_it():
    b, feed, _, tasks = opened(k=3, min_clients=2)
    feed(topology.barrier_queue(1), update(tasks[0], 1.0))
    fx = b.on_timer("deadline:1:1", 5.0)  # one answer, minimum two: ask a fresh client
    (re,) = [o.message for o in fx.publish]
    assert re.client not in {t.client for t in tasks} and re.round == 1
    feed(topology.barrier_queue(1), update(re, 3.0))
    fx = b.on_timer("deadline:1:1", 10.0)
    assert fx.publish[0].message.clients == tuple(sorted([tasks[0].client, re.client]))
    assert fx.publish[1].message.missing == tuple(sorted(t.client for t in tasks[1:]))  # the two stragglers


def test_stale_unknown_and_foreign_updates_are_rejected():
    b, feed, _, tasks = opened(clients=(0, 1, 2))
    stranger = TrainTask(
        **{
            **{f: getattr(tasks[0], f) for f in TrainTask.__dataclass_fields__ if f != "kind"},
            "client": 9,
            "id": "t1-r1-c9-v0",
        }
    )
    with pytest.raises(Reject, match="client 9 was not given task"):
        feed(topology.barrier_queue(1), update(stranger, 1.0))
    forged = update(tasks[0], 1.0)
    forged = Update(
        **{**{f: getattr(forged, f) for f in Update.__dataclass_fields__ if f != "kind"}, "task_id": "t1-r1-c0-v7"}
    )
    with pytest.raises(Reject, match="was not given task"):
        feed(topology.barrier_queue(1), forged)
    with pytest.raises(Reject, match="NaN or inf"):
        feed(topology.barrier_queue(1), update(tasks[1], float("inf")))
    for t in tasks:
        feed(topology.barrier_queue(1), update(t, 1.0))
    late = TrainTask(
        **{**{f: getattr(tasks[0], f) for f in TrainTask.__dataclass_fields__ if f != "kind"}, "id": "t1-r1-c0-v9"}
    )
    with pytest.raises(Reject, match="was not given task t1-r1-c0-v9"):
        feed(topology.barrier_queue(1), update(late, 1.0))
    with pytest.raises(Reject, match="tier 1 has no round 7"):
        feed(topology.barrier_queue(1), update(replace(tasks[0], id="t1-r7-c0-v0", round=7), 1.0))
    again = feed(topology.barrier_queue(1), update(tasks[0], 1.0))  # a copy of a merged update: acked, not stale
    assert again.ack == (feed.tag,) and again.publish == ()


def test_the_next_round_opens_only_when_the_tier_model_is_merged():
    b, feed, _, tasks = opened(k=1, min_clients=1)
    feed(topology.barrier_queue(1), update(tasks[0], 1.0))
    fx = feed(topology.BARRIER_GLOBAL, global_model(1, 1, 1, (1,)))
    (nxt,) = [o.message for o in fx.publish]
    assert nxt.round == 2 and nxt.version == 1
    assert fx.ack == (4,)


def test_a_restart_forgets_held_updates_but_keeps_the_round_and_its_deadline():
    b, feed, _, tasks = opened()
    feed(topology.barrier_queue(1), update(tasks[0], 1.0))
    (lost,) = feed.crash()
    fx = feed.start(2.0)
    assert fx.timers == ((3.0, "deadline:1:1"),) and fx.publish == ()  # the round is known: nothing re-opened
    assert feed.start(4.5).timers == ((2.0, "deadline:1:1"),)  # a passed deadline waits for the redeliveries
    feed(topology.barrier_queue(1), lost.message)  # the broker redelivers the held update
    for t in tasks[1:]:
        fx = feed(topology.barrier_queue(1), update(t, 1.0))
    assert fx.publish and len(fx.ack) == 3


def test_with_tifl_only_one_tier_runs_at_a_time():
    b = Barrier(BarrierConfig(tiers=(1, 2), clients_per_round=1, min_clients=1, codec="raw"), build_strategy("tifl"))
    feed = b = Feed(b)
    feed(topology.BARRIER_ASSIGNMENTS, TierAssignment("a1", 1, ((0, 1), (2, 3)), {c: 1.0 for c in range(4)}, 0.0))
    fx = feed(topology.BARRIER_GLOBAL, replace(seed(2, SHAPES)))
    (task,) = [o.message for o in fx.publish]
    fx = feed(topology.barrier_queue(task.tier), update(task, 1.0))
    assert fx.publish[0].message.tier == task.tier  # closed; no other tier was opened meanwhile
    merged = replace(
        seed(2, SHAPES),
        id="g1",
        version=1,
        tier=task.tier,
        tier_round=1,
        merged=((task.tier, 1),),
        tier_rounds=tuple(1 if m == task.tier else 0 for m in (1, 2)),
    )
    fx = feed(topology.BARRIER_GLOBAL, merged)
    assert len([o for o in fx.publish if isinstance(o.message, TrainTask)]) == 1  # the next single tier round


def test_fedasync_runs_concurrent_single_client_rounds_that_close_on_their_own():
    from fedat.fl.strategies import FedAsync

    b = Barrier(BarrierConfig(tiers=(1,), clients_per_round=1, min_clients=1, codec="raw"), FedAsync(concurrency=3))
    feed = b = Feed(b)
    feed(topology.BARRIER_ASSIGNMENTS, TierAssignment("a1", 1, ((0, 1, 2, 3, 4),), {c: 1.0 for c in range(5)}, 0.0))
    fx = feed(topology.BARRIER_GLOBAL, seed(1, SHAPES))
    tasks = [o.message for o in fx.publish]
    assert [t.round for t in tasks] == [1, 2, 3] and len({t.client for t in tasks}) == 3  # distinct idle clients
    fx = feed(topology.barrier_queue(1), update(tasks[2], 1.0))  # round 3 finishes first
    assert fx.publish[0].message.round == 3
    merged = replace(seed(1, SHAPES), id="g1", version=1, tier=1, tier_round=3, merged=((1, 3),), tier_rounds=(3,))
    fx = feed(topology.BARRIER_GLOBAL, merged)
    (nxt,) = [o.message for o in fx.publish]
    assert nxt.round == 4 and nxt.version == 1 and nxt.client not in {tasks[0].client, tasks[1].client}
    assert feed(topology.barrier_queue(1), update(tasks[0], 1.0)).publish  # round 1 still counts after round 3


def test_an_answer_after_the_close_is_acked_and_reported_with_its_real_latency():
    b, feed, _, tasks = opened(k=3, min_clients=1)
    feed(topology.barrier_queue(1), update(tasks[0], 1.0), now=1.0)
    feed(topology.barrier_queue(1), update(tasks[1], 1.0, not_before=9.0), now=2.0)  # counts only from 9.0
    fx = b.on_timer("deadline:1:1", 5.0)
    tier_model, report = (o.message for o in fx.publish)
    assert tier_model.clients == (tasks[0].client,)
    assert report.latencies == {tasks[0].client: 1.0, tasks[1].client: 9.0} and report.missing == (tasks[2].client,)
    late = feed(topology.barrier_queue(1), update(tasks[2], 1.0), now=12.5)
    (out,) = late.publish
    assert late.ack == (feed.tag,) and out.routing_key == topology.ROUND_REPORT_KEY
    assert out.message.latencies == {tasks[2].client: 12.5} and out.message.missing == ()
    copy = feed(topology.barrier_queue(1), update(tasks[2], 1.0), now=13.0)  # redelivered: acked, reported once
    assert copy.ack == (feed.tag,) and copy.publish == ()
    other = replace(tasks[2], id="t1-r1-c9-v0", client=tasks[2].client)
    with pytest.raises(Reject, match="was not given task"):  # no task of this id was awaited
        feed(topology.barrier_queue(1), update(other, 1.0), now=13.0)


def test_fedprox_stragglers_run_fewer_epochs_and_everyone_else_all_of_them():
    clients = (0, 1, 2, 3)
    b = Barrier(
        BarrierConfig(tiers=(1,), clients_per_round=4, epochs=3, straggler_fraction=0.5, codec="raw"),
        build_strategy("fedat"),
    )
    feed = b = Feed(b)
    feed(topology.BARRIER_ASSIGNMENTS, TierAssignment("a1", 1, (clients,), {0: 4.0, 1: 1.0, 2: 3.0, 3: 2.0}, 0.0))
    epochs = {o.message.client: o.message.epochs for o in feed(topology.BARRIER_GLOBAL, seed(1, SHAPES)).publish}
    assert epochs[1] == epochs[3] == 3 and 1 <= epochs[0] <= 2 and 1 <= epochs[2] <= 2


def test_a_global_model_frees_every_round_it_lists_as_merged():
    from fedat.fl.strategies import FedAsync

    b = Barrier(BarrierConfig(tiers=(1,), clients_per_round=1, min_clients=1, codec="raw"), FedAsync(concurrency=2))
    feed = b = Feed(b)
    feed(topology.BARRIER_ASSIGNMENTS, TierAssignment("a1", 1, ((0, 1, 2, 3),), {c: 1.0 for c in range(4)}, 0.0))
    tasks = [o.message for o in feed(topology.BARRIER_GLOBAL, seed(1, SHAPES)).publish]
    for t in tasks:
        feed(topology.barrier_queue(1), update(t, 1.0))
    both = replace(seed(1, SHAPES), id="g1", version=1, tier=1, tier_round=2, merged=((1, 1), (1, 2)), tier_rounds=(2,))
    fx = feed(topology.BARRIER_GLOBAL, both)
    assert [o.message.round for o in fx.publish] == [3, 4]
    phases = {k: r.phase for k, r in feed.state.rounds.items()}
    assert phases == {(1, 1): Phase.MERGED, (1, 2): Phase.MERGED, (1, 3): Phase.COLLECTING, (1, 4): Phase.COLLECTING}


def test_fedbuff_restarts_a_client_when_its_round_closes_before_any_merge():
    from fedat.fl.strategies import FedBuff

    b = Barrier(BarrierConfig(tiers=(1,), clients_per_round=1, min_clients=1, codec="raw"), FedBuff(concurrency=2))
    feed = b = Feed(b)
    feed(topology.BARRIER_ASSIGNMENTS, TierAssignment("a1", 1, ((0, 1, 2, 3),), {c: 1.0 for c in range(4)}, 0.0))
    tasks = [o.message for o in feed(topology.BARRIER_GLOBAL, seed(1, SHAPES)).publish]
    assert [t.round for t in tasks] == [1, 2]
    fx = feed(topology.barrier_queue(1), update(tasks[0], 1.0))
    new = [o.message for o in fx.publish if isinstance(o.message, TrainTask)]
    assert [(t.round, t.version) for t in new] == [(3, 0)] and new[0].client != tasks[1].client
    assert feed.state.rounds[(1, 1)].phase is Phase.CLOSED  # unmerged until a global model lists it


def test_an_evaluation_gives_each_tier_its_clients_mean_accuracy():
    from fedat.protocol.wire import Evaluation

    b = Barrier(BarrierConfig(tiers=(1, 2), clients_per_round=1, min_clients=1, codec="raw"), build_strategy("tifl"))
    feed = b = Feed(b)
    feed(topology.BARRIER_ASSIGNMENTS, TierAssignment("a1", 1, ((0, 2), (1, 3)), {c: 1.0 for c in range(4)}, 0.0))
    ev = Evaluation("e5", 5, 0.5, 1.0, 0.1, 4, 0.0, accuracies=(0.2, 0.7, 0.4, 0.9))
    fx = feed(topology.BARRIER_EVALUATIONS, ev)
    assert fx.ack == (feed.tag,) and feed.state.tier_accuracy == pytest.approx({1: 0.3, 2: 0.8})


def test_with_real_clients_each_task_goes_to_its_client_s_own_queue_and_the_draw_is_the_pool_s():
    def tasks_of(real: bool):
        b = Feed(
            Barrier(
                BarrierConfig(tiers=(1, 2), clients_per_round=2, min_clients=1, codec="raw", real_clients=real),
                build_strategy("fedat"),
            )
        )
        tiers = ((0, 1, 2, 3), (4, 5, 6))
        b(topology.BARRIER_ASSIGNMENTS, TierAssignment("a1", 1, tiers, {c: 1.0 for c in range(7)}, 0.0))
        return b(topology.BARRIER_GLOBAL, seed(1, SHAPES)).publish

    pool, real = tasks_of(False), tasks_of(True)
    assert [o.message for o in pool] == [o.message for o in real]  # the same clients, the same tasks
    assert [o.routing_key for o in pool] == [topology.tier_key(o.message.tier) for o in pool]
    assert [o.routing_key for o in real] == [f"client-{o.message.client}" for o in real]
    assert {o.exchange for o in real} == {topology.TRAIN} and len(real) == 4


def _polyline_global(version: int, weights: np.ndarray, rounds: tuple[int, ...]) -> GlobalModel:
    """A global model of one 400-value layer in polyline p=4, as the aggregator sends it whole."""
    layers = encode_model([weights], ["layer0"], "polyline", 4)
    g = replace(global_model(version, 1, max(rounds[0], 1), rounds), layers=layers)
    return g if version else replace(g, merged=())


def _real(**cfg):
    b = Feed(
        Barrier(
            BarrierConfig(tiers=(1,), clients_per_round=2, min_clients=1, codec="polyline", real_clients=True, **cfg),
            build_strategy("fedat"),
        )
    )
    clients = (0, 1, 2, 3)
    b(topology.BARRIER_ASSIGNMENTS, TierAssignment("a1", 1, (clients,), {c: 1.0 for c in clients}, 0.0))
    return b


def test_a_real_client_gets_its_next_task_against_the_version_it_keeps_bit_for_bit():
    rng = np.random.default_rng(5)
    w0 = rng.normal(0, 0.1, 400).astype(np.float32)
    w1 = (w0 + rng.normal(0, 0.002, 400)).astype(np.float32)
    b = _real()
    first = [o.message for o in b(topology.BARRIER_GLOBAL, _polyline_global(0, w0, (0,))).publish]
    assert all(t.relative_to == -1 for t in first)  # nobody is known to keep anything yet
    for t in first:
        b(topology.barrier_queue(1), update(t, 0.1))
    answered = {t.client for t in first}
    assert b.state.keeps == {c: 0 for c in answered}
    g1 = _polyline_global(1, w1, (1,))
    second = [o.message for o in b(topology.BARRIER_GLOBAL, g1).publish]
    assert second and all(t.version == 1 for t in second)
    whole = decode_model(g1.layers)[0]
    kept0 = decode_model(_polyline_global(0, w0, (0,)).layers)
    for t in second:
        if t.client in answered:
            assert t.relative_to == 0 and t.layers[0].codec == "delta"
            got = decode_model(t.layers, kept0)[0]
            assert got.tobytes() == whole.tobytes()  # exactly the model sent whole: nothing drifts
            assert model_bytes(t.layers) < model_bytes(g1.layers) / 2
        else:
            assert t.relative_to == -1 and t.layers == g1.layers


def test_a_real_client_that_leaves_its_task_unanswered_gets_the_next_one_whole():
    rng = np.random.default_rng(6)
    w0 = rng.normal(0, 0.1, 400).astype(np.float32)
    b = _real()
    first = [o.message for o in b(topology.BARRIER_GLOBAL, _polyline_global(0, w0, (0,))).publish]
    for t in first:
        b(topology.barrier_queue(1), update(t, 0.1))
    second = [o.message for o in b(topology.BARRIER_GLOBAL, _polyline_global(1, w0 + 0.001, (1,))).publish]
    talker, *silent = second
    b(topology.barrier_queue(1), update(talker, 0.2))
    b.on_timer("deadline:1:2", 1e6)  # closes with the one answer: the silent may have restarted and kept nothing
    assert b.state.keeps.get(talker.client) == 1
    assert all(t.client not in b.state.keeps for t in silent)
    third = [o.message for o in b(topology.BARRIER_GLOBAL, _polyline_global(2, w0 + 0.002, (2,))).publish]
    assert set(b.state.kept) == {1}  # decoded, the versions its clients keep; the current one is `model`
    assert third and all(t.relative_to == (1 if t.client == talker.client else -1) for t in third)


def test_pool_workers_and_a_barrier_told_not_to_get_every_task_whole():
    rng = np.random.default_rng(7)
    w0 = rng.normal(0, 0.1, 400).astype(np.float32)
    for barrier in (
        _real(relative_downloads=False),
        Feed(
            Barrier(
                BarrierConfig(tiers=(1,), clients_per_round=2, min_clients=1, codec="polyline"),
                build_strategy("fedat"),
            )
        ),
    ):
        if not barrier.state.assignment:
            barrier(topology.BARRIER_ASSIGNMENTS, TierAssignment("a1", 1, ((0, 1, 2, 3),), {}, 0.0))
        first = [o.message for o in barrier(topology.BARRIER_GLOBAL, _polyline_global(0, w0, (0,))).publish]
        for t in first:
            barrier(topology.barrier_queue(1), update(t, 0.1))
        g1 = _polyline_global(1, w0 + 0.001, (1,))
        second = [o.message for o in barrier(topology.BARRIER_GLOBAL, g1).publish]
        assert second and all(t.relative_to == -1 and t.layers == g1.layers for t in second)
        assert barrier.state.keeps == barrier.state.kept == barrier.state.bases == {}


def test_tasks_against_kept_versions_are_on_by_default_for_real_clients_and_a_setting_turns_them_off():
    from fedat.errors import ConfigError
    from fedat_aggregator.barrier_main import settings

    real = {"FEDAT_CLIENTS": "real", "FEDAT_SIGNING": "off"}
    assert settings(real).barrier.relative_downloads and settings(real).barrier.real_clients
    assert not settings({**real, "FEDAT_RELATIVE_DOWNLOADS": "0"}).barrier.relative_downloads
    with pytest.raises(ConfigError, match="FEDAT_RELATIVE_DOWNLOADS must be 0 or 1"):
        settings({**real, "FEDAT_RELATIVE_DOWNLOADS": "2"})
