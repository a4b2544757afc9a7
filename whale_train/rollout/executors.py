"""``run_rollouts`` and where harness code runs: in this process (shipped harnesses, when asked) or
in a worker process.

Both executors serve the same ``Episode`` operations and feed the same ``Batcher``; they differ only in
how the harness's handle calls reach the trusted side.

The worker executor keeps ``concurrency`` episodes in flight in one sandboxed worker, each episode in a
fresh process of its own forked by the worker's spawner, which relays no message (``harnesses.worker``),
so no state flows between episodes. A watchdog ends every episode whose harness computes for longer than
``limits.harness_seconds`` without an answered handle call, or whose whole wall time passes
``limits.episode_seconds``: that episode's process is killed and recorded as a timeout, the others go on
(a batch of looping episodes costs one timeout, not one per episode). The harness's clock runs from the
reply to its last answered call (or its start) to the moment its next message is read off the worker's
pipe, by a thread that does nothing else: a message waiting for the busy trusted side, a batch of the
model, an env step are not the harness's time, so a loaded machine does not turn honest episodes into
timeouts. A refused call is answered but does not restart the clock, and nothing restarts the hard
``episode_seconds``. Every message from the worker is checked (size, UTF-8, JSON, shape, a known episode
id); a worker that breaks the protocol or dies ends its in-flight episodes with the reason; after
``MAX_WORKER_RESTARTS`` deaths the remaining episodes are recorded as failed without running, so one bad
harness cannot stall an evaluation.
The worker's messages are read and answered by one thread; an env operation (a step can be a
sandboxed tool call or a retrieval) runs on a thread of its own, one at a time per episode, so one
episode's tool call never holds up another's (in process, every episode has its thread anyway).
"""

from __future__ import annotations

import itertools
import json
import queue
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

import whale_envs  # noqa: F401  (registers the envs)
from harnesses.base import ENV_METHODS, EnvProxy, HarnessCallError, LLMProxy
from harnesses.loader import HarnessRef
from whale_envs.sandbox import IsolationUnavailable
from whale_train.llm.base import LLM
from whale_train.rollout.batcher import Batcher
from whale_train.rollout.episode import Episode, EpisodeLimits
from whale_train.rollout.records import Trajectory, stable_seed
from whale_train.rollout.workers import Worker, keep_or_end, take_idle

MAX_WORKER_RESTARTS = 3
_ENV_OPS = frozenset(m.name for m in ENV_METHODS)
#: Envs outlive their rollout: an env is reset with its episode's seed and task before every episode,
#: and building one costs ~7 ms (its task split), which at concurrency 128 was a second of start-up
#: for every ``run_rollouts`` call of an RSFT step or a harness search. Per env id and kwargs.
_ENV_POOL: dict[str, list[gym.Env]] = {}
_POOL_LOCK = threading.Lock()
MAX_POOLED_ENVS = 1024
Job = tuple[str, int]  # (task id, sample index)


@dataclass(frozen=True)
class RolloutConfig:
    """How to roll out.

    Attributes:
        k: samples (episodes) per task.
        seed: the run seed; episode ``(task, sample)`` gets seed ``hash(seed, task, sample)``, and its
            i-th LLM request ``hash(episode seed, i)``.
        concurrency: episodes in flight at once (the largest batch the model sees).
        max_wait: seconds the batcher waits for stragglers before flushing a partial batch.
        limits: per-episode limits.
        trusted: run the harness in this process (only for harnesses shipped with the package).
        worker_memory_mb: address-space limit of the worker's template process (untrusted harnesses).
        episode_memory_mb: address-space limit of each episode's process; all of them together are
            bounded by ``episode_memory_mb * concurrency``.
        examples: the documented cross-episode memory: plain JSON values (few-shot examples built from
            the *train* split by the caller) that every episode's harness sees as ``self.examples``.
            Evaluation episodes never feed it.
    """

    k: int = 1
    seed: int = 0
    concurrency: int = 64
    max_wait: float = 0.05
    limits: EpisodeLimits = field(default_factory=EpisodeLimits)
    trusted: bool = False
    worker_memory_mb: int = 4096
    episode_memory_mb: int = 1024
    examples: tuple = ()


