"""`fedat compare --simulate`: every method of a comparison on several seeds in virtual time, a run per core.

Each finished run leaves its record (`fedat.lab.sweep`) under the summaries folder at once, and a record that exists
with at least these virtual minutes is not run again (checked again as each run starts, so a sweep skips what one
beside it filed meanwhile): a sweep stopped half-way resumes where it stopped. SIGTERM or
Ctrl-C stops a sweep: the runs in progress end early and file their shorter records, no further run starts, and a
record is never replaced by a shorter one.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import CancelledError, ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import TYPE_CHECKING

from fedat.deploy.experiment import Experiment
from fedat.lab import sweep
from fedat.lab.compare_run import load_comparison, simulation_plan

if TYPE_CHECKING:
    from fedat_sim import estimate
    from fedat_sim.estimate import Schedule


def _done(summaries: Path, name: str, minutes_for: Callable[[str], float]) -> set[tuple[str, int]]:
    """(method, seed) of the records already there for this comparison that ran at least the method's minutes (a
    longer run holds every shorter budget's run: `fedat.lab.sweep.truncated`)."""
    done = set()
    for path in (summaries / name).glob("*/seed-*.json"):
        rec = json.loads(path.read_text())
        if float(rec["virtual_minutes"]) >= minutes_for(rec["method"]) - 1e-9:
            done.add((rec["method"], int(rec["seed"])))
    return done


_stopping: Event | None = None  # in a pool process: the sweep's stop event


def _pool_process(stopping: Event) -> None:
    """Set up a pool process: Ctrl-C is the sweep's to handle; its stop event ends this process's run early."""
    global _stopping
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _stopping = stopping


def _stopped() -> bool:
    return _stopping is not None and _stopping.is_set()


PROGRESS_EVERY = 600.0  # wall seconds between a run's progress lines


