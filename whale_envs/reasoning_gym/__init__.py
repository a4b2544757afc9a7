"""reasoning-gym's procedural datasets as ``whale/ReasoningGym-v0``.

``gym.make("whale/ReasoningGym-v0", dataset="leg_counting", size=200, seed=0)`` (or ``dataset="composite",
datasets={"leg_counting": 1, "basic_arithmetic": 1}``; any other keyword is an option of the dataset's
config). The observation is the dataset's question; the reward is the dataset's own ``score_answer``.

The hold-out rule: reasoning-gym generates from ``(seed, index)`` alone and is importable in every
sandbox, so the seed it is given is an HMAC of the user's seed under the split key, a secret no sandbox
can read (:mod:`whale_envs.reasoning_gym.seeds`): calling ``reasoning_gym.create_dataset`` with the
user's seed does not rebuild the env's tasks, and nothing without the key does.

One module per concern: ``spec`` (what the user names, checked against the installed package),
``seeds`` (the hold-out rule), ``source`` (the task source: ids, entries, scoring), ``env`` (the
actions and what the agent sees). The reasoning-gym package is imported when a source is built, not here.
"""

from whale_envs.reasoning_gym.env import ReasoningGymEnv, parse_answer
from whale_envs.reasoning_gym.source import DEFAULT_DATASET, Entry, ReasoningGymSource, generated

__all__ = ["DEFAULT_DATASET", "Entry", "ReasoningGymEnv", "ReasoningGymSource", "generated", "parse_answer"]