def run_rollouts(
    harness: Any,
    env_id: str,
    llm: LLM,
    task_ids: Sequence[str] | None = None,
    *,
    env_kwargs: dict[str, Any] | None = None,
    config: RolloutConfig | None = None,
    progress: Callable[[Trajectory], None] | None = None,
    env: gym.Env | None = None,
) -> list[Trajectory]:
    """Run ``harness`` on every task × ``config.k`` samples; return the trajectories in task order.

    ``harness`` is a ``harnesses.loader.HarnessRef`` (source + name, from ``load_harness``). ``task_ids``
    default to the env's split (``env_kwargs["split"]``, default ``test``). ``env``: an env the caller
    built with ``env_kwargs`` and already passed through :func:`preflight` with this config and harness
    (``whale eval`` does both before it loads the model): the episodes start from it, and neither is
    done again (the sandbox still refuses to run untrusted code without isolation).
    """
    config = config or RolloutConfig()
    env_kwargs = {"split": "test", **(env_kwargs or {})}
    # The env's entry point is part of the key: an id registered again for another class gets new envs
    # (``module:EnvId`` is registered by the first ``gym.make``, under ``EnvId``).
    entry = getattr(gym.envs.registry.get(env_id.rsplit(":", 1)[-1]), "entry_point", None)
    entry = entry if entry is None or isinstance(entry, str) else f"{entry.__module__}:{entry.__qualname__}"
    pool_key = f"{env_id}@{entry}" + json.dumps(env_kwargs, sort_keys=True, default=repr)

    def make_env() -> gym.Env:
        with _POOL_LOCK:
            envs = _ENV_POOL.get(pool_key)
            if envs:
                return envs.pop()
        return gym.make(env_id, **env_kwargs)

    def recycle(used: gym.Env) -> None:
        with _POOL_LOCK:
            envs = _ENV_POOL.setdefault(pool_key, [])
            if len(envs) < MAX_POOLED_ENVS:
                envs.append(used)

    probe = env if env is not None else make_env()
    if env is None:
        preflight(config, probe.unwrapped, harness)
    ids = list(task_ids) if task_ids is not None else list(probe.unwrapped.task_ids)
    jobs = [(task_id, s) for s in range(config.k) for task_id in ids]
    recycle(probe)

    trajs = run_episodes(harness, env_id, llm, jobs, make_env, recycle, config, progress)
    order = {(t, s): i for i, (t, s) in enumerate((t, s) for t in ids for s in range(config.k))}
    return sorted(trajs, key=lambda tr: order[(tr.task_id, tr.sample)])


def preflight(config: RolloutConfig, env: Any, harness: Any = None) -> str:
    """Refuse before any episode runs when untrusted code would run without isolation.

    Untrusted code: the harness (unless ``config.trusted``) and the model-written code of an env's
    sandboxed tool (``env.uses_sandbox``). Returns the isolation label of the run (``"namespaces"``,
    the opt-in label, or ``"in-process"`` when nothing untrusted runs); raises
    ``whale_envs.sandbox.IsolationUnavailable`` with the cause and the opt-in.
    """
    from whale_envs.sandbox import UNISOLATED_LABEL, require_isolation

    labels = []
    if not config.trusted:
        name = getattr(harness, "name", "the harness")
        labels.append(require_isolation(f"the untrusted harness {name}", site_packages=False))
    if getattr(env, "uses_sandbox", False):
        labels.append(require_isolation("model-written tool code", site_packages=True))
    if UNISOLATED_LABEL in labels:
        return UNISOLATED_LABEL
    return "namespaces" if labels else "in-process"


