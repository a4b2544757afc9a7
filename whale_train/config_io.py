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
- ``validate()`` of every nested config, then of the whole, is called;
- a key a config renamed (``Config.renamed``, set with the :func:`renamed` class decorator: a flat
  ``llm_model`` that became ``llm.model`` of a nested config) is still read, from a file, ``--set``, a
  mapping or the constructor, and moved to its new place, with a one-line notice naming the new key
  (a :class:`RenamedKey` warning, shown as ``note: ...``).

Errors are ``ConfigError`` (a ``ValueError``): one line naming the file (or ``--set``) and the dotted
field, which the CLI prints as it is (exit status 2).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import types
import typing
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, TypeVar, Union

import yaml

__all__ = [
    "Config",
    "ConfigError",
    "RenamedKey",
    "at_least",
    "describe",
    "from_dict",
    "merge",
    "option",
    "parse_sets",
    "read_yaml",
    "renamed",
    "upgrade",
]

T = TypeVar("T")


class ConfigError(ValueError):
    """A config mistake, as one line naming the file (or ``--set``) and the dotted field."""


class RenamedKey(FutureWarning):
    """A config key read under its new name (the old one still works): shown as one line, ``note: ...``."""


def option(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    factory: Any = dataclasses.MISSING,
    minimum: float | None = None,
) -> Any:
    """A dataclass field with its help text (``field(metadata={"help": ...})``); ``factory`` for
    mutable defaults; ``minimum``, the smallest value :meth:`Config.validate` accepts (a range stated
    where the field is, instead of in a list of names in ``validate``)."""
    metadata = {"help": help} if minimum is None else {"help": help, "minimum": minimum}
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


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


# ------------------------------------------------------------------------------------------ renamed keys


def renamed(mapping: Mapping[str, str]) -> Callable[[type[T]], type[T]]:
    """Class decorator, above ``@dataclass``: the config's old keys, ``{"llm_model": "llm.model"}`` (the
    new key dotted from this config), are still read from a file, a mapping, ``--set`` and the
    constructor (``MetaHarnessConfig(llm_model="m")``), each with a one-line :class:`RenamedKey` notice."""

    def wrap(cls: type[T]) -> type[T]:
        cls.renamed = dict(mapping)  # type: ignore[attr-defined]
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            if any(key in cls.renamed for key in kwargs):  # type: ignore[attr-defined]
                kwargs = _renamed_kwargs(cls, kwargs)
            init(self, *args, **kwargs)

        cls.__init__ = __init__  # type: ignore[method-assign]
        return cls

    return wrap


def _notice(old: str, new: str) -> None:
    with _one_line_notices():
        warnings.warn(f"{old} is now {new} (the old key is still read)", RenamedKey, stacklevel=2)


@contextlib.contextmanager
def _one_line_notices() -> Iterator[None]:
    """While the block runs, a shown :class:`RenamedKey` reads ``note: ...``; any other warning keeps the
    format it had. The format is set back on leaving: the process's warnings are not reformatted (a
    warning that is recorded, as ``pytest.warns`` does, is not formatted at all)."""
    before = warnings.formatwarning

    def one_line(message: Any, category: Any, filename: str, lineno: int, line: str | None = None) -> str:
        if isinstance(category, type) and issubclass(category, RenamedKey):
            return f"note: {message}\n"
        return before(message, category, filename, lineno, line)

    warnings.formatwarning = one_line
    try:
        yield
    finally:
        warnings.formatwarning = before


