"""Every shipped experiment file loads, and uses only settings some service reads."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fedat.deploy.experiment import SETTINGS, check_settings, load_experiment
from fedat.fl.strategies import SETTINGS as STRATEGY_SETTINGS
from fedat.lab.compare_run import load_comparison

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = sorted((ROOT / "experiments").glob("*.yaml"))
# Set by `fedat run` itself for each process, so not an experiment setting.
# `client_id`, `state_dir`: each real client its own (its enrollment folder's client.env, the folder it keeps its
# state in).
PER_PROCESS = {
    "amqp_url", "metrics_port", "tiers", "profile_queue", "declare_topology", "keyring_file", "client_id", "state_dir"
}  # fmt: skip
# The deployment's, not the experiment's: where the broker and its management API are, credentials, keys, TLS.
DEPLOYMENT = {
    "admin_password",
    "admin_password_file",
    "admin_user",
    "amqp_host",
    "amqp_url_file",
    "broker_metrics",
    "credentials_out",
    "expect_global",
    "liveness_seconds",
    "management_url",
    "metrics_urls",
    "password_dir",
    "rabbitmq_bin",
    "roles",
    "service_url",
    "signing",
    "signing_secret",
    "signing_secret_file",
    "tls_ca_file",
    "tls_cert_file",
    "tls_key_file",
    "tls_server_name",
    "test_patience",
    "user_prefix",
    "vhost",
}


def test_the_known_settings_are_exactly_what_the_services_read():
    sources = [p.read_text() for d in ("src", "services") for p in (ROOT / d).rglob("*.py")]
    read = {m.lower() for text in sources for m in re.findall(r'"FEDAT_([A-Z0-9_]+)"', text)}
    # the strategies' settings are read by name from their declarations (fedat.runtime.config.strategy)
    assert SETTINGS == (read | STRATEGY_SETTINGS) - PER_PROCESS - DEPLOYMENT


@pytest.mark.parametrize("path", EXPERIMENTS, ids=[p.stem for p in EXPERIMENTS])
def test_every_shipped_experiment_loads(path: Path):
    if path.stem.startswith("compare-"):
        _, minutes, targets, exps = load_comparison(path)
        assert exps and minutes > 0 and targets
    else:
        assert load_experiment(path).settings


def test_a_misspelt_setting_is_named(tmp_path: Path):
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['step_second'\]"):
        check_settings({"epochs": 3, "step_second": 0.01}, "x.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nsettings: {epochs: 3, clients_per_rnd: 4}\n")
    with pytest.raises(ValueError, match="bad.yaml: unknown setting"):
        load_experiment(bad)
