"""Evaluation: a harness run with a model on task sets, k samples a task, and what the episodes say.

    tasks = task_set("whale/Math-v0", {"split": "test"}, limit=200)    # the env built once: ids, source
    result = evaluate(harness, "whale/Math-v0", llm, [tasks], k=8, seed=eval_seed(run_seed))
    result.summary["mean"], result.summary["by_data_source"], result.errors
    result.write_traces(out / "traces.jsonl")

Every evaluation of the project goes through :func:`evaluate`: ``whale eval``, the trainer's test
evaluations and selection score, the harness search's scoring of candidates (``harness`` split) and its
test scores, ``whale check``'s stand-in episodes and the model card's calibration. Each caller builds
its task sets once (:func:`task_set`, :class:`TaskSet`) and reads one :class:`EvalResult`: the
trajectories, each episode's output and score, the summary (``rollout.metrics.summarize``: mean@k ±
SE, pass@k, per difficulty, failures, tokens, plus the mean per ``data_source``) and the errors (by
failure category: how many, and the first message). The sample seeds of the evaluations that must not
reuse a run's training samples are offsets of the run's seed, written here only (:func:`eval_seed`,
:func:`select_seed`); they are part of the evaluation cache's key, so they never change.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from whale_train.rollout import (
    EpisodeLimits,
    RolloutConfig,
    Trajectory,
    by_data_source,
    run_rollouts,
    summarize,
    write_jsonl,
)

#: Offset of a run's seed for the test evaluations' samples (the trainer's in-run evaluations, the
#: search's test scores): never the samples of training or of the search.
EVAL_SEED_OFFSET = 10_000
#: Offset of a run's seed for the selection score's samples (the trainer's ``eval.select_limit``).
SELECT_SEED_OFFSET = 20_000


def eval_seed(seed: int) -> int:
    """The sample seed of a test evaluation under run seed ``seed``."""
    return EVAL_SEED_OFFSET + seed


def select_seed(seed: int) -> int:
    """The sample seed of the selection score (harness split) under run seed ``seed``."""
    return SELECT_SEED_OFFSET + seed


@dataclass
class TaskSet:
    """The tasks of one env construction: its keyword arguments (``gym.make``'s, split included) and the
    ids to run. ``source`` is the env's task source (its ``name``, and the ``data_source`` of each task
    for the per-source summary); None where nobody reads it."""

    env_kwargs: dict[str, Any]
    ids: list[str]
    source: Any = None

    @classmethod
    def of(cls, env: Any, env_kwargs: dict[str, Any], limit: int = 0) -> TaskSet:
        """The first ``limit`` tasks (0: all) of ``env`` (built with ``env_kwargs``)."""
        env = env.unwrapped
        ids = env.task_ids[:limit] if limit else env.task_ids
        return cls(dict(env_kwargs), list(ids), env.source)


def task_set(env_id: str, env_kwargs: dict[str, Any], limit: int = 0) -> TaskSet:
    """Build ``env_id`` once with ``env_kwargs`` and take the first ``limit`` tasks of its split (0: all)."""
    import gymnasium as gym

    env = gym.make(env_id, **env_kwargs)
    try:
        return TaskSet.of(env, env_kwargs, limit)
    finally:
        env.close()


@dataclass
class EvalResult:
    """What an evaluation ran and found: the trajectories (task order within each task set, the sets in
    the order given), the summary, the errors and the wall time."""

    trajectories: list[Trajectory]
    #: ``summarize`` of the trajectories, plus ``by_data_source`` (mean per ``meta["data_source"]``; {}
    #: when no task names one)
    summary: dict[str, Any]
    #: episodes that ended in an error, by failure category: ``episodes``, the ``first`` message, its ``task_id``
    errors: dict[str, dict[str, Any]] = field(default_factory=dict)
    wall_seconds: float = 0.0

    @property
    def scores(self) -> list[float]:
        """Each episode's score: 1.0 solved, else 0.0 (rewards are binary)."""
        return [float(t.solved) for t in self.trajectories]

    @property
    def outputs(self) -> list[str | None]:
        """Each episode's output: its last action (the answer), None for an episode that never acted."""
        return [t.steps[-1].action if t.steps else None for t in self.trajectories]

    def write_traces(self, path: str | Path) -> Path:
        """The trajectories as JSON lines (``traces.jsonl``: ``whale traces`` reads them), atomically."""
        return write_jsonl(self.trajectories, path)


def summary_of(trajs: Sequence[Trajectory], sources: Sequence[Any] = ()) -> dict[str, Any]:
    """``summarize`` plus the mean per data source of the tasks ``sources`` hold."""
    summary = summarize(trajs)
    summary["by_data_source"] = by_data_source(list(sources), summary["per_task"])
    return summary


def evaluate(
    harness: Any,
    env_id: str,
    llm: Any,
    task_sets: Sequence[TaskSet],
    *,
    k: int = 1,
    seed: int = 0,
    concurrency: int = 64,
    trusted: bool = False,
    limits: EpisodeLimits | None = None,
    progress: Callable[[Trajectory], None] | None = None,
    env: Any = None,
) -> EvalResult:
    """Run ``harness`` (a ``HarnessRef``) with ``llm`` on every task of ``task_sets``, ``k`` samples each,
    episode seeds from ``seed`` (``rollout.records.stable_seed``); ``trusted`` runs a shipped harness in
    this process, otherwise it runs in the sandboxed worker. ``progress(trajectory)`` after each episode.
    ``env``: the env of the one task set, already built and checked by ``rollout.preflight`` (see
    ``run_rollouts``)."""
    if env is not None and len(task_sets) != 1:
        raise ValueError(f"env= is the env of one task set, and {len(task_sets)} were given")
    config = RolloutConfig(
        k=k, seed=seed, concurrency=concurrency, trusted=trusted, limits=limits or EpisodeLimits()
    )
    start = time.monotonic()
    trajs: list[Trajectory] = []
    for tasks in task_sets:
        trajs += run_rollouts(
            harness,
            env_id,
            llm,
            tasks.ids,
            env_kwargs=tasks.env_kwargs,
            config=config,
            progress=progress,
            env=env,
        )
    wall = time.monotonic() - start
    sources = [tasks.source for tasks in task_sets if tasks.source is not None]
    return EvalResult(trajs, summary_of(trajs, sources), first_errors(trajs), wall)


def first_errors(trajs) -> dict[str, dict]:
    """Episodes that ended in an error (the harness raised, a model call failed, a timeout), by failure
    category: how many, and the first message with its task, so a failure is never only in the traces."""
    out: dict[str, dict] = {}
    for t in trajs:
        if not t.error:
            continue
        entry = out.setdefault(t.failure or "error", {"episodes": 0, "first": error_headline(t.error)})
        entry["episodes"] += 1
        entry.setdefault("task_id", t.task_id)
    return out


def error_headline(error: str) -> str:
    """The line of an episode's error that says what went wrong: a traceback's exception (the lines after
    its last frame), else the first line (a model error is ``model_error: ...`` first, then what
    the harness did after it)."""
    lines = [line for line in error.strip("\n").rstrip().splitlines() if line.strip()]
    if not lines:
        return ""
    frames = [i for i, line in enumerate(lines) if line.startswith("  File ")]
    if frames and ("Traceback (most recent call last)" in lines[0] or frames[0] == 0):
        after = lines[frames[-1] + 1 :]
        start = next((i for i, line in enumerate(after) if not line[:1].isspace()), None)
        if start is not None:
            prefix = lines[0].split("Traceback")[0] if frames[0] > 0 else ""
            return prefix + " ".join(line.strip() for line in after[start:])
    return lines[0]
