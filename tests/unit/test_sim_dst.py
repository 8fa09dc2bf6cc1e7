"""Deterministic simulation testing: dozens of seeds of injected faults, every guarantee checked, replays exact.

`FEDAT_DST_SEEDS` (default 60, 10 per strategy) sets how many seeds the sweep runs; each has `MINUTES` virtual
minutes of faults plus `fedat_sim.dst.DRAIN_SECONDS` of settling. A failure prints every failing seed with its
one-line replay.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from fedat.protocol.statecodec import StateError
from fedat.runtime import bus, publishing
from fedat_sim import dst
from fedat_sim.faults import FaultPlan

SEEDS = int(os.environ.get("FEDAT_DST_SEEDS", "60"))
MINUTES = dst.MINUTES


@pytest.mark.slow
def test_every_guarantee_holds_over_every_faulty_seed():
    started = time.perf_counter()
    outcomes = dst.run_seeds(range(SEEDS), MINUTES, jobs=min(2, os.cpu_count() or 1))
    failed = [o for o in outcomes if not o.ok]
    hours = len(outcomes) * (MINUTES * 60 + dst.DRAIN_SECONDS) / 3600
    faults = sum(o.info.get("crashes", 0) + o.info.get("reconnects", 0) for o in outcomes)
    print(
        f"\n[dst] {len(outcomes)} seeds, {hours:.1f} simulated hours, {faults} crashes and reconnects, "
        f"{sum(o.info.get('versions', 0) for o in outcomes)} global versions, "
        f"{sum(o.info.get('parts_written', 0) for o in outcomes)} checkpoint parts, "
        f"{time.perf_counter() - started:.0f} s"
    )
    assert not failed, "\n\n".join(o.report() for o in failed)
    assert {o.strategy for o in outcomes} == set(dst.STRATEGIES)
    assert all(o.info["versions"] > 0 for o in outcomes)
    # The aggregator's checkpoints went in parts on the seeds that ask for it, for the strategies whose state holds
    # more than one model beside its head, and only there.
    parted = {o.strategy for o in outcomes if o.info["parts_written"]}
    if SEEDS >= 2 * len(dst.STRATEGIES):  # a turn of the strategies without parts, then one with
        assert {"fedat-delta", "fedbuff"} <= parted
    assert all(o.info["parted"] for o in outcomes if o.info["parts_written"])
    assert faults > len(outcomes)  # faults really were injected


def test_a_seed_replays_exactly_even_in_another_interpreter_with_another_hash_seed():
    first, again = dst.run_seed(11, 2.0), dst.run_seed(11, 2.0)
    assert first.info == again.info and first.faults == again.faults
    code = "from fedat_sim import dst; print(dst.run_seed(11, 2.0).info['fingerprint'])"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == first.info["fingerprint"]
    assert dst.run_seed(12, 2.0).info["fingerprint"] != first.info["fingerprint"]


def test_the_sweep_catches_outputs_published_before_their_checkpoint(monkeypatch):
    # Break write-ahead on purpose: publish the outbox, then save. A crash in between makes a restarted service
    # decide again, and the monitor sees one id with two bodies.
    original = bus.Runner.save

    def publish_first(self, channel, state, sent):
        publishing.publish_sent(channel, sent, self.metrics)
        original(self, channel, state, ())

    monkeypatch.setattr(bus.Runner, "save", publish_first)
    heavy = FaultPlan(drops_per_minute=1.0, crashes_per_minute=1.0, in_transition=0.9)
    outcome = next(o for o in (dst.run_seed(s, 2.0, "fedat", heavy) for s in range(10)) if not o.ok)
    assert any("two different bodies" in p or "two contents" in p for p in outcome.problems), outcome.report()
    assert f"--seed {outcome.seed} " in outcome.replay() and "replay:" in outcome.report()


def test_the_sweep_catches_inputs_acked_before_their_effect_is_saved(monkeypatch):
    # Break write-ahead the other way: ack first. A crash before the checkpoint loses the input for good.
    original = bus.Session.commit

    def ack_first(self, state, effects, inbound=None):
        for tag in effects.ack:
            if self.unacked.pop(tag, None) is not None:
                self.held.pop(tag, None)
                self.channel.basic_ack(delivery_tag=tag)
        original(self, state, effects, inbound)

    monkeypatch.setattr(bus.Session, "commit", ack_first)
    heavy = FaultPlan(drops_per_minute=1.0, crashes_per_minute=1.0, in_transition=0.9)
    assert any(not dst.run_seed(s, 3.0, "fedat", heavy).ok for s in range(20))


def test_the_sweep_catches_a_state_changed_in_place_after_its_save(monkeypatch):
    # Break the state's value semantics, harmlessly for the barrier's decisions: after each save, move a collecting
    # round's first task to the end of its map in place. A later save sharing the round would write its old bytes;
    # the sweep re-encodes every shared part, and the save refuses it (the service then restarts from its checkpoint).
    original, refused = bus.Runner.save, []

    def then_reorder(self, channel, state, sent):
        try:
            original(self, channel, state, sent)
        except StateError as exc:
            refused.append(str(exc))
            raise
        for r in getattr(state, "rounds", {}).values():
            if len(r.tasks) > 1:
                first = next(iter(r.tasks))
                r.tasks[first] = r.tasks.pop(first)  # type: ignore[attr-defined]

    monkeypatch.setattr(bus.Runner, "save", then_reorder)
    from fedat_sim.faults import QUIET

    dst.run_seed(3, 1.0, "fedat", QUIET)
    assert refused and all(r == "a Round of the state changed in place after it was saved" for r in refused)


@pytest.mark.parametrize("strategy", dst.STRATEGIES)
def test_without_faults_every_strategy_makes_progress_and_keeps_every_guarantee(strategy):
    from fedat_sim.faults import QUIET

    outcome = dst.run_seed(3, 3.0, strategy, QUIET)
    assert outcome.ok, outcome.report()
    assert outcome.info["crashes"] == outcome.info["reconnects"] == 0
    assert outcome.info["recorder_duplicate_evaluations"] == 0
