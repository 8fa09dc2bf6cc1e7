#!/usr/bin/env python3
"""Generate infra/grafana/fedat.json, the FedAT Grafana dashboard, from plain dicts (no dependency).

    python infra/grafana/build_dashboard.py            # rewrite fedat.json next to this script
    python infra/grafana/build_dashboard.py --check    # exit 1 if fedat.json is not what this script generates

Every panel's PromQL is executed against a real Prometheus fed by a real run in
tests/integration/test_observability.py. Series names: FedAT services' own metrics (docs/architecture.md §7),
and rabbitmq_prometheus' per-queue series from `/metrics/detailed?family=queue_coarse_metrics&family=
queue_consumer_count` (`rabbitmq_detailed_queue_messages{,_ready,_unacked}`, `rabbitmq_detailed_queue_consumers`).
Counters that may have no series yet (late answers, re-issues, dead letters) fall back to 0 per tier / queue, so a
healthy run shows 0 rather than "No data".

Plain dicts rather than grafana-foundation-sdk: a port to the SDK (1769699998!10.1.0, pinned) reproduced the 42
panels exactly, with about 160 fewer lines of helpers but the same panel code, which is what changes when the
dashboard does; the SDK's API follows Grafana's schema versions (and spells GraphTresholdsStyleMode so), so the
helpers here stay.

Every FedAT series is scoped to one release by the `namespace` variable (added to each `fedat_*` selector by
`scoped`): several releases scraped by one Prometheus do not mix. Where the series carry no namespace label (a
local `fedat run --prometheus`), the variable is empty and `namespace=~""` selects exactly those.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

OUT = Path(__file__).resolve().with_name("fedat.json")
DS = {"type": "prometheus", "uid": "${datasource}"}
RI = "$__rate_interval"
TIER = 'tier=~"$tier"'
VHOST = 'vhost=~"$vhost"'
TRAIN_QUEUES = f'{VHOST}, queue=~"fedat[.]train[.](tier-$tier|profile)"'
BARRIER_QUEUES = f'{VHOST}, queue=~"fedat[.]barrier[.]tier-$tier"'
OTHER_QUEUES = (
    f'{VHOST}, queue=~"fedat[.].*", queue!~"fedat[.](train[.]|barrier[.]tier-|state[.]|dead-letters|client[.]).*"'
)
# Real clients: one task queue per client (and one for its evaluation requests); panels sum over them, never by client.
CLIENT_QUEUES = f'{VHOST}, queue=~"fedat[.]client[.][0-9]+"'
DEAD_LETTERS = f'{VHOST}, queue="fedat.dead-letters"'
NAMESPACE = 'namespace=~"$namespace"'
# A FedAT metric name, with its selector if it has one (not a recording rule's `level:fedat_...:op` name).
FEDAT_SERIES = re.compile(r"(?<![\w:])(fedat_[a-z0-9_]+)(\{([^}]*)\})?")


def scoped(expr: str) -> str:
    """`expr` with every fedat_* selector limited to the dashboard's namespace."""

    def add(m: re.Match) -> str:
        inner = m[3]
        return f"{m[1]}{{{NAMESPACE}{', ' + inner if inner else ''}}}"

    return FEDAT_SERIES.sub(add, expr)


def series(metric: str, selector: str = "") -> str:
    return f"{metric}{{{selector}}}" if selector else metric


def rate(metric: str, selector: str = "", by: str = "tier") -> str:
    return f"sum by ({by}) (rate({series(metric, selector)}[{RI}]))"


def or_zero(metric: str, fallback: str, selector: str = TIER, by: str = "tier") -> str:
    """Rate of `metric` by `by`, or 0 for every `by` value `fallback` has (a counter with no series yet)."""
    return f"({rate(metric, selector, by)} or 0 * {rate(fallback, selector, by)})"


