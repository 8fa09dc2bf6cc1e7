"""Unit tests for the worker's model zoo and LocalTrainer (synthetic data, CPU, one thread)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.tf

tf = pytest.importorskip("tensorflow")

from fedat_worker.models import MODELS, build_model, configure_threads, weight_names  # noqa: E402
from fedat_worker.trainer import LocalTrainer  # noqa: E402
from fedat_worker.training import TrainResult  # noqa: E402

IMG = (28, 28, 1)
Data = tuple[np.ndarray, np.ndarray]


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> None:
    try:
        configure_threads(1)
    except RuntimeError:
        pass  # another test module already started TF; thread count only affects speed here


@pytest.fixture(scope="module")
def cnn_trainer() -> LocalTrainer:
    return LocalTrainer(build_model("cnn", IMG, 10, seed=0), batch_size=10)


@pytest.fixture(scope="module")
def images() -> Data:
    rng = np.random.default_rng(0)
    return rng.random((200, *IMG), dtype=np.float32), rng.integers(0, 10, 200).astype(np.int64)


def _dist(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return float(np.sqrt(sum(float(((x - y) ** 2).sum()) for x, y in zip(a, b, strict=True))))


# -- models -------------------------------------------------------------------------------------------


def test_registry_names() -> None:
    assert set(MODELS) == {"cnn", "logreg", "lstm"}
    with pytest.raises(ValueError, match="unknown model"):
        build_model("resnet", IMG, 10)


def test_param_counts_and_shapes() -> None:
    assert build_model("cnn", IMG, 10).count_params() == 93_322
    assert build_model("logreg", (784,), 10).count_params() == 7_850
    assert build_model("logreg", IMG, 10).count_params() == 7_850
    cifar = build_model("cnn", (32, 32, 3), 10)
    assert cifar.output_shape == (None, 10)
    assert cifar(np.zeros((2, 32, 32, 3), np.float32)).shape == (2, 10)


def test_lstm_builds() -> None:
    m = build_model("lstm", (10,), 10_000)
    assert m.output_shape == (None, 10_000)
    tokens = np.random.default_rng(0).integers(0, 10_000, (3, 10)).astype(np.int32)
    assert m(tokens, training=False).shape == (3, 10_000)
    names = weight_names(m)
    assert len(names) == len(m.get_weights()) and len(set(names)) == len(names)


def test_weight_names_stable() -> None:
    m = build_model("cnn", IMG, 10)
    names = weight_names(m)
    assert names[:2] == ["cnn/conv1/kernel", "cnn/conv1/bias"]
    assert names[-1] == "cnn/logits/bias"
    assert [w.shape for w in m.get_weights()] == [tuple(v.shape) for v in m.weights]
    # Building more models must not rename layers (no auto-numbered suffixes on the wire).
    assert weight_names(build_model("cnn", IMG, 10)) == names


def test_seed_determinism_in_process() -> None:
    a = build_model("cnn", IMG, 10, seed=7).get_weights()
    build_model("lstm", (10,), 10_000, seed=7)  # disturb any global RNG / name counters
    b = build_model("cnn", IMG, 10, seed=7).get_weights()
    c = build_model("cnn", IMG, 10, seed=8).get_weights()
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[0], c[0]) and not np.array_equal(a[-2], c[-2])


def test_seed_determinism_across_processes() -> None:
    code = (
        "import hashlib, numpy as np\n"
        "from fedat_worker.models import build_model\n"
        "w = build_model('cnn', (28, 28, 1), 10, seed=7).get_weights()\n"
        "print(hashlib.sha256(b''.join(x.tobytes() for x in w)).hexdigest())\n"
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    here = build_model("cnn", IMG, 10, seed=7).get_weights()
    expected = hashlib.sha256(b"".join(x.tobytes() for x in here)).hexdigest()
    assert out.stdout.strip().splitlines()[-1] == expected


def test_configure_threads_idempotent() -> None:
    with pytest.raises(ValueError):
        configure_threads(0)
    tf.constant(1.0) + 1.0  # make sure the runtime is initialised
    n = tf.config.threading.get_intra_op_parallelism_threads()
    if n >= 1 and tf.config.threading.get_inter_op_parallelism_threads() == n:
        configure_threads(n)  # same value again: no error
        with pytest.raises(RuntimeError, match="already initialised"):
            configure_threads(n + 1)


# -- trainer ------------------------------------------------------------------------------------------


def test_training_learns_separable_problem() -> None:
    rng = np.random.default_rng(1)
    w_true = rng.normal(size=(20, 3))
    x = rng.normal(size=(300, 20)).astype(np.float32)
    y = np.argmax(x @ w_true, axis=1)
    model = build_model("logreg", (20,), 3, seed=0)
    trainer = LocalTrainer(model, learning_rate=0.02, batch_size=10)
    w0 = model.get_weights()
    loss0, acc0 = trainer.evaluate(w0, x, y)
    r1 = trainer.train(w0, x, y, epochs=1, prox_lambda=0.0, seed=0)
    r5 = trainer.train(w0, x, y, epochs=6, prox_lambda=0.0, seed=0)
    loss5, acc5 = trainer.evaluate(r5.weights, x, y)
    assert loss5 < 0.5 * loss0
    assert acc5 > 0.9 > acc0
    assert r5.loss < r1.loss  # last-epoch training loss keeps falling
    assert trainer.trace_count == 1


def test_train_result_fields(cnn_trainer: LocalTrainer, images: Data) -> None:
    x, y = images
    w0 = cnn_trainer.model.get_weights()
    r = cnn_trainer.train(w0, x[:35], y[:35], epochs=1, prox_lambda=0.0, seed=0)
    assert isinstance(r, TrainResult)
    assert r.n_samples == 35 and r.seconds > 0 and np.isfinite(r.loss)
    assert [w.shape for w in r.weights] == [w.shape for w in w0]
    assert all(w.dtype == np.float32 for w in r.weights)
    before = r.weights[0].copy()
    cnn_trainer.train(w0, x[:35], y[:35], epochs=1, prox_lambda=0.0, seed=1)
    assert np.array_equal(r.weights[0], before)  # returned arrays are copies, not views of variables


def test_proximal_term_anchors_weights(cnn_trainer: LocalTrainer, images: Data) -> None:
    x, y = images
    w0 = build_model("cnn", IMG, 10, seed=3).get_weights()
    free = cnn_trainer.train(w0, x, y, epochs=1, prox_lambda=0.0, seed=0)
    prox = cnn_trainer.train(w0, x, y, epochs=1, prox_lambda=1e4, seed=0)
    d_free, d_prox = _dist(free.weights, w0), _dist(prox.weights, w0)
    assert d_free > 0
    assert d_prox < 0.2 * d_free


def test_no_retracing_across_clients(cnn_trainer: LocalTrainer, images: Data) -> None:
    x, y = images
    w0 = cnn_trainer.model.get_weights()
    cnn_trainer.train(w0, x, y, epochs=1, prox_lambda=0.0, seed=0)
    after_first = cnn_trainer.trace_count
    # Different size with a partial last batch (73 = 7*10 + 3), different λ, more epochs.
    cnn_trainer.train(w0, x[:73], y[:73], epochs=2, prox_lambda=0.1, seed=5)
    cnn_trainer.train(w0, x[:1], y[:1], epochs=1, prox_lambda=3.0, seed=6)
    cnn_trainer.train(w0, x[:30], y[:30], epochs=1, prox_lambda=0.0, seed=7, batch_size=7)  # a task's own batch size
    assert after_first == 1 and cnn_trainer.trace_count == 1
    cnn_trainer.evaluate(w0, x, y)
    cnn_trainer.evaluate(w0, x[:17], y[:17], batch_size=5)
    assert cnn_trainer.eval_trace_count == 1


def test_batch_size_changes_the_number_of_steps(images: Data) -> None:
    x, y = images
    model = build_model("logreg", IMG, 10, seed=0)
    trainer = LocalTrainer(model, learning_rate=0.01, batch_size=10)
    w0 = model.get_weights()
    small = trainer.train(w0, x[:40], y[:40], epochs=1, prox_lambda=0.0, seed=1, batch_size=1)
    large = trainer.train(w0, x[:40], y[:40], epochs=1, prox_lambda=0.0, seed=1, batch_size=40)
    # 40 Adam steps move the weights further than a single step does.
    assert np.linalg.norm(small.weights[0] - w0[0]) > 2 * np.linalg.norm(large.weights[0] - w0[0])


def test_optimizer_reset_gives_identical_reruns(cnn_trainer: LocalTrainer, images: Data) -> None:
    x, y = images
    w0 = build_model("cnn", IMG, 10, seed=4).get_weights()
    a = cnn_trainer.train(w0, x[:60], y[:60], epochs=2, prox_lambda=0.01, seed=9)
    cnn_trainer.train(w0, x[60:], y[60:], epochs=1, prox_lambda=0.0, seed=1)  # dirty the Adam moments
    b = cnn_trainer.train(w0, x[:60], y[:60], epochs=2, prox_lambda=0.01, seed=9)
    assert a.loss == b.loss
    assert all(np.array_equal(p, q) for p, q in zip(a.weights, b.weights, strict=True))
    c = cnn_trainer.train(w0, x[:60], y[:60], epochs=2, prox_lambda=0.01, seed=10)
    assert not np.array_equal(a.weights[0], c.weights[0])  # the seed does drive the shuffle


def test_per_task_learning_rate(cnn_trainer: LocalTrainer, images: Data) -> None:
    x, y = images
    w0 = cnn_trainer.model.get_weights()
    tiny = cnn_trainer.train(w0, x[:40], y[:40], epochs=1, prox_lambda=0.0, seed=0, learning_rate=1e-7)
    default = cnn_trainer.train(w0, x[:40], y[:40], epochs=1, prox_lambda=0.0, seed=0)
    assert _dist(tiny.weights, w0) < 1e-3 * _dist(default.weights, w0)
    assert cnn_trainer.trace_count == 1
    with pytest.raises(ValueError, match="learning_rate"):
        cnn_trainer.train(w0, x, y, epochs=1, prox_lambda=0.0, seed=0, learning_rate=0.0)


def test_bad_inputs_raise(cnn_trainer: LocalTrainer, images: Data) -> None:
    x, y = images
    w0 = cnn_trainer.model.get_weights()
    bad = list(w0)
    bad[2] = np.zeros((3, 3, 32, 65), np.float32)
    msg = r"weight 2 \(cnn/conv2/kernel\).*\(3, 3, 32, 64\).*\(3, 3, 32, 65\)"
    with pytest.raises(ValueError, match=msg):
        cnn_trainer.train(bad, x, y, epochs=1, prox_lambda=0.0, seed=0)
    with pytest.raises(ValueError, match="weight tensors"):
        cnn_trainer.train(w0[:-1], x, y, epochs=1, prox_lambda=0.0, seed=0)
    with pytest.raises(ValueError, match="0 samples"):
        cnn_trainer.train(w0, x[:0], y[:0], epochs=1, prox_lambda=0.0, seed=0)
    with pytest.raises(ValueError, match="0 samples"):
        cnn_trainer.evaluate(w0, x[:0], y[:0])
    with pytest.raises(ValueError, match="samples have shape"):
        cnn_trainer.train(w0, np.zeros((5, 32, 32, 3), np.float32), y[:5], epochs=1, prox_lambda=0.0, seed=0)
    with pytest.raises(ValueError, match="y has"):
        cnn_trainer.train(w0, x[:5], y[:4], epochs=1, prox_lambda=0.0, seed=0)


def test_evaluate_per_client_matches_evaluate(cnn_trainer: LocalTrainer, images: Data) -> None:
    x, y = images
    # Slightly trained weights so accuracy differs between clients.
    w = cnn_trainer.train(cnn_trainer.model.get_weights(), x, y, epochs=1, prox_lambda=0.0, seed=0).weights
    cuts = [(0, 13), (13, 13), (13, 120), (120, 200)]
    clients = [(x[a:b], y[a:b]) for a, b in cuts]
    got = cnn_trainer.evaluate_per_client(w, clients, batch_size=64)
    assert len(got) == len(clients)
    assert got[1][2] == 0 and np.isnan(got[1][0]) and np.isnan(got[1][1])
    for (a, b), (loss, acc, n) in zip(cuts, got, strict=True):
        if a == b:
            continue
        ref_loss, ref_acc = cnn_trainer.evaluate(w, x[a:b], y[a:b])
        assert n == b - a
        assert loss == pytest.approx(ref_loss, rel=1e-5)
        assert acc == pytest.approx(ref_acc)
    # Hand check of accuracy on one client against raw logits.
    logits = cnn_trainer.model(x[13:120], training=False).numpy()
    assert got[2][1] == pytest.approx(float(np.mean(np.argmax(logits, 1) == y[13:120])))


def test_a_stopping_process_interrupts_training_between_epochs(images: Data) -> None:
    from fedat.protocol.service import Interrupted

    x, y = images
    asked = []

    def stopping() -> bool:
        asked.append(1)
        return len(asked) > 3  # SIGTERM arrives during the third epoch

    trainer = LocalTrainer(build_model("logreg", IMG, 10, seed=0), stopping=stopping)
    with pytest.raises(Interrupted):
        trainer.train(trainer.model.get_weights(), x, y, epochs=100, prox_lambda=0.0, seed=0)
    assert len(asked) == 4  # asked before each epoch: three ran, the fourth never started
