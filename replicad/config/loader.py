"""Loading the config: YAML file -> overrides -> every rule -> cross checks -> Config.

Rules it keeps:
- Nothing is half-applied: either every key is valid and a whole `Config` comes back, or
  `ConfigErrors` lists every problem found (unknown keys, wrong types, impossible values,
  cross-field conflicts), sorted by line, each naming its key path and where it came from
  (`file:line`, the file, or `override`).
- YAML syntax errors and duplicate keys stop the load at once, naming file, line and column.
- Overrides (from command-line flags) are dotted paths applied over the file, or over the
  defaults when there is no file, and validated the same way. Choosing topics by flag
  replaces the file's choice: overriding `topics.include` clears `topics.regex` and the
  other way round, unless both are overridden.
- A null section means its defaults, except `serve`, where null (or absence) means off.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, ScalarNode

from replicad.config.model import Config
from replicad.config.rules import INVALID, Problems, describe
from replicad.config.schema import (
    CROSS_CHECKS,
    GROUPS_WITHOUT_DESTINATION_CHECKS,
    GROUPS_WITHOUT_SERVE_CHECKS,
    MIRROR_CHECKS,
    SCHEMA,
    SERVE_CHECKS,
    Section,
    Values,
    find,
    join,
    unknown_key_message,
)
from replicad.errors import ConfigError, ConfigErrors

OVERRIDE = "override"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_TOPIC_CHOICE = ("topics.include", "topics.regex")


class _LineDict(dict[object, object]):
    """A YAML mapping that remembers the (1-based) line of each of its keys."""

    __slots__ = ("lines",)

    def __init__(self) -> None:
        super().__init__()
        self.lines: dict[object, int] = {}


class _LineLoader(yaml.SafeLoader):
    """PyYAML's safe loader, building `_LineDict`s and refusing duplicate keys."""


def _construct_mapping(loader: _LineLoader, node: MappingNode) -> _LineDict:
    seen: dict[tuple[str, str], int] = {}
    for key_node, _ in node.value:
        # Keys brought in by a `<<` merge may be overridden; keys written twice may not.
        if isinstance(key_node, ScalarNode) and key_node.tag != _MERGE_TAG:
            identity = (key_node.tag, key_node.value)
            if identity in seen:
                raise ConstructorError(
                    None,
                    None,
                    f"duplicate key {key_node.value!r} (first on line {seen[identity]})",
                    key_node.start_mark,
                )
            seen[identity] = key_node.start_mark.line + 1
    loader.flatten_mapping(node)
    result = _LineDict()
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            raise ConstructorError(
                None, None, "a key must be a name, not a list or mapping", key_node.start_mark
            ) from None
        result[key] = loader.construct_object(value_node, deep=True)
        result.lines[key] = key_node.start_mark.line + 1
    return result


_LineLoader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)


