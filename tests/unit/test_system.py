"""The system table is the one description of the deployment: signing, the topology, provisioning, the image's
entrypoint and the Helm chart's workloads all agree with it."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import helm_python as helm
import pytest
import yaml

from fedat.deploy.launch import process_names
from fedat.deploy.roles import SERVICE_ROLES
from fedat.protocol import signing, topology
from fedat.protocol.system import DURABLE, PROCESSES, SERVICES, Kind, Mode, Phase, processes, service, start_order

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "infra" / "helm" / "fedat"
ENTRYPOINT = ROOT / "infra" / "images" / "fedat-entrypoint"

helm.disable_logging()


DEPLOYMENT_MODES = (Mode.POOL, Mode.REAL)  # the chart's `experiment.settings.clients` (FEDAT_CLIENTS); pool by default


@functools.cache
def workloads(mode: Mode) -> dict[str, dict]:
    """The chart's Deployments and Jobs by component, at its defaults for a deployment whose clients are `mode`."""
    values = {} if mode is Mode.POOL else {"experiment": {"settings": {"clients": mode.value}}}
    with helm.Chart.load(str(CHART)) as ch:
        out = ch.render(values, name="fedat", namespace="fl")
    found = {}
    for template, text in out.items():
        if template.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc and doc["kind"] in ("Deployment", "Job"):
                found[doc["metadata"]["labels"]["app.kubernetes.io/component"]] = doc
    return found


def test_every_reader_takes_the_table():
    assert tuple(SERVICE_ROLES) == tuple(s.name for s in SERVICES)
    assert dict(signing.ROLES) == {s.name: s.keys for s in SERVICES}
    assert topology.STATEFUL == DURABLE == ("barrier", "aggregator", "profiler")
    assert all(set(s.keys) <= set(signing.NAMES) for s in SERVICES)


def test_a_local_deployment_starts_the_seed_first_and_the_profiler_last():
    names = process_names(2)
    assert sorted(names) == sorted(
        ["worker-0", "worker-1", *(s.name for s in processes(Mode.POOL) if s.kind is not Kind.SCALED)]
    )
    assert "collector" not in names and "evaluator" in names
    real = process_names(2, Mode.REAL)  # real clients are processes of their own sites, not of the deployment
    assert "collector" in real and not {"evaluator", "worker-0"} & set(real)
    phases = start_order(names)
    assert phases[0] == ["seed"] and phases[-1] == ["profiler"]
    assert [service(g[0]).phase for g in phases] == [Phase.EARLY, Phase.SERVE, Phase.PROFILE]


def test_the_chart_runs_the_processes_of_each_mode_and_no_other():
    hooks = {"provision", "upgrade-check"}  # Jobs that are no service of the table (the admin's, as hooks)
    for mode in DEPLOYMENT_MODES:
        assert set(workloads(mode)) - hooks == {s.name for s in processes(mode)}, mode


@pytest.mark.parametrize("mode", DEPLOYMENT_MODES, ids=[m.value for m in DEPLOYMENT_MODES])
@pytest.mark.parametrize("svc", PROCESSES, ids=[s.name for s in PROCESSES])
def test_the_chart_runs_each_process_as_the_table_says(svc, mode):
    if svc not in processes(mode):
        assert svc.name not in workloads(mode)
        return
    w = workloads(mode)[svc.name]
    spec = w["spec"]["template"]["spec"]
    container = spec["containers"][0]
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    assert container["args"][0] == svc.name
    assert container["image"].split(":")[0].endswith("fedat-tf" if svc.tensorflow else "fedat-core")
    if svc.kind is Kind.JOB:
        assert w["kind"] == "Job"
        return
    assert w["kind"] == "Deployment"
    assert env["FEDAT_METRICS_PORT"] == str(svc.metrics_port)
    assert [p["containerPort"] for p in container["ports"] if p["name"] == "metrics"] == [svc.metrics_port]
    if svc.kind is Kind.SINGLETON:
        assert w["spec"]["replicas"] == 1
    if svc.durable:  # two copies would compete for the checkpoint: the old pod goes before the new one starts
        assert w["spec"]["strategy"]["type"] == "Recreate"


@pytest.mark.parametrize("svc", PROCESSES, ids=[s.name for s in PROCESSES])
def test_the_image_entrypoint_runs_the_tables_module(svc):
    text = ENTRYPOINT.read_text()
    assert re.search(rf"^\s*{svc.name}\) exec \"\$PY\" -m {re.escape(svc.module)} ", text, re.M), svc


def test_the_docs_table_of_strategy_settings_is_the_generated_one():
    from fedat.fl.strategies import settings_table

    text = (ROOT / "docs" / "architecture.md").read_text()
    begin, end = (
        "<!-- strategy settings: begin (generated from fedat.fl.strategies) -->\n",
        "<!-- strategy settings: end -->",
    )
    assert text[text.index(begin) + len(begin) : text.index(end)] == settings_table()
