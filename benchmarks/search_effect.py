"""The harness-search effect on the frozen shipped tiny model: h0 vs the accepted harness, per domain.

    OMP_NUM_THREADS=1 python benchmarks/search_effect.py [--domains chess math search] [--out benchmarks/results/search]

For each domain it runs ``whale search`` with the domain's budget (``BUDGETS``: iterations of 3 candidates,
each scored on 256 ``harness``-split tasks, one rollout each; about five minutes of search on a 2-core CPU),
which also scores h0 and the final incumbent on the first 300 tasks of the held-out ``test`` split
(mean@8). The archive, with its traces, stays under ``--runs`` (a rerun resumes it and re-runs nothing);
the small files go to ``OUT/<domain>/``: ``results.json``, ``lineage.md`` (``whale lineage``), the accepted
harnesses (``<id>.py``) and a ``README.md`` with the exact command and the numbers.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
from pathlib import Path

from whale_train.domains import registered

ENVS = {d.name: d.env_id for d in registered()}  # chess, math, search

#: Search iterations per domain: what fits in at most about five minutes of search on a 2-core CPU
#: (a chess candidate that scores every legal move takes minutes, a math or search-QA one seconds).
BUDGETS = {"chess": 1, "math": 3, "search": 8}


def search_argv(domain: str, runs: Path, args: argparse.Namespace) -> list[str]:
    argv = ["search", "--env", ENVS[domain], "--iterations", str(BUDGETS[domain])]
    argv += ["--candidates", "3", "--harness-tasks", "256", "--seed", str(args.seed)]
    argv += ["--test-limit", str(args.test_limit), "--test-k", str(args.test_k), "--out", str(runs / domain)]
    return argv


def collect(domain: str, run: Path, out: Path, argv: list[str]) -> dict:
    """Copy the small files of ``run`` into ``out`` and write its README; return the results."""
    from whale_train.meta_harness.archive import Archive

    out.mkdir(parents=True, exist_ok=True)
    results = json.loads((run / "results.json").read_text())
    shutil.copyfile(run / "results.json", out / "results.json")
    shutil.copyfile(run / "lineage.md", out / "lineage.md")
    archive = Archive(run / "archive", readonly=True)
    for old in out.glob("i*-c*.py"):
        old.unlink()
    for step in results["accepted"]:
        (out / f"{step['id']}.py").write_text(archive.get(step["id"]).source)
    (out / "README.md").write_text(readme(domain, results, argv))
    return results


def pct(rec: dict | None) -> str:
    return f"{100 * rec['mean']:.1f} ± {100 * rec['se']:.1f}" if rec else "–"


def readme(domain: str, r: dict, argv: list[str]) -> str:
    test = r.get("test") or {}
    rows = []
    for name in ("seed", "incumbent"):
        t = test.get(name)
        gap = r.get("gap", {}).get(name)
        rows.append(
            f"| {name} `{r[name]}` | {pct(r['search'][name])} | {pct(t)} | "
            f"{'–' if gap is None else f'{100 * gap:+.1f}'} |"
        )
    accepted = (
        "; ".join(
            f"[`{a['id']}`]({a['id']}.py) at {a['step']}, paired gain over `{a['replaced']}` "
            f"{100 * a['gain']:+.1f} ± {100 * a['gain_se']:.1f} points"
            for a in r["accepted"]
            if a["gain"] is not None
        )
        or "none"
    )
    k = (test.get("seed") or {}).get("k", "–")
    n = (test.get("seed") or {}).get("tasks", "–")
    test_seconds = sum(t.get("wall_seconds", 0.0) for t in test.values())
    return "\n".join(
        [
            f"# Harness search on {r['env']}, frozen shipped tiny model",
            "",
            "Reproduce (from the repository root; resumes the archive if it exists):",
            "",
            "```",
            f"OMP_NUM_THREADS=1 python benchmarks/search_effect.py --domains {domain}",
            "# which runs",
            "OMP_NUM_THREADS=1 whale " + shlex.join(argv),
            "whale lineage " + shlex.join([argv[argv.index("--out") + 1] + "/archive"]),
            "```",
            "",
            f"Search split: the same {r['search']['seed']['tasks']} `harness`-split tasks for every candidate, "
            f"one rollout each (mean ± SE over tasks). Test split: the first {n} `test`-split tasks, "
            f"mean@{k} ± SE over tasks. Gap: search minus test, in points.",
            "",
            "| harness | search split % | test split % | gap |",
            "|---|---|---|---|",
            *rows,
            "",
            f"- {r['iterations']} iteration{'s' if r['iterations'] != 1 else ''}, {r['rollouts']} rollouts charged (plus {r['check_episodes']} "
            f"null-model check episodes), {r['search_seconds']:.0f} s of search; test scoring "
            f"{test_seconds:.0f} s.",
            f"- accepted: {accepted}; the whole search: [lineage.md](lineage.md); the numbers: "
            "[results.json](results.json).",
            "",
        ]
    )


def main() -> int:
    from whale_train.cli import main as whale

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--domains", nargs="+", default=list(ENVS), choices=list(ENVS))
    p.add_argument("--out", default="benchmarks/results/search")
    p.add_argument("--runs", default="runs/search-effect", help="where the archives (with traces) go")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--test-limit", type=int, default=300)
    p.add_argument("--test-k", type=int, default=8)
    args = p.parse_args()
    for domain in args.domains:
        argv = search_argv(domain, Path(args.runs), args)
        print("whale " + shlex.join(argv), flush=True)
        if whale(argv) != 0:
            return 1
        r = collect(domain, Path(args.runs) / domain, Path(args.out) / domain, argv)
        s, t = r["search"], r.get("test", {})
        print(
            f"{domain}: h0 {pct(s['seed'])} -> {r['incumbent']} {pct(s['incumbent'])} on the search split; "
            f"test {pct(t.get('seed'))} -> {pct(t.get('incumbent'))}; {r['search_seconds']:.0f} s",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
