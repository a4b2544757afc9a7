"""``whale report RUN_DIR...``: a results table and plots from run directories.

Writes ``report.md`` and ``plots/`` (PNG): test mean@k against rollouts with one line per run, the
phase timeline of each run (weight phases and harness phases shaded on the rollout axis), and the
harness lineage of each run's archive (candidates, parents, accepted incumbents).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_ledger(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "ledger.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no ledger.jsonl)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_summary(run_dir: Path) -> dict[str, Any]:
    import yaml

    events = read_ledger(run_dir)
    config = yaml.safe_load((Path(run_dir) / "config.yaml").read_text())
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
        "finished": stop is not None,
        "stop_reason": stop["reason"] if stop else "",
        "seconds": round(sum(u.get("seconds", 0) for u in units), 1),
        "switches": [e for e in events if e["event"] == "switch"],
        "evals": evals,
        "units": units,
    }


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}"


def plot_accuracy(summaries: list[dict[str, Any]], path: Path) -> Path:
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
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_timeline(summaries: list[dict[str, Any]], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 0.6 + 0.5 * len(summaries)))
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
    ax.legend(handles, ["weight phase (RSFT)", "harness phase (search)"], fontsize=8, loc="lower right")
    ax.set_title("Phase timeline")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def lineage(run_dir: Path) -> list[dict[str, Any]]:
    """The archive's candidates: id, parents, status, best score, accepted (from each meta.json)."""
    rows = []
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
                "accepted": bool(meta.get("accepted")),
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
    fig, ax = plt.subplots(
        figsize=(max(5, 1.6 * len(by_depth)), max(3, 0.5 * max(len(v) for v in by_depth.values())))
    )
    for r in rows:
        for p in r["parents"]:
            if p in pos:
                ax.plot(*zip(pos[p], pos[r["id"]], strict=True), color="#999", lw=0.8, zorder=1)
    for r in rows:
        x, y = pos[r["id"]]
        color = "#2ca02c" if r["accepted"] else ("#d62728" if r["status"] == "failed" else "#1f77b4")
        ax.scatter([x], [y], s=80, color=color, zorder=2)
        label = r["id"] if r["score"] is None else f"{r['id']} {100 * r['score']:.0f}%"
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(6, 4), fontsize=7)
    ax.set_xlabel("generation")
    ax.set_yticks([])
    ax.set_title(title + " (green: accepted, red: failed validation)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(run_dirs: list[str | Path], out: str | Path | None = None) -> Path:
    """Write ``report.md`` and ``plots/`` for the runs (into ``out``, default: the first run's folder)."""
    dirs = [Path(d) for d in run_dirs]
    out = Path(out) if out else dirs[0]
    plots = out / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    summaries = [run_summary(d) for d in dirs]
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
        "Test accuracy is mean@k in percent on the held-out test split; evaluation is not charged to the ledger.",
        "",
    ]
    acc = plot_accuracy(summaries, plots / "accuracy_vs_rollouts.png")
    timeline = plot_timeline(summaries, plots / "phase_timeline.png")
    lines += [f"![accuracy]({acc.relative_to(out)})", "", f"![timeline]({timeline.relative_to(out)})", ""]
    for d, s in zip(dirs, summaries, strict=True):
        lines += [
            f"## {s['name']}",
            "",
            f"Stopped: {s['stop_reason'] or 'not finished'}",
            "",
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


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("report", help="report.md and plots from one or more run directories")
    p.add_argument("runs", nargs="+", help="run directories (runs/NAME)")
    p.add_argument("--out", default=None, help="where to write report.md and plots/ (default: the first run)")
    p.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    from whale_train.errors import CLIError

    try:
        path = write_report(args.runs, args.out)
    except FileNotFoundError as exc:
        raise CLIError(str(exc)) from None
    print(f"wrote {path} and {path.parent / 'plots'}")
    return 0
