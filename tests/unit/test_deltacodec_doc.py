"""docs/wire-format.md §5.4-5.5: the delta codec's worked example decodes as the text says, and is signed."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from fedat.protocol import signing, wire
from fedat.protocol.codec import decode_layer
from fedat.protocol.deltacodec import GRID_OVER, decode_delta, encode_delta, encode_on_grid, header

DOC = Path(__file__).resolve().parents[2] / "docs" / "wire-format.md"
_BLOCK = re.compile(r"^```hex ([^\n]*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
BLOCKS = {
    info.split()[0]: (dict(a.split("=", 1) for a in info.split()[1:]), bytes.fromhex(text))
    for info, text in _BLOCK.findall(DOC.read_text(encoding="utf-8"))
}
BASE = decode_layer(b"]D]E", (3,), 1)  # the task's layer of §5.3, as the worker decoded it
TRAINED = np.array([1.5123, -0.2871, 2.9998], np.float32)


def test_the_example_layer_decodes_to_the_values_in_the_table():
    _, data = BLOCKS["delta:layer"]
    assert len(data) == 29
    assert header(data) == (1, 1, 0, 0, 1, 0.0009996422767464658)
    decoded = decode_delta(data, (3,), BASE, 3)
    np.testing.assert_array_equal(decoded, np.array([1.5119957, -0.28700465, 3.0], np.float32))
    assert np.all(np.abs(decoded.astype(np.float64) - TRAINED) <= 0.0005)
    assert data[13:] == bytes.fromhex("28b52ffd2403190000181a0088527e86")
    assert encode_delta(TRAINED, BASE, 3) == data  # the reference encoder writes exactly these bytes


def test_the_example_update_decodes_and_its_signature_verifies():
    attrs, body = BLOCKS["delta:update"]
    assert len(body) == int(attrs["bytes"])
    msg = wire.decode(body)
    assert isinstance(msg, wire.Update) and msg.client == 7 and msg.base_version == 0
    (layer,) = msg.layers
    assert (layer.name, layer.shape, layer.codec, layer.precision, layer.data) == (
        "dense/bias",
        (3,),
        "delta",
        3,
        BLOCKS["delta:layer"][1],
    )
    np.testing.assert_array_equal(wire.decode_model(msg.layers, [BASE])[0], decode_delta(layer.data, (3,), BASE, 3))
    sig_attrs, sig = BLOCKS["delta:update-signature"]
    keyring = signing.Keyring.from_secret(BLOCKS["secret"][1])
    headers = {signing.HEADER_SIGNER: sig_attrs["signer"], signing.HEADER_SIGNATURE: sig.hex()}
    signing.verify(keyring, msg, body, headers)


def test_the_grid_example_decodes_against_the_kept_model_to_the_model_sent_whole():
    _, data = BLOCKS["delta:grid-layer"]
    whole = decode_layer(b"_@DYE", (3,), 1)
    assert header(data) == (1, 1, 3, 0, 1, 10.0) and len(data) == 29
    assert decode_delta(data, (3,), BASE, 1).tobytes() == whole.tobytes()
    assert encode_on_grid(whole, BASE, GRID_OVER, 10.0) == data  # the reference encoder writes exactly these bytes
