"""Rules for single config values: each checks one raw value and converts it, or reports why not.

Rules are strict on purpose. YAML turns `yes`, `10.0` and `"10"` into a bool, a float and a
string; none of them is an integer here, so a typo never becomes a silently different setting.
A rule reports every problem it finds (all bad items of a list, not just the first) and returns
`INVALID` when the value cannot be used; the loader then skips checks that depend on it.
"""

from __future__ import annotations

import abc
import enum
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from replicad.config.model import HostPort, SaslUsers, Secret

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
PORT_MAX = 65535
# Kafka's legal topic names: at most 249 of these characters, and not "." or "..".
TOPIC_NAME_MAX = 249
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]+")
# sockaddr_un.sun_path is 108 bytes on Linux, one of them the terminating NUL.
UNIX_SOCKET_PATH_MAX = 107
# Longest quoted value repeated back in a message.
DESCRIBE_MAX = 60

# A Kafka principal, "Type:name" (User:replica, or a certificate's DN after "User:").
_PRINCIPAL = re.compile(r"[A-Za-z][A-Za-z0-9_]*:.+", re.DOTALL)

# POSIX's portable environment variable names.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_HOST_PORT = re.compile(r"(?:\[(?P<ipv6>[0-9A-Fa-f:.]+)\]|(?P<host>[^:\s\[\]/]*)):(?P<port>\d+)")


class _Invalid:
    """The marker a rule returns for a value it could not use."""

    def __repr__(self) -> str:
        return "INVALID"


INVALID = _Invalid()


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with the configuration; `related` are other keys it concerns."""

    path: str
    message: str
    related: tuple[str, ...] = ()


@dataclass(slots=True)
class Problems:
    """Collects problems in the order they are found."""

    items: list[Problem] = field(default_factory=list)

    def add(self, path: str, message: str, related: tuple[str, ...] = ()) -> None:
        self.items.append(Problem(path, message, related))

    def __len__(self) -> int:
        return len(self.items)


def describe(value: object) -> str:
    """A raw value as the user wrote it, short: strings quoted, YAML's names for null/bools."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        text = json.dumps(value)
        return text if len(text) <= DESCRIBE_MAX else text[: DESCRIBE_MAX - 4] + '..."'
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return f"a {type(value).__name__}"


class Rule(abc.ABC):
    """Checks and converts the raw value of one key."""

    # A required key must be given; the others fall back to the dataclass default.
    required: bool = False

    @property
    @abc.abstractmethod
    def expected(self) -> str:
        """What a good value looks like, for messages: "an integer >= 1"."""

    @abc.abstractmethod
    def convert(self, value: object, path: str, problems: Problems) -> object:
        """The converted value, or INVALID after adding at least one problem."""

    def _wrong(self, value: object, path: str, problems: Problems) -> _Invalid:
        problems.add(path, f"expected {self.expected}, got {describe(value)}")
        return INVALID


@dataclass(frozen=True)
class Int(Rule):
    minimum: int
    maximum: int = INT64_MAX
    nullable: bool = False
    # What the integer is, for messages: "an id from 0 to 2147483647".
    noun: str = "an integer"

    @property
    def expected(self) -> str:
        if self.maximum >= INT64_MAX:
            text = f"{self.noun} >= {self.minimum}"
        else:
            text = f"{self.noun} from {self.minimum} to {self.maximum}"
        return text + " or null" if self.nullable else text

    def convert(self, value: object, path: str, problems: Problems) -> object:
        if value is None and self.nullable:
            return None
        # bool is an int subclass in Python; a YAML `yes` must not pass as 1.
        if not isinstance(value, int) or isinstance(value, bool):
            return self._wrong(value, path, problems)
        if not self.minimum <= value <= self.maximum:
            return self._wrong(value, path, problems)
        return value


@dataclass(frozen=True)
class Bool(Rule):
    @property
    def expected(self) -> str:
        return "true or false"

    def convert(self, value: object, path: str, problems: Problems) -> object:
        if not isinstance(value, bool):
            return self._wrong(value, path, problems)
        return value


@dataclass(frozen=True)
class Str(Rule):
    non_empty: bool = False
    nullable: bool = False

    @property
    def expected(self) -> str:
        text = "a non-empty string" if self.non_empty else "a string"
        return text + " or null" if self.nullable else text

    def convert(self, value: object, path: str, problems: Problems) -> object:
        if value is None and self.nullable:
            return None
        if not isinstance(value, str) or (self.non_empty and not value):
            return self._wrong(value, path, problems)
        return value


def http_url_problem(text: str) -> str | None:
    """Why `text` is not an http:// or https:// URL naming a host (an S3 endpoint), or None.
    boto3 refuses one without a host only when its client is made, on the uploader's
    thread: found here, the key is named at start."""
    try:
        parts = urlsplit(text)
        _ = parts.port  # ValueError for a port that is not one
    except ValueError as error:
        return str(error)
    if parts.scheme.lower() not in ("http", "https"):
        return "it must start with http:// or https://"
    if not parts.hostname:
        return "it names no host"
    return None


