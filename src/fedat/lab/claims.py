"""The paper's claims, the records that test each one, and the rule that turns those records into a verdict.

A claim names a comparison, a subject method and the methods it is said to beat. Each (subject, comparator) pair is
judged on the seeds both ran, cut to the longest virtual budget every one of those seeds reaches (a simulation is
deterministic, so a longer run's first minutes are the shorter run), seed by seed, under the claim's rule. Where a
curve still rises at that budget, each method is judged at its own longest budget instead (the paper reports "the
best test accuracy after each training process converges") when the method that had less time wins every seed there
and the other has converged, or when every seed's time or traffic to the target can no longer change. A verdict is
settled when more time could not change it. Everything here is a pure function of the records, so `fedat tabulate`
recomputes every verdict whenever a record lands.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from fedat.lab.compare import quarter_rise, tail_mean
from fedat.lab.sweep import mean_std, truncated

HOLDS, PARTLY, FAILS, PENDING = "holds", "partly", "does not hold", "pending"
FLAT_RISE = 0.02  # a curve counts as flat when its last quarter's mean is within this of the quarter's before
LEVEL = 0.01  # "loses nothing": at most this far below, in both accuracy measures

RATE_SUFFIX = re.compile(r"-lr\d+e-\d+$")  # a method run at another learning rate: "fedat-lr3e-3"

# How a method is named in the report; a participation method's "-k2" is dropped (the claim says which k).
LABELS = {
    "fedat": "FedAT",
    "fedat-uniform": "uniform weights",
    "fedat-step": "appendix rule",
    "fedat-delta": "full step",
    "fedat-delta-decay": "decayed step",
    "fedavg": "FedAvg",
    "fedavg-lr3e-4": "FedAvg lr 3e-4",
    "fedavg-lr3e-3": "FedAvg lr 3e-3",
    "fedprox": "FedProx",
    "tifl": "TiFL",
    "fedasync": "FedAsync (20 at once)",
    "fedasync-all": "FedAsync (all at once)",
    "fedbuff": "FedBuff",
    "aso-fed": "ASO-Fed",
    "p3": "p3",
    "p6": "p6",
    "raw": "raw float32",
    "fedat-dz": "FedAT, delta codec",
    "fedavg-dz": "FedAvg, delta codec",
    "tifl-dz": "TiFL, delta codec",
    "fedasync-dz": "FedAsync, delta codec",
    "uniform": "Uniform",
    "slow": "Slow",
    "medium": "Medium",
    "fast": "Fast",
}


def label(method: str, overrides: Mapping[str, str] | None = None) -> str:
    """A method's name in the report; a run at another learning rate ("-lr3e-3") is named as its method."""
    if overrides and method in overrides:
        return overrides[method]
    if method not in LABELS:
        method = RATE_SUFFIX.sub("", method)
    base, _, k = method.rpartition("-k")
    return LABELS.get(base if base and k.isdigit() else method, method)


@dataclass(frozen=True)
class Seed:
    """One seed's numbers, as the rules read them."""

    seed: int
    best: float | None
    tail: float | None
    rise: float | None
    variance: float | None
    reach: tuple[float, int, int] | None  # (s, bytes up + down, bytes up) at the first evaluation at the target
    spent: tuple[float, int, int]  # (s, bytes up + down, bytes up) at the run's end: what a later reach exceeds


def measure(rec: dict, target: float | None) -> Seed:
    """A record's numbers for the rules (the record already cut to the pair's budget)."""
    curve = [tuple(p) for p in rec["curve"]]
    end = rec["virtual_minutes"] * 60.0
    hit = None
    if target is not None:
        hit = next(((t, up + down, up) for t, acc, up, down in curve if acc >= target), None)
    _, _, up, down = curve[-1] if curve else (0.0, 0.0, 0, 0)
    return Seed(
        rec["seed"],
        rec["summary"].get("best_accuracy"),
        tail_mean(curve, end),
        quarter_rise(curve, end),
        rec["summary"].get("best_accuracy_variance"),
        hit,
        (end, up + down, up),
    )


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def _higher(a: Seed, b: Seed) -> int:
    if None in (a.best, b.best, a.tail, b.tail):
        return 0
    signs = {_sign(a.best - b.best), _sign(a.tail - b.tail)}
    return signs.pop() if len(signs) == 1 else 0


