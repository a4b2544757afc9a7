"""``whale search``: harness-only search (Meta-Harness) on a frozen model.

    whale search --env whale/Math-v0 --iterations 4 [--model DIR] [--tasks SPEC] [--out DIR]
                 [--proposer offline|llm|agent|claude-code] [--llm-api openai|anthropic] [--prompt-only] [--config search.yaml] [--set key=value ...]

writes ``OUT/archive/`` (the search), ``OUT/lineage.md`` and ``OUT/results.json``, and scores the seed
and the final incumbent on the held-out ``test`` split (``OUT/test/``, outside the archive, so no
proposer ever reads it). Running the same command again resumes the search where it stopped.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from whale_train.cli import common
from whale_train.cli.common import console, count
from whale_train.cli.registry import command
from whale_train.errors import CLIError
from whale_train.harness_for import load_harness_for
from whale_train.meta_harness.archive import atomic_write_json, atomic_write_text
from whale_train.meta_harness.config import MetaHarnessConfig
from whale_train.meta_harness.lineage import lineage_report


@command("search", help="harness-only search (Meta-Harness) on a frozen model")
def arguments(p: argparse.ArgumentParser) -> None:
    """Propose, check and score new harnesses for a frozen model; keep the best. Resumes an
    existing --out. The seed and the final incumbent are also scored on the held-out test split."""
    common.add_env_flags(p)
    p.add_argument(
        "--iterations", type=count(1), required=True, help="search iterations in total (resumed ones count)"
    )
    common.add_model_flags(p)
    p.add_argument("--harness", default=None, help="the seed harness (default: the domain's h0)")
    p.add_argument("--out", default=None, help="output folder (default: runs/search-<domain>)")
    p.add_argument(
        "--proposer",
        default=None,
        choices=["offline", "llm", "agent", "claude-code"],
        help="offline (default; no LLM), llm (a chat model with archive file tools), agent (a chat model "
        "that also runs commands in a jail and tries candidates on train tasks) or claude-code (the real "
        "Claude Code CLI in that jail, on the Anthropic API; make install-claude-code)",
    )
    p.add_argument(
        "--prompt-only", action="store_true", help="change only the seed's prompt text (FST baseline)"
    )
    p.add_argument("--config", default=None, help="a YAML file of MetaHarnessConfig fields")
    common.add_set_option(p)
    p.add_argument(
        "--harness-tasks", type=count(1), default=None, help="search tasks per candidate (default 256)"
    )
    p.add_argument("--candidates", type=count(1), default=None, help="candidates per iteration (default 3)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument(
        "--llm-base-url",
        default=None,
        help="the proposer's endpoint (llm.base_url): OpenAI-compatible .../v1, or Anthropic's (default for "
        "--llm-api anthropic)",
    )
    p.add_argument(
        "--llm-api",
        default=None,
        choices=["openai", "anthropic"],
        help="the agent proposer's API (llm.api): openai (chat completions: OpenAI, vLLM, gateways) or anthropic",
    )
    p.add_argument("--llm-model", default=None, help="the proposer's model name (llm.model)")
    p.add_argument("--test-limit", type=count(0), default=256, help="test-split tasks to score (0: skip)")
    p.add_argument("--test-k", type=count(1), default=1, help="samples per test task")
    p.set_defaults(func=cmd_search)


def search_config(args: argparse.Namespace) -> MetaHarnessConfig:
    """``--config`` (its ``search:`` section, if it has one), then the flags, then ``--set``."""
    flags = {
        "harness_tasks": args.harness_tasks,
        "candidates": args.candidates,
        "seed": args.seed,
        "proposer": args.proposer,
        "llm": {"base_url": args.llm_base_url, "model": args.llm_model, "api": args.llm_api},
        "prompt_only": True if args.prompt_only else None,
    }
    flags["llm"] = {k: v for k, v in flags["llm"].items() if v is not None}
    flags = {k: v for k, v in flags.items() if v is not None and v != {}}
    return MetaHarnessConfig.load(args.config, args.overrides, section="search", flags=flags)


def cmd_search(args: argparse.Namespace) -> int:
    from whale_train.domains import domain_for
    from whale_train.meta_harness.results import search_results
    from whale_train.meta_harness.search import HarnessSearch

    try:
        domain = domain_for(args.env)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    if args.harness is None and domain.base_harness is None:
        raise CLIError(f"--harness: {args.env} has no registered base harness; name its h0 file")
    try:
        config = search_config(args)
    except (ValueError, FileNotFoundError) as exc:  # one line naming the file or --set and the field
        raise CLIError(str(exc)) from None
    if config.proposer == "claude-code":  # a missing CLI is a user error, before any work
        from whale_train.meta_harness.claude_code import find_cli
        from whale_train.meta_harness.proposer import ProposerError

        try:
            find_cli(config.claude_code.path)
        except ProposerError as exc:
            raise CLIError(str(exc)) from None
    out = Path(args.out or f"runs/search-{domain.name}")
    env_kwargs = {"tasks": args.tasks} if args.tasks else {}
    common.make_env(args.env, args.tasks, "harness")  # a bad task source is a user error, before any work
    seed = load_harness_for(args.harness, args.env) if args.harness else None
    llm = common.load_llm(args)
    start = time.monotonic()
    search = HarnessSearch(
        config,
        out / "archive",
        llm,
        args.env,
        env_kwargs,
        seed_harness=seed,
        log=lambda m: console.print(m, highlight=False),
    )
    reports = search.run(args.iterations)
    results = search_results(
        search, args.iterations, time.monotonic() - start, out, args.test_limit, args.test_k
    )
    atomic_write_json(out / "results.json", results)
    atomic_write_text(out / "lineage.md", lineage_report(out / "archive"))
    print_results(results, reports)
    console.print(f"wrote {out / 'lineage.md'}, {out / 'results.json'} and the archive {out / 'archive'}")
    return 0


def print_results(results: dict[str, Any], reports: list[Any]) -> None:
    from rich.table import Table

    table = Table(title=f"harness search on {results['env']} (model v{results['model_version']})")
    for col in ("harness", "search split %", "test split %", "gap (points)"):
        table.add_column(col, justify="right" if col != "harness" else "left")
    for name in ("seed", "incumbent"):
        s = results["search"][name]
        t = (results.get("test") or {}).get(name)
        table.add_row(
            f"{name} ({results[name]})",
            f"{100 * s['mean']:.1f} ± {100 * s['se']:.1f}" if s else "–",
            f"{100 * t['mean']:.1f} ± {100 * t['se']:.1f} (n={t['tasks']}, k={t['k']})" if t else "–",
            f"{100 * results['gap'][name]:+.1f}" if name in results.get("gap", {}) else "–",
        )
    console.print(table)
    console.print(
        f"{results['rollouts']} rollouts charged, {results['check_episodes']} null-model check episodes, "
        f"{results['search_seconds']} s of search ({results['search_seconds_this_run']} s in this run)"
    )
    for r in reports:
        console.print(f"  {r.summary}", highlight=False)
