"""`fedat run`: start every service as a local process on a fresh vhost, follow the run, write results/<run-id>/."""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fedat import broker_admin
from fedat.bus import BrokerConfig, run_service
from fedat.metrics import transport_metrics
from fedat.recorder import Recorder, RunState

log = logging.getLogger("fedat.run")
PR_SET_PDEATHSIG = 1

SERVICES = {
    "aggregator": "fedat_aggregator.aggregator_main",
    "barrier": "fedat_aggregator.barrier_main",
    "profiler": "fedat_profiler.main",
    "worker": "fedat_worker.worker_main",
    "evaluator": "fedat_worker.evaluator_main",
    "seed": "fedat_worker.seed_main",
}


@dataclass(frozen=True)
class Experiment:
    """An experiment file: a name, how many worker processes, and FEDAT_* settings shared by every service."""

    name: str
    workers: int
    minutes: float
    settings: dict[str, Any]

    def env(self) -> dict[str, str]:
        """The settings as FEDAT_* environment variables (lists become comma-separated)."""

        def text(v: Any) -> str:
            if isinstance(v, list | tuple):
                return ",".join(text(x) for x in v)
            return str(v)

        return {f"FEDAT_{k.upper()}": text(v) for k, v in self.settings.items()}


# What an experiment may set: every FEDAT_* variable the services read (lower-cased, without the prefix), except
# the ones `fedat run` sets per process. A typo must fail loudly, not run the default silently.
SETTINGS = frozenset(
    """batch_size classes_per_client clients_per_round codec data_root dataset deadline_factor delays device_factor
    dirichlet_alpha drift_fraction drop_window epochs eval_every eval_interval ewma_alpha group_sizes learning_rate
    log_level max_message_bytes max_misses min_clients min_deadline model num_clients num_tiers partition precision
    prefetch profile_concurrency profile_deadline profile_epochs prox_lambda retier_every samples_per_client seed
    step_seconds straggler_fraction strategy tf_threads tier_sizes time_scale unstable_clients""".split()
)


def check_settings(settings: dict[str, Any], where: str) -> dict[str, Any]:
    """The settings unchanged, or ValueError naming every unknown key."""
    unknown = sorted(set(settings) - SETTINGS)
    if unknown:
        raise ValueError(f"{where}: unknown setting(s) {unknown}; known settings: {' '.join(sorted(SETTINGS))}")
    return settings


def load_experiment(path: str | Path) -> Experiment:
    """Read an experiment YAML file; errors name the file and the key."""
    raw = yaml.safe_load(Path(path).read_text())
    if not isinstance(raw, dict) or not isinstance(raw.get("settings"), dict):
        raise ValueError(f"{path}: expected a map with 'name', 'workers', 'minutes' and a 'settings' map")
    check_settings(raw["settings"], str(path))
    return Experiment(
        name=str(raw.get("name", Path(path).stem)),
        workers=int(raw.get("workers", 2)),
        minutes=float(raw.get("minutes", 10)),
        settings=dict(raw["settings"]),
    )


class Processes:
    """The services of one run, as child processes with their logs in the run folder."""

    def __init__(self, env: dict[str, str], logdir: Path):
        self.env, self.logdir = env, logdir
        self.procs: list[tuple[str, subprocess.Popen, Any]] = []
        logdir.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, module: str, extra: dict[str, str] | None = None) -> subprocess.Popen:
        """Start one service."""
        logf = open(self.logdir / f"{name}.log", "ab")  # noqa: SIM115 — closed in stop()
        env = {**self.env, **(extra or {})}
        p = subprocess.Popen(
            [sys.executable, "-m", module], env=env, stdout=logf, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
        )
        self.procs.append((name, p, logf))
        return p

    def dead(self) -> list[str]:
        """Services that exited although nobody asked them to."""
        return [f"{n} (exit {p.returncode})" for n, p, _ in self.procs if p.poll() is not None and n != "seed"]

    def stop(self) -> None:
        """SIGTERM everything, then SIGKILL what is still alive after 10 s."""
        for _, p, _ in self.procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.time() + 10
        for _, p, logf in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            logf.close()


def _die_with_parent() -> None:
    # Linux: a child gets SIGTERM if the launcher dies, even by SIGKILL, so no service outlives its run.
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _interrupt(signum, frame) -> None:
    # One request to stop is enough: a second signal must not abort the clean-up (vhost, children, summary).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def _connected(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
            return b"fedat_broker_connected 1.0" in r.read()
    except OSError:
        return False


