"""The results report: the committed one is exactly what the committed records make, and its pieces behave."""

from __future__ import annotations

import json
import re
from pathlib import Path

import matplotlib
import PIL
import pytest
from PIL import Image

from fedat.lab import claims, pipeline_tables, plots, report, sweep
from fedat.lab.compare_run import planned_minutes

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SIM = DOCS / "summaries" / "sim"
REBUILD = "fedat tabulate --sweeps docs/summaries/sim --into docs/results.md"


def committed() -> report.Report:
    """The report the committed records make, generated as `fedat tabulate` does."""
    records = sweep.load_records(SIM)
    planned, method_minutes = planned_minutes(ROOT / "experiments", records)
    return report.generate(records, "results.md", planned, DOCS / "summaries", method_minutes)


@pytest.fixture(scope="module")
def built() -> report.Report:
    return committed()


def test_a_rebuild_from_the_committed_records_changes_no_table(built):
    for name, blocks in built.blocks.items():
        text = (DOCS / name).read_text()
        assert report.replace_blocks(text, blocks) == text, f"docs/{name} is stale: run `{REBUILD}`"
    for name, text in built.pages.items():
        assert (DOCS / name).read_text() == text, f"docs/{name} is stale: run `{REBUILD}`"
    generated = [*(DOCS / report.PAGES).glob("compare-*.md"), DOCS / report.PAGES / report.CLAIMS_PAGE]
    pages = {f"{report.PAGES}/{p.name}" for p in generated if p.exists()}
    assert pages == set(built.pages), f"pages no record makes, or missing: run `{REBUILD}`"


def test_a_rebuild_from_the_committed_records_changes_no_figure(built):
    # a figure carries the digest of the data it shows (and of its style): the same records give the same digest on
    # any machine, where the PNG's bytes also depend on the matplotlib and Pillow versions
    on_disk = {f"{report.FIGURES}/{p.name}" for p in (DOCS / report.FIGURES).glob("*.png")}
    assert on_disk == set(built.figures), f"figures no claim makes, or missing: run `{REBUILD}`"
    for name, fig in built.figures.items():
        assert plots.png_data(DOCS / name) == fig.digest, f"docs/{name} is stale: run `{REBUILD}`"


def test_committed_figures_drawn_again_have_the_same_bytes(built, tmp_path):
    # with the libraries that drew them, the same data must give the same bytes: this catches a change of look that
    # did not bump plots.STYLE (such a figure would keep its old digest and never be redrawn). A look is shared by
    # every figure of a kind, so two of each kind (a comparison's, a claim's) stand for all; the data of every
    # figure is checked by its digest above.
    libraries = f"matplotlib {matplotlib.__version__}, Pillow {PIL.__version__}"
    compared: dict[bool, int] = {True: 0, False: 0}
    for name, fig in sorted(built.figures.items()):
        kind = Path(name).name.startswith("compare-")
        if compared[kind] >= 2:
            continue
        with Image.open(DOCS / name) as img:
            if img.text.get("Software") != libraries:
                continue
        assert fig.draw(tmp_path / "again.png")
        assert (tmp_path / "again.png").read_bytes() == (DOCS / name).read_bytes(), f"docs/{name}: redraw it"
        compared[kind] += 1
    if not any(compared.values()):
        pytest.skip(f"no figure was drawn by {libraries}; bytes are only comparable with the same libraries")


