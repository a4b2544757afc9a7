"""``whale traces PATH``: read the episodes of a ``traces.jsonl`` (from ``whale eval --out``, a run's
``eval/``, a search archive) one table row each, or in full with ``--show``.

    whale traces runs/eval                                   every traces file under the folder
    whale traces runs/eval/traces.jsonl --failure harness_error --show 1
    whale traces runs/demo --harness math/h0 --task gen-3-0042 --unsolved

Filters combine: ``--task`` (a task id, or a prefix ending in ``*``), ``--failure`` (a category of
``whale eval``'s table: parse_error, illegal_action, wrong_answer, tool_error, out_of_turns, timeout,
harness_error, incomplete), ``--harness`` (name or substring), ``--solved`` / ``--unsolved``.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from whale_train.cli.common import console
from whale_train.cli.registry import command
from whale_train.errors import CLIError
from whale_train.traces import cut, matches, read_episodes, show_episode


@command(
    "traces",
    help="read the episodes of traces.jsonl files: filter by task, failure, harness; show one in full",
    description=__doc__.split("\n\n")[0],
)
def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="a traces.jsonl file, or a folder to search for them (an eval --out, a run)")
    p.add_argument("--task", default=None, help="a task id, or a prefix ending in *")
    p.add_argument("--failure", default=None, help="a failure category, e.g. harness_error, wrong_answer")
    p.add_argument("--harness", default=None, help="harness name or a part of it")
    solved = p.add_mutually_exclusive_group()
    solved.add_argument(
        "--solved", dest="solved", action="store_true", default=None, help="solved episodes only"
    )
    solved.add_argument("--unsolved", dest="solved", action="store_false", help="unsolved episodes only")
    p.add_argument("--limit", type=int, default=50, help="table rows to show (0 = all)")
    p.add_argument(
        "--show", type=int, default=0, metavar="N", help="print the first N matching episodes in full"
    )
    p.add_argument("--chars", type=int, default=600, help="longest text shown per field with --show")
    p.set_defaults(func=cmd_traces)


def cmd_traces(args: argparse.Namespace) -> int:
    if args.limit < 0 or args.show < 0 or args.chars < 1:
        raise CLIError("--limit and --show must be at least 0, --chars at least 1")
    path = Path(args.path)
    if not path.exists():
        raise CLIError(f"no such file or folder {path}")
    filters = dict(task=args.task, failure=args.failure, harness=args.harness, solved=args.solved)
    try:
        picked = [(f, n, e) for f, n, e in read_episodes(path) if matches(e, **filters)]
    except (FileNotFoundError, ValueError) as exc:
        raise CLIError(str(exc)) from None
    if args.show:
        for f, n, e in picked[: args.show]:
            show_episode(console, f, n, e, args.chars)
        return 0
    table = Table(title=f"{len(picked)} episodes in {path}")
    for col in ("file", "task", "sample", "harness", "reward", "result", "turns", "calls", "first error"):
        table.add_column(col, overflow="fold")
    for f, _n, e in picked[: args.limit or None]:
        first = e.get("error") or next((s["error"] for s in e.get("steps") or [] if s.get("error")), "")
        table.add_row(
            escape(str(f.relative_to(path)) if f != path else f.name),
            escape(e["task_id"]),
            str(e.get("sample")),
            escape(str(e.get("harness"))),
            str(e.get("reward")),
            "solved" if e.get("solved") else escape(e.get("failure") or "unsolved"),
            str(len(e.get("steps") or [])),
            str(len(e.get("calls") or [])),
            escape(cut(str(first).strip().splitlines()[-1] if first else "", 80)),
        )
    console.print(table)
    counts = Counter("solved" if e.get("solved") else e.get("failure") or "unsolved" for _f, _n, e in picked)
    console.print(", ".join(f"{k}: {v}" for k, v in counts.most_common()) or "no episode matches the filters")
    if len(picked) > (args.limit or len(picked)):
        console.print(f"(first {args.limit} shown; --limit 0 shows all, --show N prints episodes in full)")
    return 0