def _parse_yaml(text: bytes, source: str) -> object:
    try:
        return yaml.load(text, Loader=_LineLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        detail = error.problem or error.context or "cannot parse"
        if error.context and error.problem:
            detail = f"{error.problem} ({error.context})"
        raise ConfigErrors([ConfigError("", f"invalid YAML: {detail}", location=where)]) from None
    except yaml.YAMLError as error:
        raise ConfigErrors([ConfigError("", f"invalid YAML: {error}", location=source)]) from None


def load_config(path: Path | None, overrides: Mapping[str, object] | None = None) -> Config:
    """The validated Config from a YAML file (None: defaults only) with `overrides` applied.

    Raises ConfigErrors (a ConfigError) listing every problem; nothing else on bad input.
    """
    if path is None:
        return _build({}, "", overrides or {})
    source = str(path)
    try:
        text = Path(path).read_bytes()
    except OSError as error:
        reason = error.strerror or str(error)
        raise ConfigErrors(
            [ConfigError("", f"cannot read the config file: {reason}", location=source)]
        ) from None
    return _build(_parse_yaml(text, source), source, overrides or {})


def config_from_mapping(raw: Mapping[object, object], *, source: str = "<config>") -> Config:
    """The validated Config from an already-parsed mapping (same rules as a file)."""
    return _build(raw, source, {})


class _Load:
    """The state of one load: what was given, what failed, where each key came from."""

    def __init__(self, source: str, override_paths: frozenset[str]) -> None:
        self.source = source
        self.override_paths = override_paths
        self.problems = Problems()
        self.given: dict[str, object] = {}
        self.failed: set[str] = set()
        self.lines: dict[str, int] = {}
        # Nullable sections (serve) that are given, i.e. turned on.
        self.sections_on: set[str] = set()

    def location(self, path: str, related: tuple[str, ...] = ()) -> _Where:
        candidates = (path, *related)
        # A problem an override had a hand in is the flag's, even if the file has the section.
        if any(self._is_overridden(candidate) for candidate in candidates):
            return _Where(OVERRIDE, None)
        # A key's own line first; only then the section above it (a missing key's place).
        for exact in (True, False):
            for candidate in candidates:
                line = self.lines.get(candidate) if exact else self._line(candidate)
                if line is not None:
                    text = f"{self.source}:{line}" if self.source else f"line {line}"
                    return _Where(text, line)
        return _Where(self.source, None)

    def _is_overridden(self, path: str) -> bool:
        return any(
            path == given or path.startswith((f"{given}.", f"{given}["))
            for given in self.override_paths
        )

    def _line(self, path: str) -> int | None:
        # A list item or a missing key is placed at the nearest key above it that has a line.
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[: max(path.rfind("."), path.rfind("["), 0)]
        return None

    def errors(self) -> ConfigErrors:
        """Every problem, in file order (those without a line last, in the order found)."""
        located = [(self.location(item.path, item.related), item) for item in self.problems.items]
        located.sort(key=lambda entry: math.inf if entry[0].line is None else entry[0].line)
        return ConfigErrors(
            [ConfigError(item.path, item.message, location=where.text) for where, item in located]
        )


@dataclass(frozen=True, slots=True)
class _Where:
    """Where a problem is: the text leading its message, and its line when in the file."""

    text: str
    line: int | None


def _build(raw: object, source: str, overrides: Mapping[str, object]) -> Config:
    load = _Load(source, frozenset(overrides))
    document = _apply_overrides(raw, overrides, load) if overrides else raw
    if document is None:
        document = {}
    if not isinstance(document, Mapping):
        load.problems.add(
            "", f"expected a mapping of sections at the top, got {describe(document)}"
        )
        raise load.errors()
    _check_section(document, SCHEMA, "", load)
    values = Values(load.given)
    checks = (
        CROSS_CHECKS
        + (SERVE_CHECKS if "serve" in load.sections_on else GROUPS_WITHOUT_SERVE_CHECKS)
        + (MIRROR_CHECKS if "mirror" in load.sections_on else ())
        + (GROUPS_WITHOUT_DESTINATION_CHECKS if not {"mirror", "serve"} & load.sections_on else ())
    )
    for check in checks:
        if any(_has_failed(path, load.failed) for path in check.paths):
            continue
        problem = check.check(values)
        if problem is not None:
            load.problems.add(problem.path, problem.message, problem.related)
    if load.problems.items:
        raise load.errors()
    config = _construct(SCHEMA, "", load)
    assert isinstance(config, Config)
    return config


def _has_failed(path: str, failed: set[str]) -> bool:
    return any(path == bad or path.startswith(f"{bad}.") for bad in failed)


def _check_section(raw: object, section: Section, prefix: str, load: _Load) -> None:
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        load.problems.add(prefix, f"expected a mapping, got {describe(raw)}")
        load.failed.add(prefix)
        return
    lines: Mapping[object, int] = getattr(raw, "lines", {})
    for key, value in raw.items():
        path = join(prefix, key)
        if key in lines:
            load.lines[path] = lines[key]
        entry = section.entries.get(key) if isinstance(key, str) else None
        if entry is None:
            load.problems.add(path, unknown_key_message(prefix, key))
        elif isinstance(entry, Section):
            if entry.nullable and value is None:
                continue
            if entry.nullable:
                load.sections_on.add(path)
            _check_section(value, entry, path, load)
        else:
            converted = entry.convert(value, path, load.problems)
            if converted is INVALID:
                load.failed.add(path)
            else:
                load.given[path] = converted
    for key, entry in section.entries.items():
        path = join(prefix, key)
        if key in raw:
            continue
        if isinstance(entry, Section) and not entry.nullable:
            _check_section({}, entry, path, load)
        elif not isinstance(entry, Section) and entry.required:
            load.problems.add(path, f"required: {entry.expected}")
            load.failed.add(path)


def _construct(section: Section, prefix: str, load: _Load) -> object:
    kwargs: dict[str, object] = {}
    for key, entry in section.entries.items():
        path = join(prefix, key)
        if isinstance(entry, Section):
            if entry.nullable and path not in load.sections_on:
                continue
            kwargs[key] = _construct(entry, path, load)
        elif path in load.given:
            kwargs[key] = load.given[path]
    return section.cls(**kwargs)


def _apply_overrides(raw: object, overrides: Mapping[str, object], load: _Load) -> object:
    """A copy of `raw` with each dotted override set; unknown paths become problems."""
    document: object = _copy(raw) if raw is not None else _LineDict()
    given = dict(overrides)
    chosen = [path for path in _TOPIC_CHOICE if path in given]
    if len(chosen) == 1:
        other = next(path for path in _TOPIC_CHOICE if path not in given)
        given[other] = None
    for path, value in given.items():
        if not path or find(path) is None:
            load.problems.add(path, _unknown_override(path))
            continue
        document = _set(document, path.split("."), value)
    return document


def _unknown_override(path: str) -> str:
    """The message for the first key of a dotted override path that does not exist."""
    keys = path.split(".")
    for depth in range(1, len(keys) + 1):
        if find(".".join(keys[:depth])) is None:
            parent = ".".join(keys[: depth - 1])
            if not isinstance(find(parent) if parent else SCHEMA, Section):
                return f"unknown key ({parent} is a value, not a section)"
            return unknown_key_message(parent, keys[depth - 1])
    return "unknown key"


def _copy(value: object) -> object:
    if isinstance(value, Mapping):
        result = _LineDict()
        for key, item in value.items():
            result[key] = _copy(item)
        result.lines.update(getattr(value, "lines", {}))
        return result
    return value


def _set(document: object, keys: list[str], value: object) -> object:
    """`document` with `value` at `keys`; a null or missing section on the way is created.
    A section that is not a mapping is left alone: the walk reports it."""
    if document is None:
        document = _LineDict()
    if not isinstance(document, dict):
        return document
    head, rest = keys[0], keys[1:]
    if rest:
        document[head] = _set(document.get(head), rest, value)
    else:
        document[head] = value
        # The file's line no longer tells where this value came from.
        if isinstance(document, _LineDict):
            document.lines.pop(head, None)
    return document
