"""Day two on the real broker: the chart's upgrade-check hook against old checkpoints, a singleton refusing a
checkpoint that does not fit, the `helm test` check, and the query KEDA makes to count the workers' tasks.

The hook's command runs exactly as the chart renders it (its FEDAT_* settings from the rendered Job), pointed at
this test's vhost on the local broker: a compatible change passes, an incompatible one is refused naming the
difference, and every checkpoint is still in its queue afterwards, unchanged.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import helm_python as helm
import pika
import pytest
import yaml
from prometheus_client import CollectorRegistry

from fedat.deploy import release_test
from fedat.deploy.provision import ManagementApi
from fedat.deploy.roles import roles
from fedat.protocol import checkpoint, fingerprint, topology, wire
from fedat.runtime.brokerstore import BrokerStore
from fedat.runtime.bus import BrokerConfig, run_service
from fedat.runtime.metrics import serve, transport_metrics
from fedat.runtime.serving import fingerprint_of
from fedat_aggregator.aggregator import Aggregator, AggregatorConfig
from fedat_aggregator.barrier import Barrier, BarrierConfig
from fedat_profiler.profiler import Profiler, ProfilerConfig

from ..factories import seed
from .broker import channel, vhost_of, wait_for

pytestmark = pytest.mark.broker
ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "infra" / "helm" / "fedat"
SERVICES = {
    "barrier": Barrier(BarrierConfig(), None),
    "aggregator": Aggregator(AggregatorConfig(), None),
    "profiler": Profiler(ProfilerConfig()),
}
helm.disable_logging()


def hook_env(values: dict) -> dict[str, str]:
    """The FEDAT_* settings of the upgrade-check Job the chart renders for `values`."""
    with helm.Chart.load(CHART) as ch:
        text = ch.render(values, name="fedat", namespace="fl")["fedat/templates/job-upgrade-check.yaml"]
    [container] = yaml.safe_load(text)["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["upgrade-check"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    # where the services would answer in the cluster: none of them runs here
    return {k: v for k, v in env.items() if not k.endswith("_URL") and k != "FEDAT_ADMIN_PASSWORD_FILE"}


def save_old_checkpoints(url: str, env: dict[str, str]) -> None:
    """Each durable service's checkpoint as a process with these settings leaves it."""
    with channel(url) as ch:
        for name, service in SERVICES.items():
            fp = fingerprint_of(service.codec.version, env)
            state = service.codec.encode(service.initial())
            BrokerStore(name).save(ch, checkpoint.Checkpoint(name, 7, time.time(), state, (), fp))


def stored(url: str) -> dict[str, tuple[int, int, dict] | None]:
    """service -> (messages in its state queue, checkpoint seq, fingerprint), read and put back."""
    out = {}
    with channel(url) as ch:
        for name in SERVICES:
            count = ch.queue_declare(topology.state_queue(name), passive=True).method.message_count
            c = BrokerStore(name).load(ch)
            out[name] = (count, c.seq, dict(c.fingerprint)) if c is not None else None
    return out