def test_the_first_screen_fits_on_a_screen_and_the_report_tells_no_history():
    text = (DOCS / "results.md").read_text()
    first = text.split(report.END.format(name="summary"))[0]
    assert len(first.splitlines()) <= 40
    assert "[a1](" in first  # the claims table is on it
    # what a reader sees (links' targets and emphasis do not show): a table row short enough to stay on about one
    # rendered line, and prose of about a dozen lines
    lines = [re.sub(r"\]\([^)]*\)|\*\*|\[|`", "", line) for line in first.splitlines()]
    rows = [line for line in lines if line.startswith("| ")]
    assert len(rows) > 20 and max(sum(len(cell.strip()) for cell in row.split("|")) for row in rows) <= 110
    prose = [line for line in lines if line and not line.startswith(("|", "<!--", "#"))]
    assert sum(len(line) for line in prose) <= 1600
    pages = [text, *(p.read_text() for p in (DOCS / report.PAGES).glob("*.md"))]
    # no history, and no path of a machine (an absolute home, root, tmp or work folder)
    history = re.compile(r"\bissue \d|\bstop \d|\bwas\b.*\bnow\b|(?<![\w.])/(?:home|root|tmp|work|Users)/")
    for page in pages:
        assert not history.search(page)


def test_write_redraws_only_changed_figures_and_removes_what_nothing_generates(tmp_path):
    rec = {
        "schema": sweep.SCHEMA,
        "comparison": "cmp",
        "method": "fedat",
        "seed": 0,
        "virtual_minutes": 2.0,
        "settings": {"strategy": "fedat", "seed": 0},
        "summary": {"best_accuracy": 0.8, "tier_rounds": [2, 1]},
        "mean_tier_weights": [0.5, 0.5],
        "curve": [[60.0, 0.6, 1, 1], [120.0, 0.8, 2, 2]],
        "at_eval": [[0.01, 1, [1, 0], [1.0, 0.0], 1], [0.01, 2, [2, 1], [1.0, 1.0], 2]],
    }
    stale = tmp_path / report.FIGURES / "gone.png"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"")
    (tmp_path / "results.md").write_text("# R\n\nkept\n")
    built = report.generate({"cmp": {"fedat": [rec]}})
    changed = report.write(built, tmp_path)
    assert stale in changed and not stale.exists()
    figure = tmp_path / report.FIGURES / "cmp.png"
    assert figure in changed and plots.png_data(figure) == built.figures[f"{report.FIGURES}/cmp.png"].digest
    text = (tmp_path / "results.md").read_text()
    assert text.startswith("# R\n\nkept\n") and "no record yet" in text  # pending claims, blocks appended
    assert report.write(built, tmp_path) == []  # nothing changed, nothing rewritten


def test_blocks_are_replaced_in_place_and_the_text_around_them_kept():
    begin, end = report.BLOCK.format(name="x"), report.END.format(name="x")
    text = f"intro\n{begin}\nold\n{end}\noutro\n"
    assert report.replace_blocks(text, {"x": "new"}) == f"intro\n{begin}\n\nnew\n\n{end}\noutro\n"
    assert report.replace_blocks("intro\n", {"x": "new"}) == f"intro\n\n{begin}\n\nnew\n\n{end}\n"


def test_the_pipeline_tables_come_from_the_chaos_and_scale_summaries(tmp_path):
    chaos = json.loads((DOCS / "summaries" / "chaos-8min-36kills.json").read_text())
    chaos["violations"]["updates_lost"] = 7
    (tmp_path / "chaos-x.json").write_text(json.dumps(chaos))
    blocks = pipeline_tables.pipeline_blocks(tmp_path)
    assert "| updates lost / counted twice / dead-lettered by the broker | 7 / 0 / 0 " in blocks["chaos"]
    assert blocks["scale"] == "None yet."


def test_a_tuned_claims_figure_shows_every_learning_rate_on_the_seeds_the_chosen_one_was_judged_on():
    from tests.unit.test_claims import flat, records

    recs = [flat("a", s, 0.8) for s in range(3)] + [flat("b", s, 0.7) for s in range(3)]
    recs += [flat("b-fast", 0, 0.75)]  # one seed so far: it is chosen, and judged on seed 0 alone
    tuned = claims.Claim("x", "a beats b at its best rate", "—", "cmp", "a", ("b", "b-fast"), tuned=True)
    judged = claims.judge(tuned, records(*recs))
    title, series, target = report.claim_series(judged, records(*recs))
    assert judged.chosen == "b-fast" and [s.seeds for s in series] == [1, 1, 1]
    assert title.startswith("x: a beats b") and target == 0.7