def _duration(seconds: float) -> str:
    """A wall duration for people: '40 s', '12 min', '3 h 05 min'."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


class Progress:
    """Prints a run's virtual minutes done and, at its rate so far, the wall time it still needs; at most once per
    `every` wall seconds (machines of this kind differ 2× and more in speed, so a sweep's length is only known once
    it runs)."""

    def __init__(self, label: str, minutes: float, every: float, clock: Callable[[], float] = time.monotonic):
        self.label, self.minutes, self.every, self.clock = label, minutes, every, clock
        self.start = self.last = clock()

    def __call__(self, done: float) -> None:
        """Report `done` virtual minutes if `every` wall seconds have passed since the last report."""
        now = self.clock()
        if self.every <= 0 or now - self.last < self.every or done <= 0:
            return
        self.last = now
        spent = now - self.start
        left = spent * (self.minutes - done) / done
        print(
            f"[fedat compare --simulate] {self.label}: {done:.1f} of {self.minutes:g} virtual min after "
            f"{_duration(spent)}; about {_duration(left)} to go at this rate",
            flush=True,
        )


def run_one(
    path: Path,
    method: str,
    seed: int,
    minutes: float,
    results: Path,
    summaries: Path,
    progress_every: float = PROGRESS_EVERY,
    processes: int = 1,
) -> dict | None:
    """Simulate one (method, seed) of the comparison, training in `processes` processes, and file its record; return
    it (None: the sweep had stopped)."""
    if _stopped():
        return None  # queued before the sweep stopped: a run of a few virtual seconds would be no record at all
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    logging.basicConfig(level=logging.ERROR, format="%(name)s %(levelname)s: %(message)s")
    from fedat_sim.simulate import simulate, stop_on_sigterm

    name, _, targets, exps = load_comparison(path)
    if (rec := filed(summaries, name, method, seed, minutes)) is not None:
        print(f"[fedat compare --simulate] {method} seed {seed}: filed by another sweep meanwhile", flush=True)
        return rec
    methods = [e.name.removeprefix(f"{name}-") for e in exps]
    exp = exps[methods.index(method)]
    tag = f"{name}-{method}-seed{seed}-{time.strftime('%H%M%S')}"
    # SIGTERM to this process ends the run early: its record is then the shorter run's (and counts only for that)
    terminated = stop_on_sigterm()
    progress = Progress(f"{method} seed {seed}", minutes, progress_every)
    stop = lambda: terminated() or _stopped()  # noqa: E731
    summary = simulate(exp, results, minutes, seed, tag=tag, stop=stop, progress=progress, processes=processes)
    rec = sweep.make_record(Path(summary["run_dir"]), name, method, methods.index(method), targets)
    _file(sweep.record_path(summaries, name, method, seed), rec)
    return rec


def filed(summaries: Path, name: str, method: str, seed: int, minutes: float) -> dict | None:
    """The run's record if one at least `minutes` long is there: a sweep running beside this one may have filed it
    after this one was planned, and a run is not done twice."""
    out = sweep.record_path(summaries, name, method, seed)
    rec = json.loads(out.read_text()) if out.exists() else None
    return rec if rec is not None and float(rec["virtual_minutes"]) >= minutes - 1e-9 else None


def _file(out: Path, rec: dict) -> None:
    """Write `rec` at `out` unless a longer record of the run is there: that one holds it (`sweep.truncated`)."""
    if out.exists() and float(json.loads(out.read_text())["virtual_minutes"]) > float(rec["virtual_minutes"]):
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec, indent=1) + "\n")
    tmp.replace(out)  # a record is whole or absent, even if the sweep is killed while writing


def reuse(path: Path, summaries: Path, method: str, seed: int, minutes: float) -> dict | None:
    """File another comparison's run with this (method, seed)'s very settings as its record; None if there is none."""
    name, _, targets, exps = load_comparison(path)
    methods = [e.name.removeprefix(f"{name}-") for e in exps]
    i = methods.index(method)
    same = sweep.same_run(summaries, {**exps[i].settings, "seed": seed}, minutes)
    if same is None:
        return None
    rec = sweep.reused(same, name, method, i, targets)
    _file(sweep.record_path(summaries, name, method, seed), rec)
    return rec


def _pending(
    path: Path,
    summaries: Path,
    seeds: tuple[int, ...] | None,
    virtual_minutes: float | None,
    methods_only: tuple[str, ...],
) -> tuple[str, list[tuple[str, int, float]], dict[str, Experiment], float]:
    """The comparison's name, the (method, seed, virtual minutes) runs with no record that long, and each method's
    experiment, and the minutes a run gets unless its method names others. A run gets its method's minutes from the
    file's `simulate:` section, or `virtual_minutes` if given; the methods are those named, else the section's."""
    name, _, _, exps = load_comparison(path)
    plan = simulation_plan(path)
    common = plan.virtual_minutes if virtual_minutes is None else virtual_minutes
    minutes_for = plan.minutes_for if virtual_minutes is None else lambda _: common
    methods = [e.name.removeprefix(f"{name}-") for e in exps]
    if set(methods_only) - set(methods):
        raise ValueError(f"{path}: no method(s) {sorted(set(methods_only) - set(methods))}; methods: {methods}")
    # Methods named on the command line run even where the file's plan leaves them out.
    chosen = [m for m in methods if m in methods_only or (not methods_only and plan.swept(m))]
    todo = sweep.pending(chosen, seeds or plan.seeds, plan.single_seed, _done(summaries, name, minutes_for))
    return name, [(m, s, minutes_for(m)) for m, s in todo], dict(zip(methods, exps, strict=True)), common


def _budgets(todo: Sequence[tuple[str, int, float]], common: float) -> str:
    """'1 run of 30 virtual min', '5 runs of 30–60 virtual min' ('0 runs of `common` virtual min')."""
    low, high = min((t[2] for t in todo), default=common), max((t[2] for t in todo), default=common)
    runs = f"{len(todo)} run{'' if len(todo) == 1 else 's'}"
    return f"{runs} of {low:g}{f'–{high:g}' if high > low else ''} virtual min"


Run = tuple[str, int, float, "estimate.Costs"]  # method, seed, virtual minutes, and what a step costs here


def _schedules(by_method: dict[str, Experiment], runs: list[Run], jobs: int) -> Iterator[tuple[Run, Schedule]]:
    """(run, its schedule) for each (method, seed, minutes, costs) run as it is counted, `jobs` at once."""
    from fedat_sim import estimate

    def args(run: Run) -> tuple[Experiment, int, float, float]:
        method, seed, minutes, costs = run
        return by_method[method], seed, minutes, costs.step

    if jobs <= 1 or len(runs) <= 1:  # a process of its own would cost more than it saves
        yield from ((r, estimate.schedule(*args(r))) for r in runs)
        return
    # each schedule is a simulation of its own: as many at once as the sweep would run
    with ProcessPoolExecutor(min(jobs, len(runs)), mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(estimate.schedule, *args(r)): r for r in runs}
        yield from ((futures[f], f.result()) for f in as_completed(futures))


def estimate_simulated(
    path: Path,
    summaries: Path,
    seeds: tuple[int, ...] | None = None,
    jobs: int = 2,
    virtual_minutes: float | None = None,
    methods_only: tuple[str, ...] = (),
    processes: int = 1,
) -> str:
    """What the comparison's missing runs will cost here (`fedat_sim.estimate`), as a Markdown table; runs nothing.
    The wall time assumes `jobs` runs at once, each training in `processes` processes."""
    from fedat_sim import estimate

    name, todo, by_method, common = _pending(path, summaries, seeds, virtual_minutes, methods_only)
    at_once = max(1, min(jobs, len(todo)))
    cores = min(os.cpu_count() or 1, at_once * max(1, processes))  # what the sweep will keep busy side by side
    costs: dict[tuple[str, ...], estimate.Costs] = {}
    rows, total = {}, 0.0
    counted: list[Run] = []
    for m, s, minutes in todo:
        exp = by_method[m]
        if sweep.same_run(summaries, {**exp.settings, "seed": s}, minutes) is not None:
            rows[(m, s)] = f"| {m} | {s} | {minutes:g} | the same run as another comparison's record | | | none |"
            continue
        workload = estimate.workload_key(exp)
        if workload not in costs:
            costs[workload] = estimate.probe(exp, cores)
        counted.append((m, s, minutes, costs[workload]))
    for (m, s, minutes, c), sched in _schedules(by_method, counted, jobs):
        cpu = estimate.cpu_seconds(sched, c)
        total += cpu
        counts = f"{sched.trainings:,} | {sched.steps:,} | {sched.evaluations}"
        rows[(m, s)] = f"| {m} | {s} | {minutes:g} | {counts} | {_duration(cpu)} |"
        print(f"[fedat compare --simulate --estimate] {m} seed {s}: {_duration(cpu)} of CPU", flush=True)
    probed = "; ".join(
        f"a mini-batch step {c.step * 1e3:.2f} ms, an evaluation {c.evaluation:.2f} s" for c in costs.values()
    )
    head = (
        f"{name}: {_budgets(todo, common)} to do on {sweep.this_cpu()}"
        + (f" (CPU here: {probed})" if probed else "")
        + "\n\n| method | seed | virtual min | trainings | mini-batch steps | evaluations | CPU |\n"
        + "|---|---:|---:|---:|---:|---:|---:|\n"
    )
    each = "each on a core of its own" if processes <= 1 else f"each training in {processes} processes"
    foot = (
        f"\n| **all** | | | | | | **{_duration(total)}** |\n\n{at_once} at a time, {each}: at least "
        f"{_duration(total / cores)} of wall time on {cores} core{'s' if cores > 1 else ''}, timed {cores} at once "
        "(the services' own work, a few per cent, is not counted)."
    )
    return head + "\n".join(rows[(m, s)] for m, s, _ in todo) + foot


def compare_simulated(
    path: Path,
    results: Path,
    summaries: Path,
    seeds: tuple[int, ...] | None = None,
    jobs: int = 2,
    virtual_minutes: float | None = None,
    methods_only: tuple[str, ...] = (),
    progress_every: float = PROGRESS_EVERY,
    processes: int = 1,
) -> str:
    """Run the comparison's missing (method, seed) runs, `jobs` at a time, each training in `processes` processes;
    write and return its tables."""
    name, todo, _, common = _pending(path, summaries, seeds, virtual_minutes, methods_only)
    for m, s, minutes in list(todo):
        if (rec := reuse(path, summaries, m, s, minutes)) is not None:
            todo.remove((m, s, minutes))
            print(f"[fedat compare --simulate] {m} seed {s}: the same run as {rec['reused_from']}", flush=True)
    print(f"[fedat compare --simulate] {name}: {_budgets(todo, common)}, {jobs} at a time", flush=True)
    results.mkdir(parents=True, exist_ok=True)
    # spawn, one run per process: TensorFlow is not fork-safe, and a fresh process frees a run's memory
    ctx = get_context("spawn")
    stopping = ctx.Event()
    with ProcessPoolExecutor(
        jobs, mp_context=ctx, max_tasks_per_child=1, initializer=_pool_process, initargs=(stopping,)
    ) as pool:
        futures = {
            pool.submit(run_one, path, m, s, minutes, results, summaries, progress_every, processes): (m, s, minutes)
            for m, s, minutes in todo
        }

        received: list[int] = []

        def stop(signum: int, frame: object) -> None:
            # no print here: the handler may interrupt a print of the loop's, and stdout is not re-entrant
            received.append(signum)
            stopping.set()
            for f in futures:
                f.cancel()

        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        unstarted, announced = 0, False
        try:
            for f in as_completed(futures):
                if received and not announced:
                    announced = True
                    print(
                        f"[fedat compare --simulate] {signal.Signals(received[0]).name}: the runs in progress end "
                        "early and file their records; no other run starts",
                        flush=True,
                    )
                m, s, minutes = futures[f]
                try:
                    rec = f.result()
                except CancelledError:
                    rec = None
                if rec is None:
                    unstarted += 1
                else:
                    print(f"[fedat compare --simulate] {m} seed {s}: {_line(rec, minutes)}", flush=True)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    if unstarted:
        print(f"[fedat compare --simulate] stopped: {unstarted} runs not started", flush=True)
    md = f"# {name}, simulated\n\n" + sweep.render(sweep.load_records(summaries), only=name, minutes=common)
    (results / f"{name}-sim.md").write_text(md + "\n")
    return md


def _line(rec: dict, minutes: float) -> str:
    sm = rec["summary"]
    ran = float(rec["virtual_minutes"])
    return (
        f"best {sm['best_accuracy']}, rounds {sm['tier_rounds']}, {sm['client_trainings']} trainings in "
        f"{sm['wall_seconds']:.0f} s"
        + (f", stopped at {ran:g} of {minutes:g} virtual min" if ran < minutes - 1e-9 else "")
        + (f", FAILED {sm['failure']}" if sm["failure"] else "")
    )


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, run the sweep, print its tables."""
    p = argparse.ArgumentParser(prog="fedat compare --simulate", description=__doc__)
    p.add_argument("comparison", type=Path)
    p.add_argument("--seeds", default=None, help="comma-separated seeds (default: the file's simulate.seeds)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="runs at once (default: one per core)")
    p.add_argument("--virtual-minutes", type=float, default=None, help="per run (default: simulate.virtual_minutes)")
    p.add_argument("--methods", default="", help="comma-separated: only these methods")
    p.add_argument("--results", type=Path, default=Path("results"), help="run folders (not committed)")
    p.add_argument("--summaries", type=Path, default=Path("docs/summaries/sim"), help="one record per run (committed)")
    p.add_argument(
        "--estimate",
        action="store_true",
        help="run nothing: count what each missing run trains and scores, time that here, print the CPU it takes",
    )
    p.add_argument(
        "--progress-every",
        type=float,
        default=PROGRESS_EVERY,
        metavar="SECONDS",
        help=f"wall seconds between a run's progress lines (default {PROGRESS_EVERY:g}; 0: none)",
    )
    p.add_argument(
        "--processes",
        type=int,
        default=1,
        help="processes each run trains its clients in (the same run on more cores; needs a nominal step_seconds); "
        "a sweep uses jobs x processes cores",
    )
    args = p.parse_args(argv)
    seeds = tuple(int(s) for s in args.seeds.split(",")) if args.seeds else None
    only = tuple(m for m in args.methods.split(",") if m)
    try:
        if args.estimate:
            print(
                estimate_simulated(
                    args.comparison, args.summaries, seeds, args.jobs, args.virtual_minutes, only, args.processes
                )
            )
            return
        md = compare_simulated(
            args.comparison,
            args.results,
            args.summaries,
            seeds,
            args.jobs,
            args.virtual_minutes,
            only,
            args.progress_every,
            args.processes,
        )
    except (OSError, ValueError) as exc:
        sys.exit(f"fedat compare --simulate: {exc}")
    print(md)


if __name__ == "__main__":
    main()