def wait_connected(ports: list[int], procs: Processes, timeout: float) -> None:
    """Wait until every listed service reports a broker connection on its metrics endpoint."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if all(_connected(p) for p in ports):
            return
        if procs.dead():
            raise RuntimeError(f"services died during start-up: {procs.dead()} (see their logs)")
        time.sleep(0.5)
    raise RuntimeError(f"services did not connect within {timeout:.0f}s")


def run(
    exp: Experiment, results: Path, minutes: float | None = None, amqp_url: str | None = None, tag: str = ""
) -> dict:
    """Run one experiment end to end and return its summary."""
    run_id = tag or f"{time.strftime('%Y%m%d-%H%M%S')}-{exp.name}-{uuid.uuid4().hex[:4]}"
    out = results / run_id
    out.mkdir(parents=True)
    vhost = None
    if amqp_url is None:
        vhost = f"fedat-run-{uuid.uuid4().hex[:8]}"
        amqp_url = broker_admin.create_vhost(vhost)
    minutes = exp.minutes if minutes is None else minutes
    started = time.time()
    env = {
        **os.environ,
        **exp.env(),
        "FEDAT_AMQP_URL": amqp_url,
        "FEDAT_RUN_START": str(started),
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    (out / "experiment.json").write_text(
        json.dumps({"name": exp.name, "workers": exp.workers, "minutes": minutes, "settings": exp.settings}, indent=2)
    )
    procs = Processes(env, out / "logs")
    state = RunState(started_at=started)
    stop = threading.Event()
    events = open(out / "events.jsonl", "w")  # noqa: SIM115 — closed below
    broker = BrokerConfig(url=amqp_url, num_tiers=int(exp.settings.get("num_tiers", 5)), prefetch=16)
    recorder = threading.Thread(
        target=run_service,
        args=(Recorder(state, events), broker, transport_metrics(_registry(), "recorder"), stop),
        daemon=True,
    )
    failure = None
    # Stop like Ctrl-C: services stopped, vhost deleted, summary written.
    interrupted = False
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        recorder.start()
        port = 19100
        ports = []
        for i in range(exp.workers):
            procs.start(f"worker-{i}", SERVICES["worker"], {"FEDAT_METRICS_PORT": str(port)})
            ports.append(port)
            port += 1
        for name in ("evaluator", "aggregator", "barrier"):
            procs.start(name, SERVICES[name], {"FEDAT_METRICS_PORT": str(port)})
            ports.append(port)
            port += 1
        print(f"[fedat] run {run_id}: starting {exp.workers} workers, evaluator, aggregator, barrier ...", flush=True)
        wait_connected(ports, procs, timeout=180)
        with state.lock:  # the clock of events.jsonl starts with the profiling pass, not with process start-up
            state.started_at = time.time()
        # Profiling starts only now, so that worker start-up does not count as client latency.
        procs.start("profiler", SERVICES["profiler"], {"FEDAT_METRICS_PORT": str(port)})
        procs.start("seed", SERVICES["seed"], {"FEDAT_METRICS_PORT": "0"})
        t0 = time.time()
        print(f"[fedat] running for {minutes:g} min; results in {out}", flush=True)
        while time.time() - t0 < minutes * 60:
            time.sleep(5)
            if procs.dead():
                raise RuntimeError(f"services died: {procs.dead()} (see {out / 'logs'})")
            print(_progress(state, time.time() - t0), flush=True)
    except KeyboardInterrupt:
        interrupted = True
        print("\n[fedat] interrupted: stopping services", flush=True)
    except RuntimeError as exc:
        failure = str(exc)
        print(f"[fedat] run failed: {failure}", flush=True)
    finally:
        procs.stop()
        stop.set()
        recorder.join(timeout=10)
        events.close()
        if vhost:
            broker_admin.delete_vhost(vhost)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    summary = summarize(exp, state, time.time() - started)
    summary["failure"] = failure
    summary["run_dir"] = str(out)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    try:
        from fedat.plots import plot_run

        plot_run(out)
    except ImportError:
        print("[fedat] matplotlib missing: no plots", flush=True)
    print(json.dumps(summary, indent=2))
    if interrupted:
        raise KeyboardInterrupt  # after the clean-up and the summary: callers such as `fedat compare` stop too
    if failure:
        raise SystemExit(f"fedat run failed: {failure}")
    return summary


def _registry():
    from prometheus_client import CollectorRegistry

    return CollectorRegistry()


def _progress(s: RunState, elapsed: float) -> str:
    with s.lock:
        acc = s.evaluations[-1]["accuracy"] if s.evaluations else float("nan")
        return (
            f"[fedat] {elapsed:6.0f}s  version {s.version:5d}  rounds per tier {list(s.tier_counts)}  "
            f"accuracy {acc:.3f}  late {s.late}/{s.updates}"
        )


def summarize(exp: Experiment, s: RunState, wall: float) -> dict:
    """The run's headline numbers."""
    evals = s.evaluations
    best = max(evals, key=lambda e: e["accuracy"]) if evals else None
    return {
        "method": exp.settings.get("strategy", "fedat"),
        "experiment": exp.name,
        "best_accuracy": best["accuracy"] if best else None,
        "best_version": best["version"] if best else None,
        "final_accuracy": evals[-1]["accuracy"] if evals else None,
        "accuracy_variance": evals[-1]["variance"] if evals else None,
        "best_accuracy_variance": best["variance"] if best else None,
        "global_updates": s.version,
        "tier_rounds": list(s.tier_counts),
        "bytes_up": s.bytes_up,
        "bytes_down": s.bytes_down,
        "client_updates": s.updates,
        "late_updates": s.late,
        "late_fraction": (s.late / s.updates) if s.updates else 0.0,
        "wall_seconds": round(wall, 1),
        "evaluations": len(evals),
        "latency_model": {
            k: exp.settings.get(k)
            for k in (
                "time_scale",
                "device_factor",
                "delays",
                "step_seconds",
                "group_sizes",
                "tier_sizes",
                "straggler_fraction",
                "unstable_clients",
            )
        },
    }
