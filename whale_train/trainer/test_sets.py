"""The test sets a run's evaluations score, and ``splits.json``, the run's record of its split key (its
fingerprint, never the secret) and, after the run, of the ids of every test set."""

from __future__ import annotations

import json
from pathlib import Path

from whale_envs import splits
from whale_train.evaluation import TaskSet, task_set
from whale_train.files import atomic_write_text
from whale_train.trainer.config import TrainConfig


def eval_task_sets(config: TrainConfig) -> list[TaskSet]:
    """The test sets of ``config.eval_sets``, each env built once: the first ``eval.limit`` tasks of its
    split. A task id in two test sets is a ValueError naming both (their results would mix)."""
    seen: dict[str, int] = {}
    out = []
    for index, kwargs in enumerate(config.eval_sets):
        tasks = task_set(config.env, kwargs, config.eval.limit)
        if not tasks.ids:
            raise ValueError(
                f"eval: the test set {kwargs.get('tasks') or 'of the run'} has no tasks in split {kwargs['split']!r}"
            )
        for task_id in tasks.ids:
            other = seen.setdefault(task_id, index)
            if other != index:
                raise ValueError(
                    f"eval.tasks: task id {task_id!r} is in both {config.eval_sets[other].get('tasks')} and "
                    f"{kwargs.get('tasks')}; the test sets "
                    "must not share ids (aime: give a file without a year column ?year=2025)"
                )
        out.append(tasks)
    return out


def eval_task_ids(config: TrainConfig) -> list[list[str]]:
    """The task ids each test set of ``config.eval_sets`` contributes (:func:`eval_task_sets`)."""
    return [tasks.ids for tasks in eval_task_sets(config)]


def check_split_secret(run_dir: Path, resume: bool) -> None:
    """Record the split key's fingerprint in ``splits.json`` (never the secret), or, on ``--resume``,
    refuse in one line a run whose splits were drawn under another secret (its tasks would change split
    in the middle of the run)."""
    path = run_dir / "splits.json"
    now = splits.fingerprint()
    if resume and path.exists():
        then = json.loads(path.read_text()).get("fingerprint")
        if then != now:
            raise ValueError(
                f"{run_dir} drew its splits under split secret {then}, this process has {now}: set "
                f"{splits.SECRET_ENV} to that run's secret to resume it (docs/HARNESSES.md)"
            )
    if not path.exists():
        atomic_write_text(path, json.dumps({"fingerprint": now}, indent=1) + "\n")


def list_test_ids(run_dir: Path, config: TrainConfig, test_sets: list[TaskSet]) -> None:
    """After the run, ``splits.json`` lists the ids of every test set (``eval_task_sets``), for the user
    (nothing a harness or a proposer reads is written during the run)."""
    sets = [
        {"tasks": kwargs.get("tasks"), "split": kwargs["split"], "ids": tasks.ids}
        for kwargs, tasks in zip(config.eval_sets, test_sets, strict=True)
    ]
    record = {"fingerprint": splits.fingerprint(), "test_sets": sets}
    atomic_write_text(run_dir / "splits.json", json.dumps(record, indent=1) + "\n")
