"""The validated configuration of replicad: nested frozen dataclasses holding the defaults.

Instances are built by `replicad.config.loader` once every value has passed its rule in
`replicad.config.schema`, so readers never re-check them. `Config()` is the all-defaults
configuration, which is not runnable on its own: it names no bootstrap server and no topic.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

from replicad import wire
from replicad.config.defaults import default_control_socket, default_data_dir
from replicad.log.config import LogConfig

MIB = 1024 * 1024


def defaults_of(section: type) -> Mapping[str, Any]:
    """The plain defaults of a config section's keys, by name: the one place a settings
    class of the layers above takes its own defaults from (`ServeSettings`,
    `FetchSettings`, `MirrorSettings`...), so no default is written twice."""
    return MappingProxyType(
        {f.name: f.default for f in fields(section) if f.default is not MISSING}
    )


# Addresses a server can bind to but no client can connect to.
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})


class StartFrom(enum.StrEnum):
    """Where a partition with no local data starts replicating."""

    EARLIEST = "earliest"
    LATEST = "latest"


class OnGap(enum.StrEnum):
    """What to do on OFFSET_OUT_OF_RANGE when the leader's log start is above our log end."""

    # Truncate the local partition fully and restart at the leader's log start (Kafka's way).
    RESET = "reset"
    # Stop replicating that partition and report it, keeping the local data as it is.
    HALT = "halt"


class IsolationLevel(enum.StrEnum):
    READ_UNCOMMITTED = "read_uncommitted"
    READ_COMMITTED = "read_committed"

    @property
    def wire_value(self) -> int:
        """The int8 the Fetch request carries."""
        if self is IsolationLevel.READ_COMMITTED:
            return wire.READ_COMMITTED
        return wire.READ_UNCOMMITTED


class PayloadSigning(enum.StrEnum):
    """Whether the archive's PUTs sign a SHA-256 of their body (replicad/archive/store.py)."""

    AUTO = "auto"  # over plain http only
    SIGNED = "signed"
    UNSIGNED = "unsigned"


class LogLevel(enum.StrEnum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class LogFormat(enum.StrEnum):
    # Console lines on a TTY, JSON lines otherwise (journald).
    AUTO = "auto"
    JSON = "json"
    CONSOLE = "console"


@dataclass(frozen=True, slots=True, order=True)
class HostPort:
    """A TCP address as written in the config, `host:port` (IPv6 hosts in brackets)."""

    host: str
    port: int

    def __str__(self) -> str:
        if ":" in self.host:
            return f"[{self.host}]:{self.port}"
        return f"{self.host}:{self.port}"

    @property
    def is_wildcard(self) -> bool:
        """True for 0.0.0.0 / :: -- fine to listen on, useless to advertise."""
        return self.host in WILDCARD_HOSTS


class SecurityProtocol(enum.StrEnum):
    """How connections to the source are made: Kafka's `security.protocol`, in lower case."""

    PLAINTEXT = "plaintext"
    SSL = "ssl"
    SASL_PLAINTEXT = "sasl_plaintext"
    SASL_SSL = "sasl_ssl"

    @property
    def uses_tls(self) -> bool:
        return self in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL)

    @property
    def uses_sasl(self) -> bool:
        return self in (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL)


class SaslMechanism(enum.StrEnum):
    """The SASL mechanisms replicad speaks; `wire_name` is what SaslHandshake carries."""

    PLAIN = "plain"
    SCRAM_SHA_256 = "scram-sha-256"
    SCRAM_SHA_512 = "scram-sha-512"

    @property
    def wire_name(self) -> str:
        return self.value.upper()


@dataclass(frozen=True, slots=True)
class Secret:
    """A password read from a file or the environment when the config was loaded.

    Its text is left out of repr() and str(), so a logged or printed config, or a
    traceback showing one, never carries it; `reveal()` is the one way to read it.
    Two secrets are equal when their text is (a changed password needs a restart).
    """

    # Where it came from, for messages: "file /etc/replicad/sasl-password".
    origin: str
    _text: str = field(repr=False)

    def reveal(self) -> str:
        return self._text

    def __str__(self) -> str:
        return f"<secret from {self.origin}>"


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """TLS to the source's brokers, used when `SecurityConfig.protocol` is ssl or sasl_ssl."""

    # PEM file of the CAs that may sign the brokers' certificates; None = the system's.
    ca_file: Path | None = None
    # Our client certificate (PEM, chain allowed) and its private key, for mutual TLS.
    cert_file: Path | None = None
    key_file: Path | None = None
    # The password of an encrypted key_file, from a file or an environment variable.
    key_password_file: Secret | None = None
    key_password_env: Secret | None = None
    # Check the broker's certificate chain. Off = encrypted but unauthenticated.
    verify: bool = True
    # Check that the certificate names the broker (Kafka's endpoint identification).
    check_hostname: bool = True
    # The name the certificates must carry, instead of each broker's advertised host.
    server_hostname: str | None = None


