"""The Helm chart infra/helm/fedat, offline: lint, render, validate every object, check what it promises.

No cluster and no `helm` binary: helm-python-sdk (the Helm v4 SDK) lints and renders; kubernetes-validate checks
every core object strictly (unknown fields fail) against Kubernetes 1.25 (the chart's kubeVersion floor), 1.33 and
the newest it ships; the custom resources are checked with jsonschema against infra/helm/schemas/ (generated from
the upstream CRDs, see SOURCES.md there), and the KEDA objects also with npm's @kubernetes-models/keda when node
is installed. Rendering happens once per value set (module cache): the whole file runs in a few seconds.
"""

from __future__ import annotations

import base64
import functools
import glob
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlparse

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate import utils as kv_utils

from fedat import signing
from fedat.provision import amqp_url
from fedat.run import SETTINGS, load_experiment

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "infra" / "helm" / "fedat"
SCHEMAS = ROOT / "infra" / "helm" / "schemas"
CI_FILES = sorted(Path(p) for p in glob.glob(str(CHART / "ci" / "*.yaml")))
RELEASE, NAMESPACE = "fedat", "fl"
KUBE_VERSIONS = ("1.25.0", "1.33.0", kubernetes_validate.utils.latest_version())

SERVICES = ("barrier", "aggregator", "profiler", "worker", "evaluator")
SINGLETONS = ("barrier", "aggregator", "profiler")
METRICS_PORTS = {"barrier": 9101, "aggregator": 9102, "profiler": 9103, "worker": 9104, "evaluator": 9105}
CORE_IMAGE = {"barrier", "aggregator", "profiler", "provision"}
TF_IMAGE = {"worker", "evaluator", "seed"}
CUSTOM = {
    ("keda.sh/v1alpha1", "ScaledObject"): "keda.sh_v1alpha1_scaledobject.json",
    ("keda.sh/v1alpha1", "TriggerAuthentication"): "keda.sh_v1alpha1_triggerauthentication.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring.coreos.com_v1_servicemonitor.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "monitoring.coreos.com_v1_prometheusrule.json",
    ("rabbitmq.com/v1beta1", "RabbitmqCluster"): "rabbitmq.com_v1beta1_rabbitmqcluster.json",
}

helm.disable_logging()  # the SDK logs the alerts.yaml symlink at INFO on every chart load
# The schemas of kubernetes-validate are read from disk on every call: read each once.
kv_utils.schema_contents = functools.lru_cache(maxsize=None)(kv_utils.schema_contents)


VALUE_SETS = {"default": {}, **{p.name: yaml.safe_load(p.read_text()) for p in CI_FILES}}
# Branches of the templates no ci/ file takes: rendered and validated too.
VARIANTS = {
    **VALUE_SETS,
    "signing-off": {"signing": {"existingSecret": "", "insecureDisabled": True}},
    "data-pvc-singleton-pdbs": {
        "data": {"existingClaim": "fmnist"},
        "podDisruptionBudget": {"singletons": {"enabled": True}},
    },
    "bare": {
        "networkPolicy": {"enabled": False},
        "metrics": {"service": {"enabled": False}},
        "evaluator": {"enabled": False},
        "seed": {"enabled": False},
        "serviceAccount": {"create": False},
    },
    "operator-plain-keda-scale-to-zero": {
        "broker": {"mode": "operator", "admin": {"existingSecret": ""}},
        "workers": {"replicas": None, "keda": {"enabled": True, "minReplicaCount": 0}, "pdb": {"enabled": False}},
        "metrics": {"serviceMonitor": {"enabled": True}},
    },
}


@pytest.fixture(scope="module")
def chart():
    with helm.Chart.load(CHART) as ch:
        yield ch


@functools.cache
def _render_cached(key: str) -> tuple[dict, ...]:
    with helm.Chart.load(CHART) as ch:
        out = ch.render(json.loads(key), name=RELEASE, namespace=NAMESPACE)
    docs = []
    for template, text in sorted(out.items()):
        if template.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                docs.append(doc)
    return tuple(docs)


def render(values: dict) -> list[dict]:
    """Every rendered object (NOTES.txt left out), for these values merged over the chart's defaults."""
    return [json.loads(json.dumps(d)) for d in _render_cached(json.dumps(values, sort_keys=True))]


def kind(docs, k):
    return [d for d in docs if d["kind"] == k]


