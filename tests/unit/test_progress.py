"""What `fedat run` prints: the progress line and its rhythm, the end table, the refusal, the falling-behind note."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedat.deploy.experiment import load_experiment
from fedat.lab import calibration
from fedat.lab import progress as pr
from fedat.lab.calibration import calibrate_experiment, refused


def test_a_short_run_prints_about_a_dozen_lines_and_a_long_one_a_line_a_minute_at_most():
    assert 120 / pr.progress_every(120) == 12
    assert pr.progress_every(600) == 30 and pr.progress_every(3600) == 60
    assert all(pr.progress_every(b) <= pr.progress_every(b + 60) for b in range(60, 7200, 60))


def test_the_progress_line_says_where_the_run_is():
    line = pr.progress_line(40.2, 120, 37, (12, 8, 7, 6, 4), 100, 100, 0.5123, 3, 251)
    for part in ("0:40 / 2:00", "version   37", "rounds per tier 12 8 7 6 4", "tiered 100/100", "accuracy 0.512"):
        assert part in line, (part, line)
    assert line.endswith("late 1% (3 of 251)")
    start = pr.progress_line(10, 600, 0, (), 0, 100, None, 0, 0)
    assert "rounds per tier -" in start and "tiered 0/100" in start and "accuracy -" in start
    assert start.endswith("late -")
    assert "tiered ?/100" in pr.progress_line(10, 600, 0, (), None, 100, float("nan"), 0, 0)


def test_clients_tiered_are_the_profilers_tier_sizes():
    text = "\n".join(
        [
            "# TYPE fedat_tier_clients gauge",
            'fedat_tier_clients{tier="1"} 19.0',
            'fedat_tier_clients{tier="2"} 21.0',
            "fedat_tier_assignments_total 2.0",
        ]
    )
    assert pr.tiered_clients(text) == 40 and pr.tiered_clients("") == 0


def test_keeping_up_waits_for_enough_updates():
    assert pr.keeping_up(5, 20) is None
    assert pr.keeping_up(3, 30) is True and pr.keeping_up(4, 30) is False
    assert "4 of 30" in pr.falling_behind(4, 30) and "limit 10%" in pr.falling_behind(4, 30)


def summary(**kw) -> dict:
    base = {
        "run_dir": "results/x",
        "wall_seconds": 130.0,
        "client_updates": 250,
        "late_updates": 5,
        "global_updates": 40,
        "tier_rounds": [12, 9, 7, 6, 6],
        "best_accuracy": 0.612,
        "best_version": 38,
        "final_accuracy": 0.58,
        "first_accuracy": 0.1,
        "evaluations": 8,
        "latency_model": {"time_scale": 0.0267},
        "calibration": {"reference_time_scale": 0.1, "reason": "the smallest time scale at which ..."},
        "worker_utilisation": {"mean": 0.71, "training_mean": 0.66},
        "load_average": [1.0, 1.1, 1.2],
    }
    return {**base, **kw}


def test_the_end_table_has_the_headline_numbers_and_where_the_plots_are():
    table = pr.end_table(summary(), ["accuracy_vs_bytes.png", "accuracy_vs_time.png"])
    for part in (
        "results/x",
        "0.0267 (the file's 0.1)",
        "the smallest time scale at which",
        "250, late 2% (5 of 250)",
        "40, rounds per tier 12 9 7 6 6",
        "best 0.612 (version 38), last 0.580, from 0.100",
        "workers busy",
        "accuracy_vs_time.png",
    ):
        assert part in table, (part, table)
    assert all(line.startswith("[fedat] ") for line in table.splitlines())
    bare = pr.end_table(summary(calibration=None, worker_utilisation=None, best_accuracy=None), [])
    assert "chosen as" not in bare and "workers busy" not in bare and "accuracy" not in bare.replace("files", "")


def test_a_refusal_names_the_shortest_budget_and_how_to_ask_for_it():
    text = refused("fmnist2-fedat", 2, "the workers keep up only from time scale 0.3", 9)
    assert "2 min is too short" in text and "make run MINUTES=9" in text and "--minutes 9" in text
    assert "nothing was started" in text
    assert "no time scale works" in refused("x", 10, "the workers cannot keep up", None)


def _slow_machine(monkeypatch, minimum: int) -> list[float]:
    """A probe and a demand model (stand-ins: the planner has its own tests) for a machine too slow for 10 minutes."""
    budgets: list[float] = []

    def planned(exp, sizes, step, evaluation, budget):
        budgets.append(budget)
        trials = [{"profile_concurrency": 32}]
        if budget < minimum * 60:
            return {
                "guess": 0.3,
                "trials": trials,
                "plan": None,
                "refusal": {"reason": "the workers keep up only from time scale 0.45", "minimum_minutes": minimum},
            }
        plan = {
            "time_scale": 0.45,
            "profile_concurrency": 32,
            "every_tier_at": 150.0,
            "late_fraction": 0.03,
            "busy": 0.8,
            "reason": "the smallest time scale at which the workers keep up",
        }
        return {"guess": 0.3, "trials": trials, "plan": plan, "refusal": None}

    probe = {
        "train_samples": [480] * 100,
        "wall_step_seconds": 0.028,
        "cpu_step_seconds": 0.02,
        "evaluation_seconds": 3.0,
    }
    monkeypatch.setattr(calibration, "probe_machine", lambda env, workers: dict(probe))
    monkeypatch.setattr(calibration, "planned_demand", planned)
    return budgets


def test_the_experiments_own_budget_grows_to_the_shortest_that_works_and_says_so(monkeypatch, capsys):
    exp = load_experiment(Path(__file__).resolve().parents[2] / "experiments" / "fmnist2-fedat.yaml")
    budgets = _slow_machine(monkeypatch, 13)
    planned, record = calibrate_experiment(exp, {}, exp.minutes, stretch=True)
    assert budgets == [exp.minutes * 60, 13 * 60]
    assert record["asked_minutes"] == exp.minutes and record["budget_minutes"] == 13
    assert planned.settings["time_scale"] == 0.45
    said = capsys.readouterr().out
    assert f"{exp.minutes:g} min (the experiment's) is too short" in said and "planning 13 min instead" in said
    # a budget the user chose is refused instead, naming the same minimum, and nothing is planned beyond it
    budgets.clear()
    with pytest.raises(SystemExit, match="make run MINUTES=13"):
        calibrate_experiment(exp, {}, 2.0)
    assert budgets == [120.0]
