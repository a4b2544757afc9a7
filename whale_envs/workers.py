"""Bounded worker pools for the env-side work of many episodes at once: sandboxed tool calls (math's
Python tool) and retrieval (SearchQA's BM25).

A rollout keeps hundreds of episodes in flight, each in its own thread, and each waits on the model
most of the time. When many of them reach a tool call together, running every call at once would
start hundreds of sandboxes (processes, each with its memory limit) on a machine with a few dozen
cores; running them one at a time would queue a 1024-episode batch behind them. A pool per kind of
work runs at most ``workers`` calls at a time and queues the rest in arrival order; an episode waits
only for its own call, and episodes waiting on the model are not held up.
Default sizes: retrieval one worker per CPU (it computes); sandboxed calls four per CPU, at most 256:
most of a call's wall time goes to starting its interpreter and waiting on it, an episode waits for its
call before its next model request, and with one per CPU the calls queued behind each other while the
model had the cores (math/h0 on 2 CPUs: ``benchmarks/bench_rollout.py``, README).

    from whale_envs import workers
    result = workers.call("sandbox", run_python, code, limits)

Sizes: ``WHALE_SANDBOX_WORKERS`` / ``WHALE_RETRIEVAL_WORKERS`` (read when a pool is first used), or
``configure(kind, n)``. ``stats(kind)`` counts calls, the most that ran at once, and the seconds
calls spent queued.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

KINDS = ("sandbox", "retrieval")
_ENV = {"sandbox": "WHALE_SANDBOX_WORKERS", "retrieval": "WHALE_RETRIEVAL_WORKERS"}
#: The default sandbox pool is four workers per CPU, never more than this many sandboxes at once.
SANDBOX_WORKERS_MAX = 256


class Pool:
    """At most ``workers`` calls of one kind at a time, the rest queued in arrival order."""

    def __init__(self, kind: str, workers: int):
        if workers < 1:
            raise ValueError(f"the {kind} pool needs at least one worker, got {workers}")
        self.kind = kind
        self.workers = workers
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"whale-{kind}")
        self._lock = threading.Lock()
        self.calls = 0
        self.running = 0
        self.max_running = 0
        self.wait_seconds = 0.0

    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
        queued = time.monotonic()

        def run() -> T:
            with self._lock:
                self.calls += 1
                self.running += 1
                self.max_running = max(self.max_running, self.running)
                self.wait_seconds += time.monotonic() - queued
            try:
                return fn(*args, **kwargs)
            finally:
                with self._lock:
                    self.running -= 1

        return self._executor.submit(run)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "workers": self.workers,
                "calls": self.calls,
                "max_running": self.max_running,
                "wait_seconds": round(self.wait_seconds, 3),
            }


_pools: dict[str, Pool] = {}
_pools_lock = threading.Lock()


def _default_size(kind: str) -> int:
    value = os.environ.get(_ENV[kind])
    if value is None:
        cpus = max(1, os.cpu_count() or 1)
        return min(4 * cpus, SANDBOX_WORKERS_MAX) if kind == "sandbox" else cpus
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{_ENV[kind]} must be a whole number, got {value!r}") from None


def pool(kind: str) -> Pool:
    if kind not in KINDS:
        raise ValueError(f"unknown worker pool {kind!r}; known: {', '.join(KINDS)}")
    with _pools_lock:
        if kind not in _pools:
            _pools[kind] = Pool(kind, _default_size(kind))
        return _pools[kind]


def configure(kind: str, workers: int) -> Pool:
    """A fresh pool of ``workers`` for ``kind`` (calls already queued on the old one still finish)."""
    pool(kind)  # validates the kind
    with _pools_lock:
        _pools[kind] = Pool(kind, workers)
        return _pools[kind]


def call(kind: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run ``fn(*args, **kwargs)`` in the ``kind`` pool and wait for it (exceptions propagate)."""
    return pool(kind).submit(fn, *args, **kwargs).result()


def stats(kind: str) -> dict[str, Any]:
    return pool(kind).stats()


def _forget_pools_after_fork() -> None:
    """A forked child (``gym.make_vec(..., vectorization_mode="async")``) has none of its parent's pool
    threads: a pool it inherited would queue calls that no thread runs. It starts its own pools."""
    global _pools_lock
    _pools.clear()
    _pools_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_pools_after_fork)
