"""WHALE environments: chess puzzles, math reasoning and search QA as Gymnasium text environments.

Importing this package registers the envs, so both of these work::

    import whale_envs, gymnasium as gym
    env = gym.make("whale/Chess-v0")
    env = gym.make("whale_envs:whale/Chess-v0")   # without importing whale_envs first

A user's env subclasses ``TextEnv`` and registers its tasks with ``register_generator`` (generated
tasks) or ``register_source`` (tasks read from a file); docs/ARCHITECTURE.md, "Adding a domain".
"""

from __future__ import annotations

import gymnasium as gym

from whale_envs.tasks import (
    SPLITS,
    GeneratedSource,
    ListSource,
    Task,
    TaskSource,
    TaskSourceError,
    make_source,
    register_generator,
    register_source,
    source_kinds,
    split_ids,
    split_of,
)
from whale_envs.text_env import ActionError, Outcome, TextEnv

#: The ids of the built-in envs: the one place they are written (everything else imports these or reads
#: the domain registry, ``whale_train.domains``).
CHESS_ID = "whale/Chess-v0"
MATH_ID = "whale/Math-v0"
SEARCH_QA_ID = "whale/SearchQA-v0"
REASONING_GYM_ID = "whale/ReasoningGym-v0"
VERIFIERS_ID = "whale/Verifiers-v0"

#: Every env this package registers: id -> entry point. The domain's task sources are registered
#: when its subpackage (``whale_envs.<domain>``) is imported.
ENVS: dict[str, str] = {
    CHESS_ID: "whale_envs.chess:ChessEnv",
    SEARCH_QA_ID: "whale_envs.search:SearchQAEnv",
    MATH_ID: "whale_envs.math:MathEnv",
    REASONING_GYM_ID: "whale_envs.reasoning_gym:ReasoningGymEnv",
}


#: Envs that adapt another library's environments: registered too, but each needs an argument naming
#: what it adapts (``taskset=``), so they are not in ``ENVS`` (whose envs all make with no argument).
ADAPTERS: dict[str, str] = {VERIFIERS_ID: "whale_envs.verifiers:VerifiersEnv"}


def _register() -> None:
    for env_id, entry_point in {**ENVS, **ADAPTERS}.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point)


_register()

__all__ = [
    "ADAPTERS",
    "CHESS_ID",
    "ENVS",
    "MATH_ID",
    "REASONING_GYM_ID",
    "SEARCH_QA_ID",
    "SPLITS",
    "VERIFIERS_ID",
    "ActionError",
    "GeneratedSource",
    "ListSource",
    "Outcome",
    "Task",
    "TaskSource",
    "TaskSourceError",
    "TextEnv",
    "make_source",
    "register_generator",
    "register_source",
    "source_kinds",
    "split_ids",
    "split_of",
]
