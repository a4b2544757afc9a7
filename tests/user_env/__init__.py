"""A user's env that the package does not ship: the worked example of "Adding a domain" in
docs/ARCHITECTURE.md, trained and searched on by ``tests/train/test_user_env.py``.

``Reverse-v0``: which of the listed words is the given word spelled backwards? One action names a
word; a word that is not among the options is an invalid action (an error, the state unchanged, one
turn spent); three turns per task. Registered with Gymnasium under its bare id, so WHALE reaches it as
``user_env:Reverse-v0`` (the module is imported first, as ``gym.make`` does). Its harness is ``h0.py``
next to this file; no ``Domain`` is registered, so WHALE gives it the generic one (the ``options``
field of ``info`` is found as its list of valid actions).
"""

from __future__ import annotations

import random

import gymnasium as gym

from whale_envs import ActionError, GeneratedSource, Outcome, Task, TextEnv
from whale_envs.tasks import register_generator

ENV_ID = "Reverse-v0"
LETTERS = "abcdefgh"


def _make(rng: random.Random, idx: int) -> tuple[Task, str]:
    word = "".join(rng.choice(LETTERS) for _ in range(4))
    answer = word[::-1]
    options = {answer}
    while len(options) < 3:
        options.add("".join(rng.sample(word, len(word))) if rng.random() < 0.5 else word)
        if len(set(word)) == 1:
            options.add("".join(rng.choice(LETTERS) for _ in range(4)))
    shown = sorted(options)
    rng.shuffle(shown)
    return Task(f"rev-{idx}", {"word": word, "answer": answer, "options": shown}, {"difficulty": 1}), word


def generated(path: str | None = None, size: int = 200, seed: int = 0) -> GeneratedSource:
    return GeneratedSource(f"reverse(seed={seed})", [f"rev-{i}" for i in range(size)], _make, seed=seed)


register_generator("reverse", generated, doc="random 4-letter words")


class ReverseEnv(TextEnv):
    domain = "reverse"

    def _start(self, task: Task) -> str:
        self.solved = False
        return ""

    def _apply(self, action: str) -> Outcome:
        word = action.strip().lower()
        if word not in self.task.payload["options"]:
            raise ActionError(f"{action.strip()[:40]!r} is not one of the options", "illegal")
        self.solved = word == self.task.payload["answer"]
        return Outcome(float(self.solved), True, "Right." if self.solved else f"No: {word} is not it.")

    def _observe(self) -> str:
        p = self.task.payload
        return f"Which word is {p['word']} spelled backwards? Options: {', '.join(p['options'])}"

    def _public_info(self) -> dict:
        return {"word": self.task.payload["word"], "options": list(self.task.payload["options"])}

    def _final_info(self) -> dict:
        return {"solved": self.solved, "answer": self.task.payload["answer"]}

    def _default_max_turns(self, task: Task) -> int:
        return 3

    def chance_action(self, rng: random.Random) -> str:
        return rng.choice(self.task.payload["options"])


if ENV_ID not in gym.registry:
    gym.register(id=ENV_ID, entry_point=ReverseEnv)
