"""verifiers' entry to WHALE, named by its id: ``whale_verifiers`` (or ``whale-verifiers``).

verifiers' loader imports a taskset, a harness or an environment by its id as a top-level module and
takes the one ``Taskset``, ``Harness`` and ``Env`` subclass it exports. This module exports WHALE's:

* ``WhaleTaskset``: any registered WHALE env as a verifiers taskset (``--env.taskset.env whale/Math-v0``),
  scored by WHALE's own verifier;
* ``WhaleEnv``: plays such a task turn by turn against the env (a chess game's next position, ...);
* ``ChatHarness``: one chat call per segment, in-process (the harness every seat of ``WhaleEnv`` plays
  with, and the one ``whale/Verifiers-v0`` gives the seats of any taskset it runs).

The code lives in ``whale_envs.verifiers``; docs/ENVIRONMENTS.md shows both directions.
"""

from whale_envs.verifiers.harness import ChatHarness, ChatHarnessConfig
from whale_envs.verifiers.taskset import WhaleEnv, WhaleEnvConfig, WhaleTaskset, WhaleTasksetConfig

__all__ = [
    "ChatHarness",
    "ChatHarnessConfig",
    "WhaleEnv",
    "WhaleEnvConfig",
    "WhaleTaskset",
    "WhaleTasksetConfig",
]
