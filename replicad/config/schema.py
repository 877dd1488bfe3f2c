"""The shape of replicad's config file: every key, its rule, and the checks across keys.

`SCHEMA` mirrors the dataclasses of `replicad.config.model` (and `LogConfig` for `log`) key for
key; a test keeps them from drifting apart. Defaults live only in the dataclasses. Cross-field
checks (`CROSS_CHECKS`) run on the effective values -- given or default -- and are skipped when
one of their keys already failed its own rule, so one typo is reported once.

Adding a section (e.g. `groups:`), in three places and nothing else:
1. model.py: a frozen dataclass with the defaults (`GroupsConfig`), and a field of it in
   `Config` (`groups: GroupsConfig = field(default_factory=GroupsConfig)`, or
   `GroupsConfig | None = None` for a section that is off unless given, as `serve`).
2. Here: `"groups": Section(GroupsConfig, {...})` in SCHEMA, one rule per key from
   rules.py -- `Int(min, max)`, `Bool()`, `Str()`, `Choice(Enum)`, `Address()`,
   `FilePath()`, `SecretFile()`/`SecretEnv()`, and for lists `ListOf(item_rule, "a list of
   ...")` (ready-made: TOPIC_LIST, ID_LIST, ADDRESS_LIST, PRINCIPAL_LIST, choice_list(Enum));
   `nullable=True` on the Section for an optional one. A rule reports a problem with the
   key's path; the loader adds file and line.
3. Checks across keys: a `CrossCheck(paths, fn)` in CROSS_CHECKS (or one from `above(...)`;
   `only_one(values, a, b)` inside a check); `Values.show(path)` marks defaults in messages.
   Kafka's names for your keys go in KAFKA_NAMES, and config/replicad.yaml documents every
   key (tests/config/test_schema.py holds the example, the model and SCHEMA together).
Checks that look at the machine (files, directories) go to preflight.py, not here.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from replicad.config.model import (
    ArchiveConfig,
    ClientAuth,
    Config,
    ControlConfig,
    FetchConfig,
    GroupsConfig,
    IsolationLevel,
    LogFormat,
    LoggingConfig,
    LogLevel,
    MirrorConfig,
    OnGap,
    PayloadSigning,
    SaslConfig,
    SaslMechanism,
    SecurityConfig,
    SecurityProtocol,
    ServeConfig,
    ServeSaslConfig,
    ServeSecurityConfig,
    ServeTlsConfig,
    SourceConfig,
    StartFrom,
    TlsConfig,
    TopicsConfig,
    VerifyConfig,
)
from replicad.config.rules import (
    ADDRESS_COUNT_LIST,
    ADDRESS_LIST,
    GROUP_PATTERN_LIST,
    ID_LIST,
    INT32_MAX,
    PRINCIPAL_LIST,
    TOPIC_LIST,
    TOPIC_PREFIX,
    Address,
    Bool,
    Choice,
    FilePath,
    HttpUrl,
    Int,
    Problem,
    Regex,
    Rule,
    SecretEnv,
    SecretFile,
    Str,
    UsersFile,
    choice_list,
)
from replicad.errors import ConfigError
from replicad.log.config import LogConfig

# Kafka's record overhead for a magic-0 message: the smallest segment that can hold one.
MIN_SEGMENT_BYTES = 14
# A time-index entry is 12 bytes (offset-index 8): an index must hold at least one.
MIN_SEGMENT_INDEX_BYTES = 12
# Shortest part of a key name worth suggesting the keys that contain it.
MIN_FRAGMENT = 4


@dataclass(frozen=True)
class Section:
    """A mapping of keys; `nullable` sections may be null, which means "off" (serve)."""

    cls: type
    entries: Mapping[str, Rule | Section]
    nullable: bool = False


# The `security:` keys of a client section (source:, mirror:).
CLIENT_SECURITY = Section(
    SecurityConfig,
    {
        "protocol": Choice(SecurityProtocol),
        "tls": Section(
            TlsConfig,
            {
                "ca_file": FilePath(nullable=True),
                "cert_file": FilePath(nullable=True),
                "key_file": FilePath(nullable=True),
                "key_password_file": SecretFile(),
                "key_password_env": SecretEnv(),
                "verify": Bool(),
                "check_hostname": Bool(),
                "server_hostname": Str(non_empty=True, nullable=True),
            },
        ),
        "sasl": Section(
            SaslConfig,
            {
                "mechanism": Choice(SaslMechanism),
                "username": Str(),
                "password_file": SecretFile(),
                "password_env": SecretEnv(),
            },
        ),
    },
)

SCHEMA = Section(
    Config,
    {
        "source": Section(
            SourceConfig,
            {
                "bootstrap_servers": dataclasses.replace(ADDRESS_LIST, required=True),
                "client_id": Str(),
                "rack_id": Str(),
                "connect_timeout_ms": Int(1, INT32_MAX),
                "request_timeout_ms": Int(1, INT32_MAX),
                "reconnect_backoff_ms": Int(0, INT32_MAX),
                "reconnect_backoff_max_ms": Int(0, INT32_MAX),
                "metadata_max_age_ms": Int(1),
                "security": CLIENT_SECURITY,
            },
        ),
        "topics": Section(
            TopicsConfig,
            {
                "include": TOPIC_LIST,
                "regex": Regex(),
                "start_from": Choice(StartFrom),
                "on_gap": Choice(OnGap),
            },
        ),
        "fetch": Section(
            FetchConfig,
            {
                # The int32 ones go on the wire as int32.
                "response_max_bytes": Int(1, INT32_MAX),
                "partition_max_bytes": Int(1, INT32_MAX),
                "wait_max_ms": Int(0, INT32_MAX),
                "min_bytes": Int(1, INT32_MAX),
                "backoff_ms": Int(0),
                "sessions": Bool(),
                "replica_id": Int(-1, INT32_MAX),
                "isolation_level": Choice(IsolationLevel),
                "buffer_memory": Int(1),
                "sessionless_max_partitions": Int(1, INT32_MAX),
                "sessionless_wait_ms": Int(0, INT32_MAX),
            },
        ),
        "data_dir": FilePath(),
        "checkpoint_interval_ms": Int(1),
        "high_watermark_interval_ms": Int(1, nullable=True),
        "log": Section(
            LogConfig,
            {
                # Positions inside a segment are int32 in its index.
                "segment_bytes": Int(MIN_SEGMENT_BYTES, INT32_MAX),
                "segment_ms": Int(1),
                "index_interval_bytes": Int(0, INT32_MAX),
                "segment_index_bytes": Int(MIN_SEGMENT_INDEX_BYTES, INT32_MAX),
                "flush_messages": Int(1, nullable=True),
                "flush_ms": Int(0, nullable=True),
                "retention_bytes": Int(-1),
                "retention_ms": Int(-1),
                "max_open_files": Int(1, INT32_MAX),
            },
        ),
        "control": Section(
            ControlConfig,
            {
                "socket": FilePath(unix_socket=True),
                "metrics_listen": Address(listening=True, nullable=True),
                "metrics_per_topic": Bool(),
                "stall_after_ms": Int(1),
            },
        ),
        "logging": Section(LoggingConfig, {"level": Choice(LogLevel), "format": Choice(LogFormat)}),
        "serve": Section(
            ServeConfig,
            {
                "listen": Address(listening=True, required=True),
                "advertised": Address(nullable=True),
                "node_id": Int(0, INT32_MAX),
                "allowed_followers": ID_LIST,
                "security": Section(
                    ServeSecurityConfig,
                    {
                        "tls": Section(
                            ServeTlsConfig,
                            {
                                "cert_file": FilePath(nullable=True),
                                "key_file": FilePath(nullable=True),
                                "key_password_file": SecretFile(),
                                "key_password_env": SecretEnv(),
                                "ca_file": FilePath(nullable=True),
                                "client_auth": Choice(ClientAuth),
                            },
                        ),
                        "sasl": Section(
                            ServeSaslConfig,
                            {"mechanisms": choice_list(SaslMechanism), "users_file": UsersFile()},
                        ),
                        "follower_principals": PRINCIPAL_LIST,
                    },
                ),
                "max_request_bytes": Int(8, INT32_MAX),
                "queued_max_request_bytes": Int(1),
                "request_frame_timeout_ms": Int(1, INT32_MAX),
                "connections_max_idle_ms": Int(1, INT32_MAX),
                "max_connections": Int(1, INT32_MAX),
                "max_connections_per_ip": Int(1, INT32_MAX),
                "max_connections_per_ip_overrides": ADDRESS_COUNT_LIST,
                "failed_authentication_delay_ms": Int(0, INT32_MAX),
                "authentication_timeout_ms": Int(1, INT32_MAX),
                "request_quota_percentage": Int(1, 100, nullable=True),
                "message_downconversion_enable": Bool(),
            },
            nullable=True,
        ),
        "mirror": Section(
            MirrorConfig,
            {
                "bootstrap_servers": dataclasses.replace(ADDRESS_LIST, required=True),
                "client_id": Str(),
                "connect_timeout_ms": Int(1, INT32_MAX),
                "request_timeout_ms": Int(1, INT32_MAX),
                "reconnect_backoff_ms": Int(0, INT32_MAX),
                "reconnect_backoff_max_ms": Int(0, INT32_MAX),
                "security": CLIENT_SECURITY,
                "topics": TOPIC_LIST,
                "topic_prefix": TOPIC_PREFIX,
                # CreateTopics carries it as an int16.
                "replication_factor": Int(-1, 32_767),
                "produce_timeout_ms": Int(1, INT32_MAX),
                "progress_interval_ms": Int(1),
                "buffer_bytes": Int(1),
                # A broker remembers the last 5 batches per producer and partition.
                "max_in_flight": Int(1, 5),
                "connections_per_broker": Int(1, 64),
                "coalesce_bytes": Int(0, INT32_MAX),
                "retention_waits": Bool(),
                "topic_sync_interval_ms": Int(1),
            },
            nullable=True,
        ),
        "groups": Section(
            GroupsConfig,
            {
                "enabled": Bool(),
                "include": GROUP_PATTERN_LIST,
                "exclude": GROUP_PATTERN_LIST,
                "sync_interval_ms": Int(1),
                "read_only": Bool(),
                "min_session_timeout_ms": Int(1, INT32_MAX),
                "max_session_timeout_ms": Int(1, INT32_MAX),
                "initial_rebalance_delay_ms": Int(0, INT32_MAX),
                "consumer_protocol": Bool(),
                "consumer_session_timeout_ms": Int(1, INT32_MAX),
                "consumer_heartbeat_interval_ms": Int(1, INT32_MAX),
            },
        ),
        "archive": Section(
            ArchiveConfig,
            {
                "bucket": Str(non_empty=True),
                "prefix": Str(),
                "endpoint": HttpUrl(nullable=True),
                "region": Str(non_empty=True, nullable=True),
                "access_key_id": Str(non_empty=True, nullable=True),
                "secret_access_key_file": SecretFile(),
                "secret_access_key_env": SecretEnv(),
                "path_style": Bool(),
                "interval_ms": Int(1),
                "retry_backoff_ms": Int(1),
                "retry_backoff_max_ms": Int(1),
                "request_timeout_ms": Int(1, INT32_MAX),
                "read_cache_bytes": Int(0),
                "read_threads": Int(1, 64),
                "retention_ms": Int(-1),
                "retention_bytes": Int(-1),
                "upload_threads": Int(1, 64),
                "payload_signing": Choice(PayloadSigning),
                "upload_crc32c": Bool(),
            },
            nullable=True,
        ),
        "verify": Section(
            VerifyConfig,
            {
                "enabled": Bool(),
                "topics": TOPIC_LIST,
                "max_bytes_per_second": Int(1),
                "fetch_max_bytes": Int(1024, INT32_MAX),
                "interval_ms": Int(1),
                "sample": Int(0, 1_000_000),
            },
        ),
    },
)

# Kafka's names for what replicad calls otherwise, so a pasted Kafka setting gets a pointer.
KAFKA_NAMES: Mapping[str, str] = {
    "bootstrap.servers": "source.bootstrap_servers",
    "client.id": "source.client_id",
    "client.rack": "source.rack_id",
    "broker.rack": "source.rack_id",
    "socket.connection.setup.timeout.ms": "source.connect_timeout_ms",
    "request.timeout.ms": "source.request_timeout_ms",
    "reconnect.backoff.ms": "source.reconnect_backoff_ms",
    "reconnect.backoff.max.ms": "source.reconnect_backoff_max_ms",
    "metadata.max.age.ms": "source.metadata_max_age_ms",
    "security.protocol": "source.security.protocol",
    "sasl.mechanism": "source.security.sasl.mechanism",
    "sasl.mechanisms": "source.security.sasl.mechanism",
    "sasl.username": "source.security.sasl.username",
    "sasl.password": "source.security.sasl.password_file",
    "sasl.jaas.config": "source.security.sasl.username",
    "ssl.ca.location": "source.security.tls.ca_file",
    "ssl.truststore.location": "source.security.tls.ca_file",
    "ssl.certificate.location": "source.security.tls.cert_file",
    "ssl.keystore.location": "source.security.tls.cert_file",
    "ssl.key.location": "source.security.tls.key_file",
    "ssl.key.password": "source.security.tls.key_password_file",
    "ssl.endpoint.identification.algorithm": "source.security.tls.check_hostname",
    "enable.ssl.certificate.verification": "source.security.tls.verify",
    "ssl.client.auth": "serve.security.tls.client_auth",
    "sasl.enabled.mechanisms": "serve.security.sasl.mechanisms",
    "socket.request.max.bytes": "serve.max_request_bytes",
    "queued.max.request.bytes": "serve.queued_max_request_bytes",
    "connections.max.idle.ms": "serve.connections_max_idle_ms",
    "max.connections": "serve.max_connections",
    "max.connections.per.ip": "serve.max_connections_per_ip",
    "max.connections.per.ip.overrides": "serve.max_connections_per_ip_overrides",
    "connection.failed.authentication.delay.ms": "serve.failed_authentication_delay_ms",
    "message.downconversion.enable": "serve.message_downconversion_enable",
    "log.message.downconversion.enable": "serve.message_downconversion_enable",
    "auto.offset.reset": "topics.start_from",
    "replica.fetch.response.max.bytes": "fetch.response_max_bytes",
    "fetch.max.bytes": "fetch.response_max_bytes",
    "replica.fetch.max.bytes": "fetch.partition_max_bytes",
    "max.partition.fetch.bytes": "fetch.partition_max_bytes",
    "replica.fetch.wait.max.ms": "fetch.wait_max_ms",
    "fetch.max.wait.ms": "fetch.wait_max_ms",
    "replica.fetch.min.bytes": "fetch.min_bytes",
    "fetch.min.bytes": "fetch.min_bytes",
    "replica.fetch.backoff.ms": "fetch.backoff_ms",
    "isolation.level": "fetch.isolation_level",
    "buffer.memory": "fetch.buffer_memory",
    "log.dir": "data_dir",
    "log.dirs": "data_dir",
    "replica.high.watermark.checkpoint.interval.ms": "checkpoint_interval_ms",
    "segment.bytes": "log.segment_bytes",
    "log.segment.bytes": "log.segment_bytes",
    "segment.ms": "log.segment_ms",
    "index.interval.bytes": "log.index_interval_bytes",
    "segment.index.bytes": "log.segment_index_bytes",
    "flush.messages": "log.flush_messages",
    "flush.ms": "log.flush_ms",
    "retention.bytes": "log.retention_bytes",
    "retention.ms": "log.retention_ms",
    # MirrorMaker 2's and Cluster Linking's names for the group sync.
    "sync.group.offsets.enabled": "groups.enabled",
    "sync.group.offsets.interval.seconds": "groups.sync_interval_ms",
    "consumer.offset.sync.enable": "groups.enabled",
    "consumer.offset.sync.ms": "groups.sync_interval_ms",
    "group.min.session.timeout.ms": "groups.min_session_timeout_ms",
    "group.max.session.timeout.ms": "groups.max_session_timeout_ms",
    "group.initial.rebalance.delay.ms": "groups.initial_rebalance_delay_ms",
    "group.coordinator.rebalance.protocols": "groups.consumer_protocol",
    "group.consumer.session.timeout.ms": "groups.consumer_session_timeout_ms",
    "group.consumer.heartbeat.interval.ms": "groups.consumer_heartbeat_interval_ms",
}


def join(parent: str, key: object) -> str:
    return f"{parent}.{key}" if parent else str(key)


def walk(section: Section = SCHEMA, prefix: str = "") -> Iterator[tuple[str, Rule | Section]]:
    """Every (dotted path, entry) below `section`, sections before their keys, in order."""
    for key, entry in section.entries.items():
        path = join(prefix, key)
        yield path, entry
        if isinstance(entry, Section):
            yield from walk(entry, path)


def leaf_paths(section: Section = SCHEMA) -> list[str]:
    """The dotted path of every value key: what the example config must document."""
    return [path for path, entry in walk(section) if not isinstance(entry, Section)]


def find(path: str) -> Rule | Section | None:
    """The entry at a dotted path, or None if there is no such key."""
    entry: Rule | Section = SCHEMA
    for key in path.split("."):
        if not isinstance(entry, Section) or key not in entry.entries:
            return None
        entry = entry.entries[key]
    return entry


def default_of(path: str) -> object:
    """The dataclass default of a value key (dataclasses.MISSING for a required one)."""
    parent, _, key = path.rpartition(".")
    section = find(parent) if parent else SCHEMA
    if not isinstance(section, Section):
        raise KeyError(path)
    for item in dataclasses.fields(section.cls):
        if item.name == key:
            if item.default_factory is not dataclasses.MISSING:
                return item.default_factory()
            return item.default
    raise KeyError(path)


def unknown_key_message(section_path: str, key: object) -> str:
    """ "unknown key", with the best pointer we have to what was meant."""
    section = find(section_path) if section_path else SCHEMA
    if not isinstance(section, Section):
        return "unknown key"
    known = list(section.entries)
    if not isinstance(key, str):
        return f"unknown key (keys here are: {', '.join(known)})"
    spelled = key.replace("-", "_").replace(".", "_").lower()
    if spelled in section.entries:
        return f"unknown key (did you mean {spelled}?)"
    if key in KAFKA_NAMES:
        return f"unknown key (Kafka's {key} is {KAFKA_NAMES[key]} here)"
    # "max_bytes" means one of the *_max_bytes keys, not the similar-looking min_bytes;
    # "max_wait" means wait_max_ms (same words, another order).
    words = set(spelled.split("_"))
    containing = [
        name
        for name in known
        if (len(spelled) >= MIN_FRAGMENT and spelled in name)
        or (len(words) > 1 and words <= set(name.split("_")))
    ]
    if containing:
        return f"unknown key (did you mean {' or '.join(containing)}?)"
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
    if close:
        return f"unknown key (did you mean {close[0]}?)"
    # A misspelt part of a name: "bootstap" for bootstrap_servers.
    by_word: dict[str, list[str]] = {}
    for name in known:
        for word in name.split("_"):
            if len(word) >= MIN_FRAGMENT:
                by_word.setdefault(word, []).append(name)
    near = difflib.get_close_matches(spelled, list(by_word), n=1, cutoff=0.8)
    if near:
        return f"unknown key (did you mean {' or '.join(by_word[near[0]])}?)"
    elsewhere = [
        path
        for path, _ in walk()
        if path.rpartition(".")[2] == spelled and path.rpartition(".")[0] != section_path
    ]
    if elsewhere:
        return f"unknown key (did you mean {elsewhere[0]}?)"
    return f"unknown key (keys here are: {', '.join(known)})"


class Values:
    """The effective value of each key: given (and valid) or default; for cross checks."""

    def __init__(self, given: Mapping[str, object]) -> None:
        self._given = given

    def __getitem__(self, path: str) -> object:
        if path in self._given:
            return self._given[path]
        return default_of(path)

    def show(self, path: str) -> str:
        """The value for a message, marked when the user did not set it: "100 (default)"."""
        text = str(self[path])
        return text if path in self._given else f"{text} (default)"


@dataclass(frozen=True)
class CrossCheck:
    """A rule over several keys; runs only if none of `paths` failed on its own."""

    paths: tuple[str, ...]
    check: Callable[[Values], Problem | None]


def above(path: str, other: str, *, strictly: bool = False, why: str = "") -> CrossCheck:
    """`path` must be >= `other` (> when `strictly`); `why` follows the rule in the message."""

    def check(values: Values) -> Problem | None:
        value, bound = values[path], values[other]
        assert isinstance(value, int) and isinstance(bound, int)
        if value > bound or (value == bound and not strictly):
            return None
        rule, broken = (">", "<=") if strictly else (">=", "<")
        return Problem(
            path,
            f"must be {rule} {other}{why}; got {values.show(path)} {broken} {values.show(other)}",
            (other,),
        )

    return CrossCheck((path, other), check)


def must_be_off(path: str, why: str) -> CrossCheck:
    """`path`, a switch, must be false where this check runs (the checks of a section that
    is off); `why` says what it would need."""

    def check(values: Values) -> Problem | None:
        return Problem(path, f"is true, but {why}") if values[path] else None

    return CrossCheck((path,), check)


def only_one(values: Values, first: str, second: str) -> Problem | None:
    """Two ways to give one thing (a password from a file or from the environment)."""
    if values[first] is None or values[second] is None:
        return None
    name = first.rpartition(".")[2]
    return Problem(second, f"give only one of {name} and {second.rpartition('.')[2]}", (first,))


def _one_topic_choice(values: Values) -> Problem | None:
    include, regex = values["topics.include"], values["topics.regex"]
    if include and regex is not None:
        return Problem(
            "topics.regex",
            "cannot be given together with topics.include: choose topics by list or by "
            "pattern, not both",
            ("topics.include",),
        )
    if not include and regex is None:
        return Problem(
            "topics",
            "give topics.include (a list of topic names) or topics.regex (a pattern)",
            ("topics.include", "topics.regex"),
        )
    return None


_TLS_KEYS = tuple(f.name for f in dataclasses.fields(TlsConfig))
_SASL_KEYS = tuple(f.name for f in dataclasses.fields(SaslConfig))


def _changed(values: Values, paths: tuple[str, ...]) -> list[str]:
    """The keys among `paths` whose value is not their default (given as null counts as not)."""
    return [path for path in paths if values[path] != default_of(path)]


def client_security_checks(section: str) -> tuple[CrossCheck, ...]:
    """Checks of a client's `security:` keys under `section` ("source.security" for the
    source, "mirror.security" for the mirror's destination); each runs when none of its
    keys failed its own rule."""
    protocol_path = f"{section}.protocol"
    tls, sasl = f"{section}.tls", f"{section}.sasl"
    tls_paths = tuple(f"{tls}.{key}" for key in _TLS_KEYS)
    sasl_paths = tuple(f"{sasl}.{key}" for key in _SASL_KEYS)

    def protocol_of(values: Values) -> SecurityProtocol:
        protocol = values[protocol_path]
        assert isinstance(protocol, SecurityProtocol)
        return protocol

    def needs_its_protocol(paths: tuple[str, ...], uses: str, what: str, fix: str) -> CrossCheck:
        """Settings of `paths` given while the protocol does not use them."""

        def check(values: Values) -> Problem | None:
            protocol = protocol_of(values)
            changed = _changed(values, paths)
            if getattr(protocol, uses) or not changed:
                return None
            return Problem(
                changed[0],
                f"is set, but {protocol_path} is {protocol}, which does not use {what}: "
                f"set the protocol to {fix}, or remove the {what.lower()} settings",
                (protocol_path,),
            )

        return CrossCheck((protocol_path, *paths), check)

    def sasl_has_a_username(values: Values) -> Problem | None:
        protocol = protocol_of(values)
        if not protocol.uses_sasl or values[f"{sasl}.username"]:
            return None
        return Problem(
            f"{sasl}.username", f"required when {protocol_path} is {protocol}", (protocol_path,)
        )

    def sasl_has_one_password(values: Values) -> Problem | None:
        protocol = protocol_of(values)
        if not protocol.uses_sasl:
            return None
        from_file, from_env = f"{sasl}.password_file", f"{sasl}.password_env"
        if values[from_file] is None and values[from_env] is None:
            return Problem(
                from_file,
                f"give password_file or password_env when {protocol_path} is {protocol}",
                (protocol_path, from_env),
            )
        return only_one(values, from_file, from_env)

    def tls_key_goes_with_a_certificate(values: Values) -> Problem | None:
        cert = values[f"{tls}.cert_file"]
        if cert is None:
            for key in ("key_file", "key_password_file", "key_password_env"):
                path = f"{tls}.{key}"
                if values[path] is not None:
                    return Problem(
                        path,
                        f"needs {tls}.cert_file, the client certificate it belongs to",
                        (f"{tls}.cert_file",),
                    )
        return only_one(values, f"{tls}.key_password_file", f"{tls}.key_password_env")

    def tls_files_load(values: Values) -> Problem | None:
        """The CA, certificate and key files must load now, not at the first connection."""
        if not protocol_of(values).uses_tls or tls_key_goes_with_a_certificate(values):
            return None
        # Imported here: the config loader should not pay for the ssl module otherwise.
        from replicad.config.tls import TLS_KEYS, client_tls_context

        config = TlsConfig(
            **{key: values[path] for key, path in zip(_TLS_KEYS, tls_paths, strict=True)}
        )
        try:
            client_tls_context(config)
        except ConfigError as error:
            # The TLS loader names the source's keys; this section's are named instead.
            return Problem(error.path.replace(TLS_KEYS, tls, 1), error.message)
        return None

    return (
        needs_its_protocol(sasl_paths, "uses_sasl", "SASL", "sasl_ssl (or sasl_plaintext)"),
        needs_its_protocol(tls_paths, "uses_tls", "TLS", "ssl or sasl_ssl"),
        CrossCheck((protocol_path, f"{sasl}.username"), sasl_has_a_username),
        CrossCheck(
            (protocol_path, f"{sasl}.password_file", f"{sasl}.password_env"),
            sasl_has_one_password,
        ),
        CrossCheck(tls_paths, tls_key_goes_with_a_certificate),
        CrossCheck((protocol_path, *tls_paths), tls_files_load),
    )


SECURITY_CHECKS = client_security_checks("source.security")


def _read_only_needs_the_sync(values: Values) -> Problem | None:
    if values["groups.read_only"] and not values["groups.enabled"]:
        return Problem(
            "groups.read_only",
            "is true, but groups.enabled is false: read-only groups are the groups whose "
            "offsets serve takes from the source",
            ("groups.enabled",),
        )
    return None


def _archive_key_and_secret(values: Values) -> Problem | None:
    """An access key id goes with exactly one secret, and a secret with a key id."""
    key = values["archive.access_key_id"]
    from_file, from_env = "archive.secret_access_key_file", "archive.secret_access_key_env"
    if key is None:
        for path in (from_file, from_env):
            if values[path] is not None:
                return Problem(
                    path,
                    "is set, but archive.access_key_id is not: give both, or neither for "
                    "the AWS credential chain (AWS_ACCESS_KEY_ID..., a credentials file)",
                    ("archive.access_key_id",),
                )
        return None
    if values[from_file] is None and values[from_env] is None:
        return Problem(
            from_file,
            "give secret_access_key_file or secret_access_key_env with archive.access_key_id",
            ("archive.access_key_id", from_env),
        )
    return only_one(values, from_file, from_env)


CROSS_CHECKS: tuple[CrossCheck, ...] = (
    CrossCheck(("topics.include", "topics.regex"), _one_topic_choice),
    above(
        "fetch.buffer_memory",
        "fetch.response_max_bytes",
        why=", so one whole response fits the pool",
    ),
    above("source.reconnect_backoff_max_ms", "source.reconnect_backoff_ms"),
    above(
        "source.request_timeout_ms",
        "fetch.wait_max_ms",
        strictly=True,
        why=", or a fetch the leader holds back that long times out",
    ),
    *SECURITY_CHECKS,
    CrossCheck(("groups.read_only", "groups.enabled"), _read_only_needs_the_sync),
    above("groups.max_session_timeout_ms", "groups.min_session_timeout_ms"),
    above(
        "groups.consumer_session_timeout_ms",
        "groups.consumer_heartbeat_interval_ms",
        strictly=True,
        why=", or members time out between two heartbeats",
    ),
    above("archive.retry_backoff_max_ms", "archive.retry_backoff_ms"),
    CrossCheck(
        (
            "archive.access_key_id",
            "archive.secret_access_key_file",
            "archive.secret_access_key_env",
        ),
        _archive_key_and_secret,
    ),
)


def _advertise_something_reachable(values: Values) -> Problem | None:
    listen, advertised = values["serve.listen"], values["serve.advertised"]
    if advertised is not None or not getattr(listen, "is_wildcard", False):
        return None
    return Problem(
        "serve.advertised",
        f"required when serve.listen is a wildcard address ({listen}): clients cannot "
        "connect to it",
        ("serve.listen",),
    )


_SERVE_TLS = "serve.security.tls"
_SERVE_SASL = "serve.security.sasl"
_FOLLOWER_PRINCIPALS = "serve.security.follower_principals"
_SERVE_TLS_KEYS = tuple(f.name for f in dataclasses.fields(ServeTlsConfig))
SERVE_TLS_PATHS = tuple(f"{_SERVE_TLS}.{key}" for key in _SERVE_TLS_KEYS)
_SERVE_AUTH_PATHS = (f"{_SERVE_SASL}.mechanisms", f"{_SERVE_TLS}.client_auth")


def _serve_tls(values: Values) -> ServeTlsConfig:
    return ServeTlsConfig(
        **{key: values[path] for key, path in zip(_SERVE_TLS_KEYS, SERVE_TLS_PATHS, strict=True)}
    )


def _serve_tls_needs_a_certificate(values: Values) -> Problem | None:
    tls = _serve_tls(values)
    if tls.cert_file is None:
        for key in ("key_file", "key_password_file", "key_password_env", "ca_file"):
            if getattr(tls, key) is not None:
                return Problem(
                    f"{_SERVE_TLS}.{key}",
                    f"needs {_SERVE_TLS}.cert_file: TLS is on only with a server certificate",
                    (f"{_SERVE_TLS}.cert_file",),
                )
        if tls.client_auth is not ClientAuth.NONE:
            return Problem(
                f"{_SERVE_TLS}.client_auth",
                f"is {tls.client_auth}, but client certificates need TLS: give "
                f"{_SERVE_TLS}.cert_file",
                (f"{_SERVE_TLS}.cert_file",),
            )
    return only_one(values, f"{_SERVE_TLS}.key_password_file", f"{_SERVE_TLS}.key_password_env")


def _serve_client_auth_has_its_ca(values: Values) -> Problem | None:
    tls = _serve_tls(values)
    if tls.cert_file is None:
        return None
    if tls.client_auth is not ClientAuth.NONE and tls.ca_file is None:
        return Problem(
            f"{_SERVE_TLS}.ca_file",
            f"required when {_SERVE_TLS}.client_auth is {tls.client_auth}: the CAs that "
            "sign the client certificates",
            (f"{_SERVE_TLS}.client_auth",),
        )
    if tls.client_auth is ClientAuth.NONE and tls.ca_file is not None:
        return Problem(
            f"{_SERVE_TLS}.ca_file",
            "is only used to check client certificates, but "
            f"{_SERVE_TLS}.client_auth is none: set it to requested or required, or remove "
            "ca_file",
            (f"{_SERVE_TLS}.client_auth",),
        )
    return None


def _serve_tls_files_load(values: Values) -> Problem | None:
    """The server's certificate, key and client CAs must load now, not at the first client."""
    if _serve_tls_needs_a_certificate(values) or _serve_client_auth_has_its_ca(values):
        return None
    tls = _serve_tls(values)
    if tls.cert_file is None:
        return None
    # Imported here: the config loader should not pay for the ssl module otherwise.
    import ssl

    from replicad.config.tls import password_callback, tls_context

    context = tls_context(server=True)
    try:
        context.load_cert_chain(
            str(tls.cert_file),
            str(tls.key_file) if tls.key_file is not None else None,
            password=password_callback(tls.key_password),
        )
    except (ssl.SSLError, OSError) as error:
        return Problem(
            f"{_SERVE_TLS}.cert_file",
            f"cannot load the server certificate and key: {_load_reason(error)}",
            (f"{_SERVE_TLS}.key_file",),
        )
    if tls.ca_file is not None:
        try:
            context.load_verify_locations(cafile=str(tls.ca_file))
        except (ssl.SSLError, OSError) as error:
            return Problem(
                f"{_SERVE_TLS}.ca_file", f"cannot load the CA certificates: {_load_reason(error)}"
            )
    return None


