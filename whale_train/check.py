"""``check_harness``: what ``check_env`` is to envs, for harnesses.

It runs a harness on a few tasks with model-free LLMs and reports what breaks:

* the code fails validation or does not load;
* an episode raises, times out (computes without ever calling the env or the model), or hits the
  per-episode LLM call limit (a runaway loop);
* an episode never calls the model, or never steps the env;
* the harness *solves tasks by itself*: with a model that knows nothing of the task it solves more
  tasks than the env's chance level (random valid actions, ``env.chance_action``) allows. Such a harness
  makes the model irrelevant and is rejected as a solver.

The stand-in models cannot be told from a real one (``whale_train.null_llms``): log-likelihood scores
(negative, prompt-dependent, consistent), a model that answers plausibly but wrongly, and, when the
caller passes its model, the real model answering shuffled prompts. The test counts *tasks* (the k
samples of a task are not independent): a one-sided binomial test of the number of tasks solved at
least once against the chance of that under random actions. The tasks are drawn from the ``train``
split and, when ``score_tasks`` are given, half from the tasks being scored.
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


#: A harness whose null-model successes have a chance probability below this is a solver.
SOLVER_ALPHA = 0.01


def binomial_tail(n: int, x: int, q: float) -> float:
    """P(Binomial(n, q) >= x)."""
    q = min(max(q, 0.0), 1.0)
    return sum(math.comb(n, i) * q**i * (1 - q) ** (n - i) for i in range(x, n + 1))


def check_harness(
    harness: HarnessRef | str | Path,
    env_id: str,
    *,
    env_kwargs: dict[str, Any] | None = None,
    n_tasks: int = 16,
    seed: int = 0,
    trusted: bool = False,
    harness_seconds: float = 10.0,
    llm: Any = None,
    score_tasks: list[str] | None = None,
    score_split: str = "harness",
    progress: Any = None,
    max_llm_calls: int = 64,
    max_tokens: int = 512,
) -> HarnessReport:
    """Run ``harness`` on ``n_tasks`` tasks with model-free LLMs; report every problem found.

    ``llm``: the real model, for the permuted-real stand-in (skipped without one). ``score_tasks``:
    ids of the ``score_split`` tasks the harness will be scored on; half the check's tasks come from
    them. ``progress(done, total, mode)`` is called after every episode. Never raises for what the
    harness does: problems are in the report (``report.ok``, ``report.raise_for_problems()``).
    """
    import whale_envs  # noqa: F401  (registers the envs)
    from whale_train.null_llms import LogLikelihoodNull, PermutedReal, PlausibleWrong
    from whale_train.rollout import EpisodeLimits, RolloutConfig, run_rollouts

    name = str(harness.name if isinstance(harness, HarnessRef) else harness)
    report = HarnessReport(name, env_id)
    try:
        ref = harness if isinstance(harness, HarnessRef) else load_harness(harness)
    except (HarnessValidationError, FileNotFoundError) as exc:
        report.problems.append(f"does not load: {exc}")
        return report
    base_kwargs = {k: v for k, v in (env_kwargs or {}).items() if k != "split"}
    rng = random.Random(seed)
    groups: list[tuple[str, list[str]]] = []
    n_train = n_tasks
    if score_tasks:
        scored = sorted(rng.sample(sorted(score_tasks), min(n_tasks // 2, len(score_tasks))))
        groups.append((score_split, scored))
        n_train = n_tasks - len(scored)
    train = gym.make(env_id, **{**base_kwargs, "split": "train"}).unwrapped
    groups.insert(0, ("train", sorted(rng.sample(train.task_ids, min(n_train, len(train.task_ids))))))
    groups = [(split, ids) for split, ids in groups if ids]
    k = 2
    models = [LogLikelihoodNull("empty", seed), LogLikelihoodNull("random", seed), PlausibleWrong(seed)]
    if llm is not None:
        models.append(PermutedReal(llm, seed))
    tasks_total = sum(len(ids) for _, ids in groups)
    total, done = tasks_total * k * len(models), 0
    q = 0.0
    chance_sum = 0.0
    for split, ids in groups:
        c = chance_level(env_id, ids, {**base_kwargs, "split": split}, seed)
        chance_sum += c * len(ids)
    report.chance = chance_sum / max(1, tasks_total)
    # The chance that random actions solve a task at least once in k tries (floored: a small sample).
    q = 1 - (1 - max(report.chance, 0.01)) ** k
    limits = EpisodeLimits(
        max_llm_calls=max_llm_calls, max_tokens=max_tokens, harness_seconds=harness_seconds
    )
    config = RolloutConfig(k=k, seed=seed, concurrency=16, limits=limits, trusted=trusted)
    for model in models:
        mode = model.name.removeprefix("null-")
        trajs: list = []
        for split, ids in groups:

            def tick(_t, mode=mode):
                nonlocal done
                done += 1
                if progress is not None:
                    progress(done, total, mode)

            trajs += run_rollouts(
                ref,
                env_id,
                model,
                ids,
                env_kwargs={**base_kwargs, "split": split},
                config=config,
                progress=tick,
            )
        report.episodes += len(trajs)
        _episode_problems(trajs, mode, report)
        by_task: dict[str, list[bool]] = {}
        for t in trajs:
            by_task.setdefault(t.task_id, []).append(t.solved)
        report.null_scores[mode] = sum(t.solved for t in trajs) / max(1, len(trajs))
        n, hits = len(by_task), sum(any(v) for v in by_task.values())
        p_value = binomial_tail(n, hits, q)
        if hits and p_value < SOLVER_ALPHA:
            report.problems.append(
                f"solver: with a {mode} model it solves {hits} of {n} tasks (mean {report.null_scores[mode]:.2f}); "
                f"random actions (chance level {report.chance:.2f}) would do that with probability "
                f"{p_value:.1e}: the harness solves tasks without the model"
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
