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
import re
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

from fedat.deploy.experiment import SETTINGS, load_experiment
from fedat.deploy.provision import amqp_url
from fedat.protocol import signing, topology
from fedat.protocol.system import PROCESSES, Kind, Mode, processes

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "infra" / "helm" / "fedat"
SCHEMAS = ROOT / "infra" / "helm" / "schemas"
CI_FILES = sorted(Path(p) for p in glob.glob(str(CHART / "ci" / "*.yaml")))
RELEASE, NAMESPACE = "fedat", "fl"
KUBE_VERSIONS = ("1.25.0", "1.33.0", kubernetes_validate.utils.latest_version())

SINGLETONS = ("barrier", "aggregator", "profiler")
METRICS_PORTS = {s.name: s.metrics_port for s in PROCESSES if s.metrics_port}
# Hook pods that are no broker role of their own: they run as the admin (management API) or the recorder.
CHECKS = {"provision", "upgrade-check", "test"}
CORE_IMAGE = {s.name for s in PROCESSES if not s.tensorflow} | CHECKS
TF_IMAGE = {s.name for s in PROCESSES if s.tensorflow}
REAL = {"experiment": {"settings": {"clients": "real"}}}
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
    # real clients, a broker from the operator exposed to the sites on its AMQPS port only, the app installed into
    # an image FROM fedat-tf, PDBs for every singleton
    "real-clients-operator": {
        "experiment": {"settings": {"clients": "real", "app": "site_app.model:app"}},
        "image": {"tf": {"repository": "registry.example.com/fedat/site-app", "tag": "1.0.0"}},
        "broker": {
            "mode": "operator",
            "admin": {"existingSecret": ""},
            "tls": {"enabled": True, "existingSecret": "mq-tls"},
        },
        "rabbitmqCluster": {"clientService": {"enabled": True, "loadBalancerSourceRanges": ["198.51.100.0/24"]}},
        "podDisruptionBudget": {"singletons": {"enabled": True}},
        "metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}},
    },
    # the shipped digits example as a package mounted from a ConfigMap (infra/helm/fedat/README.md)
    "real-clients-digits-app": {
        "experiment": {"settings": {"clients": "real", "app": "fedat_digits.app:app"}},
        "app": {
            "volume": {
                "configMap": {
                    "name": "digits-app",
                    "items": [
                        {"key": "__init__.py", "path": "fedat_digits/__init__.py"},
                        {"key": "app.py", "path": "fedat_digits/app.py"},
                    ],
                }
            }
        },
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
    """(component, pod spec, workload) of every Deployment, Job and Pod."""
    out = [(component(d), d["spec"]["template"]["spec"], d) for d in docs if d["kind"] in ("Deployment", "Job")]
    return out + [(component(d), d["spec"], d) for d in docs if d["kind"] == "Pod"]


def env_of(container) -> dict:
    return {e["name"]: e for e in container.get("env", [])}


def merged(values: dict) -> dict:
    with helm.Chart.load(CHART) as ch:
        return ch.merge_values(values)


def mode_of(m: dict) -> Mode:
    """Where the clients are, from merged values (experiment.settings.clients, absent: a pool)."""
    return Mode(m["experiment"]["settings"].get("clients") or "pool")


def services_of(m: dict) -> list[str]:
    """The long-running services merged values must deploy: the system table's processes of that mode that are no
    Job, the evaluator only where it is enabled."""
    return [
        s.name
        for s in processes(mode_of(m))
        if s.kind is not Kind.JOB and (s.name != "evaluator" or m["evaluator"]["enabled"])
    ]


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
    for version in KUBE_VERSIONS:
        # rendered for that version (features gated on it come and go), as `helm install` on such a cluster does
        docs = render({**VARIANTS[values], "kubeVersion": version})
        core = [d for d in docs if (d["apiVersion"], d["kind"]) not in CUSTOM]
        assert {d["kind"] for d in core} >= {"ConfigMap", "Deployment", "Job", "Pod"}
        for doc in core:
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
    # `clients` (FEDAT_CLIENTS) is also what the chart reads to choose its workloads: one per Mode of the system table
    assert props["clients"]["enum"] == [m.value for m in Mode if m is not Mode.ANY]


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
        ({"experiment": {"settings": {"clients": "simulated"}}}, "/experiment/settings/clients"),
        ({"app": {"mountPath": "app"}}, "/app/mountPath"),
        ({"rabbitmqCluster": {"clientService": {"type": "ExternalName"}}}, "/rabbitmqCluster/clientService/type"),
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
        (
            {**REAL, "workers": {"replicas": None, "keda": {"enabled": True}}},
            "experiment.settings.clients=real runs none",
        ),
        (
            {"broker": {"mode": "operator"}, "rabbitmqCluster": {"clientService": {"enabled": True}}},
            "rabbitmqCluster.clientService needs broker.tls.enabled=true",
        ),
        (
            {
                "broker": {"tls": {"enabled": True, "existingSecret": "t"}, "managementUrl": "https://mq:15671"},
                "rabbitmqCluster": {"clientService": {"enabled": True}},
            },
            "an external broker (broker.mode=external) is exposed to the sites where it runs",
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
        assert c["args"] == [name if name != "test" else "release-test"], name
        if name in CHECKS:
            continue
        seen.add(name)
        env = env_of(c)
        if name == "seed":  # it publishes once through a path that reads only the variable
            assert env["FEDAT_AMQP_URL"]["valueFrom"]["secretKeyRef"] == {"name": creds, "key": f"{name}-amqp-url"}
        else:  # the password stays out of the environment: a file projected from its own key only
            assert "FEDAT_AMQP_URL" not in env and env["FEDAT_AMQP_URL_FILE"]["value"] == "/etc/fedat/broker/amqp-url"
            [vol] = [v for v in pod["volumes"] if v["name"] == "broker-url"]
            assert vol["secret"]["secretName"] == creds
            assert vol["secret"]["items"] == [{"key": f"{name}-amqp-url", "path": "amqp-url"}], name
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
    assert seen == set(services_of(m)) | ({"seed"} if m["seed"]["enabled"] else set())


def test_worker_and_collector_pods_cannot_get_the_aggregators_keyring():
    checked = set()
    for values in VALUE_SETS.values():
        docs = render(values)
        for name in ("worker", "collector"):
            found = [d for d in kind(docs, "Deployment") if component(d) == name]
            if not found:
                continue
            checked.add(name)
            text = json.dumps(found[0]["spec"]["template"]["spec"])
            for other in signing.ROLES:
                if other != name:
                    assert f"{other}.json" not in text, (name, other)
    assert checked == {"worker", "collector"}  # a pool and a real-clients value set among the ci/ files
    # and what a worker's keyring holds: only the clients master (it cannot sign a global or tier model)
    assert signing.ROLES["worker"] == (signing.CLIENTS,)


def test_signing_can_only_be_switched_off_explicitly():
    docs = render({"signing": {"existingSecret": "", "insecureDisabled": True}})
    for name, pod, _ in workloads(docs):
        if name in CHECKS:
            continue
        env = env_of(pod["containers"][0])
        assert env["FEDAT_SIGNING"]["value"] == "off" and "FEDAT_KEYRING_FILE" not in env, name
        assert "keyring" not in {v["name"] for v in pod["volumes"]}


def test_configmap_is_the_experiments_environment():
    docs = render({})
    cm = one(docs, "ConfigMap", "fedat-experiment")
    assert cm["data"] == load_experiment(ROOT / "experiments" / "fmnist2-fedat.yaml").env()
    for name, pod, _ in workloads(docs):
        if name not in CHECKS:
            refs = [e["configMapRef"]["name"] for e in pod["containers"][0]["envFrom"]]
            assert refs == ["fedat-experiment"], name
    # the upgrade check sees the NEW settings before the ConfigMap changes: the same values, rendered into its env
    check = env_of(one(docs, "Job", "fedat-upgrade-check")["spec"]["template"]["spec"]["containers"][0])
    assert {k: check[k]["value"] for k in cm["data"]} == cm["data"]
    assert check["FEDAT_RUN_ID"]["value"] == "fl/fedat/fmnist2-fedat"


def test_configmap_prints_large_and_small_numbers_as_python_does():
    from fedat.deploy.experiment import Experiment

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
    # the metrics Services (the broker's Service for the sites is no metrics Service: it is never scraped)
    services = {component(s): s for s in kind(docs, "Service") if s["metadata"]["labels"].get("fedat/metrics")}
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
        for role in ("worker", "barrier", "aggregator", "profiler", "evaluator", "collector", "seed", "recorder"):
            pw = data[f"{role}-password"]
            assert len(pw) >= 24
            assert data[f"{role}-username"] == f"{prefix}{role}"
            url = amqp_url(host, m["broker"]["vhost"], f"{prefix}{role}", pw, scheme)
            assert data[f"{role}-amqp-url"] == url
            assert unquote(urlparse(url).path[1:]) == m["broker"]["vhost"]
        # KEDA's view: the management API as the recorder, the vhost as the path
        mgmt = urlparse(env["FEDAT_MANAGEMENT_URL"]["value"])
        rec = urlparse(data["recorder-management-url"])
        assert (rec.scheme, rec.hostname, rec.port) == (mgmt.scheme, mgmt.hostname, mgmt.port)
        assert unquote(rec.username) == data["recorder-username"] and unquote(rec.password) == data["recorder-password"]
        assert unquote(rec.path[1:]) == m["broker"]["vhost"]
        # a release object Helm keeps at uninstall, not a hook (manifest, diff and rollback see it)
        assert secret["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
        # what the provisioning Job reads: the same passwords, one file per role named after the role; at a
        # pre-install the release's Secret does not exist yet, so that run reads a hook copy made in the same render
        roles = env["FEDAT_ROLES"]["value"].split(",")
        [vol] = [v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "passwords"]
        pre_install = "pre-install" in job["metadata"]["annotations"]["helm.sh/hook"]
        assert vol["secret"]["secretName"] == ("fedat-install-passwords" if pre_install else "fedat-broker-credentials")
        assert vol["secret"]["items"] == [{"key": f"{r}-password", "path": r} for r in roles]
        copies = [d for d in kind(docs, "Secret") if d["metadata"]["name"] == "fedat-install-passwords"]
        if pre_install:
            [copy] = copies
            policy = copy["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
            assert policy == "before-hook-creation,hook-succeeded"
            assert {k: v for k, v in copy["data"].items()} == {
                k: v for k, v in secret["data"].items() if k.endswith("-password")
            }
        else:
            assert copies == []
        assert env["FEDAT_PASSWORD_DIR"]["value"] == "/etc/fedat/passwords"
        # every role a pod runs as (and KEDA's recorder) is provisioned
        runs = {component(d) for d in docs if d["kind"] in ("Deployment", "Job")} - CHECKS
        assert runs <= set(roles)
        assert "recorder" in roles  # KEDA and `helm test` read as it
        assert env["FEDAT_NUM_TIERS"]["value"] == str(m["experiment"]["settings"]["num_tiers"])


def test_provision_cli_reads_files_named_after_the_role():
    # The chart relies on `fedat provision --password-dir` reading <dir>/<role>: check it against the real code.
    from fedat.deploy.provision import passwords

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
        # what the provisioning Job needs exists before it: its account, its NetworkPolicy (and, at a pre-install,
        # the passwords' install copy; a post-install provisioning reads the release's Secret)
        needs = [("ServiceAccount", "fedat-hooks"), ("NetworkPolicy", "fedat-provision-netpol")]
        if provision_phase == "pre-install":
            needs.append(("Secret", "fedat-install-passwords"))
        for k, name in needs:
            p, w = hook(one(docs, k, name))
            assert "pre-install" in p.split(",") and w < w_prov, name  # there before any install hook runs
            # an upgrade's provisioning reads the release's Secret: only the install copy is install-only
            assert ("pre-upgrade" in p.split(",")) == (name != "fedat-install-passwords"), name
        # the upgrade check runs first at an upgrade or a rollback: before provisioning touches users or queues
        check_phase, w_check = hook(one(docs, "Job", "fedat-upgrade-check"))
        assert check_phase == "pre-upgrade,pre-rollback" and w_check < w_prov
        for k, name in (("ServiceAccount", "fedat-hooks"), ("NetworkPolicy", "fedat-upgrade-check-netpol")):
            p, w = hook(one(docs, k, name))
            assert {"pre-upgrade", "pre-rollback"} <= set(p.split(",")) and w < w_check, name
        # the services and the credentials are no hooks: they are the release
        assert all(hook(d)[0] is None for d in kind(docs, "Deployment"))
        assert hook(one(docs, "Secret", "fedat-broker-credentials"))[0] is None
        assert hook(one(docs, "Pod", "fedat-test"))[0] == "test"


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
    # the checks that read the services' metrics ports: the upgrade check (with the metrics Services) and helm test
    readers = []
    if m["upgradeCheck"]["enabled"] and m["metrics"]["service"]["enabled"]:
        expected_egress["fedat-upgrade-check-netpol"] = mgmt
        readers.append("upgrade-check")
    if m["tests"]["enabled"]:
        expected_egress["fedat-test-netpol"] = amqp
        readers.append("test")
    assert set(policies) == set(expected_egress)
    services = services_of(m)
    metrics_ports = {m["workers" if s == "worker" else s]["metricsPort"] for s in services}
    for name, p in policies.items():
        spec = p["spec"]
        assert spec["policyTypes"] == ["Ingress", "Egress"]
        ports = {(pt["port"], pt["protocol"]) for rule in spec["egress"] for pt in rule["ports"]}
        expected = {(53, "UDP"), (53, "TCP"), (expected_egress[name], "TCP")}
        if name in ("fedat-upgrade-check-netpol", "fedat-test-netpol"):
            expected |= {(port, "TCP") for port in metrics_ports}
            scrape = spec["egress"][2]
            assert scrape["to"] == [
                {
                    "podSelector": {
                        "matchLabels": {"app.kubernetes.io/name": "fedat", "app.kubernetes.io/instance": RELEASE}
                    }
                }
            ]  # this release only
        assert ports == expected, name
        if name == "fedat-services-netpol":
            assert {pt["port"] for r in spec["ingress"] for pt in r["ports"]} == {"metrics"}
            froms = [r["from"] for r in spec["ingress"]]
            wanted = [m["networkPolicy"]["metricsFrom"]] if m["networkPolicy"]["metricsFrom"] else []
            if readers:
                wanted.append(
                    [
                        {
                            "podSelector": {
                                "matchLabels": {
                                    "app.kubernetes.io/name": "fedat",
                                    "app.kubernetes.io/instance": RELEASE,
                                },
                                "matchExpressions": [
                                    {"key": "app.kubernetes.io/component", "operator": "In", "values": readers}
                                ],
                            }
                        }
                    ]
                )
            assert froms == wanted
            assert sorted(spec["podSelector"]["matchExpressions"][0]["values"]) == sorted(services)
        else:
            assert spec["ingress"] == []
        if m["broker"]["mode"] == "operator":  # the broker peer defaults to the RabbitmqCluster's pods
            peers = spec["egress"][1]["to"]
            assert peers[0]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "fedat-rabbitmq"


def test_extra_egress_is_added_to_every_policy():
    rule = {"to": [{"ipBlock": {"cidr": "169.254.20.10/32"}}], "ports": [{"port": 53, "protocol": "UDP"}]}
    docs = render({"networkPolicy": {"extraEgress": [rule]}})
    policies = kind(docs, "NetworkPolicy")
    assert len(policies) >= 5
    for p in policies:
        assert p["spec"]["egress"][-1] == rule, p["metadata"]["name"]


def test_keda_owns_the_worker_count_and_counts_tasks_in_training():
    docs = render(VALUE_SETS["values-operator-keda-monitoring.yaml"])
    worker = one(docs, "Deployment", "fedat-worker")
    assert "replicas" not in worker["spec"]
    so = one(docs, "ScaledObject", "fedat-worker")
    assert so["spec"]["scaleTargetRef"]["name"] == "fedat-worker"
    # one trigger: the management API's view (ready + unacked), summed over every train queue its regex names
    [trigger] = so["spec"]["triggers"]
    meta = trigger["metadata"]
    assert meta["protocol"] == "http" and meta["mode"] == "QueueLength" and meta["operation"] == "sum"
    assert meta["useRegex"] == "true" and meta["excludeUnacknowledged"] == "false"
    queues = [q.name for q in topology.queues(5)]
    named = sorted(q for q in queues if re.fullmatch(meta["queueName"].strip("^$"), q))
    assert named == sorted([f"fedat.train.tier-{m}" for m in range(1, 6)] + ["fedat.train.profile"])
    assert "scalingModifiers" not in so["spec"]["advanced"]
    ta = one(docs, "TriggerAuthentication", "fedat-worker-queues")
    refs = {r["parameter"]: r for r in ta["spec"]["secretTargetRef"]}
    assert refs["host"]["key"] == "recorder-management-url"  # read-only user, not the workers' or the admin
    assert refs["tls"]["name"] == "fedat-keda-tls" and refs["ca"]["name"] == "fedat-rabbitmq-tls"
    assert trigger["authenticationRef"]["name"] == "fedat-worker-queues"
    # and without KEDA: a fixed count, no ScaledObject
    docs = render({})
    assert one(docs, "Deployment", "fedat-worker")["spec"]["replicas"] == 2
    assert not kind(docs, "ScaledObject")
    # the regex follows num_tiers
    three = render(
        {"experiment": {"settings": {"num_tiers": 3}}, "workers": {"replicas": None, "keda": {"enabled": True}}}
    )
    regex = one(three, "ScaledObject", "fedat-worker")["spec"]["triggers"][0]["metadata"]["queueName"]
    named = sorted(q.name for q in topology.queues(5) if re.fullmatch(regex.strip("^$"), q.name))
    assert named == ["fedat.train.profile", "fedat.train.tier-1", "fedat.train.tier-2", "fedat.train.tier-3"]


def test_prometheus_rule_carries_the_alerts_file_with_absolute_links():
    source = yaml.safe_load((ROOT / "infra" / "prometheus" / "alerts.yaml").read_text())["groups"]
    docs = render(VALUE_SETS["values-operator-keda-monitoring.yaml"])
    assert one(docs, "PrometheusRule", "fedat")["spec"]["groups"] == source  # no base URLs: the file as it is
    values = {
        **VALUE_SETS["values-operator-keda-monitoring.yaml"],
        "metrics": {
            "serviceMonitor": {"enabled": True},
            "prometheusRule": {
                "enabled": True,
                "runbookBaseUrl": "https://git.example.org/fedat/blob/main/",
                "grafanaUrl": "https://grafana.example.org",
            },
        },
    }
    groups = one(render(values), "PrometheusRule", "fedat")["spec"]["groups"]
    for got, want in zip(groups[0]["rules"], source[0]["rules"], strict=True):
        if "alert" not in want:
            assert got == want
            continue
        a, b = got["annotations"], want["annotations"]
        assert a["runbook_url"] == "https://git.example.org/fedat/blob/main/" + b["runbook_url"]
        assert a["dashboard_url"] == "https://grafana.example.org" + b["dashboard_url"]
        assert {k: v for k, v in a.items() if not k.endswith("_url")} == {
            k: v for k, v in b.items() if not k.endswith("_url")
        }


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


# ------------------------------------------------------------------------------------------ day two: upgrades, release


def render_text(values: dict, **kwargs) -> dict[str, str]:
    """template -> rendered text (NOTES.txt included), as an install or, with is_upgrade=True, an upgrade does."""
    with helm.Chart.load(CHART) as ch:
        return ch.render(values, name=RELEASE, namespace=NAMESPACE, **kwargs)


def test_an_upgrade_that_cannot_read_the_generated_passwords_is_refused_with_the_way_out():
    # offline, lookup answers nothing: exactly the case (GitOps, --dry-run=client) where new passwords would be made
    with pytest.raises(helm.HelmRenderError) as err:
        render_text({}, is_install=False, is_upgrade=True)
    assert "generating new ones would reset every broker user" in str(err.value)
    assert "--set credentials.existingSecret=fedat-broker-credentials" in str(err.value)
    # an install makes them; an upgrade given the Secret by name renders, and its notes say it is an upgrade
    assert "is installed as release fedat" in render_text({})["fedat/templates/NOTES.txt"]
    given = {"credentials": {"existingSecret": "fedat-broker-credentials"}}
    out = render_text(given, is_install=False, is_upgrade=True)
    notes = out["fedat/templates/NOTES.txt"]
    assert "is now revision" in notes and "upgrade check found" in notes and "helm rollback fedat" in notes
    assert "is installed as" not in notes


def test_pdbs_let_a_drain_evict_unhealthy_pods_where_kubernetes_has_the_field():
    values = {"podDisruptionBudget": {"singletons": {"enabled": True}}}
    for version, field in (("1.25.0", False), ("1.26.0", False), ("1.27.0", True), ("1.33.0", True)):
        for pdb in kind(render({**values, "kubeVersion": version}), "PodDisruptionBudget"):
            assert ("unhealthyPodEvictionPolicy" in pdb["spec"]) == field, (version, pdb["metadata"]["name"])
            if field:
                assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_the_upgrade_check_fails_at_once_on_a_refusal_and_retries_what_it_cannot_read():
    for version, policy in (("1.25.0", False), ("1.28.0", True), ("1.33.0", True)):
        job = one(render({"kubeVersion": version}), "Job", "fedat-upgrade-check")
        assert ("podFailurePolicy" in job["spec"]) == policy, version
        if policy:
            [rule] = job["spec"]["podFailurePolicy"]["rules"]
            assert rule["action"] == "FailJob" and rule["onExitCodes"]["values"] == [1]
        assert job["spec"]["backoffLimit"] >= 1
    pod = job["spec"]["template"]["spec"]
    env = env_of(pod["containers"][0])
    assert env["FEDAT_BARRIER_URL"]["value"] == "http://fedat-barrier.fl.svc:9101"
    assert env["FEDAT_PROFILER_URL"]["value"] == "http://fedat-profiler.fl.svc:9103"
    assert env["FEDAT_ADMIN_PASSWORD_FILE"]["value"] == "/etc/fedat/admin/password" and "FEDAT_AMQP_URL" not in env
    # it asks the services over their metrics Services; without them it is not rendered (reading a running
    # service's checkpoint from the broker would race its saves)
    jobs = kind(render({"metrics": {"service": {"enabled": False}}}), "Job")
    assert "upgrade-check" not in {component(j) for j in jobs}


def test_a_rotated_secret_rolls_the_pods():
    def checksums(values):
        pods = [d["spec"]["template"] for d in kind(render(values), "Deployment")]
        return {p["metadata"]["annotations"]["checksum/secrets"] for p in pods}

    a = checksums({"credentials": {"existingSecret": "users-1"}})
    assert len(a) == 1  # every pod reads the same Secrets
    assert checksums({"credentials": {"existingSecret": "users-1"}}) == a
    assert checksums({"credentials": {"existingSecret": "users-2"}}) != a
    assert checksums({"credentials": {"existingSecret": "users-1"}, "signing": {"existingSecret": "keys-2"}}) != a


def test_images_can_be_pinned_by_digest():
    digest = "sha256:" + "ab" * 32
    docs = render({"image": {"core": {"digest": digest}}})
    for name, pod, _ in workloads(docs):
        image = pod["containers"][0]["image"]
        assert image == (f"fedat-core@{digest}" if name in CORE_IMAGE else "fedat-tf:0.1.0"), name
    with helm.Chart.load(CHART) as ch, pytest.raises(helm.HelmValuesError, match="digest"):
        ch.validate_schema({"image": {"core": {"digest": "latest"}}})


def test_the_dashboard_ships_as_a_configmap_for_the_grafana_sidecar():
    docs = render({"dashboards": {"enabled": True, "annotations": {"grafana_folder": "FedAT"}}})
    cm = one(docs, "ConfigMap", "fedat-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "FedAT"}
    shipped = json.loads(cm["data"]["fedat.json"])
    assert shipped == json.loads((ROOT / "infra" / "grafana" / "fedat.json").read_text())
    assert "namespace" in {v["name"] for v in shipped["templating"]["list"]}
    assert not [c for c in kind(render({}), "ConfigMap") if c["metadata"]["name"] == "fedat-dashboard"]


def test_helm_test_checks_broker_model_and_metrics_as_the_read_only_user():
    docs = render({})
    pod = one(docs, "Pod", "fedat-test")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    spec = pod["spec"]
    [c] = spec["containers"]
    env = env_of(c)
    assert c["args"] == ["release-test"] and spec["restartPolicy"] == "Never"
    [vol] = [v for v in spec["volumes"] if v["name"] == "broker-url"]
    assert vol["secret"]["items"] == [{"key": "recorder-amqp-url", "path": "amqp-url"}]
    assert env["FEDAT_METRICS_URLS"]["value"].split(",") == [
        f"http://fedat-{n}.fl.svc:{METRICS_PORTS[n]}" for n in SINGLETONS
    ]
    assert env["FEDAT_EXPECT_GLOBAL"]["value"] == "1"
    no_seed = env_of(one(render({"seed": {"enabled": False}}), "Pod", "fedat-test")["spec"]["containers"][0])
    assert no_seed["FEDAT_EXPECT_GLOBAL"]["value"] == "0"
    assert not kind(render({"tests": {"enabled": False}}), "Pod")


def test_chart_metadata_and_changelog():
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert re.fullmatch(r"\d+\.\d+\.\d+", meta["version"])
    header, data = meta["icon"].split(",", 1)
    assert header == "data:image/svg+xml;base64"
    assert base64.b64decode(data).strip() == (CHART / "icon.svg").read_bytes().strip()
    assert meta["maintainers"] and meta["annotations"]["artifacthub.io/changes"]
    changelog = (CHART / "CHANGELOG.md").read_text()
    assert f"## {meta['version']}\n" in changelog and "semantic versioning" in changelog


# ------------------------------------------------------------------------------ real clients: the server side alone


def test_real_clients_render_the_server_side_only():
    values = VALUE_SETS["values-real-clients.yaml"]
    docs = render(values)
    m = merged(values)
    assert mode_of(m) is Mode.REAL
    deployments = {component(d) for d in kind(docs, "Deployment")}
    assert deployments == {"barrier", "aggregator", "profiler", "collector"}
    assert {component(j) for j in kind(docs, "Job")} == {"provision", "seed", "upgrade-check"}
    # nothing of the simulated pool: no workers, their budget or autoscaler, no central evaluator
    names = {d["metadata"]["name"] for d in docs}
    assert not {n for n in names if "worker" in n or "evaluator" in n}, names
    assert not kind(docs, "ScaledObject") and not kind(docs, "PodDisruptionBudget")
    cm = one(docs, "ConfigMap", "fedat-experiment")["data"]
    assert cm["FEDAT_CLIENTS"] == "real" and cm["FEDAT_APP"] == "my_app:app"
    assert "FEDAT_DELAYS" not in cm and "FEDAT_DATASET" not in cm  # nulled: the pool's latency model and data
    # the collector: the core image, one replica, its own broker user, keyring and metrics port
    collector = one(docs, "Deployment", "fedat-collector")
    [c] = collector["spec"]["template"]["spec"]["containers"]
    assert c["args"] == ["collector"] and c["image"] == f"{m['image']['core']['repository']}:0.1.0"
    assert collector["spec"]["replicas"] == 1 and collector["spec"]["strategy"] == {"type": "Recreate"}
    assert env_of(c)["FEDAT_METRICS_PORT"]["value"] == "9106"
    # provisioning makes users for exactly what runs (the clients' own users come from `fedat enroll`)
    env = env_of(one(docs, "Job", "fedat-provision")["spec"]["template"]["spec"]["containers"][0])
    assert env["FEDAT_ROLES"]["value"].split(",") == [*services_of(m), "seed", "recorder"]
    assert env["FEDAT_AMQP_HOST"]["value"] == "mq.example.org:5671"
    # every service reaches the broker over TLS, checking its name
    for name, pod, _ in workloads(docs):
        if name in ("provision", "upgrade-check"):
            continue
        e = env_of(pod["containers"][0])
        assert e["FEDAT_TLS_CA_FILE"]["value"] == "/etc/fedat/tls/ca.crt", name
        assert e["FEDAT_TLS_SERVER_NAME"]["value"] == "mq.example.org", name
    secret = one(docs, "Secret", "fedat-broker-credentials")
    url = base64.b64decode(secret["data"]["collector-amqp-url"]).decode()
    assert url.startswith("amqps://federation-collector:") and url.endswith("@mq.example.org:5671/federation")
    # helm test reads the collector's metrics too
    test_env = env_of(one(docs, "Pod", "fedat-test")["spec"]["containers"][0])
    assert test_env["FEDAT_METRICS_URLS"]["value"].split(",") == [
        f"http://fedat-{n}.fl.svc:{METRICS_PORTS[n]}" for n in ("barrier", "aggregator", "profiler", "collector")
    ]


def test_real_clients_reach_the_broker_and_nobody_reaches_the_services():
    docs = render(VALUE_SETS["values-real-clients.yaml"])
    policy = one(docs, "NetworkPolicy", "fedat-services-netpol")["spec"]
    assert sorted(policy["podSelector"]["matchExpressions"][0]["values"]) == sorted(
        ["barrier", "aggregator", "profiler", "collector"]
    )
    # ingress: the metrics port only (monitoring and the release's checks); no AMQP, nothing from the sites
    assert [pt for rule in policy["ingress"] for pt in rule["ports"]] == [{"port": "metrics", "protocol": "TCP"}] * 2
    assert all("ipBlock" not in peer for rule in policy["ingress"] for peer in rule["from"])
    # egress: DNS and the broker's amqps port at the address the values name
    [broker] = [r for r in policy["egress"] if {"port": 5671, "protocol": "TCP"} in r["ports"]]
    assert broker["to"] == [{"ipBlock": {"cidr": "203.0.113.10/32"}}]
    # the broker of the operator, exposed to the sites: its AMQPS port only, never management or metrics
    docs = render(VARIANTS["real-clients-operator"])
    svc = one(docs, "Service", "fedat-rabbitmq-clients")
    assert svc["spec"]["type"] == "LoadBalancer" and svc["spec"]["loadBalancerSourceRanges"] == ["198.51.100.0/24"]
    assert svc["spec"]["ports"] == [{"name": "amqps", "port": 5671, "targetPort": 5671, "protocol": "TCP"}]
    broker_pods = {"app.kubernetes.io/name": "fedat-rabbitmq", "app.kubernetes.io/component": "rabbitmq"}
    assert svc["spec"]["selector"] == broker_pods
    rmq = one(docs, "RabbitmqCluster", "fedat-rabbitmq")
    assert rmq["spec"]["tls"]["disableNonTLSListeners"] is True and "service" not in rmq["spec"]  # stays ClusterIP
    assert "fedat/metrics" not in svc["metadata"]["labels"]  # not scraped as a FedAT service
    assert not [s for s in kind(render({}), "Service") if s["metadata"]["name"] == "fedat-rabbitmq-clients"]


def test_monitoring_covers_the_collector():
    docs = render(VALUE_SETS["values-real-clients.yaml"])
    svc = one(docs, "Service", "fedat-collector")
    assert svc["metadata"]["labels"]["fedat/job"] == "fedat-collector"
    assert svc["spec"]["ports"][0]["port"] == 9106
    sm = one(docs, "ServiceMonitor", "fedat")
    assert all(svc["metadata"]["labels"].get(k) == v for k, v in sm["spec"]["selector"]["matchLabels"].items())
    rules = one(docs, "PrometheusRule", "fedat")["spec"]["groups"]
    gone = next(r for g in rules for r in g["rules"] if r.get("alert") == "FedATServiceTargetsGone")
    assert "collector" in gone["expr"]  # a singleton whose targets vanish is seen, the collector too
    assert one(docs, "ConfigMap", "fedat-dashboard")


def test_the_app_is_mounted_into_the_pods_that_import_it():
    def pods(values):
        return {name: pod for name, pod, _ in workloads(render(values))}

    volume = {"configMap": {"name": "my-app"}}
    for values, importers in (
        ({"app": {"volume": volume}}, {"seed", "worker", "evaluator"}),
        ({**REAL, "app": {"volume": volume, "mountPath": "/srv/app"}}, {"seed"}),
    ):
        path = merged(values)["app"]["mountPath"]
        for name, pod in pods(values).items():
            [c] = pod["containers"]
            mounts = [mt for mt in c["volumeMounts"] if mt["name"] == "app"]
            if name in importers:
                assert [v for v in pod["volumes"] if v["name"] == "app"] == [{"name": "app", **volume}], name
                assert mounts == [{"name": "app", "mountPath": path, "readOnly": True}], name
                assert env_of(c)["PYTHONPATH"]["value"] == path, name
            else:  # numpy services and hooks never import the app
                assert not mounts and "PYTHONPATH" not in env_of(c), name
    # without a volume the app is the image's own: nothing mounted, nothing on the path
    for pod in pods({}).values():
        assert "app" not in {v["name"] for v in pod["volumes"]} and "PYTHONPATH" not in env_of(pod["containers"][0])


def test_an_operator_broker_takes_the_largest_message_the_services_send():
    from fedat.protocol import wire

    def conf(values: dict) -> list[str]:
        docs = render({"broker": {"mode": "operator"}, **values})
        return one(docs, "RabbitmqCluster", "fedat-rabbitmq")["spec"]["rabbitmq"]["additionalConfig"].splitlines()

    # RabbitMQ 4.x's own default (16 MiB) would close the channel of a service sending a larger checkpoint part
    assert conf({}) == [f"max_message_size = {wire.MAX_MESSAGE_BYTES}"]
    assert conf({"experiment": {"settings": {"max_message_bytes": 134217728}}}) == ["max_message_size = 134217728"]
    own = {"rabbitmqCluster": {"additionalConfig": "consumer_timeout = 3600000\n"}}
    assert conf(own) == [f"max_message_size = {wire.MAX_MESSAGE_BYTES}", "consumer_timeout = 3600000"]
    theirs = {"rabbitmqCluster": {"additionalConfig": "max_message_size = 33554432\n"}}
    assert conf(theirs) == ["max_message_size = 33554432"]