def one(docs, k, name):
    [d] = [d for d in docs if d["kind"] == k and d["metadata"]["name"] == name]
    return d


def component(doc) -> str:
    return doc["metadata"]["labels"]["app.kubernetes.io/component"]


def workloads(docs):
    """(component, pod spec, workload) of every Deployment and Job."""
    return [(component(d), d["spec"]["template"]["spec"], d) for d in docs if d["kind"] in ("Deployment", "Job")]


def env_of(container) -> dict:
    return {e["name"]: e for e in container.get("env", [])}


def merged(values: dict) -> dict:
    with helm.Chart.load(CHART) as ch:
        return ch.merge_values(values)


# ----------------------------------------------------------------------------------------------- lint and schemas


@pytest.mark.parametrize("values", VALUE_SETS, ids=list(VALUE_SETS))
@pytest.mark.parametrize("kube", ["v1.25.0", "v1.33.0"])
def test_lint_strict(values, kube):
    report = helm.lint(str(CHART), VALUE_SETS[values] or None, strict=True, kube_version=kube)
    assert report["errors"] == []
    # severity 2 = warning, 3 = error; 1 (info) is only "icon is recommended"
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("values", VARIANTS, ids=list(VARIANTS))
def test_core_objects_validate_strictly(values):
    docs = render(VARIANTS[values])
    core = [d for d in docs if (d["apiVersion"], d["kind"]) not in CUSTOM]
    assert {d["kind"] for d in core} >= {"ConfigMap", "Deployment", "Job"}
    for doc in core:
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                where = ".".join(str(p) for p in e.path)
                pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} on Kubernetes {version}: {where}: {e.message}")
            # an unknown kind would only be a warning in the CLI: every core kind must have had a schema
            except kv_utils.SchemaNotFoundError as e:
                pytest.fail(e.message)


@functools.cache
def _cr_validator(filename: str) -> jsonschema.protocols.Validator:
    schema = json.loads((SCHEMAS / filename).read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def cr_errors(doc) -> list[str]:
    validator = _cr_validator(CUSTOM[(doc["apiVersion"], doc["kind"])])
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]
    if doc["kind"] == "ScaledObject":  # the CRD's one CEL rule (x-kubernetes-validations), not in the JSON schema
        spec = doc["spec"]
        if spec.get("minReplicaCount", 0) > spec.get("maxReplicaCount", 100):
            errors.append("spec: minReplicaCount must be less than or equal to maxReplicaCount")
    return errors


@pytest.mark.parametrize("values", VARIANTS, ids=list(VARIANTS))
def test_custom_resources_match_upstream_crd_schemas(values):
    for doc in render(VARIANTS[values]):
        if (doc["apiVersion"], doc["kind"]) in CUSTOM:
            assert cr_errors(doc) == [], f"{doc['kind']}/{doc['metadata']['name']}"


def test_custom_resource_schemas_refuse_unknown_and_mistyped_fields():
    docs = render(VALUE_SETS["values-operator-keda-monitoring.yaml"])
    found = {(d["apiVersion"], d["kind"]) for d in docs}
    assert found >= set(CUSTOM), f"the operator/KEDA/monitoring set must render every custom kind: {found}"
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) not in CUSTOM:
            continue
        bad = json.loads(json.dumps(doc))
        bad["spec"]["replicaz"] = 3
        assert any("replicaz" in e for e in cr_errors(bad)), doc["kind"]
    so = json.loads(json.dumps(one(docs, "ScaledObject", "fedat-worker")))
    so["spec"]["triggers"][0]["metadata"]["value"] = 4  # trigger metadata is a map of strings
    assert cr_errors(so)
    so = json.loads(json.dumps(one(docs, "ScaledObject", "fedat-worker")))
    so["spec"]["minReplicaCount"] = 50
    assert any("minReplicaCount" in e for e in cr_errors(so))


def test_values_schema_settings_are_the_services_settings(chart):
    props = chart.schema["properties"]["experiment"]["properties"]["settings"]["properties"]
    assert set(props) == set(SETTINGS)


