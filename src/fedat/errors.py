"""Every error the project raises on purpose, in one bottom module that any layer may import (no circles)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A `FEDAT_*` variable or a setting is malformed; the message names it."""


class CodecError(ValueError):
    """A layer cannot be encoded or decoded; the message names the layer and the reason."""


class WireError(ValueError):
    """A message that cannot be decoded or fails validation; the text names the offending field."""


class SignatureError(WireError):
    """An inbound message's signature is missing, malformed, by the wrong signer or does not match.

    A WireError, so the transport shell dead-letters it like any invalid message; `reason` is the text.
    """

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class SigningError(Exception):
    """This process cannot sign a message (it lacks the key): a configuration error, not the message's fault."""


class KeyringError(ConfigError):
    """A secret or keyring file is malformed or missing; the message names the source, never the key."""


class StateError(ValueError):
    """Persisted state that this code cannot read; the text says why."""


class CheckpointError(ValueError):
    """A stored checkpoint that cannot be read; the text says why."""


class CheckpointMismatch(RuntimeError):
    """A saved checkpoint was written for another run or settings than this process has; the text names each
    difference and how to go on (keep the settings it was written with, or start a new run on a fresh vhost)."""


class BrokerRefused(RuntimeError):
    """The broker refused our credentials or an operation (403): a configuration error, not a lost connection."""


class ProvisionError(RuntimeError):
    """A management API call failed, or the broker holds something that conflicts with the topology."""


class CommitFailed(ConnectionError):
    """Transitions already handled could not be saved or published: the service drops its connection and restores
    its latest checkpoint, so their inputs come again (a ConnectionError, so the shell's reconnect takes it)."""


class BrokerError(RuntimeError):
    """A private broker node failed to start, answer or stop; the message names the step and carries the log tail."""


class DatasetMissing(FileNotFoundError):
    """A data set's files are not where the loader expects them; the message names the paths and how to get them."""


class DatasetFormatError(ValueError):
    """A data set file exists but its content is not what the format promises."""


class AppError(ValueError):
    """A federated app that cannot run: what is missing or does not fit, named."""
