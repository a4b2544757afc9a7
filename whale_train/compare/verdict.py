"""The paper's claims as paired tests on ``compare.json``, and a verdict for each.

The claims (docs/COMPARE.md, "Statistics"):

1. WHALE beats weight-only, harness-only and Fast-Slow Training (FST): per domain, whale − baseline of a
   run's number (:data:`~whale_train.compare.table.METRICS`), in points.
2. Harness search reaches weight-only's peak with far fewer rollouts (search QA): per seed, the rollouts at
   which the weight-only run reached its own peak minus the rollouts at which harness-only first reached
   it (a run that never does counts as the whole budget), in rollouts.
3. On math, harness search helps only after a weight update: per seed, the gain stagewise's harness
   search measured in its harness phase (after its weight phase) minus the gain harness-only's measured
   (on the frozen model), both on ``D_harness`` (``search_gain``; the test evaluations cannot separate
   it: the one after stagewise's switch also scores weight steps; docs/COMPARE.md, amendment of
   2026-12-02), in points.
4. Small interleaved updates beat stagewise: per domain, whale − stagewise in accuracy (points) and
   stagewise − whale in rollouts to reach weight-only's peak (rollouts).

Every comparison is a paired t-test over seeds (the same seed: the same tasks, sample seeds and test
tasks for every method). The family of all comparisons of one metric is corrected with Holm's method
(:func:`~whale_train.compare.stats.holm`); each interval is at the level Holm tests it at. The verdict:

- **not resolved** when fewer than 2 seeds pair, when a difference in points has an SE above
  ``max_se`` (1.5 points), or when the corrected interval contains 0;
- **holds** when the interval lies above 0 (the claimed direction), **does not hold** when below.

``excludes_paper_effect`` says, for the rows in points, whether the interval's upper end lies below the
smallest effect the paper reports for that claim (``PAPER_EFFECT``): a resolved "WHALE is not 4 points
better" even when the verdict is "not resolved" because the interval contains 0.
"""

from __future__ import annotations

import math
from typing import Any

from whale_train.compare.plan import REFERENCE, WHALE
from whale_train.compare.stats import holm, paired_ci, t_quantile

ALPHA = 0.05
MAX_SE = 0.015  # 1.5 points: above it a difference in points is not resolved
#: the smallest effect the paper reports per claim, in the claim's unit (fractions for points)
PAPER_EFFECT = {1: 0.0415}
BASELINES = ("weight-only", "harness-only", "fst")
STAGEWISE = "stagewise"
HARNESS_ONLY = "harness-only"
CLAIM2_DOMAIN = "search"
CLAIM3_DOMAIN = "math"

CLAIM_TEXT = {
    1: "WHALE beats weight-only, harness-only and FST",
    2: "harness search reaches weight-only's peak with fewer rollouts (search QA)",
    3: "on math, harness search helps only after a weight update",
    4: "small interleaved updates beat stagewise (accuracy, rollout cost)",
}


def _seeds(domain: dict[str, Any], method: str) -> dict[str, dict[str, Any]]:
    return (domain["methods"].get(method) or {}).get("per_seed", {})


def _pair(
    a: dict[str, float | None], b: dict[str, float | None]
) -> tuple[list[str], list[float], list[float]]:
    seeds = sorted((s for s in set(a) & set(b) if a[s] is not None and b[s] is not None), key=int)
    return seeds, [a[s] for s in seeds], [b[s] for s in seeds]


def _field(domain: dict[str, Any], method: str, key: str) -> dict[str, Any]:
    """``key`` of each seed's run of ``method``."""
    return {s: v[key] for s, v in _seeds(domain, method).items()}


def _reach(domain: dict[str, Any], method: str) -> dict[str, Any]:
    """Each seed's rollouts to reach weight-only's peak; a run that never reaches it counts as the budget.
    A seed without a finished weight-only run (seeds added to some methods only) has no peak: left out."""
    peaks = domain.get("reference_peak")
    return {
        s: domain["budget"] if v["reach"] is None else v["reach"]
        for s, v in _seeds(domain, method).items()
        if peaks is None or s in peaks
    }


def comparisons(table: dict[str, Any], metric: str = "selected") -> list[dict[str, Any]]:
    """Every comparison the grid in ``table`` can make, each with its paired differences by seed."""
    rows: list[dict[str, Any]] = []

    def add(claim: int, domain: str, label: str, unit: str, a: dict, b: dict) -> None:
        seeds, xs, ys = _pair(a, b)
        rows.append(
            {"claim": claim, "domain": domain, "comparison": label, "unit": unit, "seeds": seeds}
            | paired_ci(xs, ys)
        )

    for name, d in table["domains"].items():
        methods = d["methods"]
        if WHALE not in methods:
            continue
        for base in BASELINES:
            if base in methods:
                add(1, name, f"{WHALE} − {base}", "points", _field(d, WHALE, metric), _field(d, base, metric))
        if name == CLAIM2_DOMAIN and REFERENCE in methods and HARNESS_ONLY in methods:
            label = f"{REFERENCE} at its peak − {HARNESS_ONLY} to reach it"
            add(2, name, label, "rollouts", _field(d, REFERENCE, "best_at"), _reach(d, HARNESS_ONLY))
        if name == CLAIM3_DOMAIN and STAGEWISE in methods and HARNESS_ONLY in methods:
            label = f"harness search's gain on D_harness: {STAGEWISE} − {HARNESS_ONLY}"
            add(
                3,
                name,
                label,
                "points",
                _field(d, STAGEWISE, "search_gain"),
                _field(d, HARNESS_ONLY, "search_gain"),
            )
        if STAGEWISE in methods:
            add(
                4,
                name,
                f"{WHALE} − {STAGEWISE}",
                "points",
                _field(d, WHALE, metric),
                _field(d, STAGEWISE, metric),
            )
            if REFERENCE in methods:
                label = f"rollouts to {REFERENCE}'s peak: {STAGEWISE} − {WHALE}"
                add(4, name, label, "rollouts", _reach(d, STAGEWISE), _reach(d, WHALE))
    return rows


