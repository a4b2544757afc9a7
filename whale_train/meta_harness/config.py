"""``MetaHarnessConfig``: every knob of the harness search, loadable from YAML or a dict."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from whale_train.config_io import Config, at_least, option

PROPOSERS = ("offline", "llm", "agent", "claude-code")


@dataclass
class MetaHarnessConfig(Config):
    """How the harness search proposes, checks, scores and accepts candidates (``whale search --config``,
    and ``search:`` of a train config)."""

    candidates: int = option(3, "M, the candidates proposed per iteration (paper: 3; at most 10)")
    harness_tasks: int = option(
        256,
        "tasks of the harness split every candidate is scored on (paper: 256); the same tasks (drawn once "
        "with seed) serve the whole search, so comparisons are paired",
    )
    rollouts_per_task: int = option(1, "rollouts per task and candidate (paper: 1)")
    seed: int | None = option(
        None,
        "seeds the task draw, the rollouts (common random numbers across candidates) and the offline "
        "proposer; unset: the run's seed under whale train, 0 for whale search",
    )
    proposer: str = option(
        "offline",
        "offline (no LLM; composes mechanisms from a per-domain library), llm (an OpenAI-compatible chat "
        "model reading the archive through file tools) or agent (a chat model on the OpenAI or Anthropic API "
        "that also runs shell commands in a jail and tries candidates on train tasks: Meta-Harness's "
        "coding-agent proposer), or claude-code (the real Claude Code CLI in the same jail, on the "
        "Anthropic API: make install-claude-code)",
    )
    prompt_only: bool = option(
        False,
        "the Fast-Slow Training baseline: candidates may differ from the seed harness only in string "
        "constants (prompt text); anything else is rejected by an AST comparison",
    )
    accept_z: float = option(
        2.0,
        "a candidate replaces the incumbent only when its paired mean gain over the incumbent, on the same "
        "tasks, exceeds accept_z standard errors of that gain (and accept_min_gain)",
    )
    accept_min_gain: float = option(0.0, "the smallest absolute gain in success rate that may be accepted")
    frontier_size: int = option(
        3,
        "how many of the best candidates (success rate, then fewer LLM calls and tokens per episode) form "
        "the frontier at a model version",
    )
    rescore_frontier: bool = option(
        True,
        "on a new model version, re-score the whole frontier of the previous version (true) or only the "
        "incumbent (false)",
    )
    check_tasks: int = option(8, "train tasks of the check_harness smoke run with null models (not charged)")
    concurrency: int = option(64, "episodes in flight while scoring (the model's batch size)")
    max_llm_calls: int = option(64, "LLM requests allowed per episode (a runaway candidate ends there)")
    max_tokens: int = option(512, "the largest max_tokens one request of a candidate may ask for")
    harness_seconds: float = option(30.0, "a candidate's own compute allowed between two handle calls")
    llm_base_url: str | None = option(
        None, "the proposer's OpenAI-compatible endpoint (.../v1), for proposer llm"
    )
    llm_model: str | None = option(None, "the proposer model's name")
    llm_api: str = option(
        "openai",
        "proposer agent: the wire format, openai (chat completions with tool calls: OpenAI, vLLM, most "
        "gateways) or anthropic (the Messages API; llm_base_url defaults to Anthropic's)",
    )
    llm_api_key_env: str = option(
        "OPENAI_API_KEY",
        "the environment variable holding its API key (may be unset for local servers); with llm_api "
        "anthropic the default name reads ANTHROPIC_API_KEY",
    )
    llm_max_turns: int = option(30, "chat turns (tool calls included) per proposer conversation")
    llm_temperature: float = option(0.7, "the proposer's sampling temperature")
    llm_timeout: float = option(300.0, "seconds per proposer request")
    llm_price_prompt: float = option(0.0, "USD per million prompt tokens, to record the proposer's cost")
    llm_price_completion: float = option(0.0, "USD per million completion tokens")
    llm_max_tokens: int = option(4096, "proposer agent: max_tokens of one reply")
    agent_run_seconds: float = option(
        60.0, "proposer agent: wall-clock seconds of one run(command) in the jail (CPU seconds too)"
    )
    agent_memory_mb: int = option(2048, "proposer agent: address space per process in the jail (MiB)")
    agent_scratch_mb: int = option(256, "proposer agent: size of the iteration's scratch folder (MiB)")
    agent_try_tasks: int = option(
        8, "proposer agent: the most train tasks one try_candidate may roll out (its n is capped here)"
    )
    agent_try_budget: int = option(
        32,
        "proposer agent: try_candidate rollouts allowed per iteration (charged as proposer rollouts, "
        "reported apart from the candidates' scoring)",
    )
    claude_code_path: str | None = option(
        None,
        "proposer claude-code: the CLI's cli.js (or its package folder); unset: $WHALE_CLAUDE_CODE, else "
        "the project's make install-claude-code",
    )
    claude_code_seconds: float = option(
        1800.0, "proposer claude-code: wall-clock (and CPU) seconds of one iteration's CLI session"
    )
    claude_code_memory_mb: int = option(
        4096, "proposer claude-code: address space per process in its jail (MiB; Node needs more than Python)"
    )

    def validate(self) -> None:
        at_least(
            self,
            1,
            "candidates",
            "harness_tasks",
            "rollouts_per_task",
            "frontier_size",
            "check_tasks",
            "concurrency",
            "max_llm_calls",
            "max_tokens",
            "llm_max_turns",
            "llm_max_tokens",
            "agent_memory_mb",
            "agent_scratch_mb",
            "agent_try_tasks",
            "claude_code_memory_mb",
        )
        if self.claude_code_seconds <= 0:
            raise ValueError("claude_code_seconds must be > 0")
        if self.agent_run_seconds <= 0 or self.agent_try_budget < 0:
            raise ValueError("agent_run_seconds must be > 0 and agent_try_budget >= 0")
        if self.llm_api not in ("openai", "anthropic"):
            raise ValueError(f"unknown llm_api {self.llm_api!r}; known: openai, anthropic")
        if self.candidates > 10:
            raise ValueError(f"MetaHarnessConfig.candidates must be <= 10, got {self.candidates}")
        if self.proposer not in PROPOSERS:
            raise ValueError(f"unknown proposer {self.proposer!r}; known: {', '.join(PROPOSERS)}")
        if self.accept_z < 0 or self.accept_min_gain < 0:
            raise ValueError("accept_z and accept_min_gain must be >= 0")
        if self.proposer == "llm" and not (self.llm_base_url and self.llm_model):
            raise ValueError("proposer 'llm' needs llm_base_url and llm_model")
        if self.proposer == "agent" and not self.llm_model:
            raise ValueError("proposer 'agent' needs llm_model")
        if self.proposer == "agent" and self.llm_api == "openai" and not self.llm_base_url:
            raise ValueError("proposer 'agent' with llm_api openai needs llm_base_url (.../v1)")

    @classmethod
    def from_yaml(cls, path: str | Path) -> MetaHarnessConfig:
        """Read a YAML mapping of the fields above (a ``search:`` section of a larger file works too)."""
        return cls.load(path, section="search")

    def seeded(self, seed: int = 0) -> MetaHarnessConfig:
        """This config with ``seed`` filled in where it is unset."""
        return self if self.seed is not None else dataclasses.replace(self, seed=seed)
