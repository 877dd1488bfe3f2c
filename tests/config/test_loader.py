from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from replicad.archive.uploader import ArchiverSettings
from replicad.config import (
    Config,
    HostPort,
    IsolationLevel,
    LogLevel,
    OnGap,
    ServeConfig,
    StartFrom,
    config_from_mapping,
    load_config,
)
from replicad.config.model import ClientAuth, PayloadSigning, SaslMechanism
from replicad.errors import ConfigError, ConfigErrors
from tools.peers.pki import make_test_pki

MINIMAL = """\
source:
  bootstrap_servers: ["k1:9092"]
topics:
  include: [orders]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "replicad.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def problems_of(path: Path | None, overrides: dict[str, object] | None = None) -> list[str]:
    with pytest.raises(ConfigErrors) as caught:
        load_config(path, overrides)
    return [str(problem) for problem in caught.value.problems]


def test_minimal_file(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, MINIMAL))
    assert config.source.bootstrap_servers == (HostPort("k1", 9092),)
    assert config.topics.include == ("orders",)
    assert config.fetch == Config().fetch
    assert config.serve is None


def test_values_are_converted(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        MINIMAL
        + """\
  start_from: latest
  on_gap: halt
fetch:
  isolation_level: READ_COMMITTED
  sessions: false
  response_max_bytes: 20_971_520
data_dir: var/data
log:
  flush_messages: 10000
logging:
  level: debug
serve:
  listen: "127.0.0.1:0"
""",
    )
    config = load_config(path)
    assert config.topics.start_from is StartFrom.LATEST
    assert config.topics.on_gap is OnGap.HALT
    assert config.fetch.isolation_level is IsolationLevel.READ_COMMITTED
    assert config.fetch.sessions is False
    assert config.fetch.response_max_bytes == 20 * 1024 * 1024
    assert config.data_dir == Path("var/data")
    assert config.log.flush_messages == 10000
    assert config.logging.level is LogLevel.DEBUG
    assert config.serve == ServeConfig(HostPort("127.0.0.1", 0), None)


def test_null_sections_take_their_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, MINIMAL + "fetch:\nlog: null\nserve: null\n"))
    assert config.fetch == Config().fetch
    assert config.log == Config().log
    assert config.serve is None


def test_unknown_keys_at_every_depth_with_their_lines(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        source:
          bootstap_servers: ["k1:9092"]
        topics:
          include: [orders]
        fetch:
          replica.fetch.max.bytes: 1048576
        nonsense: 1
        serve:
          listen: "127.0.0.1:9093"
          advertise: "r1:9093"
        """,
    )
    assert problems_of(path) == [
        # A missing key is placed at its section.
        f"{path}:1: source.bootstrap_servers: required: "
        'a non-empty list of "host:port" (or "a:1,b:2")',
        f"{path}:2: source.bootstap_servers: unknown key (did you mean bootstrap_servers?)",
        f"{path}:6: fetch.replica.fetch.max.bytes: unknown key "
        "(Kafka's replica.fetch.max.bytes is fetch.partition_max_bytes here)",
        f"{path}:7: nonsense: unknown key (keys here are: source, topics, fetch, data_dir, "
        "checkpoint_interval_ms, high_watermark_interval_ms, log, control, logging, serve, "
        "mirror, groups, archive, verify)",
        f"{path}:10: serve.advertise: unknown key (did you mean advertised?)",
    ]


def test_wrong_types(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        MINIMAL
        + """\
fetch:
  partition_max_bytes: big
  sessions: 1
  wait_max_ms: yes
  min_bytes: "1"
log: 5
control:
  socket: [a]
""",
    )
    assert problems_of(path) == [
        f'{path}:6: fetch.partition_max_bytes: expected an integer from 1 to 2147483647, got "big"',
        f"{path}:7: fetch.sessions: expected true or false, got 1",
        # YAML 1.1 reads `yes` as true; true is not a number of milliseconds.
        f"{path}:8: fetch.wait_max_ms: expected an integer from 0 to 2147483647, got true",
        f'{path}:9: fetch.min_bytes: expected an integer from 1 to 2147483647, got "1"',
        f"{path}:10: log: expected a mapping, got 5",
        f"{path}:12: control.socket: expected a non-empty path, got a list",
    ]


