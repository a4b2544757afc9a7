"""``whale report RUN_DIR...``: a results table and plots from run directories.

Writes ``report.md`` and ``plots/`` (PNG): test mean@k against rollouts with one line per run, the
phase timeline of each run (weight phases and harness phases shaded on the rollout axis), and the
harness lineage of each run's archive (candidates, parents, accepted incumbents). Runs with lanes
(``schedule.overlap``, or an injected proposer latency) also get the two lanes against wall-clock
(the accelerator's units and evaluations, the proposer's work, the accelerator's waits for it) and a
table of what the overlap is measured by (``whale_train.lanes.lane_metrics``).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from whale_train.lanes import lane_intervals, lane_metrics


@functools.cache
def pyplot():
    """matplotlib's pyplot on the Agg backend, imported at the first plot (here and in
    :mod:`whale_train.compare.plots`): about half a second that every ``whale`` command importing these
    modules (``whale train``, ``whale compare``) would otherwise pay, with ``--no-report`` too. Once per
    process, as the import-time switch was: switching again would close a caller's open figures."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def read_ledger(run_dir: Path) -> list[dict[str, Any]]:
    """The ledger's events; a line that is not JSON is a ValueError naming the file and the line."""
    path = Path(run_dir) / "ledger.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no ledger.jsonl)")
    events = []
    for line_no, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"{path}:{line_no}: not a JSON line ({exc.msg}); a killed run leaves one: "
                f"`whale train --out {run_dir} --resume` repairs and continues it"
            ) from None
    return events


def run_summary(run_dir: Path) -> dict[str, Any]:
    import yaml

    events = read_ledger(run_dir)
    config = yaml.safe_load((Path(run_dir) / "config.yaml").read_text(encoding="utf-8")) or {}
    state_path = Path(run_dir) / "state.json"
    state = json.loads(state_path.read_text(encoding="utf-8")) if state_path.exists() else {}
    evals = [e for e in events if e["event"] == "eval"]
    units = [e for e in events if e["event"] == "unit"]
    best = max(evals, key=lambda e: e["mean"]) if evals else None
    stop = next((e for e in events if e["event"] == "stop"), None)
    return {
        "name": Path(run_dir).name,
        "method": config.get("method"),
        "env": config.get("env"),
        "seed": config.get("seed"),
        "rollouts": units[-1]["rollouts_total"] if units else 0,
        "budget": config.get("budget_rollouts"),
        "weight_steps": sum(u["phase"] == "weight" for u in units),
        "harness_iterations": sum(u["phase"] == "harness" for u in units),
        "start_mean": evals[0]["mean"] if evals else None,
        "best_mean": best["mean"] if best else None,
        "best_se": best["se"] if best else None,
        "best_at": best["rollouts_total"] if best else None,
        "final_mean": evals[-1]["mean"] if evals else None,
        "isolation": next((e.get("isolation") for e in events if e["event"] == "start"), None),
        "finished": stop is not None,
        "stop_reason": stop["reason"] if stop else "",
        # the run's wall time as the console printed it (units, evaluations, start-up of every session);
        # the sum of the units' own seconds when the state has none
        "seconds": round(float(state.get("elapsed") or sum(u.get("seconds", 0) for u in units)), 1),
        "eval_limit": (config.get("eval") or {}).get("limit"),
        "eval_k": (config.get("eval") or {}).get("k"),
        "switches": [e for e in events if e["event"] == "switch"],
        "evals": evals,
        "units": units,
        "lanes": lane_metrics(events),
        "lane_intervals": lane_intervals(events),
    }


