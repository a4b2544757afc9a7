"""``MetaHarnessConfig``: every knob of the harness search, loadable from YAML or a dict.

The proposer's settings are nested, one config per kind of proposer: ``llm`` (the proposer's model and
its API: proposers ``llm``, ``agent`` and ``claude-code``), ``agent`` (the agent proposer's jail and
``try_candidate``) and ``claude_code`` (the Claude Code CLI's session)::

    search:
      proposer: agent
      llm: {api: anthropic, model: claude-opus-4-1, price_prompt: 15, price_completion: 75}
      agent: {try_budget: 16}

The flat keys they replace (``llm_model``, ``agent_try_budget``, ``claude_code_path``, ...: ``<kind>_<name>``
is now ``<kind>.<name>``) are still read, from files, ``--set``, run folders and the constructor, with
a one-line notice naming the new key (:data:`RENAMED`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from whale_train.config_io import Config, option, renamed

PROPOSERS = ("offline", "llm", "agent", "claude-code")
APIS = ("openai", "anthropic")


@dataclass
class LLMProposerConfig(Config):
    """The proposer's model and its API (``search.llm``): proposers ``llm``, ``agent`` and ``claude-code``."""

    base_url: str | None = option(
        None,
        "the proposer's endpoint: OpenAI-compatible (.../v1) for proposer llm and for agent with api openai; "
        "agent with api anthropic and claude-code default to Anthropic's",
    )
    model: str | None = option(None, "the proposer model's name (claude-code: unset is the CLI's default)")
    api: str = option(
        "openai",
        "proposer agent: the wire format, openai (chat completions with tool calls: OpenAI, vLLM, most "
        "gateways) or anthropic (the Messages API; base_url defaults to Anthropic's)",
    )
    api_key_env: str = option(
        "OPENAI_API_KEY",
        "the environment variable holding its API key (may be unset for local servers); with api anthropic "
        "and for claude-code the default name reads ANTHROPIC_API_KEY",
    )
    max_turns: int = option(30, "chat turns (tool calls included) per proposer conversation", minimum=1)
    temperature: float = option(0.7, "the proposer's sampling temperature (proposers llm and agent)")
    timeout: float = option(300.0, "seconds per proposer request (proposers llm and agent)")
    price_prompt: float = option(0.0, "USD per million prompt tokens, to record the proposer's cost")
    price_completion: float = option(0.0, "USD per million completion tokens, to record the proposer's cost")
    max_tokens: int = option(4096, "proposer agent: max_tokens of one reply", minimum=1)

    def validate(self) -> None:
        super().validate()
        if self.api not in APIS:  # the name a flat config knew it by, then its key (tests and users grep it)
            raise ValueError(f"unknown llm_api {self.api!r} (llm.api); known: {', '.join(APIS)}")


@dataclass
class AgentProposerConfig(Config):
    """The agent proposer's jail and ``try_candidate`` (``search.agent``): proposer ``agent``."""

    run_seconds: float = option(
        60.0, "wall-clock seconds of one run(command) in the jail (its CPU seconds too)"
    )
    memory_mb: int = option(2048, "address space per process in the jail (MiB)", minimum=1)
    scratch_mb: int = option(
        256, "size of the iteration's scratch folder (MiB; claude-code's jail has the same)", minimum=1
    )
    try_tasks: int = option(
        8, "the most train tasks one try_candidate may roll out (its n is capped here)", minimum=1
    )
    try_budget: int = option(
        32,
        "try_candidate rollouts allowed per iteration (charged as proposer rollouts, reported apart from "
        "the candidates' scoring)",
    )

    def validate(self) -> None:
        super().validate()
        if self.run_seconds <= 0 or self.try_budget < 0:
            raise ValueError("agent.run_seconds must be > 0 and agent.try_budget >= 0")


@dataclass
class ClaudeCodeConfig(Config):
    """The Claude Code CLI's session (``search.claude_code``): proposer ``claude-code``."""

    path: str | None = option(
        None,
        "the CLI's cli.js (or its package folder); unset: $WHALE_CLAUDE_CODE, else the project's "
        "make install-claude-code",
    )
    seconds: float = option(1800.0, "wall-clock (and CPU) seconds of one iteration's CLI session")
    memory_mb: int = option(
        4096, "address space per process in its jail (MiB; Node needs more than Python)", minimum=1
    )

    def validate(self) -> None:
        super().validate()
        if self.seconds <= 0:
            raise ValueError("claude_code.seconds must be > 0")


