"""Checkpoint fingerprints: what a checkpoint is valid for, compared on restore and by the pre-upgrade check."""

from __future__ import annotations

import socket

import pytest
from prometheus_client import CollectorRegistry

from fedat.deploy import upgrade_check
from fedat.errors import CheckpointError, CheckpointMismatch
from fedat.fl import strategies
from fedat.protocol import checkpoint, fingerprint, topology
from fedat.runtime import bus, config
from fedat.runtime.metrics import transport_metrics
from fedat.runtime.serving import fingerprint_of, strategy_defaults
from fedat_aggregator.aggregator import Aggregator, AggregatorConfig
from fedat_aggregator.barrier import BarrierConfig
from fedat_profiler.profiler import ProfilerConfig

BASE = {"FEDAT_NUM_TIERS": "5", "FEDAT_NUM_CLIENTS": "100", "FEDAT_STRATEGY": "fedat", "FEDAT_SEED": "0"}


def test_one_spelling_per_value():
    assert [fingerprint.canonical(v) for v in ("5", "5.0", " 5e0 ", "0.001", "1e-3", "fedat", "1,2")] == [
        "5", "5", "5", "0.001", "0.001", "fedat", "1,2",
    ]  # fmt: skip


def test_the_defaults_are_the_ones_the_services_apply():
    # An unset variable and its default must give one fingerprint, or a harmless values file would be refused.
    assert fingerprint.BOUND["num_clients"] == str(ProfilerConfig().num_clients)
    assert fingerprint.BOUND["num_tiers"] == str(ProfilerConfig().num_tiers) == str(AggregatorConfig().num_tiers)
    assert fingerprint.BOUND["seed"] == str(BarrierConfig().seed)
    assert config.strategy({}).name == fingerprint.BOUND["strategy"]
    assert fingerprint_of(1, {}) == fingerprint_of(1, BASE)


def test_only_the_settings_the_strategy_reads_are_bound():
    fedbuff = {**BASE, "FEDAT_STRATEGY": "fedbuff"}
    fp = fingerprint_of(1, fedbuff)
    bound = {k.split(".", 1)[1] for k in fp if k.startswith("strategy.")}
    assert bound == set(strategies.REGISTRY["fedbuff"].settings())
    # a setting fedbuff does not read (FedAsync's alpha) changes nothing; one it reads changes the fingerprint
    assert fingerprint_of(1, {**fedbuff, "FEDAT_ASYNC_ALPHA": "0.9"}) == fp
    assert fingerprint.differences(fp, fingerprint_of(1, {**fedbuff, "FEDAT_BUFFER_SIZE": "20"})) == [
        "strategy.buffer_size: 10 -> 20"
    ]
    # every strategy's settings are known to the registry the services build strategies from
    for name in strategies.STRATEGIES:
        assert set(strategy_defaults(name)) <= strategies.SETTINGS
    assert strategy_defaults("no-such-strategy") == {}


def test_what_may_change_and_what_may_not():
    fp = fingerprint_of(2, BASE)
    compatible = {**BASE, "FEDAT_LEARNING_RATE": "0.01", "FEDAT_EPOCHS": "1", "FEDAT_EVAL_INTERVAL": "60"}
    assert fingerprint.differences(fp, fingerprint_of(2, compatible)) == []
    for var, value, diff in (
        ("FEDAT_NUM_TIERS", "7", "num_tiers: 5 -> 7"),
        ("FEDAT_NUM_CLIENTS", "1000", "num_clients: 100 -> 1000"),
        ("FEDAT_CLIENTS", "real", "clients: pool -> real"),
        ("FEDAT_STRATEGY", "fedasync", "strategy: fedat -> fedasync"),
        ("FEDAT_SEED", "3", "seed: 0 -> 3"),
        ("FEDAT_RUN_ID", "fl/fedat/other", "run_id: (unset) -> fl/fedat/other"),
    ):
        assert diff in fingerprint.differences(fp, fingerprint_of(2, {**BASE, var: value})), var
    assert fingerprint.differences(fp, fingerprint_of(3, BASE)) == ["state_version: 2 -> 3"]
    # a key only one side has (another version of this code) blocks nothing
    assert fingerprint.differences({"state_version": "2", "future": "x"}, fp) == []


def test_a_checkpoint_carries_its_fingerprint_and_an_old_one_reads_as_empty():
    fp = fingerprint_of(1, BASE)
    c = checkpoint.Checkpoint("aggregator", 3, 1.0, b"state", (), fp)
    assert checkpoint.decode(checkpoint.encode(c), "aggregator").fingerprint == fp
    old = checkpoint.Checkpoint("aggregator", 3, 1.0, b"state", ())
    assert "fp" not in checkpoint.encode(old).decode("latin-1")
    assert checkpoint.decode(checkpoint.encode(old), "aggregator").fingerprint == {}