@pytest.mark.parametrize(
    "values, field",
    [
        ({"broker": {"mode": "foo"}}, "/broker/mode"),
        ({"signing": {"existingSecret": ""}}, "/signing/existingSecret"),
        ({"signing": {"existingSecret": None}}, "existingSecret"),
        ({"experiment": {"settings": {"num_tiers": 0}}}, "/experiment/settings/num_tiers"),
        ({"experiment": {"settings": {"num_tier": 3}}}, "num_tier"),
        ({"experiment": {"settings": {"learning_rate": 0}}}, "/experiment/settings/learning_rate"),
        ({"experiment": {"settings": {"strategy": "fedavg2"}}}, "/experiment/settings/strategy"),
        ({"workers": {"replicas": 0}}, "/workers/replicas"),
        ({"broker": {"tls": {"enabled": True}}}, "/broker/tls/existingSecret"),
        ({"broker": {"admin": {"existingSecret": ""}}}, "/broker/admin/existingSecret"),
        ({"broker": {"vhost": "a b"}}, "/broker/vhost"),
        ({"containerSecurityContext": {"readOnlyRootFilesystem": False}}, "readOnlyRootFilesystem"),
        ({"barrier": {"replicas": 2}}, "replicas"),
    ],
)
def test_values_schema_rejects_with_the_field_named(chart, values, field):
    with pytest.raises(helm.HelmValuesError) as err:
        chart.validate_schema(values)  # it merges the chart's defaults itself, as an install does
    assert field in str(err.value)
    with pytest.raises(helm.HelmError):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


def test_values_schema_accepts_every_value_set_and_signing_off(chart):
    for values in VALUE_SETS.values():
        chart.validate_schema(values)
    chart.validate_schema({"signing": {"existingSecret": "", "insecureDisabled": True}})


@pytest.mark.parametrize(
    "values, message",
    [
        ({"workers": {"keda": {"enabled": True}}}, "workers.replicas and workers.keda.enabled are mutually exclusive"),
        ({"workers": {"replicas": 1}}, "workers.pdb.minAvailable (1) must be below the lowest worker count"),
        ({"experiment": {"settings": {"min_clients": 11}}}, "min_clients must not exceed"),
        ({"experiment": {"settings": {"tier_sizes": [1, 2]}}}, "tier_sizes has 2 entries but num_tiers is 5"),
        ({"experiment": {"settings": {"group_sizes": [50, 40]}}}, "group_sizes sum to 90, not num_clients (100)"),
        (
            {"broker": {"tls": {"enabled": True, "existingSecret": "t"}, "managementUrl": "http://mq:15672"}},
            "broker.managementUrl is plain http://",
        ),
    ],
)
def test_render_refuses_inconsistent_values(chart, values, message):
    with pytest.raises(helm.HelmRenderError) as err:
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    assert message in str(err.value)


# ------------------------------------------------------------------------------------------ what the chart promises


@pytest.mark.parametrize("values", VARIANTS, ids=list(VARIANTS))
def test_every_pod_is_locked_down(values):
    docs = render(VARIANTS[values])
    for name, pod, _ in workloads(docs):
        assert pod["automountServiceAccountToken"] is False, name
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
        volumes = {v["name"]: v for v in pod["volumes"]}
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["runAsNonRoot"] is True and sc["runAsUser"] > 0, name
            assert sc["readOnlyRootFilesystem"] is True, name
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["capabilities"]["drop"] == ["ALL"], name
            assert sc["seccompProfile"]["type"] == "RuntimeDefault", name
            tmp = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
            assert tmp and "emptyDir" in volumes[tmp[0]["name"]], f"{name}: writable /tmp"
            assert c["resources"]["requests"] and c["resources"]["limits"], name
    for sa in kind(docs, "ServiceAccount"):
        assert sa["automountServiceAccountToken"] is False


@pytest.mark.parametrize("values", VARIANTS, ids=list(VARIANTS))
def test_singletons_are_one_replica_recreated(values):
    docs = render(VARIANTS[values])
    for name in SINGLETONS:
        d = one(docs, "Deployment", f"fedat-{name}")
        assert d["spec"]["replicas"] == 1 and d["spec"]["strategy"] == {"type": "Recreate"}, name