def _level(a: Seed, b: Seed) -> int:
    if None in (a.best, b.best, a.tail, b.tail):
        return 0
    ok = [a.best >= b.best - LEVEL, a.tail >= b.tail - LEVEL]
    return 1 if all(ok) else -1 if not any(ok) else 0


def _lower_variance(a: Seed, b: Seed) -> int:
    return 0 if a.variance is None or b.variance is None else _sign(b.variance - a.variance)


def _first(index: int) -> Callable[[Seed, Seed], int]:
    def rule(a: Seed, b: Seed) -> int:
        # a run that never reaches the target is infinitely late and infinitely costly; two such runs tie
        x = a.reach[index] if a.reach else math.inf
        y = b.reach[index] if b.reach else math.inf
        return _sign(y - x)

    return rule


def _stands(index: int) -> Callable[[Seed, Seed], bool]:
    def final(a: Seed, b: Seed) -> bool:
        # a reach stays where it is; a run that has not reached the target will, if ever, past its end: a seed's
        # score stands once both have reached it, or one has before the other's run ended
        if a.reach and b.reach:
            return True
        if a.reach:
            return a.reach[index] < b.spent[index]
        return b.reach is not None and b.reach[index] < a.spent[index]

    return final


@dataclass(frozen=True)
class Rule:
    """How one seed's pair is scored: +1 the subject wins it, -1 it loses it, 0 split or tie."""

    says: str  # the rule in words, for the report
    score: Callable[[Seed, Seed], int]
    longer_helps: bool = True  # a longer run can only raise a method's best, or bring its target nearer
    final: Callable[[Seed, Seed], bool] | None = None  # whether a seed's score stands however long both run on


RULES = {
    "higher": Rule(
        "on a seed the subject wins when both its best accuracy (the paper's measure) and its last-quarter mean are "
        "above the comparator's, loses when both are below, and splits the seed otherwise",
        _higher,
    ),
    "level": Rule(
        f"on a seed the subject wins when neither its best accuracy nor its last-quarter mean is more than {LEVEL} "
        f"below the comparator's, loses when both are, and splits the seed otherwise",
        _level,
    ),
    "lower-variance": Rule(
        "on a seed the subject wins when the variance of the per-client accuracies at its best evaluation is below "
        "the comparator's",
        _lower_variance,
        longer_helps=False,  # the variance at a later best evaluation may be higher or lower
    ),
    "sooner": Rule(
        "on a seed the subject wins when it reaches the target accuracy in less virtual time (a run that never "
        "reaches it counts as infinitely late; two such runs tie)",
        _first(0),
        final=_stands(0),
    ),
    "cheaper": Rule(
        "on a seed the subject wins when it reaches the target with fewer MB sent up and down (never reaching it "
        "counts as infinitely many; two such runs tie)",
        _first(1),
        final=_stands(1),
    ),
    "cheaper-upload": Rule(
        "on a seed the subject wins when it reaches the target with fewer MB uploaded",
        _first(2),
        final=_stands(2),
    ),
}


