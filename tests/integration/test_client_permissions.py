"""A real client's credentials, on the real broker: enrolled with `fedat enroll`, it reaches its own queues and keys
and nothing else; a body in another client's name is dead-lettered by the signature check; `fedat revoke` ends it.

Each test provisions its own vhost (every service role) and deletes it and every user afterwards.
"""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import quote

import pika
import pika.exceptions as pe
import pytest

from fedat.deploy import enroll as enroll_mod
from fedat.deploy.provision import ManagementApi, deprovision, provision
from fedat.deploy.roles import SERVICE_ROLES
from fedat.fl.strategies import build_strategy
from fedat.protocol import signing
from fedat.protocol import topology as t
from fedat.protocol.wire import TierAssignment, decode, encode
from fedat_aggregator.barrier import Barrier, BarrierConfig

from ..factories import answer, seed
from .broker import attempt, fetch, publish, running, wait_for

pytestmark = pytest.mark.broker

API = "http://127.0.0.1:15672"
ADMIN = ("guest", "guest")
N = 2
SECRET = secrets.token_bytes(32)


@dataclass
class Site:
    vhost: str
    tmp: Path

    @property
    def admin_url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:5672/{quote(self.vhost, safe='')}"

    def folder(self, k: int) -> Path:
        return self.tmp / f"client-{k}"

    def url(self, k: int) -> str:
        return (self.folder(k) / enroll_mod.URL_FILE).read_text().strip()


