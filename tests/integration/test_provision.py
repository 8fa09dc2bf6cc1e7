"""Provisioning through the management API, checked on the real broker: idempotent, and every role is confined.

Each test provisions its own vhost and users and deletes them afterwards, whatever happened.
"""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
import sys
import uuid
from collections import Counter
from dataclasses import dataclass
from urllib.parse import quote

import pika
import pytest

from fedat.deploy.provision import ManagementApi, ProvisionError, deprovision, provision
from fedat.deploy.roles import SERVICE_ROLES, roles
from fedat.protocol import topology as t

from .broker import attempt

pytestmark = pytest.mark.broker

API = "http://127.0.0.1:15672"
ADMIN = ("guest", "guest")
N = 5


@dataclass
class Deployment:
    vhost: str
    users: dict[str, tuple[str, str]]
    urls: dict[str, str]

    @property
    def admin_url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:5672/{quote(self.vhost, safe='')}"


def _management_answers() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 15672), timeout=2):
            return True
    except OSError:
        return False


def _fresh() -> tuple[str, dict[str, tuple[str, str]]]:
    vhost = f"fedat-test-prov-{uuid.uuid4().hex[:8]}"
    return vhost, {role: (f"{vhost}-{role}", secrets.token_urlsafe(16)) for role in SERVICE_ROLES}


@pytest.fixture
def deployment():
    """A vhost provisioned with every service role, deleted afterwards with its users."""
    if not _management_answers():
        pytest.fail("no RabbitMQ management API on 127.0.0.1:15672: run infra/ensure-broker.sh")
    vhost, users = _fresh()
    try:
        yield Deployment(vhost, users, provision(API, *ADMIN, vhost, N, users))
    finally:
        deprovision(API, *ADMIN, vhost, [u for u, _ in users.values()])


# --- helpers ------------------------------------------------------------------------------------------------------


def publish(exchange: str, key: str = ""):
    return lambda ch: ch.basic_publish(exchange, key, b"probe", pika.BasicProperties(delivery_mode=2), mandatory=True)


def consume(queue: str):
    return lambda ch: ch.basic_consume(queue, lambda *a: None)


def connect(url: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(url))


def depth(d: Deployment, queue: str) -> int:
    conn = connect(d.admin_url)
    try:
        return conn.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        conn.close()


def snapshot(d: Deployment) -> dict:
    """Everything provisioning touches, as the management API reports it (password hashes included)."""
    api = ManagementApi(API, *ADMIN)
    v = quote(d.vhost, safe="")
    defs = api.call("GET", f"definitions/{v}")
    out: dict = {k: defs.get(k) for k in ("exchanges", "queues", "bindings", "policies")}
    for username, _ in d.users.values():
        u = quote(username, safe="")
        out[username] = (
            api.call("GET", f"users/{u}"),
            api.call("GET", f"permissions/{v}/{u}"),
            sorted(api.call("GET", f"topic-permissions/{v}/{u}"), key=lambda p: p["exchange"]),
        )
    return out


# --- provisioning -------------------------------------------------------------------------------------------------


def test_provisioning_again_changes_nothing(deployment):
    before = snapshot(deployment)
    outcomes: Counter[str] = Counter()
    urls = provision(API, *ADMIN, deployment.vhost, N, deployment.users, report=lambda o, w: outcomes.update([o]))
    assert set(outcomes) == {"unchanged"}, outcomes
    assert urls == deployment.urls
    assert snapshot(deployment) == before
    # The topology is complete and equal to what services declare: a full declare changes nothing and fails nothing.
    assert {q["name"] for q in before["queues"]} == {q.name for q in t.queues(N)}
    assert {x["name"] for x in before["exchanges"]} == set(t.EXCHANGES)
    conn = connect(deployment.admin_url)
    try:
        t.declare(conn.channel(), N)
    finally:
        conn.close()
    assert snapshot(deployment) == before


def test_deprovision_removes_the_vhost_and_the_users_and_may_run_twice():
    vhost, users = _fresh()
    try:
        provision(API, *ADMIN, vhost, 2, users)
    finally:
        deprovision(API, *ADMIN, vhost, [u for u, _ in users.values()])
    api = ManagementApi(API, *ADMIN)
    assert api.call("GET", f"vhosts/{vhost}", missing_ok=True) is None
    for username, _ in users.values():
        assert api.call("GET", f"users/{username}", missing_ok=True) is None
    outcomes: Counter[str] = Counter()
    deprovision(API, *ADMIN, vhost, [u for u, _ in users.values()], report=lambda o, w: outcomes.update([o]))
    assert set(outcomes) == {"absent"}