def _load_reason(error: OSError) -> str:
    # ssl errors carry OpenSSL's reason ("PEM_R_NO_START_LINE"); OSErrors their strerror.
    reason = getattr(error, "reason", None) or error.strerror or str(error)
    return str(reason).replace("_", " ").lower() if getattr(error, "reason", None) else reason


def _serve_sasl_has_users(values: Values) -> Problem | None:
    mechanisms, users = values[f"{_SERVE_SASL}.mechanisms"], values[f"{_SERVE_SASL}.users_file"]
    if mechanisms and users is None:
        return Problem(
            f"{_SERVE_SASL}.users_file",
            f"required when {_SERVE_SASL}.mechanisms is set: the users SASL accepts",
            (f"{_SERVE_SASL}.mechanisms",),
        )
    if not mechanisms and users is not None:
        return Problem(
            f"{_SERVE_SASL}.mechanisms",
            f"give the SASL mechanisms to serve (e.g. [scram-sha-512]); {_SERVE_SASL}.users_file "
            "is set but SASL is off without them",
            (f"{_SERVE_SASL}.users_file",),
        )
    return None


def _follower_principals_need_authentication(values: Values) -> Problem | None:
    principals = values[_FOLLOWER_PRINCIPALS]
    authenticates = bool(values[f"{_SERVE_SASL}.mechanisms"]) or (
        values[f"{_SERVE_TLS}.client_auth"] is not ClientAuth.NONE
    )
    followers = values["serve.allowed_followers"]
    if principals and not authenticates:
        return Problem(
            _FOLLOWER_PRINCIPALS,
            "needs connections that authenticate: set serve.security.sasl.mechanisms or "
            f"{_SERVE_TLS}.client_auth (without either, every client is User:ANONYMOUS)",
            _SERVE_AUTH_PATHS,
        )
    if principals and not followers:
        return Problem(
            "serve.allowed_followers",
            f"required when {_FOLLOWER_PRINCIPALS} is set: the replica ids those principals "
            "fetch as (the fetch.replica_id of the downstream replicads)",
            (_FOLLOWER_PRINCIPALS,),
        )
    if followers and authenticates and not principals:
        return Problem(
            _FOLLOWER_PRINCIPALS,
            "required when connections authenticate and serve.allowed_followers is set: "
            'who may fetch as a follower, e.g. ["User:replica"]',
            ("serve.allowed_followers", *_SERVE_AUTH_PATHS),
        )
    return None