@pytest.mark.parametrize("values", VARIANTS, ids=list(VARIANTS))
def test_each_pod_runs_its_role_with_its_own_broker_user_and_keyring(values):
    docs = render(VARIANTS[values])
    m = merged(VARIANTS[values])
    creds = m["credentials"]["existingSecret"] or "fedat-broker-credentials"
    keys_secret = m["signing"]["existingSecret"]
    seen = set()
    for name, pod, _ in workloads(docs):
        [c] = pod["containers"]
        image = c["image"].rsplit(":", 1)[0]
        assert name in CORE_IMAGE | TF_IMAGE, name
        assert image == m["image"]["core" if name in CORE_IMAGE else "tf"]["repository"], name
        assert c["args"] == [name], name
        if name == "provision":
            continue
        seen.add(name)
        env = env_of(c)
        assert env["FEDAT_AMQP_URL"]["valueFrom"]["secretKeyRef"] == {"name": creds, "key": f"{name}-amqp-url"}
        assert env["FEDAT_DECLARE_TOPOLOGY"]["value"] == "0", name
        if m["signing"]["insecureDisabled"]:
            assert env["FEDAT_SIGNING"]["value"] == "off", name
            continue
        assert env["FEDAT_KEYRING_FILE"]["value"] == f"/etc/fedat/keys/{name}.json", name
        # every volume that touches the signing Secret projects exactly this role's keyring, and it is mounted there
        touching = [v for v in pod["volumes"] if v.get("secret", {}).get("secretName") == keys_secret]
        assert [v["secret"]["items"] for v in touching] == [[{"key": f"{name}.json", "path": f"{name}.json"}]], name
        [mount] = [mt for mt in c["volumeMounts"] if mt["name"] == touching[0]["name"]]
        assert mount["mountPath"] == "/etc/fedat/keys" and mount["readOnly"] is True
        assert "projected" not in json.dumps(pod["volumes"]), name
    assert seen >= {"barrier", "aggregator", "profiler", "worker"} | ({"seed"} if m["seed"]["enabled"] else set())


def test_worker_pods_cannot_get_the_aggregators_keyring():
    for values in VALUE_SETS.values():
        docs = render(values)
        pod = one(docs, "Deployment", "fedat-worker")["spec"]["template"]["spec"]
        text = json.dumps(pod)
        for other in signing.ROLES:
            if other != "worker":
                assert f"{other}.json" not in text, other
        # and what a worker's keyring holds: only the clients master (it cannot sign a global or tier model)
        assert signing.ROLES["worker"] == (signing.CLIENTS,)


def test_signing_can_only_be_switched_off_explicitly():
    docs = render({"signing": {"existingSecret": "", "insecureDisabled": True}})
    for name, pod, _ in workloads(docs):
        if name == "provision":
            continue
        env = env_of(pod["containers"][0])
        assert env["FEDAT_SIGNING"]["value"] == "off" and "FEDAT_KEYRING_FILE" not in env, name
        assert "keyring" not in {v["name"] for v in pod["volumes"]}


def test_configmap_is_the_experiments_environment():
    docs = render({})
    cm = one(docs, "ConfigMap", "fedat-experiment")
    assert cm["data"] == load_experiment(ROOT / "experiments" / "fmnist2-fedat.yaml").env()
    for name, pod, _ in workloads(docs):
        if name != "provision":
            refs = [e["configMapRef"]["name"] for e in pod["containers"][0]["envFrom"]]
            assert refs == ["fedat-experiment"], name


def test_configmap_prints_large_and_small_numbers_as_python_does():
    from fedat.run import Experiment

    settings = {
        "num_clients": 1000,
        "max_message_bytes": 134217728,
        "learning_rate": 1e-05,
        "num_tiers": 3,
        "tier_sizes": [50, 50, 100],
        "delays": [0, 0.5, 1, 2.25],
        "dataset": "mnist",
    }
    docs = render({"experiment": {"settings": settings}})
    expected = Experiment("x", 1, 1, settings).env()
    assert {k: v for k, v in one(docs, "ConfigMap", "fedat-experiment")["data"].items() if k in expected} == expected
    assert (
        one(render(VALUE_SETS["values-scale-1000.yaml"]), "ConfigMap", "fedat-experiment")["data"]["FEDAT_NUM_CLIENTS"]
        == "1000"
    )


def test_changing_a_setting_rolls_the_pods():
    a = one(render({}), "Deployment", "fedat-barrier")["spec"]["template"]["metadata"]["annotations"]
    b = one(render({"experiment": {"settings": {"epochs": 1}}}), "Deployment", "fedat-barrier")
    assert a["checksum/config"] != b["spec"]["template"]["metadata"]["annotations"]["checksum/config"]


