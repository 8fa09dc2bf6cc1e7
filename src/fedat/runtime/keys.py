"""Where a process finds its signing keys: the FEDAT_* variables and the files they name."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from fedat.errors import KeyringError
from fedat.protocol.signing import Keyring, hex_secret


def read_keyring(path: str | os.PathLike) -> Keyring:
    """Read a keyring file: a JSON object name -> hex, or `name=hex` lines (`#` comments, blank lines)."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyringError(f"{source}: cannot read the keyring file ({type(exc).__name__})") from None
    return Keyring.from_text(text, source)


def keyring_from_env(env: Mapping[str, str]) -> Keyring | None:
    """The process's keyring from exactly one of FEDAT_SIGNING_SECRET_FILE (a file holding the secret as hex),
    FEDAT_SIGNING_SECRET (hex) or FEDAT_KEYRING_FILE (a keyring file); None when none is set (signing off)."""
    given = {
        name: env[name]
        for name in ("FEDAT_SIGNING_SECRET_FILE", "FEDAT_SIGNING_SECRET", "FEDAT_KEYRING_FILE")
        if env.get(name, "").strip()
    }
    if not given:
        return None
    if len(given) > 1:
        raise KeyringError(f"set only one of {', '.join(sorted(given))}")
    [(name, value)] = given.items()
    if name == "FEDAT_SIGNING_SECRET":
        return Keyring.from_secret(hex_secret(value, name))
    if name == "FEDAT_SIGNING_SECRET_FILE":
        try:
            text = Path(value.strip()).read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError) as exc:
            raise KeyringError(f"{name}={value!r}: cannot read the secret ({type(exc).__name__})") from None
        return Keyring.from_secret(hex_secret(text, f"{name}={value!r}"))
    return read_keyring(value.strip())