def quantile(q: float, metric: str, selector: str = TIER, by: str = "tier") -> str:
    return f"histogram_quantile({q}, sum by ({by}, le) (rate({series(metric + '_bucket', selector)}[{RI}])))"


def target(expr: str, legend: str = "__auto", ref: str = "A") -> dict:
    return {"datasource": DS, "expr": scoped(expr), "legendFormat": legend, "range": True, "refId": ref}


def targets(*pairs: tuple[str, str]) -> list[dict]:
    return [target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(pairs)]


class Layout:
    """Panels left to right, 24 columns wide, rows of panels below each row header."""

    def __init__(self) -> None:
        self.panels: list[dict] = []
        self.x = self.y = 0
        self.row_h = 0
        self.next_id = 1

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append(
            {
                "type": "row",
                "title": title,
                "id": self._id(),
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y},
                "panels": [],
            }
        )
        self.y += 1

    def _newline(self) -> None:
        if self.x:
            self.y += self.row_h
            self.x, self.row_h = 0, 0

    def add(self, panel: dict, w: int, h: int) -> None:
        if self.x + w > 24:
            self._newline()
        panel["id"] = self._id()
        panel["gridPos"] = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)


def timeseries(
    title: str,
    description: str,
    tgts: list[dict],
    unit: str = "short",
    threshold: float | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
) -> dict:
    defaults: dict = {
        "unit": unit,
        "color": {"mode": "palette-classic"},
        "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": True,
            "thresholdsStyle": {"mode": "line" if threshold is not None else "off"},
        },
        "thresholds": {
            "mode": "absolute",
            "steps": [{"color": "green", "value": None}]
            + ([{"color": "red", "value": threshold}] if threshold is not None else []),
        },
    }
    if minimum is not None:
        defaults["min"] = minimum
    if maximum is not None:
        defaults["max"] = maximum
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": tgts,
    }


def stat(title: str, description: str, tgts: list[dict], unit: str = "short", red: float | None = None) -> dict:
    steps = [{"color": "green", "value": None}] + ([{"color": "red", "value": red}] if red is not None else [])
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "color": {"mode": "thresholds"},
                "thresholds": {"mode": "absolute", "steps": steps},
            },
            "overrides": [],
        },
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
            "justifyMode": "auto",
            "textMode": "auto",
            "orientation": "auto",
        },
        "targets": tgts,
    }