def _renamed_kwargs(cls: type, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The constructor's keyword arguments with the old keys moved into the nested configs."""
    out = dict(kwargs)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for old, new in cls.renamed.items():  # type: ignore[attr-defined]
        if old not in out:
            continue
        value = out.pop(old)
        head, _, rest = new.partition(".")
        if not rest:
            _notice(f"{cls.__name__}({old}=...)", f"{cls.__name__}({head}=...)")
            out[head] = value
            continue
        sub = out.get(head)
        if sub is None:
            f = fields[head]
            sub = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        _notice(f"{cls.__name__}({old}=...)", f"{cls.__name__}({head}={type(sub).__name__}({rest}=...))")
        out[head] = _replaced(sub, rest.split("."), value)
    return out


def _replaced(config: Any, path: list[str], value: Any) -> Any:
    """``config`` (a dataclass) with the field at ``path`` set to ``value`` (nested ones replaced too)."""
    head, *rest = path
    inner = _replaced(getattr(config, head), rest, value) if rest else value
    return dataclasses.replace(config, **{head: inner})


def _upgrade_level(
    cls: type, data: Mapping[str, Any], prefix: str, where: Callable[[str], str]
) -> dict[str, Any]:
    """``data`` (the keys of ``cls``) with its old keys moved to their new places (one notice each). Both
    an old key and its new one with another value is a ConfigError."""
    out = dict(data)
    for old, new in getattr(cls, "renamed", {}).items():
        if old not in out:
            continue
        value = out.pop(old)
        *parents, leaf = new.split(".")
        target = out
        for i, part in enumerate(parents):
            inner = target.get(part)
            if dataclasses.is_dataclass(inner) and not isinstance(inner, type):
                inner = dataclasses.asdict(inner)
            elif inner is None:
                inner = {}
            elif not isinstance(inner, Mapping):
                dotted = prefix + ".".join(parents[: i + 1])
                raise ConfigError(f"{where(dotted)}: expected a mapping (it holds {prefix}{old} now)")
            target[part] = inner = dict(inner)
            target = inner
        if leaf in target and target[leaf] != value:
            raise ConfigError(
                f"{where(prefix + old)}: both {prefix}{old} and its new name {prefix}{new} are given; keep {prefix}{new}"
            )
        target[leaf] = value
        _notice(where(prefix + old), prefix + new)
    return out


def upgrade(
    cls: type, data: Mapping[str, Any], where: Callable[[str], str] = str, prefix: str = ""
) -> dict[str, Any]:
    """``data`` for ``cls`` with the old keys of ``cls`` and of its nested configs moved to their new
    places, each with a one-line notice (``where`` names a dotted key in it: the file, ``--set``)."""
    out = _upgrade_level(cls, data, prefix, where)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = hints.get(f.name)
        if dataclasses.is_dataclass(kind) and isinstance(out.get(f.name), Mapping):
            out[f.name] = upgrade(kind, out[f.name], where, f"{prefix}{f.name}.")
    return out


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
        data = _upgrade_level(cls, data, prefix, self.where)  # old keys: moved, with a notice
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

    #: Old key -> its new key, dotted from this config (set by :func:`renamed`).
    renamed: ClassVar[dict[str, str]] = {}

    def validate(self) -> None:
        """Refuse values that type coercion cannot catch (ranges, combinations): ``ValueError``. Here,
        the fields' ``minimum`` (:func:`option`); a config with more rules extends this one."""
        for f in dataclasses.fields(self):  # type: ignore[arg-type]  (a subclass is the dataclass)
            if "minimum" in f.metadata:
                at_least(self, f.metadata["minimum"], f.name)

    @classmethod
    def from_dict(cls: type[T], data: Mapping[str, Any] | None, *, source: str | None = None) -> T:
        return from_dict(cls, data, source=source)

    @classmethod
    def load(
        cls: type[T],
        path: str | Path | None = None,
        sets: Iterable[str] = (),
        *,
        section: str | None = None,
        flags: Mapping[str, Any] | None = None,
    ) -> T:
        """The file at ``path`` (``base:`` merged; with ``section``, that mapping of it when present),
        then ``flags`` (a command's own options), then the ``--set`` items, as a validated config."""
        data = read_yaml(path) if path else {}
        if section and isinstance(data.get(section), dict):
            data = data[section]
        source = str(path) if path else None
        given = parse_sets(sets)
        # each layer in the new form before they merge: a flag or --set of a new key overrides the file's
        # old one
        data = upgrade(cls, data, _Builder(source, set()).where)
        flags = upgrade(cls, flags or {}, _Builder(None, set()).where)
        overrides = upgrade(cls, given, _Builder(None, _dotted(given)).where)
        data = merge(merge(data, flags), overrides)
        return from_dict(cls, data, source=source, sets=_dotted(overrides))

    @classmethod
    def from_yaml(cls: type[T], path: str | Path) -> T:
        return cls.load(path)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def at_least(config: Any, minimum: float, *names: str) -> None:
    """For ``validate()``: ValueError naming the first of the fields ``names`` that is below ``minimum``."""
    for name in names:
        value = getattr(config, name)
        if value < minimum:
            raise ValueError(f"{type(config).__name__}.{name} must be >= {minimum}, got {value}")


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
