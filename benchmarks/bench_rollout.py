"""Batched rollouts vs one request at a time, on the same episodes (target: >= 5x episodes/s on the
~1M model). Both run side by side in one process; the ratio is in the benchmark's extra_info
(``make bench`` prints it; ``--benchmark-json`` keeps it)."""

from __future__ import annotations

import time

import gymnasium as gym
import pytest

import whale_envs  # noqa: F401
from harnesses.loader import load_harness
from whale_train.llm.hf import TransformersLLM
from whale_train.rollout import RolloutConfig, run_rollouts


@pytest.mark.benchmark(group="rollout")
@pytest.mark.parametrize(
    ("env_id", "harness"), [("whale/Math-v0", "math/h0"), ("whale/Chess-v0", "chess_puzzles/h0")]
)
def test_batched_vs_sequential_rollouts(benchmark, fresh_model_dir, env_id, harness):
    llm = TransformersLLM(fresh_model_dir)
    ref = load_harness(harness)
    n = 8 if benchmark.disabled else 64  # `make test` only checks that it runs
    ids = gym.make(env_id, split="test").unwrapped.task_ids[:n]

    def episodes_per_second(concurrency: int) -> float:
        start = time.perf_counter()
        trajs = run_rollouts(
            ref, env_id, llm, ids, config=RolloutConfig(k=1, concurrency=concurrency, trusted=True)
        )
        assert len(trajs) == len(ids) and all(t.calls for t in trajs)
        return len(trajs) / (time.perf_counter() - start)

    episodes_per_second(n)  # warm-up: generate the tasks, fill caches
    sequential = episodes_per_second(1)
    batched = benchmark.pedantic(episodes_per_second, args=(n,), rounds=1, iterations=1)
    ratio = batched / sequential
    benchmark.extra_info.update(
        batched_eps=round(batched, 2), sequential_eps=round(sequential, 2), ratio=round(ratio, 2)
    )
    print(f"\n{harness}: batched {batched:.1f} episodes/s, one at a time {sequential:.1f}: {ratio:.1f}x")
    if not benchmark.disabled:  # with 8 tasks on a busy machine the ratio is noise
        assert batched > sequential


# ------------------------------------------------------------------------------------ episode isolation

# The worker as it was before episode isolation: one process, one thread per episode, every episode
# sharing the harness class and module (what the fork-per-episode template replaced). Kept here only
# as the baseline of the measurement; it speaks the same protocol to the trusted side.
_THREADED_MAIN = """
import json as _json, queue as _queue, threading as _threading, traceback as _traceback
class _EpisodeChannel:
    def __init__(self, shared, episode):
        self.shared, self.episode, self.replies = shared, episode, _queue.Queue()
    def send(self, msg):
        self.shared.send({**msg, "episode": self.episode})
    def call(self, method, args):
        from harnesses.base import HarnessCallError
        self.send({"op": "call", "method": method, "args": args})
        reply = self.replies.get()
        if not reply["ok"]:
            raise HarnessCallError(reply["error"])
        return reply["value"]
class _Shared:
    def __init__(self, out):
        self.out, self.lock = out, _threading.Lock()
    def send(self, msg):
        with self.lock:
            self.out.write(_json.dumps(msg) + "\\n")
            self.out.flush()
def _threaded_main():
    w = harnesses.worker
    out = open(sys.stdout.fileno(), "w", encoding="utf-8", closefd=False)
    sys.stdout = sys.stderr
    shared = _Shared(out)
    first = _json.loads(sys.stdin.readline())
    cls = w._load(first)
    shared.send({"op": "ready"})
    chans = {}
    def run(ch):
        error = None
        try:
            import harnesses.base as b
            cls().run(b.EnvProxy(ch.call), b.LLMProxy(ch.call, bool(first.get("has_chat_template"))))
        except BaseException:
            error = _traceback.format_exc()[-4000:]
        ch.send({"op": "done", "error": error})
    for line in sys.stdin:
        msg = _json.loads(line)
        if msg["op"] == "start":
            ch = chans[msg["episode"]] = _EpisodeChannel(shared, msg["episode"])
            _threading.Thread(target=run, args=(ch,), daemon=True).start()
        elif msg["op"] == "reply":
            chans[msg["episode"]].replies.put(msg)
        elif msg["op"] == "shutdown":
            break
harnesses.worker.main = _threaded_main
"""


def threaded_worker_program() -> str:
    from harnesses.worker import worker_program

    program = worker_program()
    return program.replace("harnesses.worker.main()\n", _THREADED_MAIN + "harnesses.worker.main()\n")


@pytest.mark.benchmark(group="isolation")
@pytest.mark.parametrize(
    ("env_id", "harness"), [("whale/Math-v0", "math/h0"), ("whale/Chess-v0", "chess_puzzles/h0")]
)
def test_episode_isolation_cost(benchmark, fresh_model_dir, monkeypatch, env_id, harness):
    """Untrusted rollouts with a fresh process per episode vs the shared-process worker it replaced,
    side by side on the same episodes (target: at most 1.2x the time). The trajectories must be
    identical: isolation changes where the harness runs, not what it does."""
    import whale_train.rollout.executors as executors

    llm = TransformersLLM(fresh_model_dir)
    ref = load_harness(harness)
    n = 4 if benchmark.disabled else 64  # `make test` only checks that both run and agree
    ids = gym.make(env_id, split="test").unwrapped.task_ids[:n]
    forked = executors.worker_program

    def seconds(program) -> tuple[float, list]:
        monkeypatch.setattr(executors, "worker_program", program)
        start = time.perf_counter()
        trajs = run_rollouts(ref, env_id, llm, ids, config=RolloutConfig(k=1, concurrency=n, trusted=False))
        return time.perf_counter() - start, trajs

    if not benchmark.disabled:
        seconds(forked)  # warm-up: generate the tasks, fill caches
    rounds = 1 if benchmark.disabled else 3
    shared_s, isolated_s = [], []
    for _ in range(rounds):  # interleaved, so machine load affects both alike
        t, shared = seconds(threaded_worker_program)
        shared_s.append(t)
        t, isolated = seconds(forked)
        isolated_s.append(t)
    key = [
        (t.task_id, t.reward, [c.completion for c in t.calls], [s.action for s in t.steps]) for t in isolated
    ]
    assert key == [
        (t.task_id, t.reward, [c.completion for c in t.calls], [s.action for s in t.steps]) for t in shared
    ]
    assert all(t.error is None for t in isolated)
    ratio = min(isolated_s) / min(shared_s)
    benchmark.extra_info.update(
        shared_s=round(min(shared_s), 3),
        isolated_s=round(min(isolated_s), 3),
        ratio=round(ratio, 3),
        episodes=n,
    )
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    print(
        f"\n{harness}: {n} episodes, shared worker {min(shared_s):.2f} s, a process per episode "
        f"{min(isolated_s):.2f} s: {ratio:.2f}x"
    )