def run_episodes(
    harness: HarnessRef,
    env_id: str,
    llm: LLM,
    jobs: list[Job],
    make_env: Callable[[], gym.Env],
    recycle: Callable[[gym.Env], None],
    config: RolloutConfig,
    progress: Callable[[Trajectory], None] | None = None,
) -> list[Trajectory]:
    batcher = Batcher(llm, config.max_wait)
    lock = threading.Lock()

    def new_episode(task_id: str, sample: int) -> Episode:
        with lock:
            env = make_env()
        seed = stable_seed(config.seed, task_id, sample)
        return Episode(env, env_id, task_id, sample, seed, batcher, harness.name, config.limits)

    def close_episode(ep: Episode, error: str | None, record: bool = True) -> Trajectory:
        """Finish the episode and return its env to the pool; ``record=False`` discards a rerun one."""
        traj = ep.finish(error)
        with lock:
            recycle(ep.env)
        if record and progress is not None:
            progress(traj)
        return traj

    try:
        if config.trusted:
            return _run_in_process(harness, llm, jobs, new_episode, close_episode, batcher, config)
        return _WorkerRun(harness, llm, jobs, new_episode, close_episode, batcher, config).run()
    finally:
        batcher.close()


# ------------------------------------------------------------------------------------- in process


def _caller(ep: Episode) -> Callable[[str, dict[str, Any]], Any]:
    """The handles' ``call``: serve it on the trusted side and wait for the reply."""
    return lambda method, args: ep.call(method, args).result()


def _run_in_process(harness, llm, jobs, new_episode, close_episode, batcher, config) -> list[Trajectory]:
    cls = harness.load_trusted()
    if config.examples:
        cls = type(cls.__name__, (cls,), {"examples": tuple(config.examples)})
    chat = bool(llm.has_chat_template)

    def play(ep: Episode) -> Trajectory:
        error = None
        ep.start()  # built ahead of its turn: its clock starts when it is played
        try:
            call = _caller(ep)
            cls().run(EnvProxy(call), LLMProxy(call, chat))
        except Exception:  # one episode never breaks the evaluation
            error = "harness_error: " + traceback.format_exc(limit=8)[-4000:]
        return close_episode(ep, error)

    # ``concurrency`` threads, each playing episodes one after another. The first episodes are built
    # and entered before any thread starts, and a thread enters its next episode before it leaves
    # the last one, so the batcher never sees a slot as free while it is only between episodes (the
    # first batch would otherwise flush with the few episodes whose thread happened to start first).
    results: list[Trajectory | None] = [None] * len(jobs)
    todo = iter(range(len(jobs)))
    take = threading.Lock()
    first = [(i, new_episode(*jobs[i])) for i in itertools.islice(todo, max(1, config.concurrency))]
    for _, ep in first:
        batcher.enter(ep)

    failed: list[BaseException] = []

    def slot(i: int, ep: Episode) -> None:
        try:
            while True:
                results[i] = play(ep)
                with take:
                    i = next(todo, -1)
                if i < 0:
                    return
                prev, ep = ep, new_episode(*jobs[i])
                batcher.enter(ep)
                batcher.leave(prev)
        except BaseException as exc:  # the engine's own failure (not a harness's): raised below
            failed.append(exc)
        finally:
            batcher.leave(ep)

    threads = [threading.Thread(target=slot, args=job, name="episode", daemon=True) for job in first]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise failed[0]
    return results  # type: ignore[return-value]


# ------------------------------------------------------------------------------------- worker