@dataclass(frozen=True, slots=True)
class SaslConfig:
    """SASL authentication, used when `SecurityConfig.protocol` is sasl_plaintext or sasl_ssl."""

    mechanism: SaslMechanism = SaslMechanism.SCRAM_SHA_512
    username: str = ""
    # Exactly one of these holds the password when SASL is on.
    password_file: Secret | None = None
    password_env: Secret | None = None

    @property
    def password(self) -> Secret | None:
        return self.password_file or self.password_env


@dataclass(frozen=True, slots=True)
class SecurityConfig:
    protocol: SecurityProtocol = SecurityProtocol.PLAINTEXT
    tls: TlsConfig = field(default_factory=TlsConfig)
    sasl: SaslConfig = field(default_factory=SaslConfig)


@dataclass(frozen=True, slots=True)
class SourceConfig:
    """The cluster replicad replicates from, and how it talks to its brokers."""

    bootstrap_servers: tuple[HostPort, ...] = ()
    client_id: str = "replicad"
    rack_id: str = ""
    connect_timeout_ms: int = 10_000
    request_timeout_ms: int = 30_000
    reconnect_backoff_ms: int = 100
    reconnect_backoff_max_ms: int = 10_000
    metadata_max_age_ms: int = 300_000
    security: SecurityConfig = field(default_factory=SecurityConfig)


@dataclass(frozen=True, slots=True)
class TopicsConfig:
    """Which topics are replicated (a list or a pattern, never both) and from where."""

    include: tuple[str, ...] = ()
    regex: str | None = None
    start_from: StartFrom = StartFrom.EARLIEST
    on_gap: OnGap = OnGap.RESET

    def selects(self, topic: str) -> bool:
        """Whether `topic` is replicated. A regex must match the whole name, as in Kafka's
        pattern subscriptions; internal topics are not special-cased here."""
        if self.regex is not None:
            return re.fullmatch(self.regex, topic) is not None
        return topic in self.include


@dataclass(frozen=True, slots=True)
class FetchConfig:
    """Fetch request limits (KIP-74), sessions (KIP-227) and the memory bound (KIP-81)."""

    response_max_bytes: int = 10 * MIB
    partition_max_bytes: int = 1 * MIB
    wait_max_ms: int = 500
    min_bytes: int = 1
    backoff_ms: int = 1000
    sessions: bool = True
    replica_id: int = -1
    isolation_level: IsolationLevel = IsolationLevel.READ_UNCOMMITTED
    buffer_memory: int = 100 * MIB
    # Partitions in one request to a leader that keeps no fetch session (every request
    # full), in turns: Tansu 0.6 answered a 1,000-partition Fetch with no records at all.
    sessionless_max_partitions: int = 100
    # Such a share's max wait is at least this after an answer that left a partition behind
    # without records: Tansu reads a request's partitions until its max wait has passed and
    # answers the rest without records.
    sessionless_wait_ms: int = 2_000


@dataclass(frozen=True, slots=True)
class ControlConfig:
    # See config/defaults.py: systemd's RuntimeDirectory, /run/replicad as root, else XDG.
    socket: Path = field(default_factory=default_control_socket)
    # Prometheus text endpoint; None = off.
    metrics_listen: HostPort | None = None
    # Lag and bytes per topic instead of per partition (for very many partitions).
    metrics_per_topic: bool = False
    # A lagging partition whose leader is connected and whose log end has not moved for
    # this long is stalled: logged once, counted, and the daemon is degraded.
    stall_after_ms: int = 60_000


@dataclass(frozen=True, slots=True)
class LoggingConfig:
    level: LogLevel = LogLevel.INFO
    format: LogFormat = LogFormat.AUTO


class ClientAuth(enum.StrEnum):
    """Whether `replicad serve` asks TLS clients for a certificate: Kafka's `ssl.client.auth`."""

    NONE = "none"
    REQUESTED = "requested"
    REQUIRED = "required"


