"""`python -m fedat.ops.chaos`: SIGKILL services and restart the broker during a run, then prove nothing was lost.

On a private, throw-away RabbitMQ node (`fedat.ops.devbroker.PrivateBroker`) and a fresh vhost, every service runs
as a process as under `fedat run`. A seeded schedule (`schedule`) SIGKILLs the barrier, aggregator, profiler,
evaluator and workers at random moments (one profiler kill during the profiling pass) and restarts each with the
same environment and metrics port after a random 0-3 s pause; the broker is restarted a few times while the
services keep running (`disturb`). A capture (`fedat.ops.capture`) records every update, tier model, global model,
round report, evaluation and dead letter from the broker itself; at the end `fedat.ops.invariants.check` says
whether anything was lost or counted twice (`report`). Optionally an undisturbed baseline of the same length runs
on the same broker (fresh vhost), to compare the best accuracy. Writes `<results>/chaos-<time>/chaos.json` and
`chaos.md`; exits 1 on any violation.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from fedat.deploy.experiment import load_experiment
from fedat.ops.chaos.disturb import run_once
from fedat.ops.chaos.report import failures_of, markdown, summarize
from fedat.ops.chaos.schedule import make_schedule
from fedat.ops.devbroker import PrivateBroker


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, run the chaos run (and the baseline), write chaos.json and chaos.md, exit 1 on violations."""
    p = argparse.ArgumentParser(prog="python -m fedat.ops.chaos", description=__doc__.split("\n\n")[0])
    p.add_argument("--experiment", type=Path, default=Path("experiments/chaos.yaml"))
    p.add_argument("--minutes", type=float, default=3.0, help="length of the disturbed run (and of the baseline)")
    p.add_argument("--kills", type=int, default=8, help="SIGKILLs (>= 5 covers every kind of service)")
    p.add_argument("--broker-restarts", type=int, default=1)
    p.add_argument("--seed", type=int, default=0, help="seed of the schedule")
    p.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True, help="also run undisturbed")
    p.add_argument("--results", type=Path, default=Path("results"))
    args = p.parse_args(argv)
    exp = load_experiment(args.experiment)
    seconds = args.minutes * 60
    schedule = make_schedule(args.seed, seconds, args.kills, args.broker_restarts, exp.workers)
    out = args.results / f"chaos-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True)
    (out / "schedule.json").write_text(json.dumps([asdict(e) for e in schedule], indent=2))
    print(f"[chaos] results in {out}; schedule: " + ", ".join(f"{e.at:.0f}s {e.target}" for e in schedule))
    baseline = None
    started = time.time()
    with PrivateBroker() as broker:
        print(f"[chaos] private broker {broker.node} on 127.0.0.1:{broker.port}", flush=True)
        run = run_once(broker, exp, seconds, schedule, out / "disturbed", "chaos", say=_say)
        if args.baseline:
            baseline = run_once(broker, exp, seconds, [], out / "baseline", "baseline", say=_say)
    failures = failures_of(run)
    summary = summarize(args, exp, run, baseline, failures)
    summary["total_wall_seconds"] = round(time.time() - started, 1)
    (out / "chaos.json").write_text(json.dumps(summary, indent=2, default=str))
    md = markdown(summary)
    (out / "chaos.md").write_text(md)
    print(md)
    print(f"[chaos] wrote {out / 'chaos.json'} and {out / 'chaos.md'}")
    if failures:
        sys.exit(1)


def _say(text: str) -> None:
    print(text, flush=True)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
