"""The table (``compare.json``) from the finished runs' ledgers: per cell the numbers over seeds,
paired differences, operator gains, the ablation, the reproduction against a reference."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from whale_train.compare.plan import REFERENCE, WHALE, CompareConfig, RunSpec
from whale_train.compare.record import locate
from whale_train.compare.stats import mean_sd, paired_ci, rollouts_to_reach
from whale_train.compare.verdict import verdicts
from whale_train.report import run_summary


def _elapsed(run_dir: Path, summary: dict[str, Any]) -> float:
    try:
        return float(json.loads((run_dir / "state.json").read_text())["elapsed"])
    except (FileNotFoundError, KeyError, json.JSONDecodeError):
        return float(summary["seconds"])


def search_gain(units: Sequence[dict[str, Any]]) -> float | None:
    """What the harness search itself measured: over every harness phase, the incumbent's ``D_harness``
    score at the phase's end minus its rescore at the phase's start, summed, as a fraction. Both scores are
    under the same weights (no RSFT step runs inside a harness phase) and on the same ``D_harness`` tasks,
    so no weight update enters it. An accepted iteration's incumbent score is the accepted candidate's
    mean. An overlapped run's iteration (``schedule.overlap``: scored under weights newer than its phase's
    rescore) counts on its own: the accepted mean minus the incumbent it was paired with under the same
    version (``paired_with``). None when the run has no harness phase that starts with a rescore, or
    has overlapped iterations recorded without ``paired_with`` (ledgers written before it was recorded)."""
    total, seen = 0.0, False
    start = score = None
    for u in list(units) + [{"phase": None}]:
        signals = u.get("signals") or {}
        if u["phase"] == "harness" and u.get("proposal") and signals.get("kind") == "iteration":
            paired = signals.get("paired_with")
            if not paired or paired.get("mean") is None:
                return None
            if signals.get("accepted"):
                total += next(c["mean"] for c in signals["candidates"] if c["id"] == signals["incumbent"])
                total -= paired["mean"]
            seen = True
            continue
        if u["phase"] == "harness" and signals.get("kind") == "rescore":
            if start is not None:  # a rescore inside a phase: the phase before it ended
                total += score - start
            start = score = signals["candidates"][0]["mean"]
            seen = True
        elif u["phase"] == "harness" and start is not None and signals.get("accepted"):
            score = next(c["mean"] for c in signals["candidates"] if c["id"] == signals["incumbent"])
        elif u["phase"] != "harness" and start is not None:
            total += score - start
            start = score = None
    return total if seen else None


def operator_gains(summary: dict[str, Any]) -> dict[str, Any]:
    """Which operator moved a run's accuracy, from its ledger.

    On test: the change of test mean@k from one evaluation to the next, credited to the operator whose
    units ran in between (``weight_gain``, ``harness_gain``), or to ``both_gain`` when units of both ran
    there (whale's cycles are shorter than the evaluation interval, so most of its intervals are mixed);
    the three sum to the final minus the first evaluation. On ``D_harness``: ``search_gain``
    (:func:`search_gain`), the harness search's own paired measure, free of weight updates. With the work
    each operator did: RSFT steps, harness iterations, candidates proposed, rejected before scoring
    (``invalid``: check_harness refused them) and accepted."""
    phase_of = {u["unit"]: u["phase"] for u in summary["units"]}
    gains = {"weight": 0.0, "harness": 0.0, "both": 0.0}
    evals = summary["evals"]
    for before, after in zip(evals, evals[1:], strict=False):
        phases = {phase_of.get(u) for u in range(before["unit"], after["unit"])} & {"weight", "harness"}
        if phases:
            gains[phases.pop() if len(phases) == 1 else "both"] += after["mean"] - before["mean"]
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
        "both_gain": gains["both"],
        "search_gain": search_gain(summary["units"]),
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


#: The three numbers of a run: ``best``, the highest test evaluation (the paper's metric: a maximum taken over
#: evaluations on the test set itself, so biased upward); ``final``, the last evaluation; ``selected``, the
#: test evaluation of the (model, harness) that the selection rule picks from the harness-split scores
#: alone (``eval.select_limit``; see :func:`selected_eval`). None where a run did not record what it needs.
METRICS = ("best", "final", "selected")


def selected_eval(evals: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The selection rule: the evaluation whose harness-split score (``select_mean``) is highest, the
    latest of equal ones; it never looks at the test score. None when no evaluation has a harness score."""
    scored = [e for e in evals if e.get("select_mean") is not None]
    if not scored:
        return None
    return max(reversed(scored), key=lambda e: e["select_mean"])


def run_numbers(summary: dict[str, Any]) -> dict[str, Any]:
    """A finished run's three numbers (:data:`METRICS`) and the rollouts at which each was evaluated."""
    evals = summary["evals"]
    chosen = selected_eval(evals)
    return {
        "best": summary["best_mean"],
        "best_at": summary["best_at"],
        "final": evals[-1]["mean"] if evals else None,
        "final_at": evals[-1]["rollouts_total"] if evals else None,
        "selected": chosen["mean"] if chosen else None,
        "selected_at": chosen["rollouts_total"] if chosen else None,
        "selected_harness_score": chosen["select_mean"] if chosen else None,
    }


def collect(runs: Sequence[RunSpec], out: Path, record: Path | None = None) -> dict[str, dict[str, Any]]:
    """The summary of every finished run, by run name (``report.run_summary`` plus wall time), from its
    folder in ``out`` or, where it finished only there, from the grid's ``record``."""
    found = {}
    for r in runs:
        name = r.config.name
        if name in found:
            continue
        state, run_dir = locate(out, record, r.config)
        if state != "done":
            continue
        s = run_summary(run_dir)
        found[name] = {**s, "wall_seconds": round(_elapsed(run_dir, s), 1)}
    return found


def build_table(cfg: CompareConfig, runs: Sequence[RunSpec], out: Path) -> dict[str, Any]:
    summaries = collect(runs, out, cfg.record)
    grid = [r for r in runs if r.point is None]
    table: dict[str, Any] = {
        "name": cfg.name,
        "methods": cfg.methods,
        "seeds": cfg.seeds,
        "more_seeds": cfg.more_seeds,
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
            **({k: v for k, v in run_numbers(s).items() if k not in ("best", "best_at")} if s else {}),
            "wall_seconds": s["wall_seconds"] if s else None,
            "evals": [
                {k: e.get(k) for k in ("rollouts_total", "mean", "se", "select_mean") if k in e}
                for e in s["evals"]
            ]
            if s
            else [],
        }
    peaks_by_domain: dict[str, dict[int, float]] = {}
    for d in cfg.domains:
        specs = [r for r in grid if r.domain == d.name]
        if not specs:  # a subset of the grid (``--seeds``) with no run of this domain
            continue
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
            numbers = [run_numbers(s) for _, s in cell]
            reach = _reach_fields(cell, reference)
            methods[method] = {
                "seeds": [r.seed for r, _ in cell],
                "missing_seeds": sorted(
                    {r.seed for r in specs if r.method == method} - {r.seed for r, _ in cell}
                ),
                "best": best,
                "best_mean": mean,
                "best_sd": sd,
                **_metric_fields(numbers),
                "rollouts": [s["rollouts"] for _, s in cell],
                **reach,
                "wall_seconds": round(sum(s["wall_seconds"] for _, s in cell), 1),
                # None (no harness phase: search_gain of weight-only) is left out of a mean
                "operators": {key: mean_sd([o[key] for o in ops if o[key] is not None])[0] for key in ops[0]}
                if ops
                else {},
                # what the verdicts pair by seed: the three numbers, rollouts to reach weight-only's peak
                # (None: not reached), where the run's own peak was, and each operator's gain
                "per_seed": {
                    str(r.seed): {
                        **{m: n[m] for m in METRICS},
                        "best_at": n["best_at"],
                        "reach": x,
                        "weight_gain": o["weight_gain"],
                        "harness_gain": o["harness_gain"],
                        "search_gain": o["search_gain"],
                    }
                    for (r, _), n, x, o in zip(cell, numbers, reach["reach"], ops, strict=True)
                },
            }
        paired_by = {metric: _paired(methods, cfg.methods, metric) for metric in METRICS}
        table["domains"][d.name] = {
            "env": specs[0].config.env,
            "budget": specs[0].budget,
            "max_unit_rollouts": max(r.max_unit for r in specs),
            "k": k,
            "reference_peak": {str(s): v for s, v in sorted(reference.items())},
            "methods": methods,
            "paired": paired_by["best"],  # the paper's metric; every metric's in paired_by_metric
            "paired_by_metric": paired_by,
        }
    if cfg.ablation and cfg.ablation["domain"] in table["domains"] and any(r.point for r in runs):
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
                    **_metric_fields([run_numbers(s) for _, s in cell]),
                    **_reach_fields(cell, peaks_by_domain.get(cfg.ablation["domain"], {})),
                    "wall_seconds": round(sum(s["wall_seconds"] for _, s in cell), 1),
                }
            )
        # the number the ablation's per-seed column and plot show: the selected one, where every run has it
        shown = "selected" if all(p["selected"] is not None for p in points if p["seeds"]) else "best"
        table["ablation"] = {"domain": cfg.ablation["domain"], "metric": shown, "points": points}
    # the selected number first: it is the one no test score chose; best is the paper's metric
    table["verdicts"] = {metric: verdicts(table, metric) for metric in ("selected", "best", "final")}
    table["total_run_seconds"] = round(sum(s["wall_seconds"] for s in summaries.values()), 1)
    table["finished_runs"] = len(summaries)
    table["unique_runs"] = len({r.config.name for r in runs})
    return table


