"""The ``Batcher``: every LLM request of every in-flight episode goes to one, and runs in large batches.

It flushes when every in-flight episode is waiting on the model (or after ``max_wait`` seconds), so
the backend sees batches as large as the number of episodes in flight.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from whale_train.llm.base import LLM, Request


@dataclass
class _Job:
    future: Future
    requests: list[Request] | None = None
    score: tuple[Any, list[str]] | None = None


class Batcher:
    """Collects the LLM requests of all in-flight episodes and runs them as large batches.

    ``enter()``/``leave()`` count in-flight episodes; ``submit_*`` returns a Future. A flush happens
    when every in-flight episode has a pending job; or, when some episodes are busy elsewhere, once the
    oldest job has waited ``max_wait`` seconds and no new job came in for ``quiet`` seconds (jobs
    still streaming in are worth waiting for); and always after ``max_hold`` seconds.
    """

    def __init__(self, llm: LLM, max_wait: float = 0.05, quiet: float = 0.01, max_hold: float = 1.0):
        self.llm = llm
        self.max_wait = max_wait
        self.quiet = quiet
        self.max_hold = max_hold
        self._last_submit = 0.0
        self._free_since = 0.0
        self._cv = threading.Condition()
        self._pending: list[tuple[float, _Job]] = []
        self._active = 0
        self._closed = False
        self.batches: list[int] = []  # sizes of the complete() batches, for benchmarks
        self._thread = threading.Thread(target=self._loop, name="whale-batcher", daemon=True)
        self._thread.start()

    def enter(self) -> None:
        with self._cv:
            self._active += 1

    def leave(self) -> None:
        with self._cv:
            self._active -= 1
            self._cv.notify_all()

    def submit_complete(self, requests: list[Request]) -> Future:
        return self._submit(_Job(Future(), requests=requests))

    def submit_score(self, prompt: Any, continuations: list[str]) -> Future:
        return self._submit(_Job(Future(), score=(prompt, continuations)))

    def _submit(self, job: _Job) -> Future:
        with self._cv:
            self._last_submit = time.monotonic()
            self._pending.append((self._last_submit, job))
            self._cv.notify_all()
        return job.future

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout=5)

    def _ready(self) -> bool:
        if not self._pending:
            return False
        if len(self._pending) >= self._active:
            return True
        now = time.monotonic()
        age = now - max(self._pending[0][0], self._free_since)  # jobs that came in during a flush wait afresh
        return age >= self.max_hold or (age >= self.max_wait and now - self._last_submit >= self.quiet)

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._closed and not self._ready():
                    self._cv.wait(self.quiet if self._pending else None)
                if self._closed and not self._pending:
                    return
                jobs = [job for _, job in self._pending]
                self._pending = []
            self._run(jobs)
            with self._cv:
                self._free_since = time.monotonic()

    def _run(self, jobs: list[_Job]) -> None:
        completes = [j for j in jobs if j.requests is not None]
        if completes:
            flat = [r for j in completes for r in j.requests]  # type: ignore[union-attr]
            self.batches.append(len(flat))
            try:
                outs = self.llm.complete(flat)
                i = 0
                for j in completes:
                    n = len(j.requests)  # type: ignore[arg-type]
                    j.future.set_result(outs[i : i + n])
                    i += n
            except Exception as exc:
                if len(completes) == 1:
                    completes[0].future.set_exception(exc)
                else:  # the backend refused the batch: again job by job, so a bad request fails its episode only
                    for j in completes:
                        try:
                            j.future.set_result(self.llm.complete(j.requests))
                        except Exception as one:
                            j.future.set_exception(one)
        for j in jobs:
            if j.score is not None:
                try:
                    j.future.set_result(self.llm.score(*j.score))
                except Exception as exc:
                    j.future.set_exception(exc)
