"""The wire format: frozen message dataclasses <-> msgpack bytes, validated on the way in.

Every message is a msgpack map with `v` (schema version), `kind` and `id` (the dedupe key). Bytes exist only
at the broker edge: services handle the dataclasses below. `docs/wire-format.md` is the normative description.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import msgpack
import numpy as np

from fedat.codec import CODECS, MAX_PRECISION, MIN_PRECISION, CodecError

SCHEMA_VERSION = 3  # 2: global-model `merged`, evaluation `accuracies`; 3: signed updates, tier and global models
# Half the broker's default 128 MiB frame limit: a message over the broker's limit closes the whole channel.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
MAX_LAYER_ELEMENTS = 50_000_000


class WireError(ValueError):
    """A message that cannot be decoded or fails validation; the text names the offending field."""


@dataclass(frozen=True)
class Layer:
    """One compressed tensor of a model: its name, shape and encoded bytes."""

    name: str
    shape: tuple[int, ...]
    codec: str
    precision: int
    data: bytes
    dtype: str = "float32"

    @property
    def size(self) -> int:
        """Number of values in the tensor."""
        return int(math.prod(self.shape))


def encode_model(
    arrays: Sequence[np.ndarray], names: Sequence[str], codec: str = "polyline", precision: int = 4
) -> tuple[Layer, ...]:
    """Compress a model's tensors into wire layers."""
    if len(arrays) != len(names):
        raise WireError(f"layers: {len(arrays)} arrays but {len(names)} names")
    impl = CODECS[codec]
    return tuple(
        Layer(name, tuple(int(d) for d in a.shape), codec, precision, impl.encode(a, precision, name))
        for a, name in zip(arrays, names, strict=True)
    )


def decode_model(layers: Sequence[Layer]) -> list[np.ndarray]:
    """Decompress wire layers into float32 arrays; raises WireError naming the bad layer."""
    out = []
    for i, layer in enumerate(layers):
        try:
            out.append(CODECS[layer.codec].decode(layer.data, layer.shape, layer.precision, layer.name))
        except CodecError as exc:
            raise WireError(f"layers[{i}] ({layer.name}): {exc}") from exc
    return out


def model_bytes(layers: Sequence[Layer]) -> int:
    """Payload bytes of a model on the wire (what compression saves)."""
    return sum(len(layer.data) for layer in layers)


@dataclass(frozen=True)
class TrainTask:
    """Downlink: train `client` from the global model `version` for tier `tier`, round `round` (tier 0 = profiling)."""

    id: str
    client: int
    tier: int
    round: int
    version: int
    epochs: int
    batch_size: int
    learning_rate: float
    prox_lambda: float
    codec: str
    precision: int
    sent_at: float
    layers: tuple[Layer, ...]
    # When the run's profiling pass began (0: unknown): the one clock every pod agrees on, the origin of the
    # simulated clients' drop-out times.
    run_started_at: float = 0.0
    kind: str = field(default="train", init=False)


@dataclass(frozen=True)
class Update:
    """Uplink: a client's locally trained model for one task.

    `not_before` is when the latency model says the client would have answered (0 for real clients): the barrier
    treats the update as arriving at max(received, not_before). `late` means the shared workers could not keep up.
    """

    id: str
    task_id: str
    client: int
    tier: int
    round: int
    base_version: int
    n_samples: int
    loss: float
    dispatched_at: float
    started_at: float
    finished_at: float
    train_seconds: float
    not_before: float
    late: bool
    layers: tuple[Layer, ...]
    kind: str = field(default="update", init=False)


@dataclass(frozen=True)
class TierModel:
    """A tier's synchronously merged model for one round."""

    id: str
    tier: int
    round: int
    base_version: int
    n_samples: int
    clients: tuple[int, ...]
    bytes_up: int
    bytes_down: int
    late: int
    closed_at: float
    layers: tuple[Layer, ...]
    kind: str = field(default="tier-model", init=False)


