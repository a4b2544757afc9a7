"""``whale search`` (harness-only search on a frozen model) and ``whale lineage`` (the archive report).

    whale search --env whale/Math-v0 --iterations 4 [--model DIR] [--tasks SPEC] [--out DIR]
                 [--proposer offline|llm|agent|claude-code] [--llm-api openai|anthropic] [--prompt-only] [--config search.yaml] [--set key=value ...]

writes ``OUT/archive/`` (the search), ``OUT/lineage.md`` and ``OUT/results.json``, and scores the seed
and the final incumbent on the held-out ``test`` split (``OUT/test/``, outside the archive, so no
proposer ever reads it). Running the same command again resumes the search where it stopped.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path
from typing import Any

from whale_envs.sandbox import isolation_label
from whale_train.meta_harness.archive import Archive, atomic_write_json, atomic_write_text
from whale_train.meta_harness.config import MetaHarnessConfig
from whale_train.meta_harness.lineage import lineage_report


def add_parser(subparsers: Any) -> None:
    """Register ``whale search`` and ``whale lineage`` on the ``whale`` command's subparsers."""
    from whale_train.cli_common import add_set_option, count

    p = subparsers.add_parser(
        "search",
        help="harness-only search (Meta-Harness) on a frozen model",
        description="Propose, check and score new harnesses for a frozen model; keep the best. Resumes an "
        "existing --out. The seed and the final incumbent are also scored on the held-out test split.",
    )
    p.add_argument("--env", required=True, help="env id, e.g. whale/Math-v0")
    p.add_argument(
        "--iterations", type=count(1), required=True, help="search iterations in total (resumed ones count)"
    )
    p.add_argument("--model", default=None, help="model directory or id (default: the shipped tiny model)")
    p.add_argument("--backend", default="transformers", choices=["transformers", "openai", "vllm"])
    p.add_argument("--base-url", default=None, help="server URL for --backend openai")
    p.add_argument("--tasks", default=None, help="task source spec (default: the env's generator)")
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
    add_set_option(p)
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

    p = subparsers.add_parser(
        "lineage", help="the lineage report of a harness archive (rendered; --out FILE writes the markdown)"
    )
    p.add_argument(
        "archive", help="an archive folder (OUT/archive of whale search, RUN/archive of whale train)"
    )
    p.add_argument("--out", default=None, help="write the report here instead of printing it")
    p.set_defaults(func=cmd_lineage)


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
    from whale_train.cli_common import CLIError, console, load_harness_for, make_env
    from whale_train.cli_common import _load_llm as load_llm
    from whale_train.domains import domain_for
    from whale_train.evaluation import task_set
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
    make_env(args.env, args.tasks, "harness")  # a bad task source is a user error, before any work
    seed = load_harness_for(args.harness, args.env) if args.harness else None
    llm = load_llm(args)
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
    search_seconds = time.monotonic() - start
    version = int(getattr(llm, "version", 0))
    archive = search.archive
    seed_rec, inc_rec = (
        archive.get(search.seed_id).eval(version),
        archive.get(search.incumbent_id).eval(version),
    )
    results: dict[str, Any] = {
        "env": args.env,
        "model_version": version,
        "seed": search.seed_id,
        "incumbent": search.incumbent_id,
        "iterations": args.iterations,
        "rollouts": sum(r.rollouts for r in archive_reports(archive)),
        "check_episodes": sum(r.get("check_episodes", 0) for r in archive.records()),
        "search_seconds_this_run": round(search_seconds, 1),
        "search_seconds": round(sum(r.get("wall_seconds", 0.0) for r in archive.records()), 1),
        "accepted": [_accepted(r) for r in archive.records() if r["accepted"]],
        "search": {"seed": _brief(seed_rec), "incumbent": _brief(inc_rec)},
        "isolation": isolation_label(),
    }
    if args.test_limit:
        tests = functools.cache(  # the test split's env built once, and only when a score is not stored
            lambda: task_set(search.env_id, {**search.env_kwargs, "split": "test"}, args.test_limit)
        )
        results["test"] = {
            name: test_score(search, cid, out / "test", args.test_limit, args.test_k, tests)
            for name, cid in (("seed", search.seed_id), ("incumbent", search.incumbent_id))
        }
        # search-split minus test-split success rate: how much of the search score is fitted to the
        # search tasks (the incumbent was picked on them; the seed was not)
        results["gap"] = {
            name: round(results["search"][name]["mean"] - results["test"][name]["mean"], 4)
            for name in ("seed", "incumbent")
            if results["search"][name]
        }
    atomic_write_json(out / "results.json", results)
    atomic_write_text(out / "lineage.md", lineage_report(out / "archive"))
    _print(console, results, reports)
    console.print(f"wrote {out / 'lineage.md'}, {out / 'results.json'} and the archive {out / 'archive'}")
    return 0


