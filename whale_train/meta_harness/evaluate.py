"""Checking and scoring candidates, and the trace statistics proposers read.

``validate`` runs the gates a candidate must pass before any model rollout is spent on it: the AST
rules (``harnesses.validate``), the prompt-only rule when asked, and ``check_harness`` with stand-in
models on a few tasks (those episodes are reported apart, never charged); its two parts (the
weight-free stand-ins, the real model on other tasks' prompts) run apart and ``joined`` makes them
one verdict.
``score`` rolls a candidate out on the search's ``harness``-split tasks and returns the eval record
stored in the archive.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from harnesses.loader import HarnessRef, harness_from_source
from harnesses.validate import HarnessValidationError
from whale_envs.sandbox import IsolationUnavailable
from whale_train.check import check_harness
from whale_train.evaluation import EvalResult, TaskSet, evaluate
from whale_train.meta_harness.config import MetaHarnessConfig
from whale_train.meta_harness.prompt_only import prompt_only_violation
from whale_train.rollout import EpisodeLimits, RolloutConfig, Trajectory


@dataclass
class Validation:
    ok: bool
    reason: str | None = None
    check: dict[str, Any] = field(default_factory=dict)
    check_episodes: int = 0

    def to_meta(self) -> dict[str, Any]:
        return {
            "status": "valid" if self.ok else "invalid",
            "reason": self.reason,
            "check": self.check,
            "check_episodes": self.check_episodes,
        }


def validate(
    source: str,
    name: str,
    env_id: str,
    env_kwargs: dict[str, Any],
    config: MetaHarnessConfig,
    seed_source: str | None = None,
    *,
    llm: Any = None,
    score_tasks: list[str] | None = None,
    scored_sources: list[dict[str, Any]] | None = None,
    stand_ins: str = "all",
) -> Validation:
    """AST rules, then (prompt-only mode) the comparison with the seed, then ``check_harness`` (with
    the search's model: the stand-ins copy it and it answers other tasks' prompts; half the tasks
    from ``score_tasks``, the ``harness``-split tasks the candidate will be scored on). Never raises
    for what the candidate does; only a refused unisolated run (``IsolationUnavailable``) stops the
    search. ``stand_ins`` runs one part of the check (``check_harness``): the search runs the
    weight-free part when a candidate is proposed and the real model's part when it is scored, and
    ``joined`` makes the two one verdict."""
    try:
        ref = harness_from_source(source, name)
    except HarnessValidationError as exc:
        return Validation(False, f"validation: {exc}")
    if config.prompt_only and seed_source is not None:
        why = prompt_only_violation(seed_source, source)
        if why:
            return Validation(False, f"prompt-only: {why}")

    def check(options: dict[str, Any], n_tasks: int, tasks: list[str] | None) -> Any:
        return check_harness(
            ref,
            env_id,
            env_kwargs={k: v for k, v in options.items() if k != "split"},
            n_tasks=n_tasks,
            seed=config.seed,
            harness_seconds=min(10.0, config.harness_seconds),
            llm=llm,
            score_tasks=tasks,
            max_llm_calls=config.max_llm_calls,
            max_tokens=config.max_tokens,
            stand_ins=stand_ins,
        )

    try:
        report = check(env_kwargs, config.check_tasks, score_tasks)
    except IsolationUnavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - one candidate never ends the search
        return Validation(False, f"check_harness: the check failed: {type(exc).__name__}: {exc}"[:2000])
    check_record = {"chance": report.chance, "null_scores": report.null_scores, "problems": report.problems}
    if not report.ok:
        why = "check_harness: " + "; ".join(report.problems)
        return Validation(False, why, check_record, report.episodes)
    episodes = report.episodes
    for extra in scored_sources or []:
        # The run's separate test sets (eval.tasks) can be told apart by their content, so the stand-ins
        # run there too. Nothing of these checks but the verdict reaches the archive (no traces, no
        # problem text: they would describe scored tasks to the proposer).
        try:
            n_tasks = max(8, config.check_tasks // len(scored_sources))  # 8: the solver test needs them
            other = check(extra, n_tasks, None)
        except IsolationUnavailable:
            raise
        except Exception:  # noqa: BLE001 - one candidate never ends the search
            why = "check_harness on the scored sources: the check failed"
            return Validation(False, why, check_record, episodes)
        episodes += other.episodes
        if not other.ok:
            why = "check_harness on the scored sources: failed (details are kept out of the archive)"
            return Validation(False, why, check_record, episodes)
    return Validation(True, None, check_record, episodes)


def joined(first: Validation, second: Validation) -> Validation:
    """One verdict from a check run in two parts: ``first`` (the weight-free stand-ins), which passed,
    then ``second`` (the real model's part): its verdict, with both parts' scores, problems and
    episodes."""
    check = {
        "chance": first.check.get("chance", second.check.get("chance")),
        "null_scores": {**first.check.get("null_scores", {}), **second.check.get("null_scores", {})},
        "problems": [*first.check.get("problems", []), *second.check.get("problems", [])],
    }
    return Validation(second.ok, second.reason, check, first.check_episodes + second.check_episodes)


def rollout_config(config: MetaHarnessConfig) -> RolloutConfig:
    limits = EpisodeLimits(
        max_llm_calls=config.max_llm_calls,
        max_tokens=config.max_tokens,
        harness_seconds=config.harness_seconds,
    )
    return RolloutConfig(
        k=config.rollouts_per_task,
        seed=config.seed,
        concurrency=config.concurrency,
        limits=limits,
        trusted=False,
    )


def score(
    ref: HarnessRef,
    env_id: str,
    llm: Any,
    task_ids: list[str],
    env_kwargs: dict[str, Any],
    config: MetaHarnessConfig,
    origin: dict[str, Any],
) -> tuple[dict[str, Any], list[Trajectory]]:
    """Roll ``ref`` out on ``task_ids`` (``harness`` split); return (eval record, trajectories)."""
    rollout = rollout_config(config)
    result = evaluate(
        ref,
        env_id,
        llm,
        [TaskSet({**env_kwargs, "split": "harness"}, task_ids)],
        k=rollout.k,
        seed=rollout.seed,
        concurrency=rollout.concurrency,
        limits=rollout.limits,
    )
    return eval_record(result, origin), result.trajectories


def eval_record(result: EvalResult, origin: dict[str, Any]) -> dict[str, Any]:
    trajs, s = result.trajectories, result.summary
    episodes = max(1, len(trajs))
    return {
        "model_version": trajs[0].model_version if trajs else 0,
        "origin": origin,
        "tasks": s["tasks"],
        "rollouts": len(trajs),
        "mean": s["mean"],
        "se": s["se"],
        "per_task": s["per_task"],
        "failures": s["failures"],
        "llm_calls": s["llm_calls"],
        "prompt_tokens": s["prompt_tokens"],
        "completion_tokens": s["completion_tokens"],
        "calls_per_episode": s["llm_calls"] / episodes,
        "tokens_per_episode": (s["prompt_tokens"] + s["completion_tokens"]) / episodes,
        "stats": trace_stats(trajs),
        "wall_seconds": round(result.wall_seconds, 2),
    }


def trace_stats(trajs: list[Trajectory]) -> dict[str, float]:
    """Failure signals in [0, 1] that proposers act on.

    ``parse``: unsolved episodes that ended on a malformed action, plus the share of env steps the env
    rejected as malformed; ``illegal``: the same for illegal actions; ``wrong``: episodes that ended
    with a wrong answer; ``tool``: tool errors; ``incomplete``: episodes the harness gave up or that ran
    out of turns; ``crash``: harness errors and timeouts; ``truncated``: share of sampled completions
    cut by ``max_tokens``; search QA splits its unsolved episodes three ways: ``missed``, the answer never
    appeared in what the env showed and neither did any of the question's supporting passages (the
    queries failed; also when the source names no supporting passages), ``partial``, the answer never
    appeared but part of the supporting chain did (the search stopped a hop short), ``misread``, the
    answer was shown and the reply was still wrong (a reading failure); ``tool_helps``: how much more often
    episodes that ran the Python tool were solved than the others, times the share of the others (what
    getting every episode to use the tool could gain); ``solved``: the success rate.
    """
    n = max(1, len(trajs))
    fail = Counter(t.failure for t in trajs)
    steps = [s for t in trajs for s in t.steps]
    kinds = Counter(s.error_kind for s in steps if s.error_kind)
    n_steps = max(1, len(steps))
    sampled = [c for t in trajs for c in t.calls if c.kind == "sample"]
    truncated = sum(c.finish_reason == "length" for c in sampled) / max(1, len(sampled))
    used = [any(s.action.lower().startswith("python:") for s in t.steps) for t in trajs]
    with_tool = [t.solved for t, u in zip(trajs, used, strict=True) if u]
    without = [t.solved for t, u in zip(trajs, used, strict=True) if not u]
    helps = 0.0
    if with_tool and without:
        gain = sum(with_tool) / len(with_tool) - sum(without) / len(without)
        helps = max(0.0, gain) * len(without) / n
    return {
        "solved": sum(t.solved for t in trajs) / n,
        "parse": min(1.0, fail["parse_error"] / n + kinds["malformed"] / n_steps),
        "illegal": min(1.0, fail["illegal_action"] / n + kinds["illegal"] / n_steps),
        "wrong": fail["wrong_answer"] / n,
        "tool": min(1.0, fail["tool_error"] / n + kinds["tool"] / n_steps),
        "incomplete": (fail["incomplete"] + fail["out_of_turns"]) / n,
        "crash": (fail["harness_error"] + fail["timeout"]) / n,
        "truncated": truncated,
        "missed": sum(_retrieval(t) == "missed" for t in trajs) / n,
        "partial": sum(_retrieval(t) == "partial" for t in trajs) / n,
        "misread": sum(_retrieval(t) == "misread" for t in trajs) / n,
        "tool_helps": helps,
    }


def _retrieval(traj: Trajectory) -> str | None:
    """Why an unsolved search-QA episode failed: ``missed``, ``partial`` or ``misread`` (None otherwise)."""
    info = traj.final_info
    if traj.solved or info.get("answer_retrieved") is None:
        return None
    if info["answer_retrieved"]:
        return "misread"
    return "partial" if info.get("gold_retrieved") else "missed"
