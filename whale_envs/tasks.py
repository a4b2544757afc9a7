"""Tasks, task sources and splits.

A *task* is one puzzle / question with its private answer. A *task source* is a finite, ordered
collection of tasks: a file loader (Lichess CSV, EPD, GSM8K jsonl, ...) or a seeded procedural
generator. Every source is named by one string, the same everywhere (``gym.make(..., tasks=...)``,
every CLI ``--tasks``)::

    kind                      bundled sample or generator:   "lichess", "generated"
    kind:path                 a file of the user's:          "lichess:data/puzzles.csv"
    kind?key=value&key=value  options:                       "generated?difficulty=2&seed=7"
    kind:path?key=value       both

Options may also be passed as a dict (``task_options=`` / keyword arguments); string values from a
spec are converted to int / float / bool where they look like one.

Splits are stable and disjoint: a task's split is a keyed hash of its id (``whale_envs.splits``: the key is
a secret no harness or proposer can read), so it never changes between runs or dataset orderings under one
split secret. ``split="all"`` is the whole source.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import os
import random
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar, runtime_checkable

from whale_envs.splits import SPLIT_NAMES, SPLITS, split_key, split_of  # noqa: F401  (re-exported)

P = TypeVar("P")


class TaskSourceError(ValueError):
    """A task source cannot be built: unknown kind, missing file, malformed row, bad option.

    The message always names what is wrong and where (file and row where there is one).
    """


@dataclass(frozen=True)
class Task(Generic[P]):
    """One task.

    Attributes:
        id: stable identifier, the source's own where it has one (Lichess ``PuzzleId``, EPD ``id``,
            a dataset's row index), so a result can be traced back to its row.
        payload: domain data, *including the answer*. Only the env reads it; it never reaches an
            observation or ``info`` before the episode ends.
        meta: public metadata for breakdowns and filters (difficulty, rating, source file and row).
    """

    id: str
    payload: P
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def difficulty(self) -> Any:
        return self.meta.get("difficulty")


@runtime_checkable
class TaskSource(Protocol[P]):
    """A finite, ordered collection of tasks.

    ``ids()`` must be cheap (a generator knows its ids without generating the tasks); ``get`` may
    build the task on demand and must return the same task for the same id every time.
    """

    name: str

    def ids(self) -> Sequence[str]: ...

    def get(self, task_id: str) -> Task[P]: ...


def existing(path: str | Path, what: str, *, folder_ok: bool = False) -> Path:
    """``path`` (``~`` expanded) when it is a file (or, with ``folder_ok``, a folder); else a
    ``TaskSourceError`` naming the source kind ``what``."""
    p = Path(path).expanduser()
    if not (p.is_file() or (folder_ok and p.is_dir())):
        raise TaskSourceError(f"{what}: file not found: {p}")
    return p


#: The longest line (row) a task file may have, in characters: 1 MiB, 250x the longest row of the
#: bundled JSON Lines files (MATH-500, 4.1 KB). ``WHALE_MAX_ROW_CHARS`` sets another.
MAX_ROW_CHARS = 1 << 20


def max_row_chars() -> int:
    """:data:`MAX_ROW_CHARS`, or ``$WHALE_MAX_ROW_CHARS`` when set."""
    value = os.environ.get("WHALE_MAX_ROW_CHARS", "").strip()
    if not value:
        return MAX_ROW_CHARS
    if not value.isdigit() or int(value) < 1:
        raise TaskSourceError(f"WHALE_MAX_ROW_CHARS must be a positive integer, got {value!r}")
    return int(value)


def capped_lines(stream: Any, where: str, max_chars: int | None = None) -> Iterator[str]:
    """The lines of a text ``stream`` (named ``where`` in messages), each read ``max_chars + 1``
    characters at most: a longer line is a ``TaskSourceError`` naming the file and line, raised before
    the rest of it is read (a 100 MB row in a 100 KB ``.gz`` costs a megabyte, not 400)."""
    cap = max_row_chars() if max_chars is None else max_chars
    line_no = 0
    while line := stream.readline(cap + 1):
        line_no += 1
        if len(line) > cap and not line.endswith("\n"):
            raise TaskSourceError(
                f"{where}, line {line_no}: longer than {cap} characters (the row cap; "
                "WHALE_MAX_ROW_CHARS raises it)"
            )
        yield line


def json_lines(lines: Iterable[str], where: str) -> Iterator[tuple[int, Any]]:
    """(line number, value) for every non-blank line of a JSON Lines file (``lines``, named ``where`` in
    messages); a line that is not JSON, or one over the row cap (:func:`capped_lines`, when ``lines`` is
    a stream), is a ``TaskSourceError`` naming the file and the line."""
    if hasattr(lines, "readline"):
        lines = capped_lines(lines, where)
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TaskSourceError(f"{where}, line {line_no}: not valid JSON: {exc.msg}") from None
        yield line_no, value


def check_split(split: str) -> str:
    if split not in SPLIT_NAMES:
        raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLIT_NAMES)}")
    return split


def split_ids(source: TaskSource, split: str) -> list[str]:
    """The ids of ``source`` that fall in ``split`` ("all" = every id), in source order."""
    check_split(split)
    ids = list(source.ids())
    if split == "all":
        return ids
    key = split_key()  # once: a rollout filters a source's ids per env it builds (100k ids)
    return [i for i in ids if split_of(i, key) == split]


class ListSource(Generic[P]):
    """A task source over tasks already in memory (what file loaders return)."""

    def __init__(self, name: str, tasks: Sequence[Task[P]]):
        self.name = name
        self._tasks: dict[str, Task[P]] = {}
        for task in tasks:
            if task.id in self._tasks:
                raise TaskSourceError(f"{name}: duplicate task id {task.id!r}")
            self._tasks[task.id] = task

    def ids(self) -> list[str]:
        return list(self._tasks)

    def get(self, task_id: str) -> Task[P]:
        try:
            return self._tasks[task_id]
        except KeyError:
            raise KeyError(f"{self.name}: no task with id {task_id!r}") from None

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[Task[P]]:
        return iter(self._tasks.values())


class GeneratedSource(Generic[P]):
    """A seeded procedural source of tasks with known ids, each built on demand and cached.

    ``make(rng, idx)`` builds one candidate for position ``idx`` from ``rng`` (a ``random.Random``
    seeded from ``(seed, idx)`` only, so a task never depends on the source's size or on which other
    tasks were built) and returns ``(task, content_key)``. The content key identifies what the solver
    sees (a FEN, a question text): a candidate is kept only when its content hashes to the same split
    as its id, so the same content can never appear in two splits (no train/test leak when a small
    generator repeats itself). Rejected candidates just draw again from the same ``rng``.
    """

    def __init__(
        self,
        name: str,
        ids: Sequence[str],
        make: Callable[[random.Random, int], tuple[Task[P], str]],
        *,
        seed: int,
        max_attempts: int = 100_000,
    ):
        self.name = name
        self.seed = seed
        self._ids = list(ids)
        self._index = {task_id: i for i, task_id in enumerate(self._ids)}
        if len(self._index) != len(self._ids):
            raise TaskSourceError(f"{name}: duplicate generated task ids")
        self._make = make
        self._max_attempts = max_attempts
        self._cache: dict[str, Task[P]] = {}

    def ids(self) -> list[str]:
        return list(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    def get(self, task_id: str) -> Task[P]:
        if task_id in self._cache:
            return self._cache[task_id]
        try:
            idx = self._index[task_id]
        except KeyError:
            raise KeyError(f"{self.name}: no task with id {task_id!r}") from None
        key = split_key()
        want = split_of(task_id, key)
        rng = random.Random(self.seed * 2**32 + idx)
        for _ in range(self._max_attempts):
            task, content_key = self._make(rng, idx)
            if split_of(content_key, key) == want:
                self._cache[task_id] = task
                return task
        raise RuntimeError(
            f"{self.name}: could not generate task {task_id!r} in {self._max_attempts} attempts"
        )


@dataclass
class GeneratorConfig:
    """Options every generated source shares (reasoning-gym style: subclass, add fields, extend ``validate``).

    Attributes:
        difficulty: one level or a range ``"lo-hi"``; task ``idx`` gets level ``lo + idx % n``.
        seed: the generator seed; the same seed gives the same tasks.
        size: number of task ids in the source (tasks are built lazily, on first use).
    """

    #: The levels this generator knows, and what a level means (for error messages).
    LEVELS: ClassVar[tuple[int, ...]] = (1,)
    LEVEL_NAME: ClassVar[str] = "level"

    difficulty: int | str = 1
    seed: int = 0
    size: int = 4000

    def levels(self) -> list[int]:
        lo, _, hi = str(self.difficulty).strip().partition("-")
        known = f"{self.LEVELS[0]}-{self.LEVELS[-1]}"
        try:
            levels = list(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            raise ValueError(
                f"difficulty must be a {self.LEVEL_NAME} {known} or a range like '1-2', got {self.difficulty!r}"
            ) from None
        if not levels or levels[0] not in self.LEVELS or levels[-1] not in self.LEVELS:
            raise ValueError(
                f"difficulty ({self.LEVEL_NAME}) must be within {known}, got {self.difficulty!r}"
            )
        return levels

    def level_of(self, idx: int) -> int:
        levels = self.levels()
        return levels[idx % len(levels)]

    def validate(self) -> None:
        self.levels()
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if not isinstance(self.size, int) or isinstance(self.size, bool) or self.size < 1:
            raise ValueError(f"size must be a positive integer, got {self.size!r}")


# --------------------------------------------------------------------------------------------
# The registry: (domain, kind) -> factory. Each domain registers its kinds in its own module.


@dataclass(frozen=True)
class SourceKind:
    domain: str
    kind: str
    factory: Callable[..., TaskSource]
    path_required: bool
    takes_path: bool
    doc: str
    shared: bool = True

    @property
    def usage(self) -> str:
        """How the kind is written in a spec: ``generated``, ``lichess[:PATH]``, ``nq:PATH``."""
        if not self.takes_path:
            return self.kind
        return f"{self.kind}:PATH" if self.path_required else f"{self.kind}[:PATH]"


_KINDS: dict[tuple[str, str], SourceKind] = {}


def register_source(
    domain: str,
    kind: str,
    factory: Callable[..., TaskSource],
    *,
    path_required: bool = False,
    takes_path: bool = True,
    doc: str = "",
    shared: bool = True,
) -> None:
    """Register ``factory(path: str | None, **options) -> TaskSource`` as ``kind`` of ``domain``.

    ``path`` is None when the spec names no file: the factory then uses its bundled sample or
    generates. ``path_required``: the kind needs a file (the factory is never called without one);
    ``takes_path=False``: the kind takes no file at all (generators). ``shared=False``: do not keep
    one instance per spec for the process (the factory caches by itself, e.g. because the source
    depends on more files than the one named).
    """
    _KINDS[(domain, kind)] = SourceKind(domain, kind, factory, path_required, takes_path, doc, shared)


def register_generator(domain: str, make: Callable[..., TaskSource], doc: str) -> None:
    """Register ``make(None, **options)`` as the ``generated`` kind of ``domain`` (it reads no file)."""
    register_source(domain, "generated", make, takes_path=False, doc=doc)


def source_kinds(domain: str | None = None) -> list[SourceKind]:
    return [k for (d, _), k in sorted(_KINDS.items()) if domain is None or d == domain]


def parse_spec(spec: str) -> tuple[str, str | None, dict[str, Any]]:
    """Split ``kind[:path][?k=v&...]`` into (kind, path, options)."""
    if not isinstance(spec, str) or not spec.strip():
        raise TaskSourceError(
            f"a task source spec must be a non-empty string like 'generated' or 'kind:path', got {spec!r}"
        )
    rest, _, query = spec.strip().partition("?")
    kind, sep, path = rest.partition(":")
    options: dict[str, Any] = {}
    for item in filter(None, query.split("&")):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise TaskSourceError(f"task source spec {spec!r}: option {item!r} is not key=value")
        options[key.strip()] = _parse_value(value.strip())
    return kind.strip(), (path.strip() or None) if sep else None, options


def _parse_value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def _import_domain(domain: str) -> None:
    """Domains register their kinds when their package (``whale_envs.<domain>``) is imported."""
    try:
        importlib.import_module(f"whale_envs.{domain}")
    except ModuleNotFoundError as exc:
        if exc.name != f"whale_envs.{domain}":
            raise
        raise TaskSourceError(f"unknown domain {domain!r}") from None


_SOURCE_CACHE: dict[tuple, TaskSource] = {}
_SOURCE_LOCK = threading.Lock()


def make_source(domain: str, spec: str | TaskSource = "generated", **options: Any) -> TaskSource:
    """Build the task source ``spec`` names for ``domain`` (see the module docstring).

    Sources are immutable, so one instance per (domain, spec, options) is kept for the process and
    shared by every env built from it (a rollout makes many envs; a generator's tasks are built once).
    A source read from a file is built again when the file changes.
    """
    if not isinstance(spec, str):
        if isinstance(spec, TaskSource):
            if options:
                raise TaskSourceError("options cannot be applied to an already built task source")
            return spec
        raise TaskSourceError(f"tasks must be a spec string or a TaskSource, got {type(spec).__name__}")
    kind, path, spec_options = parse_spec(spec)
    if not any(d == domain for d, _ in _KINDS):
        _import_domain(domain)
    entry = _KINDS.get((domain, kind))
    if entry is None:
        known = ", ".join(k.kind for k in source_kinds(domain)) or "none"
        raise TaskSourceError(
            f"unknown task source kind {kind!r} for domain {domain!r}; known kinds: {known}"
        )
    if entry.path_required and path is None:
        raise TaskSourceError(f"task source {kind!r} needs a file: use '{kind}:PATH'")
    if not entry.takes_path and path is not None:
        raise TaskSourceError(f"task source {kind!r} takes no file, got {path!r}")
    merged = {**spec_options, **options}
    stamp: Any = None
    if path is not None and path.startswith("hf://"):  # a hub name: read from the HF caches in use
        stamp = tuple(os.environ.get(v) for v in ("HF_HOME", "HF_DATASETS_CACHE", "HF_HUB_CACHE"))
    elif path is not None:
        try:
            stamp = os.stat(path).st_mtime_ns
        except OSError:
            pass  # the factory reports the missing file
    key = (domain, kind, path, stamp, repr(sorted(merged.items())))
    with _SOURCE_LOCK:
        cached = _SOURCE_CACHE.get(key) if entry.shared else None
    if cached is not None:
        return cached
    accepted = inspect.signature(entry.factory).parameters
    unknown = [k for k in merged if k not in accepted or k == "path"]
    if unknown and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
        names = ", ".join(p for p in accepted if p != "path") or "none"
        raise TaskSourceError(
            f"unknown option(s) {', '.join(map(repr, unknown))} for task source {kind!r}; accepted: {names}"
        )
    _check_option_types(kind, accepted, merged)
    try:
        source = entry.factory(path, **merged)
    except UnicodeDecodeError as exc:
        raise TaskSourceError(
            f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); save the file as UTF-8"
        ) from None
    if not entry.shared:
        return source
    with _SOURCE_LOCK:
        return _SOURCE_CACHE.setdefault(key, source)


def _check_option_types(
    kind: str, params: Mapping[str, inspect.Parameter], options: Mapping[str, Any]
) -> None:
    """A text value for a numeric option (``min_rating=abc``) is an error naming the option, not a TypeError
    deep inside the loader. Annotations are read as text (``int | None``, ``float``)."""
    for key, value in options.items():
        param = params.get(key)
        if param is None or not isinstance(value, str):
            continue
        kinds = {t.strip() for t in str(param.annotation).split("|")}
        if kinds & {"int", "float"} and not kinds & {"str", "Any", "inspect._empty"}:
            want = "a whole number" if "float" not in kinds else "a number"
            raise TaskSourceError(f"task source {kind!r}: option {key} must be {want}, got {value!r}")


def config_from_options(cls: type, where: str, options: Mapping[str, Any]) -> Any:
    """Build a config dataclass from options and ``validate()`` it, turning mistakes into TaskSourceError."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - names)
    if unknown:
        raise TaskSourceError(f"{where}: unknown option(s) {unknown}; accepted: {sorted(names)}")
    try:
        config = cls(**options)
        validate = getattr(config, "validate", None)
        if validate is not None:
            validate()
    except (TypeError, ValueError, AssertionError) as exc:
        raise TaskSourceError(f"{where}: {exc}") from None
    return config