@dataclass(frozen=True)
class HttpUrl(Rule):
    """An http:// or https:// URL with a host (an S3 endpoint), or null with `nullable`."""

    nullable: bool = False

    @property
    def expected(self) -> str:
        text = "an http:// or https:// URL"
        return text + " or null" if self.nullable else text

    def convert(self, value: object, path: str, problems: Problems) -> object:
        if value is None and self.nullable:
            return None
        if not isinstance(value, str):
            return self._wrong(value, path, problems)
        problem = http_url_problem(value)
        if problem is not None:
            problems.add(path, f"expected {self.expected}, got {describe(value)}: {problem}")
            return INVALID
        return value


@dataclass(frozen=True)
class Choice(Rule):
    """One of a StrEnum's values; case does not matter (`INFO` is `info`)."""

    choices: type[enum.StrEnum]

    @property
    def expected(self) -> str:
        return "one of " + ", ".join(member.value for member in self.choices)

    def convert(self, value: object, path: str, problems: Problems) -> object:
        if isinstance(value, str):
            for member in self.choices:
                if member.value == value.lower():
                    return member
        return self._wrong(value, path, problems)


def parse_host_port(text: str, *, allow_port_zero: bool = False) -> HostPort | str:
    """`host:port` -> HostPort, or the reason it is not one (a str, for the message)."""
    if "://" in text:
        return "no scheme or listener name here, just host:port"
    match = _HOST_PORT.fullmatch(text.strip())
    if match is None:
        return 'expected "host:port"'
    host = match["ipv6"] if match["ipv6"] is not None else match["host"]
    port = int(match["port"])
    lowest = 0 if allow_port_zero else 1
    if not lowest <= port <= PORT_MAX:
        return f"port must be from {lowest} to {PORT_MAX}"
    if not host and not allow_port_zero:
        return "the host is missing"
    return HostPort(host, port)


@dataclass(frozen=True)
class Address(Rule):
    """One `host:port`. A listening address may use port 0 (any free port) and an empty host."""

    listening: bool = False
    nullable: bool = False
    required: bool = False

    @property
    def expected(self) -> str:
        return '"host:port" or null' if self.nullable else '"host:port"'

    def convert(self, value: object, path: str, problems: Problems) -> object:
        if value is None and self.nullable:
            return None
        if not isinstance(value, str):
            return self._wrong(value, path, problems)
        parsed = parse_host_port(value, allow_port_zero=self.listening)
        if isinstance(parsed, str):
            problems.add(path, f"{parsed}, got {describe(value)}")
            return INVALID
        return parsed


def topic_name_problem(name: str) -> str | None:
    """Why `name` cannot be a Kafka topic, or None if it can."""
    if name in (".", ".."):
        return 'cannot be "." or ".."'
    if len(name) > TOPIC_NAME_MAX:
        return f"a topic name has at most {TOPIC_NAME_MAX} characters"
    if _TOPIC_NAME.fullmatch(name) is None:
        return "a topic name has only letters, digits, '.', '_' and '-'"
    return None


@dataclass(frozen=True)
class TopicName(Rule):
    """One Kafka topic name."""

    @property
    def expected(self) -> str:
        return "a topic name"

    def convert(self, value: object, path: str, problems: Problems) -> object:
        if not isinstance(value, str):
            return self._wrong(value, path, problems)
        reason = topic_name_problem(value)
        if reason is not None:
            problems.add(path, f"{reason}, got {describe(value)}")
            return INVALID
        return value


@dataclass(frozen=True)
class Matching(Rule):
    """A string the whole of which matches `pattern`."""

    pattern: re.Pattern[str]
    what: str

    @property
    def expected(self) -> str:
        return self.what

    def convert(self, value: object, path: str, problems: Problems) -> object:
        if not isinstance(value, str) or self.pattern.fullmatch(value) is None:
            return self._wrong(value, path, problems)
        return value


PRINCIPAL = Matching(_PRINCIPAL, 'a principal "Type:name" like "User:replica"')
# The start of a topic name (mirror.topic_prefix), empty allowed; the whole name is checked
# where the topic is known.
TOPIC_PREFIX = Matching(
    re.compile(r"[a-zA-Z0-9._-]{0,200}"),
    "a topic name prefix: letters, digits, '.', '_' and '-' (at most 200), or \"\"",
)


def _items(value: object, commas: bool) -> list[object] | None:
    """A list as given, or (`commas`) a comma-separated string split into its items;
    None if neither."""
    if commas and isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    if isinstance(value, list | tuple):
        return list(value)
    return None


