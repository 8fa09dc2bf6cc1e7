"""Real clients on the real broker: `fedat serve` runs the server side as processes and enrolls them; each client is a
`fedat-client` process with only its own shard in its own folder and its own credentials.

Seven clients start (3 and 4 slow: `--delay 2`), an eighth joins late. Along the way client 3 is SIGKILLed while it
holds a trained task and is restarted (its task, sent against the version it kept, is answered from the state it
kept in its folder), client 6 is revoked, and client 7 is SIGKILLed and restarted with a stolen key
(client 0's, under its own name). The run must show: global versions from both tiers, a federated accuracy of at
least ACCURACY_FLOOR, the slow clients tiered apart, the killed client back in the rounds with its task given back by
the broker, the late client profiled and tiered, the revoked client refused by the broker, and the stolen-key
update dead-lettered with the reason, and clients getting tasks and evaluation requests against a version they
keep.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from urllib.parse import quote

import pika
import pytest

from fedat.deploy.ports import free_ports
from fedat.protocol import signing, topology, wire

from .real_client_app import write_shard

pytestmark = [pytest.mark.broker, pytest.mark.tf, pytest.mark.slow, pytest.mark.alone]

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.integration.real_client_app:app"
CLIENTS = 8  # 0-4 and 6-7 at the start, 5 late
SLOW = (3, 4)
DELAY = 2.0  # seconds the slow clients hold each answer back
ACCURACY_FLOOR = 0.8  # federated (sample-weighted) test accuracy; the clusters are well apart, so ~0.95 is usual
BUDGET = 240.0  # seconds for the whole scenario; each wait fails with what it was waiting for

EXPERIMENT = f"""
name: real-clients-test
workers: 0
minutes: 10
settings:
  app: {APP}
  num_tiers: 2
  clients_per_round: 2
  min_clients: 1
  epochs: 1
  batch_size: 16
  learning_rate: 0.02
  codec: polyline
  precision: 4
  min_deadline: 4
  profile_deadline: 8
  max_misses: 3
  eval_every: 0
  eval_interval: 3
  eval_window: 6
  seed: 0
