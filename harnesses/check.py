"""``check_harness``: what ``check_env`` is to envs, for harnesses.

It runs a harness on a few tasks with model-free LLMs and reports what breaks:

* the code fails validation or does not load;
* an episode raises, times out (computes without ever calling the env or the model), or hits the
  per-episode LLM call limit (a runaway loop);
* an episode never calls the model, or never steps the env;
* the harness *solves tasks by itself*: with a null LLM (empty or random completions, random scores)
  it scores above the env's chance level (random valid actions, ``env.chance_action``) by more than
  the noise. Such a harness makes the model irrelevant and is rejected as a solver.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym

from harnesses.loader import HarnessRef, load_harness
from harnesses.validate import HarnessValidationError


@dataclass
class HarnessReport:
    harness: str
    env_id: str
    problems: list[str] = field(default_factory=list)
    chance: float = 0.0
    null_scores: dict[str, float] = field(default_factory=dict)
    episodes: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def raise_for_problems(self) -> None:
        if self.problems:
            raise HarnessValidationError(
                f"{self.harness} fails check_harness on {self.env_id}: " + "; ".join(self.problems)
            )

    def __str__(self) -> str:
        head = f"check_harness({self.harness}, {self.env_id}): {'ok' if self.ok else 'FAILED'}"
        scores = ", ".join(f"{k} {v:.2f}" for k, v in self.null_scores.items())
        lines = [head, f"  chance level {self.chance:.2f}; without a model: {scores}"]
        lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)


def chance_level(
    env_id: str, task_ids: list[str], env_kwargs: dict[str, Any], seed: int = 0, samples: int = 4
) -> float:
    """The mean reward of random valid actions (``env.chance_action``) on ``task_ids``."""
    env = gym.make(env_id, **env_kwargs).unwrapped
    rng = random.Random(seed)
    total = 0.0
    for task_id in task_ids:
        for _ in range(samples):
            env.reset(seed=seed, options={"task_id": task_id})
            while True:
                _, reward, terminated, truncated, _ = env.step(env.chance_action(rng))
                if terminated or truncated:
                    break
            total += reward
    return total / (len(task_ids) * samples)


def check_harness(
    harness: HarnessRef | str | Path,
    env_id: str,
    *,
    env_kwargs: dict[str, Any] | None = None,
    n_tasks: int = 16,
    seed: int = 0,
    trusted: bool = False,
    harness_seconds: float = 10.0,
) -> HarnessReport:
    """Run ``harness`` on ``n_tasks`` tasks of the ``train`` split with null LLMs; report every problem found.

    Never raises for what the harness does: problems are in the report (``report.ok``,
    ``report.raise_for_problems()``).
    """
    import whale_envs  # noqa: F401  (registers the envs)
    from whale_train.llm.scripted import NullLLM
    from whale_train.rollout import EpisodeLimits, RolloutConfig, run_rollouts, summarize

    name = str(harness.name if isinstance(harness, HarnessRef) else harness)
    report = HarnessReport(name, env_id)
    try:
        ref = harness if isinstance(harness, HarnessRef) else load_harness(harness)
    except (HarnessValidationError, FileNotFoundError) as exc:
        report.problems.append(f"does not load: {exc}")
        return report
    env_kwargs = {"split": "train", **(env_kwargs or {})}
    probe = gym.make(env_id, **env_kwargs).unwrapped
    rng = random.Random(seed)
    task_ids = sorted(rng.sample(probe.task_ids, min(n_tasks, len(probe.task_ids))))
    report.chance = chance_level(env_id, task_ids, env_kwargs, seed)
    limits = EpisodeLimits(max_llm_calls=64, harness_seconds=harness_seconds)
    config = RolloutConfig(k=2, seed=seed, concurrency=16, limits=limits, trusted=trusted)
    for mode in ("empty", "random"):
        trajs = run_rollouts(ref, env_id, NullLLM(mode, seed), task_ids, env_kwargs=env_kwargs, config=config)
        report.episodes += len(trajs)
        summary = summarize(trajs)
        report.null_scores[mode] = summary["mean"]
        _episode_problems(trajs, mode, report)
        n = summary["episodes"]
        tolerance = max(0.05, 3 * math.sqrt(max(report.chance * (1 - report.chance), 0.01) / n))
        if summary["mean"] > report.chance + tolerance:
            report.problems.append(
                f"solver: with a {mode} LLM it scores {summary['mean']:.2f}, above the chance level "
                f"{report.chance:.2f} (+{tolerance:.2f}): the harness solves tasks without the model"
            )
    report.problems = list(dict.fromkeys(report.problems))
    return report


def _episode_problems(trajs: list, mode: str, report: HarnessReport) -> None:
    errors = [t for t in trajs if t.error and t.failure == "harness_error"]
    if errors:
        first = errors[0].error.strip().splitlines()[-1]
        report.problems.append(f"raised in {len(errors)}/{len(trajs)} episodes with a {mode} LLM: {first}")
    timeouts = [t for t in trajs if t.failure == "timeout"]
    if timeouts:
        report.problems.append(f"never terminated: {len(timeouts)} episodes timed out ({timeouts[0].error})")
    silent = [t for t in trajs if not t.calls and not t.error]
    if silent:
        report.problems.append(f"no LLM call recorded in {len(silent)}/{len(trajs)} episodes")
    idle = [t for t in trajs if not t.steps and not t.error]
    if idle:
        report.problems.append(f"never stepped the env in {len(idle)}/{len(trajs)} episodes")