def verdicts(
    table: dict[str, Any], metric: str = "selected", *, alpha: float = ALPHA, max_se: float = MAX_SE
) -> dict[str, Any]:
    """The comparisons of ``metric``, Holm-corrected as one family, each with its verdict and reason."""
    rows = comparisons(table, metric)
    corrected = holm([r["p"] for r in rows], alpha)
    for r, c in zip(rows, corrected, strict=True):
        r.update(p_holm=c["p_adjusted"], ci_level=c["level"])
        if r["se"] is None or c["level"] is None:
            r.update(lo_holm=None, hi_holm=None, verdict="not resolved", reason=f"{r['n']} paired seed(s)")
            continue
        half = t_quantile(0.5 + c["level"] / 2.0, r["n"] - 1) * r["se"]
        lo, hi = r["mean"] - half, r["mean"] + half
        r.update(lo_holm=lo, hi_holm=hi)
        if r["unit"] == "points":  # the seeds at which this spread would give an SE of max_se
            r["seeds_for_max_se"] = max(2, math.ceil((r["sd"] / max_se) ** 2))
        if r["unit"] == "points" and r["se"] > max_se:
            r.update(verdict="not resolved", reason=f"SE {100 * r['se']:.2f} > {100 * max_se:.2f} points")
        elif lo <= 0 <= hi:
            r.update(verdict="not resolved", reason="the corrected interval contains 0")
        elif lo > 0:
            r.update(verdict="holds", reason="the corrected interval lies above 0")
        else:
            r.update(verdict="does not hold", reason="the corrected interval lies below 0")
        effect = PAPER_EFFECT.get(r["claim"])
        if effect is not None and r["unit"] == "points":
            r["excludes_paper_effect"] = hi < effect
    return {
        "metric": metric,
        "alpha": alpha,
        "max_se_points": 100 * max_se,
        "family": len(rows),
        "rows": rows,
    }


def _num(row: dict[str, Any], x: float | None) -> str:
    if x is None:
        return "—"
    return f"{100 * x:+.1f}" if row["unit"] == "points" else f"{x:+.0f}"


def verdict_markdown(v: dict[str, Any]) -> list[str]:
    """The verdict table README carries: one row per comparison."""
    lines = [
        "| claim | domain | comparison | mean difference | SE | Holm-corrected interval | p (Holm) | seeds | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in v["rows"]:
        unit = "points" if r["unit"] == "points" else "rollouts"
        se = "—" if r["se"] is None else (f"{100 * r['se']:.1f}" if unit == "points" else f"{r['se']:.0f}")
        ci = (
            "—"
            if r.get("lo_holm") is None
            else f"[{_num(r, r['lo_holm'])}, {_num(r, r['hi_holm'])}] ({100 * r['ci_level']:.2f}%)"
        )
        p = "—" if r["p_holm"] is None else f"{r['p_holm']:.3f}"
        note = " (excludes the paper's +4.15)" if r.get("excludes_paper_effect") else ""
        if r["reason"].startswith("SE "):
            note += f" (an SE of {v['max_se_points']:.1f} needs about {r['seeds_for_max_se']} seeds)"
        lines.append(
            f"| {r['claim']} | {r['domain']} | {r['comparison']} ({unit}) | {_num(r, r['mean'])} | {se} | {ci} | "
            f"{p} | {r['n']} | **{r['verdict']}**{note} |"
        )
    return lines


def account(table: dict[str, Any]) -> list[str]:
    """Per domain, where each method's accuracy moved, from the ledgers' operator credits: the sentences
    of the traces' account that numbers can fill (the why of each is for the reader of the traces)."""
    lines = []
    for name, d in table["domains"].items():
        parts = []
        for method, c in d["methods"].items():
            o = c.get("operators") or {}
            if not o:
                continue
            total = o["weight_gain"] + o["harness_gain"] + o["both_gain"]
            text = (
                f"{method}: test {100 * total:+.1f} points (intervals of RSFT steps only "
                f"{100 * o['weight_gain']:+.1f}, of harness iterations only {100 * o['harness_gain']:+.1f}, "
                f"of both {100 * o['both_gain']:+.1f})"
            )
            if o["weight_steps"]:
                text += f"; {o['weight_steps']:.1f} RSFT steps"
            if o["harness_iterations"]:
                text += (
                    f"; {o['harness_iterations']:.1f} harness iterations ({o['accepted']:.1f} accepted of "
                    f"{o['candidates']:.1f} candidates, {o['invalid']:.1f} rejected by check_harness)"
                )
                if o.get("search_gain") is not None:
                    text += f" that gained {100 * o['search_gain']:+.1f} points on D_harness"
            parts.append(text)
        if parts:
            lines.append(f"- **{name}** (mean over seeds) — " + "; ".join(parts) + ".")
    return lines
