"""Continuous batching: the vLLM backend on vLLM's async engine (``continuous=True``) against the fake
of tests/fake_vllm.py, which enforces the async engine's rules (a running event loop, one output with
``FINAL_ONLY``, per-request validation, RPCs to another process). Same samples as the barrier path for
the same seeds; requests reach the engine as their episode makes them; weight pushes still work."""

from __future__ import annotations

import time

import gymnasium as gym
import pytest
import torch
import trl  # noqa: F401  (imported before the fake vllm is installed: TRL probes for vllm when first imported)
from transformers import AutoModelForCausalLM

import whale_envs  # noqa: F401
from harnesses.loader import load_harness
from tests import fake_vllm
from whale_train.llm import SHIPPED_MODEL
from whale_train.llm.base import Request, SamplingParams
from whale_train.rollout import Batcher, RolloutConfig, run_rollouts

REQUESTS = [
    Request("What is 2+3? Answer:", SamplingParams(max_tokens=8), seed=1),
    Request("What is 2+3? Answer:", SamplingParams(max_tokens=8), seed=2),
    Request("The capital of France is", SamplingParams(temperature=0, max_tokens=5, stop=("e",)), seed=3),
]


@pytest.fixture
def vllm(monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    return fake_vllm.install(monkeypatch)


def backend(**kwargs):
    from whale_train.llm.vllm_backend import VLLMLLM

    return VLLMLLM(SHIPPED_MODEL, **kwargs)


def key(completions):
    return [(c.text, c.completion_ids, c.finish_reason) for c in completions]


def test_the_async_engine_samples_what_the_barrier_engine_samples(vllm):
    barrier, continuous = backend(), backend(continuous=True)
    assert isinstance(continuous.engine, fake_vllm.AsyncLLM)
    together = continuous.complete(REQUESTS)
    assert key(together) == key(barrier.complete(REQUESTS))
    assert together[0].completion_ids != together[1].completion_ids  # own seeds
    one_by_one = [continuous.submit([r]) for r in REQUESTS]  # in flight at once, each on its own
    assert [key(f.result())[0] for f in one_by_one] == key(together)
    assert [c.logprob for c in continuous.score("2+3=", ["5", "5 6"])] == pytest.approx(
        [c.logprob for c in barrier.score("2+3=", ["5", "5 6"])]
    )


def test_a_bad_request_fails_its_own_call_only(vllm):
    llm = backend(continuous=True)
    bad = llm.submit([Request("", SamplingParams(max_tokens=4))])  # an empty prompt: vLLM refuses it
    good = llm.submit(REQUESTS[:1])
    with pytest.raises(ValueError, match="cannot be empty"):
        bad.result()
    assert good.result()[0].completion_ids


def test_requests_reach_the_engine_without_waiting_for_the_other_episodes(vllm):
    llm = backend(continuous=True)
    batcher = Batcher(llm, max_wait=5.0, max_hold=5.0)  # a barrier would hold the job for 5 s
    try:
        first, second = batcher.enter(), batcher.enter()
        start = time.monotonic()
        out = batcher.submit_complete(REQUESTS[:1], owner=first).result(timeout=30)
        assert time.monotonic() - start < 4.0 and out[0].completion_ids  # `second` is still busy
        assert batcher.continuous and llm.engine.steps == [1]
        batcher.submit_complete(REQUESTS[1:2], owner=second).result(timeout=30)
        assert llm.engine.steps == [1, 1]
    finally:
        batcher.close()


@pytest.mark.slow
def test_a_rollout_on_the_async_engine_repeats_the_barrier_rollout(vllm):
    ids = gym.make("whale/Math-v0", split="test").unwrapped.task_ids[:6]
    config = RolloutConfig(k=2, concurrency=12, trusted=True)

    def go(llm):
        trajs = run_rollouts(load_harness("math/h0"), "whale/Math-v0", llm, ids, config=config)
        assert all(t.error is None for t in trajs)
        return [
            (t.task_id, t.reward, [c.completion_ids for c in t.calls], [s.action for s in t.steps])
            for t in trajs
        ]

    assert go(backend(continuous=True)) == go(backend())


def test_weights_push_into_the_async_engine_and_the_push_is_timed(vllm):
    llm = backend(continuous=True)
    greedy = [Request(r.prompt, SamplingParams(temperature=0, max_tokens=6)) for r in REQUESTS]
    before = key(llm.complete(greedy))
    train = AutoModelForCausalLM.from_pretrained(SHIPPED_MODEL, dtype=torch.float32)
    with torch.no_grad():
        for p in train.parameters():
            p.mul_(0.5)
    llm.load_weights(train.named_parameters())  # msgpack-checked: the async engine's core is another process
    assert key(llm.complete(greedy)) != before
    assert "whale_load_weights_file" in llm.engine.rpcs and llm.engine.prefix_resets == 1
    assert llm.version == 1 and llm.last_push_seconds is not None and llm.last_push_seconds >= 0
    barrier = backend()
    barrier.load_weights(train.named_parameters())
    assert barrier.last_push_seconds is not None