@dataclass(frozen=True)
class ListOf(Rule):
    """Values of one rule, as a list (or, with `commas`, one comma-separated string).

    Each item is checked by `item` at `path[index]`, every bad one reported; repeats are
    dropped; the result is a tuple. Null or [] means none, unless `non_empty`.
    """

    item: Rule
    expected_text: str
    commas: bool = True
    non_empty: bool = False
    required: bool = False

    @property
    def expected(self) -> str:
        return self.expected_text

    def convert(self, value: object, path: str, problems: Problems) -> object:
        if value is None and not self.non_empty:
            return ()
        items = _items(value, self.commas)
        if items is None or (self.non_empty and not items):
            return self._wrong(value, path, problems)
        found = len(problems)
        kept: list[object] = []
        for index, item in enumerate(items):
            converted = self.item.convert(item, f"{path}[{index}]", problems)
            if converted is not INVALID and converted not in kept:
                kept.append(converted)
        return INVALID if len(problems) > found else tuple(kept)


def choice_list(choices: type[enum.StrEnum]) -> ListOf:
    """Several of a StrEnum's values; case does not matter."""
    names = ", ".join(member.value for member in choices)
    return ListOf(Choice(choices), f"a list of {names}")


ADDRESS_LIST = ListOf(Address(), 'a non-empty list of "host:port" (or "a:1,b:2")', non_empty=True)
TOPIC_LIST = ListOf(TopicName(), "a list of topic names or null")
ID_LIST = ListOf(
    Int(0, INT32_MAX, noun="an id"), "a list of non-negative integer ids or null", commas=False
)
PRINCIPAL_LIST = ListOf(
    PRINCIPAL, 'a list of principals like "User:replica", or null', commas=False
)
# Kafka's max.connections.per.ip.overrides: "address:count" items (IP addresses here).
ADDRESS_COUNT_LIST = ListOf(
    Matching(re.compile(r"[0-9A-Fa-f:.]+:[0-9]{1,9}"), '"address:count" like "10.0.0.5:200"'),
    'a list of "address:count" like "10.0.0.5:200" (or "a:1,b:2"), or null',
)


@dataclass(frozen=True)
class GroupPattern(Rule):
    """A consumer group id, or a regular expression matching whole group ids (a plain id
    is a pattern matching itself, so both are checked as patterns)."""

    @property
    def expected(self) -> str:
        return "a group id or a regular expression"

    def convert(self, value: object, path: str, problems: Problems) -> object:
        if not isinstance(value, str) or not value:
            return self._wrong(value, path, problems)
        try:
            re.compile(value)
        except re.error as error:
            problems.add(path, f"does not compile as a regular expression: {error}")
            return INVALID
        return value


# Group ids may hold commas, so a string is not split.
GROUP_PATTERN_LIST = ListOf(
    GroupPattern(), "a list of group ids or regular expressions, or null", commas=False
)


@dataclass(frozen=True)
class Regex(Rule):
    """A Python regular expression (it must match a whole topic name), or null."""

    @property
    def expected(self) -> str:
        return "a regular expression or null"

    def convert(self, value: object, path: str, problems: Problems) -> object:
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            return self._wrong(value, path, problems)
        try:
            re.compile(value)
        except re.error as error:
            problems.add(path, f"does not compile: {error}")
            return INVALID
        return value


def _path_text(value: object) -> str | None:
    """The text of a path given as a string or a PathLike (None for anything else)."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class FilePath(Rule):
    """A filesystem path; `unix_socket` also bounds its length to what bind() accepts."""

    unix_socket: bool = False
    nullable: bool = False

    @property
    def expected(self) -> str:
        return "a non-empty path or null" if self.nullable else "a non-empty path"

    def convert(self, value: object, path: str, problems: Problems) -> object:
        if value is None and self.nullable:
            return None
        text = _path_text(value)
        if not text:
            return self._wrong(value, path, problems)
        if "\0" in text:
            problems.add(path, "a path cannot contain a NUL character")
            return INVALID
        size = len(os.fsencode(text))
        if self.unix_socket and size > UNIX_SOCKET_PATH_MAX:
            problems.add(
                path,
                f"a Unix socket path has at most {UNIX_SOCKET_PATH_MAX} bytes, got {size}",
            )
            return INVALID
        return Path(text)


def describe_kind(value: object) -> str:
    """What sort of value was given, never the value itself (for keys that hold secrets)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return describe(value)


def _strip_line_end(text: str) -> str:
    # `echo secret > file` adds a newline that is not part of the password.
    for ending in ("\r\n", "\n"):
        if text.endswith(ending):
            return text[: -len(ending)]
    return text


# The value of a secret's key is never repeated in a message: a user may have written
# the password itself where its file or variable name belongs.
_NOT_REPEATED = "(the value is not repeated here, in case it is the password itself)"


