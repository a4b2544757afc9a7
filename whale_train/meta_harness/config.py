"""``MetaHarnessConfig``: every knob of the harness search, loadable from YAML or a dict."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

PROPOSERS = ("offline", "llm")


@dataclass
class MetaHarnessConfig:
    """How the harness search proposes, checks, scores and accepts candidates.

    Attributes:
        candidates: M, the candidates proposed per iteration (paper: 3).
        harness_tasks: tasks of the ``harness`` split every candidate is scored on (paper: 256). The same
            tasks (drawn once with ``seed``) serve the whole search, so comparisons are paired.
        rollouts_per_task: rollouts per task and candidate (paper: 1).
        seed: seeds the task draw, the rollouts (common random numbers across candidates) and the
            offline proposer. Candidate ids depend only on the iteration and the slot.
        proposer: ``offline`` (no LLM; composes mechanisms from a per-domain library) or ``llm`` (an
            OpenAI-compatible chat model reading the archive through file tools).
        prompt_only: the Fast-Slow Training baseline: candidates may differ from the seed harness only in
            string constants (prompt text); anything else is rejected by an AST comparison.
        accept_z: a candidate replaces the incumbent only when its paired mean gain over the incumbent,
            on the same tasks, exceeds ``accept_z`` standard errors of that gain (and ``accept_min_gain``).
        accept_min_gain: the smallest absolute gain in success rate that may be accepted.
        frontier_size: how many of the best candidates (success rate, then fewer LLM calls and tokens
            per episode) form the frontier at a model version.
        rescore_frontier: on a new model version, re-score the whole frontier of the previous version
            (True) or only the incumbent (False).
        check_tasks: ``train`` tasks of the ``check_harness`` smoke run with null models (not charged).
        concurrency: episodes in flight while scoring (the model's batch size).
        max_llm_calls: LLM requests allowed per episode (a runaway candidate ends there).
        max_tokens: the largest ``max_tokens`` one request of a candidate may ask for.
        harness_seconds: a candidate's own compute allowed between two handle calls.
        llm_base_url: the proposer's OpenAI-compatible endpoint (``.../v1``), for ``proposer: llm``.
        llm_model: the proposer model's name.
        llm_api_key_env: the environment variable holding its API key (may be unset for local servers).
        llm_max_turns: chat turns (tool calls included) per proposer conversation.
        llm_temperature: the proposer's sampling temperature.
        llm_timeout: seconds per proposer request.
        llm_price_prompt: USD per million prompt tokens, to record the proposer's cost.
        llm_price_completion: USD per million completion tokens.
    """

    candidates: int = 3
    harness_tasks: int = 256
    rollouts_per_task: int = 1
    seed: int = 0
    proposer: str = "offline"
    prompt_only: bool = False
    accept_z: float = 2.0
    accept_min_gain: float = 0.0
    frontier_size: int = 3
    rescore_frontier: bool = True
    check_tasks: int = 8
    concurrency: int = 64
    max_llm_calls: int = 64
    max_tokens: int = 512
    harness_seconds: float = 30.0
    llm_base_url: str | None = None
    llm_model: str | None = None
    llm_api_key_env: str = "OPENAI_API_KEY"
    llm_max_turns: int = 30
    llm_temperature: float = 0.7
    llm_timeout: float = 300.0
    llm_price_prompt: float = 0.0
    llm_price_completion: float = 0.0

    def validate(self) -> None:
        for name in (
            "candidates",
            "harness_tasks",
            "rollouts_per_task",
            "frontier_size",
            "check_tasks",
            "concurrency",
            "max_llm_calls",
            "max_tokens",
            "llm_max_turns",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"MetaHarnessConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.candidates > 10:
            raise ValueError(f"MetaHarnessConfig.candidates must be <= 10, got {self.candidates}")
        if self.proposer not in PROPOSERS:
            raise ValueError(f"unknown proposer {self.proposer!r}; known: {', '.join(PROPOSERS)}")
        if self.accept_z < 0 or self.accept_min_gain < 0:
            raise ValueError("accept_z and accept_min_gain must be >= 0")
        if self.proposer == "llm" and not (self.llm_base_url and self.llm_model):
            raise ValueError("proposer 'llm' needs llm_base_url and llm_model")

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> MetaHarnessConfig:
        data = dict(data or {})
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown search option(s) {unknown}; known: {sorted(names)}")
        config = cls(**data)
        config.validate()
        return config

    @classmethod
    def from_yaml(cls, path: str | Path) -> MetaHarnessConfig:
        """Read a YAML mapping of the fields above (a ``search:`` section of a larger file works too)."""
        data = yaml.safe_load(Path(path).read_text()) or {}
        if "search" in data and isinstance(data["search"], dict):
            data = data["search"]
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
