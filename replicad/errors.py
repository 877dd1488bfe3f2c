"""The one tree of replicad's errors.

Errors say who broke the rules: a `RemoteProtocolError` is the peer's fault (bad
bytes, an answer that makes no sense) and is never allowed out of a shell as an
exception -- the shell counts it, logs it and retries. A `LocalProtocolError` is
ours (we tried to build a request the protocol does not allow).
"""

from __future__ import annotations


class ReplicadError(Exception):
    """Base of every error replicad raises on purpose."""


class ConfigError(ReplicadError):
    """The configuration is invalid; `path` names the offending key (e.g. `fetch.max_bytes`)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


class ProtocolError(ReplicadError):
    """The Kafka protocol was not followed."""


class LocalProtocolError(ProtocolError):
    """We were about to break the protocol: a bug in replicad."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol does not allow (malformed frame, bad field)."""


class KafkaConnectionError(ReplicadError):
    """A connection to a broker failed, timed out or was closed."""


class RequestTimeoutError(KafkaConnectionError):
    """A request got no response within its timeout."""


class CorruptRecordError(ReplicadError):
    """Record bytes failed validation (length, magic, CRC, offsets)."""


class LogError(ReplicadError):
    """The local log could not do what was asked."""


class DiskFullError(LogError):
    """An append failed for lack of space; the log was left valid (whole batches only)."""


class LogDirLockedError(LogError):
    """Another process holds the data directory's lock."""