@dataclass(frozen=True)
class SecretFile(Rule):
    """The path of a file holding a password, or null; the file is read at load time.

    A single trailing newline is not part of the password.
    """

    @property
    def expected(self) -> str:
        return "the path of a file holding the password, or null"

    def convert(self, value: object, path: str, problems: Problems) -> object:
        if value is None:
            return None
        text = _path_text(value)
        if not text or "\0" in text:
            problems.add(path, f"expected {self.expected}; got {describe_kind(value)}")
            return INVALID
        try:
            content = Path(text).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            problems.add(path, "the file it names is not UTF-8 text")
            return INVALID
        except OSError as error:
            reason = error.strerror or type(error).__name__
            problems.add(path, f"cannot read the file it names: {reason} {_NOT_REPEATED}")
            return INVALID
        secret = _strip_line_end(content)
        if not secret:
            problems.add(path, "the file it names is empty")
            return INVALID
        return Secret(f"file {text}", secret)


@dataclass(frozen=True)
class SecretEnv(Rule):
    """The name of an environment variable holding a password, or null; read at load time."""

    environ: Mapping[str, str] | None = None

    @property
    def expected(self) -> str:
        return "the name of an environment variable (letters, digits and _), or null"

    def convert(self, value: object, path: str, problems: Problems) -> object:
        if value is None:
            return None
        if not isinstance(value, str) or _ENV_NAME.fullmatch(value) is None:
            problems.add(
                path, f"expected {self.expected}; got {describe_kind(value)} {_NOT_REPEATED}"
            )
            return INVALID
        environ = os.environ if self.environ is None else self.environ
        text = environ.get(value)
        if text is None:
            problems.add(
                path,
                "the environment variable it names is not set for replicad (under systemd: "
                f"Environment= or EnvironmentFile=) {_NOT_REPEATED}",
            )
            return INVALID
        if not text:
            problems.add(path, "the environment variable it names is empty")
            return INVALID
        return Secret(f"environment variable {value}", text)


# What a user of the users file may have: where its password is, one of the two.
_USER_KEYS = ("password_file", "password_env")


@dataclass(frozen=True)
class UsersFile(Rule):
    """The path of a YAML file of SASL users, read at load time:

        replica:
          password_file: /etc/replicad/serve-passwords/replica
        alice:
          password_env: ALICE_PASSWORD

    Passwords themselves never appear in it; each is read like any other secret.
    """

    environ: Mapping[str, str] | None = None

    @property
    def expected(self) -> str:
        return "the path of a YAML file of users, or null"

    def convert(self, value: object, path: str, problems: Problems) -> object:
        if value is None:
            return None
        text = _path_text(value)
        if not text or "\0" in text:
            return self._wrong(value, path, problems)
        try:
            raw = yaml.safe_load(Path(text).read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            problems.add(path, f"{text} is not UTF-8 text")
            return INVALID
        except OSError as error:
            problems.add(path, f"cannot read {text}: {error.strerror or type(error).__name__}")
            return INVALID
        except yaml.MarkedYAMLError as error:
            # Only the line: the text around it might be a password someone pasted in.
            mark = error.problem_mark
            line = f" (line {mark.line + 1})" if mark is not None else ""
            problems.add(path, f"{text} is not valid YAML{line}: {error.problem}")
            return INVALID
        except yaml.YAMLError:
            problems.add(path, f"{text} is not valid YAML")
            return INVALID
        if not isinstance(raw, Mapping) or not raw:
            problems.add(
                path, f"{text} must map each user name to its password_file or password_env"
            )
            return INVALID
        found = len(problems)
        passwords: list[tuple[str, Secret]] = []
        for user, entry in raw.items():
            if not isinstance(user, str) or not user:
                problems.add(path, f"{text}: a user name must be a non-empty string")
                continue
            secret = self._password(entry, path, f"{text}: user {describe(user)}", problems)
            if secret is not None:
                passwords.append((user, secret))
        if len(problems) > found:
            return INVALID
        return SaslUsers(f"file {text}", tuple(passwords))

    def _password(self, entry: object, path: str, label: str, problems: Problems) -> Secret | None:
        if not isinstance(entry, Mapping) or len(entry) != 1 or next(iter(entry)) not in _USER_KEYS:
            # Never echo the entry: it may be the password itself.
            problems.add(
                path,
                f"{label}: expected exactly one of password_file or password_env {_NOT_REPEATED}",
            )
            return None
        key, item = next(iter(entry.items()))
        rule: Rule = SecretFile() if key == "password_file" else SecretEnv(self.environ)
        inner = Problems()
        secret = rule.convert(item, key, inner)
        for problem in inner.items:
            problems.add(path, f"{label}: {key}: {problem.message}")
        return secret if isinstance(secret, Secret) else None