@dataclass(frozen=True)
class Claim:
    """One row of a claims table: what is claimed, the paper's number, and where the records are."""

    key: str  # the row's id and its figure's file name
    says: str  # the claim, shortened
    paper: str  # the paper's number(s), or "—"
    comparison: str
    subject: str
    against: tuple[str, ...]  # every one must be beaten; with `tuned`, the best of them stands for one method
    rule: str = "higher"
    target: float | None = None  # accuracy for "sooner"/"cheaper" and for the figure's bars
    tuned: bool = False  # `against` is one method at several learning rates: the paper tunes it and keeps the best
    at_tuned_rate: bool = False  # every method runs at FedAvg's tuned rate (the paper's protocol): see `at_rate`
    relative: bool = False  # show the subject against the comparator in % of the comparator (as the paper does)
    beaten: bool = False  # the claim is that every comparator beats the subject (its seeds' scores change sign)
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Pair:
    """The subject against one comparator on their common seeds, at their common budget or each at its own."""

    against: str
    budgets: tuple[float, float]  # virtual minutes the subject's and the comparator's runs were cut to
    subject: list[Seed]
    other: list[Seed]
    scores: list[int]
    records: tuple[list[dict], list[dict]]  # the cut records, for the figure
    uncut: tuple[list[dict], list[dict]]  # the same seeds' whole records: one may have run on past the budget
    # Own budgets at which both have converged but the method with less time did not win every seed there: it must
    # run as long before the pair can be judged where both have converged
    outrun: tuple[float, float] | None = None
    # Own budgets at which the method with less time won every seed but the other still rises: only the other has to
    # run on (until it has flattened) before the pair can be judged there
    ahead: tuple[float, float] | None = None
    final: bool = False  # every seed's score stands however long both run on (the time or traffic to a target)

    @property
    def verdict(self) -> str:
        """holds: every seed won; does not hold: every seed lost; partly: anything else."""
        if all(s > 0 for s in self.scores):
            return HOLDS
        if all(s < 0 for s in self.scores):
            return FAILS
        return PARTLY

    @property
    def flat(self) -> bool:
        """Whether both methods' mean last-quarter rise is within FLAT_RISE (both converged at their budgets)."""
        return converged(self.subject) and converged(self.other)

    @property
    def common(self) -> bool:
        """Whether both methods were cut to one budget (else each is judged at its own)."""
        return self.budgets[0] == self.budgets[1]

    @property
    def settled(self) -> bool:
        """Whether more time could not change the verdict: both have converged, every seed's score stands, or each
        was judged at its own budget (only where more time could not change it)."""
        return self.flat or self.final or not self.common


def converged(seeds: Sequence[Seed]) -> bool:
    """Whether a method's mean last-quarter rise over these seeds is within FLAT_RISE."""
    rises = [s.rise for s in seeds if s.rise is not None]
    return bool(rises) and mean_std(rises)[0] <= FLAT_RISE


@dataclass(frozen=True)
class Judged:
    """A claim with its pairs, the comparators without records and the verdict."""

    claim: Claim
    pairs: list[Pair]
    missing: list[str]
    chosen: str | None  # with `tuned` or `at_tuned_rate`: FedAvg's run at the tuned learning rate

    @property
    def verdict(self) -> str:
        """holds against every comparator → holds; does not hold against any → does not hold; else partly.

        A comparator without records leaves the claim pending unless it already fails against another."""
        verdicts = [p.verdict for p in self.pairs]
        if FAILS in verdicts:
            return FAILS
        if self.missing or not verdicts:
            return PENDING
        return HOLDS if all(v == HOLDS for v in verdicts) else PARTLY

    @property
    def settled(self) -> bool:
        """Whether more time could not change the verdict: a settled pair fails it, or every pair is settled."""
        if any(p.settled and p.verdict == FAILS for p in self.pairs):
            return True
        return bool(self.pairs) and not self.missing and all(p.settled for p in self.pairs)


def pair(subject: Sequence[dict], other: Sequence[dict], against: str, rule: str, target: float | None) -> Pair | None:
    """Both methods on the seeds both ran, cut to the longest budget all those seeds reach; None if no common seed.

    Where the verdict there could still change with more time, each is judged at its own longest budget on those
    seeds (the paper's measure is each method's best once it has converged) when every seed's score stands there, or
    when the method given less time wins every seed and the other's runs have flattened: more time can then only
    have helped the loser, and the winner's best can only rise (for rules where a longer run only helps, a winner
    still rising will do; otherwise both must have flattened)."""
    by_seed = {r["seed"]: r for r in other}
    both = [(a, by_seed[a["seed"]]) for a in subject if a["seed"] in by_seed]
    if not both:
        return None
    budget = min(min(a["virtual_minutes"], b["virtual_minutes"]) for a, b in both)
    shared = _cut(both, (budget, budget), against, rule, target)
    own = (min(a["virtual_minutes"] for a, _ in both), min(b["virtual_minutes"] for _, b in both))
    if shared.settled or own == shared.budgets:
        return shared
    each = _cut(both, own, against, rule, target)
    if each.final:
        return each
    shorter = _sign(own[1] - own[0])  # the score of a seed the method with less time wins
    longer = each.subject if shorter < 0 else each.other  # the method given more time
    won = all(score == shorter for score in each.scores)
    if won and (each.flat or (RULES[rule].longer_helps and converged(longer))):
        return each
    if each.flat:
        return replace(shared, outrun=own)
    return replace(shared, ahead=own) if won and RULES[rule].longer_helps else shared