def test_a_claim_not_converged_at_its_budget_names_the_longer_runs_of_either_method():
    from tests.unit.test_claims import flat, rec, records

    rising = rec("b", 0, [(60.0, 0.5), (120.0, 0.6), (180.0, 0.65), (240.0, 0.7), (300.0, 0.9)], minutes=5.0)
    judged = claims.judge(claims.Claim("x", "a beats b", "—", "cmp", "a", ("b",)), records(flat("a", 0, 0.8), rising))
    assert judged.pairs[0].budgets == (4.0, 4.0) and not judged.pairs[0].flat
    assert report.ours(judged) == "a 0.800 · b 0.700; longer runs: b 0.900 at 5 min"
    level = records(flat("a", 0, 0.8, minutes=5.0), flat("b", 0, 0.7))
    assert "longer" not in report.ours(claims.judge(claims.Claim("y", "a beats b", "—", "cmp", "a", ("b",)), level))


def test_a_row_at_the_tuned_rate_names_the_rate_and_its_missing_runs():
    from tests.unit.test_claims import flat, records

    def at(method: str, level: float, lr: float) -> dict:
        r = flat(method, 0, level)
        r["settings"] = {"learning_rate": lr}
        return r

    sweep = [at("fedavg-lr3e-4", 0.6, 3e-4), at("fedavg", 0.7, 1e-3), at("fedavg-lr3e-3", 0.72, 3e-3)]
    row = claims.Claim("x", "a beats b at the tuned rate", "—", "cmp", "a", ("b",), at_tuned_rate=True)
    pending = claims.judge(row, records(*sweep, at("a", 0.8, 1e-3)))
    table = report.claims_table([pending], paper=False)
    assert "| x | a beats b at the tuned rate | no record yet at lr 3e-3: a, b | — | — | pending |" in table
    done = claims.judge(row, records(*sweep, at("a-lr3e-3", 0.8, 3e-3), at("b-lr3e-3", 0.75, 3e-3)))
    assert report.ours(done) == "at lr 3e-3: a 0.800 · b 0.750"
    title, series, _ = report.claim_series(done, records(*sweep, at("a-lr3e-3", 0.8, 3e-3), at("b-lr3e-3", 0.75, 3e-3)))
    assert [s.label for s in series] == ["a", "b"]


def test_a_claim_at_a_glance_shows_the_comparator_it_fares_worst_with():
    from tests.unit.test_claims import flat, records

    recs = records(*(flat(m, s, level) for m, level in (("a", 0.8), ("b", 0.7), ("c", 0.9)) for s in range(2)))
    judged = claims.judge(claims.Claim("x", "a beats b and c", "—", "cmp", "a", ("b", "c")), recs)
    assert report.worst(judged).against == "c" and judged.verdict == claims.FAILS
    assert report.glance(judged, report.worst(judged)) == "0.800 ± 0.000 vs c 0.900 ± 0.000"
    row = report.glance_table([judged]).splitlines()[-1]
    assert row.startswith("| [x](report/figures/x.png) a beats b and c | — | 0.800 ± 0.000 vs c 0.900 ± 0.000 | 2 · ")
    assert row.endswith("| **does\u00a0not** |")
    page = report.claims_page([judged], [])
    assert "(figures/x.png)" in page and "| b ✓✓ · c ✗✗ |" in page  # in full: every comparator, seed by seed


def test_per_seed_scores_name_two_variants_of_one_method_in_full():
    from tests.unit.test_claims import flat, records

    levels = (("a", 0.8), ("fedasync", 0.9), ("fedasync-all", 0.7), ("b", 0.6))
    recs = records(*(flat(m, 0, level) for m, level in levels))
    judged = claims.judge(claims.Claim("x", "a beats both", "—", "cmp", "a", ("fedasync", "fedasync-all")), recs)
    assert report._scores(judged) == "FedAsync (20 at once) ✗ · FedAsync (all at once) ✓"
    other = claims.judge(claims.Claim("y", "a beats both", "—", "cmp", "a", ("fedasync", "b")), recs)
    assert report._scores(other) == "FedAsync ✗ · b ✓"  # no clash: the short name


