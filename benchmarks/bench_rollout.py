"""Rollout speed, each figure a ratio of two runs side by side in one process (``make bench`` prints
them; ``--benchmark-json`` keeps them in extra_info). Timings on a shared CPU are noisy: every ratio
comes from interleaved repeats and is reported as the median; no test has a time limit.

- raw vs rollout: ``run_rollouts`` at concurrency 128 against the raw batched sampling of the very same
  calls (every episode's i-th call in one ``complete()``), and against one episode at a time
  (targets: at most 1.5x raw, at least 5x faster than one at a time);
- trusted vs untrusted: the same rollout in this process and in the sandboxed worker;
- shared-prefix vs naive scoring: ``score_many`` against one full forward per prompt and option with a
  full-vocabulary log-softmax, on the calls of the chess ``choose`` harness; and ``choose`` against h0
  on the same tasks (target: at most 1.5x);
- async vs barrier: the vLLM backend on the async engine against the batcher's turn barrier, both on
  the fake engine of tests/fake_vllm.py with a simulated per-token latency.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from pathlib import Path

import gymnasium as gym
import pytest
import torch

import whale_envs  # noqa: F401
from benchmarks.reporting import report
from harnesses.loader import load_harness
from whale_train.llm import SHIPPED_MODEL
from whale_train.llm.base import Request, SamplingParams
from whale_train.llm.hf import TransformersLLM
from whale_train.rollout import RolloutConfig, run_rollouts

ENVS = [("whale/Math-v0", "math/h0"), ("whale/Chess-v0", "chess_puzzles/h0")]


def in_thread(fn, *args):
    """``fn(*args)`` in a fresh thread, as the batcher calls the model (on a loaded CPU, torch's OpenMP
    team runs several times slower from the main thread than from another one: compare like with like)."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn(*args)))
    t.start()
    t.join()
    return out[0]


def timed(fn, *args) -> tuple[float, object]:
    start = time.perf_counter()
    value = fn(*args)
    return time.perf_counter() - start, value


def key(trajs) -> list:
    return [
        (t.task_id, t.reward, [c.completion_ids for c in t.calls], [s.action for s in t.steps]) for t in trajs
    ]


def turns(trajs) -> list[list[Request]]:
    """The sampled calls of ``trajs`` as the raw batches a perfect engine would run: every episode's
    i-th call together (the i-th turn), with the same prompts, parameters and seeds."""
    out: list[list[Request]] = []
    for t in trajs:
        for i, c in enumerate(c for c in t.calls if c.kind == "sample"):
            if i == len(out):
                out.append([])
            params = SamplingParams(**{**c.params, "stop": tuple(c.params["stop"])})
            out[i].append(Request(c.prompt, params, c.seed))
    return out


@pytest.fixture(scope="module")
def shipped() -> TransformersLLM:
    return TransformersLLM(SHIPPED_MODEL)


@pytest.mark.slow
@pytest.mark.benchmark(group="rollout")
@pytest.mark.parametrize(("env_id", "harness"), ENVS)
def test_rollout_vs_raw_sampling_vs_one_at_a_time(benchmark, shipped, monkeypatch, env_id, harness):
    """Also the rollout's time inside the model (the batcher's ``model_seconds``): the rest is start-up
    and waiting for episodes busy in their env (math's sandboxed tool calls) or harness code."""
    import whale_train.rollout.executors as executors

    class Recorded(executors.Batcher):
        last: executors.Batcher | None = None

        def close(self):
            super().close()
            Recorded.last = self

    monkeypatch.setattr(executors, "Batcher", Recorded)
    # The seconds of the env's sandboxed tool calls (math's Python tool): env time raw sampling has not.
    from whale_envs import workers

    tool_s: list[float] = []
    call = workers.call

    def timed_call(kind, fn, *args, **kwargs):
        def run(*a, **k):  # in the pool's thread: the call's own time, not its wait in the queue
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                tool_s.append(time.perf_counter() - start)

        return call(kind, run if kind == "sandbox" else fn, *args, **kwargs)

    monkeypatch.setattr(workers, "call", timed_call)
    n = 8 if benchmark.disabled else 128  # `make test` only checks that it runs
    rounds = 1 if benchmark.disabled else 3
    ref = load_harness(harness)
    ids = gym.make(env_id, split="test").unwrapped.task_ids[:n]

    def rollout(concurrency: int):
        config = RolloutConfig(k=1, concurrency=concurrency, trusted=True)
        return timed(lambda: run_rollouts(ref, env_id, shipped, ids, config=config))

    _, first = rollout(n)  # warm-up: generate the tasks, fill caches
    batches = turns(first)
    raw_s, roll_s, model_s, tools_s = [], [], [], []
    for _ in range(rounds):  # interleaved, so machine load affects both alike
        raw_s.append(in_thread(lambda: timed(lambda: [shipped.complete(b) for b in batches])[0]))
        tool_s.clear()
        t, trajs = rollout(n)
        roll_s.append(t)
        tools_s.append(sum(tool_s))
        tool_n = len(tool_s)
        model_s.append(Recorded.last.model_seconds)
        assert key(trajs) == key(first)  # same seeds, same trajectories, whatever the timing
    one_s, alone = rollout(1)
    assert key(alone) == key(first)
    # The model's own gain from batching: the same calls one at a time, raw. One episode at a time
    # cannot be slower than rollouts by more than this and the rollout's own overhead (chess on a
    # CPU: its ~340-token prefills cost as much batched as one by one).
    raw_one_s = in_thread(lambda: timed(lambda: [shipped.complete([r]) for b in batches for r in b])[0])
    raw, roll = statistics.median(raw_s), statistics.median(roll_s)
    report(
        benchmark,
        harness,
        episodes=n,
        calls=sum(map(len, batches)),
        turns=len(batches),
        raw_s=raw,
        rollout_s=roll,
        in_model_s=statistics.median(model_s),
        tool_calls=tool_n,
        tool_s_per_worker=statistics.median(tools_s) / workers.pool("sandbox").workers,
        one_at_a_time_s=one_s,
        rollout_over_raw=roll / raw,
        in_model_over_raw=statistics.median(model_s) / raw,
        speedup_over_one_at_a_time=one_s / roll,
        raw_one_by_one_s=raw_one_s,
        raw_batching_gain=raw_one_s / raw,
    )