def test_impossible_values(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"""\
        source:
          bootstrap_servers: "k1:9092,k2:0,PLAINTEXT://k3:9092"
        topics:
          regex: "orders-("
        fetch:
          partition_max_bytes: 0
          replica_id: -2
        log:
          segment_bytes: 4294967296
        control:
          socket: /run/{"x" * 120}.sock
        """,
    )
    assert problems_of(path) == [
        f'{path}:2: source.bootstrap_servers[1]: port must be from 1 to 65535, got "k2:0"',
        f"{path}:2: source.bootstrap_servers[2]: no scheme or listener name here, "
        'just host:port, got "PLAINTEXT://k3:9092"',
        f"{path}:4: topics.regex: does not compile: "
        "missing ), unterminated subpattern at position 7",
        f"{path}:6: fetch.partition_max_bytes: expected an integer from 1 to 2147483647, got 0",
        f"{path}:7: fetch.replica_id: expected an integer from -1 to 2147483647, got -2",
        f"{path}:9: log.segment_bytes: expected an integer from 14 to 2147483647, got 4294967296",
        f"{path}:11: control.socket: a Unix socket path has at most 107 bytes, got 130",
    ]


def test_cross_field_problems_name_both_keys(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        source:
          bootstrap_servers: ["k1:9092"]
          request_timeout_ms: 500
          reconnect_backoff_ms: 2000
          reconnect_backoff_max_ms: 1000
        topics:
          include: [orders]
          regex: "orders-.*"
        fetch:
          response_max_bytes: 209715200
        serve:
          listen: "0.0.0.0:9092"
        """,
    )
    assert problems_of(path) == [
        f"{path}:3: source.request_timeout_ms: must be > fetch.wait_max_ms, or a fetch the "
        "leader holds back that long times out; got 500 <= 500 (default)",
        f"{path}:5: source.reconnect_backoff_max_ms: must be >= "
        "source.reconnect_backoff_ms; got 1000 < 2000",
        f"{path}:8: topics.regex: cannot be given together with topics.include: choose "
        "topics by list or by pattern, not both",
        # buffer_memory was not given: the problem is placed at the key that made it wrong.
        f"{path}:10: fetch.buffer_memory: must be >= fetch.response_max_bytes, so one whole "
        "response fits the pool; got 104857600 (default) < 209715200",
        f"{path}:12: serve.advertised: required when serve.listen is a wildcard address "
        "(0.0.0.0:9092): clients cannot connect to it",
    ]


def test_no_topic_choice(tmp_path: Path) -> None:
    path = write(tmp_path, "source:\n  bootstrap_servers: k1:9092\ntopics:\n  include: null\n")
    assert problems_of(path) == [
        f"{path}:3: topics: give topics.include (a list of topic names) or topics.regex (a pattern)"
    ]


def test_a_bad_value_is_not_reported_again_by_a_cross_check(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "fetch:\n  response_max_bytes: lots\n")
    assert problems_of(path) == [
        f'{path}:6: fetch.response_max_bytes: expected an integer from 1 to 2147483647, got "lots"'
    ]


def test_an_empty_file_asks_for_what_is_required(tmp_path: Path) -> None:
    path = write(tmp_path, "# nothing yet\n")
    assert problems_of(path) == [
        f'{path}: source.bootstrap_servers: required: a non-empty list of "host:port" '
        '(or "a:1,b:2")',
        f"{path}: topics: give topics.include (a list of topic names) or topics.regex (a pattern)",
    ]


def test_all_problems_arrive_in_one_error_that_is_a_config_error(tmp_path: Path) -> None:
    path = write(tmp_path, "source:\n  client_id: 7\nfetch:\n  min_bytes: 0\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    error = caught.value
    assert isinstance(error, ConfigErrors)
    # In file order; the missing topics section has no line and comes last.
    assert [problem.path for problem in error.problems] == [
        "source.bootstrap_servers",
        "source.client_id",
        "fetch.min_bytes",
        "topics",
    ]
    assert str(error) == "\n".join(str(problem) for problem in error.problems)
    assert error.path == ""


def test_one_problem_reads_as_a_plain_config_error(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "checkpoint_interval_ms: 0\n")
    with pytest.raises(ConfigErrors) as caught:
        load_config(path)
    error = caught.value
    assert (error.path, error.location) == ("checkpoint_interval_ms", f"{path}:5")
    assert error.message == "expected an integer >= 1, got 0"
    assert str(error) == f"{path}:5: checkpoint_interval_ms: expected an integer >= 1, got 0"


@pytest.mark.parametrize(
    ("text", "where", "what"),
    [
        ("source:\n  bootstrap_servers: [k1:9092\ntopics: {}\n", ":3:7", "invalid YAML: "),
        ("source:\n  client_id: a\n client_id: b\n", ":3:2", "invalid YAML: "),
        ("source:\n  client_id: a\n  client_id: b\n", ":3:3",
         "invalid YAML: duplicate key 'client_id' (first on line 2)"),
        ("fetch:\n\tmin_bytes: 1\n", ":2:1", "invalid YAML: found character '\\t'"),
    ],
)  # fmt: skip
def test_yaml_errors_name_file_line_and_column(
    tmp_path: Path, text: str, where: str, what: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    (problem,) = problems_of(path)
    assert problem.startswith(f"{path}{where}: {what}")


def test_merge_keys_may_be_overridden_without_counting_as_duplicates(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        MINIMAL
        + """\
defaults: &fast
  wait_max_ms: 100
  min_bytes: 1
fetch:
  <<: *fast
  wait_max_ms: 50
""",
    )
    # `defaults` itself is an unknown key; the merge inside fetch is fine.
    assert problems_of(path) == [
        f"{path}:5: defaults: unknown key (keys here are: source, topics, fetch, data_dir, "
        "checkpoint_interval_ms, high_watermark_interval_ms, log, control, logging, serve, "
        "mirror, groups, archive, verify)"
    ]


def test_not_a_mapping_at_the_top(tmp_path: Path) -> None:
    path = write(tmp_path, "- source\n- topics\n")
    assert problems_of(path) == [f"{path}: expected a mapping of sections at the top, got a list"]


def test_unreadable_files(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    assert problems_of(missing) == [
        f"{missing}: cannot read the config file: No such file or directory"
    ]
    assert problems_of(tmp_path) == [f"{tmp_path}: cannot read the config file: Is a directory"]
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"source:\n  client_id: \xff\xfe\x00\n")
    (problem,) = problems_of(binary)
    assert problem.startswith(f"{binary}: invalid YAML: ")


def test_flags_alone_are_a_whole_config() -> None:
    config = load_config(
        None,
        {
            "source.bootstrap_servers": ["h:1"],
            "topics.include": ["a", "b"],
            "data_dir": "./var/data",
            "control.socket": "./var/control.sock",
        },
    )
    assert config.source.bootstrap_servers == (HostPort("h", 1),)
    assert config.topics.include == ("a", "b")
    assert config.data_dir == Path("var/data")
    assert config.control.socket == Path("var/control.sock")


def test_without_a_file_or_flags_the_required_keys_are_asked_for() -> None:
    assert problems_of(None) == [
        'source.bootstrap_servers: required: a non-empty list of "host:port" (or "a:1,b:2")',
        "topics: give topics.include (a list of topic names) or topics.regex (a pattern)",
    ]


def test_overrides_win_over_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "data_dir: /srv/a\nfetch:\n  wait_max_ms: 100\n")
    config = load_config(path, {"source.bootstrap_servers": "h1:1,h2:2", "data_dir": "/srv/b"})
    assert config.source.bootstrap_servers == (HostPort("h1", 1), HostPort("h2", 2))
    assert config.data_dir == Path("/srv/b")
    assert config.fetch.wait_max_ms == 100


def test_a_topic_flag_replaces_the_files_topic_choice(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL)
    config = load_config(path, {"topics.regex": "x.*"})
    assert (config.topics.include, config.topics.regex) == ((), "x.*")
    regex_file = write(tmp_path, "source:\n  bootstrap_servers: h:1\ntopics:\n  regex: y.*\n")
    config = load_config(regex_file, {"topics.include": ["a"]})
    assert (config.topics.include, config.topics.regex) == (("a",), None)


def test_an_empty_topic_list_counts_as_none_given(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL)
    config = load_config(path, {"topics.regex": "x.*", "topics.include": []})
    assert (config.topics.include, config.topics.regex) == ((), "x.*")
    assert problems_of(path, {"topics.include": []}) == [
        "override: topics: give topics.include (a list of topic names) or topics.regex (a pattern)"
    ]


def test_both_topic_flags_conflict() -> None:
    overrides = {"source.bootstrap_servers": "h:1", "topics.include": ["a"], "topics.regex": "x"}
    assert problems_of(None, overrides) == [
        "override: topics.regex: cannot be given together with topics.include: choose topics "
        "by list or by pattern, not both"
    ]


def test_overrides_are_validated_and_marked(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "fetch:\n  buffer_memory: 1000\n")
    overrides = {
        "source.bootstrap_servers": ["h"],
        "fetch.wait_max_ms": "soon",
        "fetch.max_wait": 1,
        "sourc.client_id": "x",
        "data_dir.sub": "y",
    }
    assert problems_of(path, overrides) == [
        # From the file: still reported, with its line.
        f"{path}:6: fetch.buffer_memory: must be >= fetch.response_max_bytes, so one whole "
        "response fits the pool; got 1000 < 10485760 (default)",
        "override: fetch.max_wait: unknown key (did you mean wait_max_ms?)",
        "override: sourc.client_id: unknown key (did you mean source?)",
        "override: data_dir.sub: unknown key (data_dir is a value, not a section)",
        'override: source.bootstrap_servers[0]: expected "host:port", got "h"',
        'override: fetch.wait_max_ms: expected an integer from 0 to 2147483647, got "soon"',
    ]


def test_an_override_can_turn_on_a_null_section(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "serve: null\n")
    config = load_config(path, {"serve.listen": "127.0.0.1:9093"})
    assert config.serve == ServeConfig(HostPort("127.0.0.1", 9093))


def test_the_file_is_not_changed_by_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL)
    load_config(path, {"topics.include": ["other"]})
    assert load_config(path).topics.include == ("orders",)


def test_config_from_mapping_applies_the_same_rules() -> None:
    raw = {"source": {"bootstrap_servers": ["k:1"]}, "topics": {"regex": "a.*"}}
    assert config_from_mapping(raw).topics.regex == "a.*"
    with pytest.raises(ConfigErrors) as caught:
        config_from_mapping({**raw, "fetch": {"sessions": "on"}}, source="reload")
    assert str(caught.value) == 'reload: fetch.sessions: expected true or false, got "on"'


def test_serve_allowed_followers_are_ids(tmp_path: Path) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text(
        "source:\n  bootstrap_servers: [h:1]\ntopics:\n  include: [a]\n"
        "serve:\n  listen: 127.0.0.1:0\n  node_id: 3\n  allowed_followers: [7, 7, 9]\n"
    )
    serve = load_config(path).serve
    assert serve is not None and serve.node_id == 3 and serve.allowed_followers == (7, 9)
    path.write_text(
        "source:\n  bootstrap_servers: [h:1]\ntopics:\n  include: [a]\n"
        "serve:\n  listen: 127.0.0.1:0\n  allowed_followers: [7, -1, yes]\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    text = str(caught.value)
    assert "serve.allowed_followers[1]" in text and "serve.allowed_followers[2]" in text


SERVE_HEAD = "source:\n  bootstrap_servers: [h:1]\ntopics:\n  include: [a]\nserve:\n"


def test_serve_security_is_off_unless_asked_for(tmp_path: Path) -> None:
    serve = load_config(write(tmp_path, SERVE_HEAD + "  listen: 127.0.0.1:0\n")).serve
    assert serve is not None and not serve.security.authenticates
    assert not serve.security.tls.enabled and serve.security.sasl.mechanisms == ()


def test_serve_security_loads_with_its_files(tmp_path: Path) -> None:
    pki = make_test_pki(tmp_path / "pki")
    secret = tmp_path / "replica.password"
    secret.write_text("Serve-Pw-1\n")
    users = tmp_path / "users.yaml"
    users.write_text(f"replica:\n  password_file: {secret}\n")
    path = write(
        tmp_path,
        SERVE_HEAD
        + f"""\
  listen: 127.0.0.1:0
  allowed_followers: [7]
  security:
    tls:
      cert_file: {pki.broker_cert}
      key_file: {pki.broker_key}
      ca_file: {pki.ca}
      client_auth: REQUIRED
    sasl:
      mechanisms: [scram-sha-512, plain]
      users_file: {users}
    follower_principals: ["User:replica", "User:{pki.client_dn}"]
""",
    )
    serve = load_config(path).serve
    assert serve is not None
    security = serve.security
    assert security.tls.client_auth is ClientAuth.REQUIRED and security.authenticates
    assert security.sasl.mechanisms == (SaslMechanism.SCRAM_SHA_512, SaslMechanism.PLAIN)
    assert security.follower_principals == ("User:replica", f"User:{pki.client_dn}")
    assert security.sasl.users_file is not None
    assert "Serve-Pw-1" not in repr(serve) and "Serve-Pw-1" not in str(security.sasl.users_file)


@pytest.mark.parametrize(
    ("security", "expected"),
    [
        ("tls: {client_auth: required}",
         "serve.security.tls.client_auth: is required, but client certificates need TLS"),
        ("tls: {key_file: k.pem}",
         "serve.security.tls.key_file: needs serve.security.tls.cert_file"),
        ("sasl: {mechanisms: [plain]}", "serve.security.sasl.users_file: required when"),
        ("follower_principals: ['User:replica']",
         "serve.security.follower_principals: needs connections that authenticate"),
        ("sasl: {mechanisms: [gssapi]}",
         'serve.security.sasl.mechanisms[0]: expected one of plain, scram-sha-256, '
         'scram-sha-512, got "gssapi"'),
        ("follower_principals: [replica]",
         'serve.security.follower_principals[0]: expected a principal "Type:name"'),
        ("tls: {cert_file: /nonexistent/cert.pem}",
         "serve.security.tls.cert_file: cannot load the server certificate and key"),
        ("follower_principal: []",
         "serve.security.follower_principal: unknown key (did you mean follower_principals?)"),
    ],
)  # fmt: skip
def test_serve_security_problems_name_their_key(
    tmp_path: Path, security: str, expected: str
) -> None:
    path = write(tmp_path, SERVE_HEAD + f"  listen: 127.0.0.1:0\n  security:\n    {security}\n")
    problems = problems_of(path)
    assert len(problems) == 1 and expected in problems[0], problems
    assert problems[0].startswith(f"{path}:8: ")  # the line of the offending key


def test_serve_followers_need_principals_once_clients_authenticate(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("x\n")
    users = tmp_path / "users.yaml"
    users.write_text(f"replica: {{password_file: {secret}}}\n")
    sasl = f"  security:\n    sasl: {{mechanisms: [plain], users_file: {users}}}\n"
    without = write(
        tmp_path, SERVE_HEAD + "  listen: 127.0.0.1:0\n  allowed_followers: [7]\n" + sasl
    )
    assert (
        "serve.security.follower_principals: required when connections authenticate"
        in (problems_of(without)[0])
    )
    principals = "    follower_principals: ['User:replica']\n"
    no_ids = write(tmp_path, SERVE_HEAD + "  listen: 127.0.0.1:0\n" + sasl + principals)
    assert "serve.allowed_followers: required when" in problems_of(no_ids)[0]


def test_no_secret_of_any_kind_shows_in_the_whole_config(tmp_path: Path) -> None:
    """Every way to give a password (file, environment, a users file naming either, an
    encrypted TLS key's password file) leaves the loaded config's repr() and str() clean:
    a config is logged and printed whole (config-check, errors, debugging)."""
    pki = make_test_pki(tmp_path / "pki", key_password="Tls-Key-Pw-3")
    key_secret = tmp_path / "key.password"
    key_secret.write_text("Tls-Key-Pw-3\n")
    sasl_secret = tmp_path / "sasl.password"
    sasl_secret.write_text("Sasl-Pw-1\n")
    user_secret = tmp_path / "user.password"
    user_secret.write_text("User-File-Pw-4\n")
    users = tmp_path / "users.yaml"
    users.write_text(
        f"replica:\n  password_file: {user_secret}\nalice:\n  password_env: ALICE_PW\n"
    )
    path = write(
        tmp_path,
        f"""\
source:
  bootstrap_servers: ["127.0.0.1:9093"]
  security:
    protocol: sasl_ssl
    tls:
      ca_file: {pki.ca}
      cert_file: {pki.client_cert}
      key_file: {pki.client_key_encrypted}
      key_password_file: {key_secret}
    sasl:
      mechanism: scram-sha-512
      username: replica
      password_file: {sasl_secret}
topics:
  include: [orders]
serve:
  listen: 127.0.0.1:0
  security:
    sasl:
      mechanisms: [plain]
      users_file: {users}
""",
    )
    secrets = ("Tls-Key-Pw-3", "Sasl-Pw-1", "User-File-Pw-4", "Env-Pw-2")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ALICE_PW", "Env-Pw-2")
        config = load_config(path)
    users_file = config.serve.security.sasl.users_file if config.serve else None
    assert users_file is not None and len(users_file.passwords) == 2
    assert config.source.security.tls.key_password_file is not None
    shown = repr(config) + str(config) + repr(users_file) + str(users_file)
    assert [secret for secret in secrets if secret in shown] == []
    assert f"file {key_secret}" in shown and f"file {sasl_secret}" in shown


def test_mirror_section_is_checked_like_the_source(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        MINIMAL
        + textwrap.dedent(
            """\
            mirror:
              bootstrap_servers: ["b1:9092"]
              topic_prefix: "east/"
              security:
                protocol: sasl_ssl
            """
        ),
    )
    problems = problems_of(path)
    assert any("mirror.topic_prefix: expected a topic name prefix" in p for p in problems)
    assert any("mirror.security.sasl.username: required when" in p for p in problems)
    fixed = path.read_text().replace('"east/"', '"east."').replace("sasl_ssl", "plaintext")
    path.write_text(fixed)
    mirror = load_config(path).mirror
    assert mirror is not None and mirror.topic_prefix == "east."
    assert load_config(write(tmp_path, MINIMAL)).mirror is None


def test_groups_section_is_read_and_each_bad_key_named_with_its_line(tmp_path: Path) -> None:
    good = write(
        tmp_path,
        MINIMAL
        + "mirror:\n  bootstrap_servers: ['dest:9092']\n"
        + "groups:\n  enabled: true\n  include: [billing, 'app-.*']\n"
        + "  exclude: ['app-test']\n  sync_interval_ms: 1000\n",
    )
    groups = load_config(good).groups
    assert (groups.enabled, groups.include, groups.exclude, groups.sync_interval_ms) == (
        True,
        ("billing", "app-.*"),
        ("app-test",),
        1000,
    )
    bad = write(
        tmp_path,
        MINIMAL
        + "groups:\n  enabled: yes please\n  include: ['app-(']\n"
        + "  sync_interval_ms: 0\n  sync.group.offsets.enabled: true\n",
    )
    problems = problems_of(bad)
    assert problems[0] == f'{bad}:6: groups.enabled: expected true or false, got "yes please"'
    assert problems[1].startswith(
        f"{bad}:7: groups.include[0]: does not compile as a regular expression"
    )
    assert problems[2] == (f"{bad}:8: groups.sync_interval_ms: expected an integer >= 1, got 0")
    assert problems[3] == (
        f"{bad}:9: groups.sync.group.offsets.enabled: unknown key "
        "(Kafka's sync.group.offsets.enabled is groups.enabled here)"
    )
    assert len(problems) == 4


def test_groups_enabled_needs_the_mirror_or_serve(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "groups:\n  enabled: true\n")
    assert problems_of(path) == [
        f"{path}:6: groups.enabled: is true, but there is neither a mirror: nor a serve: "
        "section: group offsets are synced into the mirror's destination cluster and into "
        "serve's own coordinator"
    ]
    served = write(
        tmp_path, MINIMAL + "groups:\n  enabled: true\nserve:\n  listen: 127.0.0.1:9999\n"
    )
    config = load_config(served)
    assert config.groups.enabled and config.serve is not None


def test_groups_read_only_needs_the_sync_and_serve(tmp_path: Path) -> None:
    path = write(
        tmp_path, MINIMAL + "groups:\n  read_only: true\nserve:\n  listen: 127.0.0.1:9999\n"
    )
    assert problems_of(path) == [
        f"{path}:6: groups.read_only: is true, but groups.enabled is false: read-only groups "
        "are the groups whose offsets serve takes from the source"
    ]
    mirrored = write(
        tmp_path,
        MINIMAL
        + "groups:\n  enabled: true\n  read_only: true\n"
        + "mirror:\n  bootstrap_servers: ['dest:9092']\n",
    )
    assert problems_of(mirrored) == [
        f"{mirrored}:7: groups.read_only: is true, but there is no serve: section: it makes "
        "serve refuse OffsetCommit for the synced groups"
    ]
    served = write(
        tmp_path,
        MINIMAL
        + "groups:\n  enabled: true\n  read_only: true\n"
        + "serve:\n  listen: 127.0.0.1:9999\n",
    )
    assert load_config(served).groups.read_only


def test_the_verify_section_names_a_bad_value_and_an_unknown_key_by_their_path(
    tmp_path: Path,
) -> None:
    path = write(
        tmp_path,
        MINIMAL
        + "verify:\n  enabled: true\n  max_bytes_per_second: 0\n  interval: 5\n  sample: -1\n",
    )
    problems = problems_of(path)
    assert any("verify.max_bytes_per_second" in p and ">= 1" in p for p in problems), problems
    assert any("verify.interval: unknown key (did you mean interval_ms?)" in p for p in problems)
    assert any("verify.sample" in p for p in problems), problems
    good = write(tmp_path, MINIMAL + "verify:\n  enabled: true\n  sample: 4\n  topics: [a]\n")
    verify = load_config(good).verify
    assert (verify.enabled, verify.sample, verify.topics) == (True, 4, ("a",))
    assert verify.max_bytes_per_second == 1024 * 1024


ARCHIVE_HEAD = MINIMAL + "archive:\n  bucket: replica\n"


def test_the_archive_secret_comes_from_a_file_and_is_never_shown(tmp_path: Path) -> None:
    secret = tmp_path / "s3.secret"
    secret.write_text("S3-Secret-1\n")
    text = f"  access_key_id: AKID\n  secret_access_key_file: {secret}\n"
    archive = load_config(write(tmp_path, ARCHIVE_HEAD + text)).archive
    assert archive is not None and archive.access_key_id == "AKID"
    assert archive.secret_access_key is not None
    assert archive.secret_access_key.reveal() == "S3-Secret-1"
    assert "S3-Secret-1" not in repr(archive) and "S3-Secret-1" not in str(
        archive.secret_access_key
    )


def test_an_archive_key_id_takes_exactly_one_secret_and_a_secret_a_key_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("S3_SECRET", "S3-Secret-2")
    secret = tmp_path / "s3.secret"
    secret.write_text("S3-Secret-1\n")
    env = "  secret_access_key_env: S3_SECRET\n"
    from_file = f"  secret_access_key_file: {secret}\n"
    key = "  access_key_id: AKID\n"
    archive = load_config(write(tmp_path, ARCHIVE_HEAD + key + env)).archive
    assert archive is not None and archive.secret_access_key is not None
    assert archive.secret_access_key.reveal() == "S3-Secret-2"
    # Neither: boto3's own credential chain.
    default = load_config(write(tmp_path, ARCHIVE_HEAD)).archive
    assert default is not None and default.secret_access_key is None
    for extra, path, why in (
        (key, "archive.secret_access_key_file", "give secret_access_key_file or"),
        (env, "archive.secret_access_key_env", "archive.access_key_id is not"),
        (key + env + from_file, "archive.secret_access_key_env", "give only one of"),
    ):
        (problem,) = problems_of(write(tmp_path, ARCHIVE_HEAD + extra))
        assert path in problem and why in problem, problem
        assert "S3-Secret" not in problem


def test_an_archive_endpoint_must_be_an_http_url_naming_a_host(tmp_path: Path) -> None:
    """boto3 refuses an endpoint without a scheme ("localhost:9000") only when the uploader
    makes its client, on its own thread: that ended the archive's task at its first round
    with no line and no status, and local retention waited for it forever. The key is named
    at start instead."""
    for good in ("http://127.0.0.1:9000", "https://s3.example.internal"):
        archive = load_config(write(tmp_path, ARCHIVE_HEAD + f"  endpoint: '{good}'\n")).archive
        assert archive is not None and archive.endpoint == good
    for bad, why in (
        ("localhost:9000", "must start with http:// or https://"),
        ("ftp://h:1", "must start with http:// or https://"),
        ("http://", "names no host"),
        ("http://h:port", "Port could not be cast"),
    ):
        (problem,) = problems_of(write(tmp_path, ARCHIVE_HEAD + f"  endpoint: '{bad}'\n"))
        assert "archive.endpoint" in problem and why in problem, problem


def test_the_archive_uploads_threads_and_payload_signing(tmp_path: Path) -> None:
    default = load_config(write(tmp_path, ARCHIVE_HEAD)).archive
    assert default is not None and default.upload_threads == 2
    assert default.payload_signing is PayloadSigning.AUTO and default.upload_crc32c
    text = "  upload_threads: 4\n  payload_signing: unsigned\n  upload_crc32c: false\n"
    archive = load_config(write(tmp_path, ARCHIVE_HEAD + text)).archive
    assert archive is not None and archive.upload_threads == 4
    assert archive.payload_signing is PayloadSigning.UNSIGNED
    assert not archive.upload_crc32c
    assert ArchiverSettings.from_config(archive).bucket.upload_crc32c is False
    for extra, path in (
        ("  upload_threads: 0\n", "archive.upload_threads"),
        ("  payload_signing: sometimes\n", "archive.payload_signing"),
        ("  upload_crc32c: sometimes\n", "archive.upload_crc32c"),
    ):
        (problem,) = problems_of(write(tmp_path, ARCHIVE_HEAD + extra))
        assert path in problem, problem