@dataclass(frozen=True, slots=True)
class SaslUsers:
    """The users `replicad serve` accepts, read from `serve.security.sasl.users_file` when
    the config was loaded: each user's password as a `Secret` (never shown)."""

    # Where they came from, for messages: "file /etc/replicad/serve-users.yaml".
    origin: str
    passwords: tuple[tuple[str, Secret], ...] = field(repr=False)

    def as_mapping(self) -> Mapping[str, Secret]:
        return dict(self.passwords)

    def __str__(self) -> str:
        return f"<{len(self.passwords)} users from {self.origin}>"


@dataclass(frozen=True, slots=True)
class ServeTlsConfig:
    """TLS on the serving listener: on when `cert_file` is given."""

    # The server's certificate chain (PEM; may also hold the key); None = no TLS.
    cert_file: Path | None = None
    key_file: Path | None = None
    # The password of an encrypted key, from a file or an environment variable.
    key_password_file: Secret | None = None
    key_password_env: Secret | None = None
    # CAs that sign the client certificates (mutual TLS).
    ca_file: Path | None = None
    client_auth: ClientAuth = ClientAuth.NONE

    @property
    def enabled(self) -> bool:
        return self.cert_file is not None

    @property
    def key_password(self) -> Secret | None:
        return self.key_password_file or self.key_password_env


@dataclass(frozen=True, slots=True)
class ServeSaslConfig:
    """SASL on the serving listener: on when `mechanisms` is not empty."""

    mechanisms: tuple[SaslMechanism, ...] = ()
    users_file: SaslUsers | None = None


@dataclass(frozen=True, slots=True)
class ServeSecurityConfig:
    """Who may connect to `replicad serve`, and who may fetch as a follower."""

    tls: ServeTlsConfig = field(default_factory=ServeTlsConfig)
    sasl: ServeSaslConfig = field(default_factory=ServeSaslConfig)
    # Principals ("User:name") whose Fetch may claim a replica id of allowed_followers;
    # checked only when connections authenticate (SASL or client certificates).
    follower_principals: tuple[str, ...] = ()

    @property
    def authenticates(self) -> bool:
        """Whether connections carry a principal of their own (else all are anonymous)."""
        return bool(self.sasl.mechanisms) or self.tls.client_auth is not ClientAuth.NONE


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """Serving the local replica over the Kafka protocol; present only when turned on."""

    listen: HostPort
    # What clients are told to connect to (Metadata); None = the listen address.
    advertised: HostPort | None = None
    # This node's broker id, as Metadata tells clients.
    node_id: int = 0
    # Replica ids that may fetch as followers (privileged KIP-227 sessions, read to the
    # log end); any other client claiming a replica id >= 0 is refused.
    allowed_followers: tuple[int, ...] = ()
    security: ServeSecurityConfig = field(default_factory=ServeSecurityConfig)
    # What one client may ask of the server (leader/request_limits.py, leader/server.py),
    # under Kafka's names where Kafka has the knob.
    # socket.request.max.bytes: a larger request frame closes the connection.
    max_request_bytes: int = 100 * 1024 * 1024
    # queued.max.request.bytes (KIP-72): request frames over 64 KiB being read or
    # answered share this many bytes; beyond it the server stops reading them.
    queued_max_request_bytes: int = 128 * 1024 * 1024
    # How long a client has to send the rest of a frame once its size is read.
    request_frame_timeout_ms: int = 30_000
    # connections.max.idle.ms: a connection with no request for this long is closed.
    connections_max_idle_ms: int = 600_000
    # max.connections / max.connections.per.ip: beyond them a new connection is closed
    # at once (also held below the open-file limit, see leader/server.py).
    max_connections: int = 10_000
    max_connections_per_ip: int = 1_000
    # max.connections.per.ip.overrides: "address:count" items, an IP address each.
    max_connections_per_ip_overrides: tuple[str, ...] = ()
    # connection.failed.authentication.delay.ms: a failed SASL authentication is
    # answered (and the connection closed) this much later.
    failed_authentication_delay_ms: int = 100
    # How long a connection has for its TLS handshake (at most 60 s), and one to a SASL
    # listener to authenticate.
    authentication_timeout_ms: int = 10_000
    # Kafka's request_percentage quota (KIP-124), for every client address: the share of
    # the event loop's time one address may use; over it, answers carry throttle_time_ms
    # and the connection is not read for that long. None = no quota (Kafka's default).
    request_quota_percentage: int | None = None
    # message.downconversion.enable (KIP-283): whether consumers of the old protocol (Fetch
    # below v4: magic 0/1 messages) get records converted from the stored format; off, they
    # get UNSUPPORTED_VERSION, as from Kafka. Followers are never down-converted.
    message_downconversion_enable: bool = True