def archive_reports(archive: Archive) -> list[Any]:
    from whale_train.meta_harness.search import IterationReport

    return [IterationReport.from_dict(r) for r in archive.records()]


def _accepted(record: dict[str, Any]) -> dict[str, Any]:
    """A step that changed the incumbent: the winner, the step, and its paired gain over the one it replaced."""
    won = next((c for c in record["candidates"] if c["id"] == record["incumbent"]), {})
    step = f"iteration {record['iteration']}" if record["kind"] == "iteration" else "rescore"
    return {
        "id": record["incumbent"],
        "step": step,
        "replaced": record["incumbent_before"],
        "gain": won.get("gain"),
        "gain_se": won.get("gain_se"),
    }


def _brief(rec: dict[str, Any] | None) -> dict[str, Any] | None:
    if rec is None:
        return None
    return {k: rec[k] for k in ("mean", "se", "tasks", "rollouts", "calls_per_episode", "tokens_per_episode")}


def test_score(search: Any, cid: str, folder: Path, limit: int, k: int, tests: Any) -> dict[str, Any]:
    """mean@k of candidate ``cid`` on the first ``limit`` tasks of the ``test`` split (measured, not
    charged); ``tests()`` returns them (a ``whale_train.evaluation.TaskSet``), called only when needed.

    Stored in ``folder`` (outside the archive) and reused when the same candidate and model version
    were scored before.
    """
    from whale_train.evaluation import eval_seed, evaluate

    version = int(getattr(search.llm, "version", 0))
    path = folder / f"{cid}-v{version}-n{limit}-k{k}.json"
    if path.exists():
        return json.loads(path.read_text())
    run = evaluate(
        search.archive.get(cid).ref(),
        search.env_id,
        search.llm,
        [tests()],
        k=k,
        seed=eval_seed(search.config.seed),
        concurrency=search.config.concurrency,
    )
    s = run.summary
    result = {
        "candidate": cid,
        "model_version": version,
        "k": k,
        "tasks": s["tasks"],
        "mean": s["mean"],
        "se": s["se"],
        "failures": s["failures"],
        "wall_seconds": round(run.wall_seconds, 1),
    }
    run.write_traces(path.with_suffix(".traces.jsonl"))
    atomic_write_json(path, result)
    return result


def _print(console: Any, results: dict[str, Any], reports: list[Any]) -> None:
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


def cmd_lineage(args: argparse.Namespace) -> int:
    from whale_train.cli_common import CLIError

    archive = Path(args.archive)
    if (archive / "archive").is_dir():  # a run or search folder: its archive
        archive = archive / "archive"
    if not archive.is_dir() or not any(archive.glob("*/meta.json")):
        raise CLIError(
            f"{args.archive} is not a harness archive (no candidate folders with meta.json); "
            "pass OUT/archive of whale search or RUN/archive of whale train"
        )
    report = lineage_report(archive)
    if args.out:
        atomic_write_text(args.out, report)
        print(f"wrote {args.out}")
    else:  # in a terminal: rendered (tables drawn, no raw markdown or HTML); --out keeps the markdown
        from whale_train.cli_common import console
        from whale_train.meta_harness.lineage import for_terminal

        console.print(for_terminal(report))
    return 0
