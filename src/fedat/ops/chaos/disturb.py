"""One chaos run on a fresh vhost of a private broker: start every service, disturb it per a schedule, settle,
stop, drain, and check from the captured message streams that nothing was lost or counted twice."""

from __future__ import annotations

import os
import threading
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fedat.deploy.experiment import Experiment
from fedat.deploy.launch import launch, metrics_ports, process_names
from fedat.deploy.supervisor import Proc, Supervisor, reports_connected
from fedat.deploy.vhost import KEYS_ENV, MANAGEMENT_ENV, Vhost
from fedat.ops.capture import Capture
from fedat.ops.chaos.report import RESUME_TIMEOUT, Outcome, measure
from fedat.ops.chaos.schedule import Event
from fedat.ops.devbroker import PrivateBroker
from fedat.ops.invariants import check
from fedat.protocol import ids
from fedat.protocol.system import Phase
from fedat.runtime.brokerstore import BrokerStore
from fedat.runtime.bus import BrokerConfig, close_quietly, connect
from fedat_aggregator.aggregator import Aggregator

SETTLE_SECONDS = 4.0  # then let the pipeline run on a little before stopping
DRAIN_SECONDS = 4.0  # between stopping the workers (no new updates) and stopping everything else
CRASH_RESTARTS = 5  # a service that crashes on its own more often is left down


class Crashes:
    """Exits nobody asked for, with their time since the run started; a crashed service is started again."""

    def __init__(self, sup: Supervisor):
        self.sup, self.t0 = sup, time.time()
        self.seen: list[dict[str, Any]] = []

    def check(self, restart: bool = True) -> None:
        """Record the services that exited on their own (the seed job's exit is reported apart); restart them."""
        for p in self.sup.exited():
            if p.job or p.popen is None:
                continue
            self.seen.append({"service": p.name, "exit": p.popen.returncode, "time": round(time.time() - self.t0, 1)})
            if restart and sum(c["service"] == p.name for c in self.seen) <= CRASH_RESTARTS:
                self.sup.restart(p.name)
            else:
                p.stopped = True  # crashed too often: leave it down


def _banner(p: Proc) -> str:
    return f"\n===== fedat.ops.chaos: start {p.starts + 1} at {time.strftime('%H:%M:%S')} =====\n"


