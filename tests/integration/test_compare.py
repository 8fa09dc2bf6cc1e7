"""`fedat compare` on the smoke subset produces both tables from real runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.broker, pytest.mark.tf, pytest.mark.slow, pytest.mark.alone]
ROOT = Path(__file__).resolve().parents[2]


def test_compare_runs_every_method_and_writes_both_tables(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedat.cli",
            "compare",
            str(ROOT / "experiments" / "compare-smoke.yaml"),
            "--minutes",  # the tables' plumbing, not the accuracies, is under test: the shortest run that evaluates
            "0.3",
            "--results",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (out,) = tmp_path.iterdir()
    md = (out / "compare.md").read_text()
    assert "Table 1" in md and "Table 2" in md
    assert "| fedat |" in md and "| fedavg |" in md
    assert (out / "fedat" / "summary.json").exists() and (out / "fedavg" / "summary.json").exists()
    assert (out / "compare_accuracy_vs_time.png").exists()
    (out / "compare.md").unlink()
    t = subprocess.run(
        [sys.executable, "-m", "fedat.cli", "tabulate", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert t.returncode == 0, t.stderr[-3000:]
    assert (out / "compare.md").read_text() == md == t.stdout  # the same tables, from compare.json alone
