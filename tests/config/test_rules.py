from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replicad.config.model import HostPort, LogLevel, SaslMechanism, SaslUsers
from replicad.config.rules import (
    ADDRESS_LIST,
    INT32_MAX,
    INVALID,
    PRINCIPAL_LIST,
    TOPIC_LIST,
    Address,
    Bool,
    Choice,
    FilePath,
    Int,
    ListOf,
    Problems,
    Regex,
    Str,
    UsersFile,
    choice_list,
    describe,
)


def convert(rule: object, value: object) -> tuple[object, list[str]]:
    problems = Problems()
    result = rule.convert(value, "k", problems)  # type: ignore[attr-defined]
    return result, [f"{p.path}: {p.message}" for p in problems.items]


@pytest.mark.parametrize(
    ("value", "text"),
    [(None, "null"), (True, "true"), (False, "false"), (3, "3"), (1.5, "1.5"),
     ("big", '"big"'), ([1], "a list"), ({"a": 1}, "a mapping")],
)  # fmt: skip
def test_describe_shows_values_as_yaml_would(value: object, text: str) -> None:
    assert describe(value) == text


def test_describe_shortens_long_strings() -> None:
    text = describe("x" * 500)
    assert len(text) == 60
    assert text.startswith('"xxx') and text.endswith('..."')


@given(st.integers(1, INT32_MAX))
def test_int_accepts_its_range(value: int) -> None:
    assert convert(Int(1, INT32_MAX), value) == (value, [])


@given(st.one_of(st.integers(max_value=0), st.integers(min_value=INT32_MAX + 1)))
def test_int_rejects_outside_its_range(value: int) -> None:
    result, problems = convert(Int(1, INT32_MAX), value)
    assert result is INVALID
    assert problems == [f"k: expected an integer from 1 to {INT32_MAX}, got {value}"]


@pytest.mark.parametrize("value", [True, False, "10", 10.0, None, [1]])
def test_int_rejects_what_is_not_an_integer(value: object) -> None:
    result, problems = convert(Int(0), value)
    assert result is INVALID
    assert problems == [f"k: expected an integer >= 0, got {describe(value)}"]


def test_nullable_int_takes_null() -> None:
    assert convert(Int(1, nullable=True), None) == (None, [])
    assert convert(Int(1, nullable=True), 0)[1] == ["k: expected an integer >= 1 or null, got 0"]


def test_bool_is_strict() -> None:
    assert convert(Bool(), False) == (False, [])
    assert convert(Bool(), "no")[1] == ['k: expected true or false, got "no"']
    assert convert(Bool(), 0)[1] == ["k: expected true or false, got 0"]


def test_str() -> None:
    assert convert(Str(), "") == ("", [])
    assert convert(Str(), 5)[1] == ["k: expected a string, got 5"]
    assert convert(Str(non_empty=True), "")[1] == ['k: expected a non-empty string, got ""']


def test_choice_ignores_case_and_lists_the_choices() -> None:
    assert convert(Choice(LogLevel), "WARNING") == (LogLevel.WARNING, [])
    result, problems = convert(Choice(LogLevel), "verbose")
    assert result is INVALID
    assert problems == ['k: expected one of debug, info, warning, error, got "verbose"']


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("kafka-1:9092", HostPort("kafka-1", 9092)),
        (" 10.0.0.1:19092 ", HostPort("10.0.0.1", 19092)),
        ("[fe80::1]:9092", HostPort("fe80::1", 9092)),
    ],
)
def test_address_parses(text: str, address: HostPort) -> None:
    assert convert(Address(), text) == (address, [])


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("kafka-1", 'expected "host:port"'),
        ("kafka-1:", 'expected "host:port"'),
        ("PLAINTEXT://kafka-1:9092", "no scheme or listener name here, just host:port"),
        ("kafka-1:0", "port must be from 1 to 65535"),
        ("kafka-1:70000", "port must be from 1 to 65535"),
        (":9092", "the host is missing"),
        ("fe80::1:9092", 'expected "host:port"'),
    ],
)
def test_address_rejects(text: str, reason: str) -> None:
    result, problems = convert(Address(), text)
    assert result is INVALID
    assert problems == [f"k: {reason}, got {describe(text)}"]


def test_listening_address_may_use_any_port_and_interface() -> None:
    assert convert(Address(listening=True), ":0") == (HostPort("", 0), [])
    assert convert(Address(listening=True), "127.0.0.1:0") == (HostPort("127.0.0.1", 0), [])


def test_address_list_takes_a_list_or_a_comma_string() -> None:
    expected = (HostPort("a", 1), HostPort("b", 2))
    assert convert(ADDRESS_LIST, ["a:1", "b:2"]) == (expected, [])
    assert convert(ADDRESS_LIST, "a:1, b:2,") == (expected, [])
    assert convert(ADDRESS_LIST, ["a:1", "a:1", "b:2"]) == (expected, [])


def test_address_list_reports_every_bad_item_by_index() -> None:
    result, problems = convert(ADDRESS_LIST, ["a:1", "b", 7, "c:0"])
    assert result is INVALID
    assert problems == [
        'k[1]: expected "host:port", got "b"',
        'k[2]: expected "host:port", got 7',
        'k[3]: port must be from 1 to 65535, got "c:0"',
    ]