def run_check(url: str, env: dict[str, str], extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fedat.deploy.upgrade_check"],
        env={
            **os.environ,
            **env,
            "FEDAT_MANAGEMENT_URL": "http://127.0.0.1:15672",
            "FEDAT_VHOST": vhost_of(url),
            "FEDAT_ADMIN_USER": "guest",
            "FEDAT_ADMIN_PASSWORD": "guest",
            **(extra or {}),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_upgrade_hook_passes_a_compatible_change_and_refuses_an_incompatible_one(vhost_url):
    old = hook_env({})
    save_old_checkpoints(vhost_url, old)
    before = stored(vhost_url)
    assert {n: c for n, (c, _, _) in before.items()} == dict.fromkeys(SERVICES, 1)

    ok = run_check(vhost_url, hook_env({"experiment": {"settings": {"epochs": 1, "learning_rate": 0.01}}}))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.count("ok ") == 3 and "checkpoint 7" in ok.stdout

    refused = run_check(vhost_url, hook_env({"experiment": {"settings": {"num_tiers": 7, "strategy": "fedbuff"}}}))
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "num_tiers: 5 -> 7" in refused.stdout and "strategy: fedat -> fedbuff" in refused.stdout
    assert "fresh vhost" in refused.stdout and "the upgrade stops here" in refused.stdout
    other_run = run_check(vhost_url, hook_env({"experiment": {"name": "another"}}))
    assert other_run.returncode == 1 and "run_id: fl/fedat/fmnist2-fedat -> fl/fedat/another" in other_run.stdout

    # nothing was consumed, purged or rewritten
    assert stored(vhost_url) == before


def test_the_upgrade_hook_asks_a_running_service_and_checks_an_old_checkpoints_state_version(vhost_url):
    old = hook_env({})
    # an aggregator that runs (it writes its own checkpoints) and answers on its metrics port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    service = Aggregator(AggregatorConfig(), None)
    fp = fingerprint_of(service.codec.version, old)
    metrics = transport_metrics(CollectorRegistry(), "aggregator")
    serve(metrics.registry, port, metrics, fingerprint=fp)
    stop = threading.Event()
    cfg = BrokerConfig(url=vhost_url)
    t = threading.Thread(target=run_service, args=(service, cfg, metrics, stop), kwargs={"fingerprint": fp})
    t.start()
    try:
        wait_for(lambda: metrics.connected._value.get() == 1, 20, "the aggregator connected")
        # the barrier's checkpoint predates fingerprints and holds another state version: refused by its bytes
        barrier = SERVICES["barrier"]
        state = barrier.codec.encode(barrier.initial())
        own = bytes([barrier.codec.version])
        state = state.replace(b"\xa1v" + own, b"\xa1v" + bytes([barrier.codec.version + 1]), 1)
        with channel(vhost_url) as ch:
            BrokerStore("barrier").save(ch, checkpoint.Checkpoint("barrier", 3, 0.0, state, ()))
        r = run_check(vhost_url, old, {"FEDAT_AGGREGATOR_URL": f"http://127.0.0.1:{port}"})
        assert r.returncode == 1, r.stdout + r.stderr
        lines = r.stdout.splitlines()
        assert any(line.startswith("ok") and "aggregator: running process" in line for line in lines), r.stdout
        want = f"barrier: checkpoint 3: state_version: {barrier.codec.version + 1} -> {barrier.codec.version}"
        assert any(want in line for line in lines), r.stdout
        assert "no migration" in r.stdout and any("profiler: no checkpoint" in line for line in lines)
    finally:
        stop.set()
        t.join(timeout=10)
    assert json.loads(json.dumps(fp)) == fp and fingerprint.STATE_VERSION in fp


def test_the_release_test_finds_the_broker_a_global_model_and_the_metrics(vhost_url):
    with channel(vhost_url) as ch:  # the topology and a seed model, as provisioning and the seed Job leave them
        ch.basic_publish(topology.GLOBAL, "", wire.encode(seed(5)), pika.BasicProperties(delivery_mode=2))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    metrics = transport_metrics(CollectorRegistry(), "aggregator")
    serve(metrics.registry, port, metrics)
    lines: list[str] = []
    cfg = BrokerConfig(url=vhost_url)
    assert not release_test.run_checks(cfg, [f"http://127.0.0.1:{port}"], True, 5, lines.append)
    assert any(line.startswith("FAIL metrics") and "not 1" in line for line in lines), lines
    metrics.connected.set(1)
    lines.clear()
    assert release_test.run_checks(cfg, [f"http://127.0.0.1:{port}"], True, 5, lines.append), lines
    assert lines[1] == "ok   global model: version 0 (2 layers)"
    with channel(vhost_url) as ch:  # fetched and put back
        assert ch.queue_declare(topology.RECORDER_GLOBAL, passive=True).method.message_count == 1
    wrong = BrokerConfig(url=vhost_url.replace("guest:guest", "guest:wrong"))
    lines.clear()
    assert not release_test.run_checks(wrong, [], True, 0, lines.append)
    assert lines[0].startswith("FAIL broker"), lines


def test_a_service_refuses_a_checkpoint_of_other_settings_and_leaves_it_untouched(vhost_url, tmp_path):
    # what an aggregator of a 5-tier run left: its state and an outbox message it would re-send on restore
    service = SERVICES["aggregator"]
    settings = {"FEDAT_NUM_TIERS": "5", "FEDAT_RUN_ID": "fl/fedat/fmnist2-fedat"}
    fp = fingerprint_of(service.codec.version, settings)
    outbox = (checkpoint.Sent(topology.GLOBAL, "", "global-model", "g-resent", wire.encode(seed(5))),)
    with channel(vhost_url) as ch:
        BrokerStore("aggregator").save(
            ch, checkpoint.Checkpoint("aggregator", 12, 0.0, service.codec.encode(service.initial()), outbox, fp)
        )
    url_file = tmp_path / "amqp-url"
    url_file.write_text(vhost_url + "\n")  # as the chart mounts it
    env = {
        **os.environ,
        **settings,
        "FEDAT_NUM_TIERS": "7",  # the upgrade that was not checked
        "FEDAT_AMQP_URL_FILE": str(url_file),
        "FEDAT_AMQP_URL": "amqp://nobody:wrong@127.0.0.1:1/none",  # the file wins
        "FEDAT_SIGNING": "off",
        "FEDAT_METRICS_PORT": "0",
    }
    r = subprocess.run(
        [sys.executable, "-m", "fedat_aggregator.aggregator_main"], env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 3, r.stdout + r.stderr
    assert "num_tiers: 5 -> 7" in r.stderr and "fedat.state.aggregator (checkpoint 12)" in r.stderr
    assert "Traceback" not in r.stderr  # one line that says why, not a crash
    # the checkpoint is still there, unchanged, and its outbox was not re-sent
    assert stored(vhost_url)["aggregator"] == (1, 12, fp)
    with channel(vhost_url) as ch:
        assert ch.queue_declare(topology.RECORDER_GLOBAL, passive=True).method.message_count == 0


def test_kedas_query_counts_waiting_and_training_tasks_as_the_read_only_recorder(vhost_url):
    vhost = vhost_of(vhost_url)
    values = {
        "broker": {"vhost": vhost, "managementUrl": "http://127.0.0.1:15672"},
        "workers": {"replicas": None, "keda": {"enabled": True}},
    }
    with helm.Chart.load(CHART) as ch:
        out = ch.render(values, name="fedat", namespace="fl")
    so = yaml.safe_load(out["fedat/templates/keda.yaml"].split("---")[-1])
    [trigger] = so["spec"]["triggers"]
    secret = yaml.safe_load(out["fedat/templates/credentials-secret.yaml"].split("---")[0])
    host = urllib.parse.urlparse(base64.b64decode(secret["data"]["recorder-management-url"]).decode())
    user, password = urllib.parse.unquote(host.username), urllib.parse.unquote(host.password)
    assert urllib.parse.unquote(host.path[1:]) == vhost
    # the recorder as provisioning makes it: its permissions let it read only the recorder's queues
    admin = ManagementApi("http://127.0.0.1:15672", "guest", "guest")
    role = roles(5)["recorder"]
    # KEDA's HTTP mode reads the management API, which needs the management tag on the user
    tags = sorted({*role.tags, "management"})
    admin.call("PUT", f"users/{urllib.parse.quote(user, safe='')}", {"password": password, "tags": ",".join(tags)})
    try:
        admin.call("PUT", f"permissions/{urllib.parse.quote(vhost, safe='')}/{urllib.parse.quote(user, safe='')}",
                   role.permissions())  # fmt: skip
        conn = pika.BlockingConnection(pika.URLParameters(vhost_url))
        ch = conn.channel()
        ch.confirm_delivery()
        topology.declare(ch, 5)
        for key, n in (("tier-1", 3), ("tier-5", 1), ("profile", 2)):
            for _ in range(n):
                ch.basic_publish(topology.TRAIN, key, b"task", pika.BasicProperties(delivery_mode=2))
        training = conn.channel()
        training.basic_qos(prefetch_count=2)
        training.basic_consume(topology.train_queue(1), lambda *a: None)  # a worker holding two tasks
        conn.process_data_events(time_limit=1)
        meta = trigger["metadata"]
        # the request KEDA's rabbitmq scaler makes in HTTP mode with useRegex, and its sum over the answer
        query = urllib.parse.urlencode(
            {"page": 1, "use_regex": "true", "pagination": "false", "name": meta["queueName"], "page_size": 100}
        )
        request = urllib.request.Request(
            f"{host.scheme}://{host.hostname}:{host.port}/api/queues/{urllib.parse.quote(vhost, safe='')}?{query}",
            headers={"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()},
        )

        def total():
            with urllib.request.urlopen(request, timeout=10) as r:
                body = json.load(r)
            items = body["items"] if isinstance(body, dict) else body
            counts = {q["name"]: (q.get("messages"), q.get("messages_unacknowledged")) for q in items}
            return counts if all(m is not None for m, _ in counts.values()) and sum(
                m for m, _ in counts.values()) == 6 and counts["fedat.train.tier-1"][1] == 2 else None  # fmt: skip

        counts = wait_for(total, 30, "the management API's queue counts")
        assert set(counts) == {f"fedat.train.tier-{m}" for m in range(1, 6)} | {"fedat.train.profile"}
        conn.close()
    finally:
        admin.call("DELETE", f"users/{urllib.parse.quote(user, safe='')}", missing_ok=True)
