"""The dashboard and the alert rules against a real Prometheus fed by a real run, and that run end to end.

`fedat run smoke-calibrated.yaml --minutes 1.5 --prometheus` (`make run` in small, `smoke_run`) starts every
service, the broker's per-queue metrics and a local Prometheus (fedat.ops.observe) loading infra/prometheus/alerts.yaml.
While the run goes on, every PromQL expression of infra/grafana/fedat.json (each panel target, with Grafana's
variables replaced by concrete values, and each template variable's query) must parse and return data, and every
rule expression must parse and evaluate without error. Each service's /metrics passes `promtool check metrics`, and
no series has a per-client label. Once it has ended, the run must have calibrated its latency model, learned, and
left a complete results folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from .broker import wait_for
from .smoke_run import calibrated_smoke, check_calibrated_run

# solo: the run measures the machine, then plans on it; a neighbour starting or ending its own training changes
# what the plan assumed (beside test_fidelity it fell behind and timed out)
pytestmark = [pytest.mark.broker, pytest.mark.tf, pytest.mark.slow, pytest.mark.alone, pytest.mark.solo]
ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "infra" / "grafana" / "fedat.json"
RULES = ROOT / "infra" / "prometheus" / "alerts.yaml"
MINUTES = 1.5
# What Grafana would substitute, at a 2 s scrape interval and a dashboard showing the whole run.
GRAFANA = {"$__rate_interval": "30s", "$__interval": "10s", "$__range": "5m"}
# Every label a FedAT series may carry: dimensions, and the ones Prometheus adds. Never a client id.
ALLOWED_LABELS = {"__name__", "job", "instance", "tier", "queue", "outcome", "kind", "direction", "record", "le"}


class Prometheus:
    def __init__(self, url: str):
        self.url = url

    def get(self, path: str, **params) -> dict:
        q = urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{q}", timeout=10) as r:
                return json.load(r)
        except urllib.error.HTTPError as exc:  # a query that does not parse: 400 with a JSON error
            return json.loads(exc.read() or b"{}") or {"status": "error", "error": str(exc)}

    def query(self, expr: str) -> dict:
        return self.get("/api/v1/query", query=expr)

    def values(self, expr: str) -> list[dict]:
        answer = self.query(expr)
        assert answer.get("status") == "success", (expr, answer)
        return answer["data"]["result"]


REAL_CLIENTS_ONLY = "With real clients"  # how the dashboard opens the description of a panel only they fill


def dashboard_queries(real_clients: bool = True) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every template variable of the dashboard (without the panels only
    real clients fill, unless `real_clients`)."""
    d = json.loads(DASHBOARD.read_text())
    out = [
        (f"panel {p['id']} {p['title']!r} target {t['refId']}", t["expr"])
        for p in d["panels"]
        if p["type"] != "row" and (real_clients or not p.get("description", "").startswith(REAL_CLIENTS_ONLY))
        for t in p["targets"]
    ]
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", v["definition"])
            assert m, v["definition"]
            out.append((f"variable ${v['name']}", f"count by ({m[2]}) ({m[1]})"))
    return out


def substitute(expr: str, tiers: list[str], vhost: str) -> str:
    """Grafana's interpolation: a multi-value variable in a regex matcher becomes (a|b).

    A local run's series carry no namespace label, so the namespace variable has no value: `namespace=~""` selects
    the series without one, which is what Grafana sends.
    """
    for var, value in GRAFANA.items():
        expr = expr.replace(var, value)
    expr = expr.replace("${namespace}", "$namespace").replace("$namespace", "")
    expr = expr.replace("${tier}", "$tier").replace("$tier", "(" + "|".join(tiers) + ")")
    assert re.fullmatch(r"[\w-]+", vhost), vhost  # no regex metacharacter to escape
    return expr.replace("${vhost}", "$vhost").replace("$vhost", vhost)


def rule_exprs() -> list[tuple[str, str]]:
    return [
        (r.get("alert") or r["record"], r["expr"])
        for g in yaml.safe_load(RULES.read_text())["groups"]
        for r in g["rules"]
    ]


class Run:
    """`fedat run ... --prometheus` as a child process whose output is read by a thread."""

    def __init__(self, results: Path):
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fedat.cli",
                "run",
                str(calibrated_smoke(results)),
                "--minutes",
                str(MINUTES),
                "--prometheus",
                "--results",
                str(results),
            ],
            cwd=ROOT,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_line(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.time() + timeout
        while time.time() < deadline:
            for line in list(self.lines):
                m = re.search(pattern, line)
                if m:
                    return m
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"no line matching {pattern!r} within {timeout}s:\n" + "\n".join(self.lines[-40:]))


