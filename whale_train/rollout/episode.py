"""The trusted side of one episode: its env, its record, its limits, and the handle operations.

The harness drives the env and the model through two handles (see ``harnesses.base``); every handle
call, wherever the harness runs, arrives here as ``Episode.call(method, args)``.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from harnesses.base import HANDLE_METHODS, HarnessCallError
from whale_envs.splits import opaque_id
from whale_train.config_io import option
from whale_train.files import replace_lone_surrogates
from whale_train.llm.base import MAX_STOP_STRINGS, Completion, Request, SamplingParams, ScoreUnsupported
from whale_train.rollout.batcher import Batcher
from whale_train.rollout.metrics import categorize
from whale_train.rollout.records import EnvStep, LLMCall, Trajectory, jsonable, stable_seed


@dataclass(frozen=True)
class EpisodeLimits:
    """Per-episode bounds, enforced on the trusted side for each episode separately."""

    max_llm_calls: int = option(64, "model requests per episode (a vote of 8 is 8; a choose/score is 1)")
    max_tokens: int = option(512, "new tokens of any single request, at most")
    harness_seconds: float = option(
        30.0,
        "the harness's own time between two answered handle calls, in seconds (from the episode's start or "
        "the reply to its last answered call to the arrival of its next call: waiting for the model, the "
        "env or the trusted side does not count, a refused call does not restart it; the CLI's "
        "--episode-timeout)",
    )
    episode_seconds: float = option(
        3600.0,
        "a hard limit on the whole episode's wall-clock time from its start, waiting for the model "
        "included; nothing the episode does restarts it (a backstop: keep it far above an honest episode)",
    )
    max_request_chars: int = option(
        1_048_576,
        "characters of the prompts of one complete/sample/complete_many call (a prompt sampled n times "
        "counts n times); a larger call is refused",
    )
    max_prompt_chars: int = option(
        32_768,
        "a score/choose prompt longer than this keeps its end (as complete keeps the last tokens that fit)",
    )
    max_options: int = option(256, "options of one score/choose call, at most")
    max_scored_chars: int = option(65_536, "characters of options of one score/choose call, at most")
    max_action_chars: int = option(65_536, "a longer action is refused")

    def __post_init__(self):
        for name in (
            "max_llm_calls",
            "max_tokens",
            "max_prompt_chars",
            "max_options",
            "max_scored_chars",
            "max_action_chars",
            "max_request_chars",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("harness_seconds", "episode_seconds"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < float("inf"):
                raise ValueError(f"{name} (an episode time limit) must be a positive number, got {value!r}")


_PARAM_KEYS = {"temperature", "top_p", "max_tokens", "stop"}


def harness_view(info: dict[str, Any]) -> dict[str, Any]:
    """What a harness is shown of an env's ``info``: the one place the rule "what is measured stays
    unseen" (docs/HARNESSES.md) is applied to it. The task's id is replaced by its opaque name under the
    split key (stable within a run, unrelated to the id, so no function of it tells the task's split);
    everything else the env chose to show passes as JSON. Every handle call of every harness, trusted or
    sandboxed, gets its ``info`` through here; ``tests/sandbox/test_split_visibility.py`` checks, for every
    registered env, that the view of a task is the same whichever split the env was built on."""
    shown = jsonable(info)
    if "task_id" in shown:
        shown["task_id"] = opaque_id(str(info["task_id"]))
    return shown


class Episode:
    """The trusted side of one episode: its env, its record, and the handle operations.

    ``call(method, args)`` serves one handle call and returns a Future (already resolved for env
    operations). It raises ``HarnessCallError`` for a bad call, a size over its limit included, before
    anything is built for it.

    Its clocks (executors report ``start``, ``call_arrived`` and ``call_answered``; ``overdue`` judges):
    the harness's turn runs from the start or the reply to its last served call to the arrival of its
    next call, and a refused call does not end it; the whole episode's wall-clock time has a hard limit.
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
        self.batcher = batcher
        self.limits = limits
        self._reset_done = False
        self._ended = False
        self._n_requests = 0
        # The clocks (see ``start``, ``overdue``): the harness's own time in its current turn is
        # ``_turn_used`` plus, while none of its calls is being served, the time since ``_turn_mark``.
        self._clock = threading.Lock()
        self._serving = 0  # calls of this episode that arrived and are not answered yet
        self._turn_used = 0.0
        self.start()
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

    # -------------------------------------------------------------- the clocks

    def start(self, now: float | None = None) -> None:
        """The episode starts now (its process is started, or its thread plays it): both clocks start."""
        with self._clock:
            self._started = time.monotonic() if now is None else now
            self._turn_mark = self._started
            self._turn_used = 0.0

    def call_arrived(self, at: float) -> None:
        """A call of the harness arrived at ``at`` (stamped where it was read): its turn pauses."""
        with self._clock:
            if self._serving == 0:
                self._turn_used += max(0.0, at - self._turn_mark)
            self._serving += 1

    def call_answered(self, at: float, served: bool) -> None:
        """The reply to a call went out at ``at``. ``served``: the call was accepted (whatever its
        outcome), so the harness's next turn starts; a refused call does not restart its turn."""
        with self._clock:
            self._serving = max(0, self._serving - 1)
            if served:
                self._turn_used = 0.0
            if self._serving == 0:
                self._turn_mark = at

    def turn_seconds(self, now: float) -> float:
        """The harness's own time in its current turn, as of ``now``."""
        with self._clock:
            running = max(0.0, now - self._turn_mark) if self._serving == 0 else 0.0
            return self._turn_used + running

    def overdue(self, now: float, arrived: float | None = None) -> str | None:
        """Why this episode must end (a limit passed), or None. ``arrived``: when a call of the harness
        that is not served yet arrived; its turn ended then (the wait on the trusted side is not its).

        Two clocks, neither of which a call of the episode can restart other than by being answered:
        ``harness_seconds`` per turn of the harness (its own time between two answered calls) and
        ``episode_seconds`` for the whole episode's wall-clock time."""
        lim = self.limits
        if now - self._started > lim.episode_seconds:
            return (
                f"timeout: the episode ran for more than {lim.episode_seconds:g} s (the hard limit per "
                "episode, waiting for the model included)"
            )
        if self.turn_seconds(now if arrived is None else min(now, arrived)) > lim.harness_seconds:
            return (
                f"timeout: the harness computed for more than {lim.harness_seconds:g} s without an answered "
                "call to the env or the model"
            )
        return None

    # -------------------------------------------------------------- serving handle calls

    def call(self, method: str, args: dict[str, Any]) -> Future:
        spec = HANDLE_METHODS.get(method)
        if spec is None:
            raise HarnessCallError(f"unknown handle method {method!r}")
        allowed = set(spec.args) | ({"params"} if spec.params else set())
        if not set(spec.args) <= set(args) <= allowed:
            raise HarnessCallError(
                f"{method} takes the arguments {sorted(allowed)}, the call sent {sorted(args)}"
            )
        return getattr(self, f"_op_{method}")(**args)

    def _done(self, value: Any) -> Future:
        f: Future = Future()
        f.set_result(value)
        return f

    def _op_reset(self) -> Future:
        if self._reset_done:
            raise HarnessCallError("env.reset() may be called once per episode (the engine chose the task)")
        self._reset_done = True
        obs, info = self.env.reset(seed=self.traj.seed, options={"task_id": self.traj.task_id})
        self.traj.reset_observation = obs
        return self._done((obs, harness_view(info)))

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
        return self._done((obs, float(reward), bool(terminated), bool(truncated), harness_view(shown)))

    def _params(self, params: dict[str, Any]) -> SamplingParams:
        unknown = set(params) - _PARAM_KEYS
        if unknown:
            raise HarnessCallError(
                f"unknown sampling parameter(s) {sorted(unknown)}; allowed: {sorted(_PARAM_KEYS)}"
            )
        params = {k: v for k, v in params.items() if v is not None}
        if "stop" in params:
            stop = params["stop"]
            stop = [stop] if isinstance(stop, str) else stop
            if not isinstance(stop, list) or len(stop) > MAX_STOP_STRINGS:
                raise HarnessCallError(
                    f"stop must be a string or a list of at most {MAX_STOP_STRINGS} strings"
                )
            params["stop"] = tuple(stop)
        try:
            sp = SamplingParams(**params)
        except (TypeError, ValueError) as exc:
            raise HarnessCallError(f"bad sampling parameters: {exc}") from None
        if sp.max_tokens > self.limits.max_tokens:
            raise HarnessCallError(
                f"max_tokens {sp.max_tokens} is above this run's limit of {self.limits.max_tokens}"
            )
        return sp

    def _requests(self, prompts: list[Any], params: dict[str, Any], copies: int = 1) -> list[Request]:
        """The requests of one call: each of ``prompts`` ``copies`` times. Every size is checked before
        anything is built (the count against the calls left, the prompts' characters, the params)."""
        lim = self.limits
        if self._n_requests + len(prompts) * copies > lim.max_llm_calls:
            left = lim.max_llm_calls - self._n_requests
            raise HarnessCallError(
                f"LLM call limit reached ({lim.max_llm_calls} requests per episode; this call asks for "
                f"{len(prompts) * copies}, {left} left)"
            )
        chars = 0
        for prompt in prompts:
            _check_prompt(prompt)
            chars += _prompt_chars(prompt) * copies
        if chars > lim.max_request_chars:
            raise HarnessCallError(
                f"the prompts of this call hold {chars} characters (n samples count n times), over this "
                f"run's limit of {lim.max_request_chars} per call"
            )
        sp = self._params(params)
        reqs = []
        for prompt in prompts:
            for _ in range(copies):
                reqs.append(Request(prompt, sp, stable_seed(self.traj.seed, self._n_requests)))
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
                self.traj.calls.append(
                    LLMCall.of("sample", req.prompt, c, req.seed, _params_dict(req.params))
                )
            texts = [replace_lone_surrogates(c.text) for c in comps]  # a remote backend's text may hold any
            out.set_result(texts[0] if unwrap else texts)

        future.add_done_callback(record)
        return out

    def _op_complete(self, prompt: Any, params: dict[str, Any] | None = None) -> Future:
        reqs = self._requests([prompt], params or {})
        return self._sampled(reqs, self.batcher.submit_complete(reqs, owner=self), unwrap=True)

    def _op_sample(self, prompt: Any, n: int, params: dict[str, Any] | None = None) -> Future:
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise HarnessCallError(f"n must be a positive integer, got {n!r}")
        reqs = self._requests([prompt], params or {}, copies=n)  # n checked before n requests are built
        return self._sampled(reqs, self.batcher.submit_complete(reqs, owner=self), unwrap=False)

    def _op_complete_many(self, prompts: list[Any], params: dict[str, Any] | None = None) -> Future:
        if not isinstance(prompts, list) or not prompts:
            raise HarnessCallError("complete_many needs a non-empty list of prompts")
        reqs = self._requests(prompts, params or {})
        return self._sampled(reqs, self.batcher.submit_complete(reqs, owner=self), unwrap=False)

    def _scored(self, prompt: Any, options: list[str], choose: bool) -> Future:
        _check_prompt(prompt)
        lim = self.limits
        if not isinstance(options, list) or not options:
            raise HarnessCallError("options must be a non-empty list of non-empty strings")
        if len(options) > lim.max_options:
            raise HarnessCallError(
                f"{len(options)} options is over this run's limit of {lim.max_options} per call"
            )
        if not all(isinstance(o, str) and o for o in options):
            raise HarnessCallError("options must be a non-empty list of non-empty strings")
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
            # A scoring call, never training data: the model sampled nothing (the options are the
            # harness's text). A choice keeps the option it picked as text, for reading, with no ids.
            c = comps[0]
            self.traj.calls.append(
                LLMCall(
                    "choice" if choose else "score",
                    prompt,
                    c.prompt_text,
                    options[best] if choose else "",
                    c.prompt_ids,
                    None,
                    "stop",
                    c.prompt_tokens,
                    sum(x.completion_tokens for x in comps),
                    params={"options": len(options)},
                    logprob=scores[best] if choose else None,
                )
            )
            out.set_result(best if choose else scores)

        self.batcher.submit_score(prompt, options, owner=self).add_done_callback(record)
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


def _prompt_chars(prompt: Any) -> int:
    return len(prompt) if isinstance(prompt, str) else sum(len(m["content"]) for m in prompt)


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
