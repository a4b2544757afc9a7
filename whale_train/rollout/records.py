"""The record of an episode: ``LLMCall``/``EnvStep``/``Trajectory``, its JSON lines, and the seeds."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from whale_train.files import atomic_write_text
from whale_train.llm.base import Completion


@dataclass
class LLMCall:
    """One model call of an episode. ``kind``: ``sample`` (generated: the only kind RSFT trains on),
    ``choice`` (an option picked by likelihood; ``completion`` is the option, for reading, and
    ``completion_ids`` is None: the harness wrote it, the model sampled nothing) or ``score``
    (likelihoods only)."""

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

    @classmethod
    def of(
        cls, kind: str, prompt: Any, completion: Completion, seed: int | None, params: dict[str, Any]
    ) -> LLMCall:
        """The record of a generated (or chosen) ``completion``: the fields it shares with
        ``Completion`` (prompt text and ids, tokens, finish reason, logprob) copied from it."""
        ours = {f.name for f in fields(cls)}
        shared = {f.name: getattr(completion, f.name) for f in fields(completion) if f.name in ours}
        return cls(kind=kind, prompt=prompt, completion=completion.text, seed=seed, params=params, **shared)


@dataclass
class EnvStep:
    """One ``env.step`` of an episode, as the trusted side saw it."""

    action: str  #: what the harness sent
    observation: str  #: what came back (the env's error message above it, for a refused action)
    reward: float
    terminated: bool
    truncated: bool
    #: the env's message for a refused action (``info["error"]``): it cost a turn, nothing else
    error: str | None = None
    #: its kind for statistics (``info["error_kind"]``): ``malformed``, ``illegal``, ``budget``, or a
    #: domain's own (``whale_envs.text_env.ActionError``)
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


def stable_seed(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:8], "big") >> 1


def jsonable(value: Any) -> Any:
    """A JSON-safe copy (numpy scalars, tuples, sets become plain types)."""
    return json.loads(json.dumps(value, default=lambda o: o.item() if hasattr(o, "item") else str(o)))


def write_jsonl(trajs: Iterable[Trajectory], path: str | Path) -> Path:
    """One JSON line per trajectory, written atomically (``whale_train.files``)."""
    return atomic_write_text(path, "".join(json.dumps(t.to_dict(), ensure_ascii=False) + "\n" for t in trajs))


def read_jsonl(path: str | Path) -> list[Trajectory]:
    with open(path, encoding="utf-8") as fh:
        return [Trajectory.from_dict(json.loads(line)) for line in fh if line.strip()]
