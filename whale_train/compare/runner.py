"""Running the grid: every unfinished run as a ``whale train`` subprocess (or a Ray task), the run
states that make ``--resume`` skip finished runs and continue killed ones, one writer per folder."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from whale_train import placement
from whale_train.compare.markdown import to_markdown
from whale_train.compare.plan import CompareConfig, plan, prune_checkpoints
from whale_train.compare.plots import plot_ablation, plot_accuracy
from whale_train.compare.record import export_run, locate, stale_records, sync
from whale_train.compare.table import build_table, reproduction
from whale_train.files import hold_folder, release_folder
from whale_train.placement import train_one


def run_grid(
    cfg: CompareConfig,
    out: str | Path,
    *,
    jobs: int = 1,
    log: Callable[[str], None] = print,
    train: Callable[..., int] = train_one,
    reference: dict[str, Any] | None = None,
    devices: placement.DevicePool | None = None,
    ray: placement.RayPlacement | None = None,
    domains: Sequence[str] | None = None,
    hours: float | None = None,
) -> dict[str, Any]:
    """Run (or continue) every unfinished run of the grid, then write the table and plots. Returns the
    table (``compare.json``) with ``invocation``: what this call ran, skipped and failed, and, given a
    ``reference`` table (an earlier ``compare.json``), ``reproduction``: see :func:`reproduction`.

    Placement (see :mod:`whale_train.placement`): with ``devices``, each job leases its own GPUs and
    ``train`` is called with a third argument, ``{"CUDA_VISIBLE_DEVICES": ...}``; with ``ray``, every
    run is submitted at once as a Ray task (``train`` is not used) and Ray places them. With ``domains``,
    only the runs of those domains are run (a grid run in parts, a domain at a time); the table is always
    built from every finished run. With ``hours``, no run starts once that many hours have passed (the
    runs already started finish): a session's share of a grid run in parts ends with no run cut short.

    With ``cfg.record`` (see :mod:`whale_train.compare.record`), every finished run is also copied there
    (and any finished in ``out`` but missing there, first), and a run finished there counts as finished."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs = plan(cfg)
    unique = {r.config.name: r for r in reversed(runs)}  # the first spec of each distinct config
    located = {name: locate(out, cfg.record, r.config) for name, r in unique.items()}
    states = {name: state for name, (state, _) in located.items()}
    stale = sorted(n for n, s in states.items() if s == "stale")
    if stale:
        raise ValueError(
            f"{out}/runs holds runs of another config: {', '.join(stale)}; remove them or choose another --out"
        )
    if cfg.record is not None and (other := stale_records(cfg.record, [r.config for r in unique.values()])):
        raise ValueError(
            f"the record {cfg.record} holds runs of another config: {', '.join(other)}; a record belongs to one "
            "grid (give this one a record of its own)"
        )
    hold_folder(out, ".compare.lock", "whale compare")
    try:
        (out / "grid.yaml").write_text(yaml.safe_dump(cfg.source, sort_keys=False))
        (out / "configs").mkdir(exist_ok=True)
        todo = []
        for name in dict.fromkeys(r.config.name for r in runs):  # plan order
            path = out / "configs" / f"{name}.yaml"
            text = yaml.safe_dump(unique[name].config.to_dict(), sort_keys=False)
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
            if states[name] == "partial":
                saved = out / "runs" / name / "config.yaml"
                if saved.read_text() != text:  # the same config, written before a TrainConfig field was
                    saved.write_text(text)  # added: as this version writes it, so that --resume accepts it
            if states[name] != "done" and (domains is None or unique[name].domain in domains):
                todo.append(name)
        skipped = sorted(n for n, s in states.items() if s == "done")
        if cfg.keep_checkpoints == "evaluated":
            for name in skipped:
                if located[name][1] == out / "runs" / name:  # not a run read from the record
                    prune_checkpoints(out / "runs" / name)
        if cfg.record is not None:
            added = sync(out, cfg.record, [unique[n].config for n in skipped])
            if added:
                log(f"recorded {len(added)} finished run(s) in {cfg.record}: {', '.join(added)}")
        log(
            f"{len(unique)} runs: {len(skipped)} finished, "
            f"{sum(states[n] == 'partial' for n in todo)} to continue, {sum(states[n] == 'new' for n in todo)} to start"
            f" ({jobs} at a time)"
        )
        started = time.monotonic()
        deadline = None if hours is None else started + 3600 * hours
        failed: list[str] = []
        postponed: list[str] = []
        done = [0]
        lock = threading.Lock()

        def work(name: str) -> None:
            t0 = time.monotonic()
            if deadline is not None and t0 >= deadline:
                with lock:
                    postponed.append(name)
                return
            log(f"  start {name} ({states[name]})")
            config_path, run_dir = out / "configs" / f"{name}.yaml", out / "runs" / name
            if ray is not None:
                rc = ray.run(config_path, run_dir)
            elif devices is not None:
                with devices.lease() as leased:
                    visible = ",".join(leased)
                    placement.record_placement(run_dir, via="local", devices=visible)
                    rc = train(config_path, run_dir, {"CUDA_VISIBLE_DEVICES": visible})
            else:
                rc = train(config_path, run_dir)
            if rc == 0 and cfg.keep_checkpoints == "evaluated":
                prune_checkpoints(run_dir)
            if rc == 0 and cfg.record is not None:
                export_run(run_dir, cfg.record)
            with lock:
                done[0] += 1
                if rc != 0:
                    failed.append(name)
                status = "done" if rc == 0 else f"FAILED (exit {rc}; see {out / 'runs' / name / 'train.log'})"
                log(f"  [{done[0]}/{len(todo)}] {name}: {status} in {time.monotonic() - t0:.0f} s")

        if todo:
            if ray is not None:  # Ray queues the tasks its cluster cannot place yet
                jobs = len(todo)
            elif devices is not None:
                jobs = min(jobs, devices.slots)
            warm = placement.warm_starts() if ray is None and devices is None else contextlib.nullcontext()
            with warm, ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
                list(pool.map(work, todo))
        if postponed:
            log(
                f"--hours {hours:g} reached: {len(postponed)} run(s) not started; rerun with --resume for them"
            )
        wall = time.monotonic() - started
        table = build_table(cfg, runs, out)
        table["invocation"] = {
            "ran": [n for n in todo if n not in postponed],
            "skipped": skipped,
            "failed": sorted(failed),
            "postponed": postponed,
            "jobs": jobs,
            "wall_seconds": round(wall, 1),
        }
        if reference is not None:
            table["reproduction"] = reproduction(table, reference)
        write_table(table, out)
    finally:
        release_folder(out, ".compare.lock")
    return table


def write_table(table: dict[str, Any], out: Path) -> Path:
    """``compare.json``, ``compare.md`` and ``plots/`` in ``out``."""
    plots_dir = out / "plots"
    plots_dir.mkdir(exist_ok=True)
    plots = {}
    for domain in table["domains"]:
        path = plot_accuracy(table, domain, plots_dir / f"accuracy_{domain}.png")
        plots[domain] = str(path.relative_to(out))
    if table.get("ablation"):
        plots["ablation"] = str(plot_ablation(table, plots_dir / "ablation.png").relative_to(out))
    table["plots"] = plots
    (out / "compare.json").write_text(json.dumps(table, indent=1))
    path = out / "compare.md"
    path.write_text(to_markdown(table, plots))
    return path
