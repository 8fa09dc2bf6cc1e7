"""A real client, with a real app, model and trainer: it trains only its own tasks, answers profiling and round
tasks and evaluation requests, joins on every connection, and an app that does not fit is named at start."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from fedat.errors import AppError, ConfigError  # noqa: E402
from fedat.protocol import signing, topology  # noqa: E402
from fedat.protocol.service import Reject  # noqa: E402
from fedat.protocol.wire import (  # noqa: E402
    ClientEvaluation,
    EvaluationRequest,
    Join,
    TrainTask,
    Update,
    decode_model,
    encode_against,
    encode_model,
)
from fedat_worker import client_main, local  # noqa: E402
from fedat_worker.app import load_app  # noqa: E402
from fedat_worker.client import answer_timer  # noqa: E402
from fedat_worker.tuned import Overrides, Tuned, overrides_of  # noqa: E402

from ..driver import Driver  # noqa: E402
from .test_filestore import runner  # noqa: E402

pytestmark = pytest.mark.tf
APPS = "tests.unit.client_apps"


def env(app: str = "good", k: int = 1, **extra: str) -> dict[str, str]:
    return {"FEDAT_CLIENT_ID": str(k), "FEDAT_APP": f"{APPS}:{app}", "FEDAT_SIGNING": "off", **extra}


def make(app: str = "good", k: int = 1, delay: float = 0.0):
    return client_main.build(client_main.settings(env(app, k), delay), lambda: False)


@pytest.fixture(scope="module")
def c1():
    return make()


def task(service, client: int = 1, tier: int = 2, codec: str = "polyline", epochs: int = 1, layers=None) -> TrainTask:
    if layers is None:
        layers = encode_model(service.initial_weights, service.names, "raw") if tier else ()
    tid = f"t{tier}-r3-c{client}-v7" if tier else f"p-c{client}"
    return TrainTask(tid, client, tier, 3 if tier else 0, 7 if tier else 0, epochs, 10, 1e-2, 0.0, codec, 4, 100.0,
                     tuple(layers), 50.0)  # fmt: skip


def test_it_joins_on_every_connection_with_its_own_key_and_sample_count(c1):
    d = Driver(c1)
    (first,) = d.start(now=10.0).publish
    (again,) = d.start(now=11.0).publish  # a reconnect after a broker outage: it says so again
    assert isinstance(first.message, Join) and first.message.client == 1 and first.message.n_samples == 40
    assert first.exchange == topology.RESULTS and first.routing_key == "join.client-1"
    assert first.message.id != again.message.id and d.state.joins == 2


def test_a_task_for_another_client_is_refused_with_both_ids_and_nothing_is_trained(c1):
    d = Driver(c1)
    with pytest.raises(Reject, match=r"task t2-r3-c4-v7 is for client 4, but this is client 1"):
        d.deliver(topology.client_queue(1), task(c1, client=4))
    assert d.state.answered == 0


def test_a_profiling_task_is_trained_from_the_initial_model_and_answered_timed_without_layers(c1):
    d = Driver(c1)
    fx = d.deliver(topology.client_queue(1), task(c1, tier=0), now=101.0)
    (out,) = fx.publish
    u: Update = out.message
    assert out.routing_key == "profile.client-1" and fx.ack == (d.tag,)
    assert (u.id, u.task_id, u.client, u.tier, u.layers) == ("u-p-c1", "p-c1", 1, 0, ())
    assert u.n_samples == 40 and u.train_seconds > 0 and u.dispatched_at == 100.0
    assert u.not_before == 0.0 and u.late is False  # real time: the barrier and profiler count its arrival


@pytest.mark.parametrize("codec", ["polyline", "delta"])
def test_a_round_task_is_answered_with_the_trained_model_in_the_tasks_codec(c1, codec):
    d = Driver(c1)
    t = task(c1, codec=codec)
    fx = d.deliver(topology.client_queue(1), t)
    (out,) = fx.publish
    u: Update = out.message
    assert out.exchange == topology.RESULTS and out.routing_key == "tier-2.client-1"
    assert (u.task_id, u.tier, u.round, u.base_version, u.not_before, u.late) == (t.id, 2, 3, 7, 0.0, False)
    assert all(layer.codec == codec for layer in u.layers)
    bases = c1.initial_weights if codec == "delta" else None
    trained = decode_model(u.layers, bases)
    assert [w.shape for w in trained] == [w.shape for w in c1.initial_weights]
    assert max(float(np.abs(a - b).max()) for a, b in zip(trained, c1.initial_weights, strict=True)) > 1e-3
    assert [o.name for o in fx.observe] == ["trained", "epochs", "received_whole"] and fx.observe[0].tier == 2
    assert fx.observe[2].value == sum(len(layer.data) for layer in t.layers)


def test_the_apps_own_settings_win_over_the_tasks():
    tuned = make("tuned")
    fx = Driver(tuned).deliver(topology.client_queue(1), task(tuned, epochs=1))
    assert fx.observe[1].value == 3  # the app's 3 epochs, not the task's 1
    assert overrides_of(tuned.trainer) == Overrides(learning_rate=0.05, batch_size=5, epochs=3)
    assert overrides_of(make().trainer) == Overrides()  # an app that sets none trains as the task says


def test_the_tuned_trainer_passes_the_apps_settings_and_keeps_the_tasks_where_the_app_has_none():
    class Recording:
        def train(self, weights, x, y, **kw):
            self.kw = kw
            return None

    inner = Recording()
    Tuned(inner, Overrides(batch_size=32)).train([], np.zeros(1), np.zeros(1), epochs=2, prox_lambda=0.1, seed=7,
                                                 learning_rate=0.5, batch_size=10)  # fmt: skip
    assert inner.kw == {"epochs": 2, "prox_lambda": 0.1, "seed": 7, "learning_rate": 0.5, "batch_size": 32}


def test_a_task_whose_model_does_not_match_the_apps_is_refused_naming_both():
    other = make("bigger")  # the federation runs a model with 5 outputs; this client's app has 3
    with pytest.raises(Reject) as refused:
        Driver(make()).deliver(topology.client_queue(1), task(other))
    reason = refused.value.reason
    assert "(8, 5)" in reason and "(8, 3)" in reason and f"app {APPS}:good" in reason


def test_with_a_delay_the_answer_waits_for_its_timer_holding_the_task():
    slow = make(delay=2.5)
    d = Driver(slow)
    fx = d.deliver(topology.client_queue(1), task(slow))
    assert fx.publish == () and fx.ack == () and fx.timers == ((2.5, answer_timer(d.tag)),)
    assert d.held[d.tag].note.message.task_id == "t2-r3-c1-v7"
    released = d.timer(answer_timer(d.tag), now=3.0)
    assert [o.message.id for o in released.publish] == ["u-t2-r3-c1-v7"] and released.ack == (d.tag,)
    d.crash()  # a connection lost while waiting loses the answer: the task comes back and is trained again
    assert d.timer(answer_timer(d.tag), now=4.0).publish == ()


def test_it_scores_an_evaluation_request_on_its_own_test_split_once(c1):
    d = Driver(c1)
    req = EvaluationRequest("ev12", 12, 5.0, encode_model(c1.initial_weights, c1.names, "polyline", 4))
    fx = d.deliver(topology.client_evaluate_queue(1), req)
    (out,) = fx.publish
    score: ClientEvaluation = out.message
    assert out.routing_key == "evaluation.client-1" and out.exchange == topology.RESULTS
    assert (score.client, score.version, score.n_samples) == (1, 12, 20)
    assert 0.0 <= score.accuracy <= 1.0 and score.loss > 0
    again = d.deliver(topology.client_evaluate_queue(1), req)
    assert again.publish == () and again.ack == (d.tag,)


def test_bad_apps_are_named_at_start():
    with pytest.raises(AppError, match=r"module 'tests.unit.client_apps' has no attribute 'missing'"):
        make("missing")
    with pytest.raises(AppError, match=r"'not_an_app' is a dict, not a fedat_worker.app.App"):
        load_app(f"{APPS}:not_an_app")
    with pytest.raises(AppError, match=r"output must have shape \(batch, classes\), got \(None, 2, 3\)"):
        make("wrong_output")
    with pytest.raises(AppError, match=r"labels go up to 2 but the model has 2 outputs"):
        make("too_few_outputs")
    with pytest.raises(AppError, match=r"takes inputs of shape \(5,\), the data has \(4,\)"):
        make("wrong_inputs")
    with pytest.raises(AppError, match=r"client 1: train labels must be >= 0, got -1"):
        make("negative_labels")


def test_settings_name_what_is_missing(tmp_path):
    with pytest.raises(ConfigError, match="FEDAT_CLIENT_ID"):
        client_main.settings({"FEDAT_SIGNING": "off"})
    secret = bytes(range(32))
    keyring = tmp_path / "keyring"
    keyring.write_text("".join(f"{n}={h}\n" for n, h in signing.keys_for_role(secret, "client-2").items()))
    with pytest.raises(ConfigError, match=r"holds no key for client-1 \(it holds client-2\)"):
        client_main.settings({"FEDAT_CLIENT_ID": "1", "FEDAT_KEYRING_FILE": str(keyring)})
    with pytest.raises(ConfigError, match="--delay"):
        client_main.settings(env(), delay=-1)


def test_the_env_file_is_the_clients_identity_and_the_flags_win(tmp_path):
    folder = tmp_path / "client-3"
    folder.mkdir()
    (folder / "client.env").write_text(
        "# enrolled\nFEDAT_CLIENT_ID=3\nFEDAT_AMQP_URL_FILE=amqp-url\n"
        "FEDAT_KEYRING_FILE=/etc/k.json\nFEDAT_APP=p.m:app\n\n"
    )
    args = client_main.parse(["--env", str(folder / "client.env"), "--app", f"{APPS}:good", "--delay", "2"])
    got = client_main.environment(args, {"FEDAT_CLIENT_ID": "9", "HOME": "/home/x"})
    assert got["FEDAT_CLIENT_ID"] == "3" and got["HOME"] == "/home/x"
    assert got["FEDAT_AMQP_URL_FILE"] == str(folder / "amqp-url") and got["FEDAT_KEYRING_FILE"] == "/etc/k.json"
    assert got["FEDAT_APP"] == f"{APPS}:good"
    assert args.delay == 2.0
    # it keeps its state beside its identity unless told otherwise; empty: nowhere
    unset = client_main.settings(env())
    assert client_main.state_store(unset, str(folder / "client.env")).folder == folder / "state"
    assert client_main.state_store(unset, None) is None  # no enrollment folder, no default
    assert client_main.state_store(client_main.settings(env(FEDAT_STATE_DIR="")), str(folder / "client.env")) is None
    named = client_main.settings(env(FEDAT_STATE_DIR=str(tmp_path / "kept")))
    assert client_main.state_store(named, str(folder / "client.env")).folder == tmp_path / "kept"
    # a folder it cannot write: named, it is refused; by default (a read-only enrollment mount), it goes without
    (tmp_path / "ro").write_text("")
    with pytest.raises(ConfigError, match="state folder .*ro/state: cannot create it"):
        client_main.state_store(client_main.settings(env(FEDAT_STATE_DIR=str(tmp_path / "ro" / "state"))), None)
    assert client_main.state_store(unset, str(tmp_path / "ro" / "client.env")) is None
    (folder / "bad.env").write_text("FEDAT_CLIENT_ID 3\n")
    with pytest.raises(ConfigError, match=r"bad.env:1: expected NAME=value"):
        client_main.read_env_file(folder / "bad.env")


def test_the_readmes_app_runs_as_a_client(tmp_path, monkeypatch):
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    (tmp_path / "my_app.py").write_text(re.search(r"```python\n# my_app.py\n(.*?)```", readme, re.S).group(1))
    rng = np.random.default_rng(0)
    x, y = rng.random((50, 64), np.float32), rng.integers(0, 10, 50)
    np.savez(tmp_path / "my-data.npz", x_train=x[:40], y_train=y[:40], x_test=x[40:], y_test=y[40:])
    monkeypatch.syspath_prepend(str(tmp_path))
    env = {"FEDAT_CLIENT_ID": "0", "FEDAT_APP": "my_app:app", "FEDAT_SIGNING": "off", "FEDAT_DATA_ROOT": str(tmp_path)}
    readme_client = client_main.build(client_main.settings(env), lambda: False)
    fx = Driver(readme_client).deliver(topology.client_queue(0), task(readme_client, client=0))
    assert fx.publish[0].message.n_samples == 40 and fx.observe[1].value == 2  # the app's own 2 epochs


def test_its_metrics_are_labelled_by_tier_never_by_client(c1):
    from fedat_worker.metrics import client_metrics

    m = client_metrics()
    fx = Driver(c1).deliver(topology.client_queue(1), task(c1))
    for o in (*Driver(c1).start().observe, *fx.observe):
        m.observe(o)
    own = [f for f in m.transport.registry.collect() if f.name.startswith("fedat_client_")]
    labels = {name for f in own for s in f.samples for name in s.labels}
    assert labels <= {"tier", "le", "sent"} and m.trained.labels("2")._value.get() == 1 and m.joins._value.get() == 1
    assert m.task_bytes.labels("2", "whole")._value.get() == sum(len(layer.data) for layer in task(c1).layers)


def test_a_task_sent_against_a_version_it_keeps_decodes_exactly_and_one_it_does_not_keep_is_refused(c1):
    d = Driver(c1)
    rng = np.random.default_rng(3)
    w7 = [(w + rng.normal(0, 0.01, w.shape)).astype(np.float32) for w in c1.initial_weights]
    g7 = encode_model(w7, c1.names, "polyline")
    d.deliver(topology.client_queue(1), task(c1, layers=g7))  # version 7, sent whole
    assert sorted(d.state.models) == [7]
    g9 = encode_model([(w + 0.001).astype(np.float32) for w in w7], c1.names, "polyline")
    against = encode_against(g9, decode_model(g9), decode_model(g7))
    t9 = replace(task(c1, layers=against), id="t2-r4-c1-v9", round=4, version=9, relative_to=7)
    fx = d.deliver(topology.client_queue(1), t9)
    (out,) = fx.publish
    assert out.message.base_version == 9 and sorted(d.state.models) == [7, 9]
    assert fx.observe[2].name == "received_against" and fx.observe[2].value == sum(len(x.data) for x in against)
    assert [w.tobytes() for w in d.state.models[9]] == [w.tobytes() for w in decode_model(g9)]
    with pytest.raises(Reject, match=r"against global version 5, which this receiver does not keep \(it keeps "):
        d.deliver(topology.client_queue(1), replace(t9, id="t2-r5-c1-v9", round=5, relative_to=5))
    # A pool worker keeps no model: a task sent against one is refused, never trained from a wrong model.
    with pytest.raises(Reject, match=r"does not keep \(it keeps none\)"):
        local.start_weights(t9, c1.initial_weights, c1.shapes)


def test_a_restarted_client_decodes_a_task_against_the_version_it_kept_from_its_state_folder(c1, tmp_path):
    rng = np.random.default_rng(4)
    w7 = [(w + rng.normal(0, 0.01, w.shape)).astype(np.float32) for w in c1.initial_weights]
    g7 = encode_model(w7, c1.names, "polyline")
    d = Driver(c1)
    d.deliver(topology.client_queue(1), task(c1, layers=g7))  # version 7, sent whole
    before = runner(c1, tmp_path)
    before.save(None, d.state, ())  # what `run_service` writes ahead of the answer; the process is then killed
    g9 = encode_model([(w + 0.001).astype(np.float32) for w in w7], c1.names, "polyline")
    t9 = replace(task(c1, layers=encode_against(g9, decode_model(g9), decode_model(g7))), id="t2-r4-c1-v9",
                 round=4, version=9, relative_to=7)  # fmt: skip
    with pytest.raises(Reject, match="does not keep"):
        Driver(c1).deliver(topology.client_queue(1), t9)  # restarted without its folder
    restarted = Driver(c1)
    restarted.state = runner(c1, tmp_path).state
    assert [w.tobytes() for w in restarted.state.models[7]] == [w.tobytes() for w in decode_model(g7)]
    (out,) = restarted.deliver(topology.client_queue(1), t9).publish
    assert out.message.base_version == 9


def test_a_state_folder_of_another_federation_or_unreadable_is_moved_aside_never_refused(c1, tmp_path):
    s = client_main.settings(env(FEDAT_AMQP_URL="amqp://u:p@broker.example:5671/fed-a"))
    fp = client_main.state_fingerprint(s, c1.codec.version)
    assert fp["federation"] == "broker.example:5671/fed-a" and fp["client"] == "1"
    d = Driver(c1)
    d.deliver(topology.client_queue(1), task(c1, layers=encode_model(c1.initial_weights, c1.names, "raw")))
    folder = tmp_path / "state"
    saver = runner(c1, folder, fp)
    saver.save(None, d.state, ())
    # the same client of the same federation: kept
    kept = client_main.usable_store(client_main.FileStore(folder, "client"), fp, c1.codec)
    assert kept.load().seq == saver.seq and not list(tmp_path.glob("state.set-aside-*"))
    # the same folder in a new federation (a new vhost numbers its versions anew): moved aside, a fresh start
    other = client_main.state_fingerprint(
        client_main.settings(env(FEDAT_AMQP_URL="amqp://u:p@broker.example:5671/fed-b")), c1.codec.version
    )
    fresh = client_main.usable_store(client_main.FileStore(folder, "client"), other, c1.codec)
    assert fresh.load() is None and (tmp_path / "state.set-aside-1" / "snapshot").exists()
    # unreadable (a state of another shape, or garbage): moved aside too
    (folder / "snapshot").write_bytes(b"garbage")
    again = client_main.usable_store(client_main.FileStore(folder, "client"), fp, c1.codec)
    assert again.load() is None and (tmp_path / "state.set-aside-2").exists()


def test_it_keeps_the_newest_request_sent_whole_and_scores_the_ones_sent_against_it(c1, tmp_path):
    rng = np.random.default_rng(5)
    w = [(a + rng.normal(0, 0.01, a.shape)).astype(np.float32) for a in c1.initial_weights]
    g20 = encode_model(w, c1.names, "polyline")
    g25 = encode_model([(a + 0.002).astype(np.float32) for a in w], c1.names, "polyline")
    whole = EvaluationRequest("er20", 20, 5.0, g20)
    against = EvaluationRequest("er25", 25, 6.0, encode_against(g25, decode_model(g25), decode_model(g20)), 20)
    queue = topology.client_evaluate_queue(1)
    d = Driver(c1)
    scored = d.deliver(queue, whole)
    assert list(d.state.evaluation_model) == [20] and scored.observe[0].name == "asked_whole"
    runner(c1, tmp_path).save(None, d.state, ())
    restarted = Driver(c1)
    restarted.state = runner(c1, tmp_path).state  # the state folder keeps it across a restart
    fx = restarted.deliver(queue, against)
    (out,) = fx.publish
    assert out.message.version == 25 and fx.observe[0].name == "asked_against"
    assert fx.observe[0].value == sum(len(x.data) for x in against.layers)
    # the score of the model sent whole, exactly
    (same,) = Driver(c1).deliver(queue, EvaluationRequest("er25", 25, 6.0, g25)).publish
    assert (out.message.accuracy, out.message.loss) == (same.message.accuracy, same.message.loss)
    # one that came after the request sent whole skips requests until the next one; acked, counted, not dead-lettered
    late = Driver(c1)
    skipped = late.deliver(queue, against)
    assert skipped.publish == () and skipped.ack == (late.tag,) and [o.name for o in skipped.observe] == ["unscorable"]
    assert late.state.evaluated == -1
    # a task model of that version serves as well (the same global model, decoded the same)
    late.deliver(topology.client_queue(1), replace(task(c1, layers=g20), version=20))
    assert late.deliver(queue, against).publish[0].message.version == 25


def test_evaluation_bytes_and_skips_are_counted_by_how_the_model_came(c1):
    from fedat_worker.metrics import client_metrics

    m = client_metrics()
    g = encode_model(c1.initial_weights, c1.names, "polyline")
    d = Driver(c1)
    for fx in (
        d.deliver(topology.client_evaluate_queue(1), EvaluationRequest("er3", 3, 1.0, g)),
        d.deliver(topology.client_evaluate_queue(1), EvaluationRequest("er4", 4, 1.0, g, relative_to=2)),
    ):
        for o in fx.observe:
            m.observe(o)
    assert m.evaluation_bytes.labels("whole")._value.get() == sum(len(x.data) for x in g)
    assert m.unscorable._value.get() == 1 and m.evaluations._value.get() == 1
