"""``whale/ReasoningGym-v0``: a reasoning-gym question, answered once, scored by the dataset's own
``score_answer``.

Actions (one per step):

* any text with ``<answer>...</answer>`` (reasoning-gym's own convention): the content of the **last**
  pair is the answer; ends the episode. The reasoning around it is ignored.
* ``answer: <text>``: everything after the prefix is the answer (it may span lines: some datasets want
  a grid or a list); ends the episode.
* anything else (an unclosed or empty tag included): an error that costs a turn and changes nothing.

The reward is ``score_answer(answer, entry)`` in [0, 1] (some datasets give partial credit); ``solved``
when it is 1. ``info`` holds the ``question`` only: the entry's answer and metadata stay on the trusted
side, and at the end ``info`` adds ``solved``, ``score``, ``answer`` (the gold) and ``extracted``
(what was scored), of which a harness is shown ``solved`` alone.
"""

from __future__ import annotations

import random
import re
from typing import Any

from whale_envs.reasoning_gym.source import Entry, ReasoningGymSource
from whale_envs.tasks import Task, TaskSource
from whale_envs.text_env import ActionError, Outcome, TextEnv, show_action

_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_OPEN = re.compile(r"<answer>", re.IGNORECASE)
_PREFIX = re.compile(r"\s*answer\s*:", re.IGNORECASE)
FORMAT = "Put your final answer inside <answer></answer> tags."


def parse_answer(action: str) -> str:
    """The answer an action gives, or :class:`ActionError` (see the module docstring)."""
    tags = list(_TAG.finditer(action))
    opened = list(_OPEN.finditer(action))
    if opened and (not tags or opened[-1].start() > tags[-1].start()):
        raise ActionError("the last <answer> is not closed; put the final answer in <answer>...</answer>")
    if tags:
        answer = tags[-1].group(1).strip()
        if not answer:
            raise ActionError("the last <answer></answer> is empty; put the final answer inside it")
        return answer
    prefix = _PREFIX.match(action)
    if prefix:
        answer = action[prefix.end() :].strip()
        if not answer:
            raise ActionError("'answer:' must be followed by the answer, e.g. 'answer: 42'")
        return answer
    raise ActionError(
        f"unrecognized action {show_action(action)}: put your final answer inside <answer></answer> tags "
        "(or reply 'answer: <your answer>')"
    )


class ReasoningGymEnv(TextEnv[Entry]):
    """reasoning-gym datasets as a text environment.

    Args:
        dataset: a reasoning-gym dataset name (``leg_counting``), or ``composite`` with ``datasets``.
        datasets: a composite's datasets: ``{name: weight}``, ``{name: {weight:, config:}}``, a list of
            ``{name:, weight:, config:}`` or ``"name:weight,..."``.
        size: tasks in the source (before the split); seed: the user's seed (the hold-out rule of
            :mod:`whale_envs.reasoning_gym.seeds` keys the seed reasoning-gym gets).
        **config: any other keyword is an option of the dataset's config (``min_animals=3``).
        tasks, split, task_options, max_turns (default 2: one unreadable reply, then the answer),
        render_mode: as for every WHALE env (``TextEnv``).
    """

    domain = "reasoning_gym"

    def __init__(
        self,
        tasks: str | TaskSource = "generated",
        *,
        dataset: str | None = None,
        datasets: Any = None,
        size: int | None = None,
        seed: int | None = None,
        split: str = "all",
        task_options: dict[str, Any] | None = None,
        max_turns: int | None = None,
        render_mode: str | None = None,
        **config: Any,
    ):
        given = {"dataset": dataset, "datasets": datasets, "size": size, "seed": seed}
        options = {**dict(task_options or {}), **{k: v for k, v in given.items() if v is not None}, **config}
        super().__init__(
            tasks, split=split, task_options=options, max_turns=max_turns, render_mode=render_mode
        )

    def _default_max_turns(self, task: Task[Entry]) -> int:
        return 2

    def chance_action(self, rng: random.Random) -> str:
        """A guess: a small integer (most answers are numbers or short words)."""
        return f"<answer>{rng.randint(0, 20)}</answer>"

    # ------------------------------------------------------------------ episode

    def _start(self, task: Task[Entry]) -> str:
        self.entry = task.payload
        self.extracted: str | None = None
        self.score = 0.0
        return ""

    def _apply(self, action: str) -> Outcome:
        answer = parse_answer(action)
        self.extracted = answer
        self.score = self._score(answer)
        shown = answer if len(answer) <= 200 else answer[:200] + "..."
        if self.score >= 1.0:
            return Outcome(reward=1.0, terminated=True, feedback=f"Your answer {shown} is correct.")
        return Outcome(
            reward=self.score, terminated=True, feedback=f"Your answer {shown} scored {self.score:.2f} of 1."
        )

    def _score(self, answer: str) -> float:
        if not isinstance(self.source, ReasoningGymSource):
            raise TypeError(f"task source {self.source.name!r} is not a reasoning-gym source")
        try:
            score = self.source.score(self.entry, answer)
        except Exception:  # a dataset's scorer choking on a malformed answer: it scores nothing
            return 0.0
        return min(max(score, 0.0), 1.0) if score == score else 0.0  # NaN scores nothing

    # ------------------------------------------------------------------ what the agent sees

    def _observe(self) -> str:
        return f"{self.entry.question.rstrip()}\n\n{FORMAT}"

    def _public_info(self) -> dict[str, Any]:
        return {"question": self.entry.question}

    def _final_info(self) -> dict[str, Any]:
        answer = self.entry.answer
        return {
            "solved": self.score >= 1.0,
            "score": self.score,
            "answer": answer if answer is None or isinstance(answer, str) else str(answer),
            "extracted": self.extracted,
        }