"""


class Serve:
    """`fedat serve` as a process: its output kept, its run folder, vhost and secret read from what it prints."""

    def __init__(self, results: Path, experiment: Path):
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fedat.cli", "serve", str(experiment), "--clients", str(CLIENTS),
             "--results", str(results)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
        )  # fmt: skip
        threading.Thread(target=self._read, daemon=True).start()
        self.results = results

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())

    def find(self, pattern: str) -> re.Match | None:
        return next((m for m in map(re.compile(pattern).search, list(self.lines)) if m), None)

    @property
    def run(self) -> Path:
        return self.results / self.find(r"serve (\S+): starting").group(1)

    @property
    def vhost(self) -> str:
        return self.find(r"--vhost (\S+)").group(1)

    def events(self) -> list[dict]:
        path = self.run / "events.jsonl"
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # it deletes its vhost and the clients' users
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Client:
    """One `fedat-client` process for client k, started from its enrollment folder with its own shard."""

    def __init__(self, k: int, folder: Path, port: int, delay: float = 0.0, env_file: str = "client.env"):
        self.k, self.folder, self.port = k, folder, port
        self.starts = 0
        self.delay, self.env_file = delay, env_file
        self.proc: subprocess.Popen | None = None

    def start(self, env_file: str | None = None) -> None:
        env = {**os.environ, "FEDAT_DATA_ROOT": str(self.folder), "FEDAT_METRICS_PORT": str(self.port)}
        cmd = [
            sys.executable,
            "-m",
            "fedat_worker.client_main",
            "--env",
            str(self.folder / (env_file or self.env_file)),
        ]
        cmd += ["--delay", str(self.delay)] if self.delay else []
        self.starts += 1
        log = open(self.folder / f"client-{self.starts}.log", "w")  # noqa: SIM115 — the process keeps it
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return (self.folder / f"client-{self.starts}.log").read_text()

    def metrics(self) -> str:
        """Its Prometheus exposition; "" until it serves it."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as r:
                return r.read().decode()
        except OSError:
            return ""

    def trainings(self) -> dict[int, int]:
        """tier -> tasks this process trained (0: profiling), from its metrics; {} until it serves them."""
        found = re.findall(r'^fedat_client_trainings_total\{tier="(\d+)"\} ([0-9.e+]+)$', self.metrics(), re.M)
        return {int(t): int(float(n)) for t, n in found}

    def model_bytes(self, of: str) -> dict[str, float]:
        """How the models of its round tasks (`of` "task") or evaluation requests ("evaluation") came ("whole",
        "against_kept") -> bytes, from its metrics."""
        out: dict[str, float] = {}
        pattern = rf'^fedat_client_{of}_model_bytes_total\{{[^}}]*sent="(\w+)"[^}}]*\}} (\S+)$'
        for sent, n in re.findall(pattern, self.metrics(), re.M):
            out[sent] = out.get(sent, 0.0) + float(n)
        return out

    def in_tier(self) -> int:
        """Round tasks (tier >= 1) this process trained."""
        return sum(n for t, n in self.trainings().items() if t >= 1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def wait_for(what: str, check, deadline: float, every: float = 0.5):
    """Poll `check` until it returns something true; fail naming `what` at the deadline."""
    while time.time() < deadline:
        got = check()
        if got:
            return got
        time.sleep(every)
    pytest.fail(f"timed out waiting for {what}")


def admin(vhost: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:5672/{quote(vhost, safe='')}"))


def ready_messages(vhost: str, queue: str) -> int:
    conn = admin(vhost)
    try:
        return conn.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        conn.close()


def first_message(vhost: str, queue: str):
    """The message at the head of `queue`, decoded and left there."""
    conn = admin(vhost)
    try:
        method, _, body = conn.channel().basic_get(queue, auto_ack=False)
        assert method is not None, f"{queue} is empty"
        return wire.decode(body)
    finally:
        conn.close()  # unacked: back at the head


def dead_letter_reasons(vhost: str) -> list[str]:
    """Every dead letter's reason (left in the queue)."""
    conn = admin(vhost)
    reasons = []
    try:
        ch = conn.channel()
        while True:
            method, props, _ = ch.basic_get(topology.DEAD_LETTERS, auto_ack=False)
            if method is None:
                break
            reasons.append(str((props.headers or {}).get(topology.HEADER_REASON, "")))
        # closing without acks gives them all back
    finally:
        conn.close()
    return reasons


def test_real_clients_train_a_federation_through_kills_a_late_join_a_revocation_and_a_stolen_key(tmp_path):
    (tmp_path / "experiment.yaml").write_text(EXPERIMENT)
    serve = Serve(tmp_path / "results", tmp_path / "experiment.yaml")
    deadline = time.time() + BUDGET
    ports = free_ports(CLIENTS)
    clients: dict[int, Client] = {}
    try:
        wait_for("fedat serve to enroll the clients", lambda: serve.find("start each client"), deadline)
        folders = serve.run / "clients"
        for k in range(CLIENTS):
            write_shard(k, folders / f"client-{k}")  # its own data, in its own folder, beside its own credentials
            clients[k] = Client(k, folders / f"client-{k}", ports[k], DELAY if k in SLOW else 0.0)
        for k in (0, 1, 2, 3, 4, 6, 7):
            clients[k].start()

        wait_for("global versions", lambda: any(e["event"] == "global" for e in serve.events()), deadline)

        # A client that joins a running federation is profiled, then tiered.
        clients[5].start()

        # SIGKILL while holding a trained task: its trainings count rises as it starts holding the answer back.
        c3 = clients[3]
        before = wait_for("client 3 in a tier", c3.in_tier, deadline, every=0.1)
        wait_for("client 3 to train a round task", lambda: c3.in_tier() > before, deadline, every=0.05)
        c3.proc.send_signal(signal.SIGKILL)
        c3.proc.wait(10)
        queue = topology.client_queue(3)
        assert wait_for("the broker to give client 3's task back", lambda: ready_messages(serve.vhost, queue), deadline)
        given_back = first_message(serve.vhost, queue)
        c3.start()

        # A stolen key: client 0's key under client 7's name. Killed without a goodbye, client 7 is still in its tier,
        # so tasks keep coming; every answer it signs is dead-lettered by the barrier with the reason.
        c7 = clients[7]
        wait_for("client 7 in a tier", c7.in_tier, deadline)
        c7.proc.send_signal(signal.SIGKILL)
        c7.proc.wait(10)
        stolen = signing.keys_for_role(bytes.fromhex((serve.run / "secret").read_text()), "client-0")["client-0"]
        (c7.folder / "stolen.json").write_text(json.dumps({"client-7": stolen}))
        env = re.sub(
            r"(?m)^FEDAT_KEYRING_FILE=.*$", "FEDAT_KEYRING_FILE=stolen.json", (c7.folder / "client.env").read_text()
        )
        (c7.folder / "stolen.env").write_text(env)
        c7.start("stolen.env")

        # Revoked: the broker closes its connection and refuses it from then on; the process says so and exits.
        c6 = clients[6]
        wait_for("client 6 in a tier", c6.in_tier, deadline)
        revoke = subprocess.run(
            [sys.executable, "-m", "fedat.cli", "revoke", "6", "--vhost", serve.vhost,
             "--secret-file", str(serve.run / "secret")],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert revoke.returncode == 0, revoke.stdout + revoke.stderr
        assert c6.proc.wait(60) == 3
        assert "refused" in c6.log()

        forged = re.compile(r"signature of update u-t\d+-r\d+-c7-v\d+ does not match client-7's key")
        wait_for(
            "client 7's update to be dead-lettered",
            lambda: any(forged.search(r) for r in dead_letter_reasons(serve.vhost)),
            deadline,
            every=1.0,
        )

        # The restarted client rejoined: profiled again (one profiling task), and back in the rounds.
        wait_for("client 3 profiled again and training", lambda: c3.trainings().get(0) == 1 and c3.in_tier(), deadline)
        # The task given back was sent against the version it kept; its state folder kept that version over the kill.
        assert given_back.relative_to >= 0, given_back.id
        assert not any(given_back.id in r for r in dead_letter_reasons(serve.vhost))
        assert (c3.folder / "state" / "snapshot").exists()
        # The late client was profiled, then tiered.
        c5 = clients[5]
        wait_for(
            "the late client 5 profiled and in a tier", lambda: c5.trainings().get(0) == 1 and c5.in_tier(), deadline
        )

        def learnt() -> bool:
            events = serve.events()
            versions = [e for e in events if e["event"] == "global"]
            scores = [e["accuracy"] for e in events if e["event"] == "evaluation"]
            both = bool(versions) and all(n > 0 for n in versions[-1]["tier_counts"])
            return both and bool(scores) and max(scores) >= ACCURACY_FLOOR

        wait_for(f"versions from both tiers and a federated accuracy >= {ACCURACY_FLOOR}", learnt, deadline, every=1.0)

        # A client that answered gets its next task against the version it keeps (lossless, fewer bytes).
        sent = {k: clients[k].model_bytes("task") for k in (0, 1, 2, 4)}
        assert any(b.get("against_kept", 0) > 0 for b in sent.values()), sent
        # Evaluation requests between the ones sent whole come against the newest whole one, which clients keep.
        asked = {k: clients[k].model_bytes("evaluation") for k in (0, 1, 2, 4)}
        assert all(b.get("whole", 0) > 0 for b in asked.values()), asked
        assert any(b.get("against_kept", 0) > 0 for b in asked.values()), asked

        # Tiered by measured response time: the clients that hold their answers back train in the slow tier (once
        # the draws of that tier have picked them: the federation can learn before they train a round task).
        wait_for("the slow clients to train round tasks", lambda: all(clients[k].in_tier() for k in SLOW), deadline)
        for k in SLOW:
            trained = clients[k].trainings()
            assert trained.get(2, 0) > trained.get(1, 0), (k, trained)
    finally:
        for c in clients.values():
            c.stop()
        serve.stop()
    for k in (0, 1, 2, 3, 4, 5):  # a clean stop: it said it leaves, and exits 0
        assert clients[k].proc.returncode == 0, clients[k].log()[-2000:]
        assert "left (stopped)" in clients[k].log()
