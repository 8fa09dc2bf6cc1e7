"""Tests for fedat.protocol.signing: key derivation, keyrings, sign/verify for every kind, every rejection reason."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from fedat.protocol import signing
from fedat.protocol.signing import (
    HEADER_SIGNATURE,
    HEADER_SIGNER,
    REQUIRED_KINDS,
    Keyring,
    KeyringError,
    SignatureError,
    SigningError,
    check,
    derive,
    expected_signer,
    keys_for_role,
    sign,
    verify,
)
from fedat.protocol.wire import (
    Evaluation,
    RoundReport,
    TierAssignment,
    TierModel,
    TrainTask,
    WireError,
    encode,
    encode_model,
    seed_model,
)
from fedat.runtime.keys import keyring_from_env, read_keyring
from tests.factories import answer

SECRET = bytes(range(32))
# Known answers for SECRET = 00 01 .. 1f, computed once and cross-checked with
# `printf 'fedat-key/v1/<name>' | openssl dgst -sha256 -mac HMAC -macopt hexkey:<secret>`.
KNOWN = {
    "barrier": "9b5e35809c04e38fd62d187bc3dc8447b104a774be263bc57d1bc4ea65cd1c04",
    "aggregator": "8277f0956fb51a3c1a2c186788510d30c4d73d17617d070628a9b593e4cbc1f7",
    "profiler": "0a7baeb4480e73304f1fd636191fcdf2f49d740ee8fb7abfef5ade1d288bbbb9",
    "evaluator": "1301c866d9312e8448fdec6cebc7c9ff559833a42b79e088bab75ec3ba75cdc1",
    "seed": "46566633fc1e06c95c595ed83c22823e0ce3bc8fdf5b33f764616234b0aa3880",
    "clients": "588787bd5b9f8ae198d75036a77b8340e8788960da2ccf45f5cb15fafc9342e5",
}
KNOWN_CLIENT_7 = "5dd2ff14eef471527abdea7344900b533c9b763f87b734f09679531a4aeb4408"

ALL = Keyring.from_secret(SECRET)
LAYERS = encode_model([np.array([1.5, -0.25, 3.0], np.float32)], ["dense/bias"], "polyline", 1)


def _task(tier: int = 2, client: int = 3) -> TrainTask:
    return TrainTask(
        id=f"t{tier}-r2-c{client}-v0" if tier else f"p-c{client}",
        client=client,
        tier=tier,
        round=2 if tier else 0,
        version=0,
        epochs=1,
        batch_size=10,
        learning_rate=0.01,
        prox_lambda=0.0,
        codec="polyline",
        precision=1,
        sent_at=100.0,
        layers=LAYERS if tier else (),
    )


def _update(client: int = 3):
    return answer(_task(client=client), 0.5, n=10)


def _messages():
    g0 = seed_model([np.zeros(3, np.float32)], ["dense/bias"], 2, "raw", 4, 1.0)
    return {
        "train (round)": (_task(), "barrier"),
        "train (profile)": (_task(tier=0), "profiler"),
        "update": (_update(), "client-3"),
        "tier-model": (
            TierModel("tm2-r2", 2, 2, 0, 10, (3,), 5, 5, 0, 2.0, LAYERS),
            "barrier",
        ),
        "global-model (seed)": (g0, "seed"),
        "global-model": (replace(g0, id="g1", version=1, tier=2, tier_round=2), "aggregator"),
        "tier-assignment": (TierAssignment("a1", 1, ((3,), (4,)), {3: 1.0, 4: 2.0}, 3.0), "profiler"),
        "round-report": (RoundReport("rr2-r2", 2, 2, {3: 1.5}, (), 1.5, 4.0), "barrier"),
        "evaluation": (Evaluation("e1", 1, 0.5, 0.7, 0.01, 2, 5.0, (0.5, 0.5)), "evaluator"),
    }


MESSAGES = _messages()


# --- derivation and keyrings ---------------------------------------------------------------------------------


def test_derivation_matches_known_answers():
    for name, key in KNOWN.items():
        assert derive(SECRET, name).hex() == key
        assert ALL.key(name).hex() == key
    assert derive(bytes.fromhex(KNOWN["clients"]), "client-7").hex() == KNOWN_CLIENT_7
    assert ALL.key("client-7").hex() == KNOWN_CLIENT_7


def test_client_keys_differ_and_need_the_clients_master():
    assert ALL.key("client-1") != ALL.key("client-2")
    no_clients = Keyring({k: v for k, v in ALL.keys.items() if k != "clients"})
    assert no_clients.key("client-1") is None
    assert ALL.key("client-01") is None  # only the canonical decimal form names a client
    assert ALL.key("client--1") is None


def test_short_or_non_bytes_secret_is_refused():
    with pytest.raises(KeyringError, match="at least 32 bytes"):
        Keyring.from_secret(b"x" * 31)
    with pytest.raises(KeyringError, match="must be bytes"):
        Keyring.from_secret("0" * 64)  # type: ignore[arg-type]


def test_repr_never_shows_key_material():
    text = repr(ALL) + str(ALL)
    for key in KNOWN.values():
        assert key not in text
        assert repr(bytes.fromhex(key)) not in text
    assert "barrier" in text


def test_keyring_is_frozen():
    with pytest.raises(TypeError):
        ALL.keys["barrier"] = b"\0" * 32  # type: ignore[index]
    with pytest.raises(AttributeError):
        ALL.keys = {}  # type: ignore[misc]


def test_keys_for_role_is_minimal():
    worker = keys_for_role(SECRET, "worker")
    assert set(worker) == {"clients"}
    assert worker["clients"] == KNOWN["clients"]
    barrier = {"barrier", "clients", "aggregator", "seed", "profiler", "evaluator"}
    assert set(keys_for_role(SECRET, "barrier")) == barrier
    assert set(keys_for_role(SECRET, "aggregator")) == {"aggregator", "barrier", "seed"}
    assert set(keys_for_role(SECRET, "profiler")) == {"profiler", "clients"}
    assert set(keys_for_role(SECRET, "evaluator")) == {"evaluator", "aggregator", "seed"}
    assert set(keys_for_role(SECRET, "recorder")) == {"aggregator", "seed", "evaluator"}
    assert "barrier" not in keys_for_role(SECRET, "profiler")  # it could forge tier models
    assert set(keys_for_role(SECRET, "seed")) == {"seed"}
    assert keys_for_role(SECRET, "client-7") == {"client-7": KNOWN_CLIENT_7}
    with pytest.raises(KeyringError, match="unknown role"):
        keys_for_role(SECRET, "admin")


def test_worker_keyring_cannot_sign_as_aggregator_or_barrier():
    worker = Keyring.from_mapping(keys_for_role(SECRET, "worker"))
    assert not worker.can_sign("aggregator") and not worker.can_sign("barrier") and not worker.can_sign("seed")
    g1, _ = MESSAGES["global-model"]
    with pytest.raises(SigningError, match="no key for signer 'aggregator'"):
        sign(worker, g1, encode(g1))
    tm, _ = MESSAGES["tier-model"]
    with pytest.raises(SigningError, match="'barrier'"):
        sign(worker, tm, encode(tm))
    u = _update(client=41)
    assert sign(worker, u, encode(u)) == sign(ALL, u, encode(u))


def test_every_role_can_sign_what_it_publishes_and_verify_what_it_must():
    publishes = {
        "worker": ["update"],
        "barrier": ["train (round)", "tier-model", "round-report"],
        "aggregator": ["global-model"],
        "profiler": ["train (profile)", "tier-assignment"],
        "evaluator": ["evaluation"],
        "seed": ["global-model (seed)"],
    }
    must_verify = {
        "barrier": ["update", "global-model", "global-model (seed)", "tier-assignment", "evaluation"],
        "aggregator": ["tier-model", "global-model", "global-model (seed)"],
        "profiler": ["update"],
        "evaluator": ["global-model", "global-model (seed)"],
        "recorder": ["global-model", "global-model (seed)", "evaluation"],
    }
    for role in publishes.keys() | must_verify.keys():
        ring = Keyring.from_mapping(keys_for_role(SECRET, role))
        for name in publishes.get(role, []) + must_verify.get(role, []):
            _, signer = MESSAGES[name]
            assert ring.can_sign(signer), (role, name)


def test_keyring_file_json_and_lines(tmp_path):
    keys = keys_for_role(SECRET, "aggregator")
    as_json = tmp_path / "ring.json"
    as_json.write_text(json.dumps(keys))
    as_lines = tmp_path / "ring.env"
    as_lines.write_text("# aggregator keys\n\n" + "\n".join(f"{k} = {v}" for k, v in keys.items()) + "\n")
    for path in (as_json, as_lines):
        ring = read_keyring(path)
        assert ring.names == {"aggregator", "barrier", "seed"}
        assert ring.key("aggregator") == ALL.key("aggregator")


def test_partial_keyring_from_file_cannot_sign_as_others(tmp_path):
    path = tmp_path / "client7"
    path.write_text(json.dumps(keys_for_role(SECRET, "client-7")))
    ring = read_keyring(path)
    mine, other = _update(client=7), _update(client=8)
    headers = sign(ring, mine, encode(mine))
    verify(ALL, mine, encode(mine), headers)
    with pytest.raises(SigningError, match="client-8"):
        sign(ring, other, encode(other))
    tm, _ = MESSAGES["tier-model"]
    with pytest.raises(SigningError, match="'barrier'"):
        sign(ring, tm, encode(tm))


@pytest.mark.parametrize(
    "text, match",
    [
        ('{"barrier": "zz"}', "key 'barrier' is not hex"),
        ('{"barrier": "00"}', "must be 32 bytes"),
        ('{"admin": "' + "00" * 32 + '"}', "unknown key name 'admin'"),
        ("[1, 2]", "expected a JSON object"),
        ("{not json", "invalid JSON"),
        ("barrier\n", "expected `name=hex`"),
        (f"seed={'00' * 32}\nseed={'00' * 32}\n", "given twice"),
    ],
)
def test_malformed_keyring_files(tmp_path, text, match):
    path = tmp_path / "ring"
    path.write_text(text)
    with pytest.raises(KeyringError, match=match):
        read_keyring(path)


def test_keyring_errors_never_echo_key_material(tmp_path):
    hexkey = KNOWN["barrier"]
    path = tmp_path / "ring"
    path.write_text(f"{hexkey}=barrier\n")  # swapped name and value
    with pytest.raises(KeyringError) as info:
        read_keyring(path)
    assert hexkey not in str(info.value)
    with pytest.raises(KeyringError) as info:
        keyring_from_env({"FEDAT_SIGNING_SECRET": hexkey[:-2] + "zz"})
    assert hexkey[:-2] not in str(info.value)


def test_keyring_from_env(tmp_path):
    assert keyring_from_env({}) is None
    assert keyring_from_env({"FEDAT_SIGNING_SECRET": "  "}) is None
    assert keyring_from_env({"FEDAT_SIGNING_SECRET": SECRET.hex()}) == ALL
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET.hex() + "\n")
    assert keyring_from_env({"FEDAT_SIGNING_SECRET_FILE": str(secret_file)}) == ALL
    ring_file = tmp_path / "ring.json"
    ring_file.write_text(json.dumps(keys_for_role(SECRET, "worker")))
    assert keyring_from_env({"FEDAT_KEYRING_FILE": str(ring_file)}).names == {"clients"}
    with pytest.raises(KeyringError, match="set only one of"):
        keyring_from_env({"FEDAT_SIGNING_SECRET": SECRET.hex(), "FEDAT_KEYRING_FILE": str(ring_file)})
    with pytest.raises(KeyringError, match="at least 32 bytes"):
        keyring_from_env({"FEDAT_SIGNING_SECRET": "00" * 16})
    with pytest.raises(KeyringError, match="cannot read"):
        keyring_from_env({"FEDAT_SIGNING_SECRET_FILE": str(tmp_path / "absent")})


# --- who signs what ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_expected_signer(name):
    msg, signer = MESSAGES[name]
    assert expected_signer(msg) == signer


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_sign_verify_round_trip_every_kind(name):
    msg, signer = MESSAGES[name]
    body = encode(msg)
    headers = sign(ALL, msg, body)
    assert headers[HEADER_SIGNER] == signer
    assert len(headers[HEADER_SIGNATURE]) == 64 and headers[HEADER_SIGNATURE] == headers[HEADER_SIGNATURE].lower()
    verify(ALL, msg, body, headers)
    # pika may hand header values back as bytes
    verify(ALL, msg, body, {k: v.encode() for k, v in headers.items()})
    assert check(ALL, msg, body, headers) is True


def test_signature_is_hmac_of_the_exact_body():
    msg, _ = MESSAGES["update"]
    body = encode(msg)
    import hashlib
    import hmac

    expected = hmac.new(ALL.key("client-3"), body, hashlib.sha256).hexdigest()
    assert sign(ALL, msg, body)[HEADER_SIGNATURE] == expected


# --- rejections -------------------------------------------------------------------------------------------------


def test_tampered_body_is_rejected():
    msg = _update()
    body = encode(msg)
    headers = sign(ALL, msg, body)
    forged = replace(msg, n_samples=10_000)
    with pytest.raises(SignatureError, match=r"signature of update u-t2-r2-c3-v0 does not match client-3's key"):
        verify(ALL, forged, encode(forged), headers)
    flipped = bytearray(body)
    flipped[-1] ^= 1
    with pytest.raises(SignatureError, match="does not match"):
        verify(ALL, msg, bytes(flipped), headers)


def test_update_signed_by_another_client_names_both():
    mine, theirs = _update(client=3), _update(client=4)
    # client 4 signs a body that claims to be client 3's update, with its own key and name
    body = encode(mine)
    headers = {HEADER_SIGNER: "client-4", HEADER_SIGNATURE: signing.signature(ALL.key("client-4"), body)}
    with pytest.raises(SignatureError, match=r"^update u-t2-r2-c3-v0 is signed by client-4, but it names client 3$"):
        verify(ALL, mine, body, headers)
    # ...or with its own key under client 3's name
    headers = {HEADER_SIGNER: "client-3", HEADER_SIGNATURE: signing.signature(ALL.key("client-4"), body)}
    with pytest.raises(SignatureError, match="does not match client-3's key"):
        verify(ALL, mine, body, headers)
    # its own update verifies
    verify(ALL, theirs, encode(theirs), sign(ALL, theirs, encode(theirs)))


def test_wrong_signer_for_a_kind():
    g1, _ = MESSAGES["global-model"]
    body = encode(g1)
    headers = {HEADER_SIGNER: "barrier", HEADER_SIGNATURE: signing.signature(ALL.key("barrier"), body)}
    with pytest.raises(SignatureError, match="global-model g1 is signed by barrier, but must be signed by aggregator"):
        verify(ALL, g1, body, headers)
    # the seed's key does not make a later version valid, nor the aggregator's the seed model
    headers = {HEADER_SIGNER: "aggregator", HEADER_SIGNATURE: signing.signature(ALL.key("seed"), body)}
    with pytest.raises(SignatureError, match="does not match aggregator's key"):
        verify(ALL, g1, body, headers)


def test_missing_or_malformed_headers():
    msg = _update()
    body = encode(msg)
    good = sign(ALL, msg, body)
    for headers in (None, {}, {HEADER_SIGNER: "client-3"}):
        with pytest.raises(SignatureError, match=r"^unsigned update u-t2-r2-c3-v0: no x-fedat-signature header$"):
            verify(ALL, msg, body, headers)
    with pytest.raises(SignatureError, match="no x-fedat-signer header"):
        verify(ALL, msg, body, {HEADER_SIGNATURE: good[HEADER_SIGNATURE]})
    for bad in (good[HEADER_SIGNATURE].upper(), good[HEADER_SIGNATURE][:-1], "zz" * 32, 17, b"\xff" * 64):
        with pytest.raises(SignatureError, match="malformed x-fedat-signature"):
            verify(ALL, msg, body, {HEADER_SIGNER: "client-3", HEADER_SIGNATURE: bad})


def test_verifier_without_the_key_says_so():
    g1, _ = MESSAGES["global-model"]
    body = encode(g1)
    headers = sign(ALL, g1, body)
    worker = Keyring.from_mapping(keys_for_role(SECRET, "worker"))
    with pytest.raises(SignatureError, match="this process holds no key to verify signer 'aggregator'"):
        verify(worker, g1, body, headers)
    with pytest.raises(SignatureError, match="this process holds no key to verify signer 'aggregator'"):
        check(worker, g1, body, headers)  # a required kind: no skipping


def test_another_deployments_secret_does_not_verify():
    other = Keyring.from_secret(bytes(range(1, 33)))
    msg = _update()
    body = encode(msg)
    with pytest.raises(SignatureError, match="does not match"):
        verify(ALL, msg, body, sign(other, msg, body))


def test_signature_error_is_a_wire_error_with_a_reason():
    msg = _update()
    with pytest.raises(WireError) as info:
        verify(ALL, msg, encode(msg), {})
    assert info.value.reason == str(info.value)


# --- the consumer's policy ----------------------------------------------------------------------------------------


def test_required_kinds():
    # models, and what a real client says of itself: who it is, that it leaves, what it scored
    assert REQUIRED_KINDS == {"update", "tier-model", "global-model", "join", "leave", "client-evaluation"}


def test_check_skips_optional_kinds_without_the_key_and_verifies_them_with_it():
    task, _ = MESSAGES["train (round)"]
    body = encode(task)
    worker = Keyring.from_mapping(keys_for_role(SECRET, "worker"))
    assert check(worker, task, body, None) is False  # the worker holds no barrier key: cannot check tasks
    assert check(None, task, body, None) is False  # signing off
    with pytest.raises(SignatureError, match="unsigned train"):
        check(ALL, task, body, None)  # a process holding the barrier key does check
    assert check(ALL, task, body, sign(ALL, task, body)) is True


def test_check_never_skips_required_kinds_when_signing_is_on():
    profiler = Keyring.from_mapping(keys_for_role(SECRET, "profiler"))
    u = _update()
    with pytest.raises(SignatureError, match="unsigned update"):
        check(profiler, u, encode(u), {})
    assert check(profiler, u, encode(u), sign(ALL, u, encode(u))) is True
    assert check(None, u, encode(u), {}) is False  # signing off entirely: nothing is checked


def test_fedat_keys_writes_each_roles_keyring_and_a_worker_cannot_sign_as_the_aggregator(tmp_path):
    import stat

    from fedat.cli import main

    secret = tmp_path / "secret.hex"
    secret.write_text(bytes(range(32)).hex())
    main(["keys", "--secret-file", str(secret), "--out-dir", str(tmp_path / "keys")])
    worker = read_keyring(tmp_path / "keys" / "worker.json")
    assert worker.can_sign("client-12") and not worker.can_sign("aggregator") and not worker.can_sign("barrier")
    assert stat.S_IMODE((tmp_path / "keys" / "barrier.json").stat().st_mode) == 0o600
    assert read_keyring(tmp_path / "keys" / "aggregator.json").can_sign("aggregator")