def data_source_table(summaries: list[dict[str, Any]]) -> list[str]:
    """Markdown lines: each run's first and last test mean per data source (Search-R1's seven benchmarks,
    aime2024/2025, ...), when its evaluations recorded any; [] otherwise."""
    names = sorted({n for s in summaries for e in s["evals"] for n in e.get("by_data_source", {})})
    if not names:
        return []
    names = [n for n in names if n != "average"] + (["average"] if "average" in names else [])
    lines = [
        "Test mean@k by data source, first → last evaluation:",
        "",
        "| run | " + " | ".join(names) + " |",
        "|" + "---|" * (len(names) + 1),
    ]
    for s in summaries:
        first = s["evals"][0].get("by_data_source", {}) if s["evals"] else {}
        last = s["evals"][-1].get("by_data_source", {}) if s["evals"] else {}
        cells = [f"{_pct(first.get(n))} → {_pct(last.get(n))}" for n in names]
        lines.append(f"| {s['name']} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}"


def plot_accuracy(summaries: list[dict[str, Any]], path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for s in summaries:
        xs = [e["rollouts_total"] for e in s["evals"]]
        ys = [100 * e["mean"] for e in s["evals"]]
        err = [100 * e["se"] for e in s["evals"]]
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=2, label=f"{s['name']} ({s['method']})")
    ax.set_xlabel("rollouts (ledger)")
    ax.set_ylabel("test mean@k (%)")
    ax.set_title("Test accuracy vs rollouts")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    note = eval_note(summaries)
    if note:
        fig.text(0.01, 0.01, note, fontsize=7, color="#a00")
        fig.tight_layout(rect=(0, 0.05, 1, 1))
    else:
        fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def eval_note(summaries: list[dict[str, Any]]) -> str:
    """A warning when the runs' test evaluations differ (tasks or k), so their curves do not compare."""
    settings = {(s.get("eval_limit"), s.get("eval_k")) for s in summaries}
    if len(settings) <= 1:
        return ""
    each = ", ".join(f"{s['name']}: {s.get('eval_limit')} tasks × k={s.get('eval_k')}" for s in summaries)
    return f"not comparable: test evaluations differ ({each})"


def plot_timeline(summaries: list[dict[str, Any]], path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 1.3 + 0.5 * len(summaries)))
    colors = {"weight": "#4c72b0", "harness": "#dd8452"}
    for row, s in enumerate(summaries):
        start = 0
        for u in s["units"]:
            end = u["rollouts_total"]
            ax.barh(row, end - start, left=start, color=colors[u["phase"]], edgecolor="white", linewidth=0.3)
            start = end
    ax.set_yticks(range(len(summaries)), [s["name"] for s in summaries])
    ax.set_xlabel("rollouts")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    # the legend sits above the axes, where it cannot cover a bar
    ax.legend(
        handles,
        ["weight phase (RSFT)", "harness phase (search)"],
        fontsize=8,
        loc="lower center",
        bbox_to_anchor=(0.5, 1.0),
        ncol=2,
        frameon=False,
    )
    ax.set_title("Phase timeline", pad=22)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


LANE_COLORS = {"weight": "#4c72b0", "harness": "#dd8452", "eval": "#999999", "proposer": "#55a868"}


def plot_lanes(summaries: list[dict[str, Any]], path: Path) -> Path | None:
    """Two rows per run with lanes, against wall-clock: the accelerator lane (RSFT steps, harness scoring
    and re-scoring, evaluations; its waits for the proposer hatched) and the proposer lane (each
    iteration's proposer, from its request to its reply). None when no run has lane timings."""
    runs = [s for s in summaries if s["lanes"]]
    if not runs:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.9 * len(runs)))
    labels = []
    for row, s in enumerate(runs):
        lanes = s["lane_intervals"]
        y_acc, y_prop = 2 * row + 1, 2 * row
        for a, b, what in lanes["accelerator"]:
            kind = "weight" if what == "weight" else "eval" if what == "eval" else "harness"
            ax.barh(y_acc, b - a, left=a, color=LANE_COLORS[kind], edgecolor="white", linewidth=0.3)
        for a, b, _ in lanes["wait"]:
            ax.barh(y_acc, b - a, left=a, color="none", edgecolor="#c44e52", hatch="///", linewidth=0.5)
        for a, b, _ in lanes["proposer"]:
            ax.barh(y_prop, b - a, left=a, color=LANE_COLORS["proposer"], edgecolor="white", linewidth=0.3)
        labels += [f"{s['name']}: proposer", f"{s['name']}: accelerator"]
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_xlabel("wall-clock (s since the run started)")
    names = ["RSFT step", "harness scoring", "evaluation", "proposer at work", "waiting for the proposer"]
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in LANE_COLORS.values()]
    handles.append(plt.Rectangle((0, 0), 1, 1, facecolor="none", edgecolor="#c44e52", hatch="///"))
    ax.legend(
        handles, names, fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, frameon=False
    )
    ax.set_title("Lanes against wall-clock", pad=34)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def lanes_table(summaries: list[dict[str, Any]]) -> list[str]:
    """The overlap's measurements per run with lanes (nothing without any)."""
    runs = [s for s in summaries if s["lanes"]]
    if not runs:
        return []
    lines = [
        "| run | accelerator idle | waiting for the proposer | idle over full cycles | wall s per cycle | "
        "version gap (mean / max) |",
        "|" + "---|" * 6,
    ]
    for s in runs:
        m = s["lanes"]
        steady = m.get("steady_idle_share")
        gap = "—" if m["mean_version_gap"] is None else f"{m['mean_version_gap']:g} / {m['max_version_gap']}"
        lines.append(
            f"| {s['name']} | {100 * m['accelerator_idle_share']:.1f}% | {100 * m['proposer_wait_share']:.1f}% | "
            f"{'—' if steady is None else f'{100 * steady:.1f}%'} | {m['wall_per_cycle'] or '—'} | {gap} |"
        )
    return [*lines, ""]