@dataclass(frozen=True)
class GlobalModel:
    """The cross-tier global model, published after a tier-model merge (or after a buffer of them, for FedBuff).

    `tier`/`tier_round` name the arrival that produced this version; `merged` lists every (tier, round) folded
    into it, so the barrier knows which of its closed rounds are done.
    """

    id: str
    version: int
    tier: int
    tier_round: int
    merged: tuple[tuple[int, int], ...]
    tier_rounds: tuple[int, ...]
    tier_counts: tuple[int, ...]
    tier_weights: tuple[float, ...]
    bytes_up: int
    bytes_down: int
    late: int
    updates: int
    created_at: float
    layers: tuple[Layer, ...]
    kind: str = field(default="global-model", init=False)


@dataclass(frozen=True)
class TierAssignment:
    """Which clients belong to which tier (index 0 = tier 1, the fastest) and their measured latencies."""

    id: str
    epoch: int
    tiers: tuple[tuple[int, ...], ...]
    latencies: Mapping[int, float]
    created_at: float
    run_started_at: float = 0.0  # when the profiling pass began; the barrier copies it into its tasks
    kind: str = field(default="tier-assignment", init=False)


@dataclass(frozen=True)
class RoundReport:
    """Response latencies seen in one closed tier round: dispatch to (effective) arrival, and who never answered.

    Small on purpose: the profiler learns latencies from these instead of receiving every model update.
    """

    id: str
    tier: int
    round: int
    latencies: Mapping[int, float]
    missing: tuple[int, ...]
    waited: float
    closed_at: float
    kind: str = field(default="round-report", init=False)


@dataclass(frozen=True)
class Evaluation:
    """Scores of global model `version` on every client's test split."""

    id: str
    version: int
    accuracy: float
    loss: float
    variance: float
    n_clients: int
    evaluated_at: float
    accuracies: tuple[float, ...]  # per client, index = client id: TiFL's tier accuracies come from these
    kind: str = field(default="evaluation", init=False)


def seed_model(
    weights: Sequence[np.ndarray], names: Sequence[str], num_tiers: int, codec: str, precision: int, now: float
) -> GlobalModel:
    """The version-0 global model w0: no tier has reported, so every count and weight is 0."""
    zeros = (0,) * num_tiers
    return GlobalModel(
        id="g0",
        version=0,
        tier=0,
        tier_round=0,
        merged=(),
        tier_rounds=zeros,
        tier_counts=zeros,
        tier_weights=(0.0,) * num_tiers,
        bytes_up=0,
        bytes_down=0,
        late=0,
        updates=0,
        created_at=now,
        layers=encode_model(weights, names, codec, precision),
    )


Message = TrainTask | Update | TierModel | GlobalModel | TierAssignment | RoundReport | Evaluation
KINDS: dict[str, type] = {
    cls.__dataclass_fields__["kind"].default: cls
    for cls in (TrainTask, Update, TierModel, GlobalModel, TierAssignment, RoundReport, Evaluation)
}
KINDS_TUPLE: tuple[type, ...] = tuple(KINDS.values())


def _layer_to_map(layer: Layer) -> dict[str, Any]:
    return {
        "name": layer.name,
        "shape": list(layer.shape),
        "dtype": layer.dtype,
        "codec": layer.codec,
        "precision": layer.precision,
        "data": layer.data,
    }


def encode(msg: Message, max_bytes: int = MAX_MESSAGE_BYTES) -> bytes:
    """Serialise a message to msgpack bytes; raises WireError if it exceeds max_bytes."""
    body: dict[str, Any] = {"v": SCHEMA_VERSION}
    for f in fields(msg):
        value = getattr(msg, f.name)
        if f.name == "layers":
            value = [_layer_to_map(layer) for layer in value]
        elif f.name == "tiers":
            value = [list(t) for t in value]
        elif isinstance(value, tuple):
            value = list(value)
        elif isinstance(value, Mapping):
            value = dict(value)
        body[f.name] = value
    data = msgpack.packb(body, use_bin_type=True)
    if len(data) > max_bytes:
        raise WireError(f"message {msg.id}: oversize, {len(data)} bytes exceeds the limit of {max_bytes}")
    return data


