"""The ``whale`` parser, assembled from the registered commands, and :func:`main`, which runs one."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from rich.markup import escape

from whale_envs.tasks import TaskSourceError
from whale_train.cli.common import DefaultsFormatter, Interrupted, Parser, errors, version
from whale_train.cli.registry import COMMANDS
from whale_train.errors import CLIError


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


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``whale ARGV``; the exit status (a user error is one line on stderr and 2, Ctrl-C 130)."""
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
