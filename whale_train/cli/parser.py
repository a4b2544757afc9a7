"""The ``whale`` parser, assembled from the registered commands, and :func:`main`, which runs one."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Sequence

from rich.markup import escape

from whale_envs.tasks import TaskSourceError
from whale_train.cli.common import DefaultsFormatter, Interrupted, Parser, errors, version
from whale_train.cli.registry import COMMANDS
from whale_train.errors import CLIError
from whale_train.warm_start import gc_paused


def build_parser() -> argparse.ArgumentParser:
    """``whale`` with one subparser per registered command, each with the isolation opt-in flag."""
    from whale_envs.sandbox import OPT_IN_ENV, OPT_IN_FLAG

    parser = Parser(
        prog="whale",
        description="WHALE: jointly optimize an LLM agent's weights and its harness.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Task sources (--tasks) are spec strings: kind[:path][?key=value&...]. See `whale envs`.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS.values():
        p = sub.add_parser(
            command.name,
            help=command.help,
            description=command.description,
            formatter_class=DefaultsFormatter,  # --help shows the defaults
        )
        command.arguments(p)
        p.add_argument(
            OPT_IN_FLAG,
            action="store_true",
            dest="allow_unisolated",
            help=f"run untrusted code without namespaces if they are unavailable (= {OPT_IN_ENV}=1); "
            "every output then says so",
        )
    return parser


def _loads_a_model(args: argparse.Namespace) -> bool:
    """Whether the command imports PyTorch and transformers first thing: training, or a model run in
    this process."""
    if args.command in ("train", "pretrain"):
        return not getattr(args, "fields", False)
    return getattr(args, "backend", None) in ("transformers", "vllm")


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``whale ARGV``; the exit status (a user error is one line on stderr and 2, Ctrl-C 130).
    As a process's own command line (``argv`` None) the start-up imports run with the garbage collector
    paused (``warm_start.gc_paused``)."""
    own_process = argv is None
    with gc_paused() if own_process else contextlib.nullcontext():
        args = build_parser().parse_args(argv)
        if own_process and _loads_a_model(args):
            import torch  # noqa: F401
            import transformers  # noqa: F401
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