@pytest.mark.parametrize("value", [[], "", " , ", None, 9092])
def test_address_list_must_not_be_empty(value: object) -> None:
    assert convert(ADDRESS_LIST, value)[0] is INVALID


def test_topic_list() -> None:
    assert convert(TOPIC_LIST, "a, b.c,a") == (("a", "b.c"), [])
    assert convert(TOPIC_LIST, None) == ((), [])
    result, problems = convert(TOPIC_LIST, ["ok", "no way", "..", "x" * 250, 3])
    assert result is INVALID
    assert [p.split(":")[0] for p in problems] == ["k[1]", "k[2]", "k[3]", "k[4]"]
    assert convert(TOPIC_LIST, []) == ((), [])
    assert convert(TOPIC_LIST, 7)[1] == ["k: expected a list of topic names or null, got 7"]


def test_regex_must_compile() -> None:
    assert convert(Regex(), "orders-.*") == ("orders-.*", [])
    assert convert(Regex(), None) == (None, [])
    result, problems = convert(Regex(), "orders-(")
    assert result is INVALID
    assert problems[0].startswith("k: does not compile: missing )")


def test_path() -> None:
    assert convert(FilePath(), "var/data") == (Path("var/data"), [])
    assert convert(FilePath(), Path("/x")) == (Path("/x"), [])
    assert convert(FilePath(), "")[1] == ['k: expected a non-empty path, got ""']
    assert convert(FilePath(), "a\0b")[0] is INVALID


def test_unix_socket_path_fits_sun_path() -> None:
    fits = "/" + "s" * 106
    assert convert(FilePath(unix_socket=True), fits) == (Path(fits), [])
    result, problems = convert(FilePath(unix_socket=True), fits + "s")
    assert result is INVALID
    assert problems == ["k: a Unix socket path has at most 107 bytes, got 108"]


def test_choice_list() -> None:
    rule = choice_list(SaslMechanism)
    assert convert(rule, ["PLAIN", "scram-sha-512", "plain"]) == (
        (SaslMechanism.PLAIN, SaslMechanism.SCRAM_SHA_512),
        [],
    )
    assert convert(rule, "plain,scram-sha-256")[0] == (
        SaslMechanism.PLAIN,
        SaslMechanism.SCRAM_SHA_256,
    )
    assert convert(rule, None) == ((), [])
    result, problems = convert(rule, ["plain", "gssapi"])
    assert result is INVALID
    assert problems == ['k[1]: expected one of plain, scram-sha-256, scram-sha-512, got "gssapi"']


def test_principal_list() -> None:
    rule = PRINCIPAL_LIST
    assert convert(rule, ["User:replica", "User:CN=a,O=b", "User:replica"]) == (
        ("User:replica", "User:CN=a,O=b"),
        [],
    )
    result, problems = convert(rule, ["replica", "User:", 3])
    assert result is INVALID and [p.split(":")[0] for p in problems] == ["k[0]", "k[1]", "k[2]"]


def test_users_file_reads_each_password_and_never_repeats_one(tmp_path: Path) -> None:
    secret = tmp_path / "replica.password"
    secret.write_text("pw-from-file\n")
    users = tmp_path / "users.yaml"
    users.write_text(f"replica:\n  password_file: {secret}\nanalyst:\n  password_env: ANALYST_PW\n")
    rule = UsersFile(environ={"ANALYST_PW": "pw-from-env"})
    result, problems = convert(rule, str(users))
    assert problems == [] and isinstance(result, SaslUsers)
    assert {u: s.reveal() for u, s in result.as_mapping().items()} == {
        "replica": "pw-from-file",
        "analyst": "pw-from-env",
    }
    assert "pw-from" not in repr(result) + str(result)

    # A password written where its file belongs, an unset variable, an unknown key.
    users.write_text(
        "alice: hunter2-inline\nbob:\n  password_env: UNSET_PW\ncarol:\n  password: x\n"
    )
    result, problems = convert(rule, str(users))
    assert result is INVALID and len(problems) == 3
    assert all(p.startswith(f"k: {users}: user ") for p in problems)
    assert "hunter2" not in " ".join(problems)
    assert "is not set" in problems[1]


def test_users_file_that_cannot_be_used(tmp_path: Path) -> None:
    rule = UsersFile(environ={})
    assert "cannot read" in convert(rule, str(tmp_path / "missing.yaml"))[1][0]
    broken = tmp_path / "broken.yaml"
    broken.write_text("a: [unclosed-secret-text\n")
    problem = convert(rule, str(broken))[1][0]
    assert "is not valid YAML (line" in problem and "unclosed-secret-text" not in problem
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert "must map each user name" in convert(rule, str(empty))[1][0]


def test_list_of_checks_every_item_by_its_own_rule() -> None:
    ids = ListOf(Int(0, 9, noun="an id"), "a list of ids", commas=False)
    assert convert(ids, [3, 1, 3]) == ((3, 1), [])
    assert convert(ids, None) == ((), [])
    assert convert(ids, "1,2")[1] == ['k: expected a list of ids, got "1,2"']
    result, problems = convert(ids, [1, 10, "x"])
    assert result is INVALID
    assert problems == [
        "k[1]: expected an id from 0 to 9, got 10",
        'k[2]: expected an id from 0 to 9, got "x"',
    ]
    some = ListOf(Int(0), "a non-empty list", non_empty=True)
    assert convert(some, [])[0] is INVALID and convert(some, None)[0] is INVALID
