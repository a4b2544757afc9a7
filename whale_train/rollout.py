"""The rollout engine: harness × tasks × k samples, many episodes in flight, their LLM calls batched.

One episode = one harness object driving one env through two handles (see ``harnesses.base``). The
env, the model and the record of everything that happens (the ``Trajectory``) live here, in the
trusted process. The harness runs either in this process (harnesses shipped with the package, when
asked) or in a worker process (everything else; see ``whale_train.executors``).

Batching: every LLM request of every in-flight episode goes to one ``Batcher``. It flushes when every
in-flight episode is waiting on the model (or after ``max_wait`` seconds), so the backend sees
batches as large as the number of episodes in flight.

Error policy: one episode never breaks an evaluation. A harness exception, a timeout or a limit hit
ends that episode with the env's reward so far (0 unless solved) and the reason recorded.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym

import whale_envs  # noqa: F401  (registers the envs)
from harnesses.base import HarnessCallError
from whale_train.llm.base import LLM, Completion, Request, SamplingParams, ScoreUnsupported

# ------------------------------------------------------------------------------------- records


@dataclass
class LLMCall:
    """One model call of an episode. ``kind``: ``sample`` (generated), ``choice`` (an option picked by
    likelihood; ``completion`` is the option), or ``score`` (likelihoods only, nothing to train on)."""

    kind: str
    prompt: Any
    prompt_text: str
    completion: str
    prompt_ids: list[int] | None
    completion_ids: list[int] | None
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    seed: int | None = None
    params: dict[str, Any] | None = None
    logprob: float | None = None


@dataclass
class EnvStep:
    action: str
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    error: str | None = None
    error_kind: str | None = None


@dataclass
class Trajectory:
    """Everything one episode did. ``failure`` is empty when solved, else a category (see ``categorize``)."""

    task_id: str
    sample: int
    seed: int
    harness: str
    env_id: str
    model_version: int
    difficulty: Any = None
    reward: float = 0.0
    solved: bool = False
    reset_observation: str = ""
    steps: list[EnvStep] = field(default_factory=list)
    calls: list[LLMCall] = field(default_factory=list)
    error: str | None = None
    failure: str = ""
    final_info: dict[str, Any] = field(default_factory=dict)
    wall_seconds: float = 0.0

    @property
    def prompt_tokens(self) -> int:
        return sum(c.prompt_tokens for c in self.calls)

    @property
    def completion_tokens(self) -> int:
        return sum(c.completion_tokens for c in self.calls)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        d = dict(d)
        d["steps"] = [EnvStep(**s) for s in d.get("steps", [])]
        d["calls"] = [LLMCall(**c) for c in d.get("calls", [])]
        return cls(**d)


FAILURES = (
    "parse_error",
    "illegal_action",
    "wrong_answer",
    "tool_error",
    "out_of_turns",
    "timeout",
    "harness_error",
    "model_error",
    "incomplete",
)


def categorize(traj: Trajectory) -> str:
    """The failure category of an unsolved episode ('' when solved).

    model_error (a model call failed: the backend raised; whatever the harness did next) /
    timeout / harness_error (the harness raised or hit a limit) / wrong_answer (the env ended the
    episode with reward 0) / parse_error, illegal_action, tool_error (the episode ran out of turns,
    and the last env error was of that kind) / out_of_turns / incomplete (the harness returned early).
    """
    if traj.solved:
        return ""
    if traj.error and traj.error.startswith("model_error"):
        return "model_error"
    if traj.error and traj.error.startswith("timeout"):
        return "timeout"
    if traj.error:
        return "harness_error"
    if not traj.steps:
        return "incomplete"
    last = traj.steps[-1]
    if last.terminated:
        return "wrong_answer"
    kinds = [s.error_kind for s in traj.steps if s.error_kind]
    if last.truncated or kinds:
        kind = kinds[-1] if kinds else None
        return {"malformed": "parse_error", "illegal": "illegal_action", "tool": "tool_error"}.get(
            kind, "out_of_turns"
        )
    return "incomplete"


def stable_seed(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:8], "big") >> 1


def jsonable(value: Any) -> Any:
    """A JSON-safe copy (numpy scalars, tuples, sets become plain types)."""
    return json.loads(json.dumps(value, default=lambda o: o.item() if hasattr(o, "item") else str(o)))


# ------------------------------------------------------------------------------------- batcher


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


# ------------------------------------------------------------------------------------- episode


@dataclass(frozen=True)
class EpisodeLimits:
    """Per-episode bounds, enforced on the trusted side for each episode separately.

    ``max_llm_calls`` counts requests (a vote of 8 is 8; a ``choose``/``score`` is 1); ``max_tokens``
    caps the new tokens of any single request; ``harness_seconds`` bounds the harness's own compute
    between two handle calls (time spent waiting for the model or the env does not count; the CLI's
    ``--episode-timeout``). ``score``/``choose``: a prompt longer than ``max_prompt_chars`` keeps its
    end (as ``complete`` keeps the last tokens that fit), at most ``max_options`` options and
    ``max_scored_chars`` characters of options per call. An action longer than ``max_action_chars``
    is refused."""

    max_llm_calls: int = 64
    max_tokens: int = 512
    harness_seconds: float = 30.0
    max_prompt_chars: int = 32_768
    max_options: int = 256
    max_scored_chars: int = 65_536
    max_action_chars: int = 65_536

    def __post_init__(self):
        for name in (
            "max_llm_calls",
            "max_tokens",
            "max_prompt_chars",
            "max_options",
            "max_scored_chars",
            "max_action_chars",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.harness_seconds, (int, float)) or self.harness_seconds <= 0:
            raise ValueError(
                f"harness_seconds (the episode timeout) must be positive, got {self.harness_seconds!r}"
            )


_PARAM_KEYS = {"temperature", "top_p", "max_tokens", "stop"}


class Episode:
    """The trusted side of one episode: its env, its record, and the handle operations.

    ``call(method, args)`` serves one handle call and returns a Future (already resolved for env
    operations). It raises ``HarnessCallError`` for a bad call.
    """

    def __init__(
        self,
        env: gym.Env,
        env_id: str,
        task_id: str,
        sample: int,
        seed: int,
        batcher: Batcher,
        harness_name: str,
        limits: EpisodeLimits,
    ):
        self.env = env
        self.task_id = task_id
        self.seed = seed
        self.batcher = batcher
        self.limits = limits
        self._reset_done = False
        self._ended = False
        self._n_requests = 0
        self._started = time.monotonic()
        self.last_activity = self._started
        self.busy_in_harness = True  # False while a handle call is being served
        self.model_error: str | None = None  # the first failed model call: the episode is a model error
        task = env.unwrapped.source.get(task_id)
        self.traj = Trajectory(
            task_id=task_id,
            sample=sample,
            seed=seed,
            harness=harness_name,
            env_id=env_id,
            model_version=getattr(batcher.llm, "version", 0),
            difficulty=jsonable(task.meta.get("difficulty")),
        )

    # -------------------------------------------------------------- serving handle calls

    def call(self, method: str, args: dict[str, Any]) -> Future:
        handler = getattr(self, f"_op_{method}", None)
        if handler is None:
            raise HarnessCallError(f"unknown handle method {method!r}")
        return handler(**args)

    def _done(self, value: Any) -> Future:
        f: Future = Future()
        f.set_result(value)
        return f

    def _op_reset(self) -> Future:
        if self._reset_done:
            raise HarnessCallError("env.reset() may be called once per episode (the engine chose the task)")
        self._reset_done = True
        obs, info = self.env.reset(seed=self.seed, options={"task_id": self.task_id})
        self.traj.reset_observation = obs
        return self._done((obs, jsonable(info)))

    def overdue(self, now: float) -> str | None:
        """Why this episode must end now (its harness computed too long), or None."""
        limit = self.limits.harness_seconds
        if self.busy_in_harness and now - self.last_activity > limit:
            return f"timeout: the harness computed for more than {limit:g} s without calling the env or the model"
        return None

    def _op_step(self, action: Any) -> Future:
        if not self._reset_done:
            raise HarnessCallError("call env.reset() before env.step()")
        if self._ended:
            raise HarnessCallError("the episode has ended: no more env.step() calls")
        if not isinstance(action, str):
            action = str(action)
        if len(action) > self.limits.max_action_chars:
            raise HarnessCallError(
                f"an action of {len(action)} characters is over this run's limit of {self.limits.max_action_chars}"
            )
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.traj.steps.append(
            EnvStep(
                action,
                obs,
                float(reward),
                bool(terminated),
                bool(truncated),
                info.get("error"),
                info.get("error_kind"),
            )
        )
        self.traj.reward += float(reward)
        shown = info
        if terminated or truncated:
            self._ended = True
            self.traj.final_info = jsonable(
                {k: v for k, v in info.items() if k not in ("legal_moves_uci", "legal_moves_san")}
            )
            # The end-of-episode record (the gold answer, the solution line) is the trusted side's: the
            # harness learns whether it solved the task, never the answer it could replay in another episode.
            final = getattr(self.env.unwrapped, "_final_info", None)
            withheld = set(final()) - {"solved"} if callable(final) else set()
            shown = {k: v for k, v in info.items() if k not in withheld}
        return self._done((obs, float(reward), bool(terminated), bool(truncated), jsonable(shown)))

    def _params(self, params: dict[str, Any]) -> SamplingParams:
        unknown = set(params) - _PARAM_KEYS
        if unknown:
            raise HarnessCallError(
                f"unknown sampling parameter(s) {sorted(unknown)}; allowed: {sorted(_PARAM_KEYS)}"
            )
        params = {k: v for k, v in params.items() if v is not None}
        if "stop" in params:
            stop = params["stop"]
            params["stop"] = tuple([stop] if isinstance(stop, str) else stop)
        try:
            sp = SamplingParams(**params)
        except (TypeError, ValueError) as exc:
            raise HarnessCallError(f"bad sampling parameters: {exc}") from None
        if sp.max_tokens > self.limits.max_tokens:
            raise HarnessCallError(
                f"max_tokens {sp.max_tokens} is above this run's limit of {self.limits.max_tokens}"
            )
        return sp

    def _requests(self, prompts: list[Any], params: dict[str, Any]) -> list[Request]:
        sp = self._params(params)
        if self._n_requests + len(prompts) > self.limits.max_llm_calls:
            raise HarnessCallError(
                f"LLM call limit reached ({self.limits.max_llm_calls} requests per episode)"
            )
        reqs = []
        for prompt in prompts:
            _check_prompt(prompt)
            reqs.append(Request(prompt, sp, stable_seed(self.seed, self._n_requests)))
            self._n_requests += 1
        return reqs

    def _sampled(self, reqs: list[Request], future: Future, unwrap: bool) -> Future:
        out: Future = Future()

        def record(f: Future) -> None:
            try:
                comps: list[Completion] = f.result()
            except Exception as exc:
                self.model_error = self.model_error or f"{type(exc).__name__}: {exc}"
                out.set_exception(HarnessCallError(f"the model failed: {exc}"))
                return
            for req, c in zip(reqs, comps, strict=True):
                self.traj.calls.append(_call("sample", req.prompt, c, req.seed, _params_dict(req.params)))
            texts = [c.text for c in comps]
            out.set_result(texts[0] if unwrap else texts)

        future.add_done_callback(record)
        return out

    def _op_complete(self, prompt: Any, params: dict[str, Any] | None = None) -> Future:
        reqs = self._requests([prompt], params or {})
        return self._sampled(reqs, self.batcher.submit_complete(reqs), unwrap=True)

    def _op_sample(self, prompt: Any, n: int, params: dict[str, Any] | None = None) -> Future:
        if not isinstance(n, int) or n < 1:
            raise HarnessCallError(f"n must be a positive integer, got {n!r}")
        reqs = self._requests([prompt] * n, params or {})
        return self._sampled(reqs, self.batcher.submit_complete(reqs), unwrap=False)

    def _op_complete_many(self, prompts: list[Any], params: dict[str, Any] | None = None) -> Future:
        if not isinstance(prompts, list) or not prompts:
            raise HarnessCallError("complete_many needs a non-empty list of prompts")
        reqs = self._requests(prompts, params or {})
        return self._sampled(reqs, self.batcher.submit_complete(reqs), unwrap=False)

    def _scored(self, prompt: Any, options: list[str], choose: bool) -> Future:
        _check_prompt(prompt)
        if not isinstance(options, list) or not options or not all(isinstance(o, str) and o for o in options):
            raise HarnessCallError("options must be a non-empty list of non-empty strings")
        lim = self.limits
        if len(options) > lim.max_options:
            raise HarnessCallError(
                f"{len(options)} options is over this run's limit of {lim.max_options} per call"
            )
        if sum(map(len, options)) > lim.max_scored_chars:
            raise HarnessCallError(
                f"the options hold {sum(map(len, options))} characters, over this run's limit of "
                f"{lim.max_scored_chars} per call"
            )
        prompt = _keep_end(prompt, lim.max_prompt_chars)
        if self._n_requests + 1 > self.limits.max_llm_calls:
            raise HarnessCallError(
                f"LLM call limit reached ({self.limits.max_llm_calls} requests per episode)"
            )
        self._n_requests += 1
        out: Future = Future()

        def record(f: Future) -> None:
            try:
                comps: list[Completion] = f.result()
            except ScoreUnsupported as exc:
                out.set_exception(HarnessCallError(str(exc)))
                return
            except Exception as exc:
                self.model_error = self.model_error or f"{type(exc).__name__}: {exc}"
                out.set_exception(HarnessCallError(f"the model failed: {exc}"))
                return
            scores = [float(c.logprob or 0.0) for c in comps]
            best = max(range(len(scores)), key=lambda i: scores[i])
            if choose:
                self.traj.calls.append(_call("choice", prompt, comps[best], None, {"options": len(options)}))
                out.set_result(best)
            else:
                c = comps[0]
                self.traj.calls.append(
                    LLMCall(
                        "score",
                        prompt,
                        c.prompt_text,
                        "",
                        c.prompt_ids,
                        None,
                        "stop",
                        c.prompt_tokens,
                        sum(x.completion_tokens for x in comps),
                    )
                )
                out.set_result(scores)

        self.batcher.submit_score(prompt, options).add_done_callback(record)
        return out

    def _op_choose(self, prompt: Any, options: list[str]) -> Future:
        return self._scored(prompt, options, choose=True)

    def _op_score(self, prompt: Any, continuations: list[str]) -> Future:
        return self._scored(prompt, continuations, choose=False)

    # -------------------------------------------------------------- the end

    def finish(self, error: str | None = None) -> Trajectory:
        t = self.traj
        t.wall_seconds = round(time.monotonic() - self._started, 4)
        t.error = error
        last = t.steps[-1] if t.steps else None
        t.solved = bool(last and last.terminated and t.final_info.get("solved", last.reward >= 1.0))
        if self.model_error and not t.solved:  # not the harness's fault, whatever it raised after
            t.error = f"model_error: {self.model_error}" + (f"\n(then {error})" if error else "")
        t.failure = categorize(t)
        return t


def _keep_end(prompt: Any, max_chars: int) -> Any:
    """``prompt`` cut to its last ``max_chars`` characters (chat: the earliest message text goes first)."""
    if isinstance(prompt, str):
        return prompt[-max_chars:] if len(prompt) > max_chars else prompt
    total = sum(len(m["content"]) for m in prompt)
    if total <= max_chars:
        return prompt
    out, excess = [], total - max_chars
    for m in prompt:
        cut = min(excess, len(m["content"]))
        excess -= cut
        out.append({**m, "content": m["content"][cut:]})
    return out


def _check_prompt(prompt: Any) -> None:
    if isinstance(prompt, str):
        return
    ok = (
        isinstance(prompt, list)
        and prompt
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in prompt
        )
    )
    if not ok:
        raise HarnessCallError(
            "a prompt is a string or a non-empty list of {'role': str, 'content': str} messages"
        )


def _params_dict(p: SamplingParams) -> dict[str, Any]:
    return {"temperature": p.temperature, "top_p": p.top_p, "max_tokens": p.max_tokens, "stop": list(p.stop)}


def _call(kind: str, prompt: Any, c: Completion, seed: int | None, params: dict[str, Any]) -> LLMCall:
    return LLMCall(
        kind=kind,
        prompt=prompt,
        prompt_text=c.prompt_text,
        completion=c.text,
        prompt_ids=c.prompt_ids,
        completion_ids=c.completion_ids,
        finish_reason=c.finish_reason,
        prompt_tokens=c.prompt_tokens,
        completion_tokens=c.completion_tokens,
        seed=seed,
        params=params,
        logprob=c.logprob,
    )


# ------------------------------------------------------------------------------------- running


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
) -> list[Trajectory]:
    """Run ``harness`` on every task × ``config.k`` samples; return the trajectories in task order.

    ``harness`` is a ``harnesses.loader.HarnessRef`` (source + name, from ``load_harness``). ``task_ids``
    default to the env's split (``env_kwargs["split"]``, default ``test``).
    """
    from whale_train.executors import run_episodes

    config = config or RolloutConfig()
    env_kwargs = {"split": "test", **(env_kwargs or {})}
    probe = gym.make(env_id, **env_kwargs)
    preflight(config, probe.unwrapped, harness)
    ids = list(task_ids) if task_ids is not None else list(probe.unwrapped.task_ids)
    jobs = [(task_id, s) for s in range(config.k) for task_id in ids]
    envs: list[gym.Env] = [probe]

    def make_env() -> gym.Env:
        return envs.pop() if envs else gym.make(env_id, **env_kwargs)

    def recycle(env: gym.Env) -> None:
        envs.append(env)

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


# ------------------------------------------------------------------------------------- metrics


def summarize(trajs: Sequence[Trajectory]) -> dict[str, Any]:
    """mean@k with its standard error over tasks, pass@k, per-difficulty breakdown, tokens, failures."""
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        by_task[t.task_id].append(t)
    per_task = {tid: sum(x.solved for x in ts) / len(ts) for tid, ts in by_task.items()}
    n = len(per_task)
    mean = sum(per_task.values()) / n if n else 0.0
    var = sum((v - mean) ** 2 for v in per_task.values()) / (n - 1) if n > 1 else 0.0
    ks = {len(ts) for ts in by_task.values()}
    by_diff: dict[str, list[float]] = defaultdict(list)
    for tid, ts in by_task.items():
        by_diff[str(ts[0].difficulty)].append(per_task[tid])
    failures = Counter(t.failure for t in trajs if t.failure)
    return {
        "tasks": n,
        "episodes": len(trajs),
        "k": max(ks) if ks else 0,
        "mean": mean,
        "se": math.sqrt(var / n) if n > 1 else 0.0,
        "pass_at_k": sum(any(x.solved for x in ts) for ts in by_task.values()) / n if n else 0.0,
        "by_difficulty": {d: {"tasks": len(v), "mean": sum(v) / len(v)} for d, v in sorted(by_diff.items())},
        "failures": dict(failures.most_common()),
        "llm_calls": sum(len(t.calls) for t in trajs),
        "prompt_tokens": sum(t.prompt_tokens for t in trajs),
        "completion_tokens": sum(t.completion_tokens for t in trajs),
        "per_task": per_task,
    }


def write_jsonl(trajs: Iterable[Trajectory], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for t in trajs:
            fh.write(json.dumps(t.to_dict(), ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path


def read_jsonl(path: str | Path) -> list[Trajectory]:
    with open(path, encoding="utf-8") as fh:
        return [Trajectory.from_dict(json.loads(line)) for line in fh if line.strip()]
