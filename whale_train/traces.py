"""The episodes of ``traces.jsonl`` files (``whale eval --out``, a run's ``eval/``, a search archive):
found under a folder, read line by line, filtered, shown in full. ``whale traces`` (``whale_train.cli.traces``)
is their command line.
"""

from __future__ import annotations

import json
import re
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


def cut(text: Any, limit: int) -> str:
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
        console.print(f"[red]error:[/red] {escape(cut(e['error'], chars))}", highlight=False)
    console.print("[bold]reset observation[/bold]")
    console.print(escape(cut(e.get("reset_observation"), chars)), highlight=False)
    calls = e.get("calls") or []
    for i, c in enumerate(calls):
        console.print(f"[bold cyan]LLM call {i + 1}/{len(calls)} ({c.get('kind')})[/bold cyan] prompt (end):")
        prompt = str(c.get("prompt_text") or "")
        console.print(escape(prompt[-chars:]), highlight=False)
        console.print(
            f"[bold cyan]→ completion:[/bold cyan] {escape(cut(c.get('completion'), chars))}",
            highlight=False,
        )
    for i, st in enumerate(e.get("steps") or []):
        flags = " ".join(f for f in ("terminated", "truncated") if st.get(f))
        console.print(
            f"[bold]step {i + 1}[/bold] action {escape(repr(cut(st.get('action'), chars)))} → reward "
            f"{st.get('reward')} {flags}",
            highlight=False,
        )
        console.print(escape(cut(st.get("observation"), chars)), highlight=False)
    if e.get("final_info"):
        console.print(
            f"[bold]final info[/bold] {escape(cut(json.dumps(e['final_info'], default=str), chars))}"
        )