def accepted_ids(archive: Path) -> set[str]:
    """Candidates the search accepted at some point (an iteration or rescore record names it incumbent
    with ``accepted``), and the seed, the first incumbent."""
    ids: set[str] = set()
    for sub in ("iterations", "rescores"):
        for path in (archive / "search" / sub).glob("*.json"):
            try:
                record = json.loads(path.read_text(encoding="utf-8"))
            except json.JSONDecodeError:
                continue
            if record.get("accepted") and record.get("incumbent"):
                ids.add(record["incumbent"])
    return ids


def lineage(run_dir: Path) -> list[dict[str, Any]]:
    """The archive's candidates: id, parents, status, best score, accepted (meta.json and the search records)."""
    rows = []
    accepted = accepted_ids(Path(run_dir) / "archive")
    for meta_path in sorted((Path(run_dir) / "archive").glob("*/meta.json")):
        meta = json.loads(meta_path.read_text())
        scores = []
        for ev in sorted((meta_path.parent / "evals").glob("*.json")):
            try:
                scores.append(json.loads(ev.read_text()).get("mean"))
            except json.JSONDecodeError:
                continue
        rows.append(
            {
                "id": meta.get("id", meta_path.parent.name),
                "parents": meta.get("parents") or ([meta["parent"]] if meta.get("parent") else []),
                "status": meta.get("status", ""),
                "accepted": bool(meta.get("accepted")) or meta.get("id", meta_path.parent.name) in accepted,
                "seed": not (meta.get("parents") or meta.get("parent")),
                "hypothesis": meta.get("hypothesis", ""),
                "score": max((x for x in scores if x is not None), default=None),
            }
        )
    return rows


