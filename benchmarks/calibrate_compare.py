"""Calibration of the decisive comparison's task mix: the frozen shipped model under h0 and under the best
shipped harness of each domain, per difficulty level, on the ``harness`` split.

    OMP_NUM_THREADS=1 python benchmarks/calibrate_compare.py [--tasks 60] [--k 2] [--out benchmarks/results/compare/calibration]

This is the only input docs/COMPARE.md's choice of task sources and difficulty mixes may use: the frozen
model (no method has run) under ``h0`` and under the domain's best shipped harness (the mechanism the
harness search of ``benchmarks/search_effect.py`` accepted in its first iteration; see README's harness
phase results), never a method's results and never the test split. A difficulty level where the best
harness on the frozen model already scores near 100% would put every method that finds it at its
ceiling after one harness iteration; a level where both score near 0 gives RSFT nothing to keep.

Each (domain, harness) is scored once on the first ``--tasks`` tasks of the harness split of a generated
source spanning every level (the generator deals the levels out in turn), ``--k`` samples per task, in
this process (the shipped harnesses are trusted), seed 0; the levels are read from ``by_difficulty``.
Writes ``calibration.json`` and ``calibration.md`` (with the command) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

#: per domain: the env, a generated source over every level, h0 and the best shipped harness
DOMAINS = {
    "math": ("whale/Math-v0", "generated?difficulty=1-5&seed=0&size=2000", "math/h0", "math/calculator"),
    "chess": (
        "whale/Chess-v0",
        "generated?difficulty=1-4&seed=0&size=2000",
        "chess_puzzles/h0",
        "chess_puzzles/choose",
    ),
    "search": (
        "whale/SearchQA-v0",
        "generated?difficulty=1-3&seed=0&size=2000",
        "search_qa/h0",
        "search_qa/follow_up",
    ),
}


def score(env_id: str, tasks: str, harness_name: str, llm, n: int, k: int) -> dict:
    import gymnasium as gym

    from harnesses.loader import load_harness
    from whale_train.rollout import RolloutConfig, run_rollouts, summarize

    env = gym.make(env_id, tasks=tasks, split="harness").unwrapped
    harness = load_harness(harness_name)
    start = time.monotonic()
    trajs = run_rollouts(
        harness,
        env_id,
        llm,
        env.task_ids[:n],
        env_kwargs={"tasks": tasks, "split": "harness"},
        config=RolloutConfig(k=k, seed=0, concurrency=64, trusted=True),
    )
    s = summarize(trajs)
    return {
        "harness": harness_name,
        "mean": s["mean"],
        "se": s["se"],
        "tasks": s["tasks"],
        "by_difficulty": {str(d): v for d, v in s["by_difficulty"].items()},
        "seconds": round(time.monotonic() - start, 1),
    }


def markdown(results: dict, argv: list[str]) -> str:
    lines = [
        "# Calibration of the decisive comparison (frozen shipped model, harness split)",
        "",
        f"    OMP_NUM_THREADS=1 python benchmarks/calibrate_compare.py {shlex.join(argv)}".rstrip(),
        "",
        f"mean@{results['k']} on the first {results['n']} harness-split tasks of each source (levels dealt "
        "out in turn), in percent; per level: the level's share of those tasks. Seconds: wall time on a "
        "2-core machine shared with other jobs.",
        "",
        "| domain | harness | all levels | per level (tasks) | seconds |",
        "|---|---|---|---|---|",
    ]
    for name, d in results["domains"].items():
        for r in (d["h0"], d["best"]):
            per = ", ".join(
                f"L{lvl}: {100 * v['mean']:.0f} ({v['tasks']})" for lvl, v in r["by_difficulty"].items()
            )
            lines.append(
                f"| {name} | `{r['harness']}` | {100 * r['mean']:.1f} ± {100 * r['se']:.1f} | {per} | {r['seconds']:.0f} |"
            )
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=60, help="harness-split tasks per (domain, harness)")
    p.add_argument("--k", type=int, default=2, help="samples per task")
    p.add_argument("--domains", nargs="+", default=list(DOMAINS), choices=list(DOMAINS))
    p.add_argument("--out", default="benchmarks/results/compare/calibration")
    args = p.parse_args(argv)
    from whale_train.llm import load_llm

    llm = load_llm("transformers", None)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "calibration.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    if results.get("n") != args.tasks or results.get("k") != args.k:
        results = {"n": args.tasks, "k": args.k, "domains": {}}
    for name in args.domains:
        env_id, tasks, h0, best = DOMAINS[name]
        results["domains"][name] = {
            "env": env_id,
            "tasks": tasks,
            "h0": score(env_id, tasks, h0, llm, args.tasks, args.k),
            "best": score(env_id, tasks, best, llm, args.tasks, args.k),
        }
        print(json.dumps({name: {h: results["domains"][name][h]["by_difficulty"] for h in ("h0", "best")}}))
        path.write_text(json.dumps(results, indent=1))
    (out / "calibration.md").write_text(markdown(results, argv))
    print(f"wrote {path} and {out / 'calibration.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
