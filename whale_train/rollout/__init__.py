"""The rollout engine: harness × tasks × k samples, many episodes in flight, their LLM calls batched.

One episode = one harness object driving one env through two handles (see ``harnesses.base``). The
env, the model and the record of everything that happens (the ``Trajectory``) live here, in the
trusted process. The harness runs either in this process (harnesses shipped with the package, when
asked) or in a worker process (everything else).

The package, in the order an episode meets it:

* ``executors`` — ``run_rollouts`` (the entry point), ``RolloutConfig``, ``preflight``, and where the
  harness code runs: in this process or in a sandboxed worker, one forked process per episode;
* ``episode`` — ``Episode``, the trusted side of one episode (the handle operations), ``EpisodeLimits``;
* ``batcher`` — ``Batcher``: the LLM requests of all in-flight episodes, run as large batches;
* ``records`` — ``Trajectory`` / ``EnvStep`` / ``LLMCall``, their JSON lines, the seeds;
* ``metrics`` — ``categorize`` (the failure of one episode) and ``summarize`` (mean@k ± SE, pass@k, ...);
* ``workers`` — the sandboxed worker from the trusted side (start, read, write) and
  ``reusing_workers``: the rollouts of one block share a worker.

Error policy: one episode never breaks an evaluation. A harness exception, a timeout or a limit hit
ends that episode with the env's reward so far (0 unless solved) and the reason recorded.
"""

from whale_train.rollout.batcher import Batcher
from whale_train.rollout.episode import Episode, EpisodeLimits
from whale_train.rollout.executors import RolloutConfig, preflight, run_episodes, run_rollouts
from whale_train.rollout.metrics import FAILURES, by_data_source, categorize, summarize
from whale_train.rollout.records import (
    EnvStep,
    LLMCall,
    Trajectory,
    jsonable,
    read_jsonl,
    stable_seed,
    write_jsonl,
)
from whale_train.rollout.workers import reusing_workers

__all__ = [
    "FAILURES",
    "Batcher",
    "EnvStep",
    "Episode",
    "EpisodeLimits",
    "LLMCall",
    "RolloutConfig",
    "Trajectory",
    "by_data_source",
    "categorize",
    "jsonable",
    "preflight",
    "read_jsonl",
    "run_episodes",
    "reusing_workers",
    "run_rollouts",
    "stable_seed",
    "summarize",
    "write_jsonl",
]