def panels() -> list[dict]:
    L = Layout()  # noqa: N806 — reads like a layout grid
    W, H = 8, 8  # noqa: N806

    L.row("Throughput per tier")
    L.add(
        timeseries(
            "Client updates trained per tier",
            "Local trainings finished by the workers, per second (fedat_client_trainings_total; tier 0 = profiling). "
            "A simulated pool only: real clients train at their sites, which nobody scrapes here (see updates merged).",
            targets(
                (rate("fedat_client_trainings_total", TIER), "tier {{tier}}"),
                ('sum(rate(fedat_client_trainings_total{tier="0"}[$__rate_interval]))', "profiling"),
            ),
            "ops",
        ),
        W,
        H,
    )
    L.add(
        timeseries(
            "Client updates merged per tier",
            "Client updates the barrier merged into tier models, per second (fedat_tier_updates_merged_total).",
            targets((rate("fedat_tier_updates_merged_total", TIER), "tier {{tier}}")),
            "ops",
        ),
        W,
        H,
    )
    L.add(
        timeseries(
            "Tier rounds closed and re-issued per minute",
            "Rounds closed (merged) and rounds re-issued for lack of clients at their deadline, per minute.",
            targets(
                (f"{rate('fedat_tier_rounds_closed_total', TIER)} * 60", "tier {{tier}} closed"),
                (
                    f"{or_zero('fedat_tier_round_reissues_total', 'fedat_tier_rounds_opened_total')} * 60",
                    "tier {{tier}} re-issued",
                ),
            ),
        ),
        W,
        H,
    )
    L.add(
        timeseries(
            "Tier round duration",
            "Wall time from opening to closing a tier round (fedat_tier_round_seconds), median and 90th percentile.",
            targets(
                (quantile(0.5, "fedat_tier_round_seconds"), "tier {{tier}} p50"),
                (quantile(0.9, "fedat_tier_round_seconds"), "tier {{tier}} p90"),
            ),
            "s",
        ),
        W,
        H,
    )
    L.add(
        timeseries(
            "Updates finished late (workers not keeping up)",
            "Fraction of trainings a worker finished after the simulated client would have answered: the worker "
            "pool, not the latency model, set their response time. Alert FedATWorkersNotKeepingUp above 20% for 5m. "
            "A simulated pool only (real clients answer when they answer).",
            targets(
                (
                    f"{or_zero('fedat_client_updates_late_total', 'fedat_client_trainings_total')}"
                    f" / {rate('fedat_client_trainings_total', TIER)}",
                    "tier {{tier}}",
                )
            ),
            "percentunit",
            threshold=0.2,
            minimum=0,
        ),
        W,
        H,
    )
    L.add(
        timeseries(
            "Answers after their round closed, per minute",
            "Updates that reached the barrier after their round had closed (stragglers; fedat_tier_late_answers_total) "
            "and redelivered copies counted once (fedat_barrier_duplicate_updates_total).",
            targets(
                (
                    f"{or_zero('fedat_tier_late_answers_total', 'fedat_tier_rounds_opened_total')} * 60",
                    "tier {{tier}} late",
                ),
                (
                    f"{or_zero('fedat_barrier_duplicate_updates_total', 'fedat_tier_rounds_opened_total')} * 60",
                    "tier {{tier}} duplicate",
                ),
            ),
        ),
        W,
        H,
    )
    L.add(
        timeseries(
            "Clients per tier",
            "Clients the profiler assigned to each tier (fedat_tier_clients).",
            targets((f"max by (tier) (fedat_tier_clients{{{TIER}}})", "tier {{tier}}")),
            minimum=0,
        ),
        W,
        H,
    )
    L.add(
        timeseries(
            "Client response time per tier",
            "Dispatch to (modelled) arrival of round updates, as the profiler measures it "
            "(fedat_client_response_seconds).",
            targets(
                (quantile(0.5, "fedat_client_response_seconds"), "tier {{tier}} p50"),
                (quantile(0.9, "fedat_client_response_seconds"), "tier {{tier}} p90"),
            ),
            "s",
        ),
        W,
        H,
    )
    L.add(
        timeseries(
            "Real clients: joins, leaves, revocations",
            "With real clients, the profiler's membership events per minute (fedat_client_membership_total): joins "
            "(each is profiled, then tiered), leaves, revocations, and joins refused because the client was revoked. "
            "Empty with a simulated pool.",
            targets((f"{rate('fedat_client_membership_total', '', 'event')} * 60", "{{event}}")),
            minimum=0,
        ),
        W,
        H,
    )

    L.row("Model progress")
    L.add(
        stat(
            "Global model version",
            "Version of the newest global model (fedat_global_model_version).",
            targets(("max(fedat_global_model_version)", "version")),
        ),
        6,
        4,
    )
    L.add(
        stat(
            "Global model age",
            "Seconds since the newest global model was published (the newest value of the last day: an aggregator "
            "restarts its gauge at 0); empty until the first one. Alert FedATNoNewGlobalModel above 10 min.",
            targets(("time() - (max(max_over_time(fedat_global_model_created_timestamp_seconds[24h])) > 0)", "age")),
            "s",
            red=600,
        ),
        6,
        4,
    )
    L.add(
        stat(
            "Mean client accuracy",
            "Mean client test accuracy of the last evaluated global model (fedat_eval_accuracy_ratio).",
            targets(("max(fedat_eval_accuracy_ratio)", "accuracy")),
            "percentunit",
        ),
        6,
        4,
    )
    L.add(
        stat(
            "Last evaluated version",
            "The global version the evaluator (real clients: the collector) scored last (fedat_eval_model_version).",
            targets(("max(fedat_eval_model_version)", "evaluated")),
        ),
        6,
        4,
    )
    L.add(
        timeseries(
            "Global and evaluated versions",
            "Newest global version and the version last evaluated.",
            targets(
                ("max(fedat_global_model_version)", "global"),
                ("max(fedat_eval_model_version)", "evaluated"),
            ),
        ),
        W,
        H,
    )
    L.add(
        timeseries(
            "Mean client accuracy over time",
            "Mean of the clients' test accuracies of the last evaluated model.",
            targets(("max(fedat_eval_accuracy_ratio)", "accuracy")),
            "percentunit",
            minimum=0,
            maximum=1,
        ),
        W,
        H,
    )
    L.add(
        timeseries(
            "Variance of client accuracy",
            "Variance of the per-client test accuracy (fairness across clients; fedat_eval_accuracy_variance).",
            targets(("max(fedat_eval_accuracy_variance)", "variance")),
            minimum=0,
        ),
        W,
        H,
    )
    L.add(
        timeseries(
            "Global merges per minute by tier",
            "Tier models merged into the global model, per minute (fedat_global_merges_total).",
            targets((f"{rate('fedat_global_merges_total', TIER)} * 60", "tier {{tier}}")),
        ),
        W,
        H,
    )
    L.add(
        timeseries(
            "Cross-tier weights",
            "Current weight of each tier in the global model (fedat_tier_weight_ratio).",
            targets((f"max by (tier) (fedat_tier_weight_ratio{{{TIER}}})", "tier {{tier}}")),
            "percentunit",
            minimum=0,
        ),
        W,
        H,
    )
    L.add(
        timeseries(
            "Staleness of merged tier models",
            "Global versions published between a tier round's start and its merge "
            "(fedat_tier_model_staleness_versions).",
            targets(
                (quantile(0.5, "fedat_tier_model_staleness_versions"), "tier {{tier}} p50"),
                (quantile(0.9, "fedat_tier_model_staleness_versions"), "tier {{tier}} p90"),
                (
                    f"{rate('fedat_tier_model_staleness_versions_sum', TIER)}"
                    f" / {rate('fedat_tier_model_staleness_versions_count', TIER)}",
                    "tier {{tier}} mean",
                ),
            ),
            minimum=0,
        ),
        W,
        H,
    )

    L.row("Communication")
    L.add(
        timeseries(
            "Model bytes per tier",
            "Model payload of merged tier rounds, per second: up = client updates, down = training tasks "
            "(fedat_model_bytes_total).",
            targets((rate("fedat_model_bytes_total", TIER, "tier, direction"), "tier {{tier}} {{direction}}")),
            "Bps",
        ),
        W,
        H,
    )
    L.add(
        timeseries(
            "Model bytes per merged update",
            "Bytes moved per client update merged, by direction (codec efficiency).",
            targets(
                (
                    f"{rate('fedat_model_bytes_total', TIER, 'tier, direction')}"
                    f" / on (tier) group_left {rate('fedat_tier_updates_merged_total', TIER)}",
                    "tier {{tier}} {{direction}}",
                )
            ),
            "bytes",
        ),
        W,
        H,
    )
    L.add(
        timeseries(
            "Published bytes by message kind",
            "Every message body published with confirms, per second, by kind (fedat_published_bytes_total).",
            targets((rate("fedat_published_bytes_total", "", "kind"), "{{kind}}")),
            "Bps",
        ),
        W,
        H,
    )
    L.add(
        stat(
            "Model bytes in the time range",
            "Model payload moved during the dashboard's time range, by direction.",
            targets(
                (
                    f"sum by (direction) (increase(fedat_model_bytes_total{{{TIER}}}[$__range]))",
                    "{{direction}}",
                )
            ),
            "bytes",
        ),
        24,
        4,
    )
    L.add(
        timeseries(
            "Real clients: evaluation requests",
            "With real clients, the model bytes per second of the collector's evaluation requests, one copy each (the "
            "broker copies each to every client's evaluate queue), by how the model went: whole, or against the "
            "newest request sent whole, which clients keep (fedat_eval_request_model_bytes_total). Empty with a "
            "simulated pool.",
            targets((rate("fedat_eval_request_model_bytes_total", "", "sent"), "{{sent}}")),
            "Bps",
            minimum=0,
        ),
        24,
        6,
    )

    L.row("Broker and queues ($vhost)")
    L.add(
        timeseries(
            "Train queues: tasks waiting and in training",
            "Ready (waiting for a worker) and unacked (being trained) tasks per train queue of a simulated pool (real "
            "clients: see their own queues).",
            targets(
                (f"sum by (queue) (rabbitmq_detailed_queue_messages_ready{{{TRAIN_QUEUES}}})", "{{queue}} waiting"),
                (f"sum by (queue) (rabbitmq_detailed_queue_messages_unacked{{{TRAIN_QUEUES}}})", "{{queue}} training"),
            ),
        ),
        W,
        H,
    )
    L.add(
        timeseries(
            "Train queues: consumers",
            "Workers consuming each train queue (one consumer per worker and queue).",
            targets((f"sum by (queue) (rabbitmq_detailed_queue_consumers{{{TRAIN_QUEUES}}})", "{{queue}}")),
            minimum=0,
        ),
        W,
        H,
    )
    L.add(
        timeseries(
            "Dead-letter queue depth",
            "Messages in fedat.dead-letters (nobody consumes it; it keeps the newest 10,000, so its depth stops "
            "growing at the cap) and the services' dead-lettering per minute, which does not. Alert FedATDeadLettering "
            "above 100 from one queue in 15 min.",
            targets(
                (f"sum by (queue) (rabbitmq_detailed_queue_messages{{{DEAD_LETTERS}}})", "{{queue}} depth"),
                (
                    f"{or_zero('fedat_dead_lettered_total', 'fedat_messages_consumed_total', '', 'queue')} * 60",
                    "from {{queue}} per minute",
                ),
            ),
            minimum=0,
        ),
        W,
        H,
    )
    L.add(
        timeseries(
            "Barrier queues: updates held and waiting",
            "Unacked = updates the barrier holds until their round closes; ready = not yet delivered.",
            targets(
                (f"sum by (queue) (rabbitmq_detailed_queue_messages_unacked{{{BARRIER_QUEUES}}})", "{{queue}} held"),
                (f"sum by (queue) (rabbitmq_detailed_queue_messages_ready{{{BARRIER_QUEUES}}})", "{{queue}} waiting"),
            ),
        ),
        W,
        H,
    )
    L.add(
        timeseries(
            "Barrier queues: consumers",
            "Consumers of each tier's barrier queue (1: the barrier).",
            targets((f"sum by (queue) (rabbitmq_detailed_queue_consumers{{{BARRIER_QUEUES}}})", "{{queue}}")),
            minimum=0,
        ),
        W,
        H,
    )
    L.add(
        timeseries(
            "Other FedAT queues: depth and consumers",
            "Aggregator, evaluator or collector, recorder, profiler and barrier control queues.",
            targets(
                (f"sum by (queue) (rabbitmq_detailed_queue_messages{{{OTHER_QUEUES}}})", "{{queue}}"),
                (f"sum by (queue) (rabbitmq_detailed_queue_consumers{{{OTHER_QUEUES}}})", "{{queue}} consumers"),
            ),
        ),
        W,
        H,
    )
    L.add(
        timeseries(
            "Real clients: their task queues",
            "With real clients, each enrolled client's own task queue (fedat.client.<id>), summed over all clients: "
            "tasks waiting and in training, and how many clients are connected (consume their queue). Empty with a "
            "simulated pool.",
            targets(
                (f"sum(rabbitmq_detailed_queue_messages_ready{{{CLIENT_QUEUES}}})", "tasks waiting"),
                (f"sum(rabbitmq_detailed_queue_messages_unacked{{{CLIENT_QUEUES}}})", "tasks in training"),
                (f"count(rabbitmq_detailed_queue_consumers{{{CLIENT_QUEUES}}} > 0)", "clients connected"),
                (f"count(rabbitmq_detailed_queue_consumers{{{CLIENT_QUEUES}}})", "clients enrolled"),
            ),
            minimum=0,
        ),
        W,
        H,
    )

    L.row("Health")
    L.add(
        timeseries(
            "Broker connected",
            "1 while the service holds a broker connection (fedat_broker_connected). Alerts: FedATPodDisconnected "
            "(one pod, 5 min), FedATServiceDisconnected (most pods of one service), FedATBrokerUnreachable (all).",
            targets(("fedat_broker_connected", "{{job}} {{instance}}")),
            minimum=0,
            maximum=1,
        ),
        W,
        H,
    )
    L.add(
        timeseries(
            "Broker reconnects in the time range",
            "Connection losses per service during the dashboard's time range (fedat_broker_reconnects_total).",
            targets(
                ("sum by (job, instance) (increase(fedat_broker_reconnects_total[$__range]))", "{{job}} {{instance}}")
            ),
            minimum=0,
        ),
        W,
        H,
    )
    L.add(
        timeseries(
            "Scrape targets up",
            "Targets Prometheus scrapes successfully, per job. Alerts: FedATTargetDown (one target, 5 min), "
            "FedATServiceDown (fewer than half of a service's targets).",
            targets(('sum by (job) (up{namespace=~"$namespace"})', "{{job}}")),
            minimum=0,
        ),
        W,
        H,
    )
    L.add(
        timeseries(
            "Dead-lettered by queue, per minute",
            "Messages services sent to the dead-letter exchange, by source queue (fedat_dead_lettered_total); "
            "0 for queues that dead-lettered nothing.",
            targets(
                (
                    f"{rate('fedat_dead_lettered_total', '', 'queue')} * 60"
                    f" or 0 * {rate('fedat_messages_consumed_total', '', 'queue')}",
                    "{{queue}}",
                )
            ),
            minimum=0,
        ),
        W,
        H,
    )
    L.add(
        timeseries(
            "Messages consumed by outcome",
            "Per second, by service and outcome: ok, dead-lettered, error (requeued), "
            "interrupted (requeued by a stopping worker).",
            targets((rate("fedat_messages_consumed_total", "", "job, outcome"), "{{job}} {{outcome}}")),
            "ops",
        ),
        W,
        H,
    )
    L.add(
        timeseries(
            "Event-loop age",
            "Seconds since each service's event loop last turned (it turns while reconnecting too). /healthz fails "
            "(Kubernetes restarts the pod) and FedATEventLoopStalled warns above 60 s.",
            targets(("time() - (fedat_event_loop_timestamp_seconds > 0)", "{{job}} {{instance}}")),
            "s",
            threshold=60,
            minimum=0,
        ),
        W,
        H,
    )
    saved = "and on (job) (max by (job) (fedat_state_saves_total) > 0)"
    L.add(
        timeseries(
            "Checkpoint save time",
            "Time to save one checkpoint, confirmed (fedat_state_save_seconds), stateful services only. "
            "Alert FedATCheckpointSlow when p99 > 1 s for 5 min.",
            targets(
                (
                    f"histogram_quantile(0.5, sum by (job, le) (rate(fedat_state_save_seconds_bucket[{RI}])) {saved})",
                    "{{job}} p50",
                ),
                (
                    f"histogram_quantile(0.99, sum by (job, le) (rate(fedat_state_save_seconds_bucket[{RI}])) {saved})",
                    "{{job}} p99",
                ),
            ),
            "s",
            threshold=1,
        ),
        W,
        H,
    )
    L.add(
        timeseries(
            "Checkpoints saved per second",
            "Checkpoints written ahead of every output, stateful services only (fedat_state_saves_total).",
            targets((f"{rate('fedat_state_saves_total', '', 'job')} {saved}", "{{job}}")),
            "ops",
        ),
        W,
        H,
    )
    L.add(
        timeseries(
            "State held on the broker",
            "What the broker holds of each stateful service's state, before compression (fedat_state_bytes): its "
            "latest snapshot, and the journal written since (up to four snapshots' worth). A restart reads both, so "
            "restore time grows with them; ASO-Fed's grows with every client heard from (one model each).",
            targets(("max by (job, record) (fedat_state_bytes)", "{{job}} {{record}}")),
            "bytes",
            minimum=0,
        ),
        W,
        H,
    )
    L.add(
        timeseries(
            "Handler time p90 by queue",
            "Handler time per consumed message (fedat_handle_seconds), 90th percentile.",
            targets((quantile(0.9, "fedat_handle_seconds", "", "queue"), "{{queue}}")),
            "s",
        ),
        W,
        H,
    )
    return L.panels


