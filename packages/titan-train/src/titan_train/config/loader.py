"""TOML recipes (with `extends`) plus dotted CLI overrides, turned into a typed JobConfig.

Every error names the field, the bad value and what is allowed, and is raised before any process group,
model or data exists.
"""

import dataclasses
import difflib
import tomllib
import types
import typing
from pathlib import Path

from titan_train.config.sections import JobConfig


class ConfigError(ValueError):
    """A config value that cannot be used; the message says which field and what would be right."""


def sections() -> dict[str, type]:
    """{section name: its dataclass}, in declaration order."""
    return {f.name: f.type for f in dataclasses.fields(JobConfig)}


def all_keys() -> list[str]:
    return [f"{s}.{f.name}" for s, cls in sections().items() for f in dataclasses.fields(cls)]


def did_you_mean(name: str, choices) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def read_toml(path: str | Path, _seen: tuple = ()) -> dict:
    """A recipe as nested dicts, with its `extends` chain merged in (the extending file wins)."""
    path = Path(path).resolve()
    if path in _seen:
        chain = " -> ".join(str(p) for p in (*_seen, path))
        raise ConfigError(f"config files extend each other in a cycle: {chain}")
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {e}") from None
    parent = data.pop("extends", None)
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise ConfigError(f"{path}: extends must be a path string, got {parent!r}")
    base = read_toml(path.parent / parent, (*_seen, path))
    for section, values in data.items():
        if isinstance(values, dict) and isinstance(base.get(section), dict):
            base[section] = {**base[section], **values}
        else:
            base[section] = values
    return base


def _described(hint) -> str:
    if typing.get_origin(hint) is typing.Literal:
        return " or ".join(repr(c) for c in typing.get_args(hint))
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(hint, str(hint))


def _coerce(value, hint, key: str):
    """`value` (from TOML, or a string from the CLI) as type `hint`, or a ConfigError naming `key`."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(members) < len(typing.get_args(hint)) and value in ("", None):
            return None  # Optional fields: an empty value means "not set"
        for member in members:  # e.g. int | Literal["auto"]: the first that takes the value
            try:
                return _coerce(value, member, key)
            except ConfigError:
                continue
        raise ConfigError(f"{key}={value!r} must be {' or '.join(_described(m) for m in members)}")
    if origin is typing.Literal:
        choices = typing.get_args(hint)
        value = _coerce(value, type(choices[0]), key)
        if value not in choices:
            allowed = ", ".join(repr(c) for c in choices)
            raise ConfigError(
                f"{key}={value!r} is not allowed; use one of {allowed}{did_you_mean(str(value), choices)}"
            )
        return value
    if origin is list:
        (item,) = typing.get_args(hint)
        if isinstance(value, str) and value.lstrip().startswith("["):
            value = _toml_value(value, key)  # a TOML array on the command line: lists of tables need it
        elif isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            raise ConfigError(f"{key}={value!r} must be a list (TOML array, or comma-separated on the CLI)")
        return [_coerce(v, item, key) for v in value]
    if hint is dict:
        if isinstance(value, dict):
            return value
        raise ConfigError(f'{key}={value!r} must be a table, e.g. {{path = "data.jsonl", weight = 1}}')
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ConfigError(f"{key}={value!r} must be a boolean: true or false")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}={value!r} must be an integer")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}={value!r} must be a number")
    if hint is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}={value!r} must be a string")
    raise TypeError(f"unsupported config type {hint} for {key}")  # a bug in sections.py, not user input


def _toml_value(text: str, key: str):
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{key}={text!r} is not a valid TOML array: {e}") from None


def _apply(config: JobConfig, section: str, key: str, value, source: str) -> None:
    known = sections()
    if section not in known:
        raise ConfigError(f"{source}: unknown config section [{section}]{did_you_mean(section, known)}")
    cls = known[section]
    hints = typing.get_type_hints(cls)
    if key not in hints:
        full = f"{section}.{key}"
        raise ConfigError(f"{source}: unknown config key {full!r}{did_you_mean(full, all_keys())}")
    setattr(getattr(config, section), key, _coerce(value, hints[key], f"{section}.{key}"))


def build_config(
    toml: dict | None = None, overrides: dict[str, str] | None = None, source: str = "config"
) -> JobConfig:
    """Defaults, then the recipe's values, then `{"section.key": "value"}` overrides."""
    config = JobConfig()
    for section, values in (toml or {}).items():
        if not isinstance(values, dict):
            raise ConfigError(
                f"{source}: top-level key {section!r} must be a [section]{did_you_mean(section, sections())}"
            )
        for key, value in values.items():
            _apply(config, section, key, value, source)
    for dotted, value in (overrides or {}).items():
        section, _, key = dotted.partition(".")
        if not key:
            raise ConfigError(
                f"command line: option --{dotted} must have the form --section.key{did_you_mean(dotted, all_keys())}"
            )
        _apply(config, section, key, value, "command line")
    return config


def to_dict(config: JobConfig) -> dict:
    return dataclasses.asdict(config)


def format_toml_value(v) -> str:
    """A config value as TOML writes it."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(format_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {format_toml_value(x)}" for k, x in v.items()) + "}"
    if v is None:
        return '""'
    return repr(v)


def to_toml(config: JobConfig) -> str:
    """The resolved config as a TOML recipe (what --print-config shows)."""
    lines = []
    for section, values in to_dict(config).items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {format_toml_value(v)}" for k, v in values.items()]
        lines.append("")
    return "\n".join(lines)
