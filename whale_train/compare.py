"""``whale compare CONFIG.yaml``: the methods x domains x seeds grid at matched rollout budgets.

    whale compare configs/compare/cpu.yaml --jobs 2 [--out runs/compare/cpu] [--set eval.limit=32]

A compare config names the domains (a ``whale train`` config per domain, by path, plus overrides),
the methods, the seeds, overrides for every run, and optionally a schedule ablation of ``whale``::

    name: cpu
    domains:
      math: configs/math/base.yaml              # a path (relative to the working directory or this file)
      chess: {config: configs/chess/base.yaml, set: {tasks: "generated?difficulty=1"}}
      search: {set: {env: whale/SearchQA-v0}}   # no file: the overrides are the whole config
    methods: [whale, weight-only, harness-only, stagewise, fst]
    seeds: [0, 1, 2]
    set: {budget_rollouts: 768, eval.k: 8}     # nested mappings or dotted keys
    ablation: {domain: math, points: [[0.2, 2], [0.6, 6]]}   # (E, I) of whale; seeds: the grid's

Every run of a domain has the same config but for ``method`` and ``seed`` (and, for an ablation point,
``schedule.weight_epochs`` / ``schedule.harness_iterations``), so the methods spend the same rollout
budget. Runs with identical configs are run once. Each run is a ``whale train`` subprocess with
``OMP_NUM_THREADS=1``, ``--jobs`` of them at a time. The output folder::

    grid.yaml                  the compare config as given (and the command line's --set)
    configs/<run>.yaml         the resolved train config of every run
    runs/<run>/                the run directories (ledger, checkpoints, archive, eval, train.log)
    compare.md, compare.json   the table
    plots/                     accuracy vs rollouts per domain; the ablation's bars

Resume: a second ``whale compare`` on the same folder skips finished runs (their ledger ends with a
``stop`` event) and continues unfinished ones with ``whale train --resume``.

Placement (docs/SCALING.md): ``--gpus-per-run N`` gives every concurrent local job N GPUs of its own
(disjoint ``CUDA_VISIBLE_DEVICES``); ``--ray ADDRESS`` (or ``local``) submits each run as a Ray task
with those resources, on run directories of a shared file system; a run whose node is lost is retried
by Ray and resumes. See :mod:`whale_train.placement`.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import yaml

from whale_train import placement
from whale_train.placement import train_one
from whale_train.report import read_ledger, run_summary
from whale_train.schedule import METHODS
from whale_train.trainer import TrainConfig

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

WHALE = "whale"
REFERENCE = "weight-only"  # "rollouts to reach weight-only's peak"


# ------------------------------------------------------------------------------------------ statistics


def mean_sd(xs: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (n - 1); None where undefined."""
    n = len(xs)
    if n == 0:
        return None, None
    mean = sum(xs) / n
    if n < 2:
        return mean, None
    return mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        for aa in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t (bisection on ``t_cdf``)."""
    if not 0.0 < p < 1.0:
        raise ValueError("p must be in (0, 1)")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
        if hi - lo < 1e-12:
            break
    return (lo + hi) / 2.0


def paired_ci(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> dict[str, Any]:
    """The differences ``a[i] - b[i]`` (paired by seed): their mean and the t-interval at ``level``.
    With fewer than two pairs the interval is None."""
    if len(a) != len(b):
        raise ValueError("paired samples must have the same length")
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    mean, sd = mean_sd(diffs)
    out: dict[str, Any] = {"n": len(diffs), "diffs": diffs, "mean": mean, "sd": sd, "level": level}
    if sd is None:
        out.update(lo=None, hi=None, t=None)
        return out
    t = t_quantile(0.5 + level / 2.0, len(diffs) - 1)
    half = t * sd / math.sqrt(len(diffs))
    out.update(lo=mean - half, hi=mean + half, t=t)
    return out


def rollouts_to_reach(evals: Sequence[dict[str, Any]], target: float, eps: float = 1e-9) -> int | None:
    """The rollouts of the first evaluation whose mean reaches ``target``; None when none does."""
    for e in evals:
        if e["mean"] >= target - eps:
            return int(e["rollouts_total"])
    return None


def step_curve(evals: Sequence[dict[str, Any]], grid: Sequence[float]) -> np.ndarray:
    """A run's eval curve step-interpolated on ``grid``: at x, the mean of the last evaluation at or
    before x rollouts (NaN before the first)."""
    xs = np.array([e["rollouts_total"] for e in evals], dtype=float)
    ys = np.array([e["mean"] for e in evals], dtype=float)
    idx = np.searchsorted(xs, np.asarray(grid, dtype=float), side="right") - 1
    out = np.full(len(idx), np.nan)
    out[idx >= 0] = ys[idx[idx >= 0]]
    return out


# ------------------------------------------------------------------------------------------ config


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
                value = _merge(target[leaf], value)
        target[leaf] = value
    return out


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = (
            _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def _parse_sets(items: Sequence[str]) -> dict[str, Any]:
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"--set expects key=value, got {item!r}")
        out[key.strip()] = yaml.safe_load(value)
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

    @classmethod
    def load(cls, path: str | Path, sets: Sequence[str] = ()) -> CompareConfig:
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"no compare config {path}")
        data = yaml.safe_load(path.read_text()) or {}
        known = {"name", "domains", "methods", "seeds", "set", "ablation"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown compare key(s) {unknown}; known: {sorted(known)}")
        overrides = _nest(data.get("set"))
        command_line = _nest(_parse_sets(sets))
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
        source = {**data, **({"command_line_set": command_line} if command_line else {})}
        name = str(data.get("name") or path.stem)
        return cls(name, domains, methods, seeds, overrides, ablation, source, command_line)


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
        data = _merge(data, layer)
    return TrainConfig.from_dict(data)


def plan(cfg: CompareConfig) -> list[RunSpec]:
    """Every run of the grid (seed-major, so a stopped grid has whole seeds), then the ablation runs.
    A run whose config equals an earlier one's (but for its name) is that run."""
    wanted: list[tuple[str, str, str, int, tuple[float, int] | None, dict[str, Any]]] = []
    for seed in cfg.seeds:
        for d in cfg.domains:
            for method in cfg.methods:
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


