"""The one tree of replicad's errors.

Errors say who broke the rules: a `RemoteProtocolError` is the peer's fault (bad
bytes, an answer that makes no sense) and is never allowed out of a shell as an
exception -- the shell counts it, logs it and retries. A `LocalProtocolError` is
ours (we tried to build a request the protocol does not allow).
"""

from __future__ import annotations

from collections.abc import Sequence


class ReplicadError(Exception):
    """Base of every error replicad raises on purpose."""


class ConfigError(ReplicadError):
    """The configuration is invalid; `path` names the offending key (e.g. `fetch.max_bytes`).

    `location` says where the bad value came from when that is known: `file:line`, a
    file, or `override` (a command-line flag); it leads the text like a compiler's message.
    """

    def __init__(self, path: str, message: str, *, location: str = "") -> None:
        text = f"{path}: {message}" if path else message
        super().__init__(f"{location}: {text}" if location else text)
        self.path = path
        self.message = message
        self.location = location


class ConfigErrors(ConfigError):
    """Every problem found in one configuration, reported together: one line each.

    `problems` holds the single errors in file order. With exactly one problem, `path`,
    `message` and `location` are that problem's, so callers can treat it as a ConfigError.
    """

    def __init__(self, problems: Sequence[ConfigError]) -> None:
        if not problems:
            raise ValueError("ConfigErrors needs at least one problem")
        self.problems = tuple(problems)
        text = "\n".join(str(problem) for problem in self.problems)
        ReplicadError.__init__(self, text)
        only = self.problems[0] if len(self.problems) == 1 else None
        self.path = only.path if only else ""
        self.message = only.message if only else text
        self.location = only.location if only else ""


class ProtocolError(ReplicadError):
    """The Kafka protocol was not followed."""


class LocalProtocolError(ProtocolError):
    """We were about to break the protocol: a bug in replicad."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol does not allow (malformed frame, bad field)."""


class KafkaConnectionError(ReplicadError):
    """A connection to a broker failed, timed out or was closed."""


class LeaderNotKnownError(KafkaConnectionError):
    """Metadata names no leader for a partition yet (just created, or being elected): the
    broker may be up; a metadata refresh is what is waited for."""


class RequestTimeoutError(KafkaConnectionError):
    """A request got no response within its timeout."""


class AuthenticationError(KafkaConnectionError):
    """TLS or SASL failed: a broker's certificate was not trusted, or it refused ours or
    our SASL credentials. Retried like any connection failure (credentials or trust may be
    fixed on the broker's side), and said plainly, never with the secret in it."""


class CorruptRecordError(ReplicadError):
    """Record bytes failed validation (length, magic, CRC, offsets)."""


class LogError(ReplicadError):
    """The local log could not do what was asked."""


class DiskFullError(LogError):
    """An append failed for lack of space; the log was left valid (whole batches only)."""


class DamagedLogError(LogError):
    """The log's bytes where a batch must start are no batch (a header that does not parse,
    or one that runs past the segment's end): damaged on disk. Kafka's reads raise
    CorruptRecordException there and answer the Fetch with CORRUPT_MESSAGE; a read never
    passes over it to later data."""


class LogDirLockedError(LogError):
    """Another process holds the data directory's lock."""


class ControlError(ReplicadError):
    """The control-socket conversation failed: a malformed message, a refused or failed command."""


class DaemonNotRunning(ControlError):
    """No daemon answers on the control socket: the file is missing, stale or nobody replied."""

    def __init__(self, path: object, reason: str = "no control socket at") -> None:
        super().__init__(f"replicad is not running ({reason} {path})")
        self.path = path


class OffsetOutOfRangeError(LogError):
    """A read asked for an offset below the log start or above the log end."""
