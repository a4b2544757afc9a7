"""``whale report RUN_DIR...``: report.md and plots from run directories (:mod:`whale_train.report`)."""

from __future__ import annotations

import argparse

from whale_train.cli.registry import command
from whale_train.errors import CLIError


@command("report", help="report.md and plots from one or more run directories")
def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", help="run directories (runs/NAME)")
    p.add_argument(
        "--out",
        default=None,
        help="where to write report.md and plots/ (default: a single run's own folder; for several "
        "runs a folder beside the first, runs/report-A-B, so no run's own report is overwritten)",
    )
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from whale_train.report import write_report

    try:
        path = write_report(args.runs, args.out)
    except (FileNotFoundError, ValueError) as exc:
        raise CLIError(str(exc)) from None
    print(f"wrote {path} and {path.parent / 'plots'}")
    return 0