def test_the_still_rising_table_names_the_runs_that_would_settle_a_claim():
    from tests.unit.test_claims import flat, rec, records, rising_then_flat

    rising = [rec("b", s, [(60.0, 0.5), (120.0, 0.6), (180.0, 0.65), (240.0, 0.7)]) for s in range(2)]
    longer = [rising_then_flat("a", s, 16.0) for s in range(2)]  # cut to b's 4 minutes, where it rises too
    judged = claims.judge(claims.Claim("x", "a beats b", "—", "cmp", "a", ("b",)), records(*longer, *rising))
    assert not judged.pairs[0].flat and not claims.converged(judged.pairs[0].subject)
    table = report.rising_table([judged])
    assert table.splitlines()[2:] == ["| cmp | b | 0,1 · 4 | +0.075 | longer | x |"]  # a's own runs go on
    # a budget its comparison file sets beyond the runs is what to run; one the runs have reached is not
    set_to = report.rising_table([judged], {"cmp": {"b": 10.0}}).splitlines()[2:]
    assert set_to == ["| cmp | b | 0,1 · 4 | +0.075 | to 10 min, as its comparison file sets | x |"]
    assert report.rising_table([judged], {"cmp": {"b": 4.0}}) == table
    # a flat at 4 minutes, b flat at 16 above it: b's four times longer runs won, so a has to run as long
    a = [flat("a", s, 0.7, minutes=4.0) for s in range(2)]
    b = [rising_then_flat("b", s, 16.0) for s in range(2)]
    outrun = claims.judge(claims.Claim("z", "a beats b", "—", "cmp", "a", ("b",)), records(*a, *b))
    assert outrun.pairs[0].outrun == (4.0, 16.0) and outrun.pairs[0].budgets == (4.0, 4.0)
    assert report.rising_table([outrun]).splitlines()[2:] == [
        "| cmp | a | 0,1 · 4 | flat | to 16 min, where b was not beaten on every seed | z |"
    ]
    level = records(flat("a", 0, 0.8), flat("b", 0, 0.7))
    judged = claims.judge(claims.Claim("y", "a beats b", "—", "cmp", "a", ("b",)), level)
    assert judged.pairs and report.rising_table([judged]) == "Every verdict is settled."


def test_a_method_that_won_with_less_time_is_not_asked_to_run_on_only_the_one_it_beat_is():
    from tests.unit.test_claims import flat, rec, records

    # b wins at 4 minutes, where both still rise; a's 8-minute runs rise too: only a's running on can settle it
    a = [rec("a", s, [(60.0 * k, 0.3 + 0.04 * k) for k in range(9)], minutes=8.0) for s in range(2)]
    b = [rec("b", s, [(60.0, 0.5), (120.0, 0.7), (180.0, 0.8), (240.0, 0.9)]) for s in range(2)]
    judged = claims.judge(claims.Claim("x", "a beats b", "—", "cmp", "a", ("b",)), records(*a, *b))
    assert judged.pairs[0].ahead == (8.0, 4.0) and not judged.settled
    assert report.rising_table([judged]).splitlines()[2:] == ["| cmp | a | 0,1 · 8 | +0.100 | longer | x |"]
    # once a has flattened below b's 4-minute best, b's still rising best is a floor and the verdict is settled
    done = claims.judge(claims.Claim("x", "a beats b", "—", "cmp", "a", ("b",)), records(*b, flat("a", 0, 0.7, 8.0)))
    assert done.settled and report.glance(done, done.pairs[0]) == "0.700 vs ≥ 0.900"
    assert "↗" not in report.claims_table([done], paper=False)
