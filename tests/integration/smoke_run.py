"""`make run` in small: smoke.yaml calibrated to a modelled 90 % worker load, and what a finished run must show.

The probe and the virtual-time demand pick the time scale (`fedat.lab.calibrate`); the run goes end to end through
`fedat run`, the real RabbitMQ and two TensorFlow workers. `test_observability` runs it under Prometheus and checks
both the live metrics and, with `check_calibrated_run`, the finished run.
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def calibrated_smoke(folder: Path) -> Path:
    """Write smoke.yaml with `calibrate: 0.9` into `folder`; its path."""
    text = (ROOT / "experiments" / "smoke.yaml").read_text().replace("minutes: 1\n", "minutes: 1\ncalibrate: 0.9\n")
    assert "calibrate: 0.9" in text
    path = folder / "smoke-calibrated.yaml"
    path.write_text(text)
    return path


def check_calibrated_run(run: Path, output: str) -> None:
    """The run rescaled its latency model, reports worker utilisation, learned, and left a complete folder."""
    summary = json.loads((run / "summary.json").read_text())
    meta = json.loads((run / "experiment.json").read_text())
    assert summary["failure"] is None, summary
    cal = summary["calibration"]
    assert cal == meta["calibration"] and cal["target"] == 0.9 and cal["reference_time_scale"] == 0.1
    assert cal["step_cost_seconds"] > 0 and len(cal["probe"]["probes"]) == 2 and cal["simulated"]
    # the services ran with the calibrated time scale; the nominal step cost, hence the tiers' ratios, is the file's
    assert meta["settings"]["time_scale"] == round(cal["time_scale"], 6) != 0.1
    assert summary["latency_model"]["time_scale"] == meta["settings"]["time_scale"]
    assert "step_seconds" not in meta["settings"] and cal["step_seconds"] == 0.0  # smoke.yaml: measured times
    u = summary["worker_utilisation"]
    # measured from the last time scale change, if any: the pace changes it early enough for a window to follow
    assert set(u["per_worker"]) == {"worker-0", "worker-1"} and u["window_seconds"] > 10, (u, cal)
    assert all(0 < x < 1.5 for x in u["per_worker"].values()), u  # CPU seconds per second of one process
    assert 0 < u["training_mean"] <= 1.05, u
    assert "workers busy" in output
    # it learns, every tier takes part, and the results folder is complete
    assert summary["global_updates"] >= 10, summary
    # 10 classes, chance 0.1: it learns when it ends well above its first evaluation (a loaded machine's 1.5 min
    # run reached 0.31 from 0.10; an unloaded one goes past 0.35; a model that does not learn stays near 0.1)
    assert summary["best_accuracy"] > max(0.25, summary["first_accuracy"] + 0.15), summary
    assert all(n > 0 for n in summary["tier_rounds"]), summary
    lines = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    assert sum(e["event"] == "global" and e["version"] > 0 for e in lines) == summary["global_updates"]
    assert (run / "accuracy_vs_time.png").stat().st_size > 0 and (run / "accuracy_vs_bytes.png").stat().st_size > 0
