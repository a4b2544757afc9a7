"""``whale train``: its command line, the run it starts (:class:`whale_train.trainer.Run`), the follower
ranks under ``accelerate launch`` and the summary table at the end."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from whale_train import distributed
from whale_train.cli.common import Interrupted, add_set_option, console, errors, progress_bar
from whale_train.cli.registry import command
from whale_train.config_io import describe
from whale_train.errors import CLIError
from whale_train.llm.replicas import WeightSyncError
from whale_train.rsft import ModelFailure
from whale_train.trainer import Run, TrainConfig, shipped_configs, sigint_stops_run


@command(
    "train",
    help="train: alternate RSFT and harness search (or a baseline) under a rollout budget",
    description="Run WHALE or a baseline (method: whale, adaptive, weight-only, harness-only, stagewise, fst) "
    "from a YAML config. Leaves a run directory with the ledger, checkpoints, the harness archive, test "
    "evaluations and tracker logs (report_to: TensorBoard by default); --resume continues a stopped run "
    f"where it stopped. Shipped configs, by name: {', '.join(shipped_configs())}.",
)
def arguments(p: argparse.ArgumentParser) -> None:
    add_set_option(p, "override a config field (dotted for nested: rsft.learning_rate=5e-5)")
    p.add_argument(
        "config",
        nargs="?",
        default=None,
        help="a YAML config file or a shipped config's name (demo, math/whale, ...); "
        "with --resume it may be left out (the run's own config.yaml is used)",
    )
    p.add_argument("--out", default=None, help="run directory (default: runs/<name>)")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out (which must exist; an existing folder without a run starts one)",
    )
    p.add_argument(
        "--trust-state",
        action="store_true",
        help="with --resume: load a checkpoint's rsft_state.pt even when it needs a full unpickle (an older "
        "format), which runs code written in it; only for a run folder you trust (recorded in "
        "trusted_state.log)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="check everything the run needs (task files, test sets, model, backend, retriever, judge and "
        "proposer keys) and list every problem with its fix; starts nothing, writes nothing (exit 2 on a problem)",
    )
    p.add_argument("--json", action="store_true", help="with --check: print one JSON object")
    p.add_argument("--no-report", action="store_true", help="do not write report.md and plots at the end")
    p.add_argument(
        "--eval-cache",
        default=None,
        metavar="DIR",
        help="a folder of evaluations shared with other runs: a test evaluation of the same weights, harness, "
        "tasks and sample seeds is read from there instead of run again (whale compare's runs share one)",
    )
    p.add_argument(
        "--fields",
        action="store_true",
        help="list every config field (dotted) with its type, default and help",
    )
    p.set_defaults(func=cmd_train)


def _plain(console):
    """Log lines printed as text: a message holding ``[...]`` (an error, a path) is not rich markup."""
    return lambda line: console.print(line, markup=False, highlight=False)


def _train_config(args: argparse.Namespace) -> TrainConfig:
    if args.resume and args.out and not Path(args.out).exists():
        raise CLIError(
            f"--resume: {args.out} does not exist, so there is no run to resume; drop --resume to start one"
        )
    path = args.config
    if path is None:
        saved = Path(args.out) / "config.yaml" if args.out else None
        if not (args.resume and saved and saved.exists()):
            raise CLIError(
                "whale train needs a config: a YAML file or a shipped name, e.g. `whale train demo` or "
                "`whale train math/whale` (`whale train --help` lists the shipped ones)"
            )
        path = saved
    try:
        return TrainConfig.load(path, args.overrides)
    except (ValueError, FileNotFoundError) as exc:  # one line naming the file or --set and the field
        raise CLIError(str(exc)) from None


def follow_run(config: TrainConfig, trust_state: bool = False) -> int:
    """``whale train`` on a rank other than 0 under ``accelerate launch``: the training model and
    ``rsft.RSFTUpdater`` exactly as rank 0 builds them, then ``distributed.follow`` until rank 0 stops; a
    resume loads the checkpoint as ``RSFT.restore`` does (``from_pretrained``, PEFT's loader for LoRA)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from whale_train.llm import default_model
    from whale_train.rsft import RSFTUpdater, load_checkpoint, load_state

    path = config.model or default_model()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if torch.cuda.is_available():
        model = model.to(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}")
    rsft = dataclasses.replace(config.rsft, seed=config.seed, concurrency=config.concurrency)
    trainer = RSFTUpdater(model, AutoTokenizer.from_pretrained(path), rsft)

    def load(checkpoint) -> None:
        load_checkpoint(trainer.model, Path(checkpoint))
        trainer.optimizer_state = load_state(Path(checkpoint), trust_state)[0]["optimizer"]

    try:
        distributed.follow(trainer, load=load)
    except distributed.RankLost as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from rich.table import Table

    from whale_train.preflight import preflight

    if args.fields:
        console.print("\n".join(describe(TrainConfig)), markup=False, highlight=False)
        return 0
    if args.check:
        return check_only(args)
    config = _train_config(args)
    out = Path(args.out or f"runs/{config.name}")
    if args.resume and not out.exists():
        raise CLIError(
            f"--resume: {out} does not exist, so there is no run to resume; drop --resume to start one"
        )
    if not distributed.is_main():  # accelerate launch: this rank only trains, on rank 0's examples
        return follow_run(config, args.trust_state)
    try:
        # every problem of the config, the data, the model and the services, before the run directory is made
        report = preflight(config, out, resume=args.resume)
        if not report.ok:
            errors.print(report.text(), markup=False, highlight=False)
            return 2
        try:
            run = Run(
                config,
                out,
                resume=args.resume,
                log=_plain(console),
                progress=progress_bar,
                eval_cache=args.eval_cache,
                trust_state=args.trust_state,
                harness=report.harness,
            )
        except (FileExistsError, ValueError, ImportError, RuntimeError, OSError) as exc:
            # the engine or the model failed to start (vLLM, ModelNotFound, the hub cache): one line
            raise CLIError(str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)) from None
        if report.test_sets is not None:  # the test sets the pre-flight built: the run's, not built again
            run.test_sets = report.test_sets
        console.rule(f"{config.method} on {config.env}: {config.budget_rollouts} rollouts → {out}")
        try:
            with sigint_stops_run():
                summary = run.run()
        except KeyboardInterrupt:
            raise Interrupted(stopped_message(out)) from None
        except ImportError as exc:  # a tracker asked for in report_to is not installed
            raise CLIError(str(exc)) from None
        except ModelFailure as exc:
            console.print(
                f"[red]error:[/] {exc} (the run stopped; --resume continues it once the model works)",
                highlight=False,
                soft_wrap=True,  # one line, whatever the terminal's width
            )
            return 1
        except WeightSyncError as exc:  # a push to vllm serve replicas failed; the line says what to do
            from rich.markup import escape

            console.print(f"[red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            return 1
        except distributed.RankLost as exc:  # a training rank died: `--resume` continues from the last unit
            from rich.markup import escape

            console.print(
                f"[red]error:[/] {escape(str(exc))}; `whale train --out {out} --resume` continues",
                soft_wrap=True,
            )
            return 1
    finally:
        if distributed.world()[1] > 1:
            with contextlib.suppress(distributed.RankLost):  # a rank that is gone cannot be told to stop
                distributed.stop_followers()
    table = Table(title=f"{config.name}: {config.method} on {config.env}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    pct = lambda x: "—" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    table.add_row("test mean@k at start", pct(run_evals(out)[0]["mean"] if run_evals(out) else None))
    table.add_row("best test mean@k", f"{pct(summary['best_mean'])} ± {pct(summary['best_se'])}")
    table.add_row("reached at rollouts", str(summary["best_at_rollouts"]))
    table.add_row("rollouts spent / budget", f"{summary['rollouts']} / {summary['budget']}")
    startup = summary.get("startup_seconds")
    table.add_row(
        "wall time", f"{summary['wall_seconds']:.0f} s" + (f" (start-up {startup:.0f} s)" if startup else "")
    )
    console.print(table)
    if not args.no_report:
        from whale_train.report import write_report

        path = write_report([out])
        console.print(f"report: {path}   plots: {path.parent / 'plots'}")
    return 0


def check_only(args: argparse.Namespace) -> int:
    """``whale train CONFIG --check``: every pre-flight problem, one line each with its fix (exit 2), or what
    was checked (exit 0); ``--json``: one JSON object. Nothing is started or written."""
    from whale_train.preflight import Problem, Report, preflight

    try:
        config = _train_config(args)
    except CLIError as exc:  # the config itself: the other checks need it
        report = Report({}, [Problem("config", str(exc), "fix the config file or the --set")])
    else:
        out = Path(args.out or f"runs/{config.name}")
        report = preflight(config, out, resume=args.resume)
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
    else:
        (console if report.ok else errors).print(report.text(), markup=False, highlight=False)
    return 0 if report.ok else 2


def stopped_message(out: Path) -> str:
    """What Ctrl-C kept, read from the run's saved state: the units finished before the one in progress
    (whose RSFT step or search iteration, even if its line was printed, is redone by --resume)."""
    again = f"whale train --out {out} --resume"  # the run's own config.yaml, overrides included
    try:
        state = json.loads((Path(out) / "state.json").read_text())
    except (OSError, ValueError):
        return f"stopped before the first unit was saved; `{again}` starts it again"
    kept = (
        f"{state['units']} units, {state['schedule'].get('rollouts', 0)} rollouts, "
        f"{state.get('rsft_steps', 0)} RSFT steps (model v{state.get('model_version', 0)})"
    )
    return (
        f"stopped; kept what was saved: {kept}. Unit {state['units']} was in progress and is not kept "
        f"(an RSFT step or search iteration it printed is redone); `{again}` continues from there"
    )


def run_evals(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in open(Path(run_dir) / "ledger.jsonl") if '"event": "eval"' in line]
