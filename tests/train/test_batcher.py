"""The batcher's flush policy: a batch holds every in-flight episode that is about to call the model,
an episode busy elsewhere for long does not hold the others back, and the score calls of many
episodes reach the backend together."""

from __future__ import annotations

import contextlib
import threading
import time

from whale_train.llm.base import Request, SamplingParams
from whale_train.llm.scripted import ScriptedLLM
from whale_train.rollout import Batcher


class Recording(ScriptedLLM):
    """A scripted model that records the size of every batch and every score_many call it gets."""

    def __init__(self):
        super().__init__(lambda prompt: "ok")
        self.completes: list[int] = []
        self.score_calls: list[int] = []

    def complete(self, requests):
        self.completes.append(len(requests))
        return super().complete(requests)

    def score_many(self, items):
        self.score_calls.append(len(items))
        return [self.score(p, c) for p, c in items]


def request(i: int) -> list[Request]:
    return [Request(f"prompt {i}", SamplingParams(max_tokens=4), seed=i)]


@contextlib.contextmanager
def batching(**options):
    """A recording model and a batcher in front of it, closed at the end."""
    llm = Recording()
    batcher = Batcher(llm, **options)
    try:
        yield llm, batcher
    finally:
        batcher.close()


def test_the_first_batch_waits_for_every_episode_that_is_still_starting():
    # Episodes whose first call comes 30 ms apart (slower than the old 10 ms quiet gap): one batch.
    with batching(max_wait=0.005, max_hold=5.0) as (llm, batcher):
        owners = [batcher.enter() for _ in range(8)]
        futures = []
        for i, owner in enumerate(owners):
            futures.append(batcher.submit_complete(request(i), owner=owner))
            time.sleep(0.03)
        assert [f.result(timeout=10)[0].text for f in futures] == ["ok"] * 8
        assert llm.completes == [8]


def test_an_episode_busy_elsewhere_does_not_hold_the_batch_past_the_patience():
    with batching(max_wait=0.05, max_hold=30.0) as (llm, batcher):
        slow, quick = batcher.enter(), batcher.enter()
        first = [batcher.submit_complete(request(i), owner=o) for i, o in enumerate((slow, quick))]
        [f.result(timeout=10) for f in first]  # both busy since the reply
        start = time.monotonic()
        # `slow` is in a long tool call (never submits); `quick` asks again and is served after the
        # patience (max_wait, or half the last batch), not after max_hold.
        batcher.submit_complete(request(1), owner=quick).result(timeout=10)
        assert time.monotonic() - start < 5.0
        assert llm.completes == [2, 1]


def test_a_busy_episode_that_answers_soon_joins_the_batch():
    with batching(max_wait=1.0, max_hold=30.0) as (llm, batcher):
        a, b = batcher.enter(), batcher.enter()
        first = batcher.submit_complete(request(0), owner=a)
        threading.Timer(0.1, lambda: batcher.submit_complete(request(1), owner=b)).start()
        first.result(timeout=10)
        assert llm.completes == [2]  # flushed when b arrived, well before max_wait ran out
        batcher.leave(b)
        batcher.submit_complete(request(2), owner=a).result(timeout=10)  # alone in flight: no wait
        assert llm.completes == [2, 1]


def test_the_score_calls_of_many_episodes_go_to_the_backend_together():
    llm = Recording()
    batcher = Batcher(llm)
    owners = [batcher.enter() for _ in range(5)]
    try:
        futures = [batcher.submit_score(f"p{i}", ["a", "bc"], owner=o) for i, o in enumerate(owners)]
        results = [f.result(timeout=10) for f in futures]
        assert llm.score_calls == [5]
        assert all(len(r) == 2 and r[0].text == "a" for r in results)
    finally:
        batcher.close()


def test_a_finished_completion_is_answered_while_its_batch_still_decodes(fresh_model_dir):
    """transformers ``streams``: a short request's episode gets its reply when its row ends, before
    the batch's longest row is done (that episode goes on to its env meanwhile); the replies are
    the completions ``complete`` returns."""
    from whale_train.llm.hf import TransformersLLM

    llm = TransformersLLM(fresh_model_dir)
    events: list[str] = []
    returned: list = []
    complete = llm.complete

    def recorded(requests, on_done=None):
        out = complete(requests, on_done=on_done)
        events.append("batch returned")
        returned.extend(out)
        return out

    llm.complete = recorded  # type: ignore[method-assign]
    batcher = Batcher(llm, max_wait=0.005, max_hold=5.0)
    short_owner, long_owner = batcher.enter(), batcher.enter()
    try:
        short = batcher.submit_complete(
            [Request("2+2=", SamplingParams(temperature=0.0, max_tokens=1), seed=1)], owner=short_owner
        )
        short.add_done_callback(lambda f: events.append("short answered"))
        long = batcher.submit_complete(
            [Request("2+2=", SamplingParams(temperature=0.0, max_tokens=24), seed=2)], owner=long_owner
        )
        replies = short.result(timeout=60) + long.result(timeout=60)
    finally:
        batcher.close()  # the batch has returned once the batcher's thread is done
    assert events == ["short answered", "batch returned"]
    assert sorted(r.completion_tokens for r in replies) == sorted(r.completion_tokens for r in returned)
    assert replies[0].completion_tokens == 1
