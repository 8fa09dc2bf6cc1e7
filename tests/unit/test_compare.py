"""The comparison tables, from hand-made summaries and curves."""

from __future__ import annotations

from fedat.lab.compare import MethodResult, accuracy_table, first_reaching, tail_mean, traffic_table

FEDAT = MethodResult(
    "fedat",
    {"best_accuracy": 0.8, "best_accuracy_variance": 0.01, "late_fraction": 0.05},
    [(10.0, 0.4, 1_000_000, 2_000_000), (20.0, 0.6, 3_000_000, 4_000_000)],
)
FEDAVG = MethodResult(
    "fedavg",
    {"best_accuracy": 0.5, "best_accuracy_variance": 0.02, "late_fraction": 0.5},
    [(30.0, 0.5, 5_000_000, 5_000_000)],
)


def test_first_reaching_takes_the_first_evaluation_at_or_above_the_target():
    assert first_reaching(FEDAT.curve, 0.6) == (20.0, 7_000_000)
    assert first_reaching(FEDAT.curve, 0.4) == (10.0, 3_000_000)
    assert first_reaching(FEDAT.curve, 0.9) is None


def test_accuracy_table_normalises_variance_and_flags_overloaded_runs():
    table = accuracy_table([FEDAT, FEDAVG], budget_seconds=24.0)
    assert "| fedat | 0.800 | 0.600 | 2 | 1.00 | 0.05 |" in table  # last quarter of 24 s: the evaluation at 20 s
    assert "| fedavg | 0.500 | 0.500 | 1 | 2.00 | 0.50 ⚠ workers could not keep up |" in table
    assert "improvement over the best baseline: +60.00 %" in table


def test_tail_mean_averages_the_evaluations_of_the_last_quarter():
    curve = [(t, acc, 0, 0) for t, acc in [(10.0, 0.9), (80.0, 0.4), (90.0, 0.6), (100.0, 0.8)]]
    assert tail_mean(curve, 100.0) == 0.6
    assert tail_mean(curve, 400.0) is None


def test_traffic_table_shows_megabytes_seconds_and_ratio_or_a_dash():
    table = traffic_table([FEDAT, FEDAVG], [0.5, 0.6])
    assert "| fedat | 7.0 | 20 | 1.00× | 7.0 | 20 | 1.00× |" in table
    assert "| fedavg | 10.0 | 30 | 1.50× | — | — | — |" in table
