"""Reading `FEDAT_*` environment variables into typed values; used only by each service's `main()`."""

from __future__ import annotations

from collections.abc import Mapping


class ConfigError(ValueError):
    """A `FEDAT_*` variable is malformed; the message names it."""


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


def broker(env: Mapping[str, str], prefetch: int):
    """The broker section every service shares: where, how (TLS), whether to declare, and the signing keys.

    Signing is required: a process without keys refuses to start unless FEDAT_SIGNING=off says on purpose that
    it runs against a development broker where nobody signs.
    """
    from fedat import signing
    from fedat.bus import BrokerConfig
    from fedat.tls import tls_from_env

    keyring = signing.keyring_from_env(env)
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
        url=get_str(env, "FEDAT_AMQP_URL", BrokerConfig.url),
        num_tiers=get_int(env, "FEDAT_NUM_TIERS", 5),
        prefetch=get_int(env, "FEDAT_PREFETCH", prefetch),
        max_message_bytes=get_int(env, "FEDAT_MAX_MESSAGE_BYTES", BrokerConfig.max_message_bytes),
        tls=tls,
        declare=get_int(env, "FEDAT_DECLARE_TOPOLOGY", 1) == 1,
        keyring=keyring,
    )


def latency(env: Mapping[str, str]):
    """The latency model (`fedat.latency.StragglerProfile`) from the FEDAT_* latency variables."""
    from fedat.latency import PAPER_DELAYS, StragglerProfile

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
