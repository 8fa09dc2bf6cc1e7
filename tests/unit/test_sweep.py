"""Sweep records and the multi-seed tables rebuilt from them alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedat.lab import sweep
from fedat.lab.compare_run import simulation_plan


def run_folder(tmp: Path, seed: int, best: float, weights: list[list[float]]) -> Path:
    """A minimal results folder as `fedat simulate` writes it."""
    run = tmp / f"run-{seed}-{best}"
    run.mkdir()
    settings = {"strategy": "fedat", "seed": seed}
    (run / "experiment.json").write_text(json.dumps({"settings": settings, "simulated": {"virtual_minutes": 2.0}}))
    summary = {"seed": seed, "best_accuracy": best, "best_accuracy_variance": 0.01 * (seed + 1), "tier_rounds": [6, 2]}
    (run / "summary.json").write_text(json.dumps({**summary, "wall_seconds": 30.0, "events": "not kept"}))
    lines = [{"event": "global", "time": 1.0, "tier_weights": w} for w in weights]
    lines += [
        {
            "event": "evaluation",
            "time": 60.0,
            "version": 1,
            "accuracy": best - 0.2,
            "bytes_up": 1_000_000,
            "bytes_down": 2_000_000,
        },
        {
            "event": "evaluation",
            "time": 110.0,
            "version": 2,
            "accuracy": best,
            "bytes_up": 3_000_000,
            "bytes_down": 4_000_000,
        },
    ]
    (run / "events.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run


def save(root: Path, rec: dict) -> None:
    path = sweep.record_path(root, rec["comparison"], rec["method"], rec["seed"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec))


def test_a_record_keeps_headline_numbers_curve_and_mean_tier_weights_but_not_the_events(tmp_path):
    rec = sweep.make_record(run_folder(tmp_path, 3, 0.8, [[1.0, 0.0], [0.5, 0.5]]), "cmp", "fedat", 2, [0.6])
    assert rec["seed"] == 3 and rec["order"] == 2 and rec["targets"] == [0.6] and rec["virtual_minutes"] == 2.0
    assert rec["summary"]["best_accuracy"] == 0.8 and "events" not in rec["summary"]
    assert rec["mean_tier_weights"] == [0.75, 0.25]
    assert rec["curve"] == [[60.0, 0.6, 1_000_000, 2_000_000], [110.0, 0.8, 3_000_000, 4_000_000]]


def test_tables_give_mean_and_spread_over_seeds_in_the_comparison_files_order(tmp_path):
    root = tmp_path / "sums"
    for seed, best in [(0, 0.8), (1, 0.9)]:
        save(root, sweep.make_record(run_folder(tmp_path, seed, best, [[0.5, 0.5]]), "cmp", "fedat", 0, [0.65, 0.75]))
    save(root, sweep.make_record(run_folder(tmp_path, 0, 0.7, [[1.0, 0.0]]), "cmp", "fedavg", 1, [0.65, 0.75]))
    records = sweep.load_records(root)
    assert list(records["cmp"]) == ["fedat", "fedavg"]  # file order, not alphabetical
    md = sweep.render(records)
    # last-quarter rise: the evaluation at 110 s (last quarter of 120 s) minus the one at 60 s (the quarter before)
    row = "| fedat | 0,1 | 0.850 ± 0.071 | 0.850 ± 0.071 | +0.200 ± 0.000 | 1.00 ± 0.47 | [6, 2] | [0.5, 0.5] | 1 |"
    assert row in md
    assert "| fedavg | 0 | 0.700 | 0.700 | +0.200 | 0.67 | [6, 2] | [1.0, 0.0] | 0 |" in md
    # paired on the same seed: fedavg seed 0 against fedat seed 0 only
    assert "| fedavg | 0 | -0.100 | -0.100 | 0/1 |" in md and "| fedat | 0,1 | +" not in md
    # 0.65: seed 1 at 60 s with 3 MB, seed 0 at 110 s with 7 MB; 0.75: both at 110 s; fedavg never reaches 0.75
    assert "| fedat | 5 ± 3 | 85 ± 35 | 7 ± 0 | 110 ± 0 |" in md
    assert "| fedavg | 7 | 110 | — (0/1) | — |" in md


def test_the_first_minutes_of_a_longer_run_give_the_shorter_budgets_record(tmp_path):
    run = run_folder(tmp_path, 0, 0.8, [])
    lines = [
        {"event": "global", "time": 5.0, "tier_counts": [1, 0], "tier_weights": [1.0, 0.0]},
        {
            "event": "evaluation",
            "time": 30.0,
            "accuracy": 0.5,
            "variance": 0.2,
            "version": 1,
            "bytes_up": 1,
            "bytes_down": 2,
        },
        {"event": "global", "time": 40.0, "tier_counts": [1, 1], "tier_weights": [0.5, 0.5]},
        {
            "event": "evaluation",
            "time": 60.0,
            "accuracy": 0.4,
            "variance": 0.3,
            "version": 2,
            "bytes_up": 3,
            "bytes_down": 4,
        },
        {"event": "global", "time": 70.0, "tier_counts": [2, 1], "tier_weights": [0.0, 1.0]},
        {
            "event": "evaluation",
            "time": 90.0,
            "accuracy": 0.9,
            "variance": 0.1,
            "version": 3,
            "bytes_up": 5,
            "bytes_down": 6,
        },
    ]
    (run / "events.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    rec = sweep.make_record(run, "cmp", "fedat")
    assert rec["mean_tier_weights"] == [0.5, 0.5] and rec["virtual_minutes"] == 2.0
    cut = sweep.truncated(rec, 1.0)  # the evaluations at 30 and 60 s
    assert cut["curve"] == [[30.0, 0.5, 1, 2], [60.0, 0.4, 3, 4]] and cut["truncated_from"] == 2.0
    sm = cut["summary"]
    assert (sm["best_accuracy"], sm["best_version"], sm["best_accuracy_variance"]) == (0.5, 1, 0.2)
    assert (sm["final_accuracy"], sm["tier_rounds"], sm["global_updates"], sm["bytes_up"]) == (0.4, [1, 1], 2, 3)
    assert cut["mean_tier_weights"] == [0.75, 0.25] and sweep.truncated(rec, 2.0) is rec
    rec["summary"]["cpu_seconds"] = 1200.0  # the whole 2-minute run's; a 1-minute cut is charged half of it

    def compute(r: dict) -> str:
        return sweep.seed_accuracy_table({"fedat": [r]}).splitlines()[2].rsplit("|", 2)[1].strip()

    assert (compute(sweep.truncated(rec, 1.0)), compute(rec)) == ("10", "20")
    with pytest.raises(ValueError, match="ran 2 min, not 3"):
        sweep.truncated(rec, 3.0)
    budget, methods = sweep.at_budget({"fedat": [rec, {**rec, "seed": 1, "virtual_minutes": 0.5}]}, None)
    assert budget == 0.5 and [r["seed"] for r in methods["fedat"]] == [0, 1]
    budget, methods = sweep.at_budget({"fedat": [rec, {**rec, "seed": 1, "virtual_minutes": 0.5}]}, 1.0)
    assert [r["seed"] for r in methods["fedat"]] == [0]  # the half-minute run cannot stand for a minute


def test_pending_skips_done_runs_and_runs_single_seed_methods_on_the_first_seed_only():
    todo = sweep.pending(["fedat", "fedbuff"], [0, 1], ["fedbuff"], {("fedat", 0)})
    assert todo == [("fedbuff", 0), ("fedat", 1)]


def test_a_run_with_the_same_settings_and_seed_elsewhere_is_filed_again_not_rerun_and_costs_nothing_twice(tmp_path):
    root = tmp_path / "sums"
    rec = sweep.make_record(run_folder(tmp_path, 0, 0.8, [[1.0, 0.0]]), "main", "fedat", 0, [0.6])
    rec["summary"]["wall_seconds"] = 600.0
    save(root, rec)
    settings = {"strategy": "fedat", "seed": 0}
    assert sweep.same_run(root, settings, 2.0)["method"] == "fedat"
    assert sweep.same_run(root, {**settings, "seed": 1}, 2.0) is None  # another seed is another run
    assert sweep.same_run(root, {**settings, "precision": 3}, 2.0) is None
    assert sweep.same_run(root, settings, 2.5) is None  # too short for the budget asked
    copy = sweep.reused(rec, "participation", "fedat-k10", 3, [0.7])
    assert (copy["comparison"], copy["method"], copy["order"], copy["targets"]) == (
        "participation",
        "fedat-k10",
        3,
        [0.7],
    )
    assert copy["reused_from"] == "main/fedat/seed-0" and copy["curve"] == rec["curve"]
    save(root, copy)
    assert sweep.same_run(root, settings, 2.0)["comparison"] == "main"  # always the original, never a copy
    table = sweep.seed_accuracy_table({"fedat-k10": [copy]}, "fedat-k10")
    assert "| fedat-k10 | 0* |" in table and table.splitlines()[2].endswith("| 0 |")  # its 10 min counted in main
    assert "fedat-k10 seed 0 is main/fedat/seed-0" in table


def test_a_budget_that_only_reused_runs_reach_gets_no_table_of_its_own(tmp_path):
    root = tmp_path / "sums"
    long = sweep.make_record(run_folder(tmp_path, 0, 0.8, [[1.0, 0.0]]), "main", "fedat", 0, [0.6])
    save(root, long)
    save(root, sweep.reused(long, "precision", "fedat", 0, [0.6]))  # 2 min, reused
    own = sweep.make_record(run_folder(tmp_path, 1, 0.7, [[1.0, 0.0]]), "precision", "p3", 1, [0.6])
    save(root, {**sweep.truncated(own, 1.0), "seed": 0})  # the comparison's own run, 1 min
    md = sweep.render(sweep.load_records(root))
    assert "### main (2 virtual min per run)" in md and "### precision (1 virtual min per run)" in md
    assert "### precision (2 virtual min per run)" not in md  # it would hold the reused run alone
    assert "| fedat | 0* |" in md.split("### precision (1 virtual min per run)")[1]


def test_a_record_of_another_schema_is_refused_by_name(tmp_path):
    path = sweep.record_path(tmp_path, "cmp", "fedat", 0)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"schema": 99}))
    with pytest.raises(ValueError, match="seed-0.json: record schema 99"):
        sweep.load_records(tmp_path)


def test_the_simulate_section_of_a_comparison_file_is_read_and_checked(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("name: b\nminutes: 3\nsettings: {seed: 7}\n")
    cmp = tmp_path / "cmp.yaml"
    cmp.write_text("name: c\nbase: base.yaml\nmethods: {fedat: {}, fedbuff: {strategy: fedbuff}}\n")
    assert simulation_plan(cmp) == sweep_plan(3.0, (7,), ())
    cmp.write_text(cmp.read_text() + "simulate: {virtual_minutes: 40, seeds: [0, 1, 2], single_seed: [fedbuff]}\n")
    assert simulation_plan(cmp) == sweep_plan(40.0, (0, 1, 2), ("fedbuff",))
    longer = cmp.read_text().replace("single_seed", "method_minutes: {fedat: 90}, single_seed")
    cmp.write_text(longer)
    plan = simulation_plan(cmp)
    assert plan.minutes_for("fedat") == 90.0 and plan.minutes_for("fedbuff") == 40.0
    for wrong, match in (("{fedat: 0}", "positive"), ("{fedat: x}", "positive"), ("{fedatt: 9}", "known methods")):
        cmp.write_text(longer.replace("{fedat: 90}", wrong))
        with pytest.raises(ValueError, match=match):
            simulation_plan(cmp)
    cmp.write_text(longer.replace("[fedbuff]", "[fedbuf]"))
    with pytest.raises(ValueError, match="unknown method"):
        simulation_plan(cmp)
    assert plan.swept("fedbuff") and plan.methods == ()  # no list: every method
    cmp.write_text(longer.replace("single_seed", "methods: [fedat], single_seed"))
    plan = simulation_plan(cmp)
    assert plan.swept("fedat") and not plan.swept("fedbuff")
    cmp.write_text(longer.replace("single_seed", "methods: [fedatt], single_seed"))
    with pytest.raises(ValueError, match=r"simulate.methods names unknown method\(s\) \['fedatt'\]"):
        simulation_plan(cmp)


def sweep_plan(minutes: float, seeds: tuple[int, ...], single: tuple[str, ...]):
    from fedat.lab.compare_run import SimulationPlan

    return SimulationPlan(minutes, seeds, single)


def test_fedat_tabulate_sweeps_rebuilds_the_report_beside_its_file_and_prints_tables_without_one(tmp_path, capsys):
    from fedat.cli import main
    from fedat.lab import report

    root = tmp_path / "sums"
    save(root, sweep.make_record(run_folder(tmp_path, 0, 0.8, [[0.5, 0.5]]), "cmp", "fedat", 0, [0.65]))
    md = tmp_path / "docs" / "results.md"
    md.parent.mkdir()
    begin, end = report.BLOCK.format(name="comparisons"), report.END.format(name="comparisons")
    md.write_text(f"# Results\n{begin}\nstale\n{end}\nkept\n")
    main(["tabulate", "--sweeps", str(root), "--into", str(md)])
    text = md.read_text()
    assert "stale" not in text and "[cmp](report/cmp.md)" in text and "kept\n" in text
    assert "| fedat | 0 | 0.800 |" in (md.parent / "report" / "cmp.md").read_text()
    assert (md.parent / "report" / "figures" / "cmp.png").stat().st_size > 1000
    main(["tabulate", "--sweeps", str(root)])
    assert "| fedat | 0 | 0.800 |" in capsys.readouterr().out


def band_record(seed: int, minutes: float, curve: list[tuple[float, float]]) -> dict:
    """A record with just what the seed band reads."""
    return {"seed": seed, "virtual_minutes": minutes, "curve": [[t, a, 0, 0] for t, a in curve]}


def test_the_seed_band_holds_each_curve_smooths_it_and_counts_only_seeds_that_ran_that_far():
    short = band_record(0, 1.0, [(0.0, 0.1), (20.0, 0.5), (50.0, 0.7)])
    long = band_record(1, 2.0, [(0.0, 0.1), (40.0, 0.3), (100.0, 0.9)])
    times, mean, lo, hi, n = sweep.seed_band([short, long], step=30.0, window=60.0)
    assert times == [0.0, 30.0, 60.0, 90.0, 120.0]
    assert n == [2, 2, 2, 1, 1]
    # held: short 0.1, 0.5, 0.7; long 0.1, 0.1, 0.3, 0.3, 0.9; trailing two-point means of those
    assert mean == pytest.approx([0.1, (0.3 + 0.1) / 2, (0.6 + 0.2) / 2, 0.3, 0.6])
    assert lo[1:3] == pytest.approx([0.1, 0.2]) and hi[1:3] == pytest.approx([0.3, 0.6])
    assert lo[3:] == hi[3:] == pytest.approx([0.3, 0.6])


def test_the_legend_says_how_far_each_seed_ran():
    assert sweep.coverage([band_record(s, 30.0, []) for s in range(3)]) == "3 seeds, 30 min"
    recs = [band_record(0, 60.0, []), band_record(1, 16.5, []), band_record(2, 16.5, [])]
    assert sweep.coverage(recs) == "3 seeds to 16.5 min, 1 to 60"
    assert sweep.coverage([band_record(0, 30.0, [])]) == "1 seed, 30 min"


def test_a_record_names_the_processor_it_ran_on_with_its_widest_vector_unit(tmp_path):
    info = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse4_2 avx avx2 fma\n\nprocessor\t: 1\n"
    assert sweep.cpu_name(info) == "AMD EPYC 7B13 (avx2)"
    assert sweep.cpu_name("flags : avx512f avx2\n") == "unknown (avx512f)"
    rec = sweep.make_record(run_folder(tmp_path, 0, 0.5, [[1.0]]), "cmp", "fedat")
    assert rec["cpu"] and rec["cpu"] != "unknown (none)"


def test_the_planned_budget_keeps_its_table_after_every_run_went_on_past_it(tmp_path):
    root = tmp_path / "sums"
    save(root, sweep.make_record(run_folder(tmp_path, 0, 0.8, [[0.5, 0.5]]), "cmp", "fedat", 0, [0.65]))
    assert "(1 virtual min per run)" not in sweep.render(sweep.load_records(root))
    md = sweep.render(sweep.load_records(root), planned={"cmp": 1.0, "other": 5.0})
    # the 2-minute run's table first, then its first minute: only the evaluation at 60 s counts there
    assert md.index("(2 virtual min per run)") < md.index("(1 virtual min per run)")
    assert "| fedat | 0 | 0.600 |" in md.split("(1 virtual min per run)")[1]
    assert "(5 virtual min" not in md
    # a plan no run of the comparison's own reaches makes no table of its own
    assert "(3 virtual min" not in sweep.render(sweep.load_records(root), planned={"cmp": 3.0})


def test_the_paired_table_counts_the_pairs_that_ran_on_one_kind_of_processor(tmp_path):
    root = tmp_path / "sums"
    cpus = {("fedat", 0): "A (avx2)", ("fedat", 1): "A (avx2)", ("delta", 0): "A (avx2)", ("delta", 1): "B (avx512f)"}
    for (method, seed), cpu in cpus.items():
        rec = sweep.make_record(run_folder(tmp_path, seed, 0.8 if method == "fedat" else 0.7, [[1.0]]), "cmp", method)
        save(root, {**rec, "cpu": cpu})
    save(root, {**sweep.make_record(run_folder(tmp_path, 2, 0.71, [[1.0]]), "cmp", "delta"), "cpu": None})
    save(root, {**sweep.make_record(run_folder(tmp_path, 2, 0.81, [[1.0]]), "cmp", "fedat"), "cpu": None})
    md = sweep.render(sweep.load_records(root))
    # seed 0 on one kind, seed 1 across kinds, seed 2 unrecorded: only seed 0 is known to share the arithmetic
    assert "| delta | 0,1,2 | -0.100 ± 0.000 | -0.100 ± 0.000 | 0/3 | 1/3 |" in md
    assert md.endswith(sweep.CPU_NOTE)
    for method, best in (("fedat", 0.6), ("delta", 0.5)):  # a second comparison with a paired table: one note
        save(root, {**sweep.make_record(run_folder(tmp_path, 3, best, [[1.0]]), "cmp2", method), "cpu": "A (avx2)"})
    md = sweep.render(sweep.load_records(root))
    assert md.count(sweep.CPU_NOTE) == 1 and md.endswith(sweep.CPU_NOTE) and "### cmp2" in md
    one = sweep.render_comparison("cmp2", sweep.load_records(root)["cmp2"])
    assert one.endswith(sweep.CPU_NOTE)  # a comparison's own page explains its own paired table