def plot_lineage(rows: list[dict[str, Any]], path: Path, title: str) -> Path | None:
    if not rows:
        return None
    depth: dict[str, int] = {}
    for r in rows:
        depth[r["id"]] = 1 + max((depth.get(p, 0) for p in r["parents"]), default=-1)
    by_depth: dict[int, list[str]] = {}
    for r in rows:
        by_depth.setdefault(depth[r["id"]], []).append(r["id"])
    pos = {cid: (d, i - (len(ids) - 1) / 2) for d, ids in by_depth.items() for i, cid in enumerate(ids)}
    plt = pyplot()
    fig, ax = plt.subplots(
        figsize=(max(6.5, 1.8 * len(by_depth)), max(3, 0.6 * max(len(v) for v in by_depth.values())))
    )
    for r in rows:
        for p in r["parents"]:
            if p in pos:
                ax.plot(*zip(pos[p], pos[r["id"]], strict=True), color="#999", lw=0.8, zorder=1)
    for r in rows:
        x, y = pos[r["id"]]
        if r["accepted"]:
            color = "#2ca02c"
        elif r["seed"]:
            color = "#7f7f7f"
        elif r["status"] in ("failed", "invalid", "rejected"):
            color = "#d62728"
        else:
            color = "#1f77b4"
        ax.scatter([x], [y], s=80, color=color, zorder=2)
        label = r["id"] if r["score"] is None else f"{r['id']} {100 * r['score']:.0f}%"
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(6, 4), fontsize=7)
    ax.set_xlabel("generation")
    ax.set_xticks(sorted(by_depth))  # generations are whole numbers
    ax.set_xlim(min(by_depth) - 0.4, max(by_depth) + 0.9)  # room for the labels right of the last nodes
    ax.set_yticks([])
    ax.margins(y=0.25)  # the labels above the top and bottom nodes stay inside the frame
    ax.set_title(title, fontsize=10)
    legend = [("accepted", "#2ca02c"), ("seed", "#7f7f7f"), ("scored", "#1f77b4"), ("rejected", "#d62728")]
    ax.legend(
        [plt.Line2D([], [], marker="o", ls="", color=c) for _, c in legend],
        [name for name, _ in legend],
        fontsize=7,
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        frameon=False,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def default_out(dirs: list[Path]) -> Path:
    """Where a report goes without ``--out``: one run's own folder; for several runs a folder beside the
    first, named after them (``runs/a`` + ``runs/b`` -> ``runs/report-a-b``)."""
    if len(dirs) == 1:
        return dirs[0]
    names = "-".join(d.resolve().name for d in dirs)
    if len(names) > 80:
        names = f"{dirs[0].resolve().name}-and-{len(dirs) - 1}-more"
    return dirs[0].parent / f"report-{names}"


def write_report(run_dirs: list[str | Path], out: str | Path | None = None) -> Path:
    """Write ``report.md`` and ``plots/`` for the runs into ``out``; by default a single run's own folder,
    and for several runs :func:`default_out` (never one run's folder: its own report stays its own)."""
    dirs = [Path(d) for d in run_dirs]
    out = Path(out) if out else default_out(dirs)
    summaries = [run_summary(d) for d in dirs]  # before anything is written: a bad folder writes nothing
    plots = out / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    lines = [
        "# WHALE report",
        "",
        "| run | method | env | seed | start | best ± SE | best at rollouts | final | rollouts / budget | weight steps | harness iterations | wall s |",
        "|" + "---|" * 12,
    ]
    for s in summaries:
        lines.append(
            f"| {s['name']} | {s['method']} | {s['env']} | {s['seed']} | {_pct(s['start_mean'])} | "
            f"{_pct(s['best_mean'])} ± {_pct(s['best_se'])} | {s['best_at']} | {_pct(s['final_mean'])} | "
            f"{s['rollouts']} / {s['budget']} | {s['weight_steps']} | {s['harness_iterations']} | {s['seconds']} |"
        )
    lines += [
        "",
        "Test accuracy is mean@k in percent on the test set(s) (the held-out test split, or the run's eval.tasks); "
        "evaluation is not charged to the ledger.",
        "Wall time is the run's own (units, evaluations and start-up, over every resumed session).",
        "",
    ]
    lines += data_source_table(summaries)
    if eval_note(summaries):
        lines += [f"**Note:** {eval_note(summaries)}.", ""]
    acc = plot_accuracy(summaries, plots / "accuracy_vs_rollouts.png")
    timeline = plot_timeline(summaries, plots / "phase_timeline.png")
    lines += [f"![accuracy]({acc.relative_to(out)})", "", f"![timeline]({timeline.relative_to(out)})", ""]
    lanes = plot_lanes(summaries, plots / "lanes.png")
    if lanes:
        lines += ["## Lanes", "", *lanes_table(summaries), f"![lanes]({lanes.relative_to(out)})", ""]
    for d, s in zip(dirs, summaries, strict=True):
        lines += [
            f"## {s['name']}",
            "",
            f"Stopped: {s['stop_reason'] or 'not finished'}",
            "",
            *([f"**Isolation: {s['isolation']}**", ""] if s["isolation"] not in (None, "namespaces") else []),
            "Phase switches:",
            "",
        ]
        lines += [
            f"- at {e['rollouts_total']} rollouts → {e['to']}: {e['reason']}" for e in s["switches"]
        ] or ["- none"]
        rows = lineage(d)
        if rows:
            img = plot_lineage(rows, plots / f"lineage_{s['name']}.png", f"Harness lineage: {s['name']}")
            lines += [
                "",
                f"![lineage]({img.relative_to(out)})",
                "",
                "| candidate | parents | status | best score | hypothesis |",
                "|---|---|---|---|---|",
            ]
            for r in rows:
                mark = " (accepted)" if r["accepted"] else ""
                lines.append(
                    f"| {r['id']}{mark} | {', '.join(r['parents']) or '—'} | {r['status']} | {_pct(r['score'])} | {r['hypothesis'][:120]} |"
                )
        lines.append("")
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
