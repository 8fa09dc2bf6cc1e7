"""HMAC-SHA256 signatures on messages: who may publish what, checked by every consumer that holds the key.

Threat model: anyone with broker credentials can publish to any exchange, and every client holds the same
broker credentials. Without signatures such a party could publish a global model, or forge another client's
update. With them, a consumer only accepts a message signed with the key of the role that must produce it
(`expected_signer`): an update with client k's key, a tier model with the barrier's, a global model with the
aggregator's (the seed's for version 0), and so on.

Keys. One deployment secret (>= 32 bytes) is the root; named keys are derived from it with
`derive(secret, name) = HMAC-SHA256(secret, b"fedat-key/v1/" + name)` for the names in `NAMES`. Client k's key is
`derive(clients_master, f"client-{k}")`, where `clients_master = derive(secret, "clients")`: a holder of the
`clients` master (the simulation's shared workers; the barrier and the profiler, which verify updates) can
derive every client's key, while a real single client is given only its own `client-<k>` key. A `Keyring` holds
the keys one process has; `keys_for_role` gives the minimal keyring of each role.

Wire. The body is not changed: the signature travels in two AMQP headers, `x-fedat-signer` (the key name, e.g.
`client-17`) and `x-fedat-signature` (lowercase hex of HMAC-SHA256(key, body) over the exact body bytes). The
body carries `kind`, `id` and every field, so the HMAC binds all of them; a valid body cannot be passed off as
another message. The routing key and the AMQP properties are not signed: consumers act on the body only.

HMAC is symmetric: whoever can verify a signer's messages can also sign as that signer. `keys_for_role`
therefore gives a verifying key only to roles trusted at least as much as its owner (see `ROLES`): the profiler,
for instance, does not get the barrier's key (it could forge tier models), so round reports reach it unchecked.

Keys are never logged: `Keyring.__repr__` shows names only, and no error message contains key material.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from fedat.errors import KeyringError, SignatureError, SigningError  # noqa: F401 (re-exported)
from fedat.protocol import system

HEADER_SIGNER = "x-fedat-signer"
HEADER_SIGNATURE = "x-fedat-signature"

DERIVE_PREFIX = b"fedat-key/v1/"
MIN_SECRET_BYTES = 32
KEY_BYTES = 32  # HMAC-SHA256 output: every derived key

BARRIER, AGGREGATOR, PROFILER, EVALUATOR, SEED, CLIENTS = (
    "barrier",
    "aggregator",
    "profiler",
    "evaluator",
    "seed",
    "clients",
)
NAMES = system.SIGNERS

# Kinds every consumer must verify: a process that holds no key for their signer dead-letters them.
# Every other kind is verified when the consumer holds the signer's key and accepted unverified otherwise
# (e.g. a worker holds no barrier key, so it cannot check its tasks; a forged task only wastes its time, and the
# update it produces is still checked by the barrier against the tasks the barrier really sent).
REQUIRED_KINDS = frozenset({"update", "tier-model", "global-model", "join", "leave", "client-evaluation"})

# The minimal keyring of each role (the system table's `keys`): its own signing key plus the keys of the signers
# it must verify. A worker signs as any simulated client.
ROLES: Mapping[str, tuple[str, ...]] = MappingProxyType({s.name: s.keys for s in system.SERVICES})

_CLIENT_NAME = re.compile(r"client-(0|[1-9][0-9]*)")
_SIGNATURE = re.compile(r"[0-9a-f]{64}")


def derive(secret: bytes, name: str) -> bytes:
    """The key `name` derived from `secret` (or client k's key from the `clients` master): 32 bytes."""
    return hmac.new(secret, DERIVE_PREFIX + name.encode("ascii"), hashlib.sha256).digest()


def client_name(client: int) -> str:
    """The key name of client k: `client-<k>`."""
    return f"client-{client}"


def _valid_name(name: str) -> bool:
    return name in NAMES or _CLIENT_NAME.fullmatch(name) is not None


def _shown(name: object) -> str:
    # An unknown name may be a key pasted into the wrong place: show only short ones.
    return repr(name) if isinstance(name, str) and len(name) <= 24 else "(not shown)"


def _check_secret(secret: bytes, source: str) -> bytes:
    if not isinstance(secret, bytes | bytearray):
        raise KeyringError(f"{source}: the secret must be bytes, got {type(secret).__name__}")
    if len(secret) < MIN_SECRET_BYTES:
        raise KeyringError(f"{source}: the secret must be at least {MIN_SECRET_BYTES} bytes, got {len(secret)}")
    return bytes(secret)


def hex_secret(text: str, source: str) -> bytes:
    try:
        secret = bytes.fromhex(text.strip())
    except ValueError:
        raise KeyringError(f"{source}: the secret must be hex (e.g. `openssl rand -hex 32`)") from None
    return _check_secret(secret, source)


@dataclass(frozen=True, repr=False)
class Keyring:
    """The keys one process holds, by name (see NAMES; `client-<k>` for a single client's own key)."""

    keys: Mapping[str, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, key in self.keys.items():
            if not isinstance(name, str) or not _valid_name(name):
                raise KeyringError(f"unknown key name {_shown(name)} (known: {', '.join(NAMES)}, client-<k>)")
            if not isinstance(key, bytes) or len(key) != KEY_BYTES:
                raise KeyringError(f"key '{name}' must be {KEY_BYTES} bytes")
        object.__setattr__(self, "keys", MappingProxyType(dict(self.keys)))

    def __repr__(self) -> str:  # never show key material
        return f"Keyring({', '.join(sorted(self.keys))})"

    __str__ = __repr__

    @property
    def names(self) -> frozenset[str]:
        """Names of the keys held (the `clients` master stands for every `client-<k>`)."""
        return frozenset(self.keys)

    def key(self, name: str) -> bytes | None:
        """The key of signer `name`, or None if this keyring cannot produce it."""
        if name in self.keys:
            return self.keys[name]
        if CLIENTS in self.keys and _CLIENT_NAME.fullmatch(name):
            return derive(self.keys[CLIENTS], name)
        return None

    def can_sign(self, name: str) -> bool:
        """Whether this keyring holds (or can derive) the key of signer `name`."""
        return self.key(name) is not None

    @classmethod
    def from_secret(cls, secret: bytes) -> Keyring:
        """Every named key derived from the deployment secret (for the local run and tests)."""
        secret = _check_secret(secret, "signing secret")
        return cls({name: derive(secret, name) for name in NAMES})

    @classmethod
    def from_mapping(cls, keys: Mapping[str, str], source: str = "keyring") -> Keyring:
        """A keyring from name -> hex key (the shape `keys_for_role` returns and keyring files hold)."""
        out = {}
        for name, text in keys.items():
            if not isinstance(name, str) or not _valid_name(name):
                raise KeyringError(f"{source}: unknown key name {_shown(name)} (known: {', '.join(NAMES)}, client-<k>)")
            if not isinstance(text, str):
                raise KeyringError(f"{source}: key '{name}' must be a hex string")
            try:
                out[name] = bytes.fromhex(text.strip())
            except ValueError:
                raise KeyringError(f"{source}: key '{name}' is not hex") from None
        try:
            return cls(out)
        except KeyringError as exc:
            raise KeyringError(f"{source}: {exc}") from None

    @classmethod
    def from_text(cls, text: str, source: str) -> Keyring:
        """Parse a keyring file's text: a JSON object name -> hex, or `name=hex` lines (`#` comments, blank lines)."""
        if text.lstrip()[:1] in ("{", "["):
            try:
                data: Any = json.loads(text)
            except json.JSONDecodeError as exc:
                raise KeyringError(f"{source}: invalid JSON at line {exc.lineno}") from None
            if not isinstance(data, dict):
                raise KeyringError(f"{source}: expected a JSON object of name -> hex key")
            return cls.from_mapping(data, source)
        keys: dict[str, str] = {}
        for lineno, line in enumerate(text.splitlines(), start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, sep, value = line.partition("=")
            name = name.strip()
            if not sep or not name:
                raise KeyringError(f"{source}:{lineno}: expected `name=hex`")
            if name in keys:
                raise KeyringError(f"{source}:{lineno}: key '{name}' given twice")
            keys[name] = value
        return cls.from_mapping(keys, source)


def keys_for_role(secret: bytes, role: str) -> dict[str, str]:
    """The minimal keyring of `role` (a key of ROLES, or `client-<k>` for one real client) as name -> hex."""
    secret = _check_secret(secret, "signing secret")
    if _CLIENT_NAME.fullmatch(role):
        return {role: derive(derive(secret, CLIENTS), role).hex()}
    if role not in ROLES:
        raise KeyringError(f"unknown role {role!r} (known: {', '.join(ROLES)}, client-<k>)")
    return {name: derive(secret, name).hex() for name in ROLES[role]}


def expected_signer(msg: Any) -> str:
    """The key name that must sign `msg` (a fedat.protocol.wire message), by kind."""
    kind = msg.kind
    if kind == "update":
        return client_name(msg.client)
    if kind == "tier-model":
        return BARRIER
    if kind == "global-model":
        return SEED if msg.version == 0 else AGGREGATOR
    if kind == "train":
        return BARRIER if msg.tier >= 1 else PROFILER
    if kind == "tier-assignment":
        return PROFILER
    if kind == "round-report":
        return BARRIER
    if kind in ("evaluation", "evaluate"):
        return EVALUATOR
    if kind in ("join", "leave", "client-evaluation"):
        return client_name(msg.client)
    raise ValueError(f"no signer is defined for kind {kind!r}")


def signature(key: bytes, body: bytes) -> str:
    """Lowercase hex HMAC-SHA256 of the exact body bytes."""
    return hmac.new(key, bytes(body), hashlib.sha256).hexdigest()


def sign(keyring: Keyring, msg: Any, body: bytes) -> dict[str, str]:
    """The AMQP headers that sign `body` (the encoding of `msg`) as `expected_signer(msg)`.

    Raises SigningError naming the missing key when this keyring cannot sign as that signer.
    """
    signer = expected_signer(msg)
    key = keyring.key(signer)
    if key is None:
        raise SigningError(f"cannot sign {msg.kind} {msg.id}: this process holds no key for signer '{signer}'")
    return {HEADER_SIGNER: signer, HEADER_SIGNATURE: signature(key, body)}


def _header(headers: Mapping[str, Any], name: str) -> str | None:
    value = headers.get(name)
    if isinstance(value, bytes | bytearray):
        try:
            value = bytes(value).decode("ascii")
        except UnicodeDecodeError:
            return ""
    if value is None:
        return None
    return value if isinstance(value, str) else ""


def verify(keyring: Keyring, msg: Any, body: bytes, headers: Mapping[str, Any] | None) -> None:
    """Check that `body` (whose decoding is `msg`) carries a valid signature by `expected_signer(msg)`.

    Raises SignatureError with the reason; returns None when the signature is good.
    """
    what = f"{msg.kind} {msg.id}"
    expected = expected_signer(msg)
    key = keyring.key(expected)
    if key is None:
        raise SignatureError(f"this process holds no key to verify signer '{expected}' (of {what})")
    headers = headers or {}
    sig = _header(headers, HEADER_SIGNATURE)
    if sig is None:
        raise SignatureError(f"unsigned {what}: no {HEADER_SIGNATURE} header")
    signer = _header(headers, HEADER_SIGNER)
    if signer is None:
        raise SignatureError(f"{what}: no {HEADER_SIGNER} header")
    if signer != expected:
        shown = signer if _valid_name(signer) else repr(signer[:64])
        if msg.kind == "update":
            raise SignatureError(f"{what} is signed by {shown}, but it names client {msg.client}")
        raise SignatureError(f"{what} is signed by {shown}, but must be signed by {expected}")
    if not _SIGNATURE.fullmatch(sig):
        raise SignatureError(f"{what}: malformed {HEADER_SIGNATURE} (expected 64 lowercase hex digits)")
    if not hmac.compare_digest(sig, signature(key, body)):
        raise SignatureError(f"signature of {what} does not match {expected}'s key")


def check(keyring: Keyring | None, msg: Any, body: bytes, headers: Mapping[str, Any] | None) -> bool:
    """The consumer's policy: True if the signature was verified, False if verification was skipped.

    Skipped when signing is off (`keyring` None) or when the kind is not in REQUIRED_KINDS and this process holds
    no key for its signer. Otherwise `verify` runs and its SignatureError propagates (dead-letter the message).
    """
    if keyring is None:
        return False
    if msg.kind not in REQUIRED_KINDS and not keyring.can_sign(expected_signer(msg)):
        return False
    verify(keyring, msg, body, headers)
    return True
