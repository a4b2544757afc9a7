"""One way to read a config: a YAML file, a mapping and ``--set key=value`` items into a dataclass.

Every config of WHALE (``TrainConfig``, ``RSFTConfig``, ``ScheduleConfig``, ``MetaHarnessConfig``,
``EvalConfig``) is a dataclass that derives from ``Config`` and documents its fields with
``option(default, "help text")`` (the help lives in ``field(metadata={"help": ...})``)::

    @dataclass
    class EvalConfig(Config):
        k: int = option(8, "samples per task (mean@k)")

    EvalConfig.load("eval.yaml", ["k=4"])       # file, then overrides; validated
    EvalConfig.from_dict({"k": "4"})            # "4" becomes 4: YAML strings are coerced to the field type

What the loader does, for nested dataclasses too (a field typed as another ``Config`` is read from a
mapping, recursively):

- an unknown key is refused, naming the nearest valid one (``rsft.lr: unknown field; did you mean
  rsft.learning_rate?``);
- a value is coerced to the field's type where that is unambiguous (PyYAML reads ``5e-5`` as a string;
  ``"8"`` for an int, ``"true"`` for a bool) and refused where it is not;
- ``validate()`` of every nested config, then of the whole, is called.

Errors are ``ConfigError`` (a ``ValueError``): one line naming the file (or ``--set``) and the dotted
field, which the CLI prints as it is (exit status 2).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar, Union

import yaml

__all__ = [
    "Config",
    "ConfigError",
    "describe",
    "from_dict",
    "merge",
    "option",
    "parse_sets",
    "read_yaml",
]

T = TypeVar("T")


class ConfigError(ValueError):
    """A config mistake, as one line naming the file (or ``--set``) and the dotted field."""


def option(default: Any = dataclasses.MISSING, help: str = "", *, factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field with its help text (``field(metadata={"help": ...})``); ``factory`` for
    mutable defaults."""
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata={"help": help})
    return dataclasses.field(default=default, metadata={"help": help})


# ------------------------------------------------------------------------------------------ --set


def parse_sets(items: Iterable[str], option_name: str = "--set") -> dict[str, Any]:
    """``["rsft.learning_rate=5e-5", "seed=3"]`` → ``{"rsft": {"learning_rate": "5e-5"}, "seed": 3}``:
    dotted keys become nested mappings, values are read as YAML (``true``, ``[a, b]``, ``{k: v}``)."""
    out: dict[str, Any] = {}
    for item in items:
        key, eq, value = str(item).partition("=")
        key = key.strip()
        if not eq or not key:
            raise ConfigError(f"{option_name} expects key=value, got {item!r}")
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError:
            raise ConfigError(f"{option_name} {key}: the value {value!r} is not valid YAML") from None
        *parents, leaf = key.split(".")
        target = out
        for i, part in enumerate(parents):
            nxt = target.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise ConfigError(
                    f"{option_name} {key}: {'.'.join(parents[: i + 1])} was given a value already"
                )
            target = nxt
        target[leaf] = merge(target[leaf], parsed) if isinstance(target.get(leaf), dict) else parsed
    return out


def merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``, mappings merged key by key at every depth."""
    out = dict(base)
    for key, value in over.items():
        old = out.get(key)
        out[key] = merge(old, value) if isinstance(value, Mapping) and isinstance(old, Mapping) else value
    return out


def _dotted(data: Mapping[str, Any], prefix: str = "") -> set[str]:
    keys = set()
    for key, value in data.items():
        name = f"{prefix}{key}"
        keys.add(name)
        if isinstance(value, Mapping):
            keys |= _dotted(value, f"{name}.")
    return keys


# ------------------------------------------------------------------------------------------ YAML


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML mapping from ``path``. ``base: other.yaml`` (relative to this file) is read first and this
    file's keys merged over it (nested mappings key by key). Errors name the file (and the line)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no config file {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config is a mapping of fields, got {type(data).__name__}")
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str):
        raise ConfigError(f"{path}: base: a file name, got {base!r}")
    return merge(read_yaml(path.parent / base), data)


# ------------------------------------------------------------------------------------------ building


def from_dict(
    cls: type[T], data: Mapping[str, Any] | None, *, source: str | None = None, sets: Iterable[str] = ()
) -> T:
    """``cls`` built from ``data``: unknown keys refused, values coerced, ``validate()`` called (nested
    first). ``source`` (a file name) and ``sets`` (the dotted keys that came from ``--set``) say where a
    bad key came from in the error."""
    return _Builder(source, set(sets)).build(cls, dict(data or {}), "")


class _Builder:
    def __init__(self, source: str | None, set_keys: set[str]):
        self.source, self.set_keys = source, set_keys

    def where(self, dotted: str) -> str:
        if any(dotted == k or dotted.startswith(k + ".") for k in self.set_keys):
            return f"--set {dotted}"
        return f"{self.source}: {dotted}" if self.source else dotted

    def fail(self, dotted: str, message: str) -> ConfigError:
        return ConfigError(f"{self.where(dotted)}: {message}")

    def build(self, cls: type[T], data: dict[str, Any], prefix: str) -> T:
        fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for key, value in data.items():
            dotted = f"{prefix}{key}"
            if key not in fields:
                near = difflib.get_close_matches(str(key), list(fields), n=1)
                hint = f"did you mean {prefix}{near[0]}?" if near else f"known: {', '.join(sorted(fields))}"
                raise self.fail(dotted, f"unknown field; {hint}")
            kwargs[key] = self.coerce(hints[key], value, dotted)
        try:
            config = cls(**kwargs)
        except TypeError as exc:  # a required field left out
            raise self.fail(prefix.rstrip(".") or cls.__name__, str(exc)) from None
        validate = getattr(config, "validate", None)
        if validate is not None:
            try:
                validate()
            except ConfigError:
                raise
            except ValueError as exc:
                where = self.where(prefix.rstrip(".")) if prefix else (self.source or "")
                raise ConfigError(f"{where}: {exc}" if where else str(exc)) from None
        return config

    def coerce(self, kind: Any, value: Any, dotted: str) -> Any:
        """``value`` as a ``kind``, or a ConfigError naming the field."""
        if kind is Any:
            return value
        origin = typing.get_origin(kind)
        if origin in (Union, types.UnionType):
            options = typing.get_args(kind)
            if value is None and type(None) in options:
                return None
            for option_kind in (k for k in options if k is not type(None)):
                with contextlib.suppress(ConfigError):
                    return self.coerce(option_kind, value, dotted)
            raise self.fail(dotted, f"expected {_name(kind)}, got {value!r}")
        if dataclasses.is_dataclass(kind):
            if isinstance(value, kind):
                return value
            if not isinstance(value, Mapping):
                raise self.fail(dotted, f"expected a mapping of {kind.__name__} fields, got {value!r}")
            return self.build(kind, dict(value), f"{dotted}.")
        if origin is not None:  # list[str], dict[str, Any], ...
            if not isinstance(value, origin):
                raise self.fail(dotted, f"expected {_name(kind)}, got {value!r}")
            return value
        if kind is bool:
            if isinstance(value, bool):
                return value
            words = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}
            if isinstance(value, str) and value.strip().lower() in words:
                return words[value.strip().lower()]
            raise self.fail(dotted, f"expected true or false, got {value!r}")
        if kind is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            number = self._number(value)
            if number is not None and float(number).is_integer():
                return int(number)
            raise self.fail(dotted, f"expected an integer, got {value!r}")
        if kind is float:
            number = self._number(value)
            if number is not None:
                return float(number)
            raise self.fail(dotted, f"expected a number, got {value!r}")
        if kind is str:
            if isinstance(value, str):
                return value
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return str(value)  # name: 2024
            raise self.fail(dotted, f"expected a string, got {value!r}")
        if isinstance(kind, type) and not isinstance(value, kind):
            raise self.fail(dotted, f"expected {_name(kind)}, got {value!r}")
        return value

    @staticmethod
    def _number(value: Any) -> int | float | None:
        if isinstance(value, bool):
            return None
        if isinstance(value, (int, float)):
            return value
        if isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                return None
        return None


def _name(kind: Any) -> str:
    return getattr(kind, "__name__", None) or str(kind).replace("typing.", "")


# ------------------------------------------------------------------------------------------ Config


class Config:
    """The base of WHALE's config dataclasses: loading, overrides and ``to_dict`` written once."""

    def validate(self) -> None:
        """Refuse values that type coercion cannot catch (ranges, combinations): ``ValueError``."""

    @classmethod
    def from_dict(cls: type[T], data: Mapping[str, Any] | None, *, source: str | None = None) -> T:
        return from_dict(cls, data, source=source)

    @classmethod
    def load(
        cls: type[T], path: str | Path | None = None, sets: Iterable[str] = (), *, section: str | None = None
    ) -> T:
        """The file at ``path`` (``base:`` merged; with ``section``, that mapping of it when present),
        then the ``--set`` items, as a validated config."""
        data = read_yaml(path) if path else {}
        if section and isinstance(data.get(section), dict):
            data = data[section]
        overrides = parse_sets(sets)
        return from_dict(
            cls, merge(data, overrides), source=str(path) if path else None, sets=_dotted(overrides)
        )

    @classmethod
    def from_yaml(cls: type[T], path: str | Path) -> T:
        return cls.load(path)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def describe(cls: type, prefix: str = "") -> list[str]:
    """One line per field, nested configs flattened: ``rsft.learning_rate (float, 0.0001): help``."""
    hints = typing.get_type_hints(cls)
    lines = []
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            lines += describe(kind, f"{prefix}{f.name}.")
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = "required"
        help_text = f.metadata.get("help", "")
        lines.append(f"{prefix}{f.name} ({_name(kind)}, {default!r}){': ' + help_text if help_text else ''}")
    return lines