def _cut(
    both: Sequence[tuple[dict, dict]], budgets: tuple[float, float], against: str, rule: str, target: float | None
) -> Pair:
    cut = [(truncated(a, budgets[0]), truncated(b, budgets[1])) for a, b in both]
    mine = [measure(a, target) for a, _ in cut]
    theirs = [measure(b, target) for _, b in cut]
    scores = [RULES[rule].score(a, b) for a, b in zip(mine, theirs, strict=True)]
    final = RULES[rule].final
    return Pair(
        against,
        budgets,
        mine,
        theirs,
        scores,
        ([a for a, _ in cut], [b for _, b in cut]),
        ([a for a, _ in both], [b for _, b in both]),
        final=final is not None and all(final(a, b) for a, b in zip(mine, theirs, strict=True)),
    )


def tuned_choice(methods: Mapping[str, Sequence[dict]], candidates: Sequence[str]) -> str:
    """The candidate with the highest mean best accuracy on the seeds all ran, at the budget all of them reach."""
    seeds = set.intersection(*({r["seed"] for r in methods[c]} for c in candidates))
    chosen = {c: [r for r in methods[c] if r["seed"] in seeds] for c in candidates}
    budget = min(r["virtual_minutes"] for rs in chosen.values() for r in rs)

    def mean_best(c: str) -> float:
        return mean_std([truncated(r, budget)["summary"]["best_accuracy"] for r in chosen[c]])[0]

    return max(candidates, key=lambda c: (mean_best(c), -candidates.index(c)))


def at_rate(method: str, fedavg: str) -> str:
    """`method` at the rate of FedAvg's run `fedavg`: FedAvg is that run, another method carries its suffix."""
    return fedavg if method == "fedavg" else method + fedavg.removeprefix("fedavg")


def judge(claim: Claim, records: Mapping[str, Mapping[str, Sequence[dict]]]) -> Judged:
    """The claim's verdict from the records (comparison → method → records)."""
    methods = records.get(claim.comparison, {})
    if claim.at_tuned_rate:  # the claim's methods become their runs at the rate tuned for FedAvg, once it is known
        untuned = [m for m in TUNING if not methods.get(m)]
        if untuned:
            return Judged(claim, [], untuned, None)
        rate = tuned_choice(methods, TUNING)
        mapped = replace(
            claim, subject=at_rate(claim.subject, rate), against=tuple(at_rate(m, rate) for m in claim.against)
        )
        return replace(judge(replace(mapped, at_tuned_rate=False), records), claim=mapped, chosen=rate)
    missing = [m for m in claim.against if not methods.get(m)]
    if not methods.get(claim.subject):
        return Judged(claim, [], [claim.subject, *missing], None)
    chosen = None
    against = list(claim.against)
    if claim.tuned:
        if missing:
            return Judged(claim, [], missing, None)
        chosen = tuned_choice(methods, claim.against)
        against = [chosen]
    pairs = []
    for other in against:
        if other in missing:
            continue
        p = pair(methods[claim.subject], methods[other], other, claim.rule, claim.target)
        if p is None:
            missing.append(other)
        else:
            pairs.append(replace(p, scores=[-s for s in p.scores]) if claim.beaten else p)
    return Judged(claim, pairs, missing, chosen)