@pytest.mark.parametrize("values", VARIANTS, ids=list(VARIANTS))
def test_probes_and_ports(values):
    docs = render(VARIANTS[values])
    for d in kind(docs, "Deployment"):
        name = component(d)
        [c] = d["spec"]["template"]["spec"]["containers"]
        port = env_of(c)["FEDAT_METRICS_PORT"]["value"]
        assert c["ports"] == [{"name": "metrics", "containerPort": int(port), "protocol": "TCP"}]
        if values == "default":
            assert int(port) == METRICS_PORTS[name]
        for probe, path in (("startupProbe", "/healthz"), ("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            assert c[probe]["httpGet"] == {"path": path, "port": "metrics"}, (name, probe)
        assert d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 30
        if name in ("worker", "evaluator"):  # TensorFlow pods
            mem = c["resources"]["requests"]["memory"]
            assert mem.endswith("Gi") or int(mem.rstrip("Mi")) >= 1024, (name, mem)


@pytest.mark.parametrize("values", VARIANTS, ids=list(VARIANTS))
def test_metrics_services_select_their_pods(values):
    docs = render(VARIANTS[values])
    deployments = {component(d): d for d in kind(docs, "Deployment")}
    services = {component(s): s for s in kind(docs, "Service")}
    if not merged(VARIANTS[values])["metrics"]["service"]["enabled"]:
        assert services == {} and not kind(docs, "ServiceMonitor")
        return
    assert set(services) == set(deployments)
    for name, svc in services.items():
        labels = deployments[name]["spec"]["template"]["metadata"]["labels"]
        assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
        assert all(labels.get(k) == v for k, v in svc["spec"]["selector"].items()), name
        assert svc["spec"]["ports"][0]["targetPort"] == "metrics"
        assert svc["metadata"]["labels"]["fedat/job"] == f"fedat-{name}"  # the job names alerts.yaml expects
    for sm in kind(docs, "ServiceMonitor"):
        if sm["metadata"]["name"] == "fedat":
            sel = sm["spec"]["selector"]["matchLabels"]
            assert sm["spec"]["jobLabel"] == "fedat/job"
            assert all(all(s["metadata"]["labels"].get(k) == v for k, v in sel.items()) for s in services.values())


def test_credentials_secret_urls_are_what_fedat_provision_builds():
    for values in (VALUE_SETS["default"], VALUE_SETS["values-operator-keda-monitoring.yaml"]):
        docs = render(values)
        m = merged(values)
        secret = one(docs, "Secret", "fedat-broker-credentials")
        data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
        job = one(docs, "Job", "fedat-provision")
        env = env_of(job["spec"]["template"]["spec"]["containers"][0])
        prefix = env["FEDAT_USER_PREFIX"]["value"]
        host = env["FEDAT_AMQP_HOST"]["value"]
        scheme = "amqps" if m["broker"]["tls"]["enabled"] else "amqp"
        for role in ("worker", "barrier", "aggregator", "profiler", "evaluator", "seed", "recorder"):
            pw = data[f"{role}-password"]
            assert len(pw) >= 24
            assert data[f"{role}-username"] == f"{prefix}{role}"
            url = amqp_url(host, m["broker"]["vhost"], f"{prefix}{role}", pw, scheme)
            assert data[f"{role}-amqp-url"] == url
            assert unquote(urlparse(url).path[1:]) == m["broker"]["vhost"]
        # what the provisioning Job reads: the same passwords, one file per role named after the role
        roles = env["FEDAT_ROLES"]["value"].split(",")
        [vol] = [v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "passwords"]
        assert vol["secret"]["secretName"] == "fedat-broker-credentials"
        assert vol["secret"]["items"] == [{"key": f"{r}-password", "path": r} for r in roles]
        assert env["FEDAT_PASSWORD_DIR"]["value"] == "/etc/fedat/passwords"
        # every role a pod runs as (and KEDA's recorder) is provisioned
        runs = {component(d) for d in docs if d["kind"] in ("Deployment", "Job")} - {"provision"}
        assert runs <= set(roles)
        assert ("recorder" in roles) == m["workers"]["keda"]["enabled"]
        assert env["FEDAT_NUM_TIERS"]["value"] == str(m["experiment"]["settings"]["num_tiers"])


def test_provision_cli_reads_files_named_after_the_role():
    # The chart relies on `fedat provision --password-dir` reading <dir>/<role>: check it against the real code.
    from fedat.provision import passwords

    with tempfile.TemporaryDirectory() as d:
        Path(d, "worker").write_text("s3cret\n")
        assert passwords(["worker"], d)["worker"] == "s3cret"


def test_existing_secrets_are_used_and_nothing_is_generated():
    docs = render(VALUE_SETS["values-existing-secrets.yaml"])
    assert not [s for s in kind(docs, "Secret") if s["metadata"]["name"] == "fedat-broker-credentials"]
    job = one(docs, "Job", "fedat-provision")
    pod = job["spec"]["template"]["spec"]
    env = env_of(pod["containers"][0])
    assert env["FEDAT_ADMIN_USER"]["valueFrom"]["secretKeyRef"] == {"name": "mq-admin", "key": "user"}
    assert env["FEDAT_USER_PREFIX"]["value"] == "fl-"
    assert env["SSL_CERT_FILE"]["value"] == "/etc/fedat/tls/ca.crt"  # https management API, private CA
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["admin"]["secret"] == {
        "secretName": "mq-admin",
        "defaultMode": 0o440,
        "items": [{"key": "pass", "path": "password"}],
    }
    assert vols["passwords"]["secret"]["secretName"] == "fedat-broker-users"
    worker = one(docs, "Deployment", "fedat-worker")["spec"]["template"]["spec"]
    wenv = env_of(worker["containers"][0])
    assert wenv["FEDAT_TLS_CA_FILE"]["value"] == "/etc/fedat/tls/ca.crt"
    assert wenv["FEDAT_TLS_CERT_FILE"]["value"] == "/etc/fedat/tls/tls.crt"
    assert wenv["FEDAT_TLS_SERVER_NAME"]["value"] == "mq.example.internal"
    assert worker["serviceAccountName"] == "fedat-runner"


def test_hooks_run_in_order():
    def hook(doc):
        a = doc["metadata"].get("annotations", {})
        return a.get("helm.sh/hook"), int(a.get("helm.sh/hook-weight", 0))

    for values, provision_phase in (
        (VALUE_SETS["default"], "pre-install"),
        (VALUE_SETS["values-operator-keda-monitoring.yaml"], "post-install"),
    ):
        docs = render(values)
        phase, w_prov = hook(one(docs, "Job", "fedat-provision"))
        assert phase.split(",") == [provision_phase, "pre-upgrade"]
        seed_phase, w_seed = hook(one(docs, "Job", "fedat-seed"))
        assert seed_phase == "post-install" and w_seed > w_prov
        # what the provisioning Job needs exists before it: the passwords Secret, its account, its NetworkPolicy
        for k, name in (
            ("Secret", "fedat-broker-credentials"),
            ("ServiceAccount", "fedat-hooks"),
            ("NetworkPolicy", "fedat-provision-netpol"),
        ):
            p, w = hook(one(docs, k, name))
            assert p == "pre-install,pre-upgrade" and w < w_prov, name
        # the services are no hooks: they are the release
        assert all(hook(d)[0] is None for d in kind(docs, "Deployment"))


@pytest.mark.parametrize("values", VARIANTS, ids=list(VARIANTS))
def test_network_policies_allow_only_dns_broker_and_scraping(values):
    docs = render(VARIANTS[values])
    m = merged(VARIANTS[values])
    tls = m["broker"]["tls"]["enabled"]
    if m["broker"]["mode"] == "operator":
        amqp = 5671 if tls else 5672
    else:
        amqp = m["broker"]["tls"]["port"] if tls else m["broker"]["port"]
    policies = {p["metadata"]["name"]: p for p in kind(docs, "NetworkPolicy")}
    if not m["networkPolicy"]["enabled"]:
        assert policies == {}
        return
    expected_egress = {"fedat-services-netpol": amqp}
    if m["seed"]["enabled"]:
        expected_egress["fedat-seed-netpol"] = amqp
    mgmt = (
        urlparse(m["broker"]["managementUrl"]).port
        if m["broker"]["mode"] == "external"
        else (15671 if m["broker"]["tls"]["enabled"] else 15672)
    )
    expected_egress["fedat-provision-netpol"] = mgmt
    assert set(policies) == set(expected_egress)
    for name, p in policies.items():
        spec = p["spec"]
        assert spec["policyTypes"] == ["Ingress", "Egress"]
        ports = sorted({(pt["port"], pt["protocol"]) for rule in spec["egress"] for pt in rule["ports"]})
        assert ports == sorted({(53, "UDP"), (53, "TCP"), (expected_egress[name], "TCP")}), name
        if name == "fedat-services-netpol":
            assert [pt["port"] for r in spec["ingress"] for pt in r["ports"]] == ["metrics"]
            assert [r["from"] for r in spec["ingress"]] == [m["networkPolicy"]["metricsFrom"]]
            assert spec["podSelector"]["matchExpressions"][0]["values"] == [
                s for s in SERVICES if s != "evaluator" or m["evaluator"]["enabled"]
            ]
        else:
            assert spec["ingress"] == []
        if m["broker"]["mode"] == "operator":  # the broker peer defaults to the RabbitmqCluster's pods
            peers = spec["egress"][1]["to"]
            assert peers[0]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "fedat-rabbitmq"


def test_keda_owns_the_worker_count():
    docs = render(VALUE_SETS["values-operator-keda-monitoring.yaml"])
    worker = one(docs, "Deployment", "fedat-worker")
    assert "replicas" not in worker["spec"]
    so = one(docs, "ScaledObject", "fedat-worker")
    assert so["spec"]["scaleTargetRef"]["name"] == "fedat-worker"
    queues = [t["metadata"]["queueName"] for t in so["spec"]["triggers"]]
    assert queues == [f"fedat.train.tier-{m}" for m in range(1, 6)] + ["fedat.train.profile"]
    names = [t["name"] for t in so["spec"]["triggers"]]
    assert so["spec"]["advanced"]["scalingModifiers"]["formula"] == " + ".join(names)
    ta = one(docs, "TriggerAuthentication", "fedat-worker-queues")
    refs = {r["parameter"]: r for r in ta["spec"]["secretTargetRef"]}
    assert refs["host"]["key"] == "recorder-amqp-url"  # read-only user, not the workers' or the admin
    assert refs["tls"]["name"] == "fedat-keda-tls" and refs["ca"]["name"] == "fedat-rabbitmq-tls"
    assert all(t["authenticationRef"]["name"] == "fedat-worker-queues" for t in so["spec"]["triggers"])
    # and without KEDA: a fixed count, no ScaledObject
    docs = render({})
    assert one(docs, "Deployment", "fedat-worker")["spec"]["replicas"] == 2
    assert not kind(docs, "ScaledObject")
    # the queue list follows num_tiers
    three = render(
        {"experiment": {"settings": {"num_tiers": 3}}, "workers": {"replicas": None, "keda": {"enabled": True}}}
    )
    so = one(three, "ScaledObject", "fedat-worker")
    assert [t["metadata"]["queueName"] for t in so["spec"]["triggers"]][:-1] == [
        f"fedat.train.tier-{m}" for m in (1, 2, 3)
    ]


def test_prometheus_rule_carries_the_alerts_file():
    source = ROOT / "infra" / "prometheus" / "alerts.yaml"
    docs = render(VALUE_SETS["values-operator-keda-monitoring.yaml"])
    rule = one(docs, "PrometheusRule", "fedat")
    if not source.exists():
        pytest.skip("infra/prometheus/alerts.yaml does not exist: the chart ships its placeholder")
    assert rule["spec"]["groups"] == yaml.safe_load(source.read_text())["groups"]


def test_operator_mode_renders_a_broker_with_management_and_prometheus():
    docs = render(VALUE_SETS["values-operator-keda-monitoring.yaml"])
    rmq = one(docs, "RabbitmqCluster", "fedat-rabbitmq")
    assert {"rabbitmq_management", "rabbitmq_prometheus"} <= set(rmq["spec"]["rabbitmq"]["additionalPlugins"])
    assert rmq["spec"]["tls"]["disableNonTLSListeners"] is True
    job = one(docs, "Job", "fedat-provision")["spec"]["template"]["spec"]
    env = env_of(job["containers"][0])
    assert env["FEDAT_MANAGEMENT_URL"]["value"] == "https://fedat-rabbitmq.fl.svc:15671"
    assert env["FEDAT_ADMIN_USER"]["valueFrom"]["secretKeyRef"]["name"] == "fedat-rabbitmq-default-user"
    assert env["FEDAT_AMQP_HOST"]["value"] == "fedat-rabbitmq.fl.svc:5671"


def test_pdb_only_where_it_means_something():
    docs = render({})
    [pdb] = kind(docs, "PodDisruptionBudget")
    assert pdb["metadata"]["name"] == "fedat-worker" and pdb["spec"]["minAvailable"] == 1
    docs = render({"podDisruptionBudget": {"singletons": {"enabled": True}}})
    singles = {p["metadata"]["name"]: p["spec"] for p in kind(docs, "PodDisruptionBudget")}
    for name in ("fedat-barrier", "fedat-aggregator", "fedat-profiler"):
        assert singles[name]["maxUnavailable"] == 1


@pytest.mark.parametrize("values", VARIANTS, ids=list(VARIANTS))
def test_rendered_manifests_pass_yamllint(values):
    yamllint = pytest.importorskip("yamllint", reason="yamllint not installed: rendered YAML style not checked")
    from yamllint import linter
    from yamllint.config import YamlLintConfig

    conf = YamlLintConfig("extends: relaxed\nrules:\n  line-length: {max: 160}\n")
    with helm.Chart.load(CHART) as ch:
        out = ch.render(VARIANTS[values], name=RELEASE, namespace=NAMESPACE)
    assert yamllint
    for template, text in out.items():
        if template.endswith("NOTES.txt"):
            continue
        problems = [f"{template}:{p.line}: {p.message}" for p in linter.run(text, conf) if p.level == "error"]
        assert problems == []


# ------------------------------------------------------------------------------- KEDA models from npm (node needed)

KEDA_NPM = "@kubernetes-models/keda@2.0.0"
NODE_CHECK = r"""
import { readFileSync } from "node:fs";
import { ScaledObject } from "@kubernetes-models/keda/keda.sh/v1alpha1/ScaledObject";
import { TriggerAuthentication } from "@kubernetes-models/keda/keda.sh/v1alpha1/TriggerAuthentication";
const kinds = { ScaledObject, TriggerAuthentication };
let failed = 0;
for (const doc of JSON.parse(readFileSync(process.argv[2], "utf8"))) {
  try { new kinds[doc.kind](doc).validate(); console.log(`ok ${doc.kind}/${doc.metadata.name}`); }
  catch (e) { failed++; console.log(`FAIL ${doc.kind}/${doc.metadata.name}: ${e.message}`); }
}
process.exit(failed ? 1 : 0);
"""


@pytest.fixture(scope="module")
def keda_models():
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        pytest.skip("node/npm not installed: the @kubernetes-models/keda check of the ScaledObject did not run")
    workdir = Path(tempfile.gettempdir()) / "fedat-chart-keda-models-2.0.0"
    if not (workdir / "node_modules" / "@kubernetes-models" / "keda").is_dir():
        workdir.mkdir(exist_ok=True)
        (workdir / "package.json").write_text('{"name": "fedat-chart-check", "private": true, "type": "module"}\n')
        r = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--loglevel=error", KEDA_NPM],
            cwd=workdir,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert r.returncode == 0, f"npm install {KEDA_NPM} failed:\n{r.stdout}\n{r.stderr}"
    (workdir / "check.mjs").write_text(NODE_CHECK)
    return node, workdir


def test_keda_objects_pass_kubernetes_models_validation(keda_models, tmp_path):
    node, workdir = keda_models
    docs = [
        d for d in render(VALUE_SETS["values-operator-keda-monitoring.yaml"]) if d["apiVersion"] == "keda.sh/v1alpha1"
    ]
    assert {d["kind"] for d in docs} == {"ScaledObject", "TriggerAuthentication"}
    bad = json.loads(json.dumps(one(docs, "ScaledObject", "fedat-worker")))
    bad["metadata"]["name"] = "broken"
    bad["spec"]["minReplicaCount"] = "2"  # a string where the model wants an integer: must fail
    (tmp_path / "good.json").write_text(json.dumps(docs))
    (tmp_path / "bad.json").write_text(json.dumps([bad]))
    env = {**os.environ, "NODE_NO_WARNINGS": "1"}
    good = subprocess.run(
        [node, "check.mjs", str(tmp_path / "good.json")],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert good.returncode == 0, good.stdout + good.stderr
    broken = subprocess.run(
        [node, "check.mjs", str(tmp_path / "bad.json")],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert broken.returncode == 1 and "minReplicaCount" in broken.stdout, broken.stdout + broken.stderr
