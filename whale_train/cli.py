"""The ``whale`` command line.

    whale envs                      the registered environments and their task sources
    whale tasks --env ID            the tasks of a source and split (ids, difficulty), for tracing results
    whale demo                      the main job on the CPU default (grows as the trainer lands)

Every command that takes ``--tasks`` takes the same spec string as ``gym.make(env_id, tasks=...)``:
``kind[:path][?key=value&...]`` (e.g. ``lichess``, ``lichess:puzzles.csv?min_rating=1500``, ``generated?seed=3``).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections import Counter
from collections.abc import Sequence

import gymnasium as gym
from rich.console import Console
from rich.table import Table

import whale_envs
from whale_envs.tasks import SPLIT_NAMES, SPLITS, TaskSourceError, source_kinds, split_ids

console = Console()


class CLIError(Exception):
    """A user mistake: printed as one clear line, exit status 2."""


def _make_env(env_id: str, tasks: str | None, split: str = "all", **kwargs) -> gym.Env:
    if env_id not in gym.registry:
        known = ", ".join(sorted(whale_envs.ENVS))
        raise CLIError(f"unknown env {env_id!r}; registered: {known}")
    try:
        options = {"tasks": tasks} if tasks else {}
        return gym.make(env_id, split=split, **options, **kwargs)
    except TaskSourceError as exc:
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


# ------------------------------------------------------------------------------------------ demo


def cmd_demo(args: argparse.Namespace) -> int:
    """Until harnesses and the trainer land: show each env and a random-legal-move chess baseline."""
    import random

    env = _make_env("whale/Chess-v0", args.tasks, "test")
    obs, info = env.reset(seed=args.seed)
    console.rule("whale/Chess-v0: one episode")
    console.print(obs)
    rng = random.Random(args.seed)
    solved = 0
    ids = env.unwrapped.task_ids[: args.limit]
    for task_id in ids:
        obs, info = env.reset(options={"task_id": task_id})
        done = False
        while not done:
            obs, reward, terminated, truncated, info = env.step(rng.choice(info["legal_moves_uci"]))
            done = terminated or truncated
        solved += int(info["solved"])
    console.rule("random legal moves (the chance level a harness must beat)")
    console.print(
        f"{solved}/{len(ids)} puzzles solved = {100 * solved / len(ids):.1f}% on {env.unwrapped.source.name} (test split)"
    )
    return 0


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

    p = sub.add_parser("demo", help="the main job on the CPU default")
    p.add_argument(
        "--tasks", default="lichess", help="chess task source (default: the bundled Lichess sample)"
    )
    p.add_argument("--limit", type=int, default=100, help="number of test puzzles")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CLIError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
