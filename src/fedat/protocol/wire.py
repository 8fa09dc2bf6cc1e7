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

from fedat.errors import WireError  # noqa: F401 (re-exported)
from fedat.protocol import deltacodec
from fedat.protocol.codec import CODECS, MAX_PRECISION, MIN_PRECISION, CodecError

SCHEMA_VERSION = 3  # 2: global-model `merged`, evaluation `accuracies`; 3: signed updates, tier and global models
# Half the broker's default 128 MiB frame limit: a message over the broker's limit closes the whole channel.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
MAX_LAYER_ELEMENTS = 50_000_000


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
    arrays: Sequence[np.ndarray],
    names: Sequence[str],
    codec: str = "polyline",
    precision: int = 4,
    bases: Sequence[np.ndarray] | None = None,
) -> tuple[Layer, ...]:
    """Compress a model's tensors into wire layers; a relative codec encodes each against its base, if given."""
    if len(arrays) != len(names):
        raise WireError(f"layers: {len(arrays)} arrays but {len(names)} names")
    if bases is not None and len(bases) != len(arrays):
        raise WireError(f"layers: {len(arrays)} arrays but {len(bases)} bases")
    impl = CODECS[codec]
    return tuple(
        Layer(
            name,
            tuple(int(d) for d in a.shape),
            codec,
            precision,
            impl.encode(a, precision, name, None if bases is None else bases[i]),
        )
        for i, (a, name) in enumerate(zip(arrays, names, strict=True))
    )


def decode_model(layers: Sequence[Layer], bases: Sequence[np.ndarray] | None = None) -> list[np.ndarray]:
    """Decompress wire layers into float32 arrays (relative layers against `bases`); WireError names the bad layer."""
    if bases is not None and len(bases) != len(layers):
        raise WireError(f"layers: {len(layers)} layers but {len(bases)} bases")
    out = []
    for i, layer in enumerate(layers):
        base = None if bases is None else bases[i]
        try:
            out.append(CODECS[layer.codec].decode(layer.data, layer.shape, layer.precision, layer.name, base))
        except CodecError as exc:
            raise WireError(f"layers[{i}] ({layer.name}): {exc}") from exc
    return out


def relative(layers: Sequence[Layer]) -> bool:
    """Whether any layer is in a relative codec, i.e. may need the message's base model to decode."""
    return any(CODECS[layer.codec].relative for layer in layers)


def _grid(layer: Layer) -> tuple[int, float] | None:
    """The grid a whole model's layer lies on, as the delta codec names it; None for one on no grid (raw, exact)."""
    if layer.codec == "polyline":
        return deltacodec.GRID_OVER, float(10**layer.precision)
    if layer.codec == "delta" and len(layer.data) >= deltacodec.HEADER.size:
        _, base, kind, _, _, step = deltacodec.header(layer.data)
        if base == deltacodec.BASE_ZERO and kind == deltacodec.QUANTISED:
            return deltacodec.GRID_TIMES, step
    return None


def on_grid(layers: Sequence[Layer]) -> bool:
    """Whether every layer of a whole model lies on a grid, so that a later model can be sent against it."""
    return all(_grid(layer) is not None for layer in layers)


def encode_against(
    layers: Sequence[Layer], arrays: Sequence[np.ndarray], bases: Sequence[np.ndarray]
) -> tuple[Layer, ...] | None:
    """A whole model (`layers`, decoded as `arrays`) re-sent against `bases`, an earlier model the receiver holds, in
    the delta codec's lossless grid kinds: the receiver decodes exactly `arrays`. None where a layer is on no grid."""
    out = []
    for layer, a, b in zip(layers, arrays, bases, strict=True):
        grid = _grid(layer)
        data = None if grid is None else deltacodec.encode_on_grid(a, b, *grid, name=layer.name)
        if data is None:
            return None
        out.append(Layer(layer.name, layer.shape, "delta", layer.precision, data, layer.dtype))
    return tuple(out)


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
    # The global version `layers` are sent against (a real client's copy of it, `encode_against`); -1: sent whole.
    relative_to: int = -1
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


@dataclass(frozen=True)
class Join:
    """A real client announces itself: it is online and wants to be profiled and tiered (again, after a restart)."""

    id: str
    client: int
    n_samples: int  # its training samples
    sent_at: float
    kind: str = field(default="join", init=False)


@dataclass(frozen=True)
class Leave:
    """A real client goes offline for good (a clean stop, or its revocation): the tiers drop it at once."""

    id: str
    client: int
    reason: str  # "stopped" or "revoked"
    sent_at: float
    kind: str = field(default="leave", init=False)


@dataclass(frozen=True)
class EvaluationRequest:
    """Federated evaluation: every real client scores global model `version` on its own test split."""

    id: str
    version: int
    created_at: float
    layers: tuple[Layer, ...]
    # The version `layers` are sent against (the newest request sent whole, which clients keep); -1: sent whole.
    relative_to: int = -1
    kind: str = field(default="evaluate", init=False)


@dataclass(frozen=True)
class ClientEvaluation:
    """One real client's score of global model `version` on its own test split."""

    id: str
    client: int
    version: int
    loss: float
    accuracy: float
    n_samples: int  # its test samples
    evaluated_at: float
    kind: str = field(default="client-evaluation", init=False)


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


Message = (
    TrainTask
    | Update
    | TierModel
    | GlobalModel
    | TierAssignment
    | RoundReport
    | Evaluation
    | Join
    | Leave
    | EvaluationRequest
    | ClientEvaluation
)
KINDS: dict[str, type] = {
    cls.__dataclass_fields__["kind"].default: cls
    for cls in (
        TrainTask,
        Update,
        TierModel,
        GlobalModel,
        TierAssignment,
        RoundReport,
        Evaluation,
        Join,
        Leave,
        EvaluationRequest,
        ClientEvaluation,
    )
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


def _version_or_whole(name: str, v: Any) -> int:
    v = _int(name, v)
    if v < -1:
        raise WireError(f"field '{name}': {v} is neither a version (>= 0) nor -1 (sent whole)")
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
    "relative_to": _version_or_whole,
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
    "reason": _nonempty_str,
}
# Fields whose type differs by kind.
_KIND_OVERRIDES: dict[tuple[str, str], Callable[[str, Any], Any]] = {("update", "late"): _bool}


def decode(data: bytes, expect: type | tuple[type, ...] | None = None, max_bytes: int = MAX_MESSAGE_BYTES) -> Message:
    """Parse and validate msgpack bytes into a message of the kind(s) `expect` names (None: any); any defect raises
    WireError naming the field."""
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
    wanted = expect if isinstance(expect, tuple) else (expect,)
    if expect is not None and cls not in wanted:
        names = " or ".join(repr(c.__dataclass_fields__["kind"].default) for c in wanted)
        raise WireError(f"field 'kind': expected {names}, got {kind!r}")
    kwargs = {}
    for f in fields(cls):
        if not f.init:
            continue
        if f.name not in body:
            raise WireError(f"field '{f.name}': missing from {kind} message")
        check = _KIND_OVERRIDES.get((kind, f.name), _VALIDATORS[f.name])
        kwargs[f.name] = check(f.name, body[f.name])
    return cls(**kwargs)
