"""What an RSFT step trains on: of the sampled trajectories, the accepted ones (``accept``), and of their
model calls, the ones the episode used (``used_calls``), each as an example on the exact token ids that
were sampled (``examples_from``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from whale_train.rollout import LLMCall, Trajectory
from whale_train.rsft.config import RSFTConfig


@dataclass(frozen=True)
class Example:
    """One training example: the exact ids the model saw (prompt) and produced (completion)."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    task_id: str

    def row(self) -> dict[str, list[int]]:
        ids = list(self.prompt_ids) + list(self.completion_ids)
        return {
            "input_ids": ids,
            "completion_mask": [0] * len(self.prompt_ids) + [1] * len(self.completion_ids),
        }


def accept(trajs: list[Trajectory], config: RSFTConfig) -> list[Trajectory]:
    """The trajectories whose reward passes the threshold, at most ``per_task_cap`` per task."""
    kept: list[Trajectory] = []
    per_task: dict[str, int] = {}
    for t in trajs:
        if t.reward < config.reward_threshold or t.error:
            continue
        if config.per_task_cap is not None and per_task.get(t.task_id, 0) >= config.per_task_cap:
            continue
        per_task[t.task_id] = per_task.get(t.task_id, 0) + 1
        kept.append(t)
    return kept


def examples_from(trajs: list[Trajectory], config: RSFTConfig, tokenizer: Any) -> list[Example]:
    """Every trainable call of the accepted trajectories as an example on its sampled token ids.

    Only what the model sampled is trained on: ``sample`` calls, on their completion ids as generated
    (a call without token ids, from a remote backend that does not return them, is re-tokenized from
    its text). Scoring calls (``score``, and ``choice``: ``llm.choose`` of any number of options) are
    never examples: their text is the harness's, which the model only scored, and a one-option choice
    would otherwise turn any text a harness writes into training data.
    """
    out: list[Example] = []
    seen: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
    for t in trajs:
        for call in used_calls(t):
            ex = _example(call, t.task_id, tokenizer, config)
            if ex is None:
                continue
            key = (ex.prompt_ids, ex.completion_ids)
            if config.dedup and key in seen:
                continue
            seen.add(key)
            out.append(ex)
    return out


def used_calls(t: Trajectory) -> list[LLMCall]:
    """The calls of a trajectory whose output the episode used.

    - A call whose completion holds only what the env rejected (the argument of an action that came back
      with an error, e.g. the illegal move before a retry) is not used: an accepted episode may contain
      a mistake it recovered from, and the mistake is not what to learn.
    - Calls that share a prompt within one episode are alternatives a harness chose among (a vote, a
      best-of-n): of those, only a completion that holds what the env accepted (the argument of one of
      the episode's actions, e.g. ``7`` of ``answer: 7`` or ``print(3*4)`` of ``python: print(3*4)``) is
      used, so a losing vote or a discarded sample is never trained on as if it had solved the task.
    - Any other call (its prompt is its own) is used, and so is every call of an episode whose actions
      the env all rejected (kept only with a reward threshold of 0)."""
    good: set[str] = set()
    bad: set[str] = set()
    for step in t.steps:
        action = " ".join(step.action.split())
        if not action:
            continue
        _head, colon, rest = action.partition(":")
        forms = {action, rest.strip()} if colon and rest.strip() else {action}
        (bad if step.error else good).update(forms)
    if not good:  # the env accepted no action at all (reward threshold 0): nothing to prefer
        return list(t.calls)
    bad -= good
    groups = Counter(call.prompt_text for call in t.calls if call.kind == "sample")
    kept = []
    for call in t.calls:
        text = " ".join((call.completion or "").split())
        holds_good = any(p in text for p in good)
        if any(p in text for p in bad) and not holds_good:
            continue
        if call.kind == "sample" and groups[call.prompt_text] > 1 and not holds_good:
            continue
        kept.append(call)
    return kept


def _example(call: LLMCall, task_id: str, tokenizer: Any, config: RSFTConfig) -> Example | None:
    if call.kind != "sample":  # scoring calls (score, choice): the model sampled nothing
        return None
    if config.require_stop and call.finish_reason != "stop":
        return None
    prompt = call.prompt_ids
    completion = call.completion_ids
    if prompt is None:
        prompt = tokenizer(call.prompt_text, add_special_tokens=False)["input_ids"]
    if completion is None:
        completion = tokenizer(call.completion, add_special_tokens=False)["input_ids"]
    completion = list(completion)
    if not completion or len(prompt) + len(completion) > config.max_length:
        return None
    return Example(tuple(prompt), tuple(completion), task_id)