PAPER = "compare-fmnist2-paper"
DEVICE = "compare-fmnist2-grid"
TWEETS = "compare-tweets-paper"
BASELINES = ("tifl", "fedavg", "fedprox", "fedasync-all")  # the paper's Table 1 methods, FedAsync as it ran it
TUNING = ("fedavg-lr3e-4", "fedavg", "fedavg-lr3e-3")  # FedAvg's learning-rate sweep (1e-3: "fedavg")
# The headline comparison rerun at FedAvg's tuned rate (FedProx, one seed at 1e-3, is not rerun)
AT_RATE = ("tifl", "fedavg", "fedasync-all", "fedasync")
WEIGHTING = "+1.39 to +4.05 %"

# The paper's claims (FMNIST #2 unless a row names another task), in the order of its evaluation section.
CLAIMS = (
    Claim("a1", "beats TiFL", "0.873 vs 0.859", PAPER, "fedat", ("tifl",)),
    Claim(
        "a2",
        "beats FedAvg",
        "0.873 vs 0.842",
        PAPER,
        "fedat",
        ("fedavg",),
    ),
    Claim(
        "a3",
        "↳ FedAvg at its best",
        "0.873 vs 0.842",
        PAPER,
        "fedat",
        TUNING,
        tuned=True,
    ),
    Claim("a4", "beats FedProx", "0.873 vs 0.831", PAPER, "fedat", ("fedprox",)),
    Claim(
        "a5",
        "beats FedAsync, all at once",
        "0.873 vs 0.795",
        PAPER,
        "fedat",
        ("fedasync-all",),
    ),
    Claim("a6", "↳ FedAsync, 20 at once", "0.873 vs 0.795", PAPER, "fedat", ("fedasync",)),
    Claim(
        "a7",
        "↳ appendix rule vs all four",
        "0.873 vs ≤ 0.859",
        PAPER,
        "fedat-step",
        BASELINES,
    ),
    Claim(
        "a8",
        "↳ all at FedAvg's best lr",
        "0.873 vs ≤ 0.859",
        PAPER,
        "fedat",
        AT_RATE,
        at_tuned_rate=True,
    ),
    Claim(
        "a9",
        "↳ appendix rule too",
        "0.873 vs ≤ 0.859",
        PAPER,
        "fedat-step",
        AT_RATE,
        at_tuned_rate=True,
    ),
    Claim(
        "v1",
        "lowest per-client variance",
        "others 1.29–2.24×",
        PAPER,
        "fedat",
        BASELINES,
        rule="lower-variance",
    ),
    Claim(
        "t1",
        "reaches 0.79 first",
        "5.3–5.8×, CIFAR-10",
        PAPER,
        "fedat",
        ("tifl", "fedavg", "fedprox"),
        rule="sooner",
        target=0.79,
    ),
    Claim(
        "m1",
        "least traffic to 0.79",
        "1,042 vs ≥ 1,042 MB",
        PAPER,
        "fedat",
        BASELINES,
        rule="cheaper",
        target=0.79,
    ),
    Claim("w1", "its weights beat uniform", WEIGHTING, PAPER, "fedat", ("fedat-uniform",), relative=True),
    Claim(
        "w2",
        "↳ as the appendix's step",
        WEIGHTING,
        PAPER,
        "fedat-step",
        ("fedat-uniform",),
        relative=True,
    ),
    Claim("w3", "↳ device regime", WEIGHTING, DEVICE, "fedat", ("fedat-uniform",), relative=True),
    Claim("w4", "↳ device regime, its step", WEIGHTING, DEVICE, "fedat-step", ("fedat-uniform",), relative=True),
    Claim("w5", "↳ tweets", WEIGHTING, TWEETS, "fedat", ("fedat-uniform",), relative=True),
    Claim(
        "w6",
        "↳ at FedAvg's best lr",
        WEIGHTING,
        PAPER,
        "fedat",
        ("fedat-uniform",),
        relative=True,
        at_tuned_rate=True,
    ),
    Claim(
        "s1",
        "tweets: beats 3 baselines",
        "0.748 vs ≤ 0.741",
        TWEETS,
        "fedat",
        ("fedavg", "tifl", "fedasync"),
    ),
    Claim(
        "p1",
        "2 a round: beats 3 baselines",
        "≥ +14 %, CIFAR-10",
        "compare-participation-paper",
        "fedat-k2",
        ("fedavg-k2", "tifl-k2", "fedprox-k2"),
        relative=True,
    ),
    Claim(
        "c1",
        "p3 less accurate than p4",
        "p3 the lowest",
        "compare-precision-paper",
        "fedat",
        ("p3",),
        labels={"fedat": "p4"},
    ),
    Claim(
        "c2",
        "p4 as good as p6 and raw",
        "close to raw",
        "compare-precision-paper",
        "fedat",
        ("p6", "raw"),
        rule="level",
        labels={"fedat": "p4"},
    ),
    Claim(
        "c3",
        "p4 uploads less to 0.60",
        "-36 %, -67 %",
        "compare-precision-paper",
        "fedat",
        ("p6", "raw"),
        rule="cheaper-upload",
        target=0.6,
        relative=True,
        labels={"fedat": "p4"},
    ),
    Claim(
        "z1",
        "500 clients: Fast tiers last",
        "slightly",
        "compare-tier-sizes-paper",
        "fast",
        ("slow", "medium"),
        beaten=True,
    ),
)