def _runner(fp) -> bus.Runner:
    service = Aggregator(AggregatorConfig(num_tiers=2), strategies.build_strategy("fedat"))
    metrics = transport_metrics(CollectorRegistry(), "x")
    return bus.Runner(service, bus.BrokerConfig(), metrics, lambda: 0.0, True, None, fp)


def test_a_process_refuses_a_checkpoint_that_does_not_fit_naming_the_difference():
    version = Aggregator.codec.version
    written = fingerprint_of(version, {**BASE, "FEDAT_NUM_TIERS": "2"})
    runner = _runner(fingerprint_of(version, {**BASE, "FEDAT_NUM_TIERS": "3"}))
    state = runner.codec.encode(runner.state)
    with pytest.raises(CheckpointMismatch) as err:
        runner.check(checkpoint.Checkpoint("aggregator", 9, 0.0, state, (), written))
    text = str(err.value)
    assert "num_tiers: 2 -> 3" in text and "fedat.state.aggregator (checkpoint 9)" in text
    assert "go back to the settings" in text and "fresh vhost" in text
    # the same settings fit; so does a checkpoint from before fingerprints whose state version matches
    _runner(written).check(checkpoint.Checkpoint("aggregator", 9, 0.0, state, (), written))
    _runner(written).check(checkpoint.Checkpoint("aggregator", 9, 0.0, state, ()))


def test_an_old_checkpoint_of_another_state_version_is_refused_by_its_state_bytes():
    runner = _runner(fingerprint_of(Aggregator.codec.version, BASE))
    other = Aggregator.codec.version + 1
    own = bytes([Aggregator.codec.version])
    state = runner.codec.encode(runner.state).replace(b"\xa1v" + own, b"\xa1v" + bytes([other]), 1)
    assert fingerprint.state_version(state) == other
    with pytest.raises(CheckpointMismatch, match=f"state_version: {other} -> {Aggregator.codec.version}") as err:
        runner.check(checkpoint.Checkpoint("aggregator", 1, 0.0, state, ()))
    assert "no migration" in str(err.value)
    assert fingerprint.state_version(b"\xc1 not msgpack") is None


def test_a_process_writes_its_fingerprint_into_every_checkpoint():
    fp = fingerprint_of(Aggregator.codec.version, BASE)
    runner = _runner(fp)
    saved = []

    class Store:
        queue = topology.state_queue("aggregator")

        def save(self, channel, c):
            saved.append(c)

    runner.store = Store()
    runner.save(None, runner.service.initial(), ())
    assert saved and saved[0].fingerprint == fp


def test_the_upgrade_check_asks_running_services_and_reads_stopped_ones():
    versions = {"barrier": 1, "aggregator": 1, "profiler": 2}
    old = {**BASE, "FEDAT_RUN_ID": "fl/fedat/fmnist"}
    new = {**old, "FEDAT_NUM_TIERS": "6", "FEDAT_LEARNING_RATE": "0.5"}
    read = []

    def stored(service):
        read.append(service)
        if service == "profiler":
            return None  # never saved one
        return checkpoint.Checkpoint(service, 4, 0.0, b"", (), fingerprint_of(versions[service], old))

    def running(service):
        return fingerprint_of(versions["barrier"], old) if service == "barrier" else None

    findings = upgrade_check.check(new, running, stored, versions)
    assert [(f.service, f.source, f.differences) for f in findings] == [
        ("barrier", "running process", ("num_tiers: 5 -> 6",)),
        ("aggregator", "checkpoint 4", ("num_tiers: 5 -> 6",)),
        ("profiler", "no checkpoint", ()),
    ]
    assert read == ["aggregator", "profiler"]  # a running service's checkpoint is never taken out of its queue
    status, text = upgrade_check.report(findings, "fedat")
    assert status == 1 and "REFUSED  barrier" in text and "the upgrade stops here" in text
    findings = upgrade_check.check({**old, "FEDAT_EPOCHS": "1"}, running, stored, versions)
    status, text = upgrade_check.report(findings, "v")
    assert status == 0 and "REFUSED" not in text


def test_the_upgrade_check_knows_every_durable_service():
    assert set(upgrade_check.state_versions()) == set(topology.STATEFUL)


def test_a_service_with_a_pod_is_asked_never_read():
    # no pod: the name does not resolve, so nothing writes the checkpoint and it may be read
    assert upgrade_check.fetch_running("http://no-such-service.invalid:9101/fingerprint") is None
    # a pod that does not answer (a closed port here) is not read behind its back
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(CheckpointError, match="has a pod but it does not answer"):
        upgrade_check.fetch_running(f"http://127.0.0.1:{port}/fingerprint", timeout=2)
    findings = upgrade_check.check(
        BASE, lambda s: (_ for _ in ()).throw(CheckpointError("x")), lambda s: pytest.fail("read"), {"barrier": 1,
        "aggregator": 1, "profiler": 2},
    )  # fmt: skip
    assert all(f.source.startswith("not checked") and not f.differences for f in findings)
