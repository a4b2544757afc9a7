"""What a ``whale/ReasoningGym-v0`` user names: one reasoning-gym dataset with its config, or a weighted
composite of several, checked against the installed package before anything is generated.

Forms accepted (the same as env keywords, ``--env-option`` values and task-spec options)::

    dataset="leg_counting", min_animals=3                       one dataset; other keywords: its config
    dataset="composite", datasets={"leg_counting": 1, "basic_arithmetic": 2}
    datasets={"leg_counting": {"weight": 1, "config": {"min_animals": 3}}, "basic_arithmetic": 1}
    datasets=[{"name": "leg_counting", "weight": 1, "config": {}}]         reasoning-gym's own YAML form
    datasets="leg_counting:1,basic_arithmetic:2"                           (weights optional: 1)

Every mistake is a ``TaskSourceError`` of one line naming the dataset and the option; an unknown dataset
name lists the close ones.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from whale_envs.tasks import TaskSourceError

COMPOSITE = "composite"
#: The package and the extra that installs it, for the message when it is missing.
INSTALL_HINT = "pip install 'whale-harness[envs]' (or pip install reasoning-gym)"


def datasets_registry() -> dict[str, tuple[type, type]]:
    """reasoning-gym's registry, name -> (dataset class, config class); imported on first use (~1 s)."""
    try:
        import reasoning_gym  # noqa: F401  (importing it registers its datasets)
        from reasoning_gym.factory import DATASETS
    except ImportError as exc:
        raise TaskSourceError(
            f"reasoning-gym datasets need the reasoning-gym package ({exc}): {INSTALL_HINT}"
        ) from None
    return DATASETS


@dataclass(frozen=True)
class Part:
    """One dataset of a spec: its name, its weight in a composite (1 for a single dataset), its config."""

    name: str
    weight: float
    config: Mapping[str, Any]


@dataclass(frozen=True)
class DatasetSpec:
    """A checked dataset spec: one part (a single dataset) or several (a composite)."""

    parts: tuple[Part, ...]
    composite: bool

    @property
    def label(self) -> str:
        """The readable, stable stem of every task id: ``leg_counting``, ``leg_counting.1a2b3c4d`` (with a
        config), ``composite.5e6f7a8b`` (the digest covers names, weights and configs)."""
        if not self.composite:
            part = self.parts[0]
            return part.name if not part.config else f"{part.name}.{_digest(part.config)}"
        return f"{COMPOSITE}.{_digest([[p.name, p.weight, p.config] for p in self.parts])}"

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.parts]


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]


def parse_spec(dataset: str | None, datasets: Any, config: Mapping[str, Any]) -> DatasetSpec:
    """Check ``dataset`` / ``datasets`` / config keywords against the installed reasoning-gym."""
    registry = datasets_registry()
    if datasets is not None and dataset not in (None, COMPOSITE):
        raise TaskSourceError(
            f"dataset={dataset!r} with datasets=...: name one dataset, or dataset=composite with datasets"
        )
    if datasets is None:
        if dataset in (None, COMPOSITE):
            raise TaskSourceError(
                "dataset=composite needs datasets, e.g. datasets={leg_counting: 1, basic_arithmetic: 1}"
                if dataset == COMPOSITE
                else "name a reasoning-gym dataset: dataset=NAME (e.g. leg_counting)"
            )
        return DatasetSpec((_part(registry, dataset, 1.0, config, "dataset"),), composite=False)
    if config:
        raise TaskSourceError(
            f"option(s) {sorted(config)} with a composite: give each dataset its config in datasets, e.g. "
            "datasets={leg_counting: {weight: 1, config: {min_animals: 3}}}"
        )
    parts = tuple(_part(registry, *item) for item in _composite_items(datasets))
    if not parts:
        raise TaskSourceError("datasets: name at least one reasoning-gym dataset")
    names = [p.name for p in parts]
    if len(set(names)) != len(names):
        raise TaskSourceError(f"datasets: {sorted({n for n in names if names.count(n) > 1})} named twice")
    return DatasetSpec(parts, composite=True)


def _composite_items(datasets: Any) -> list[tuple[str, Any, Any, str]]:
    """(name, weight, config, where) for each dataset of a composite, in any of the accepted forms."""
    if isinstance(datasets, str):
        items = []
        for piece in filter(None, (p.strip() for p in datasets.split(","))):
            name, _, weight = piece.partition(":")
            items.append((name.strip(), weight.strip() or 1, {}, f"datasets {piece!r}"))
        return items
    if isinstance(datasets, Mapping):
        items = []
        for name, value in datasets.items():
            where = f"datasets.{name}"
            if isinstance(value, Mapping):
                unknown = sorted(set(value) - {"weight", "config"})
                if unknown:
                    raise TaskSourceError(f"{where}: unknown key(s) {unknown}; accepted: weight, config")
                items.append((str(name), value.get("weight", 1), value.get("config") or {}, where))
            else:
                items.append((str(name), value, {}, where))
        return items
    if isinstance(datasets, list | tuple):
        items = []
        for i, value in enumerate(datasets):
            where = f"datasets[{i}]"
            if isinstance(value, str):
                items.append((value, 1, {}, where))
                continue
            if not isinstance(value, Mapping) or "name" not in value:
                raise TaskSourceError(
                    f"{where}: expected a name or {{name:, weight:, config:}}, got {value!r}"
                )
            unknown = sorted(set(value) - {"name", "weight", "config"})
            if unknown:
                raise TaskSourceError(f"{where}: unknown key(s) {unknown}; accepted: name, weight, config")
            items.append((str(value["name"]), value.get("weight", 1), value.get("config") or {}, where))
        return items
    raise TaskSourceError(
        f"datasets must be a mapping name -> weight, a list or 'name:weight,...', got {type(datasets).__name__}"
    )


def _part(registry: Mapping[str, Any], name: Any, weight: Any, config: Any, where: str) -> Part:
    if not isinstance(name, str) or name not in registry or name == COMPOSITE:
        raise TaskSourceError(f"{where}: {unknown_name(name, registry)}")
    try:
        weight = float(weight)
    except (TypeError, ValueError):
        raise TaskSourceError(f"{where}: weight must be a number, got {weight!r}") from None
    if not weight > 0:
        raise TaskSourceError(f"{where}: weight must be positive, got {weight!r}")
    if not isinstance(config, Mapping):
        raise TaskSourceError(f"{where}: config must be a mapping of options, got {config!r}")
    config = dict(config)
    fields = {f.name for f in dataclasses.fields(registry[name][1])} - {"seed", "size"}
    unknown = sorted(set(config) - fields)
    if unknown:
        taken = [k for k in unknown if k in ("seed", "size")]
        note = f" ({', '.join(taken)}: an option of the env, not of one dataset)" if taken else ""
        raise TaskSourceError(
            f"{where} {name}: unknown option(s) {unknown}{note}; accepted: {', '.join(sorted(fields)) or 'none'}"
        )
    return Part(name, weight, config)


def unknown_name(name: Any, registry: Mapping[str, Any]) -> str:
    """The one-line message for a name reasoning-gym does not know, with the close names."""
    names = sorted(n for n in registry if n != COMPOSITE)
    close = difflib.get_close_matches(str(name), names, n=5, cutoff=0.6)
    if close:
        return f"unknown reasoning-gym dataset {name!r}; close names: {', '.join(close)}"
    return f"unknown reasoning-gym dataset {name!r}; the {len(names)} datasets: {', '.join(names)}"