# What the project adds: the decayed step (fedat-delta with server_lr_decay), against the paper's rules and baselines.
BEYOND = (
    Claim("d1", "more accurate than FedAT", "—", PAPER, "fedat-delta-decay", ("fedat",)),
    Claim("d2", "more accurate than uniform weights", "—", PAPER, "fedat-delta-decay", ("fedat-uniform",)),
    Claim("d3", "more accurate than the appendix's rule", "—", PAPER, "fedat-delta-decay", ("fedat-step",)),
    Claim("d4", "more accurate than TiFL", "—", PAPER, "fedat-delta-decay", ("tifl",)),
    Claim("d5", "more accurate than FedAsync, all at once", "—", PAPER, "fedat-delta-decay", ("fedasync-all",)),
    Claim("d6", "more accurate than FedAsync, 20 at once", "—", PAPER, "fedat-delta-decay", ("fedasync",)),
    Claim(
        "d7", "lower per-client variance than FedAT", "—", PAPER, "fedat-delta-decay", ("fedat",), rule="lower-variance"
    ),
    Claim(
        "d8", "less traffic than FedAT to 0.70", "—", PAPER, "fedat-delta-decay", ("fedat",), rule="cheaper", target=0.7
    ),
    Claim("d9", "device regime: more accurate than FedAT", "—", DEVICE, "fedat-delta-decay", ("fedat",)),
    Claim("d10", "↳ than uniform weights", "—", DEVICE, "fedat-delta-decay", ("fedat-uniform",)),
    Claim("d11", "↳ than the appendix's rule", "—", DEVICE, "fedat-delta-decay", ("fedat-step",)),
    Claim("d12", "tweets: more accurate than FedAT", "—", TWEETS, "fedat-delta-decay", ("fedat",)),
    Claim("d13", "↳ than uniform weights", "—", TWEETS, "fedat-delta-decay", ("fedat-uniform",)),
    Claim(
        "d14",
        "at FedAvg's best lr: beats FedAT, appendix rule, TiFL, FedAsync (all)",
        "—",
        PAPER,
        "fedat-delta-decay",
        ("fedat", "fedat-step", "tifl", "fedasync-all"),
        at_tuned_rate=True,
    ),
    # The delta codec (`codec: delta`): the same FedAT, its models sent as zstd-packed deltas instead of polylines.
    Claim(
        "k1",
        "delta codec: less traffic than polyline to 0.70",
        "—",
        PAPER,
        "fedat-dz",
        ("fedat",),
        rule="cheaper",
        target=0.7,
    ),
    Claim("k2", "↳ as accurate as polyline", "—", PAPER, "fedat-dz", ("fedat",), rule="level"),
    Claim(
        "k3",
        "↳ least traffic to 0.70 when every method sends deltas",
        "—",
        PAPER,
        "fedat-dz",
        ("tifl-dz", "fedavg-dz", "fedasync-dz"),
        rule="cheaper",
        target=0.7,
    ),
)