# Field validators: each takes (field name, raw value) and returns the typed value or raises WireError.
def _int(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise WireError(f"field '{name}': expected int, got {type(v).__name__}")
    return v


def _nonneg_int(name: str, v: Any) -> int:
    v = _int(name, v)
    if v < 0:
        raise WireError(f"field '{name}': must be >= 0, got {v}")
    return v


def _pos_int(name: str, v: Any) -> int:
    v = _int(name, v)
    if v < 1:
        raise WireError(f"field '{name}': must be >= 1, got {v}")
    return v


def _float(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise WireError(f"field '{name}': expected number, got {type(v).__name__}")
    v = float(v)
    if not math.isfinite(v):
        raise WireError(f"field '{name}': must be finite, got {v}")
    return v


def _nonneg_float(name: str, v: Any) -> float:
    v = _float(name, v)
    if v < 0:
        raise WireError(f"field '{name}': must be >= 0, got {v}")
    return v


def _pos_float(name: str, v: Any) -> float:
    v = _float(name, v)
    if v <= 0:
        raise WireError(f"field '{name}': must be > 0, got {v}")
    return v


def _str(name: str, v: Any) -> str:
    if not isinstance(v, str):
        raise WireError(f"field '{name}': expected str, got {type(v).__name__}")
    return v


def _nonempty_str(name: str, v: Any) -> str:
    v = _str(name, v)
    if not v or len(v) > 256:
        raise WireError(f"field '{name}': must be 1..256 characters")
    return v


def _bool(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise WireError(f"field '{name}': expected bool, got {type(v).__name__}")
    return v


def _codec(name: str, v: Any) -> str:
    v = _str(name, v)
    if v not in CODECS:
        raise WireError(f"field '{name}': unknown codec {v!r} (known: {sorted(CODECS)})")
    return v


def _precision(name: str, v: Any) -> int:
    v = _int(name, v)
    if not MIN_PRECISION <= v <= MAX_PRECISION:
        raise WireError(f"field '{name}': precision {v} outside {MIN_PRECISION}..{MAX_PRECISION}")
    return v


def _list(name: str, v: Any) -> list:
    if not isinstance(v, list):
        raise WireError(f"field '{name}': expected list, got {type(v).__name__}")
    return v


def _int_tuple(name: str, v: Any) -> tuple[int, ...]:
    return tuple(_nonneg_int(f"{name}[{i}]", x) for i, x in enumerate(_list(name, v)))


def _float_tuple(name: str, v: Any) -> tuple[float, ...]:
    return tuple(_float(f"{name}[{i}]", x) for i, x in enumerate(_list(name, v)))


def _nonneg_float_tuple(name: str, v: Any) -> tuple[float, ...]:
    return tuple(_nonneg_float(f"{name}[{i}]", x) for i, x in enumerate(_list(name, v)))


def _tiers(name: str, v: Any) -> tuple[tuple[int, ...], ...]:
    return tuple(_int_tuple(f"{name}[{i}]", t) for i, t in enumerate(_list(name, v)))


def _pairs(name: str, v: Any) -> tuple[tuple[int, int], ...]:
    pairs = _tiers(name, v)
    for i, p in enumerate(pairs):
        if len(p) != 2:
            raise WireError(f"field '{name}[{i}]': expected a (tier, round) pair, got {len(p)} values")
    return pairs


def _latencies(name: str, v: Any) -> dict[int, float]:
    if not isinstance(v, dict):
        raise WireError(f"field '{name}': expected map, got {type(v).__name__}")
    return {_nonneg_int(f"{name} key", k): _nonneg_float(f"{name}[{k}]", x) for k, x in v.items()}


def _layer(name: str, v: Any) -> Layer:
    if not isinstance(v, dict):
        raise WireError(f"field '{name}': expected map, got {type(v).__name__}")
    missing = {"name", "shape", "dtype", "codec", "precision", "data"} - v.keys()
    if missing:
        raise WireError(f"field '{name}': missing {sorted(missing)}")
    shape = _int_tuple(f"{name}.shape", v["shape"])
    if len(shape) > 8 or any(d > MAX_LAYER_ELEMENTS for d in shape) or math.prod(shape) > MAX_LAYER_ELEMENTS:
        raise WireError(f"field '{name}.shape': {list(shape)} is too large")
    if v["dtype"] != "float32":
        raise WireError(f"field '{name}.dtype': only 'float32' is supported, got {v['dtype']!r}")
    data = v["data"]
    if not isinstance(data, bytes):
        raise WireError(f"field '{name}.data': expected bytes, got {type(data).__name__}")
    layer = Layer(
        name=_nonempty_str(f"{name}.name", v["name"]),
        shape=shape,
        codec=_codec(f"{name}.codec", v["codec"]),
        precision=_precision(f"{name}.precision", v["precision"]),
        data=data,
    )
    if layer.codec == "raw" and len(data) != 4 * layer.size:
        raise WireError(
            f"field '{name}.data': raw layer of shape {list(shape)} needs {4 * layer.size} bytes, got {len(data)}"
        )
    return layer


def _layers(name: str, v: Any) -> tuple[Layer, ...]:
    return tuple(_layer(f"{name}[{i}]", x) for i, x in enumerate(_list(name, v)))


_VALIDATORS: dict[str, Callable[[str, Any], Any]] = {
    "id": _nonempty_str,
    "task_id": _nonempty_str,
    "client": _nonneg_int,
    "tier": _nonneg_int,
    "round": _nonneg_int,
    "tier_round": _nonneg_int,
    "version": _nonneg_int,
    "base_version": _nonneg_int,
    "epoch": _nonneg_int,
    "epochs": _pos_int,
    "batch_size": _pos_int,
    "n_samples": _nonneg_int,
    "n_clients": _nonneg_int,
    "bytes_up": _nonneg_int,
    "bytes_down": _nonneg_int,
    "late": _nonneg_int,
    "updates": _nonneg_int,
    "learning_rate": _pos_float,
    "prox_lambda": _nonneg_float,
    "loss": _float,
    "accuracy": _nonneg_float,
    "variance": _nonneg_float,
    "sent_at": _nonneg_float,
    "dispatched_at": _nonneg_float,
    "started_at": _nonneg_float,
    "finished_at": _nonneg_float,
    "train_seconds": _nonneg_float,
    "not_before": _nonneg_float,
    "closed_at": _nonneg_float,
    "created_at": _nonneg_float,
    "run_started_at": _nonneg_float,
    "evaluated_at": _nonneg_float,
    "codec": _codec,
    "precision": _precision,
    "clients": _int_tuple,
    "missing": _int_tuple,
    "waited": _nonneg_float,
    "tier_counts": _int_tuple,
    "tier_rounds": _int_tuple,
    "tier_weights": _float_tuple,
    "accuracies": _nonneg_float_tuple,
    "tiers": _tiers,
    "merged": _pairs,
    "latencies": _latencies,
    "layers": _layers,
}
# Fields whose type differs by kind.
_KIND_OVERRIDES: dict[tuple[str, str], Callable[[str, Any], Any]] = {("update", "late"): _bool}


def decode(data: bytes, expect: type | None = None, max_bytes: int = MAX_MESSAGE_BYTES) -> Message:
    """Parse and validate msgpack bytes into a message; any defect raises WireError naming the field."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WireError(f"message: expected bytes, got {type(data).__name__}")
    if len(data) > max_bytes:
        raise WireError(f"message: oversize, {len(data)} bytes exceeds the limit of {max_bytes}")
    try:
        body = msgpack.unpackb(bytes(data), raw=False, strict_map_key=False, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types for garbage input
        raise WireError(f"message: not valid msgpack ({type(exc).__name__}: {exc})") from None
    if not isinstance(body, dict):
        raise WireError(f"message: expected a map at the top level, got {type(body).__name__}")
    if type(body.get("v")) is not int or body["v"] != SCHEMA_VERSION:
        raise WireError(f"field 'v': unsupported schema version {body.get('v')!r} (expected {SCHEMA_VERSION})")
    kind = body.get("kind")
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise WireError(f"field 'kind': unknown kind {kind!r} (known: {sorted(KINDS)})")
    if expect is not None and cls is not expect:
        raise WireError(f"field 'kind': expected {expect.__dataclass_fields__['kind'].default!r}, got {kind!r}")
    kwargs = {}
    for f in fields(cls):
        if not f.init:
            continue
        if f.name not in body:
            raise WireError(f"field '{f.name}': missing from {kind} message")
        check = _KIND_OVERRIDES.get((kind, f.name), _VALIDATORS[f.name])
        kwargs[f.name] = check(f.name, body[f.name])
    return cls(**kwargs)
