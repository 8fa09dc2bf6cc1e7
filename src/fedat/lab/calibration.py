"""`fedat run`'s calibration: measure this machine's training step and evaluation, then plan the run's time scale
for its budget (`fedat.lab.plan`, with the demand model `fedat_sim.demand` in its own process), or refuse it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace

from fedat.deploy.children import die_with_parent
from fedat.deploy.experiment import Experiment
from fedat.lab import calibrate as cal
from fedat.lab import plan
from fedat.runtime import config

PROBE_SECONDS = 4.0  # measured per probe after tracing: a few client tasks, against a run of minutes


def probe_machine(env: dict[str, str], workers: int, seconds: float = PROBE_SECONDS) -> dict:
    """Seconds per training step here: one `fedat_worker.probe` per worker process, all measuring at once; the
    first one then also times an evaluation."""
    cmd = [sys.executable, "-m", "fedat_worker.probe", "--seconds", str(seconds)]
    logs = [tempfile.TemporaryFile("w+") for _ in range(workers)]  # TensorFlow's start-up chatter, shown on failure
    probes = [
        subprocess.Popen(
            cmd + (["--evaluate"] if i == 0 else []),
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=logs[i],
            text=True,
            preexec_fn=die_with_parent,
        )
        for i in range(workers)
    ]
    try:
        for p, log in zip(probes, logs, strict=True):  # each traces first: the measurements start together
            if p.stdout.readline().strip() != "ready":
                log.seek(0)
                raise RuntimeError(f"the trainer probe failed (exit {p.wait()}): {log.read()[-2000:]}")
        for p in probes:
            p.stdin.write("go\n")
            p.stdin.flush()
        results = [json.loads(p.stdout.readline()) for p in probes]
    finally:
        for p in probes:
            if p.poll() is None:
                p.kill()
            p.wait()
        for log in logs:
            log.close()
    return {
        # Wall seconds with every probe training at once: what a worker process gets done per second here, whoever
        # else shares the cores (CPU seconds alone would count a core the workers do not get).
        "wall_step_seconds": sum(r["step_seconds"] for r in results) / len(results),
        "cpu_step_seconds": sum(r["cpu_step_seconds"] for r in results) / len(results),
        "evaluation_seconds": results[0]["evaluation_seconds"],
        "evaluation_wall_seconds": results[0]["evaluation_wall_seconds"],
        "probes": [{k: v for k, v in r.items() if k != "train_samples"} for r in results],
        "train_samples": results[0]["train_samples"],
    }


def planned_demand(exp: Experiment, train_samples: list[int], step: float, evaluation: float, budget: float) -> dict:
    """The plan for `budget` seconds (`fedat_sim.demand`, its own process: the core does not import the simulator)."""
    request = {
        "experiment": {"name": exp.name, "workers": exp.workers, "minutes": exp.minutes, "settings": exp.settings},
        "train_samples": train_samples,
        "step_seconds": step,
        "evaluation_seconds": evaluation,
        "budget_seconds": budget,
        "target": exp.calibrate,
    }
    r = subprocess.run(
        [sys.executable, "-m", "fedat_sim.demand"], input=json.dumps(request), capture_output=True, text=True
    )
    if r.returncode != 0:
        raise RuntimeError(f"the demand model failed: {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout)


def calibrate_experiment(
    exp: Experiment, env: dict[str, str], minutes: float, slowdown: float = 1.0, stretch: bool = False
) -> tuple[Experiment, dict]:
    """`exp` with the time scale planned for `minutes` on this machine, and how it was found; SystemExit saying why
    and what would work if no time scale fits. `slowdown` multiplies the measured costs (a slower machine's view).

    With `stretch` (the budget is the experiment's own, not one the user chose), a budget too short here becomes the
    shortest that works, said before anything starts; the record's `budget_minutes` is the budget planned."""
    if str(exp.settings.get("strategy", "fedat")) not in cal.TIER_LOOPS:
        raise ValueError(f"calibrate models tier loops ({sorted(cal.TIER_LOOPS)}), not {exp.settings['strategy']!r}")
    if not slowdown > 0:
        raise ValueError(f"the emulated slowdown must be > 0, got {slowdown}")
    print(
        f"[fedat] measuring this machine: {exp.workers} trainer probes at once (TensorFlow starts first) ...",
        flush=True,
    )
    probe = probe_machine(env, exp.workers)
    sizes = probe.pop("train_samples")
    cores = os.cpu_count() or 1
    step = probe["wall_step_seconds"] * slowdown
    # The evaluator takes the workers' cores only when they have none to spare.
    evaluation = probe["evaluation_seconds"] * slowdown if exp.workers >= cores else 0.0
    emulated = f", emulating a machine {slowdown:g}x slower" if slowdown != 1 else ""
    print(
        f"[fedat] this machine{emulated}: {step * 1e3:.2f} ms per training step in each of {exp.workers} workers "
        f"at once (CPU {probe['cpu_step_seconds'] * slowdown * 1e3:.2f} ms), "
        f"{probe['evaluation_seconds'] * slowdown:.2f} s per evaluation; planning {minutes:g} min ...",
        flush=True,
    )
    budget = minutes * 60.0
    planned = planned_demand(exp, sizes, step, evaluation, budget)
    asked = minutes
    if stretch and planned["refusal"] is not None and planned["refusal"]["minimum_minutes"] is not None:
        minutes = float(planned["refusal"]["minimum_minutes"])
        print(
            f"[fedat] {asked:g} min (the experiment's) is too short for {exp.name} on this machine: "
            f"{planned['refusal']['reason']}; planning {minutes:g} min instead, the shortest that works here "
            "(MINUTES=N, or --minutes N, chooses the budget) ...",
            flush=True,
        )
        budget = minutes * 60.0
        planned = planned_demand(exp, sizes, step, evaluation, budget)
    profile = config.latency(exp.env())
    record = {
        "target": exp.calibrate,
        "workers": exp.workers,
        "capacity_cores": cal.worker_capacity(exp.workers, cores),
        "slowdown": slowdown,
        "step_cost_seconds": step,
        "evaluation_seconds": evaluation,
        "probe": probe,
        "budget_minutes": minutes,
        "asked_minutes": asked,
        "late_limit": plan.LATE_LIMIT,
        "planned_late": plan.PLANNED_LATE,
        "early_share": plan.EARLY_SHARE,
        "reference_time_scale": profile.time_scale,
        "step_seconds": profile.step_seconds,  # unchanged: every latency is scaled through the time scale
        "closed_form": {"time_scale": planned["guess"]},
        "simulated": planned["trials"],
    }
    refusal = planned["refusal"]
    if refusal is not None:
        raise SystemExit(refused(exp.name, minutes, refusal["reason"], refusal["minimum_minutes"]))
    chosen = planned["plan"]
    time_scale = chosen["time_scale"]
    settings = {**exp.settings, "time_scale": time_scale}
    if chosen["profile_concurrency"] != planned["trials"][0]["profile_concurrency"]:
        settings["profile_concurrency"] = chosen["profile_concurrency"]
    record |= {
        "time_scale": time_scale,
        "factor": time_scale / profile.time_scale,
        "profile_concurrency": chosen["profile_concurrency"],
        "modelled": {k: chosen[k] for k in ("every_tier_at", "late_fraction", "busy")},
        "reason": chosen["reason"],
        "time_scale_changes": [],  # a run whose workers fall behind adds to it (`fedat.lab.pace`)
    }
    print(f"[fedat] time scale {time_scale:g} (the file's {profile.time_scale:g}): {chosen['reason']}", flush=True)
    return replace(exp, settings=settings), record


def refused(name: str, minutes: float, reason: str, minimum: int | None) -> str:
    """What `fedat run` says when it will not start: why, and what would work here."""
    if minimum is None:
        return (
            f"fedat run: no time scale works for {name} on this machine: {reason}. Give it more worker processes or "
            "a lighter experiment; nothing was started."
        )
    return (
        f"fedat run: {minutes:g} min is too short for {name} on this machine: {reason}. "
        f"The shortest budget that works here is {minimum} min: `make run MINUTES={minimum}` "
        f"(or `fedat run ... --minutes {minimum}`); nothing was started."
    )