def run_once(
    broker: PrivateBroker,
    exp: Experiment,
    seconds: float,
    schedule: list[Event],
    outdir: Path,
    label: str,
    say=print,
) -> Outcome:
    """One run on a fresh vhost of `broker`: start, disturb per `schedule`, settle, stop, drain, check."""
    wall0 = time.time()
    vhost = f"fedat-{label}-{uuid.uuid4().hex[:8]}"
    url = broker.add_vhost(vhost)
    num_tiers = int(exp.settings.get("num_tiers", 5))
    capture = Capture(url, num_tiers)
    capture.declare()  # before any service: every message is copied from the first one on
    capture.start()
    env = {
        **{k: v for k, v in os.environ.items() if k not in MANAGEMENT_ENV and k not in KEYS_ENV},
        **exp.env(),
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    # As under `fedat run` with a given URL: every role on this vhost's URL, declaring the topology, signing with a
    # fresh secret of the run, each role with only its own keys.
    roles = Vhost(url, num_tiers)
    procs = Supervisor(env, outdir / "logs", banner=_banner)
    out = Outcome(label, vhost, seconds)
    names = process_names(exp.workers)
    ports = metrics_ports(names)
    restarting: threading.Thread | None = None
    finished = False
    crashes = Crashes(procs)
    try:

        def before(phase: Phase, group: list[str]) -> None:
            if phase is Phase.SERVE:
                say(f"[chaos] {label}: starting {', '.join(group)} on vhost {vhost}")

        launch(procs, roles, names, ports, before)
        t0 = crashes.t0 = time.time()
        say(f"[chaos] {label}: running {seconds:.0f}s with {len(schedule)} disruptions")
        pending = sorted(schedule, key=lambda e: e.at)
        restarts_due: list[tuple[float, dict[str, Any]]] = []  # (when, event record)
        watching: list[dict[str, Any]] = []  # events waiting for their services to report connected
        next_progress = t0 + 15
        while True:
            now = time.time()
            if now - t0 >= seconds and not restarts_due and (restarting is None or not restarting.is_alive()):
                break
            while pending and now - t0 >= pending[0].at and now - t0 < seconds:
                ev = pending.pop(0)
                rec = {**asdict(ev), "time": round(now - t0, 2), "wall": now, "phase": _phase(capture, now)}
                if ev.action == "kill":
                    procs.kill(ev.target)
                    say(f"[chaos] {now - t0:6.1f}s  SIGKILL {ev.target} ({rec['phase']}); restart in {ev.pause:.1f}s")
                    restarts_due.append((now + ev.pause, rec))
                else:
                    if restarting is not None and restarting.is_alive():
                        restarting.join(timeout=120)
                    say(f"[chaos] {now - t0:6.1f}s  broker restart")
                    restarting = threading.Thread(target=_restart_broker, args=(broker, rec), daemon=True)
                    restarting.start()
                    rec["services"] = list(ports)
                    watching.append(rec)
                out.events.append(rec)
            for due, rec in list(restarts_due):
                if now >= due:
                    procs.restart(rec["target"])
                    rec["restarted_wall"] = time.time()
                    rec["services"] = [rec["target"]]
                    restarts_due.remove((due, rec))
                    watching.append(rec)
            for rec in list(watching):
                up = "broker_up_wall" in rec if rec["action"] == "broker-restart" else True
                if up and all(reports_connected(ports[s]) for s in rec["services"]):
                    rec["connected_wall"] = time.time()
                    watching.remove(rec)
            crashes.check()
            if now >= next_progress:
                say(_progress(capture, now - t0))
                next_progress += 15
            time.sleep(0.2)
        # The budget is spent: let every service come back and the pipeline show progress, then a little more.
        back = time.time()
        resumed = _wait_quietly(
            lambda: _all_connected(ports, watching) and _newest_created(capture) > back, RESUME_TIMEOUT, crashes
        )
        out.live_at_end = resumed
        say(f"[chaos] {label}: {'resumed' if resumed else 'did NOT resume'} after the budget; settling")
        time.sleep(SETTLE_SECONDS)
        crashes.check(restart=False)
        finished = True
    finally:
        if restarting is not None:
            restarting.join(timeout=120)
        # Workers and profiler first, so no new update appears; then the rest, once the queues had time to drain.
        procs.stop([n for n in procs.procs if n.startswith("worker") or n == "profiler"])
        time.sleep(DRAIN_SECONDS)
        procs.close()
        roles.close()
        seed = procs.procs.get("seed")
        out.seed_exit = seed.popen.returncode if seed and seed.popen else None
        out.crashes = crashes.seen
        if not finished:
            capture.stop()
    say(f"[chaos] {label}: draining the capture")
    records = capture.finish(timeout=120)
    pending = absorbed(url)
    try:
        broker.ctl("delete_vhost", vhost)
    except Exception as exc:  # the node is thrown away anyway
        say(f"[chaos] could not delete vhost {vhost}: {exc}")
    out.records = records
    out.verdict = check(
        records.updates,
        records.tier_models,
        records.globals,
        records.reports,
        records.dead_letters,
        [*records.queued, *pending],
    )
    measure(out, records)
    out.wall_seconds = round(time.time() - wall0, 1)
    return out


def absorbed(url: str) -> list[str]:
    """Tier models the aggregator's last checkpoint holds as pending (FedBuff's buffer): acked, saved, and merged by
    its next version, so in flight rather than lost (`fedat_sim.dst` counts them alike)."""
    conn = connect(BrokerConfig(url=url))
    try:
        saved = BrokerStore("aggregator").load(conn.channel())
    finally:
        close_quietly(conn)
    if saved is None:
        return []
    state = Aggregator.codec.decode(saved.state, saved.models)
    return [ids.tier_model(t, r) for t, r in state.pending]


def _restart_broker(broker: Any, rec: dict[str, Any]) -> None:
    try:
        broker.restart()
        rec["broker_up_wall"] = time.time()
    except Exception as exc:  # reported, and the run goes on: services keep retrying
        rec["error"] = f"{type(exc).__name__}: {exc}"
        try:
            broker.start()
            rec["broker_up_wall"] = time.time()
        except Exception as exc2:
            rec["error"] += f"; start: {exc2}"


def _wait_quietly(predicate, timeout: float, crashes: Crashes) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        crashes.check()
        time.sleep(0.5)
    return False


def _all_connected(ports: dict[str, int], watching: list[dict[str, Any]]) -> bool:
    ok = all(reports_connected(p) for p in ports.values())
    if ok:
        now = time.time()
        for rec in watching:
            rec.setdefault("connected_wall", now)
        watching.clear()
    return ok


def _newest_created(capture: Capture) -> float:
    with capture.lock:
        return max((g.created_at for g in capture.records.globals if g.version > 0), default=0.0)


def _phase(capture: Capture, now: float) -> str:
    with capture.lock:
        rounds = any(g.version > 0 and g.created_at <= now for g in capture.records.globals)
    return "rounds" if rounds else "profiling"


def _progress(capture: Capture, elapsed: float) -> str:
    r = capture.snapshot()
    version = max((g.version for g in r.globals), default=-1)
    acc = max(r.evaluations, key=lambda e: e.evaluated_at).accuracy if r.evaluations else float("nan")
    return (
        f"[chaos] {elapsed:6.0f}s  version {version}  updates {len({u.id for u in r.updates})}  "
        f"tier models {len({t.id for t in r.tier_models})}  accuracy {acc:.3f}"
    )
