"""The compare config and the grid of runs: config merging (domain config, ``set``, the domain's
``set``, ``--set``, the run's own fields) and one :class:`RunSpec` per distinct run."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from whale_train.config_io import merge, parse_sets
from whale_train.report import read_ledger
from whale_train.schedule import METHODS
from whale_train.trainer import TrainConfig

WHALE = "whale"
REFERENCE = "weight-only"  # "rollouts to reach weight-only's peak"
#: ``keep_checkpoints:`` of a compare config. A run saves every model version (about 11 MB each for the
#: shipped model, 128 of them in a decisive run); "evaluated" removes, once a run has finished, those
#: that no evaluation scored (best, final and selected are evaluations, so their weights stay).
KEEP_CHECKPOINTS = ("all", "evaluated")


def _nest(overrides: dict[str, Any] | None) -> dict[str, Any]:
    """``{"a.b": 1, "c": {"d": 2}}`` -> ``{"a": {"b": 1}, "c": {"d": 2}}``."""
    out: dict[str, Any] = {}
    for key, value in (overrides or {}).items():
        *parents, leaf = str(key).split(".")
        target = out
        for p in parents:
            target = target.setdefault(p, {})
        if isinstance(value, dict):
            value = _nest(value)
            if isinstance(target.get(leaf), dict):
                value = merge(target[leaf], value)
        target[leaf] = value
    return out


@dataclass
class Domain:
    name: str
    config: Path | None  # a whale train config, or None: the overrides are the whole config
    overrides: dict[str, Any]


@dataclass
class CompareConfig:
    name: str
    domains: list[Domain]
    methods: list[str]
    seeds: list[int]
    overrides: dict[str, Any] = field(default_factory=dict)  # ``set:``, for every run
    ablation: dict[str, Any] | None = None  # {"domain", "points": [(E, I), ...], "seeds"}
    source: dict[str, Any] = field(default_factory=dict)  # as read (with --set), for grid.yaml
    command_line: dict[str, Any] = field(default_factory=dict)  # ``--set``: applied last
    keep_checkpoints: str = "all"  # "evaluated": a finished run keeps only the model versions evaluated
    record: Path | None = None  # finished runs' small files, to commit (whale_train.compare.record)
    # seeds added to some methods of a domain (an amendment): [{"domain", "methods", "seeds"}, ...]
    more_seeds: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def load(cls, path: str | Path, sets: Sequence[str] = ()) -> CompareConfig:
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"no compare config {path}")
        data = yaml.safe_load(path.read_text()) or {}
        known = {
            "name",
            "domains",
            "methods",
            "seeds",
            "set",
            "ablation",
            "more_seeds",
            "keep_checkpoints",
            "record",
        }
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown compare key(s) {unknown}; known: {sorted(known)}")
        overrides = _nest(data.get("set"))
        command_line = parse_sets(sets)
        domains = []
        for name, spec in (data.get("domains") or {}).items():
            if isinstance(spec, str):
                spec = {"config": spec}
            if not isinstance(spec, dict) or set(spec) - {"config", "set"}:
                raise ValueError(f"domain {name!r}: a config path or a mapping with 'config' and/or 'set'")
            config = _find(spec["config"], path.parent) if spec.get("config") else None
            domains.append(Domain(str(name), config, _nest(spec.get("set"))))
        if not domains:
            raise ValueError("a compare config needs at least one domain")
        methods = list(data.get("methods") or [WHALE, REFERENCE, "harness-only", "stagewise", "fst"])
        bad = [m for m in methods if m not in METHODS]
        if bad:
            raise ValueError(f"unknown method(s) {bad}; known: {', '.join(METHODS)}")
        seeds = [int(s) for s in data.get("seeds") or [0]]
        ablation = data.get("ablation")
        if ablation:
            if ablation.get("domain") not in {d.name for d in domains}:
                raise ValueError(f"ablation domain {ablation.get('domain')!r} is not one of the domains")
            points = [(float(e), int(i)) for e, i in ablation.get("points") or []]
            if not points:
                raise ValueError("ablation needs points: [[E, I], ...]")
            ablation = {
                "domain": ablation["domain"],
                "points": points,
                "seeds": [int(s) for s in ablation.get("seeds") or seeds],
            }
        more_seeds = _more_seeds(data.get("more_seeds"), {d.name for d in domains}, methods, seeds)
        keep = str(data.get("keep_checkpoints", "all"))
        if keep not in KEEP_CHECKPOINTS:
            raise ValueError(f"keep_checkpoints: {keep!r} is not one of {', '.join(KEEP_CHECKPOINTS)}")
        record = data.get("record")
        if record is not None and (not isinstance(record, str) or not record.strip()):
            raise ValueError(f"record: {record!r} is not a folder path")
        source = {**data, **({"command_line_set": command_line} if command_line else {})}
        name = str(data.get("name") or path.stem)
        return cls(
            name,
            domains,
            methods,
            seeds,
            overrides,
            ablation,
            source,
            command_line,
            keep,
            Path(record) if record else None,  # relative to the working directory, like --out
            more_seeds,
        )

    def only_seeds(self, seeds: Sequence[int]) -> CompareConfig:
        """This grid with only ``seeds`` (the ablation's too): a subset of it, such as the one seed of every
        cell that a reproduction reruns. A seed the config does not have is an error."""
        more = [s for m in self.more_seeds for s in m["seeds"]]
        unknown = sorted(
            set(seeds) - set(self.seeds) - set((self.ablation or {}).get("seeds", [])) - set(more)
        )
        if unknown:
            raise ValueError(f"seed(s) {unknown} not in the config (seeds: {self.seeds})")
        ablation = self.ablation and {
            **self.ablation,
            "seeds": [s for s in self.ablation["seeds"] if s in seeds],
        }
        return replace(
            self,
            seeds=[s for s in self.seeds if s in seeds],
            ablation=ablation,
            more_seeds=[
                {**m, "seeds": [s for s in m["seeds"] if s in seeds]}
                for m in self.more_seeds
                if set(m["seeds"]) & set(seeds)
            ],
            source={**self.source, "command_line_seeds": list(seeds)},
        )


def _more_seeds(
    entries: Any, domains: set[str], methods: Sequence[str], seeds: Sequence[int]
) -> list[dict[str, Any]]:
    """``more_seeds:``: seeds added to some methods of a domain, e.g. where the grid's seeds leave a paired
    difference's SE too wide (docs/COMPARE.md). Each entry: ``{domain, methods (default: all), seeds}``;
    a seed of the grid itself is an error (those runs exist already)."""
    out = []
    for n, entry in enumerate(entries or []):
        where = f"more_seeds[{n}]"
        if not isinstance(entry, dict) or set(entry) - {"domain", "methods", "seeds"}:
            raise ValueError(f"{where}: a mapping with domain, methods and seeds")
        if entry.get("domain") not in domains:
            raise ValueError(f"{where}: domain {entry.get('domain')!r} is not one of the domains")
        chosen = list(entry.get("methods") or methods)
        bad = [m for m in chosen if m not in methods]
        if bad:
            raise ValueError(f"{where}: method(s) {bad} are not the config's methods")
        added = [int(s) for s in entry.get("seeds") or []]
        if not added or set(added) & set(seeds):
            raise ValueError(f"{where}: seeds must be a non-empty list of seeds the grid does not have")
        out.append({"domain": entry["domain"], "methods": chosen, "seeds": added})
    return out


def _find(name: str, here: Path) -> Path:
    """A domain config path: relative to the working directory, else to the compare config's folder."""
    for candidate in (Path(name), here / name):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"no domain config {name} (looked in . and {here})")