@dataclass(frozen=True, slots=True)
class MirrorConfig:
    """Mirroring the replicated topics into a destination Kafka cluster; present only
    when turned on (replicad.mirror)."""

    bootstrap_servers: tuple[HostPort, ...] = ()
    client_id: str = "replicad-mirror"
    connect_timeout_ms: int = 10_000
    request_timeout_ms: int = 30_000
    reconnect_backoff_ms: int = 100
    reconnect_backoff_max_ms: int = 5_000
    security: SecurityConfig = field(default_factory=SecurityConfig)
    # Replicated topics to mirror; empty: all of them.
    topics: tuple[str, ...] = ()
    # Destination topic name = topic_prefix + source topic name; "": the same name.
    topic_prefix: str = ""
    # Of the destination topics the mirror creates; -1: the destination's default.
    replication_factor: int = -1
    # How long the destination may hold a Produce (acks=all) before answering.
    produce_timeout_ms: int = 30_000
    # How often the mirrored position is saved (a restart reconciles the rest exactly).
    progress_interval_ms: int = 1_000
    # Batch bytes read ahead from the local log and held per partition.
    buffer_bytes: int = 4 * 1024 * 1024
    # Batches in flight per partition (Kafka allows an idempotent producer up to 5).
    max_in_flight: int = 5
    # Connections to each destination broker the partitions' Produce requests are spread
    # over (a broker takes one request at a time per connection).
    connections_per_broker: int = 4
    # Coalesce runs of small batches (under 16 KiB stored) into one batch of up to this
    # many bytes (their records re-compressed); 0: batches are produced as stored.
    coalesce_bytes: int = 256 * 1024
    # Local retention (log.retention_*) keeps what is not mirrored yet; false: it deletes
    # on schedule, and what the destination never got is a gap (counted and logged).
    retention_waits: bool = True
    # How often topics and partitions new at the source get their destination and mirror.
    topic_sync_interval_ms: int = 30_000


@dataclass(frozen=True, slots=True)
class ArchiveConfig:
    """Rolled segments uploaded to an S3-compatible bucket; present only when turned on
    (replicad.archive)."""

    bucket: str = ""
    # Keys start with it ("replicas/east" -> replicas/east/<topic>-<partition>/...).
    prefix: str = ""
    # The S3 endpoint (http(s)://host:port); None: AWS's own for the region.
    endpoint: str | None = None
    region: str | None = None
    # None: boto3's credential chain (AWS_ACCESS_KEY_ID..., ~/.aws/credentials, a role).
    access_key_id: str | None = None
    secret_access_key_file: Secret | None = None
    secret_access_key_env: Secret | None = None
    # http://host/bucket/key (every S3-compatible server); false: http://bucket.host/key.
    path_style: bool = True
    # How often the logs are looked at for rolled segments not uploaded yet.
    interval_ms: int = 1_000
    # A failed upload is tried again after this, doubling up to the max.
    retry_backoff_ms: int = 500
    retry_backoff_max_ms: int = 30_000
    # Connecting to, and waiting for an answer from, the bucket.
    request_timeout_ms: int = 30_000
    # serve's reads of offsets only the bucket holds (below local retention): the bytes
    # of the bucket kept in memory for them, and how many reads go to the bucket at once.
    read_cache_bytes: int = 64 * 1024 * 1024
    read_threads: int = 2
    # The bucket's own retention (Kafka's retention.ms / retention.bytes of tiered data;
    # log.retention_* is the local one): archived segments older, or beyond the size, are
    # deleted from the bucket, the newest archived segment always kept. -1: keep forever.
    retention_ms: int = -1
    retention_bytes: int = -1
    # Uploads in flight at once (one partition each, its segments in order).
    upload_threads: int = 2
    # SigV4's SHA-256 of each PUT's body: auto = only over plain http (over https, TLS
    # guards it); every PUT carries a CRC32C the bucket checks either way, unless
    # upload_crc32c is off.
    payload_signing: PayloadSigning = PayloadSigning.AUTO
    # Each PUT carries its body's CRC32C (x-amz-checksum-crc32c), which the bucket checks;
    # off for an S3-compatible store without S3's flexible checksums, which refuses it.
    upload_crc32c: bool = True

    @property
    def secret_access_key(self) -> Secret | None:
        return self.secret_access_key_file or self.secret_access_key_env


