"""The ``Batcher``: every LLM request of every in-flight episode goes to one, and runs in large batches.

The cost of a batch on a small model (and on a GPU at modest batch sizes) is mostly the fixed cost of
each decoding step, so a batch of 1 costs nearly what a batch of 128 does: the flush policy, not the
model, decides how fast rollouts go. The batcher therefore knows each in-flight episode (its owner
key): one is *waiting* while it has a job pending, else *busy* (its harness or its env is working) since
the moment its last reply came back (or it entered). A flush happens

* when every in-flight episode is waiting (the usual case: a turn of every episode in one batch);
* when every busy episode has been busy for longer than the *patience*: ``max_wait``, or half the
  last batch's duration if that is longer (a straggler is worth waiting for while it costs less than
  the batch it would miss), or ``max_hold`` for an episode that has not made its first call yet
  (start-up: forking its process, building its task);
* always once the oldest job has waited ``max_hold`` seconds.

A backend that ``streams`` (transformers) answers each job as soon as its completions are done, not
when its whole batch is: its episode steps its env (a tool call) while the batch's longer completions
still decode. A backend that batches continuously itself (``continuous`` and ``submit``: vLLM's async engine) gets
each sampling job the moment it is submitted, with no barrier. Score jobs of many episodes go to the
backend together when it has ``score_many`` (transformers:
the prompts share one forward pass). Jobs are answered in submission order within a batch; each request carries its own seed, so what a
request samples does not depend on its batch mates (see ``whale_train.llm.base``).
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
    owner: Any
    requests: list[Request] | None = None
    score: tuple[Any, list[str]] | None = None


class Batcher:
    """Collects the LLM requests of all in-flight episodes and runs them as large batches.

    ``enter(owner)`` / ``leave(owner)`` bracket an in-flight episode (``owner``: any hashable key, the
    ``Episode``); ``submit_*(..., owner=)`` returns a Future. ``enter()`` without an owner returns a
    fresh key. See the module docstring for when a batch flushes.
    """

    def __init__(self, llm: LLM, max_wait: float = 0.05, max_hold: float = 1.0):
        self.llm = llm
        self.max_wait = max_wait
        self.max_hold = max_hold
        self._cv = threading.Condition()
        self._pending: list[tuple[float, _Job]] = []
        self._busy: dict[Any, float] = {}  # in-flight owner -> since when it is busy (no job pending)
        self._fresh: set[Any] = set()  # owners that have not submitted yet
        self._waiting: dict[Any, int] = {}  # owner -> jobs pending or running
        self._free_since = 0.0
        self._last_batch_s = 0.0
        self._closed = False
        self.batches: list[int] = []  # sizes of the complete() batches, for benchmarks and tests
        self.model_seconds = 0.0  # time spent in the backend's batch calls (the rest is waiting)
        #: The backend batches continuously itself (vLLM's async engine: ``submit``): sampling requests
        #: go straight to it; score jobs still flush here.
        self.continuous = bool(getattr(llm, "continuous", False)) and callable(getattr(llm, "submit", None))
        self._thread = threading.Thread(target=self._loop, name="whale-batcher", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ episodes

    def enter(self, owner: Any = None) -> Any:
        owner = object() if owner is None else owner
        with self._cv:
            self._busy[owner] = time.monotonic()
            self._fresh.add(owner)
        return owner

    def leave(self, owner: Any) -> None:
        with self._cv:
            self._busy.pop(owner, None)
            self._fresh.discard(owner)
            self._waiting.pop(owner, None)
            self._cv.notify_all()

    def submit_complete(self, requests: list[Request], owner: Any = None) -> Future:
        job = _Job(Future(), owner, requests=requests)
        if not self.continuous:
            return self._submit(job)
        # A continuous-batching backend takes each request as it comes: no flush, no turn barrier.
        with self._cv:
            if owner is not None:
                self._busy.pop(owner, None)
                self._fresh.discard(owner)
                self._waiting[owner] = self._waiting.get(owner, 0) + 1
        self.batches.append(len(requests))
        try:
            inner = self.llm.submit(requests)  # type: ignore[attr-defined]
        except Exception as exc:
            self._answer(job, exc=exc)
            return job.future

        def done(f: Future) -> None:
            exc = f.exception()
            if exc is not None:
                self._answer(job, exc=exc)
            else:
                self._answer(job, f.result())

        inner.add_done_callback(done)
        return job.future

    def submit_score(self, prompt: Any, continuations: list[str], owner: Any = None) -> Future:
        return self._submit(_Job(Future(), owner, score=(prompt, continuations)))

    def _submit(self, job: _Job) -> Future:
        with self._cv:
            self._pending.append((time.monotonic(), job))
            if job.owner is not None:
                self._busy.pop(job.owner, None)
                self._fresh.discard(job.owner)
                self._waiting[job.owner] = self._waiting.get(job.owner, 0) + 1
            self._cv.notify_all()
        return job.future

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout=5)

    # ------------------------------------------------------------------ the flush policy

    def _wait_left(self, now: float) -> float:
        """Seconds until a flush is due (0: now); ``inf`` with nothing pending."""
        if not self._pending:
            return float("inf")
        if not self._busy:
            return 0.0
        hold = max(self._pending[0][0], self._free_since) + self.max_hold - now  # jobs that came in
        patience = max(
            self.max_wait, min(self.max_hold, self._last_batch_s / 2)
        )  # during a flush wait afresh
        stragglers = max(
            since + (self.max_hold if owner in self._fresh else patience)
            for owner, since in self._busy.items()
        )
        return max(0.0, min(hold, stragglers - now))

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._closed:
                    left = self._wait_left(time.monotonic())
                    if left <= 0:
                        break
                    self._cv.wait(None if left == float("inf") else left)
                if self._closed and not self._pending:
                    return
                jobs = [job for _, job in self._pending]
                self._pending = []
            start = time.monotonic()
            self._run(jobs)
            with self._cv:
                self._free_since = time.monotonic()
                self._last_batch_s = self._free_since - start
                self.model_seconds += self._last_batch_s

    def _answer(self, job: _Job, value: Any = None, exc: BaseException | None = None) -> None:
        """Resolve ``job``; its owner is busy from now on (marked before its episode can submit again)."""
        with self._cv:
            owner = job.owner
            if owner is not None and owner in self._waiting:
                self._waiting[owner] -= 1
                if self._waiting[owner] <= 0:
                    del self._waiting[owner]
                    self._busy[owner] = time.monotonic()
        if exc is not None:
            job.future.set_exception(exc)
        else:
            job.future.set_result(value)

    def _run(self, jobs: list[_Job]) -> None:
        completes = [j for j in jobs if j.requests is not None]
        if completes:
            flat = [r for j in completes for r in j.requests]  # type: ignore[union-attr]
            self.batches.append(len(flat))
            # A backend that ``streams`` hands back each completion as it ends: a job is answered once
            # all of its requests are, while the rest of the batch still decodes.
            job_of = [(j, k) for j in completes for k in range(len(j.requests))]  # type: ignore[arg-type]
            got: dict[int, list] = {id(j): [None] * len(j.requests) for j in completes}  # type: ignore[arg-type]
            left = {id(j): len(j.requests) for j in completes}  # type: ignore[arg-type]
            answered: set[int] = set()

            def on_done(i: int, completion: Any) -> None:
                j, k = job_of[i]
                got[id(j)][k] = completion
                left[id(j)] -= 1
                if left[id(j)] == 0:
                    answered.add(id(j))
                    self._answer(j, got[id(j)])

            try:
                if getattr(self.llm, "streams", False):
                    outs = self.llm.complete(flat, on_done=on_done)  # type: ignore[call-arg]
                else:
                    outs = self.llm.complete(flat)
            except Exception as exc:
                todo = [j for j in completes if id(j) not in answered]
                if len(todo) == 1:
                    self._answer(todo[0], exc=exc)
                else:  # the backend refused the batch: again job by job, so a bad request fails its episode only
                    for j in todo:
                        try:
                            self._answer(j, self.llm.complete(j.requests))
                        except Exception as one:
                            self._answer(j, exc=one)
            else:
                i = 0
                for j in completes:
                    n = len(j.requests)  # type: ignore[arg-type]
                    if id(j) not in answered:
                        self._answer(j, outs[i : i + n])
                    i += n
        scores = [j for j in jobs if j.score is not None]
        many = getattr(self.llm, "score_many", None)
        if len(scores) > 1 and callable(many):  # the prompts of many episodes in one pass (transformers)
            try:
                outs = many([j.score for j in scores])
            except Exception:  # again job by job, so a bad call fails its episode only
                pass
            else:
                for j, value in zip(scores, outs, strict=True):
                    self._answer(j, value)
                return
        for j in scores:
            try:
                value = self.llm.score(*j.score)  # type: ignore[misc]
            except Exception as exc:
                self._answer(j, exc=exc)
            else:
                self._answer(j, value)
