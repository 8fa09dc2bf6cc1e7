"""`fedat run`: start every service as a local process on a fresh vhost, follow the run, write results/<run-id>/.

The services come from the system table (`fedat.protocol.system`), the vhost with one least-privilege user per role
from `fedat.deploy.vhost`, the processes are supervised by `fedat.deploy.supervisor` and started phase by phase by
`fedat.deploy.launch`. The vhost and the users are deleted at the end. A calibrated experiment is planned for this
machine and budget before anything starts (`fedat.lab.calibration`) and keeps to its latency model while it runs
(`fedat.lab.pace`); what the run prints comes from `fedat.lab.progress`.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import uuid
from pathlib import Path

from fedat.deploy.experiment import Experiment
from fedat.deploy.launch import launch, metrics_ports, process_names
from fedat.deploy.supervisor import Supervisor
from fedat.deploy.vhost import MANAGEMENT_ENV, Vhost
from fedat.lab import plan
from fedat.lab.calibration import calibrate_experiment
from fedat.lab.pace import Pace, restart_workers
from fedat.lab.plan import clock
from fedat.lab.progress import end_table, falling_behind, keeping_up, progress_every, progress_line, tiered_clients
from fedat.lab.recorder import Recorder, RunState
from fedat.lab.utilisation import Sample, metrics_text, sample_workers, worker_utilisation
from fedat.protocol.system import BY_NAME, Phase
from fedat.runtime.bus import BrokerConfig, run_service
from fedat.runtime.metrics import transport_metrics


def _interrupt(signum, frame) -> None:
    # One request to stop is enough: a second signal must not abort the clean-up (vhost, children, summary).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def run(
    exp: Experiment,
    results: Path,
    minutes: float | None = None,
    amqp_url: str | None = None,
    tag: str = "",
    prometheus: bool = False,
    slowdown: float = 1.0,
    plan_only: bool = False,
) -> dict:
    """Run one experiment end to end and return its summary (`prometheus`: observe it, see `fedat.ops.observe`).

    An experiment that calibrates is planned for this machine and budget first (`fedat.lab.calibration`; `slowdown`
    emulates a slower machine, `plan_only` stops after the plan); a budget too short here ends it before anything
    starts, with SystemExit naming the shortest budget that would work; without `minutes` (the experiment's own
    budget) it runs for that shortest budget instead, and says so.
    """
    stretch = minutes is None
    minutes = exp.minutes if minutes is None else minutes
    num_tiers = int(exp.settings.get("num_tiers", 5))
    base_env = {k: v for k, v in os.environ.items() if k not in MANAGEMENT_ENV}
    calibration = None
    if exp.calibrate:  # before the vhost and the results folder exist: a refusal or a failed probe leaves nothing
        exp, calibration = calibrate_experiment(
            exp, {**base_env, **exp.env(), "TF_CPP_MIN_LOG_LEVEL": "2"}, minutes, slowdown, stretch
        )
        minutes = calibration["budget_minutes"]
    if plan_only:
        print("[fedat] --plan-only: nothing started", flush=True)
        return {"calibration": calibration, "latency_model": {"time_scale": exp.settings.get("time_scale")}}
    run_id = tag or f"{time.strftime('%Y%m%d-%H%M%S')}-{exp.name}-{uuid.uuid4().hex[:4]}"
    out = results / run_id
    out.mkdir(parents=True)
    vhost = Vhost(amqp_url, num_tiers)
    vhost.open()
    started = time.time()
    env = {**base_env, **exp.env(), "TF_CPP_MIN_LOG_LEVEL": "2"}
    meta = {"name": exp.name, "workers": exp.workers, "minutes": minutes, "settings": exp.settings}
    (out / "experiment.json").write_text(json.dumps({**meta, "calibration": calibration}, indent=2))
    sup = Supervisor(env, out / "logs")
    state = RunState(started_at=started)
    stop = threading.Event()
    events = open(out / "events.jsonl", "w")  # noqa: SIM115 — closed below
    recorder_broker = BrokerConfig(
        url=vhost.url("recorder"),
        num_tiers=num_tiers,
        prefetch=BY_NAME["recorder"].prefetch,
        declare=vhost.declare,
        keyring=vhost.keyring("recorder"),
    )
    recorder = threading.Thread(
        target=run_service,
        args=(Recorder(state, events), recorder_broker, transport_metrics(_registry(), "recorder"), stop),
        daemon=True,
    )
    failure = None
    window_start: Sample | None = None  # the workers' CPU and training seconds, for their utilisation
    window_end: Sample | None = None
    observer = None  # a local Prometheus (--prometheus)
    pace = _pace(exp, calibration, minutes * 60)  # a calibrated run changes its time scale if its workers fall behind
    behind: dict | None = None  # when the late share first passed the limit, once enough updates came
    # Stop like Ctrl-C: services stopped, vhost and users deleted, summary written.
    interrupted = False
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        names = process_names(exp.workers)
        ports = metrics_ports(names)
        if prometheus:
            from fedat.ops import observe

            observer = observe.start(out, ports, vhost)
        recorder.start()

        def before(phase: Phase, group: list[str]) -> None:
            if phase is Phase.SERVE:
                print(
                    f"[fedat] run {run_id}: starting {exp.workers} workers, evaluator, aggregator, barrier ...",
                    flush=True,
                )
            if phase is Phase.PROFILE:
                # The clock of events.jsonl starts with the profiling pass, not with process start-up, and profiling
                # starts only now, so that worker start-up does not count as client latency.
                with state.lock:
                    state.started_at = time.time()

        # The seed job starts first: its cold TensorFlow start (~10 s) then overlaps the services' start-up instead of
        # delaying the first round past the end of a short profiling pass.
        launching = time.time()
        launch(sup, vhost, names, ports, before)
        if pace is not None:  # the first estimate of what a restart of the workers costs (with TensorFlow's start)
            pace.restart_seconds = time.time() - launching
        (out / "services.json").write_text(json.dumps(sup.table(ports), indent=2))
        t0 = time.time()
        budget = minutes * 60
        every = progress_every(budget)
        clients = int(exp.settings.get("num_clients", 100))
        print(f"[fedat] running for {clock(budget)}: profiling {clients} clients, then FedAT; results in {out}")
        sys.stdout.flush()
        printed = 0
        while (elapsed := time.time() - t0) < budget:
            time.sleep(min(1.0, budget - elapsed))
            if sup.exited():
                raise RuntimeError(f"services died: {sup.describe_exits()} (see {out / 'logs'})")
            if window_start is None and state.version >= 1:  # profiled, tiers assigned, a first round merged
                window_start = sample_workers(sup.pids("worker-"), ports)
                if pace is not None:
                    pace.since = window_start
            elapsed = time.time() - t0
            if elapsed < (printed + 1) * every and elapsed < budget:
                continue
            printed = int(elapsed // every)
            print(_progress(state, elapsed, budget, ports.get("profiler"), clients), flush=True)
            with state.lock:
                late, updates = state.late, state.updates
            now = sample_workers(sup.pids("worker-"), ports) if pace is not None and window_start else None
            change = pace.due(elapsed, late, updates, now) if pace is not None else None
            if change is not None:
                new, why = change
                print(
                    f"[fedat] the workers fell behind: {why}. Time scale {pace.time_scale:g} -> {new:g}: "
                    "restarting them one at a time ...",
                    flush=True,
                )
                workers = [n for n in names if n.startswith("worker-")]
                restarting = time.time()
                restart_workers(sup, ports, workers, new)
                pace.restart_seconds = time.time() - restarting
                pace.changes.append({"at_seconds": round(elapsed, 1), "from": pace.time_scale, "to": new, "why": why})
                with state.lock:  # counted from the restarted workers on: the restart itself is no measure of them
                    pace.time_scale, pace.late, pace.updates = new, state.late, state.updates
                # utilisation from here on: the restarted workers count their CPU and training seconds from zero
                window_start = pace.since = sample_workers(sup.pids("worker-"), ports)
                continue
            if pace is not None:  # what counts is how the workers did since the scale last changed
                late, updates = late - pace.late, updates - pace.updates
            if behind is None and elapsed >= plan.EARLY_SHARE * budget and keeping_up(late, updates) is False:
                behind = {"at_seconds": round(elapsed, 1), "late": late, "updates": updates}
                print(falling_behind(late, updates), flush=True)
    except KeyboardInterrupt:
        interrupted = True
        print("\n[fedat] interrupted: stopping services", flush=True)
    except RuntimeError as exc:
        failure = str(exc)
        print(f"[fedat] run failed: {failure}", flush=True)
    finally:
        if window_start is not None:
            window_end = sample_workers(sup.pids("worker-"), ports)
        if observer is not None:
            observer.stop()
        sup.close()
        stop.set()
        recorder.join(timeout=10)
        events.close()
        vhost.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    summary = summarize(exp, state, time.time() - started)
    summary["failure"] = failure
    summary["run_dir"] = str(out)
    if pace is not None and pace.changes:  # experiment.json says what the run became, too (the same list)
        (out / "experiment.json").write_text(json.dumps({**meta, "calibration": calibration}, indent=2))
    summary["calibration"] = calibration
    summary["keeping_up"] = {
        "limit": plan.LATE_LIMIT,
        "kept_up": keeping_up(summary["late_updates"], summary["client_updates"]),
        "fell_behind": behind,
        # since the time scale last changed, if it did: what the run became
        "since_last_change": None
        if pace is None or not pace.changes
        else {"late": summary["late_updates"] - pace.late, "updates": summary["client_updates"] - pace.updates},
    }
    summary["worker_utilisation"] = worker_utilisation(window_start, window_end) if window_end else None
    if summary["worker_utilisation"] and pace is not None and pace.changes:
        summary["worker_utilisation"]["window"] = "the last time scale change to the end of the run"
    summary["load_average"] = [round(x, 2) for x in os.getloadavg()]  # others' work on the machine lowers the above
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    plots: list[str] = []
    try:
        from fedat.lab.plots import plot_run

        plot_run(out)
        plots = sorted(p.name for p in out.glob("*.png"))
    except ImportError:
        print("[fedat] matplotlib missing: no plots", flush=True)
    print(end_table(summary, plots), flush=True)
    if interrupted:
        raise KeyboardInterrupt  # after the clean-up and the summary: callers such as `fedat compare` stop too
    if failure:
        raise SystemExit(f"fedat run failed: {failure}")
    return summary


def _pace(exp: Experiment, calibration: dict | None, budget: float) -> Pace | None:
    """The watch over a calibrated run's workers (a run at the file's fixed time scale keeps it, as comparisons do)."""
    if calibration is None:
        return None
    probe = calibration["probe"]
    share = probe["cpu_step_seconds"] / probe["wall_step_seconds"] if probe["wall_step_seconds"] > 0 else None
    return Pace(float(exp.settings["time_scale"]), budget, share, changes=calibration["time_scale_changes"])


def _registry():
    from prometheus_client import CollectorRegistry

    return CollectorRegistry()


def _progress(s: RunState, elapsed: float, budget: float, profiler_port: int | None, clients: int) -> str:
    text = metrics_text(profiler_port)
    tiered = tiered_clients(text) if text is not None else None
    with s.lock:
        acc = s.evaluations[-1]["accuracy"] if s.evaluations else None
        return progress_line(elapsed, budget, s.version, s.tier_counts, tiered, clients, acc, s.late, s.updates)


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
        "first_accuracy": evals[0]["accuracy"] if evals else None,
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
