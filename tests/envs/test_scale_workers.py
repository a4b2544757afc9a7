"""The env-side bounded pools: many episodes' tool calls run at most ``workers`` at a time, each episode
waiting only for its own call, and the envs' Python tool and retrieval go through them."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import gymnasium as gym
import pytest

import whale_envs  # noqa: F401  (registers the envs)
from whale_envs import workers


def test_a_burst_of_calls_runs_workers_at_a_time():
    pool = workers.Pool("sandbox", 4)

    def tool(i: int) -> int:
        time.sleep(0.05)
        return i * i

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=64) as episodes:  # 64 episodes reach a tool call together
        results = list(episodes.map(lambda i: pool.submit(tool, i).result(), range(64)))
    elapsed = time.monotonic() - start
    assert results == [i * i for i in range(64)]
    st = pool.stats()
    assert st["calls"] == 64 and st["max_running"] == 4 and st["wait_seconds"] > 0
    assert 64 / 4 * 0.05 * 0.9 <= elapsed < 64 * 0.05 / 2  # bounded, and far from one at a time

    # an episode whose call is queued does not hold up one that needs no tool (it never enters the pool)
    slow = workers.Pool("sandbox", 1)
    gate = threading.Event()
    blocked = slow.submit(gate.wait, 5)
    queued = slow.submit(lambda: "ran")
    assert not queued.done()
    gate.set()
    assert blocked.result() is True and queued.result(timeout=5) == "ran"
    with pytest.raises(ValueError, match="at least one worker"):
        workers.Pool("sandbox", 0)
    with pytest.raises(ValueError, match="unknown worker pool"):
        workers.call("gpu", print)


def test_the_envs_tool_and_retrieval_go_through_the_pools(monkeypatch):
    sandbox = workers.configure("sandbox", 2)
    env = gym.make("whale/Math-v0", split="train").unwrapped
    env.reset(seed=0)
    obs, _r, _term, _trunc, info = env.step("python: print(6 * 7)")
    assert "42" in obs and info["error"] is None
    assert sandbox.stats()["calls"] == 1

    retrieval = workers.configure("retrieval", 3)
    env = gym.make("whale/SearchQA-v0", split="train").unwrapped
    env.reset(seed=0)
    env.step("search: capital city river")
    assert retrieval.stats()["calls"] == 1
    monkeypatch.setenv("WHALE_SANDBOX_WORKERS", "nope")
    monkeypatch.setattr(workers, "_pools", {})
    with pytest.raises(ValueError, match="WHALE_SANDBOX_WORKERS must be a whole number"):
        workers.pool("sandbox")


def test_default_sizes_sandbox_four_per_cpu_retrieval_one_per_cpu(monkeypatch):
    """Sandboxed calls mostly start an interpreter and wait on it: four per CPU (at most 256), so that
    the calls of a turn do not queue behind each other; retrieval computes: one per CPU."""
    monkeypatch.delenv("WHALE_SANDBOX_WORKERS", raising=False)
    monkeypatch.delenv("WHALE_RETRIEVAL_WORKERS", raising=False)
    for cpus, sandbox, retrieval in ((2, 8, 2), (16, 64, 16), (192, 256, 192), (None, 4, 1)):
        monkeypatch.setattr(workers.os, "cpu_count", lambda n=cpus: n)
        monkeypatch.setattr(workers, "_pools", {})
        assert (workers.pool("sandbox").workers, workers.pool("retrieval").workers) == (sandbox, retrieval)
