"""``whale tasks``: the tasks of a source and split (ids, difficulty, source row, the first observation),
for tracing results back to tasks."""

from __future__ import annotations

import argparse
from collections import Counter

from rich.markup import escape
from rich.table import Table

from whale_envs import CHESS_ID
from whale_envs.tasks import SPLIT_NAMES
from whale_train.cli.common import add_env_flags, console, count, make_env
from whale_train.cli.registry import command


@command("tasks", help="list the tasks of a source and split")
def arguments(p: argparse.ArgumentParser) -> None:
    add_env_flags(p, CHESS_ID)
    p.add_argument("--split", default="test", choices=SPLIT_NAMES, help="which split's tasks")
    p.add_argument("--limit", type=count(0), default=20, help="show at most N tasks (0 = all)")
    p.set_defaults(func=cmd_tasks)


def cmd_tasks(args: argparse.Namespace) -> int:
    env = make_env(args.env, args.tasks, args.split).unwrapped
    ids = env.task_ids[: args.limit] if args.limit else env.task_ids
    total = len(env.task_ids)
    shown = f"the first {len(ids)} shown (--limit 0: all)" if len(ids) < total else "all shown"
    table = Table(title=f"{args.env} · {env.source.name} · split {args.split}: {total} tasks, {shown}")
    table.add_column("task id", no_wrap=True)
    table.add_column("difficulty")
    table.add_column("source row")
    table.add_column("task (the first observation, cut)")
    for task_id in ids:
        meta = env.source.get(task_id).meta
        obs, _info = env.reset(options={"task_id": task_id})
        text = " ".join(obs.split())
        table.add_row(
            escape(task_id),
            str(meta.get("difficulty", "")),
            str(meta.get("row", "")),
            escape(text[:100] + ("…" if len(text) > 100 else "")),
        )
    console.print(table)
    counts = Counter(str(env.source.get(i).meta.get("difficulty", "")) for i in ids)
    of = f"of the {len(ids)} shown" if len(ids) < total else f"of all {total}"
    console.print(f"by difficulty ({of}): " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    return 0