def _flat(kind: str, config: type) -> dict[str, str]:
    return {f"{kind}_{f.name}": f"{kind}.{f.name}" for f in dataclasses.fields(config)}


#: The flat keys of the proposer's settings before they were nested: ``llm_model`` is ``llm.model``.
RENAMED = (
    _flat("llm", LLMProposerConfig)
    | _flat("agent", AgentProposerConfig)
    | _flat("claude_code", ClaudeCodeConfig)
)


@renamed(RENAMED)
@dataclass
class MetaHarnessConfig(Config):
    """How the harness search proposes, checks, scores and accepts candidates (``whale search --config``,
    and ``search:`` of a train config)."""

    candidates: int = option(3, "M, the candidates proposed per iteration (paper: 3; at most 10)", minimum=1)
    harness_tasks: int = option(
        256,
        "tasks of the harness split every candidate is scored on (paper: 256); the same tasks (drawn once "
        "with seed) serve the whole search, so comparisons are paired",
        minimum=1,
    )
    rollouts_per_task: int = option(1, "rollouts per task and candidate (paper: 1)", minimum=1)
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
        minimum=1,
    )
    rescore_frontier: bool = option(
        True,
        "on a new model version, re-score the whole frontier of the previous version (true) or only the "
        "incumbent (false)",
    )
    check_tasks: int = option(
        8, "train tasks of the check_harness smoke run with null models (not charged)", minimum=1
    )
    concurrency: int = option(64, "episodes in flight while scoring (the model's batch size)", minimum=1)
    max_llm_calls: int = option(
        64, "LLM requests allowed per episode (a runaway candidate ends there)", minimum=1
    )
    max_tokens: int = option(512, "the largest max_tokens one request of a candidate may ask for", minimum=1)
    harness_seconds: float = option(30.0, "a candidate's own compute allowed between two handle calls")
    llm: LLMProposerConfig = option(
        factory=LLMProposerConfig,
        help="the proposer's model and API (proposers llm, agent and claude-code); the flat llm_* keys "
        "are still read",
    )
    agent: AgentProposerConfig = option(
        factory=AgentProposerConfig,
        help="the agent proposer's jail and try_candidate; the flat agent_* keys are still read",
    )
    claude_code: ClaudeCodeConfig = option(
        factory=ClaudeCodeConfig,
        help="the Claude Code CLI's session (proposer claude-code); the flat claude_code_* keys are still read",
    )

    def validate(self) -> None:
        super().validate()
        for sub in (self.llm, self.agent, self.claude_code):  # when built in Python (a loader did them)
            sub.validate()
        if self.candidates > 10:
            raise ValueError(f"MetaHarnessConfig.candidates must be <= 10, got {self.candidates}")
        if self.proposer not in PROPOSERS:
            raise ValueError(f"unknown proposer {self.proposer!r}; known: {', '.join(PROPOSERS)}")
        if self.accept_z < 0 or self.accept_min_gain < 0:
            raise ValueError("accept_z and accept_min_gain must be >= 0")
        # each message names the setting as a flat config knew it, then its key (users and tests grep them)
        llm = self.llm
        if self.proposer == "llm" and not (llm.base_url and llm.model):
            raise ValueError("proposer 'llm' needs llm_base_url and llm_model (llm.base_url, llm.model)")
        if self.proposer == "agent" and not llm.model:
            raise ValueError("proposer 'agent' needs llm_model (llm.model)")
        if self.proposer == "agent" and llm.api == "openai" and not llm.base_url:
            raise ValueError("proposer 'agent' with llm_api openai needs llm_base_url (llm.base_url: .../v1)")

    @classmethod
    def from_yaml(cls, path: str | Path) -> MetaHarnessConfig:
        """Read a YAML mapping of the fields above (a ``search:`` section of a larger file works too)."""
        return cls.load(path, section="search")

    def seeded(self, seed: int = 0) -> MetaHarnessConfig:
        """This config with ``seed`` filled in where it is unset."""
        return self if self.seed is not None else dataclasses.replace(self, seed=seed)