def variable_query(name: str, label: str, query: str, multi: bool, all_value: str | None) -> dict:
    var = {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "definition": query,
        "query": {"qryType": 1, "query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "refresh": 2,
        "regex": "",
        "sort": 3,
        "multi": multi,
        "includeAll": True,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "hide": 0,
        "skipUrlSync": False,
    }
    if all_value is not None:
        var["allValue"] = all_value
    return var


def dashboard() -> dict:
    return {
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "description": "FedAT: tiered asynchronous federated learning on RabbitMQ (generated by "
        "infra/grafana/build_dashboard.py; alerts in infra/prometheus/alerts.yaml)",
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": [],
        "liveNow": False,
        "panels": panels(),
        "refresh": "10s",
        "schemaVersion": 39,
        "tags": ["fedat", "federated-learning", "rabbitmq"],
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                    "includeAll": False,
                    "multi": False,
                    "options": [],
                    "refresh": 1,
                    "regex": "",
                    "skipUrlSync": False,
                },
                {
                    "name": "namespace",
                    "label": "Namespace",
                    "type": "query",
                    "datasource": DS,
                    "definition": "label_values(fedat_broker_connected, namespace)",
                    "query": {
                        "qryType": 1,
                        "query": "label_values(fedat_broker_connected, namespace)",
                        "refId": "PrometheusVariableQueryEditor-VariableQuery",
                    },
                    "refresh": 2,
                    "regex": "",
                    "sort": 1,
                    "multi": False,
                    "includeAll": False,
                    "current": {},
                    "options": [],
                    "hide": 0,
                    "skipUrlSync": False,
                },
                variable_query(
                    "vhost",
                    "vhost",
                    'label_values(rabbitmq_detailed_queue_messages{queue=~"fedat[.].*"}, vhost)',
                    multi=False,
                    all_value=".*",
                ),
                variable_query(
                    "tier", "Tier", scoped("label_values(fedat_tier_rounds_closed_total, tier)"), True, None
                ),
            ]
        },
        "time": {"from": "now-30m", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "title": "FedAT",
        "uid": "fedat-overview",
        "version": 1,
        "weekStart": "",
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="fail if the committed JSON differs from the generated one")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args()
    text = render()
    if args.check:
        if not args.out.exists() or args.out.read_text() != text:
            sys.exit(f"{args.out} is out of date: run python {Path(__file__).name}")
        return
    args.out.write_text(text)
    print(f"wrote {args.out} ({len(dashboard()['panels'])} panels and rows)")


if __name__ == "__main__":
    main()
