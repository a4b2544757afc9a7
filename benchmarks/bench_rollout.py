"""Batched rollouts vs one request at a time, on the same episodes (target: >= 5x episodes/s on the
~1M model). Both run side by side in one process; the ratio is in the benchmark's extra_info
(``make bench`` prints it; ``--benchmark-json`` keeps it)."""

from __future__ import annotations

import time

import gymnasium as gym
import pytest

import whale_envs  # noqa: F401
from harnesses.loader import load_harness
from whale_train.llm.hf import TransformersLLM
from whale_train.rollout import RolloutConfig, run_rollouts


@pytest.mark.benchmark(group="rollout")
@pytest.mark.parametrize(
    ("env_id", "harness"), [("whale/Math-v0", "math/h0"), ("whale/Chess-v0", "chess_puzzles/h0")]
)
def test_batched_vs_sequential_rollouts(benchmark, fresh_model_dir, env_id, harness):
    llm = TransformersLLM(fresh_model_dir)
    ref = load_harness(harness)
    n = 8 if benchmark.disabled else 64  # `make test` only checks that it runs
    ids = gym.make(env_id, split="test").unwrapped.task_ids[:n]

    def episodes_per_second(concurrency: int) -> float:
        start = time.perf_counter()
        trajs = run_rollouts(
            ref, env_id, llm, ids, config=RolloutConfig(k=1, concurrency=concurrency, trusted=True)
        )
        assert len(trajs) == len(ids) and all(t.calls for t in trajs)
        return len(trajs) / (time.perf_counter() - start)

    episodes_per_second(n)  # warm-up: generate the tasks, fill caches
    sequential = episodes_per_second(1)
    batched = benchmark.pedantic(episodes_per_second, args=(n,), rounds=1, iterations=1)
    ratio = batched / sequential
    benchmark.extra_info.update(
        batched_eps=round(batched, 2), sequential_eps=round(sequential, 2), ratio=round(ratio, 2)
    )
    print(f"\n{harness}: batched {batched:.1f} episodes/s, one at a time {sequential:.1f}: {ratio:.1f}x")
    if not benchmark.disabled:  # with 8 tasks on a busy machine the ratio is noise
        assert batched > sequential