def _metric_fields(numbers: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``final`` / ``selected``: the per-seed values and their mean ± SD over seeds (``best`` has its own
    fields); a metric some run lacks (no harness-split scores) is None throughout."""
    out: dict[str, Any] = {}
    for metric in ("final", "selected"):
        values = [n[metric] for n in numbers]
        complete = bool(values) and all(v is not None for v in values)
        mean, sd = mean_sd(values) if complete else (None, None)
        out.update({metric: values if complete else None, f"{metric}_mean": mean, f"{metric}_sd": sd})
    return out


def _paired(methods: dict[str, Any], names: Sequence[str], metric: str) -> dict[str, Any]:
    """whale − baseline of ``metric`` paired by seed, for every other method (empty without whale)."""
    if WHALE not in names:
        return {}

    def by_seed(method: str) -> dict[int, float]:
        cell = methods[method]
        return {int(s): v[metric] for s, v in cell["per_seed"].items() if v[metric] is not None}

    ours, paired = by_seed(WHALE), {}
    for base in names:
        if base == WHALE:
            continue
        theirs = by_seed(base)
        seeds = sorted(set(ours) & set(theirs))
        paired[base] = {"seeds": seeds, **paired_ci([ours[s] for s in seeds], [theirs[s] for s in seeds])}
    return paired


def _repro_cell(label: str, ref: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    ref_seed = dict(zip(ref["seeds"], ref["best"], strict=True))
    ref_mean, compared_seeds = ref["best_mean"], list(ref["seeds"])
    if set(new["seeds"]) < set(ref_seed):  # a subset of the seeds: against the reference's same seeds
        compared_seeds = list(new["seeds"])
        ref_mean = sum(ref_seed[s] for s in compared_seeds) / len(compared_seeds)
    diff = new["best_mean"] - ref_mean
    bar = ref["best_sd"] or 0.0
    per_seed = {
        str(s): round(b - ref_seed[s], 6)
        for s, b in zip(new["seeds"], new["best"], strict=True)
        if s in ref_seed
    }
    return {
        "cell": label,
        "reference_mean": ref_mean,
        "reference_seeds": compared_seeds,
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
    reported error bar (its mean ± its SD over seeds). A reproduction of a subset of the reference's seeds
    (``--seeds``) is held against the reference's mean over the same seeds (``reference_seeds``), with
    the same bar: one seed of five lies outside its cell's mean ± SD about a third of the time. ``per_seed``: the difference of the same seed's
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
