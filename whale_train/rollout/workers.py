"""The sandboxed worker seen from the trusted side: :class:`Worker` starts it
(``whale_envs.sandbox.spawn_python`` with the harness source), reads its messages on a thread of its
own and writes to it; :func:`reusing_workers` lets the rollouts of one block share a worker. The
executor (:mod:`whale_train.rollout.executors`) drives the episodes through it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import queue
import threading
import time
from typing import Any

from harnesses.loader import HarnessRef
from harnesses.worker import MAX_MESSAGE_BYTES, parse_message, worker_program
from whale_envs.sandbox import Limits, spawn_python

#: Idle workers a block keeps at most (each a sandboxed interpreter of about 10 MB waiting).
MAX_IDLE = 4
#: This thread's idle workers within :func:`reusing_workers` (the worker's settings -> the worker).
_IDLE = threading.local()


@contextlib.contextmanager
def reusing_workers():
    """Within the block, this thread's rollouts of one harness with the same settings share one sandboxed
    worker instead of starting one each (a jail, an interpreter and the harness API: about 0.1 s of CPU).
    A worker's template never runs harness code, and its episodes are forked by its spawner, which
    relays no message (``harnesses.worker``), so the episodes of a later rollout meet a worker as more
    episodes of the same rollout would: nothing of the earlier rollouts' prompts and replies is in
    their memory, and episode ids never repeat. A block inside another keeps workers of its own (the
    outer block's come back when it ends). The block's workers are all ended when it ends."""
    outer = getattr(_IDLE, "workers", None)
    _IDLE.workers = {}
    try:
        yield
    finally:
        for worker in _IDLE.workers.values():
            worker.end()
        _IDLE.workers = outer


def take_idle(settings: tuple) -> Worker | None:
    """An idle worker of the enclosing :func:`reusing_workers` block with these settings, alive, taken
    out of the block's keeping (a dead one is ended); None outside a block or when there is none."""
    idle = getattr(_IDLE, "workers", None)
    worker = idle.pop(settings, None) if idle is not None else None
    if worker is not None and not worker.alive():
        worker.end()
        return None
    return worker


def keep_or_end(worker: Worker, busy: bool) -> None:
    """At the end of a rollout: keep ``worker`` for the block's next rollout (inside a
    :func:`reusing_workers` block, alive, no episode of it left in flight: ``busy`` false, and none with
    its settings kept already), else end it."""
    idle = getattr(_IDLE, "workers", None)
    if idle is not None and not busy and worker.alive() and worker.key not in idle:
        idle[worker.key] = worker
        while len(idle) > MAX_IDLE:  # the one kept longest (a search's earlier candidate) goes
            idle.pop(next(iter(idle))).end()
    else:
        worker.end()


class Worker:
    """One sandboxed worker process (``whale_envs.sandbox.spawn_python``: no network, no view of the
    project or the task files, its own uid, rlimits) and the thread that reads its messages."""

    def __init__(self, harness: HarnessRef, has_chat_template: bool, config: Any, inbox: queue.Queue):
        limits = Limits(
            wall_s=86_400,
            cpu_s=86_400,
            memory_mb=config.worker_memory_mb,
            # an episode in flight is two processes while it starts (its forked process and the isolated
            # one, PID 1 of its namespace); one process per episode had forks refused (EAGAIN) under load
            max_processes=2 * config.concurrency + 32,
            open_files=4 * config.concurrency + 64,  # the template holds two pipes per episode
            file_mb=16,
            site_packages=False,  # the worker needs the standard library only
            writable_files=False,  # no file an episode could leave for a later one
        )
        self.proc = spawn_python(worker_program(), limits)
        self._lock = threading.Lock()
        self.inbox = inbox
        self.key = self.settings(harness, has_chat_template, config)
        self.ids = itertools.count()  # episode ids, unique over the worker's life
        #: episode id -> when its oldest message not yet handled was read (by ``_read``, which only
        #: reads): the harness's turn ended then, however long the trusted side takes to handle it.
        self.arrived: dict[int, float] = {}
        self.send(
            {
                "op": "load",
                "source": harness.source,
                "filename": harness.filename,
                "has_chat_template": has_chat_template,
                "examples": list(config.examples),
                "episode_memory_bytes": config.episode_memory_mb * 1024 * 1024,
            }
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @staticmethod
    def settings(harness: HarnessRef, has_chat_template: bool, config: Any) -> tuple:
        """What a worker is started with: workers with equal settings are interchangeable."""
        return (
            harness.source,
            harness.filename,
            has_chat_template,
            tuple(config.examples),
            config.episode_memory_mb,
            config.worker_memory_mb,
            config.concurrency,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None and self._reader.is_alive()

    def end(self) -> None:
        self.send({"op": "shutdown"})
        self.kill()

    def _read(self) -> None:
        """Any bytes may come: a message that is not a checked protocol object ends the worker."""
        stream = self.proc.stdout.buffer
        try:
            while True:
                line = stream.readline(MAX_MESSAGE_BYTES + 2)
                if not line:
                    break
                if not line.endswith(b"\n") and len(line) > MAX_MESSAGE_BYTES:
                    self.inbox.put(
                        (self, {"op": "protocol", "error": f"a message over {MAX_MESSAGE_BYTES} bytes"})
                    )
                    return
                now = time.monotonic()
                msg, why = parse_message(line.rstrip(b"\n"))
                if msg is None:
                    self.inbox.put((self, {"op": "protocol", "error": why}))
                    return
                eid = msg.get("episode")
                if isinstance(eid, int):
                    self.arrived.setdefault(eid, now)
                self.inbox.put((self, msg))
        except (OSError, ValueError) as exc:
            self.inbox.put((self, {"op": "protocol", "error": f"reading the worker failed: {exc}"}))
            return
        self.inbox.put((self, {"op": "exit"}))

    def send(self, msg: dict) -> bool:
        try:
            with self._lock:  # ASCII: a reply holding a lone surrogate is still a line the pipe takes
                self.proc.stdin.write(json.dumps(msg, ensure_ascii=True) + "\n")
                self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def stderr_tail(self, n: int = 1500) -> str:
        return self.proc.stderr_tail(n)

    def kill(self) -> None:
        self.proc.close()
