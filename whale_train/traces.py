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

import json
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from whale_envs.tasks import TaskSourceError, json_lines
from whale_train.files import without_lone_surrogates

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def trace_files(path: Path) -> list[Path]:
    """``path`` itself, or every traces file under a folder (sorted): ``traces.jsonl`` (whale eval),
    ``*.traces.jsonl`` (a run's eval/), ``traces/*.jsonl`` (a search archive's candidates)."""
    if path.is_file():
        return [path]
    found = sorted(
        {*path.rglob("traces.jsonl"), *path.rglob("*.traces.jsonl"), *path.rglob("traces/*.jsonl")}
    )
    if not found:
        raise FileNotFoundError(f"{path} holds no traces.jsonl (write one with `whale eval --out DIR`)")
    return found


def read_episodes(path: Path) -> Iterator[tuple[Path, int, dict[str, Any]]]:
    """(file, line number, episode dict) for every line; a broken line is a ValueError naming file:line.
    A ``"\\ud800"`` escape (a lone surrogate, which no console or UTF-8 writer takes) reads as U+FFFD."""
    for file in trace_files(path):
        with open(file, encoding="utf-8", errors="replace") as fh:
            read = 0  # the lines json_lines has taken: the broken one, when it raises
            escaped = False  # the line last taken holds a surrogate escape

            def counted(lines=fh):
                nonlocal read, escaped
                for line in lines:
                    read += 1
                    escaped = _SURROGATE_ESCAPE.search(line) is not None
                    yield line

            try:
                for line_no, episode in json_lines(counted(), str(file)):
                    if not isinstance(episode, dict) or "task_id" not in episode:
                        raise ValueError(f"{file}:{line_no}: not an episode record (no task_id)")
                    yield file, line_no, without_lone_surrogates(episode) if escaped else episode
            except TaskSourceError:
                raise ValueError(f"{file}:{read}: not a JSON line; is the file cut short?") from None


def matches(e: dict[str, Any], *, task=None, failure=None, harness=None, solved=None) -> bool:
    if task and not (e["task_id"].startswith(task[:-1]) if task.endswith("*") else e["task_id"] == task):
        return False
    if failure and e.get("failure") != failure:
        return False
    if harness and harness not in str(e.get("harness", "")):
        return False
    return solved is None or bool(e.get("solved")) == solved


def _cut(text: Any, limit: int) -> str:
    text = str(text if text is not None else "")
    return text if len(text) <= limit else text[:limit] + f" [... {len(text) - limit} more characters]"


def show_episode(console, file: Path, line_no: int, e: dict[str, Any], chars: int) -> None:
    from rich.markup import escape

    verdict = "[green]solved[/green]" if e.get("solved") else f"[red]{e.get('failure') or 'unsolved'}[/red]"
    console.rule(
        f"{escape(e['task_id'])} · sample {e.get('sample')} · {escape(str(e.get('harness')))} · {verdict}"
        f" · {escape(str(file))}:{line_no}"
    )
    if e.get("error"):
        console.print(f"[red]error:[/red] {escape(_cut(e['error'], chars))}", highlight=False)
    console.print("[bold]reset observation[/bold]")
    console.print(escape(_cut(e.get("reset_observation"), chars)), highlight=False)
    calls = e.get("calls") or []
    for i, c in enumerate(calls):
        console.print(f"[bold cyan]LLM call {i + 1}/{len(calls)} ({c.get('kind')})[/bold cyan] prompt (end):")
        prompt = str(c.get("prompt_text") or "")
        console.print(escape(prompt[-chars:]), highlight=False)
        console.print(
            f"[bold cyan]→ completion:[/bold cyan] {escape(_cut(c.get('completion'), chars))}",
            highlight=False,
        )
    for i, st in enumerate(e.get("steps") or []):
        flags = " ".join(f for f in ("terminated", "truncated") if st.get(f))
        console.print(
            f"[bold]step {i + 1}[/bold] action {escape(repr(_cut(st.get('action'), chars)))} → reward "
            f"{st.get('reward')} {flags}",
            highlight=False,
        )
        console.print(escape(_cut(st.get("observation"), chars)), highlight=False)
    if e.get("final_info"):
        console.print(
            f"[bold]final info[/bold] {escape(_cut(json.dumps(e['final_info'], default=str), chars))}"
        )


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "traces",
        help="read the episodes of traces.jsonl files: filter by task, failure, harness; show one in full",
        description=__doc__.split("\n\n")[0],
    )
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


def cmd_traces(args) -> int:
    from rich.markup import escape
    from rich.table import Table

    from whale_train.cli_common import CLIError, console

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
            escape(_cut(str(first).strip().splitlines()[-1] if first else "", 80)),
        )
    console.print(table)
    counts = Counter("solved" if e.get("solved") else e.get("failure") or "unsolved" for _f, _n, e in picked)
    console.print(", ".join(f"{k}: {v}" for k, v in counts.most_common()) or "no episode matches the filters")
    if len(picked) > (args.limit or len(picked)):
        console.print(f"(first {args.limit} shown; --limit 0 shows all, --show N prints episodes in full)")
    return 0
