"""``compare.md``: the table in Markdown."""

from __future__ import annotations

from typing import Any

from whale_train.compare.plan import REFERENCE, WHALE
from whale_train.compare.stats import mean_sd
from whale_train.compare.verdict import account, verdict_markdown


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
    later = f"; {len(inv['postponed'])} left for a later --resume" if inv.get("postponed") else ""
    if not inv["ran"]:
        why = "--hours reached" if inv.get("postponed") else "every run had finished"
        return f" (this invocation ran nothing: {why}{later})"
    return (
        f" (this invocation: {len(inv['ran'])} runs, {_minutes(inv['wall_seconds'])} wall with {inv['jobs']} jobs"
        f"{later})"
    )


def _mean_sd_text(cell: dict[str, Any], metric: str) -> str:
    mean, sd = cell.get(f"{metric}_mean"), cell.get(f"{metric}_sd")
    return _pct(mean) + ("" if sd is None else f" ± {_pct(sd)}")


def to_markdown(table: dict[str, Any], plots: dict[str, str]) -> str:
    lines = [f"# Method comparison: {table['name']}", ""]
    inv = table.get("invocation", {})
    lines += [
        f"{len(table['domains'])} domains × {len(table['methods'])} methods × {len(table['seeds'])} seeds"
        + (f", plus the schedule ablation on {table['ablation']['domain']}" if table.get("ablation") else "")
        + "".join(
            f", plus seeds {', '.join(map(str, m['seeds']))} of {m['domain']} ({', '.join(m['methods'])})"
            for m in table.get("more_seeds") or []
        )
        + f"; {table['finished_runs']} of {table['unique_runs']} runs finished; "
        f"run time {_minutes(table['total_run_seconds'])} in all" + _invocation_text(inv) + ".",
        "",
        "Best test mean@k: the highest test evaluation of a run (mean over k samples per task, in percent), "
        "mean ± standard deviation over seeds. Rollouts to reach: the first evaluation at or above the "
        f"{REFERENCE} run's peak of the same seed, mean over seeds. Paired differences: "
        f"{WHALE} − baseline of the best test mean@k by seed, in points, with a 95% t-interval over seeds. "
        "Final: the last test evaluation. Selected: the test evaluation of the (model, harness) with the "
        "highest harness-split score (the rule never sees a test score; — when the runs recorded none).",
        "",
    ]
    verdicts = {  # a number no run recorded (selected, without eval.select_limit) has no table
        metric: v for metric, v in (table.get("verdicts") or {}).items() if any(r["n"] for r in v["rows"])
    }
    if verdicts:
        lines += ["## Verdicts", ""]
        for metric, v in verdicts.items():
            lines += [
                f"On the **{metric}** number ({v['family']} comparisons, Holm-corrected at α = {v['alpha']}; "
                f"not resolved when an SE exceeds {v['max_se_points']:.1f} points or the interval contains 0):",
                "",
                *verdict_markdown(v),
                "",
            ]
        told = account(table)
        if told:
            lines += [
                "Where the accuracy moved, per domain (from the ledgers' operator credits):",
                "",
                *told,
                "",
            ]
    for name, d in table["domains"].items():
        lines += [
            f"## {name} ({d['env']}, budget {d['budget']} rollouts, a unit costs at most {d['max_unit_rollouts']})",
            "",
            f"| method | best test mean@{d['k']} (%) | final (%) | selected (%) | seeds | "
            f"rollouts to reach {REFERENCE}'s peak | rollouts spent | total wall time |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for method, c in d["methods"].items():
            spent = mean_sd(c["rollouts"])[0]
            missing = f" (missing: {c['missing_seeds']})" if c["missing_seeds"] else ""
            lines.append(
                f"| {method} | {_mean_sd_text(c, 'best')} | {_mean_sd_text(c, 'final')} | "
                f"{_mean_sd_text(c, 'selected')} | {len(c['seeds'])}{missing} | {_reach_text(c)} | "
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
                "Where the accuracy moved (mean over seeds). On test: the change of test mean@k from one "
                "evaluation to the next, credited to the operator whose units ran in between, or to both "
                "(weight + harness + both = final − start). On D_harness: the gain the harness search "
                "measured itself, the incumbent's score at the end of each harness phase minus its rescore "
                "at the start, under the same weights (— without a harness phase).",
                "",
                "| method | RSFT steps | test gain: RSFT only (points) | harness iterations | candidates | "
                "rejected by check_harness | accepted | test gain: harness only (points) | "
                "test gain: both (points) | search gain on D_harness (points) |",
                "|---|---|---|---|---|---|---|---|---|---|",
            ]
            for method, o in ops.items():
                search = "—" if o.get("search_gain") is None else f"{100 * o['search_gain']:+.1f}"
                lines.append(
                    f"| {method} | {o['weight_steps']:.1f} | {100 * o['weight_gain']:+.1f} | "
                    f"{o['harness_iterations']:.1f} | {o['candidates']:.1f} | {o['invalid']:.1f} | "
                    f"{o['accepted']:.1f} | {100 * o['harness_gain']:+.1f} | {100 * o['both_gain']:+.1f} | "
                    f"{search} |"
                )
        if name in plots:
            lines += ["", f"![accuracy vs rollouts: {name}]({plots[name]})"]
        lines.append("")
    ab = table.get("ablation")
    if ab:
        domain = table["domains"][ab["domain"]]
        metric = ab.get("metric", "best")  # a table written before the ablation had three numbers: best
        lines += [
            f"## Schedule ablation: {WHALE} (E, I) on {ab['domain']}",
            "",
            f"| E (epochs) | I (iterations) | selected test mean@{domain['k']} (%) | best (%) | final (%) | "
            f"seeds | per seed ({metric}) | rollouts to reach {REFERENCE}'s peak | total wall time |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for p in ab["points"]:
            numbers = " | ".join(_mean_sd_text(p, m) for m in ("selected", "best", "final"))
            per = ", ".join(f"{s}: {_pct(x)}" for s, x in zip(p["seeds"], p[metric] or [], strict=True))
            lines.append(
                f"| {p['weight_epochs']:g} | {p['harness_iterations']} | {numbers} | "
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
            "over seeds; where this table has a subset of the reference's seeds, the reference's mean over the "
            "same seeds ± its SD). Per seed: this run's best minus the reference run's of the same seed, in "
            "points.",
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