@dataclass(frozen=True, slots=True)
class GroupsConfig:
    """Consumer groups of the source whose committed offsets follow the data: written into
    the mirror's destination Kafka (replicad.mirror.group_sync) when `mirror:` is on, and
    into serve's own coordinator (replicad.leader.source_group_sync) when `serve:` is on."""

    # Off by default, as MirrorMaker 2's sync.group.offsets.enabled: writing into the
    # destination's groups is asked for, not assumed.
    enabled: bool = False
    # Group ids or regular expressions (matching the whole id); empty: every group with
    # a committed offset on a mirrored topic.
    include: tuple[str, ...] = ()
    # Group ids or regular expressions never synced, even when included.
    exclude: tuple[str, ...] = ()
    # How often the chosen groups' offsets are read at the source and written.
    sync_interval_ms: int = 5_000
    # serve's coordinator refuses OffsetCommit from clients for the groups chosen here
    # (sync-only groups: their offsets are the source's, and stay so once members leave).
    read_only: bool = False
    # serve's coordinator (Kafka's broker settings of the same meaning): the session
    # timeouts a classic member may ask for (group.min/max.session.timeout.ms) ...
    min_session_timeout_ms: int = 6_000
    max_session_timeout_ms: int = 1_800_000
    # ... how long an empty group's first rebalance waits for more members to join
    # (group.initial.rebalance.delay.ms; 0 starts it at the first join) ...
    initial_rebalance_delay_ms: int = 3_000
    # ... and the consumer group protocol (KIP-848, group.coordinator.rebalance.protocols
    # with "consumer"): off, serve answers only the classic protocol. Its members' session
    # timeout and heartbeat interval are the coordinator's (group.consumer.*).
    consumer_protocol: bool = True
    consumer_session_timeout_ms: int = 45_000
    consumer_heartbeat_interval_ms: int = 5_000

    def selects(self, group_id: str) -> bool:
        """Whether `group_id` is synced: included (or no include list) and not excluded.
        An item matches a group named exactly so, or whose whole id its regex matches."""
        if self.include and not _any_matches(self.include, group_id):
            return False
        return not _any_matches(self.exclude, group_id)


def _any_matches(items: tuple[str, ...], name: str) -> bool:
    # The schema compiled every item at load time (GROUP_PATTERN_LIST).
    return any(item == name or re.fullmatch(item, name) is not None for item in items)


@dataclass(frozen=True, slots=True)
class VerifyConfig:
    """`replicad run` comparing its replica with the source, batch by batch, again and again
    at a low rate (replicad/verify/continuous.py); the keys are `replicad verify
    --against-source`'s options."""

    enabled: bool = False
    # Replicated topics to verify; empty: all of them.
    topics: tuple[str, ...] = ()
    # Bytes a second fetched from the source at most (the same again is read locally).
    max_bytes_per_second: int = MIB
    # Bytes asked of the source in one fetch (and read from the replica to match it).
    fetch_max_bytes: int = MIB
    # A pass walks every partition's new offsets; the next one starts this long after.
    interval_ms: int = 60_000
    # Batches a partition re-checked each pass, at offsets drawn at random below its
    # verified offset (damage done after the first comparison); 0: none.
    sample: int = 0


@dataclass(frozen=True, slots=True)
class Config:
    source: SourceConfig = field(default_factory=SourceConfig)
    topics: TopicsConfig = field(default_factory=TopicsConfig)
    fetch: FetchConfig = field(default_factory=FetchConfig)
    # See config/defaults.py: systemd's StateDirectory, /var/lib/replicad as root, else XDG.
    data_dir: Path = field(default_factory=default_data_dir)
    checkpoint_interval_ms: int = 5000
    # None: replication-offset-checkpoint is written with the checkpoint only.
    high_watermark_interval_ms: int | None = None
    log: LogConfig = field(default_factory=LogConfig)
    control: ControlConfig = field(default_factory=ControlConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    serve: ServeConfig | None = None
    mirror: MirrorConfig | None = None
    groups: GroupsConfig = field(default_factory=GroupsConfig)
    archive: ArchiveConfig | None = None
    verify: VerifyConfig = field(default_factory=VerifyConfig)