def test_every_dashboard_and_rule_query_runs_against_a_real_run(tmp_path):
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        pytest.skip("the prometheus server and promtool are not installed: `apt-get install -y prometheus`")
    started = time.time()
    run = Run(tmp_path)
    try:
        url = run.wait_line(r"\[fedat\] prometheus: (http://127\.0\.0\.1:\d+)", 120)[1]
        run.wait_line(r"\[fedat\] running for", 240)
        running_since = time.time()
        prom = Prometheus(url)

        # Every target of the local run (the ports fedat run assigns) and the broker answer.
        def all_up():
            targets = prom.get("/api/v1/targets")["data"]["activeTargets"]
            return targets if all(t["health"] == "up" for t in targets) else None

        targets = wait_for(all_up, 60, "every scrape target up", every=1)
        jobs = sorted(t["labels"]["job"] for t in targets)
        assert jobs == [
            "fedat-aggregator",
            "fedat-barrier",
            "fedat-evaluator",
            "fedat-profiler",
            "fedat-worker",
            "fedat-worker",
            "rabbitmq",
        ]

        # Each endpoint's exposition passes promtool's lint.
        for t in targets:
            with urllib.request.urlopen(t["scrapeUrl"], timeout=10) as r:
                body = r.read()
            lint = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True, timeout=30)
            assert lint.returncode == 0, (t["scrapeUrl"], lint.stdout + lint.stderr)

        # Enough of a run to have every panel's series: rounds closed in each tier, models evaluated, queues seen.
        def progressed():
            tiers = prom.values("min by (tier) (fedat_tier_rounds_closed_total)")
            return (
                len(tiers) == 2
                and all(float(s["value"][1]) >= 3 for s in tiers)
                and prom.values("fedat_eval_accuracy_ratio > 0")
                and prom.values('rabbitmq_detailed_queue_consumers{queue="fedat.train.tier-1"} > 0')
                and prom.values("fedat_tier_clients")
                and time.time() - running_since > 35  # a full $__rate_interval of rounds
            )

        wait_for(progressed, 60, "two tiers closing rounds, an evaluation and the broker's queue metrics", every=1)
        tiers = sorted(s["metric"]["tier"] for s in prom.values("count by (tier) (fedat_tier_rounds_closed_total)"))
        assert tiers == ["1", "2"]
        (vhost,) = [s["metric"]["vhost"] for s in prom.values("count by (vhost) (rabbitmq_detailed_queue_messages)")]
        assert vhost.startswith("fedat-run-")

        # No per-client label on any FedAT series.
        labels = prom.get("/api/v1/labels", **{"match[]": '{__name__=~"fedat_.+"}'})["data"]
        assert set(labels) <= ALLOWED_LABELS, set(labels) - ALLOWED_LABELS

        # Every dashboard query parses; every one a simulated pool fills returns data at some moment of the run.
        for where, expr in dashboard_queries():
            answer = prom.query(substitute(expr, tiers, vhost))
            assert answer.get("status") == "success", (where, expr, answer)
        pending = {where: substitute(expr, tiers, vhost) for where, expr in dashboard_queries(real_clients=False)}
        assert len(pending) >= 50
        deadline = running_since + MINUTES * 60 - 3
        while pending and time.time() < deadline:
            for where, expr in list(pending.items()):
                answer = prom.query(expr)
                assert answer.get("status") == "success", (where, expr, answer)
                if answer["data"]["result"]:
                    del pending[where]
            if pending:
                time.sleep(2)
        assert not pending, f"queries without data: {json.dumps(pending, indent=2)}"

        # Every rule expression parses and evaluates; the server loaded every rule and evaluates it without error.
        for name, expr in rule_exprs():
            answer = prom.query(expr)
            assert answer.get("status") == "success", (name, expr, answer)
        loaded = [r for g in prom.get("/api/v1/rules")["data"]["groups"] for r in g["rules"]]
        assert sorted(r["name"] for r in loaded) == sorted(name for name, _ in rule_exprs())
        assert all(r["health"] == "ok" for r in loaded), [(r["name"], r.get("lastError")) for r in loaded]
        # A recording rule used by the alerts has values for both tiers.
        assert len(prom.values("tier:fedat_tier_rounds_closed:increase10m")) == 2
    finally:
        try:
            rc = run.proc.wait(timeout=MINUTES * 60 + 120)
        except subprocess.TimeoutExpired:
            run.proc.terminate()
            rc = run.proc.wait(timeout=30)
    output = "\n".join(run.lines)
    assert rc == 0, output[-4000:]
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    # Prometheus was stopped and left its alert log (and its small TSDB) in the results folder.
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{url}/-/ready", timeout=2)
    fired = json.loads((folder / "prometheus" / "alerts.json").read_text())
    assert not [a for a in fired if a["labels"].get("severity") == "critical"], fired
    assert (folder / "updates_per_tier.png").exists()
    check_calibrated_run(folder, output)
    print(f"\nobservability run: {time.time() - started:.0f}s, alerts fired: {fired}")
