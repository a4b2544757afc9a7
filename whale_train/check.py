"""``check_harness``: what ``check_env`` is to envs, for harnesses.

It runs a harness on many tasks with stand-in LLMs and reports what breaks:

* the code fails validation or does not load;
* an episode raises, times out (computes without ever calling the env or the model), or hits the
  per-episode LLM call limit (a runaway loop);
* an episode never calls the model, or never steps the env;
* the harness *solves tasks by itself*: with a model that knows nothing of the task it solves more
  tasks than the env's chance level (random valid actions, ``env.chance_action``) allows. Such a harness
  makes the model irrelevant and is rejected as a solver.

The stand-ins (``whale_train.null_llms``) copy everything a harness can observe of the real model
(``llm``): its chat-template flag, its determinism (temperature 0 greedy, otherwise a function of the
request's seed), token boundaries, finish reasons and log-likelihood-shaped scores. Without ``llm`` the
flag is unknown, so the model-free stand-ins run twice, once with each value. With ``llm``, the real
model also answers *another task's prompt* (``OtherTaskReal``): the model's own outputs, about a real
task of this env, only not the one being played.

The test, one per stand-in: one sample per task (the tasks are independent; a harness's samples of
one task are not), a one-sided binomial test of the number of tasks solved against the chance level,
at ``SOLVER_ALPHA`` split evenly over the stand-ins (Bonferroni: an honest harness is wrongly rejected
with probability below ``SOLVER_ALPHA`` in all). ``solver_power`` is the probability that a solver is
caught; the default ``CHECK_TASKS`` is chosen with it (docs/HARNESSES.md shows the numbers). The tasks
are drawn from the ``train`` split and, when ``score_tasks`` are given, half from the tasks being scored.
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
        lines = [head, f"  chance level {self.chance:.3f}; solved with each stand-in model: {scores}"]
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


#: What ``check_harness(stand_ins=...)`` runs: every stand-in, those that need no weights (they copy
#: what the model shows of itself), or the real model answering other tasks' prompts.
STAND_IN_PARTS = ("all", "weight-free", "real-model")
#: The probability that an honest harness is wrongly rejected as a solver, in all: each stand-in's test
#: runs at ``SOLVER_ALPHA / number of stand-ins``.
SOLVER_ALPHA = 0.01
#: Tasks of a check by default (``whale check --n-tasks``): a solver at 3x the chance level is caught
#: with probability >= 0.9 where chance is 2 % or more, at 6x with >= 0.99 (docs/HARNESSES.md).
CHECK_TASKS = 400
#: The other-task stand-in is held to this many times the chance level: a real model that answers
#: another task's prompt still knows which of *this* task's options look good in general (a queen move
#: that gives check), so an honest harness that asks it to choose among them beats chance (measured:
#: 3.7x on 400 tasks with the tiny model and ``chess_puzzles/choose``); a solver hiding behind a
#: real-model tell solves far more.
OTHER_TASK_FACTOR = 4.0
#: The chance level the test assumes is at least this: a few lucky tasks of a near-zero-chance env (a
#: plausible answer that happens to be right) are not a solver.
CHANCE_FLOOR = 0.01


def binomial_tail(n: int, x: int, q: float) -> float:
    """P(Binomial(n, q) >= x)."""
    q = min(max(q, 0.0), 1.0)
    if x <= 0:
        return 1.0
    return sum(math.comb(n, i) * q**i * (1 - q) ** (n - i) for i in range(x, n + 1))


def solver_threshold(n: int, q: float, alpha: float) -> int:
    """The fewest tasks solved of ``n`` that the test calls a solver (chance ``q``, level ``alpha``)."""
    x = 1
    while x <= n and binomial_tail(n, x, q) >= alpha:
        x += 1
    return x


def solver_power(
    n: int, chance: float, solves: float, stand_ins: int = 4, alpha: float = SOLVER_ALPHA
) -> float:
    """The probability that a harness solving a fraction ``solves`` of tasks with a stand-in is rejected
    by that stand-in's test on ``n`` tasks, at an env's ``chance`` level."""
    x = solver_threshold(n, max(chance, CHANCE_FLOOR), alpha / stand_ins)
    return binomial_tail(n, x, min(solves, 1.0))


def task_texts(
    env_id: str, split: str, task_ids: list[str], env_kwargs: dict[str, Any], seed: int
) -> list[dict[str, str]]:
    """The texts a harness can put in a prompt, per task: the first observation, each of its lines,
    the public info's text fields (a list of texts joined as a harness would). ``OtherTaskReal`` swaps
    them between tasks. The env is reset with the seed the episode gets, so the texts are the same."""
    from whale_train.rollout.records import stable_seed

    env = gym.make(env_id, **{**env_kwargs, "split": split}).unwrapped
    out = []
    for task_id in task_ids:
        obs, info = env.reset(seed=stable_seed(seed, task_id, 0), options={"task_id": task_id})
        fields = {"obs": str(obs)}
        lines = [line.strip() for line in str(obs).splitlines()]
        fields.update({f"obs:{i}": line for i, line in enumerate(lines) if len(line) >= 8})
        for key, value in (info or {}).items():
            if isinstance(value, str):
                fields[f"info.{key}"] = value
            elif isinstance(value, list | tuple) and value and all(isinstance(v, str) for v in value):
                for sep in (", ", "\n", " ", ","):
                    fields[f"info.{key}:{sep}"] = sep.join(value)
        out.append(fields)
    return out


def check_harness(
    harness: HarnessRef | str | Path,
    env_id: str,
    *,
    env_kwargs: dict[str, Any] | None = None,
    n_tasks: int = CHECK_TASKS,
    seed: int = 0,
    trusted: bool = False,
    harness_seconds: float = 10.0,
    llm: Any = None,
    score_tasks: list[str] | None = None,
    score_split: str = "harness",
    progress: Any = None,
    max_llm_calls: int = 64,
    max_tokens: int = 512,
    stand_ins: str = "all",
) -> HarnessReport:
    """Run ``harness`` on ``n_tasks`` tasks (one episode each) with every stand-in LLM; report every
    problem found.

    ``llm``: the real model being checked: the stand-ins copy what a harness can see of it, and it
    answers other tasks' prompts (``OtherTaskReal``). Without it the model-free stand-ins run with and
    without a chat template. ``score_tasks``: ids of the ``score_split`` tasks the harness will be
    scored on; half the check's tasks come from them. ``progress(done, total, mode)`` is called after
    every episode. Never raises for what the harness does: problems are in the report
    (``report.ok``, ``report.raise_for_problems()``), a model call that fails included.

    ``stand_ins``: ``"all"``, or one of the check's two parts (see ``STAND_IN_PARTS``): ``"weight-free"``
    (the stand-ins that copy only what ``llm`` shows of itself: they run while the weights train, with a
    detached ``null_llms.Likeness``) and ``"real-model"`` (the real model on another task's prompt: under
    the weights being scored). Each part tests at the level of the whole check (``SOLVER_ALPHA`` over all
    four stand-ins), so the two parts together report what ``"all"`` reports.
    """
    if stand_ins not in STAND_IN_PARTS:
        raise ValueError(f"stand_ins must be one of {', '.join(STAND_IN_PARTS)}, got {stand_ins!r}")
    import whale_envs  # noqa: F401  (registers the envs)
    from whale_train.evaluation import TaskSet, evaluate
    from whale_train.null_llms import LogLikelihoodNull, OtherTaskReal, PlausibleWrong, derangement_swaps
    from whale_train.rollout import EpisodeLimits, reusing_workers

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
    if llm is not None:
        models: list[Any] = [
            LogLikelihoodNull("empty", seed, like=llm),
            LogLikelihoodNull("random", seed, like=llm),
            PlausibleWrong(seed, like=llm),
        ]
        labels = ["empty", "random", "plausible", "other-task"]
        if stand_ins != "weight-free":
            texts = [t for split, ids in groups for t in task_texts(env_id, split, ids, base_kwargs, seed)]
            models.append(OtherTaskReal(llm, derangement_swaps(texts, seed), seed))
        else:
            models.append(None)  # the real model's part, run apart (it counts in the test's level)
    else:
        models = [
            m(chat)
            for chat in (False, True)
            for m in (
                lambda chat: LogLikelihoodNull("empty", seed, chat=chat),
                lambda chat: LogLikelihoodNull("random", seed, chat=chat),
                lambda chat: PlausibleWrong(seed, chat=chat),
            )
        ]
        labels = [f"{m.name.removeprefix('null-')}{' (chat)' if m.has_chat_template else ''}" for m in models]
    tasks_total = sum(len(ids) for _, ids in groups)
    chance_sum = 0.0
    for split, ids in groups:
        c = chance_level(env_id, ids, {**base_kwargs, "split": split}, seed)
        chance_sum += c * len(ids)
    report.chance = chance_sum / max(1, tasks_total)
    q = max(report.chance, CHANCE_FLOOR)
    alpha = SOLVER_ALPHA / len(models)
    keep = [
        (m, mode)
        for m, mode in zip(models, labels, strict=True)
        if m is not None
        and (stand_ins == "all" or (stand_ins == "real-model") == isinstance(m, OtherTaskReal))
    ]
    models, labels = [m for m, _ in keep], [mode for _, mode in keep]
    total, done = tasks_total * len(models), 0
    limits = EpisodeLimits(
        max_llm_calls=max_llm_calls, max_tokens=max_tokens, harness_seconds=harness_seconds
    )
    task_sets = [TaskSet({**base_kwargs, "split": split}, ids) for split, ids in groups]
    replays: dict[tuple, bool] = {}
    # The stand-ins that show the same model flags share a sandboxed worker (reusing_workers: one worker
    # start instead of one per stand-in, about 0.1 s of CPU each); the worker's spawner keeps each
    # episode's memory free of the others' prompts and replies, as within one evaluation.
    with reusing_workers():
        for model, mode in zip(models, labels, strict=True):

            def tick(_t, mode=mode):
                nonlocal done
                done += 1
                if progress is not None:
                    progress(done, total, mode)

            trajs = evaluate(
                ref,
                env_id,
                model,
                task_sets,
                k=1,
                seed=seed,
                concurrency=16,
                trusted=trusted,
                limits=limits,
                progress=tick,
            ).trajectories
            report.episodes += len(trajs)
            _episode_problems(trajs, mode, report)
            report.null_scores[mode] = sum(t.solved for t in trajs) / max(1, len(trajs))
            n, hits = len(trajs), sum(bool(t.solved) for t in trajs)
            level = min(1.0, OTHER_TASK_FACTOR * q) if isinstance(model, OtherTaskReal) else q
            p_value = binomial_tail(n, hits, level)
            if not hits or p_value >= alpha:
                continue
            # Above chance: do its actions solve *their own* task more often than other tasks?
            solved = _replayed(env_id, trajs, groups, base_kwargs, seed, replays)
            p_own = own_task_tail(solved)
            if p_own < alpha:
                report.problems.append(
                    f"solver: with the {mode} stand-in model it solves {hits} of {n} tasks; at a success "
                    f"rate of {level:.3f} (chance level {report.chance:.3f}) that has probability {p_value:.1e}, and "
                    f"its actions solve other tasks {sum(sum(r) for _, r in solved)} times in "
                    f"{sum(len(r) for _, r in solved)} replays: its own task that often has probability "
                    f"{p_own:.1e} (both < {alpha:.1e}): the harness solves tasks without the model"
                )
    report.problems = list(dict.fromkeys(report.problems))
    return report


#: Most replays of one check (``_replayed``): each episode is replayed on up to 8 other tasks.
REPLAYS = 3200


def own_task_tail(solved: list[tuple[bool, list[bool]]]) -> float:
    """P(as many own-task successes as observed) if a harness's actions were no better for their own
    task than for the other tasks they were replayed on: per episode, (own solved, others solved); its
    own task is then any one of its 1 + m tasks at random (an exact permutation test, one
    Poisson-binomial tail)."""
    dist = [1.0]  # P(own successes = j) so far
    observed = 0
    for own, others in solved:
        observed += bool(own)
        p = (bool(own) + sum(others)) / (1 + len(others))
        nxt = [0.0] * (len(dist) + 1)
        for j, mass in enumerate(dist):
            nxt[j] += mass * (1 - p)
            nxt[j + 1] += mass * p
        dist = nxt
    return min(1.0, sum(dist[observed:]))


def _replayed(
    env_id: str,
    trajs: list,
    groups: list[tuple[str, list[str]]],
    env_kwargs: dict[str, Any],
    seed: int,
    cache: dict[tuple, bool],
) -> list[tuple[bool, list[bool]]]:
    """Each episode's actions played again on other tasks of the check (the next ones in a seeded
    cycle): (solved its own task, solved each other task) per episode. A harness that answers what the
    model says solves another task as often as its own, however often two tasks' answers coincide
    (small numbers, a default answer of 0); one that solves its task by itself does not. ``cache``
    keeps the outcome of an action sequence on a task for the next stand-in (the same actions often
    come back)."""
    from whale_train.rollout.records import stable_seed

    by_task = {t.task_id: t for t in trajs}
    envs = {split: gym.make(env_id, **{**env_kwargs, "split": split}).unwrapped for split, _ in groups}
    order = sorted((split, task_id) for split, ids in groups for task_id in ids)
    random.Random(f"{seed}/replay").shuffle(order)
    m = max(1, min(8, REPLAYS // max(1, len(trajs)), len(order) - 1))
    out = []
    for i, (_, task_id) in enumerate(order):
        traj = by_task.get(task_id)
        if traj is None:
            continue
        others = []
        for shift in range(1, m + 1):
            split, target = order[(i + shift) % len(order)]
            key = (split, target, tuple(step.action for step in traj.steps))
            if key in cache:
                others.append(cache[key])
                continue
            solved = False
            try:
                envs[split].reset(seed=stable_seed(seed, target, 0), options={"task_id": target})
                for step in traj.steps:
                    _, reward, terminated, truncated, info = envs[split].step(step.action)
                    if terminated or truncated:
                        solved = bool(terminated and info.get("solved", reward >= 1.0))
                        break
            except Exception:  # noqa: BLE001 - an action the other task cannot take: not solved
                solved = False
            cache[key] = solved
            others.append(solved)
        out.append((bool(traj.solved), others))
    return out


def _episode_problems(trajs: list, mode: str, report: HarnessReport) -> None:
    errors = [t for t in trajs if t.error and t.failure == "harness_error"]
    if errors:
        first = errors[0].error.strip().splitlines()[-1]
        report.problems.append(f"raised in {len(errors)}/{len(trajs)} episodes with a {mode} LLM: {first}")
    failed = [t for t in trajs if t.error and t.failure == "model_error"]
    if failed:  # what the real model would refuse too (a chat prompt to a model without a template)
        first = failed[0].error.strip().splitlines()[-1]
        report.problems.append(f"the {mode} model failed in {len(failed)}/{len(trajs)} episodes: {first}")
    timeouts = [t for t in trajs if t.failure == "timeout"]
    if timeouts:
        report.problems.append(f"never terminated: {len(timeouts)} episodes timed out ({timeouts[0].error})")
    silent = [t for t in trajs if not t.calls and not t.error]
    if silent:
        report.problems.append(f"no LLM call recorded in {len(silent)}/{len(trajs)} episodes")
    idle = [t for t in trajs if not t.steps and not t.error]
    if idle:
        report.problems.append(f"never stepped the env in {len(idle)}/{len(trajs)} episodes")