def test_a_queue_with_other_arguments_fails_naming_both_argument_sets():
    vhost, users = _fresh()
    queue = t.train_queue(1)
    api = ManagementApi(API, *ADMIN)
    try:
        api.call("PUT", f"vhosts/{vhost}", {})
        api.call("PUT", f"queues/{vhost}/{queue}", {"durable": True, "arguments": {"x-queue-type": "classic"}})
        with pytest.raises(ProvisionError) as err:
            provision(API, *ADMIN, vhost, N, users)
        text = str(err.value)
        assert queue in text and '"x-queue-type": "classic"' in text and '"x-delivery-limit": 5' in text, text
    finally:
        deprovision(API, *ADMIN, vhost, [u for u, _ in users.values()])


def test_an_api_error_names_the_call_and_the_broker_s_answer():
    with pytest.raises(ProvisionError, match=r"GET /api/vhosts/x failed: HTTP 401 .*Login failed"):
        provision(API, "guest", "wrong-password", "x", N, {})


# --- what each role may do ----------------------------------------------------------------------------------------


def test_the_worker_is_confined(deployment):
    d = deployment
    conn = connect(d.urls["worker"])
    try:
        # Other services' exchanges: refused, and nothing reaches their queues.
        for exchange, queues in [
            (t.GLOBAL, [t.AGGREGATOR_GLOBAL, t.BARRIER_GLOBAL, t.EVALUATOR_GLOBAL, t.RECORDER_GLOBAL]),
            (t.TIER_MODELS, [t.AGGREGATOR_TIER_MODELS]),
        ]:
            code, text = attempt(conn, publish(exchange))
            assert code == 403 and "ACCESS_REFUSED" in text and exchange in text
            assert all(depth(d, q) == 0 for q in queues)
        # Its own results: allowed with its keys, refused by topic permission with any other.
        assert attempt(conn, publish(t.RESULTS, t.tier_key(1))) is None
        assert attempt(conn, publish(t.RESULTS, t.PROFILE_KEY)) is None
        assert depth(d, t.barrier_queue(1)) == 1 and depth(d, t.PROFILER_RESULTS) == 1
        code, text = attempt(conn, publish(t.RESULTS, "evil"))
        assert code == 403 and "topic 'evil'" in text
        code, _ = attempt(conn, publish(t.RESULTS, t.tier_key(N + 1)))
        assert code == 403
        assert attempt(conn, publish("", t.train_queue(1)))[0] == 403  # the default exchange too
        # Dead-lettering by republishing is allowed.
        assert attempt(conn, publish(t.DLX, t.train_queue(1))) is None
        # Other services' queues (and a stateful service's state): refused; its own: allowed.
        for queue in (t.barrier_queue(1), t.AGGREGATOR_TIER_MODELS, t.state_queue("barrier"), t.DEAD_LETTERS):
            code, text = attempt(conn, consume(queue))
            assert code == 403 and queue in text
        assert attempt(conn, lambda ch: ch.basic_get(t.barrier_queue(1)))[0] == 403
        assert depth(d, t.barrier_queue(1)) == 1
        assert attempt(conn, lambda ch: (ch.basic_qos(prefetch_count=1), consume(t.train_queue(1))(ch))) is None
        # Declaring anything is refused, even a queue that exists with equal arguments; a passive declare is fine.
        assert attempt(conn, lambda ch: ch.queue_declare("mine", durable=True))[0] == 403
        assert attempt(conn, lambda ch: ch.queue_declare("", exclusive=True))[0] == 403
        q = next(q for q in t.queues(N) if q.name == t.train_queue(1))
        assert attempt(conn, lambda ch: ch.queue_declare(q.name, durable=True, arguments=q.arguments))[0] == 403
        assert attempt(conn, lambda ch: ch.exchange_declare(t.RESULTS, "topic", durable=True))[0] == 403
        assert attempt(conn, lambda ch: ch.queue_bind(t.train_queue(1), t.RESULTS, "#"))[0] == 403
        assert attempt(conn, lambda ch: ch.queue_declare(t.train_queue(1), passive=True)) is None
        assert attempt(conn, lambda ch: ch.exchange_declare(t.RESULTS, passive=True)) is None
    finally:
        conn.close()


def test_the_barrier_consumes_its_queues_and_publishes_tier_models_but_no_global_model(deployment):
    d = deployment
    conn = connect(d.urls["barrier"])
    try:
        mine = [*(t.barrier_queue(m) for m in range(1, N + 1))]
        mine += [t.BARRIER_GLOBAL, t.BARRIER_ASSIGNMENTS, t.BARRIER_EVALUATIONS, t.state_queue("barrier")]
        ch = conn.channel()
        ch.basic_qos(prefetch_count=64)
        for queue in mine:
            ch.basic_consume(queue, lambda *a: None)
        assert len(ch.consumer_tags) == len(mine)
        ch.close()
        assert attempt(conn, publish(t.TIER_MODELS)) is None
        assert depth(d, t.AGGREGATOR_TIER_MODELS) == 1
        assert attempt(conn, publish(t.TRAIN, t.tier_key(2))) is None
        assert depth(d, t.train_queue(2)) == 1
        assert attempt(conn, publish(t.EVENTS, t.ROUND_REPORT_KEY)) is None
        assert depth(d, t.PROFILER_REPORTS) == 1
        assert attempt(conn, publish(t.STATE, "barrier")) is None
        assert depth(d, t.state_queue("barrier")) == 1
        code, text = attempt(conn, publish(t.GLOBAL))
        assert code == 403 and t.GLOBAL in text
        assert depth(d, t.AGGREGATOR_GLOBAL) == 0 and depth(d, t.BARRIER_GLOBAL) == 0
        assert attempt(conn, publish(t.EVENTS, t.EVALUATION_KEY))[0] == 403  # only the evaluator evaluates
        assert attempt(conn, publish(t.STATE, "aggregator"))[0] == 403  # another service's state
        assert depth(d, t.state_queue("aggregator")) == 0
        assert attempt(conn, consume(t.AGGREGATOR_TIER_MODELS))[0] == 403
    finally:
        conn.close()


