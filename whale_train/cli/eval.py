"""``whale eval``: a harness with a model on the tasks of a split, k samples each: mean@k ± SE, pass@k,
per difficulty and data source, failure categories; ``--out`` writes results.json and traces.jsonl."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from rich.table import Table

from whale_envs import CHESS_ID
from whale_envs.tasks import SPLIT_NAMES
from whale_train.cli import common
from whale_train.cli.common import (
    add_env_flags,
    add_episode_flags,
    add_harness_flag,
    add_model_flags,
    console,
    count,
    episode_limits,
    errors,
    isolation_of,
    make_env,
    print_errors,
)
from whale_train.cli.registry import command
from whale_train.errors import CLIError
from whale_train.harness_for import load_harness_for


@command("eval", help="evaluate a harness with a model: mean@k, pass@k, traces")
def arguments(p: argparse.ArgumentParser) -> None:
    """Run a harness on the tasks of a split, k samples each, and report mean@k ± standard error,
    pass@k, a per-difficulty breakdown and failure categories. Untrusted harness files run in a
    sandboxed worker process."""
    add_env_flags(p, CHESS_ID)
    add_harness_flag(p, "chess_puzzles/h0")
    add_model_flags(p)
    p.add_argument(
        "--backend-option",
        dest="backend_options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a backend option, repeatable, as backend_options in a config: for --backend vllm the engine "
        "settings (dtype=float32, max_model_len=2048, enforce_eager=true, multiprocess=true, "
        "continuous=true, ...); for --backend openai e.g. tokenizer=MODEL_DIR",
    )
    p.add_argument(
        "--env-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an env keyword argument, repeatable (verifier=dapo, judge_mode=paper, max_turns=9)",
    )
    p.add_argument("--split", default="test", choices=SPLIT_NAMES, help="which split's tasks")
    p.add_argument(
        "--limit", type=count(0), default=0, help="evaluate the first N tasks of the split (0 = all)"
    )
    p.add_argument("--k", type=count(1), default=8, help="samples per task (mean@k, pass@k)")
    p.add_argument(
        "--concurrency", type=count(1), default=128, help="episodes in flight (the model's batch size)"
    )
    p.add_argument("--out", default=None, help="write results.json and traces.jsonl here")
    add_episode_flags(p, 30.0, 64)
    p.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    results = evaluate(args)
    model_failed = results["failures"].get("model_error", 0)
    if model_failed:  # the model failed, not the harness: the numbers above do not measure the harness
        errors.print(
            f"the model failed in {model_failed} of {results['episodes']} episodes: {results['model_error']}"
        )
        return 1
    failed = sum(e["episodes"] for e in results["errors"].values())
    if results["episodes"] and failed == results["episodes"]:
        errors.print(f"every episode failed ({', '.join(results['errors'])}): see the first error above")
        return 1
    return 0


def evaluate(args: argparse.Namespace) -> dict:
    """Run, print the table, write results.json and traces.jsonl; return the results. The env is built
    once (its tasks, the isolation check, then the first episodes) and checked once, before the model
    loads."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from whale_train import evaluation
    from whale_train.rollout import RolloutConfig

    env_options = env_options_of(args.env_option)
    env = make_env(args.env, args.tasks, args.split, **env_options)
    env_kwargs = {"split": args.split, **env_options, **({"tasks": args.tasks} if args.tasks else {})}
    tasks = evaluation.TaskSet.of(env, env_kwargs, args.limit)
    harness = load_harness_for(args.harness, args.env, trusted=args.trusted)
    limits = episode_limits(args)
    isolation = isolation_of(RolloutConfig(trusted=args.trusted), env.unwrapped, harness)
    llm = common.load_llm(args)
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as bar:
        job = bar.add_task(f"{harness.name} on {args.env}", total=len(tasks.ids) * args.k)
        result = evaluation.evaluate(
            harness,
            args.env,
            llm,
            [tasks],
            k=args.k,
            seed=args.seed,
            concurrency=args.concurrency,
            trusted=args.trusted,
            limits=limits,
            progress=lambda _t: bar.advance(job),
            env=env,
        )
    wall, trajs = result.wall_seconds, result.trajectories
    results = {
        "env": args.env,
        "task_source": tasks.source.name,
        "split": args.split,
        "harness": harness.name,
        "model": getattr(llm, "name", str(args.model)),
        "backend": args.backend,
        "k": args.k,
        "seed": args.seed,
        "isolation": isolation,
        "wall_seconds": round(wall, 2),
        "episodes_per_second": round(len(trajs) / wall, 2) if wall else None,
        **result.summary,
        "errors": result.errors,
    }
    model_errors = [t.error for t in trajs if t.failure == "model_error"]
    if model_errors:
        results["model_error"] = model_errors[0].splitlines()[0]
    print_results(results)
    print_errors(results["errors"], len(trajs))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
        result.write_traces(out / "traces.jsonl")
        console.print(f"wrote {out / 'results.json'} and {out / 'traces.jsonl'}")
    return results


def env_options_of(items: Sequence[str]) -> dict:
    """``--env-option KEY=VALUE`` pairs as env keyword arguments; a value is read as YAML (data only)."""
    import yaml

    options = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise CLIError(f"--env-option {item!r}: expected KEY=VALUE, e.g. verifier=dapo")
        try:
            options[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise CLIError(f"--env-option {key}: not a YAML value: {str(exc).splitlines()[0]}") from None
    return options


def print_results(r: dict) -> None:
    table = Table(title=f"{r['harness']} · {r['env']} · {r['task_source']} ({r['split']})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row(f"mean@{r['k']}", f"{100 * r['mean']:.1f}% ± {100 * r['se']:.1f}")
    table.add_row(f"pass@{r['k']}", f"{100 * r['pass_at_k']:.1f}%")
    table.add_row("tasks × k", f"{r['tasks']} × {r['k']}")
    for diff, d in r["by_difficulty"].items():
        table.add_row(f"  difficulty {diff}", f"{100 * d['mean']:.1f}% ({d['tasks']} tasks)")
    for name, d in r.get("by_data_source", {}).items():
        if name in r["by_difficulty"]:  # the paper's sources use the data source as difficulty
            continue
        table.add_row(f"  data source {name}", f"{100 * d['mean']:.1f}% ({d['tasks']} tasks)")
    for name, n in r["failures"].items():
        table.add_row(f"  failed: {name}", str(n))
    table.add_row("LLM calls", str(r["llm_calls"]))
    table.add_row("tokens (prompt / completion)", f"{r['prompt_tokens']} / {r['completion_tokens']}")
    table.add_row("wall time", f"{r['wall_seconds']:.1f} s ({r['episodes_per_second']} episodes/s)")
    table.add_row("isolation", r["isolation"])
    console.print(table)