@dataclass
class RunSpec:
    id: str
    domain: str
    method: str
    seed: int
    point: tuple[float, int] | None  # an ablation point (E, I), else None
    config: TrainConfig
    max_unit: int  # the most rollouts one unit can cost: the budget is matched within this

    @property
    def budget(self) -> int:
        return self.config.budget_rollouts


def unit_cost(config: TrainConfig) -> int:
    """The largest unit of a run (an RSFT step or a harness iteration), as the trainer's budget check
    charges them."""
    return max(config.weight_step_cost, config.harness_iteration_cost)


def resolve(cfg: CompareConfig, domain: Domain, **fields: Any) -> TrainConfig:
    """A run's train config: the domain's config file, then ``set``, the domain's ``set``, ``--set``,
    and the run's own fields (method, seed, an ablation point)."""
    data = TrainConfig.load(domain.config).to_dict() if domain.config else {}
    for layer in (cfg.overrides, domain.overrides, cfg.command_line, _nest(fields)):
        data = merge(data, layer)
    return TrainConfig.from_dict(data)


def plan(cfg: CompareConfig) -> list[RunSpec]:
    """Every run of the grid (seed-major, so a stopped grid has whole seeds), then the runs of
    ``more_seeds`` (seed-major too), then the ablation runs. A run whose config equals an earlier one's
    (but for its name) is that run."""
    wanted: list[tuple[str, str, str, int, tuple[float, int] | None, dict[str, Any]]] = []
    for seed in cfg.seeds:
        for d in cfg.domains:
            for method in cfg.methods:
                wanted.append((f"{d.name}-{method}-s{seed}", d.name, method, seed, None, {}))
    for seed in sorted({s for m in cfg.more_seeds for s in m["seeds"]}):
        for d in cfg.domains:  # the config's order of domains and methods, as in the grid
            chosen = {
                m
                for entry in cfg.more_seeds
                if entry["domain"] == d.name and seed in entry["seeds"]
                for m in entry["methods"]
            }
            for method in (m for m in cfg.methods if m in chosen):
                wanted.append((f"{d.name}-{method}-s{seed}", d.name, method, seed, None, {}))
    if cfg.ablation:
        for seed in cfg.ablation["seeds"]:
            for e, i in cfg.ablation["points"]:
                wanted.append(
                    (
                        f"{cfg.ablation['domain']}-{WHALE}-E{e:g}-I{i}-s{seed}",
                        cfg.ablation["domain"],
                        WHALE,
                        seed,
                        (e, i),
                        {"schedule.weight_epochs": e, "schedule.harness_iterations": i},
                    )
                )
    domains = {d.name: d for d in cfg.domains}
    seen: dict[str, str] = {}
    runs: list[RunSpec] = []
    for run_id, dom, method, seed, point, extra in wanted:
        config = resolve(cfg, domains[dom], method=method, seed=seed, **extra)
        key = json.dumps({**config.to_dict(), "name": None}, sort_keys=True, default=str)
        config.name = seen.setdefault(key, run_id)
        runs.append(RunSpec(run_id, dom, method, seed, point, config, unit_cost(config)))
    budgets: dict[str, set[int]] = {}
    for r in runs:
        budgets.setdefault(r.domain, set()).add(r.budget)
    mixed = {d: sorted(b) for d, b in budgets.items() if len(b) > 1}
    if mixed:
        raise ValueError(f"the methods of a domain must share one budget_rollouts: {mixed}")
    return runs


