"""``whale lineage ARCHIVE``: the lineage report of a harness archive, rendered for the terminal, or
written as markdown with ``--out`` (:func:`whale_train.meta_harness.lineage.lineage_report`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from whale_train.cli.common import console
from whale_train.cli.registry import command
from whale_train.errors import CLIError


@command("lineage", help="the lineage report of a harness archive (rendered; --out FILE writes the markdown)")
def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "archive", help="an archive folder (OUT/archive of whale search, RUN/archive of whale train)"
    )
    p.add_argument("--out", default=None, help="write the report here instead of printing it")
    p.set_defaults(func=cmd_lineage)


def cmd_lineage(args: argparse.Namespace) -> int:
    from whale_train.meta_harness.archive import atomic_write_text
    from whale_train.meta_harness.lineage import for_terminal, lineage_report

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
        console.print(for_terminal(report))
    return 0
