"""The ``whale`` command line.

    whale envs                      the registered environments and their task sources
    whale tasks --env ID            the tasks of a source and split (ids, difficulty), for tracing results
    whale eval --env ID --harness H evaluate a harness with a model: mean@k, pass@k, traces
    whale check --env ID --harness H check_harness: does the harness work, and does it need the model?
    whale pretrain --out DIR        build the tiny CPU default model
    whale search --env ID ...       harness-only Meta-Harness search
    whale train CONFIG.yaml         WHALE or a baseline, with ledger, checkpoints, resume
    whale report RUN_DIR...         report.md and plots from run directories
    whale compare CONFIG.yaml       the methods x domains x seeds grid at matched budgets: table and plots

Every command that takes ``--tasks`` takes the same spec string as ``gym.make(env_id, tasks=...)``:
``kind[:path][?key=value&...]`` (e.g. ``lichess``, ``lichess:puzzles.csv?min_rating=1500``, ``generated?seed=3``).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import gymnasium as gym
from rich.console import Console
from rich.table import Table

import whale_envs
from whale_envs.tasks import SPLIT_NAMES, SPLITS, TaskSourceError, source_kinds, split_ids
from whale_train.domains import import_env_module
from whale_train.errors import CLIError

console = Console()
errors = Console(stderr=True, soft_wrap=True)  # one line per error, never wrapped


def _make_env(env_id: str, tasks: str | None, split: str = "all", **kwargs) -> gym.Env:
    _check_env(env_id)
    try:
        options = {"tasks": tasks} if tasks else {}
        return gym.make(env_id, split=split, **options, **kwargs)
    except TaskSourceError as exc:
        raise CLIError(str(exc)) from None


def _check_env(env_id: str) -> None:
    """A built-in env id, or a user's ``module:EnvId`` (the module is imported, as ``gym.make`` does)."""
    try:
        import_env_module(env_id)
    except ValueError as exc:
        raise CLIError(str(exc)) from None


# ------------------------------------------------------------------------------------------ envs


def cmd_envs(args: argparse.Namespace) -> int:
    table = Table(title="WHALE environments")
    for col in ("env id", "task source kind", "what", *SPLITS):
        table.add_column(col)
    for env_id in sorted(whale_envs.ENVS):
        for kind in source_kinds(_domain_of(env_id)):
            sizes = ["" for _ in SPLITS]
            if args.sizes and not kind.path_required:
                env = _make_env(env_id, kind.kind).unwrapped
                sizes = [str(len(split_ids(env.source, s))) for s in SPLITS]
            table.add_row(env_id, kind.usage, kind.doc, *sizes)
    console.print(table)
    return 0


def _domain_of(env_id: str) -> str:
    module, _, cls = whale_envs.ENVS[env_id].partition(":")
    return getattr(importlib.import_module(module), cls).domain


# ------------------------------------------------------------------------------------------ tasks


