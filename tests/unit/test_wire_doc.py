"""docs/wire-format.md's examples are real: every marked hex block decodes, and its signatures and keys verify.

Marked blocks are fenced as ```hex <marker> [attr=value ...]```:
  `secret`                       the example deployment secret
  `key:<name>`                   a key derived from it (`client-<k>` from the clients master)
  `message:<name> bytes=<n>`     a whole message body, n bytes
  `signature:<name> signer=<s>`  the x-fedat-signature of message <name>, signed by <s>
"""

from __future__ import annotations

import hashlib
import hmac
import re
from pathlib import Path
from types import SimpleNamespace

import msgpack
import numpy as np
import polyline
import pytest

from fedat.protocol import signing, wire
from fedat.protocol.codec import encode_layer

DOC = Path(__file__).resolve().parents[2] / "docs" / "wire-format.md"
DOC_VERSION = 3
_BLOCK = re.compile(r"^```hex ([^\n]*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _blocks() -> dict[str, tuple[dict[str, str], bytes]]:
    out = {}
    for info, text in _BLOCK.findall(DOC.read_text(encoding="utf-8")):
        marker, *attrs = info.split()
        assert marker not in out, f"marker {marker!r} appears twice in {DOC.name}"
        out[marker] = (dict(a.split("=", 1) for a in attrs), bytes.fromhex(text))
    return out


BLOCKS = _blocks()
MESSAGES = sorted(m.split(":", 1)[1] for m in BLOCKS if m.startswith("message:"))
SIGNATURES = sorted(m.split(":", 1)[1] for m in BLOCKS if m.startswith("signature:"))
KEYS = sorted(m.split(":", 1)[1] for m in BLOCKS if m.startswith("key:"))
KEYRING = signing.Keyring.from_secret(BLOCKS["secret"][1])


# What the examples must say, field by field (layers compared separately).
EXPECTED = {
    "profile-task": wire.TrainTask(
        id="p-c7",
        client=7,
        tier=0,
        round=0,
        version=0,
        epochs=1,
        batch_size=10,
        learning_rate=0.001,
        prox_lambda=0.0,
        codec="polyline",
        precision=4,
        sent_at=1700000000.5,
        layers=(),
        run_started_at=1699999990.0,
    ),
    "update": wire.Update(
        id="u-t1-r1-c7-v0",
        task_id="t1-r1-c7-v0",
        client=7,
        tier=1,
        round=1,
        base_version=0,
        n_samples=600,
        loss=0.5,
        dispatched_at=1700000000.5,
        started_at=1700000001.0,
        finished_at=1700000003.0,
        train_seconds=2.0,
        not_before=1700000004.5,
        late=False,
        layers=(wire.Layer("dense/bias", (3,), "polyline", 1, b"]D]E"),),
    ),
    # §4.8-§4.11: a real client's own kinds
    "join": wire.Join(id="j-c7-1700000000500", client=7, n_samples=600, sent_at=1700000000.5),
    "leave": wire.Leave(id="l-c7-1700000100000", client=7, reason="stopped", sent_at=1700000100.0),
    "client-evaluation": wire.ClientEvaluation(
        id="e130-c7", client=7, version=130, loss=0.5, accuracy=0.875, n_samples=150, evaluated_at=1700000050.25
    ),
}


def test_the_doc_has_the_marked_examples():
    assert {"secret", "key:clients", "key:client-7"} <= BLOCKS.keys()
    assert set(MESSAGES) >= {"profile-task", "update", "join", "leave", "client-evaluation"}
    assert set(SIGNATURES) == set(MESSAGES), "every example message needs its signature"
    assert len(BLOCKS["secret"][1]) >= signing.MIN_SECRET_BYTES


def test_the_doc_is_for_the_version_it_claims():
    text = DOC.read_text(encoding="utf-8")
    assert text.startswith(f"# FedAT wire format (schema version {DOC_VERSION})")
    assert f"`v = {DOC_VERSION}`" in text
    assert f"must be the msgpack int `{DOC_VERSION}`" in text


@pytest.mark.parametrize("name", MESSAGES)
def test_example_message_bytes(name):
    attrs, body = BLOCKS[f"message:{name}"]
    assert len(body) == int(attrs["bytes"]), "the byte count stated next to the block is wrong"
    raw = msgpack.unpackb(body, raw=False, strict_map_key=False)
    assert raw["v"] == DOC_VERSION and type(raw["v"]) is int


@pytest.mark.parametrize("name", MESSAGES)
def test_example_message_decodes(name):
    _, body = BLOCKS[f"message:{name}"]
    msg = wire.decode(body)
    assert msg == EXPECTED[name]
    assert wire.encode(msg) == body  # the reference encoder writes exactly these bytes
    if getattr(msg, "layers", ()):
        assert np.array_equal(wire.decode_model(msg.layers)[0], np.array([1.5, -0.3, 3.0], np.float32))


@pytest.mark.parametrize("name", KEYS)
def test_example_keys(name):
    _, key = BLOCKS[f"key:{name}"]
    assert KEYRING.key(name) == key


def test_key_table_matches_the_secret():
    rows = re.findall(r"^\| `([a-z]+)` +\| `([0-9a-f]{64})` \|$", DOC.read_text(encoding="utf-8"), re.MULTILINE)
    assert {name for name, _ in rows} == set(signing.NAMES)
    for name, hexkey in rows:
        assert KEYRING.key(name).hex() == hexkey, name


@pytest.mark.parametrize("name", SIGNATURES)
def test_example_signature_hmac(name):
    """Version-independent: the HMAC of the block's bytes under the named signer's key is the stated signature."""
    attrs, sig = BLOCKS[f"signature:{name}"]
    _, body = BLOCKS[f"message:{name}"]
    assert hmac.compare_digest(hmac.new(KEYRING.key(attrs["signer"]), body, hashlib.sha256).digest(), sig)
    raw = msgpack.unpackb(body, raw=False, strict_map_key=False)
    assert signing.expected_signer(SimpleNamespace(**raw)) == attrs["signer"]
    assert f"x-fedat-signer: {attrs['signer']}" in DOC.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", SIGNATURES)
def test_example_signature_verifies(name):
    attrs, sig = BLOCKS[f"signature:{name}"]
    _, body = BLOCKS[f"message:{name}"]
    msg = wire.decode(body)
    headers = {signing.HEADER_SIGNER: attrs["signer"], signing.HEADER_SIGNATURE: sig.hex()}
    signing.verify(KEYRING, msg, body, headers)
    assert signing.sign(KEYRING, msg, body) == headers
    # and only the signer's own key verifies it
    if msg.kind in ("join", "leave", "client-evaluation"):
        other = {signing.HEADER_SIGNER: f"client-{msg.client + 1}", signing.HEADER_SIGNATURE: sig.hex()}
        with pytest.raises(signing.SignatureError, match=f"must be signed by client-{msg.client}"):
            signing.verify(KEYRING, msg, body, other)
    if msg.kind == "update":
        other = {signing.HEADER_SIGNER: f"client-{msg.client + 1}", signing.HEADER_SIGNATURE: sig.hex()}
        with pytest.raises(signing.SignatureError, match=f"but it names client {msg.client}"):
            signing.verify(KEYRING, msg, body, other)


def test_float32_claims_of_section_5_2():
    """§5.2: byte-identical to the package given Python floats, not given numpy float32 scalars."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(10_001) * 50).astype(np.float32)

    def pairs(values):
        values = list(values) + [values[0] * 0]
        return list(zip(values[0::2], values[1::2], strict=True))

    for p in (1, 4, 8):
        assert encode_layer(x, p) == polyline.encode(pairs(x.tolist()), p).encode()
        assert encode_layer(x.astype(np.float64), p) == encode_layer(x, p)
    v = np.float32(75.85)
    assert float(v) == 75.8499984741211
    assert encode_layer(np.array([v]), 1) == b"kn@?" == polyline.encode([(float(v), 0.0)], 1).encode()
    assert polyline.encode([(v, np.float32(0.0))], 1) == "mn@?"


def test_the_doc_describes_the_schema_version_the_code_speaks():
    assert wire.SCHEMA_VERSION == DOC_VERSION


def _field_tables() -> dict[str, set[str]]:
    """§4's table of each kind: the field names in its first column."""
    text = DOC.read_text(encoding="utf-8")
    sections = re.findall(r"^### 4\.\d+ `([a-z-]+)`.*?\n(.*?)(?=^##)", text, re.MULTILINE | re.DOTALL)
    return {kind: set(re.findall(r"^\| `([a-z_]+)` ", body, re.MULTILINE)) for kind, body in sections}


def test_section_4_names_every_field_of_every_kind_and_no_other():
    from dataclasses import fields

    tables = _field_tables()
    assert set(tables) == set(wire.KINDS)
    for kind, cls in wire.KINDS.items():
        assert tables[kind] == {f.name for f in fields(cls) if f.init}, kind