@pytest.mark.parametrize("role", SERVICE_ROLES)
def test_each_role_reaches_exactly_what_its_permissions_name(deployment, role):
    """Every queue consumed and every exchange published to, as this role: allowed iff the role names it."""
    r = roles(N)[role]
    keys = dict(r.topic_keys)
    conn = connect(deployment.urls[role])
    try:
        for q in t.queues(N):
            result = attempt(conn, consume(q.name))
            assert (result is None) == (q.name in r.consumes), (role, q.name, result)
        for exchange, kind in t.EXCHANGES.items():
            key = keys[exchange][0] if exchange in keys else (t.tier_key(1) if kind != "fanout" else "")
            result = attempt(conn, publish(exchange, key))
            assert (result is None) == (exchange in r.publishes), (role, exchange, result)
            assert result is None or result[0] == 403
    finally:
        conn.close()


def test_fedat_provision_command_writes_private_credentials_and_no_password_to_stdout(tmp_path):
    vhost, _ = _fresh()
    (tmp_path / "admin").write_text("guest\n")
    (tmp_path / "pw").mkdir()
    (tmp_path / "pw" / "worker").write_text("worker-password-from-a-secret\n")
    creds = tmp_path / "out" / "credentials.json"
    admin = str(tmp_path / "admin")
    base = [sys.executable, "-m", "fedat.cli", "provision", "--api-url", API, "--admin-password-file", admin]
    base += ["--vhost", vhost]
    cmd = [*base, "--num-tiers", "2", "--credentials-out", str(creds), "--password-dir", str(tmp_path / "pw")]
    try:
        first = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert first.returncode == 0, first.stderr
        assert creds.stat().st_mode & 0o777 == 0o600
        data = json.loads(creds.read_text())
        assert set(data) == set(SERVICE_ROLES)
        assert data["worker"]["password"] == "worker-password-from-a-secret"
        assert data["worker"]["username"] == f"{vhost}-worker"
        second = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert second.returncode == 0, second.stderr
        assert json.loads(creds.read_text()) == data  # generated passwords are kept: nothing changes
        assert "created" not in second.stdout and "updated" not in second.stdout, second.stdout
        for out in (first.stdout + first.stderr, second.stdout + second.stderr):
            for entry in data.values():
                assert entry["password"] not in out
        # A worker connects with what was written.
        connect(data["worker"]["amqp_url"]).close()
    finally:
        gone = subprocess.run([*base, "--delete"], capture_output=True, text=True, timeout=60)
        assert gone.returncode == 0, gone.stderr
    api = ManagementApi(API, *ADMIN)
    assert api.call("GET", f"vhosts/{vhost}", missing_ok=True) is None
    assert api.call("GET", f"users/{vhost}-worker", missing_ok=True) is None


def test_a_checkpoint_outlives_its_restores_under_a_blanket_delivery_limit(deployment):
    """A restore gives a service's checkpoints back to their queues, which a quorum queue counts as a delivery, and
    RabbitMQ 4.0-4.2 give every quorum queue a delivery limit (20) unless told otherwise: the state queues' policy
    keeps the checkpoints however often the service restarts."""
    from fedat.protocol.checkpoint import Checkpoint
    from fedat.runtime.brokerstore import BrokerStore

    api = ManagementApi(API, *ADMIN)
    v = quote(deployment.vhost, safe="")
    blanket = {"pattern": ".*", "definition": {"delivery-limit": 2}, "priority": 0, "apply-to": "queues"}
    api.call("PUT", f"policies/{v}/blanket", blanket)  # as a 4.x broker's default behaves, sooner
    conn = connect(deployment.admin_url)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        BrokerStore("aggregator").save(ch, Checkpoint("aggregator", 3, 0.0, b"state", ()))
        for _ in range(6):  # six restarts
            assert BrokerStore("aggregator").restore(ch).checkpoint.seq == 3
        # Without the state queues' policy the blanket limit applies, and the checkpoint is gone at the next restore.
        api.call("DELETE", f"policies/{v}/fedat-state")
        seen = [BrokerStore("aggregator").load(ch) for _ in range(3)]
        assert seen[-1] is None
    finally:
        conn.close()