def cmd_tasks(args: argparse.Namespace) -> int:
    env = _make_env(args.env, args.tasks, args.split).unwrapped
    ids = env.task_ids[: args.limit] if args.limit else env.task_ids
    table = Table(title=f"{args.env} · {env.source.name} · split {args.split}: {len(env.task_ids)} tasks")
    table.add_column("task id")
    table.add_column("difficulty")
    table.add_column("source row")
    for task_id in ids:
        meta = env.source.get(task_id).meta
        table.add_row(task_id, str(meta.get("difficulty", "")), str(meta.get("row", "")))
    console.print(table)
    counts = Counter(str(env.source.get(i).meta.get("difficulty", "")) for i in ids)
    console.print("by difficulty: " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    return 0


# ------------------------------------------------------------------------------------------ eval


def _load_harness(spec: str):
    from harnesses.loader import load_harness
    from harnesses.validate import HarnessValidationError

    try:
        return load_harness(spec)
    except (HarnessValidationError, FileNotFoundError) as exc:
        raise CLIError(f"harness {spec!r} fails validation: {exc}") from None


def _load_llm(args: argparse.Namespace):
    from whale_train.llm import ModelNotFound, load_llm

    kwargs = {"base_url": args.base_url} if args.backend == "openai" else {}
    try:
        return load_llm(args.backend, args.model, **kwargs)
    except (ModelNotFound, ValueError, RuntimeError) as exc:
        raise CLIError(str(exc)) from None


def evaluate(args: argparse.Namespace) -> dict:
    """``whale eval``: run, print the table, write results.json and traces.jsonl; return the results."""
    import json
    import time

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from whale_train.rollout import EpisodeLimits, RolloutConfig, run_rollouts, summarize, write_jsonl

    harness = _load_harness(args.harness)
    env = _make_env(args.env, args.tasks, args.split).unwrapped
    task_ids = env.task_ids[: args.limit] if args.limit else env.task_ids
    llm = _load_llm(args)
    config = RolloutConfig(
        k=args.k, seed=args.seed, concurrency=args.concurrency, trusted=args.trusted, limits=EpisodeLimits()
    )
    env_kwargs = {"split": args.split, **({"tasks": args.tasks} if args.tasks else {})}
    start = time.monotonic()
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as bar:
        job = bar.add_task(f"{harness.name} on {args.env}", total=len(task_ids) * args.k)
        trajs = run_rollouts(
            harness,
            args.env,
            llm,
            task_ids,
            env_kwargs=env_kwargs,
            config=config,
            progress=lambda _t: bar.advance(job),
        )
    wall = time.monotonic() - start
    summary = summarize(trajs)
    results = {
        "env": args.env,
        "tasks": env.source.name,
        "split": args.split,
        "harness": harness.name,
        "model": getattr(llm, "name", str(args.model)),
        "backend": args.backend,
        "k": args.k,
        "seed": args.seed,
        "wall_seconds": round(wall, 2),
        "episodes_per_second": round(len(trajs) / wall, 2) if wall else None,
        **summary,
    }
    _print_results(results)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
        write_jsonl(trajs, out / "traces.jsonl")
        console.print(f"wrote {out / 'results.json'} and {out / 'traces.jsonl'}")
    return results


def _print_results(r: dict) -> None:
    table = Table(title=f"{r['harness']} · {r['env']} · {r['tasks']} ({r['split']})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row(f"mean@{r['k']}", f"{100 * r['mean']:.1f}% ± {100 * r['se']:.1f}")
    table.add_row(f"pass@{r['k']}", f"{100 * r['pass_at_k']:.1f}%")
    table.add_row("tasks × k", f"{r['tasks']} × {r['k']}")
    for diff, d in r["by_difficulty"].items():
        table.add_row(f"  difficulty {diff}", f"{100 * d['mean']:.1f}% ({d['tasks']} tasks)")
    for name, n in r["failures"].items():
        table.add_row(f"  failed: {name}", str(n))
    table.add_row("LLM calls", str(r["llm_calls"]))
    table.add_row("tokens (prompt / completion)", f"{r['prompt_tokens']} / {r['completion_tokens']}")
    table.add_row("wall time", f"{r['wall_seconds']:.1f} s ({r['episodes_per_second']} episodes/s)")
    console.print(table)


def cmd_eval(args: argparse.Namespace) -> int:
    evaluate(args)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from harnesses.check import check_harness

    _check_env(args.env)
    env_kwargs = {"tasks": args.tasks} if args.tasks else {}
    report = check_harness(
        args.harness, args.env, env_kwargs=env_kwargs, n_tasks=args.n_tasks, trusted=args.trusted
    )
    console.print(str(report))
    return 0 if report.ok else 1


# ------------------------------------------------------------------------------------------ main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="whale",
        description="WHALE: jointly optimize an LLM agent's weights and its harness.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Task sources (--tasks) are spec strings: kind[:path][?key=value&...]. See `whale envs`.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("envs", help="list the registered environments and their task sources")
    p.add_argument("--sizes", action="store_true", help="also load each bundled source and count its splits")
    p.set_defaults(func=cmd_envs)

    p = sub.add_parser("tasks", help="list the tasks of a source and split")
    p.add_argument("--env", required=True, help="env id, e.g. whale/Chess-v0")
    p.add_argument("--tasks", default=None, help="task source spec (default: the env's generator)")
    p.add_argument("--split", default="test", choices=SPLIT_NAMES)
    p.add_argument("--limit", type=int, default=20, help="show at most N tasks (0 = all)")
    p.set_defaults(func=cmd_tasks)

    p = sub.add_parser(
        "eval",
        help="evaluate a harness with a model: mean@k, pass@k, traces",
        description="Run a harness on the tasks of a split, k samples each, and report mean@k ± standard "
        "error, pass@k, a per-difficulty breakdown and failure categories. Untrusted harness files run in a "
        "sandboxed worker process.",
    )
    p.add_argument("--env", required=True, help="env id, e.g. whale/Chess-v0")
    p.add_argument("--harness", required=True, help="a harness file, or a shipped name like chess_puzzles/h0")
    p.add_argument("--model", default=None, help="model directory or id (default: the shipped tiny model)")
    p.add_argument("--backend", default="transformers", choices=["transformers", "openai", "vllm"])
    p.add_argument(
        "--base-url", default=None, help="server URL for --backend openai (e.g. http://localhost:8000/v1)"
    )
    p.add_argument("--tasks", default=None, help="task source spec (default: the env's generator)")
    p.add_argument("--split", default="test", choices=SPLIT_NAMES)
    p.add_argument("--limit", type=int, default=0, help="evaluate the first N tasks of the split (0 = all)")
    p.add_argument("--k", type=int, default=8, help="samples per task (mean@k, pass@k)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--concurrency", type=int, default=128, help="episodes in flight (the model's batch size)")
    p.add_argument("--trusted", action="store_true", help="run a shipped harness in this process (faster)")
    p.add_argument("--out", default=None, help="write results.json and traces.jsonl here")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("check", help="check_harness: run a harness with null models and report what breaks")
    p.add_argument("--env", required=True)
    p.add_argument("--harness", required=True)
    p.add_argument("--tasks", default=None)
    p.add_argument("--n-tasks", type=int, default=16)
    p.add_argument("--trusted", action="store_true")
    p.set_defaults(func=cmd_check)

    # Commands that live with their subsystem: each module adds its own subcommand.
    for module in (
        "whale_train.pretrain",
        "whale_train.meta_harness.cli",
        "whale_train.trainer",
        "whale_train.report",
        "whale_train.compare",
    ):
        importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CLIError as exc:
        errors.print(f"[red]error:[/red] {exc}", markup=True, highlight=False)
        return 2


if __name__ == "__main__":
    sys.exit(main())