@pytest.mark.slow
@pytest.mark.benchmark(group="rollout")
@pytest.mark.parametrize(("env_id", "harness"), ENVS)
def test_trusted_vs_untrusted_rollouts(benchmark, shipped, env_id, harness):
    """The same episodes with the harness in this process and in the sandboxed worker (a forked
    process per episode): identical trajectories, the worker's cost as a ratio."""
    n = 4 if benchmark.disabled else 128
    rounds = 1 if benchmark.disabled else 3
    ref = load_harness(harness)
    ids = gym.make(env_id, split="test").unwrapped.task_ids[:n]

    def go(trusted: bool):
        return timed(
            lambda: run_rollouts(
                ref, env_id, shipped, ids, config=RolloutConfig(k=1, concurrency=n, trusted=trusted)
            )
        )

    _, first = go(True)
    trusted_s, worker_s = [], []
    for _ in range(rounds):
        t, trajs = go(True)
        trusted_s.append(t)
        t, untrusted = go(False)
        worker_s.append(t)
        assert key(untrusted) == key(trajs) == key(first)
    trusted, worker = statistics.median(trusted_s), statistics.median(worker_s)
    report(
        benchmark,
        harness,
        episodes=n,
        trusted_s=trusted,
        worker_s=worker,
        worker_over_trusted=worker / trusted,
    )


@torch.inference_mode()
def naive_score(llm: TransformersLLM, prompt, options: list[str]) -> list[float]:
    """Scoring as it was: every option on the full prompt + option sequence, a log-softmax over the
    whole vocabulary at every position, one call at a time."""
    ids = llm.encode(llm.render(prompt))
    out = []
    for start in range(0, len(options), llm.max_batch_size):
        conts = [llm.encode(o) for o in options[start : start + llm.max_batch_size]]
        seqs = [ids + c for c in conts]
        width = max(map(len, seqs))
        batch = torch.full((len(seqs), width), llm.pad_id, dtype=torch.long)
        mask = torch.zeros_like(batch)
        for row, seq in enumerate(seqs):
            batch[row, : len(seq)] = torch.tensor(seq)
            mask[row, : len(seq)] = 1
        logp = torch.log_softmax(llm.model(input_ids=batch, attention_mask=mask).logits.float(), dim=-1)
        for row, c in enumerate(conts):
            out.append(sum(float(logp[row, len(ids) + t - 1, tok]) for t, tok in enumerate(c)))
    return out


