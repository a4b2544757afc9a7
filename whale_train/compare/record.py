"""The grid's record: the small text files of every finished run, kept where a commit can carry them.

A grid that takes many sessions cannot rely on its run folders (``--out``, with model checkpoints and
traces: gigabytes) outliving the machine. A compare config with ``record: FOLDER`` keeps, for every
finished run, what the table is built from, in ``FOLDER/<run>/``::

    config.yaml    the run's resolved config (what ``run_state`` checks it against)
    ledger.jsonl   every unit, phase switch and evaluation (the three numbers, the curves, the account)
    state.json     where the run ended (its wall time)
    eval/*.json    each evaluation's summary (mean, SE, pass@k, by difficulty, errors; no traces)

about 100 KB a run. A run finished in the record is finished for ``whale compare``: it is skipped, and
the table reads it from there, so a later session on a fresh machine continues the grid from the
record alone. A run unfinished in ``--out`` is continued from there as before; only finished runs are
recorded (a partial run's checkpoints are what its resume needs, and those stay in ``--out``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from whale_train.compare.plan import run_state
from whale_train.trainer import TrainConfig

#: The files of a finished run that the record keeps (``eval/*.json``: the summaries, not the traces).
RECORD_FILES = ("config.yaml", "ledger.jsonl", "state.json")


def export_run(run_dir: Path, record: Path) -> Path:
    """Copy the record files of the finished run in ``run_dir`` to ``record/<run>/``: into a temporary
    folder first, renamed into place, so a record folder is whole or absent. A record of the same name
    holding another config is never replaced: ValueError (a record belongs to one grid)."""
    target = record / run_dir.name
    config = TrainConfig.from_dict(yaml.safe_load((run_dir / "config.yaml").read_text()))
    if run_state(target, config) == "stale":
        raise ValueError(f"{target} records a run of another config; a record belongs to one grid")
    tmp = record / f".{run_dir.name}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "eval").mkdir(parents=True)
    for name in RECORD_FILES:
        shutil.copy2(run_dir / name, tmp / name)
    for path in sorted((run_dir / "eval").glob("*.json")):
        shutil.copy2(path, tmp / "eval" / path.name)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target


def stale_records(record: Path, configs: list[TrainConfig]) -> list[str]:
    """The runs of ``configs`` whose record folder holds a run of another config."""
    return sorted(c.name for c in configs if run_state(record / c.name, c) == "stale")


def locate(out: Path, record: Path | None, config: TrainConfig) -> tuple[str, Path]:
    """A run's state and the folder to read it from: ``out/runs/<run>`` unless the run is unfinished
    there and finished in the record (``done`` from ``record/<run>``). A stale folder in ``--out`` is
    reported as stale whatever the record holds: two configs for one name is an error to fix."""
    run_dir = out / "runs" / config.name
    state = run_state(run_dir, config)
    if state in ("done", "stale") or record is None:
        return state, run_dir
    kept = record / config.name
    if run_state(kept, config) == "done":
        return "done", kept
    return state, run_dir


def sync(out: Path, record: Path, configs: list[TrainConfig]) -> list[str]:
    """Record every run finished in ``out`` whose record is missing or differs (a run finished before the
    record existed, or whose copy a killed session cut short); returns their names."""
    added = []
    for config in configs:
        run_dir = out / "runs" / config.name
        if run_state(run_dir, config) != "done":
            continue
        kept = record / config.name
        if not (kept / "ledger.jsonl").exists() or (
            (kept / "ledger.jsonl").read_bytes() != (run_dir / "ledger.jsonl").read_bytes()
        ):
            export_run(run_dir, record)
            added.append(config.name)
    return added