def fedat(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedat.cli", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def site(tmp_path):
    """A provisioned vhost with clients 7 (enrolled by the command) and 8 (by the library); all deleted afterwards."""
    try:
        socket.create_connection(("127.0.0.1", 15672), timeout=2).close()
    except OSError:
        pytest.fail("no RabbitMQ management API on 127.0.0.1:15672: run infra/ensure-broker.sh")
    vhost = f"fedat-test-enroll-{uuid.uuid4().hex[:8]}"
    users = {role: (f"{vhost}-{role}", secrets.token_urlsafe(16)) for role in SERVICE_ROLES}
    (tmp_path / "secret").write_text(SECRET.hex())
    s = Site(vhost, tmp_path)
    try:
        provision(API, *ADMIN, vhost, N, users)
        cmd = ["enroll", "7", "--vhost", vhost, "--secret-file", str(tmp_path / "secret"), "--out", str(s.folder(7))]
        first = fedat(*cmd, "--num-tiers", str(N))
        assert first.returncode == 0, first.stderr
        assert "created" in first.stdout and s.url(7).split(":")[2].split("@")[0] not in first.stdout  # no password
        again = fedat(*cmd, "--num-tiers", str(N))
        assert again.returncode == 0 and "created" not in again.stdout and "updated" not in again.stdout, again.stdout
        enroll_mod.enroll(API, *ADMIN, vhost, 8, SECRET, s.folder(8), num_tiers=N)
        yield s
    finally:
        deprovision(API, *ADMIN, vhost, [u for u, _ in users.values()] + [f"{vhost}-client-7", f"{vhost}-client-8"])


def publish_raw(exchange: str, key: str = "", body: bytes = b"probe", headers=None):
    props = pika.BasicProperties(delivery_mode=2, headers=headers)
    return lambda ch: ch.basic_publish(exchange, key, body, props, mandatory=True)


def consume(queue: str):
    return lambda ch: ch.basic_consume(queue, lambda *a: None)


def depth(s: Site, queue: str) -> int:
    conn = pika.BlockingConnection(pika.URLParameters(s.admin_url))
    try:
        return conn.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        conn.close()


def test_the_folder_holds_exactly_what_a_site_needs(site):
    f = site.folder(7)
    assert sorted(p.name for p in f.iterdir()) == ["amqp-url", "client.env", "keyring.json"]
    assert f.stat().st_mode & 0o777 == 0o700
    assert all((f / n).stat().st_mode & 0o777 == 0o600 for n in ("amqp-url", "client.env", "keyring.json"))
    env = dict(line.split("=", 1) for line in (f / "client.env").read_text().splitlines() if not line.startswith("#"))
    assert env == {
        "FEDAT_CLIENT_ID": "7",
        "FEDAT_AMQP_URL_FILE": "amqp-url",
        "FEDAT_KEYRING_FILE": "keyring.json",
        "FEDAT_NUM_TIERS": str(N),
        "FEDAT_DECLARE_TOPOLOGY": "0",
    }
    keys = json.loads((f / "keyring.json").read_text())
    assert keys == signing.keys_for_role(SECRET, "client-7")  # its own key, nothing to derive others' from
    assert site.url(7).startswith(f"amqp://{site.vhost}-client-7:")


def test_a_client_reaches_its_own_queues_and_keys_and_nothing_else(site):
    conn = pika.BlockingConnection(pika.URLParameters(site.url(7)))
    try:
        # Its own tasks and evaluation requests: allowed. Another client's, any service's, the dead letters: refused.
        assert attempt(conn, consume(t.client_queue(7))) is None
        assert attempt(conn, consume(t.client_evaluate_queue(7))) is None
        for queue in (t.client_queue(8), t.client_evaluate_queue(8), t.DEAD_LETTERS, t.barrier_queue(1),
                      t.PROFILER_MEMBERS, t.RECORDER_GLOBAL, t.state_queue("barrier")):  # fmt: skip
            code, text = attempt(conn, consume(queue))
            assert code == 403 and queue in text, (queue, code, text)
        assert attempt(conn, lambda ch: ch.basic_get(t.client_queue(8)))[0] == 403
        # Its own keys on the results exchange reach the services' queues; another client's are refused.
        own = [
            ("tier-1.client-7", t.barrier_queue(1)),
            ("profile.client-7", t.PROFILER_RESULTS),
            ("join.client-7", t.PROFILER_MEMBERS),
            ("evaluation.client-7", t.COLLECTOR_EVALUATIONS),
        ]
        for key, queue in own:
            assert attempt(conn, publish_raw(t.RESULTS, key)) is None, key
            assert depth(site, queue) == 1, queue
        for key in ("tier-1.client-8", "join.client-8", "leave.client-8", "evaluation.client-8", "tier-1", "profile",
                    "tier-1.client-7.x", "#"):  # fmt: skip
            code, text = attempt(conn, publish_raw(t.RESULTS, key))
            assert code == 403 and f"topic '{key}'" in text, (key, code, text)
        # No task, tier model, global model, assignment, evaluation, request or checkpoint of its own making.
        services = [
            (t.TRAIN, "client-8"),
            (t.TIER_MODELS, ""),
            (t.GLOBAL, ""),
            (t.CONTROL, ""),
            (t.EVENTS, t.EVALUATION_KEY),
            (t.EVALUATE, ""),
            (t.STATE, "barrier"),
            ("", t.client_queue(8)),  # the default exchange
        ]
        for exchange, key in services:
            code, text = attempt(conn, publish_raw(exchange, key))
            assert code == 403, (exchange, code, text)
        assert depth(site, t.AGGREGATOR_GLOBAL) == 0 and depth(site, t.client_queue(8)) == 0
        # It may dead-letter with a reason, but not read what is dead-lettered.
        assert attempt(conn, publish_raw(t.DLX, t.client_queue(7))) is None
        assert depth(site, t.DEAD_LETTERS) == 1
        # It configures nothing: no queue of its own (exclusive or not), no binding; a passive declare is fine.
        assert attempt(conn, lambda ch: ch.queue_declare("", exclusive=True))[0] == 403
        q = t.client_queues(7)[0]
        assert attempt(conn, lambda ch: ch.queue_declare(q.name, durable=True, arguments=q.arguments))[0] == 403
        assert attempt(conn, lambda ch: ch.queue_bind(t.client_queue(7), t.TRAIN, "client-8"))[0] == 403
        assert attempt(conn, lambda ch: ch.queue_declare(t.client_queue(7), passive=True)) is None
    finally:
        conn.close()


def test_an_update_in_another_client_s_name_is_dead_lettered_by_the_signature_check(site):
    keyring = signing.Keyring.from_secret(SECRET)
    mine = signing.Keyring.from_text((site.folder(7) / "keyring.json").read_text(), "client-7's keyring")
    barrier = Barrier(BarrierConfig(tiers=(1, 2), codec="raw", real_clients=True), build_strategy("fedat"))
    with running(barrier, site.admin_url, N, keyring=keyring):
        tiers = ((7, 8), ())
        publish(
            site.admin_url, t.CONTROL, "", TierAssignment("a1", 1, tiers, {7: 1.0, 8: 1.0}, 0.0), N, keyring=keyring
        )
        publish(site.admin_url, t.GLOBAL, "", seed(N), N, keyring=keyring)
        task = fetch(site.url(8), t.client_queue(8), timeout=20)  # client 8's own task, in its own queue
        assert task is not None and task.client == 8
        forged = answer(task, 1.0)  # client 7 answers in client 8's name, signed with the only key it has
        body = encode(forged)
        headers = signing.sign(mine, replace(forged, client=7), body)  # its own signature over client 8's body
        conn = pika.BlockingConnection(pika.URLParameters(site.url(7)))
        try:
            assert attempt(conn, publish_raw(t.RESULTS, "tier-1.client-7", body, headers)) is None
        finally:
            conn.close()
        dead = fetch(site.admin_url, t.DEAD_LETTERS, timeout=20, raw=True)
        assert dead is not None
        assert dead[0].headers[t.HEADER_REASON] == f"update {forged.id} is signed by client-7, but it names client 8"


def test_after_fedat_revoke_its_credentials_stop_working_and_the_profiler_is_told(site):
    conn = pika.BlockingConnection(pika.URLParameters(site.url(7)))
    ch = conn.channel()
    ch.basic_consume(t.client_queue(7), lambda *a: None)
    secret_file = str(site.tmp / "secret")
    done = fedat("revoke", "7", "--vhost", site.vhost, "--secret-file", secret_file)
    assert done.returncode == 0, done.stderr
    assert f"deleted   user {site.vhost}-client-7" in done.stdout, done.stdout
    # Its open connection is closed by the broker, and it cannot log in again.
    with pytest.raises((pe.ConnectionClosed, pe.StreamLostError, pe.ChannelClosed, pe.AMQPConnectionError)):
        deadline = time.time() + 10
        while time.time() < deadline:
            conn.process_data_events(time_limit=0.2)
            ch.basic_qos(prefetch_count=1)
        raise AssertionError("the revoked client's connection is still open")
    with pytest.raises(pe.ProbableAuthenticationError):
        pika.BlockingConnection(pika.URLParameters(site.url(7)))
    # The profiler learns it from a leave signed with the client's own key.
    props, body = fetch(site.admin_url, t.PROFILER_MEMBERS, timeout=10, raw=True)
    leave = decode(body)
    assert (leave.kind, leave.client, leave.reason) == ("leave", 7, "revoked")
    signing.verify(signing.Keyring.from_secret(SECRET), leave, body, props.headers)
    # Nothing else is disturbed; revoking again changes nothing; its queues go only with --purge.
    pika.BlockingConnection(pika.URLParameters(site.url(8))).close()
    again = fedat("revoke", "7", "--vhost", site.vhost, "--secret-file", secret_file)
    assert again.returncode == 0 and "absent    user" in again.stdout, again.stdout
    assert depth(site, t.client_queue(7)) == 0
    purged = fedat("revoke", "7", "--vhost", site.vhost, "--secret-file", secret_file, "--purge")
    assert purged.returncode == 0 and f"deleted   queue {t.client_queue(7)}" in purged.stdout, purged.stdout
    api = ManagementApi(API, *ADMIN)
    assert api.call("GET", f"queues/{quote(site.vhost, safe='')}/{t.client_queue(7)}", missing_ok=True) is None


def test_a_task_for_a_purged_client_does_not_stop_the_barrier(site):
    enroll_mod.revoke(API, *ADMIN, site.vhost, 7, SECRET, purge=True)
    barrier = Barrier(BarrierConfig(tiers=(1, 2), codec="raw", real_clients=True), build_strategy("fedat"))
    with running(barrier, site.admin_url, N) as metrics:
        publish(site.admin_url, t.CONTROL, "", TierAssignment("a1", 1, ((7, 8), ()), {7: 1.0, 8: 1.0}, 0.0), N)
        publish(site.admin_url, t.GLOBAL, "", seed(N), N)
        task = fetch(site.url(8), t.client_queue(8), timeout=20)
        assert task is not None and task.client == 8  # its task went out after client 7's found no queue
        wait_for(lambda: metrics.published.labels("train")._value.get() >= 1, 10, "the barrier's published task")
        assert metrics.connected._value.get() == 1 and metrics.reconnects._value.get() == 0


def test_enroll_names_what_is_wrong(site, tmp_path):
    missing = fedat("enroll", "1", "--vhost", "no-such-vhost", "--secret-file", str(site.tmp / "secret"),
                    "--out", str(tmp_path / "x"))  # fmt: skip
    assert missing.returncode != 0 and "vhost no-such-vhost does not exist" in missing.stderr
    (tmp_path / "short").write_text("abcd")
    short = fedat("enroll", "1", "--vhost", site.vhost, "--secret-file", str(tmp_path / "short"),
                  "--out", str(tmp_path / "y"))  # fmt: skip
    assert short.returncode != 0 and "at least 32 bytes" in short.stderr
    assert not (tmp_path / "y").exists()
