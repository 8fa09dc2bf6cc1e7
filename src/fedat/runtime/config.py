"""Reading `FEDAT_*` environment variables into typed values; used only by each service's `main()`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from fedat.errors import ConfigError
from fedat.fl.evaluation import ANCHORS, EvalSchedule
from fedat.fl.latency import PAPER_DELAYS, StragglerProfile
from fedat.fl.strategies import REGISTRY, Strategy, build_strategy, setting_bounds
from fedat.protocol.system import Mode, clients_mode
from fedat.runtime import keys
from fedat.runtime.bus import BrokerConfig
from fedat.runtime.tls import tls_from_env


def get_str(env: Mapping[str, str], name: str, default: str) -> str:
    """A string variable."""
    return env.get(name, default)


def get_int(env: Mapping[str, str], name: str, default: int) -> int:
    """An integer variable."""
    raw = env.get(name)
    try:
        return default if raw is None or raw == "" else int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None


def get_float(env: Mapping[str, str], name: str, default: float) -> float:
    """A float variable."""
    raw = env.get(name)
    try:
        return default if raw is None or raw == "" else float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None


def get_ints(env: Mapping[str, str], name: str, default: tuple[int, ...]) -> tuple[int, ...]:
    """A comma-separated list of integers."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return tuple(int(x) for x in raw.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a comma-separated list of integers") from None


def get_floats(env: Mapping[str, str], name: str, default: tuple[float, ...]) -> tuple[float, ...]:
    """A comma-separated list of floats."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return tuple(float(x) for x in raw.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a comma-separated list of numbers") from None


def amqp_url(env: Mapping[str, str]) -> str:
    """The AMQP URL: from the file FEDAT_AMQP_URL_FILE names, else FEDAT_AMQP_URL.

    A mounted file keeps the password out of the process environment (and so out of `kubectl describe`, crash
    dumps and child processes); it wins over FEDAT_AMQP_URL.
    """
    path = env.get("FEDAT_AMQP_URL_FILE", "").strip()
    if not path:
        return get_str(env, "FEDAT_AMQP_URL", BrokerConfig.url)
    try:
        url = Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"FEDAT_AMQP_URL_FILE={path}: cannot read it ({exc.strerror})") from None
    if not url.startswith(("amqp://", "amqps://")):
        raise ConfigError(f"FEDAT_AMQP_URL_FILE={path} does not hold an amqp:// or amqps:// URL")
    return url


def broker(env: Mapping[str, str], prefetch: int) -> BrokerConfig:
    """The broker section every service shares: where, how (TLS), whether to declare, and the signing keys.

    Signing is required: a process without keys refuses to start unless FEDAT_SIGNING=off says on purpose that
    it runs against a development broker where nobody signs.
    """
    keyring = keys.keyring_from_env(env)
    if keyring is None and get_str(env, "FEDAT_SIGNING", "on") != "off":
        raise ConfigError(
            "no signing keys: set FEDAT_SIGNING_SECRET_FILE, FEDAT_SIGNING_SECRET or FEDAT_KEYRING_FILE "
            "(or FEDAT_SIGNING=off for a development broker where nobody signs)"
        )
    try:
        tls = tls_from_env(env)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return BrokerConfig(
        url=amqp_url(env),
        num_tiers=get_int(env, "FEDAT_NUM_TIERS", 5),
        prefetch=get_int(env, "FEDAT_PREFETCH", prefetch),
        max_message_bytes=get_int(env, "FEDAT_MAX_MESSAGE_BYTES", BrokerConfig.max_message_bytes),
        tls=tls,
        declare=get_int(env, "FEDAT_DECLARE_TOPOLOGY", 1) == 1,
        keyring=keyring,
    )


def clients(env: Mapping[str, str]) -> Mode:
    """Where the clients are: FEDAT_CLIENTS `pool` (the default: workers train logical clients) or `real`."""
    try:
        return clients_mode(get_str(env, "FEDAT_CLIENTS", Mode.POOL.value))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def eval_schedule(env: Mapping[str, str]) -> EvalSchedule:
    """Which global versions are scored: FEDAT_EVAL_EVERY, FEDAT_EVAL_INTERVAL, FEDAT_EVAL_ANCHOR (`last`, `grid`)."""
    anchor = get_str(env, "FEDAT_EVAL_ANCHOR", "last")
    if anchor not in ANCHORS:
        raise ConfigError(f"FEDAT_EVAL_ANCHOR={anchor!r} is not one of {list(ANCHORS)}")
    d = EvalSchedule()
    return EvalSchedule(
        every=get_int(env, "FEDAT_EVAL_EVERY", d.every),
        interval=get_float(env, "FEDAT_EVAL_INTERVAL", d.interval),
        grid=anchor == "grid",
    )


def latency(env: Mapping[str, str]) -> StragglerProfile:
    """The latency model (`fedat.fl.latency.StragglerProfile`) from the FEDAT_* latency variables."""
    d = StragglerProfile()
    flat = get_floats(env, "FEDAT_DELAYS", tuple(x for pair in PAPER_DELAYS for x in pair))
    if len(flat) % 2:
        raise ConfigError("FEDAT_DELAYS must list lo,hi pairs")
    return StragglerProfile(
        time_scale=get_float(env, "FEDAT_TIME_SCALE", d.time_scale),
        delays=tuple(zip(flat[::2], flat[1::2], strict=True)),
        device_factor=tuple(get_floats(env, "FEDAT_DEVICE_FACTOR", d.device_factor)),
        unstable_clients=get_int(env, "FEDAT_UNSTABLE_CLIENTS", d.unstable_clients),
        drop_window=tuple(get_floats(env, "FEDAT_DROP_WINDOW", d.drop_window)),
        step_seconds=get_float(env, "FEDAT_STEP_SECONDS", d.step_seconds),
        group_sizes=get_ints(env, "FEDAT_GROUP_SIZES", d.group_sizes),
    )


def strategy(env: Mapping[str, str]) -> Strategy:
    """The strategy FEDAT_STRATEGY names, with the settings its FEDAT_* variables give (each strategy declares its own).

    Every strategy setting present is read and checked, whichever strategy runs: a typo in an unused one is still a
    typo. A bad value is a ConfigError naming its variable.
    """
    name = get_str(env, "FEDAT_STRATEGY", "fedat")
    if name not in REGISTRY:
        raise ConfigError(f"FEDAT_STRATEGY={name!r} is not one of {sorted(REGISTRY)}")
    readers = {int: get_int, float: get_float, str: get_str}
    values = {}
    for key, (kind, default, bounds) in setting_bounds().items():
        var = f"FEDAT_{key.upper()}"
        if not env.get(var, "").strip():
            continue
        value = readers[kind](env, var, default)
        problem = bounds.problem(value)
        if problem:
            raise ConfigError(f"{var}={value!r} {problem}")
        values[key] = value
    return build_strategy(name, **values)
