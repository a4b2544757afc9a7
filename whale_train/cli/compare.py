"""``whale compare CONFIG.yaml``: the methods x domains x seeds grid at matched budgets, from the command
line (the grid itself: :mod:`whale_train.compare`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

import yaml

from whale_train import placement
from whale_train.cli.common import add_set_option
from whale_train.cli.registry import command
from whale_train.compare.plan import CompareConfig, plan
from whale_train.compare.record import locate
from whale_train.compare.runner import run_grid
from whale_train.compare.table import collect, run_numbers
from whale_train.errors import CLIError


@command(
    "compare",
    help="run the methods x domains x seeds grid at matched budgets; the comparison table and plots",
)
def arguments(p: argparse.ArgumentParser) -> None:
    """Run every (domain, method, seed) of a compare config (and its schedule ablation) as `whale
    train` subprocesses at the same rollout budget per domain, --jobs at a time, then write
    compare.md / compare.json and plots. Rerunning on the same --out skips finished runs and
    continues unfinished ones."""
    add_set_option(
        p, "override a config field (dotted for nested: eval.limit=32; a train config field, for every run)"
    )
    p.add_argument("config", help="compare config (see configs/compare/)")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (each with OMP_NUM_THREADS=1)")
    p.add_argument("--out", default=None, help="output folder (default: runs/compare/<name>)")
    p.add_argument(
        "--reference",
        default=None,
        metavar="COMPARE_JSON",
        help="an earlier compare.json of this grid (e.g. benchmarks/results/compare/compare.json): add a "
        "reproduction section (each cell against the reference's mean ± SD) and exit 2 if any cell lies "
        "outside it",
    )
    p.add_argument(
        "--gpus-per-run",
        type=float,
        default=0,
        metavar="N",
        help="GPUs of each run: locally, every concurrent job gets N of its own (disjoint "
        "CUDA_VISIBLE_DEVICES; --jobs is capped by the GPUs); under --ray, the num_gpus of each task",
    )
    p.add_argument(
        "--devices",
        default=None,
        metavar="0,1,...",
        help="the local GPUs to split between jobs (default: CUDA_VISIBLE_DEVICES, else every GPU)",
    )
    p.add_argument(
        "--ray",
        default=None,
        metavar="ADDRESS|local",
        help="submit each run as a Ray task to the cluster at ADDRESS (e.g. auto, ray://head:10001), or to a "
        "Ray instance started here (local, with --jobs CPUs); --out must be on a file system every node sees",
    )
    p.add_argument("--cpus-per-run", type=float, default=1.0, help="num_cpus of each Ray task (default 1)")
    p.add_argument(
        "--ray-retries",
        type=int,
        default=3,
        help="times Ray reruns a task whose worker or node died (the run resumes; default 3)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the grid already in --out (a later session of a grid run in parts): refuse when --out holds "
        "no grid, so a mistyped folder never starts the grid anew (without --resume a rerun also continues)",
    )
    p.add_argument(
        "--hours",
        type=float,
        default=None,
        metavar="H",
        help="start no run after H hours (the runs already started finish): one session's share of a grid run "
        "in parts, ended with no run cut short; 0 starts nothing and only writes the table of the finished runs",
    )
    p.add_argument(
        "--domains",
        default=None,
        metavar="NAME,...",
        help="run only the runs of these domains of the config (a grid run in parts); the table still has every "
        "finished run",
    )
    p.add_argument(
        "--seeds",
        default=None,
        metavar="S,...",
        help="keep only these seeds of the config (and of its ablation): a subset of the grid, e.g. the one "
        "seed of every cell a reproduction reruns; the table has only these seeds",
    )
    p.add_argument(
        "--no-record",
        action="store_true",
        help="neither read nor write the config's record of finished runs: the grid from nothing in --out, "
        "e.g. a reproduction (with the record, its finished runs count as done)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="list the runs and their state, with a finished run's best, final and selected test mean@k; run "
        "nothing (it only reads, so it is safe beside a running grid)",
    )
    p.set_defaults(func=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> int:
    try:
        cfg = CompareConfig.load(args.config, args.overrides)
        if args.no_record:
            cfg = dataclasses.replace(cfg, record=None)
    except (ValueError, FileNotFoundError, yaml.YAMLError) as exc:
        raise CLIError(f"bad compare config: {exc}") from None
    if args.seeds:
        try:
            cfg = cfg.only_seeds([int(s) for s in args.seeds.split(",") if s.strip()])
        except ValueError as exc:
            raise CLIError(f"--seeds {args.seeds}: {exc}") from None
    try:
        runs = plan(cfg)
    except (ValueError, FileNotFoundError, yaml.YAMLError) as exc:
        raise CLIError(f"bad compare config: {exc}") from None
    if args.jobs < 1:
        raise CLIError("--jobs must be >= 1")
    out = Path(args.out or f"runs/compare/{cfg.name}")
    only = None
    if args.domains:
        only = [d.strip() for d in args.domains.split(",") if d.strip()]
        unknown = sorted(set(only) - {d.name for d in cfg.domains})
        if unknown:
            raise CLIError(
                f"--domains: {', '.join(unknown)} not in {args.config} ({', '.join(d.name for d in cfg.domains)})"
            )
    if args.hours is not None and args.hours < 0:
        raise CLIError("--hours must be 0 or more")
    recorded = cfg.record is not None and any(p.is_dir() for p in cfg.record.glob("*/"))
    if args.resume and not (out / "grid.yaml").exists() and not recorded:
        where = f" and {cfg.record} holds no finished run" if cfg.record is not None else ""
        raise CLIError(
            f"--resume: {out} holds no grid (no grid.yaml){where}; run without --resume to start it"
        )
    reference = None
    if args.reference:
        try:
            reference = json.loads(Path(args.reference).read_text())
            if not isinstance(reference, dict) or "domains" not in reference:
                raise ValueError("not a compare.json (no 'domains')")
        except (OSError, ValueError) as exc:
            raise CLIError(f"--reference {args.reference}: {exc}") from None
    if args.dry_run:
        dry_run([r for r in runs if only is None or r.domain in only], out, cfg.record)
        return 0
    devices = ray = None
    try:
        if args.ray:
            ray = placement.RayPlacement(
                args.ray,
                cpus_per_run=args.cpus_per_run,
                gpus_per_run=args.gpus_per_run,
                max_retries=args.ray_retries,
                local_cpus=max(1, math.ceil(args.jobs * args.cpus_per_run)),
                local_gpus=len(placement.visible_devices(args.devices)) if args.gpus_per_run else 0,
            )
        elif args.gpus_per_run:
            if args.gpus_per_run != int(args.gpus_per_run):
                raise ValueError("--gpus-per-run must be a whole number without --ray")
            devices = placement.DevicePool(placement.visible_devices(args.devices), int(args.gpus_per_run))
        table = run_grid(
            cfg,
            out,
            jobs=args.jobs,
            reference=reference,
            devices=devices,
            ray=ray,
            domains=only,
            hours=args.hours,
        )
    except (ValueError, RuntimeError, FileExistsError) as exc:
        raise CLIError(str(exc)) from None
    finally:
        if ray is not None:
            ray.close()
    inv = table["invocation"]
    print(f"wrote {out / 'compare.md'}, {out / 'compare.json'} and {out / 'plots'}")
    if inv["failed"]:
        print(f"{len(inv['failed'])} run(s) failed: {', '.join(inv['failed'])}; rerun to continue them")
        return 1
    rep = table.get("reproduction")
    if rep:
        print(f"reproduction: {rep['within']} of {rep['compared']} cells within the reference's error bars")
        outside = [c["cell"] for c in rep["cells"] if not c["within"]]
        if outside:
            print(f"outside: {', '.join(outside)} (see the reproduction section of {out / 'compare.md'})")
            return 2
    return 0


def dry_run(runs, out: Path, record: Path | None = None) -> None:
    """Each run's state; a finished one with its three test numbers (so a grid run in parts shows its
    results so far), marked ``(record)`` when it is read from the grid's record. Reads only: safe beside a
    running grid."""
    finished = collect(runs, out, record)
    for r in runs:
        state, where = locate(out, record, r.config)
        if state == "done" and where != out / "runs" / r.config.name:
            state = "done (record)"
        same = "" if r.config.name == r.id else f" = {r.config.name}"
        line = f"{r.id}{same}: {state} (budget {r.budget}, unit <= {r.max_unit})"
        if r.config.name in finished:
            n = run_numbers(finished[r.config.name])
            line += ": test mean@k " + ", ".join(
                f"{m} {'—' if n[m] is None else f'{100 * n[m]:.1f}%'}" for m in ("best", "final", "selected")
            )
        print(line)
    print(f"{len(finished)} of {len({r.config.name for r in runs})} runs finished")
