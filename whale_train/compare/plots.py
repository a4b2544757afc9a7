"""The plots of ``whale compare``: accuracy vs rollouts per domain, the schedule ablation."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from whale_train.compare.plan import REFERENCE, WHALE
from whale_train.report import pyplot


def step_curve(evals: Sequence[dict[str, Any]], grid: Sequence[float]) -> np.ndarray:
    """A run's eval curve step-interpolated on ``grid``: at x, the mean of the last evaluation at or
    before x rollouts (NaN before the first)."""
    xs = np.array([e["rollouts_total"] for e in evals], dtype=float)
    ys = np.array([e["mean"] for e in evals], dtype=float)
    idx = np.searchsorted(xs, np.asarray(grid, dtype=float), side="right") - 1
    out = np.full(len(idx), np.nan)
    out[idx >= 0] = ys[idx[idx >= 0]]
    return out


def plot_accuracy(table: dict[str, Any], domain: str, path: Path, points: int = 200) -> Path:
    """Test mean@k vs rollouts, one line per method: the mean over seeds of the step-interpolated eval
    curves, and a band of ± one standard deviation."""
    d = table["domains"][domain]
    grid = np.linspace(0, d["budget"], points)
    plt = pyplot()
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
    """Two panels per (E, I) point: the ablation's number (the selected test mean@k where every run has
    one, else the best), and rollouts to reach weight-only's peak (seeds that never reach it are left out
    of the bar and drawn at the budget as crosses)."""
    ab = table["ablation"]
    metric = ab.get("metric", "best")
    domain = table["domains"][ab["domain"]]
    labels = [f"E={p['weight_epochs']:g}\nI={p['harness_iterations']}" for p in ab["points"]]
    xs = np.arange(len(labels))
    plt = pyplot()
    fig, (acc, cost) = plt.subplots(1, 2, figsize=(9, 3.6))
    means = [100 * (p[f"{metric}_mean"] or 0.0) for p in ab["points"]]
    sds = [100 * (p[f"{metric}_sd"] or 0.0) for p in ab["points"]]
    acc.bar(xs, means, yerr=sds, capsize=4, color="#4c72b0", alpha=0.8)
    for x, p in zip(xs, ab["points"], strict=True):
        values = p[metric] or []  # a point no seed of which has finished has none
        acc.scatter([x] * len(values), [100 * v for v in values], color="black", s=12, zorder=3)
    acc.set_ylabel(f"{metric} test mean@{domain['k']} (%)")
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
