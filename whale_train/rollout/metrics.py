"""What a set of trajectories says: the failure category of one episode, the summary of a run."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from whale_train.rollout.records import Trajectory
from whale_train.stats import mean_se

FAILURES = (
    "parse_error",
    "illegal_action",
    "wrong_answer",
    "tool_error",
    "out_of_turns",
    "timeout",
    "harness_error",
    "model_error",
    "incomplete",
)


def categorize(traj: Trajectory) -> str:
    """The failure category of an unsolved episode ('' when solved).

    model_error (a model call failed: the backend raised; whatever the harness did next) /
    timeout / harness_error (the harness raised or hit a limit) / wrong_answer (the env ended the
    episode with reward 0) / parse_error, illegal_action, tool_error (the episode ran out of turns,
    and the last env error was of that kind) / out_of_turns / incomplete (the harness returned early).
    """
    if traj.solved:
        return ""
    if traj.error and traj.error.startswith("model_error"):
        return "model_error"
    if traj.error and traj.error.startswith("timeout"):
        return "timeout"
    if traj.error:
        return "harness_error"
    if not traj.steps:
        return "incomplete"
    last = traj.steps[-1]
    if last.terminated:
        return "wrong_answer"
    kinds = [s.error_kind for s in traj.steps if s.error_kind]
    if last.truncated or kinds:
        kind = kinds[-1] if kinds else None
        return {"malformed": "parse_error", "illegal": "illegal_action", "tool": "tool_error"}.get(
            kind, "out_of_turns"
        )
    return "incomplete"


def summarize(trajs: Sequence[Trajectory]) -> dict[str, Any]:
    """mean@k with its standard error over tasks, pass@k, per-difficulty breakdown, tokens, failures."""
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        by_task[t.task_id].append(t)
    per_task = {tid: sum(x.solved for x in ts) / len(ts) for tid, ts in by_task.items()}
    n = len(per_task)
    mean, se = mean_se(per_task.values()) if n else (0.0, 0.0)
    ks = {len(ts) for ts in by_task.values()}
    by_diff: dict[str, list[float]] = defaultdict(list)
    for tid, ts in by_task.items():
        by_diff[str(ts[0].difficulty)].append(per_task[tid])
    failures = Counter(t.failure for t in trajs if t.failure)
    return {
        "tasks": n,
        "episodes": len(trajs),
        "k": max(ks) if ks else 0,
        "mean": mean,
        "se": se,
        "pass_at_k": sum(any(x.solved for x in ts) for ts in by_task.values()) / n if n else 0.0,
        "by_difficulty": {d: {"tasks": len(v), "mean": sum(v) / len(v)} for d, v in sorted(by_diff.items())},
        "failures": dict(failures.most_common()),
        "llm_calls": sum(len(t.calls) for t in trajs),
        "prompt_tokens": sum(t.prompt_tokens for t in trajs),
        "completion_tokens": sum(t.completion_tokens for t in trajs),
        "per_task": per_task,
    }


def by_data_source(sources: Any, per_task: dict[str, float]) -> dict[str, dict]:
    """mean per ``meta["data_source"]`` (Search-R1's benchmarks, aime2024/2025) of the tasks in
    ``per_task``, plus their macro ``average`` when there are several; {} when no task names one.
    ``sources``: the task source (or a list of them) the task ids come from."""
    sources = sources if isinstance(sources, (list, tuple)) else [sources]
    groups: dict[str, list[float]] = {}
    for task_id, value in per_task.items():
        for source in sources:
            try:
                meta = source.get(task_id).meta
            except KeyError:
                continue
            name = meta.get("data_source")
            if name is not None:
                groups.setdefault(str(name), []).append(value)
            break
    out = {k: {"tasks": len(v), "mean": sum(v) / len(v)} for k, v in sorted(groups.items())}
    if len(out) > 1:
        means = [d["mean"] for d in out.values()]
        out["average"] = {"tasks": sum(d["tasks"] for d in out.values()), "mean": sum(means) / len(means)}
    return out