class _WorkerRun:
    def __init__(self, harness, llm, jobs, new_episode, close_episode, batcher, config: RolloutConfig):
        self.harness = harness
        self.llm = llm
        self.todo: deque[Job] = deque(jobs)
        self.new_episode = new_episode
        self.close_episode = close_episode
        self.batcher = batcher
        self.config = config
        self.inbox: queue.Queue = queue.Queue()
        self.in_flight: dict[int, Episode] = {}
        self.results: list[Trajectory] = []
        self.restarts = 0
        self.worker: Worker | None = None
        # Env operations of the episodes, off the thread that reads the worker; the lock of an episode
        # keeps its operations (and its end) one at a time, whatever its harness sends.
        self.env_threads = ThreadPoolExecutor(
            max_workers=max(1, config.concurrency), thread_name_prefix="env"
        )
        self.locks: dict[Episode, threading.Lock] = {}

    def run(self) -> list[Trajectory]:
        try:
            while self.todo or self.in_flight:
                if self.worker is None and not self._start_worker():
                    break
                self._fill()
                try:
                    worker, msg = self.inbox.get(timeout=0.2)
                except queue.Empty:
                    self._watchdog()
                    continue
                if worker is self.worker:
                    self._handle(msg)
                self._watchdog()
        finally:
            self.env_threads.shutdown(wait=True)
            if self.worker is not None:
                keep_or_end(self.worker, busy=bool(self.in_flight))
        return self.results

    def _end(self, ep: Episode, error: str | None) -> None:
        """Record the end of ``ep`` (already out of ``in_flight``), after its env operation if one runs."""
        self.batcher.leave(ep)
        with self.locks.pop(ep, None) or threading.Lock():
            self.results.append(self.close_episode(ep, error))

    # ------------------------------------------------------------ worker life

    def _start_worker(self) -> bool:
        chat = bool(self.llm.has_chat_template)
        reused = take_idle(Worker.settings(self.harness, chat, self.config))
        if reused is not None:  # loaded and ready already
            reused.inbox, self.worker = self.inbox, reused
            return True
        try:
            self.worker = Worker(self.harness, chat, self.config, self.inbox)
        except IsolationUnavailable:
            raise  # not the harness's fault: the run stops with the cause and the opt-in
        except RuntimeError as exc:
            self._fail_remaining(f"harness_error: the sandboxed worker cannot start: {exc}")
            return False
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                worker, msg = self.inbox.get(timeout=1)
            except queue.Empty:
                continue
            if worker is not self.worker:
                continue
            if msg.get("op") == "ready":
                return True
            reason = msg.get("error") or f"the worker exited while loading: {worker.stderr_tail()}"
            self._fail_remaining(f"harness_error: could not load the harness: {reason}")
            return False
        self._fail_remaining("harness_error: the worker did not start within 60 s")
        return False

    def _fail_remaining(self, error: str) -> None:
        ended = list(self.in_flight.values())
        self.in_flight.clear()
        for ep in ended:
            self._end(ep, error)
        while self.todo:
            ep = self.new_episode(*self.todo.popleft())
            self.results.append(self.close_episode(ep, error))
        if self.worker is not None:
            self.worker.kill()
            self.worker = None

    # ------------------------------------------------------------ episodes

    def _fill(self) -> None:
        assert self.worker is not None
        while self.todo and len(self.in_flight) < self.config.concurrency:
            ep = self.new_episode(*self.todo.popleft())
            eid = next(self.worker.ids)
            self.in_flight[eid] = ep
            self.locks[ep] = threading.Lock()
            self.batcher.enter(ep)
            ep.start()  # its clocks start with its process, not when it was queued
            self.worker.send({"op": "start", "episode": eid})

    def _handle(self, msg: dict) -> None:
        op = msg.get("op")
        if op == "exit":
            self._worker_died()
            return
        if op == "protocol":
            self._worker_died(f"the worker broke the protocol: {msg.get('error')}")
            return
        eid = msg.get("episode")
        ep = self.in_flight.get(eid) if isinstance(eid, int) and not isinstance(eid, bool) else None
        arrived = self.worker.arrived.pop(eid, None) if self.worker is not None else None
        if ep is None:
            return  # a late message of an episode already ended (killed, timed out)
        arrived = arrived or time.monotonic()
        why = ep.overdue(arrived, arrived)  # decided by when it arrived, not when the trusted side got to it
        if why and op in ("done", "call"):
            del self.in_flight[eid]
            self.worker.send({"op": "kill", "episode": eid})
            self._end(ep, why)
            return
        if op == "done":
            del self.in_flight[eid]
            error = msg.get("error")
            error = error if isinstance(error, str) or error is None else repr(error)[:4000]
            self._end(ep, f"harness_error: {error}" if error else None)
        elif op == "call":
            ep.call_arrived(arrived)
            args = msg.get("args")
            if not isinstance(args, dict) or not isinstance(msg.get("method"), str):
                self._reply(ep, eid, None, "a call needs a method name and an object of arguments")
                return
            if msg["method"] in _ENV_OPS:  # may take a while (a tool call): not on this thread
                self.env_threads.submit(self._serve, ep, eid, msg["method"], args, self.worker)
            else:  # a model call only queues its requests: answered when the batcher is done
                self._serve(ep, eid, msg["method"], args, self.worker)

    def _serve(self, ep: Episode, eid: int, method: str, args: dict, worker: Worker | None) -> None:
        with self.locks.get(ep) or threading.Lock():
            if self.in_flight.get(eid) is not ep:
                return  # the episode ended meanwhile (killed, its worker died)
            try:
                future = ep.call(method, args)
            except HarnessCallError as exc:
                self._reply(ep, eid, None, str(exc), worker)
                return
            except Exception as exc:  # a malformed call: the harness sees it, the run goes on
                self._reply(ep, eid, None, f"{type(exc).__name__}: {exc}", worker)
                return
        future.add_done_callback(lambda f: self._reply_future(ep, eid, f, worker))

    def _reply_future(self, ep: Episode, eid: int, future: Future, worker: Worker | None) -> None:
        exc = future.exception()
        value = None if exc else future.result()
        self._reply(ep, eid, value, str(exc) if exc else None, worker, served=True)

    def _reply(
        self,
        ep: Episode,
        eid: int,
        value: Any,
        error: str | None,
        worker: Worker | None = None,
        served: bool = False,
    ) -> None:
        """Answer a call; ``served``: it was accepted (its harness's next turn starts), else refused."""
        worker = worker or self.worker
        ep.call_answered(time.monotonic(), served)  # before it goes: the next call may come at once
        if worker is not None:
            msg = {"op": "reply", "episode": eid, "ok": error is None}
            msg.update({"error": error} if error else {"value": value})
            worker.send(msg)

    def _watchdog(self) -> None:
        """End every episode past a limit at once (each in its own process: the others go on)."""
        now = time.monotonic()
        arrived = self.worker.arrived if self.worker is not None else {}
        for eid, ep in list(self.in_flight.items()):
            why = ep.overdue(now, arrived.get(eid))
            if why:
                del self.in_flight[eid]
                if self.worker is not None:
                    self.worker.send({"op": "kill", "episode": eid})
                self._end(ep, why)

    def _worker_died(self, reason: str | None = None) -> None:
        assert self.worker is not None
        code = self.worker.proc.poll()
        if code is None and reason is None:
            time.sleep(0.1)
            code = self.worker.proc.poll()
        tail = self.worker.stderr_tail(600)
        hint = " (memory limit?)" if "MemoryError" in tail or code in (-9, 137) else ""
        if reason:
            error = f"harness_error: {reason}"
        else:
            error = (
                f"harness_error: the worker process died (exit status {code}){hint}: {tail.strip()[-400:]}"
            )
        ended = list(self.in_flight.values())
        self.in_flight.clear()
        for ep in ended:
            self._end(ep, error)
        self.worker.kill()
        self.worker = None
        self.restarts += 1
        if self.restarts > MAX_WORKER_RESTARTS:
            self._fail_remaining(
                f"{error} [the worker died {self.restarts} times: remaining episodes not run]"
            )