# Checks of the optional serve section, run only when it is turned on.
SERVE_CHECKS: tuple[CrossCheck, ...] = (
    CrossCheck(("serve.listen", "serve.advertised"), _advertise_something_reachable),
    CrossCheck(SERVE_TLS_PATHS, _serve_tls_needs_a_certificate),
    CrossCheck(SERVE_TLS_PATHS, _serve_client_auth_has_its_ca),
    CrossCheck(SERVE_TLS_PATHS, _serve_tls_files_load),
    CrossCheck((f"{_SERVE_SASL}.mechanisms", f"{_SERVE_SASL}.users_file"), _serve_sasl_has_users),
    CrossCheck(
        (_FOLLOWER_PRINCIPALS, "serve.allowed_followers", *_SERVE_AUTH_PATHS),
        _follower_principals_need_authentication,
    ),
    above(
        "serve.queued_max_request_bytes",
        "serve.max_request_bytes",
        why=", so the largest request frame fits the request memory pool",
    ),
    above("serve.max_connections", "serve.max_connections_per_ip"),
)


# Checks of the groups section run when serve: is off.
GROUPS_WITHOUT_SERVE_CHECKS: tuple[CrossCheck, ...] = (
    must_be_off(
        "groups.read_only",
        "there is no serve: section: it makes serve refuse OffsetCommit for the synced groups",
    ),
)


# Checks of the groups section run when the sections it serves are off (no mirror:, no serve:).
GROUPS_WITHOUT_DESTINATION_CHECKS: tuple[CrossCheck, ...] = (
    must_be_off(
        "groups.enabled",
        "there is neither a mirror: nor a serve: section: group offsets are synced into the "
        "mirror's destination cluster and into serve's own coordinator",
    ),
)


# Checks of the optional mirror section, run only when it is turned on.
MIRROR_CHECKS: tuple[CrossCheck, ...] = (
    above("mirror.reconnect_backoff_max_ms", "mirror.reconnect_backoff_ms"),
    *client_security_checks("mirror.security"),
)