def run_state(run_dir: Path, config: TrainConfig) -> str:
    """``new``, ``partial`` (started, not finished), ``done`` (its ledger ends with ``stop``), or
    ``stale`` (the folder holds a run of another config)."""
    saved = run_dir / "config.yaml"
    if not saved.exists():
        return "new"
    if not _same_config(yaml.safe_load(saved.read_text()), config):
        return "stale"
    ledger = run_dir / "ledger.jsonl"
    if ledger.exists() and (run_dir / "state.json").exists():
        events = read_ledger(run_dir)
        if events and events[-1]["event"] == "stop":
            return "done"
    return "partial"


def prune_checkpoints(run_dir: Path) -> list[str]:
    """Remove ``checkpoints/<version>/`` of a finished run for every version no ``eval`` event of its
    ledger scored (the resume checkpoint stays); returns the names removed."""
    evaluated = {str(e["model_version"]) for e in read_ledger(run_dir) if e["event"] == "eval"}
    removed = []
    for path in sorted((run_dir / "checkpoints").glob("*")):
        if path.is_dir() and path.name.isdigit() and path.name not in evaluated:
            shutil.rmtree(path)
            removed.append(path.name)
    return removed


def _same_config(saved: dict[str, Any], config: TrainConfig) -> bool:
    """Whether a run folder's config is ``config`` (read through ``TrainConfig``, so that a field added
    to it since, with its default, does not count as a difference)."""
    try:
        loaded = TrainConfig.from_dict(saved)
    except (ValueError, TypeError):
        return False
    normal = lambda c: json.loads(json.dumps(c.to_dict(), default=str))  # noqa: E731
    return normal(loaded) == normal(config)