# ------------------------------------------------------------------------------------------ running


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


def _same_config(saved: dict[str, Any], config: TrainConfig) -> bool:
    """Whether a run folder's config is ``config`` (read through ``TrainConfig``, so that a field added
    to it since, with its default, does not count as a difference)."""
    try:
        loaded = TrainConfig.from_dict(saved)
    except (ValueError, TypeError):
        return False
    normal = lambda c: json.loads(json.dumps(c.to_dict(), default=str))  # noqa: E731
    return normal(loaded) == normal(config)


class _Lock:
    """One ``whale compare`` per output folder at a time."""

    def __init__(self, out: Path):
        self.path = out / ".compare.lock"

    def __enter__(self) -> _Lock:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            pid = int(self.path.read_text().strip() or "0")
            if _alive(pid):
                raise RuntimeError(
                    f"another whale compare (pid {pid}) is writing to {self.path.parent}"
                ) from None
            self.path.unlink(missing_ok=True)
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        return self

    def __exit__(self, *exc) -> None:
        self.path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_grid(
    cfg: CompareConfig,
    out: str | Path,
    *,
    jobs: int = 1,
    log: Callable[[str], None] = print,
    train: Callable[..., int] = train_one,
    reference: dict[str, Any] | None = None,
    devices: placement.DevicePool | None = None,
    ray: placement.RayPlacement | None = None,
) -> dict[str, Any]:
    """Run (or continue) every unfinished run of the grid, then write the table and plots. Returns the
    table (``compare.json``) with ``invocation``: what this call ran, skipped and failed, and, given a
    ``reference`` table (an earlier ``compare.json``), ``reproduction``: see :func:`reproduction`.

    Placement (see :mod:`whale_train.placement`): with ``devices``, each job leases its own GPUs and
    ``train`` is called with a third argument, ``{"CUDA_VISIBLE_DEVICES": ...}``; with ``ray``, every
    run is submitted at once as a Ray task (``train`` is not used) and Ray places them."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs = plan(cfg)
    unique = {r.config.name: r for r in reversed(runs)}  # the first spec of each distinct config
    states = {name: run_state(out / "runs" / name, r.config) for name, r in unique.items()}
    stale = sorted(n for n, s in states.items() if s == "stale")
    if stale:
        raise ValueError(
            f"{out}/runs holds runs of another config: {', '.join(stale)}; remove them or choose another --out"
        )
    with _Lock(out):
        (out / "grid.yaml").write_text(yaml.safe_dump(cfg.source, sort_keys=False))
        (out / "configs").mkdir(exist_ok=True)
        todo = []
        for name in dict.fromkeys(r.config.name for r in runs):  # plan order
            path = out / "configs" / f"{name}.yaml"
            text = yaml.safe_dump(unique[name].config.to_dict(), sort_keys=False)
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
            if states[name] == "partial":
                saved = out / "runs" / name / "config.yaml"
                if saved.read_text() != text:  # the same config, written before a TrainConfig field was
                    saved.write_text(text)  # added: as this version writes it, so that --resume accepts it
            if states[name] != "done":
                todo.append(name)
        skipped = sorted(n for n, s in states.items() if s == "done")
        log(
            f"{len(unique)} runs: {len(skipped)} finished, "
            f"{sum(states[n] == 'partial' for n in todo)} to continue, {sum(states[n] == 'new' for n in todo)} to start"
            f" ({jobs} at a time)"
        )
        started = time.monotonic()
        failed: list[str] = []
        done = [0]
        lock = threading.Lock()

        def work(name: str) -> None:
            t0 = time.monotonic()
            log(f"  start {name} ({states[name]})")
            config_path, run_dir = out / "configs" / f"{name}.yaml", out / "runs" / name
            if ray is not None:
                rc = ray.run(config_path, run_dir)
            elif devices is not None:
                with devices.lease() as leased:
                    visible = ",".join(leased)
                    placement.record_placement(run_dir, via="local", devices=visible)
                    rc = train(config_path, run_dir, {"CUDA_VISIBLE_DEVICES": visible})
            else:
                rc = train(config_path, run_dir)
            with lock:
                done[0] += 1
                if rc != 0:
                    failed.append(name)
                status = "done" if rc == 0 else f"FAILED (exit {rc}; see {out / 'runs' / name / 'train.log'})"
                log(f"  [{done[0]}/{len(todo)}] {name}: {status} in {time.monotonic() - t0:.0f} s")

        if todo:
            if ray is not None:  # Ray queues the tasks its cluster cannot place yet
                jobs = len(todo)
            elif devices is not None:
                jobs = min(jobs, devices.slots)
            with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
                list(pool.map(work, todo))
        wall = time.monotonic() - started
        table = build_table(cfg, runs, out)
        table["invocation"] = {
            "ran": todo,
            "skipped": skipped,
            "failed": sorted(failed),
            "jobs": jobs,
            "wall_seconds": round(wall, 1),
        }
        if reference is not None:
            table["reproduction"] = reproduction(table, reference)
        write_table(table, out)
    return table


# ------------------------------------------------------------------------------------------ the table


def _elapsed(run_dir: Path, summary: dict[str, Any]) -> float:
    try:
        return float(json.loads((run_dir / "state.json").read_text())["elapsed"])
    except (FileNotFoundError, KeyError, json.JSONDecodeError):
        return float(summary["seconds"])


def operator_gains(summary: dict[str, Any]) -> dict[str, Any]:
    """Which operator moved a run's test accuracy, from its ledger: the change of test mean@k from one
    evaluation to the next, credited to the phase of the unit just before it (``weight_gain``,
    ``harness_gain``; they sum to the final minus the first evaluation), with the work each operator
    did: RSFT steps, harness iterations, candidates proposed, rejected before scoring (``invalid``:
    check_harness refused them) and accepted."""
    phase_of = {u["unit"]: u["phase"] for u in summary["units"]}
    gains = {"weight": 0.0, "harness": 0.0}
    evals = summary["evals"]
    for before, after in zip(evals, evals[1:], strict=False):
        phase = phase_of.get(after["unit"] - 1)
        if phase in gains:
            gains[phase] += after["mean"] - before["mean"]
    iterations = [
        u["signals"]
        for u in summary["units"]
        if u["phase"] == "harness" and u["signals"].get("kind") == "iteration"
    ]
    candidates = [c for sig in iterations for c in sig.get("candidates", [])]
    return {
        "weight_steps": sum(u["phase"] == "weight" for u in summary["units"]),
        "weight_gain": gains["weight"],
        "harness_iterations": len(iterations),
        "candidates": len(candidates),
        "invalid": sum(c.get("status") != "valid" for c in candidates),
        "accepted": sum(bool(sig.get("accepted")) for sig in iterations),
        "harness_gain": gains["harness"],
    }


def _reach_fields(cell: Sequence[tuple[RunSpec, dict[str, Any]]], peaks: dict[int, float]) -> dict[str, Any]:
    """Rollouts to reach the weight-only peak of the same seed (``peaks``), per run of ``cell``; None where
    a run never reaches it or its seed has no weight-only run. The mean is over the runs that reach it."""
    reach = [rollouts_to_reach(s["evals"], peaks[r.seed]) if r.seed in peaks else None for r, s in cell]
    reached = [x for x in reach if x is not None]
    return {
        "reach": reach,
        "reach_mean": mean_sd(reached)[0],
        "reached": len(reached),
        "reach_of": sum(r.seed in peaks for r, _ in cell),
    }


def collect(runs: Sequence[RunSpec], out: Path) -> dict[str, dict[str, Any]]:
    """The summary of every finished run, by run name (``report.run_summary`` plus wall time)."""
    found = {}
    for r in runs:
        name = r.config.name
        run_dir = out / "runs" / name
        if name in found or run_state(run_dir, r.config) != "done":
            continue
        s = run_summary(run_dir)
        found[name] = {**s, "wall_seconds": round(_elapsed(run_dir, s), 1)}
    return found


def build_table(cfg: CompareConfig, runs: Sequence[RunSpec], out: Path) -> dict[str, Any]:
    summaries = collect(runs, out)
    grid = [r for r in runs if r.point is None]
    table: dict[str, Any] = {
        "name": cfg.name,
        "methods": cfg.methods,
        "seeds": cfg.seeds,
        "domains": {},
        "runs": {},
    }
    for r in runs:
        s = summaries.get(r.config.name)
        table["runs"][r.id] = {
            "run": r.config.name,
            "domain": r.domain,
            "method": r.method,
            "seed": r.seed,
            "point": list(r.point) if r.point else None,
            "finished": s is not None,
            "budget": r.budget,
            "max_unit_rollouts": r.max_unit,
            "rollouts": s["rollouts"] if s else None,
            "best_mean": s["best_mean"] if s else None,
            "best_se": s["best_se"] if s else None,
            "best_at": s["best_at"] if s else None,
            "wall_seconds": s["wall_seconds"] if s else None,
            "evals": [{k: e[k] for k in ("rollouts_total", "mean", "se")} for e in s["evals"]] if s else [],
        }
    peaks_by_domain: dict[str, dict[int, float]] = {}
    for d in cfg.domains:
        specs = [r for r in grid if r.domain == d.name]
        k = specs[0].config.eval.k
        reference = {
            r.seed: summaries[r.config.name]["best_mean"]
            for r in specs
            if r.method == REFERENCE and r.config.name in summaries
        }
        peaks_by_domain[d.name] = reference
        methods: dict[str, Any] = {}
        for method in cfg.methods:
            cell = [
                (r, summaries[r.config.name])
                for r in specs
                if r.method == method and r.config.name in summaries
            ]
            best = [s["best_mean"] for _, s in cell]
            mean, sd = mean_sd(best)
            ops = [operator_gains(s) for _, s in cell]
            methods[method] = {
                "seeds": [r.seed for r, _ in cell],
                "missing_seeds": sorted(
                    {r.seed for r in specs if r.method == method} - {r.seed for r, _ in cell}
                ),
                "best": best,
                "best_mean": mean,
                "best_sd": sd,
                "rollouts": [s["rollouts"] for _, s in cell],
                **_reach_fields(cell, reference),
                "wall_seconds": round(sum(s["wall_seconds"] for _, s in cell), 1),
                "operators": {key: mean_sd([o[key] for o in ops])[0] for key in ops[0]} if ops else {},
            }
        paired = {}
        if WHALE in cfg.methods:
            by_seed = {
                m: dict(zip(methods[m]["seeds"], methods[m]["best"], strict=True)) for m in cfg.methods
            }
            for base in cfg.methods:
                if base == WHALE:
                    continue
                seeds = sorted(set(by_seed[WHALE]) & set(by_seed[base]))
                ci = paired_ci([by_seed[WHALE][s] for s in seeds], [by_seed[base][s] for s in seeds])
                paired[base] = {"seeds": seeds, **ci}
        table["domains"][d.name] = {
            "env": specs[0].config.env,
            "budget": specs[0].budget,
            "max_unit_rollouts": max(r.max_unit for r in specs),
            "k": k,
            "reference_peak": {str(s): v for s, v in sorted(reference.items())},
            "methods": methods,
            "paired": paired,
        }
    if cfg.ablation:
        points = []
        for e, i in cfg.ablation["points"]:
            cell = [
                (r, summaries[r.config.name])
                for r in runs
                if r.point == (e, i) and r.config.name in summaries
            ]
            best = [s["best_mean"] for _, s in cell]
            mean, sd = mean_sd(best)
            points.append(
                {
                    "weight_epochs": e,
                    "harness_iterations": i,
                    "seeds": [r.seed for r, _ in cell],
                    "best": best,
                    "best_mean": mean,
                    "best_sd": sd,
                    **_reach_fields(cell, peaks_by_domain.get(cfg.ablation["domain"], {})),
                    "wall_seconds": round(sum(s["wall_seconds"] for _, s in cell), 1),
                }
            )
        table["ablation"] = {"domain": cfg.ablation["domain"], "points": points}
    table["total_run_seconds"] = round(sum(s["wall_seconds"] for s in summaries.values()), 1)
    table["finished_runs"] = len(summaries)
    table["unique_runs"] = len({r.config.name for r in runs})
    return table


def _repro_cell(label: str, ref: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    diff = new["best_mean"] - ref["best_mean"]
    bar = ref["best_sd"] or 0.0
    ref_seed = dict(zip(ref["seeds"], ref["best"], strict=True))
    per_seed = {
        str(s): round(b - ref_seed[s], 6)
        for s, b in zip(new["seeds"], new["best"], strict=True)
        if s in ref_seed
    }
    return {
        "cell": label,
        "reference_mean": ref["best_mean"],
        "reference_sd": ref["best_sd"],
        "mean": new["best_mean"],
        "sd": new["best_sd"],
        "diff": diff,
        "within": abs(diff) <= bar + 1e-9,
        "per_seed": per_seed,
        "identical_seeds": sum(abs(d) < 1e-9 for d in per_seed.values()),
    }


def reproduction(table: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    """This grid's table against ``reference``, an earlier ``compare.json`` of the same command.

    For every (domain, method) cell and ablation point that both tables finished: the reference's best
    mean ± SD, this table's, the difference, and ``within``: this mean lies inside the reference's
    reported error bar (its mean ± its SD over seeds). ``per_seed``: the difference of the same seed's
    runs (0 everywhere when the code, the config and the machine's arithmetic are the same). Cells in
    one table only are listed in ``missing``, never compared."""
    cells, missing = [], []
    for name, d in reference.get("domains", {}).items():
        for method, ref in d["methods"].items():
            new = table["domains"].get(name, {}).get("methods", {}).get(method)
            label = f"{name} {method}"
            if new is None or new["best_mean"] is None or ref["best_mean"] is None:
                missing.append(label)
            else:
                cells.append(_repro_cell(label, ref, new))
    new_points = {
        (p["weight_epochs"], p["harness_iterations"]): p
        for p in (table.get("ablation") or {}).get("points", [])
    }
    for ref in (reference.get("ablation") or {}).get("points", []):
        e, i = ref["weight_epochs"], ref["harness_iterations"]
        label = f"{reference['ablation']['domain']} ablation (E={e:g}, I={i})"
        new = new_points.get((e, i))
        if new is None or new["best_mean"] is None or ref["best_mean"] is None:
            missing.append(label)
        else:
            cells.append(_repro_cell(label, ref, new))
    return {
        "reference": reference.get("name"),
        "cells": cells,
        "missing": missing,
        "within": sum(c["within"] for c in cells),
        "compared": len(cells),
    }


def _pct(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{100 * x:.{digits}f}"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def _reach_text(cell: dict[str, Any]) -> str:
    if not cell["reach_of"]:
        return "—"
    if not cell["reached"]:
        return "not reached"
    text = f"{cell['reach_mean']:.0f}"
    if cell["reached"] < cell["reach_of"]:
        text += f" ({cell['reached']}/{cell['reach_of']} seeds; not reached by the others)"
    return text


def _invocation_text(inv: dict[str, Any]) -> str:
    if not inv:
        return ""
    if not inv["ran"]:
        return " (this invocation ran nothing: every run had finished)"
    return f" (this invocation: {len(inv['ran'])} runs, {_minutes(inv['wall_seconds'])} wall with {inv['jobs']} jobs)"


def to_markdown(table: dict[str, Any], plots: dict[str, str]) -> str:
    lines = [f"# Method comparison: {table['name']}", ""]
    inv = table.get("invocation", {})
    lines += [
        f"{len(table['domains'])} domains × {len(table['methods'])} methods × {len(table['seeds'])} seeds"
        + (f", plus the schedule ablation on {table['ablation']['domain']}" if table.get("ablation") else "")
        + f"; {table['finished_runs']} of {table['unique_runs']} runs finished; "
        f"run time {_minutes(table['total_run_seconds'])} in all" + _invocation_text(inv) + ".",
        "",
        "Best test mean@k: the highest test evaluation of a run (mean over k samples per task, in percent), "
        "mean ± standard deviation over seeds. Rollouts to reach: the first evaluation at or above the "
        f"{REFERENCE} run's peak of the same seed, mean over seeds. Paired differences: "
        f"{WHALE} − baseline of the best test mean@k by seed, in points, with a 95% t-interval over seeds.",
        "",
    ]
    for name, d in table["domains"].items():
        lines += [
            f"## {name} ({d['env']}, budget {d['budget']} rollouts, a unit costs at most {d['max_unit_rollouts']})",
            "",
            f"| method | best test mean@{d['k']} (%) | seeds | rollouts to reach {REFERENCE}'s peak | rollouts spent | total wall time |",
            "|---|---|---|---|---|---|",
        ]
        for method, c in d["methods"].items():
            sd = "" if c["best_sd"] is None else f" ± {_pct(c['best_sd'])}"
            spent = mean_sd(c["rollouts"])[0]
            missing = f" (missing: {c['missing_seeds']})" if c["missing_seeds"] else ""
            lines.append(
                f"| {method} | {_pct(c['best_mean'])}{sd} | {len(c['seeds'])}{missing} | {_reach_text(c)} | "
                f"{'—' if spent is None else f'{spent:.0f}'} | {_minutes(c['wall_seconds'])} |"
            )
        if d["paired"]:
            lines += [
                "",
                f"| {WHALE} − baseline | mean (points) | 95% CI | seeds | per seed |",
                "|---|---|---|---|---|",
            ]
            for base, p in d["paired"].items():
                ci = "—" if p["lo"] is None else f"[{_pct(p['lo'])}, {_pct(p['hi'])}]"
                per = ", ".join(f"{s}: {_pct(x)}" for s, x in zip(p["seeds"], p["diffs"], strict=True))
                lines.append(f"| {WHALE} − {base} | {_pct(p['mean'])} | {ci} | {p['n']} | {per or '—'} |")
        ops = {m: c["operators"] for m, c in d["methods"].items() if c.get("operators")}
        if ops:
            lines += [
                "",
                "Where the accuracy moved (mean over seeds): the change of test mean@k credited to the "
                "operator whose unit preceded each evaluation (weight + harness = final − start), and "
                "what each operator did.",
                "",
                "| method | RSFT steps | weight gain (points) | harness iterations | candidates | "
                "rejected by check_harness | accepted | harness gain (points) |",
                "|---|---|---|---|---|---|---|---|",
            ]
            for method, o in ops.items():
                lines.append(
                    f"| {method} | {o['weight_steps']:.1f} | {100 * o['weight_gain']:+.1f} | "
                    f"{o['harness_iterations']:.1f} | {o['candidates']:.1f} | {o['invalid']:.1f} | "
                    f"{o['accepted']:.1f} | {100 * o['harness_gain']:+.1f} |"
                )
        if name in plots:
            lines += ["", f"![accuracy vs rollouts: {name}]({plots[name]})"]
        lines.append("")
    ab = table.get("ablation")
    if ab:
        domain = table["domains"][ab["domain"]]
        lines += [
            f"## Schedule ablation: {WHALE} (E, I) on {ab['domain']}",
            "",
            f"| E (epochs) | I (iterations) | best test mean@{domain['k']} (%) | seeds | per seed | "
            f"rollouts to reach {REFERENCE}'s peak | total wall time |",
            "|---|---|---|---|---|---|---|",
        ]
        for p in ab["points"]:
            sd = "" if p["best_sd"] is None else f" ± {_pct(p['best_sd'])}"
            per = ", ".join(f"{s}: {_pct(x)}" for s, x in zip(p["seeds"], p["best"], strict=True))
            lines.append(
                f"| {p['weight_epochs']:g} | {p['harness_iterations']} | {_pct(p['best_mean'])}{sd} | "
                f"{len(p['seeds'])} | {per or '—'} | {_reach_text(p) if 'reach_of' in p else '—'} | "
                f"{_minutes(p['wall_seconds'])} |"
            )
        if "ablation" in plots:
            lines += ["", f"![schedule ablation]({plots['ablation']})"]
        lines.append("")
    rep = table.get("reproduction")
    if rep:
        lines += [
            f"## Reproduction: against the reference table `{rep['reference']}`",
            "",
            f"{rep['within']} of {rep['compared']} cells lie within the reference's error bars (its mean ± SD "
            "over seeds). Per seed: this run's best minus the reference run's of the same seed, in points.",
            "",
            "| cell | reference (%) | this run (%) | difference (points) | within | per seed |",
            "|---|---|---|---|---|---|",
        ]
        for c in rep["cells"]:
            ref_sd = "" if c["reference_sd"] is None else f" ± {_pct(c['reference_sd'])}"
            sd = "" if c["sd"] is None else f" ± {_pct(c['sd'])}"
            per = ", ".join(f"{s}: {100 * x:+.1f}" for s, x in c["per_seed"].items())
            lines.append(
                f"| {c['cell']} | {_pct(c['reference_mean'])}{ref_sd} | {_pct(c['mean'])}{sd} | "
                f"{100 * c['diff']:+.1f} | {'yes' if c['within'] else 'no'} | {per or '—'} |"
            )
        if rep["missing"]:
            lines += ["", "Not in both tables: " + ", ".join(rep["missing"])]
        lines.append("")
    failed = inv.get("failed") if inv else None
    if failed:
        lines += [
            "Failed in this invocation (rerun `whale compare` to continue them): " + ", ".join(failed),
            "",
        ]
    return "\n".join(lines)


def plot_accuracy(table: dict[str, Any], domain: str, path: Path, points: int = 200) -> Path:
    """Test mean@k vs rollouts, one line per method: the mean over seeds of the step-interpolated eval
    curves, and a band of ± one standard deviation."""
    d = table["domains"][domain]
    grid = np.linspace(0, d["budget"], points)
    fig, ax = plt.subplots(figsize=(7, 4))
    plotted = False
    for method in d["methods"]:
        curves = [
            step_curve(r["evals"], grid)
            for r in table["runs"].values()
            if r["domain"] == domain and r["method"] == method and r["point"] is None and r["finished"]
        ]
        if not curves:
            continue
        ys = 100 * np.vstack(curves)
        mean = np.nanmean(ys, axis=0)
        (line,) = ax.plot(grid, mean, drawstyle="steps-post", label=f"{method} ({len(curves)} seeds)")
        if len(curves) > 1:
            sd = np.std(ys, axis=0, ddof=1)  # every curve starts with the evaluation at 0 rollouts
            ax.fill_between(grid, mean - sd, mean + sd, step="post", color=line.get_color(), alpha=0.15)
        plotted = True
    ax.set_xlabel("rollouts (ledger)")
    ax.set_ylabel(f"test mean@{d['k']} (%)")
    ax.set_title(f"{domain}: test accuracy vs rollouts (mean ± SD over seeds)")
    ax.grid(alpha=0.3)
    if plotted:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no finished runs yet", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_ablation(table: dict[str, Any], path: Path) -> Path:
    """Two panels per (E, I) point: best test mean@k, and rollouts to reach weight-only's peak (seeds
    that never reach it are left out of the bar and drawn at the budget as crosses)."""
    ab = table["ablation"]
    domain = table["domains"][ab["domain"]]
    labels = [f"E={p['weight_epochs']:g}\nI={p['harness_iterations']}" for p in ab["points"]]
    xs = np.arange(len(labels))
    fig, (acc, cost) = plt.subplots(1, 2, figsize=(9, 3.6))
    means = [100 * (p["best_mean"] or 0.0) for p in ab["points"]]
    sds = [100 * (p["best_sd"] or 0.0) for p in ab["points"]]
    acc.bar(xs, means, yerr=sds, capsize=4, color="#4c72b0", alpha=0.8)
    for x, p in zip(xs, ab["points"], strict=True):
        acc.scatter([x] * len(p["best"]), [100 * b for b in p["best"]], color="black", s=12, zorder=3)
    acc.set_ylabel(f"best test mean@{domain['k']} (%)")
    acc.set_title("accuracy (mean ± SD; dots: seeds)", fontsize=9)
    for x, p in zip(xs, ab["points"], strict=True):
        reach = p.get("reach", [])
        reached = [r for r in reach if r is not None]
        if reached:
            cost.bar(x, float(np.mean(reached)), color="#dd8452", alpha=0.8)
            cost.scatter([x] * len(reached), reached, color="black", s=12, zorder=3)
        missed = len(reach) - len(reached)
        if missed:
            cost.scatter([x] * missed, [domain["budget"]] * missed, color="red", marker="x", zorder=3)
    cost.set_ylabel(f"rollouts to reach {REFERENCE}'s peak")
    cost.set_title("cost (mean; dots: seeds; x: not reached)", fontsize=9)
    for ax in (acc, cost):
        ax.set_xticks(xs, labels)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"{WHALE} schedule (E, I) on {ab['domain']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_table(table: dict[str, Any], out: Path) -> Path:
    """``compare.json``, ``compare.md`` and ``plots/`` in ``out``."""
    plots_dir = out / "plots"
    plots_dir.mkdir(exist_ok=True)
    plots = {}
    for domain in table["domains"]:
        path = plot_accuracy(table, domain, plots_dir / f"accuracy_{domain}.png")
        plots[domain] = str(path.relative_to(out))
    if table.get("ablation"):
        plots["ablation"] = str(plot_ablation(table, plots_dir / "ablation.png").relative_to(out))
    table["plots"] = plots
    (out / "compare.json").write_text(json.dumps(table, indent=1))
    path = out / "compare.md"
    path.write_text(to_markdown(table, plots))
    return path


# ------------------------------------------------------------------------------------------ CLI


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "compare",
        help="run the methods x domains x seeds grid at matched budgets; the comparison table and plots",
        description="Run every (domain, method, seed) of a compare config (and its schedule ablation) as "
        "`whale train` subprocesses at the same rollout budget per domain, --jobs at a time, then write "
        "compare.md / compare.json and plots. Rerunning on the same --out skips finished runs and continues "
        "unfinished ones.",
    )
    p.add_argument("config", help="compare config (see configs/compare/)")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (each with OMP_NUM_THREADS=1)")
    p.add_argument("--out", default=None, help="output folder (default: runs/compare/<name>)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a train config field of every run (dotted for nested: eval.limit=32)",
    )
    p.add_argument(
        "--reference",
        default=None,
        metavar="COMPARE_JSON",
        help="an earlier compare.json of this grid (e.g. benchmarks/results/compare/compare.json): add a "
        "reproduction section (each cell against the reference's mean ± SD) and exit 2 if any cell lies "
        "outside it",
    )
    p.add_argument(
        "--gpus-per-run",
        type=float,
        default=0,
        metavar="N",
        help="GPUs of each run: locally, every concurrent job gets N of its own (disjoint "
        "CUDA_VISIBLE_DEVICES; --jobs is capped by the GPUs); under --ray, the num_gpus of each task",
    )
    p.add_argument(
        "--devices",
        default=None,
        metavar="0,1,...",
        help="the local GPUs to split between jobs (default: CUDA_VISIBLE_DEVICES, else every GPU)",
    )
    p.add_argument(
        "--ray",
        default=None,
        metavar="ADDRESS|local",
        help="submit each run as a Ray task to the cluster at ADDRESS (e.g. auto, ray://head:10001), or to a "
        "Ray instance started here (local, with --jobs CPUs); --out must be on a file system every node sees",
    )
    p.add_argument("--cpus-per-run", type=float, default=1.0, help="num_cpus of each Ray task (default 1)")
    p.add_argument(
        "--ray-retries",
        type=int,
        default=3,
        help="times Ray reruns a task whose worker or node died (the run resumes; default 3)",
    )
    p.add_argument("--dry-run", action="store_true", help="list the runs and their state; run nothing")
    p.set_defaults(func=cmd_compare)


def cmd_compare(args) -> int:
    from whale_train.errors import CLIError

    try:
        cfg = CompareConfig.load(args.config, args.overrides)
        runs = plan(cfg)
    except (ValueError, FileNotFoundError, yaml.YAMLError) as exc:
        raise CLIError(f"bad compare config: {exc}") from None
    if args.jobs < 1:
        raise CLIError("--jobs must be >= 1")
    out = Path(args.out or f"runs/compare/{cfg.name}")
    reference = None
    if args.reference:
        try:
            reference = json.loads(Path(args.reference).read_text())
            if not isinstance(reference, dict) or "domains" not in reference:
                raise ValueError("not a compare.json (no 'domains')")
        except (OSError, ValueError) as exc:
            raise CLIError(f"--reference {args.reference}: {exc}") from None
    if args.dry_run:
        for r in runs:
            state = run_state(out / "runs" / r.config.name, r.config)
            same = "" if r.config.name == r.id else f" = {r.config.name}"
            print(f"{r.id}{same}: {state} (budget {r.budget}, unit <= {r.max_unit})")
        return 0
    devices = ray = None
    try:
        if args.ray:
            ray = placement.RayPlacement(
                args.ray,
                cpus_per_run=args.cpus_per_run,
                gpus_per_run=args.gpus_per_run,
                max_retries=args.ray_retries,
                local_cpus=max(1, math.ceil(args.jobs * args.cpus_per_run)),
                local_gpus=len(placement.visible_devices(args.devices)) if args.gpus_per_run else 0,
            )
        elif args.gpus_per_run:
            if args.gpus_per_run != int(args.gpus_per_run):
                raise ValueError("--gpus-per-run must be a whole number without --ray")
            devices = placement.DevicePool(placement.visible_devices(args.devices), int(args.gpus_per_run))
        table = run_grid(cfg, out, jobs=args.jobs, reference=reference, devices=devices, ray=ray)
    except (ValueError, RuntimeError) as exc:
        raise CLIError(str(exc)) from None
    finally:
        if ray is not None:
            ray.close()
    inv = table["invocation"]
    print(f"wrote {out / 'compare.md'}, {out / 'compare.json'} and {out / 'plots'}")
    if inv["failed"]:
        print(f"{len(inv['failed'])} run(s) failed: {', '.join(inv['failed'])}; rerun to continue them")
        return 1
    rep = table.get("reproduction")
    if rep:
        print(f"reproduction: {rep['within']} of {rep['compared']} cells within the reference's error bars")
        outside = [c["cell"] for c in rep["cells"] if not c["within"]]
        if outside:
            print(f"outside: {', '.join(outside)} (see the reproduction section of {out / 'compare.md'})")
            return 2
    return 0