@pytest.mark.slow
@pytest.mark.benchmark(group="scoring")
def test_shared_prefix_vs_naive_scoring_and_choose_vs_h0(benchmark, shipped):
    n = 4 if benchmark.disabled else 32  # the naive side is slow: ~30 options of a ~380-token prompt each
    rounds = 1 if benchmark.disabled else 3
    env_id = "whale/Chess-v0"
    ids = gym.make(env_id, split="test").unwrapped.task_ids[:n]
    config = RolloutConfig(k=1, concurrency=n, trusted=True)
    choose, h0 = load_harness("chess_puzzles/choose"), load_harness("chess_puzzles/h0")
    run_rollouts(h0, env_id, shipped, ids, config=config)  # warm-up
    _, chosen = timed(lambda: run_rollouts(choose, env_id, shipped, ids, config=config))
    items = [(c.prompt, None) for t in chosen for c in t.calls]
    # The options of each call: the legal moves of the position its prompt shows.
    options = []
    for prompt, _ in items:
        text = prompt if isinstance(prompt, str) else prompt[-1]["content"]
        moves = next(line for line in text.splitlines() if line.startswith("Legal moves: ")).split()[2:]
        options.append([f"<move>{m}</move>" for m in moves])
    items = [(p, o) for (p, _), o in zip(items, options, strict=True)]
    shared_s, naive_s, choose_s, h0_s = [], [], [], []
    for _ in range(rounds):
        t, shared = in_thread(lambda: timed(shipped.score_many, items))
        shared_s.append(t)
        t, naive = in_thread(lambda: timed(lambda: [naive_score(shipped, p, o) for p, o in items]))
        naive_s.append(t)
        for got, want in zip(shared, naive, strict=True):
            assert [c.logprob for c in got] == pytest.approx(want, abs=1e-3)
        choose_s.append(timed(lambda: run_rollouts(choose, env_id, shipped, ids, config=config))[0])
        h0_s.append(timed(lambda: run_rollouts(h0, env_id, shipped, ids, config=config))[0])
    shared, naive = statistics.median(shared_s), statistics.median(naive_s)
    report(
        benchmark,
        "chess_puzzles/choose",
        calls=len(items),
        options=sum(map(len, options)),
        shared_prefix_s=shared,
        naive_s=naive,
        naive_over_shared=naive / shared,
        choose_rollout_s=statistics.median(choose_s),
        h0_rollout_s=statistics.median(h0_s),
        choose_over_h0=statistics.median(choose_s) / statistics.median(h0_s),
    )


@pytest.mark.slow
@pytest.mark.benchmark(group="async")
def test_async_engine_vs_turn_barrier(benchmark, monkeypatch):
    """vLLM's async engine (each request joins the running batch as its episode makes it) against the
    batcher's turn barrier (one generate() per flush, done when its longest request is), on the fake
    engine with a simulated per-token latency. Same trajectories."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import fake_vllm

    from whale_train.llm.vllm_backend import VLLMLLM

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    fake_vllm.install(monkeypatch)
    n = 4 if benchmark.disabled else 64
    rounds = 1 if benchmark.disabled else 3
    latency = 0.002 if benchmark.disabled else 0.02
    ids = gym.make("whale/Math-v0", split="test").unwrapped.task_ids[:n]
    ref = load_harness("math/h0")
    engines = {"barrier": VLLMLLM(str(SHIPPED_MODEL)), "async": VLLMLLM(str(SHIPPED_MODEL), continuous=True)}

    def go(name: str):
        return timed(
            lambda: run_rollouts(
                ref,
                "whale/Math-v0",
                engines[name],
                ids,
                config=RolloutConfig(k=1, concurrency=n, trusted=True),
            )
        )

    go("barrier")
    go("async")  # warm-up
    monkeypatch.setitem(fake_vllm.TOKEN_LATENCY, "seconds", latency)
    times: dict[str, list[float]] = {"barrier": [], "async": []}
    for _ in range(rounds):
        t, barrier = go("barrier")
        times["barrier"].append(t)
        t, continuous = go("async")
        times["async"].append(t)
        assert key(continuous) == key(barrier)
    b, a = statistics.median(times["barrier"]), statistics.median(times["async"])
    report(
        benchmark,
        "math/h0 on the fake vLLM",
        episodes=n,
        token_latency_s=latency,
        barrier_s=b,
        async_s=a,
        barrier_over_async=b / a,
    )


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
    out = open(sys.stdout.fileno(), "w", encoding="utf-8", closefd=False)
    sys.stdout = sys.stderr
    shared = _Shared(out)
    first = _json.loads(sys.stdin.readline())
    cls = _load(first)
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
main = _threaded_main
"""


def threaded_worker_program() -> str:
    from tests.sandbox.test_harness_worker import changed_worker_program

    return changed_worker_program(_THREADED_MAIN)  # run in the worker module, before its main


@pytest.mark.benchmark(group="isolation")
@pytest.mark.parametrize(
    ("env_id", "harness"), [("whale/Math-v0", "math/h0"), ("whale/Chess-v0", "chess_puzzles/h0")]
)
def test_episode_isolation_cost(benchmark, fresh_model_dir, monkeypatch, env_id, harness):
    """Untrusted rollouts with a fresh process per episode vs the shared-process worker it replaced,
    side by side on the same episodes (target: at most 1.2x the time). The trajectories must be
    identical: isolation changes where the harness runs, not what it does."""
    import whale_train.rollout.workers as workers

    llm = TransformersLLM(fresh_model_dir)
    ref = load_harness(harness)
    n = 4 if benchmark.disabled else 64  # `make test` only checks that both run and agree
    ids = gym.make(env_id, split="test").unwrapped.task_ids[:n]
    forked = workers.worker_program

    def seconds(program) -> tuple[float, list]:
        monkeypatch.setattr(workers, "worker_program", program)
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
