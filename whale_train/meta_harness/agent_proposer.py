"""The agent proposer (``proposer: agent``): Meta-Harness's coding-agent proposer over any chat model.

A chat model (OpenAI-compatible or Anthropic Messages API, :mod:`.llm_api`) works one iteration with
these tools:

* ``list_files`` / ``read_file`` / ``grep``: the archive folder, read-only (:class:`.tools.ArchiveTools`);
* ``run(command)``: a shell command in the iteration's jail (:class:`.jail.ProposerJail`): the archive
  read-only at ``/archive``, the harness SDK and the env package at ``/sdk``, a private scratch folder
  kept for the iteration, no network, no project checkout, no ``test`` split, no answers; CPU, memory,
  time and output limits. This is where the agent prototypes a parser or a prompt on real traces;
* ``try_candidate(source, n)``: the candidate checked like any other, then rolled out on ``n``
  ``train``-split tasks under the current model; the agent gets the outcome and the traces (also in its
  scratch folder, gold answers hidden). These rollouts are the proposer's: recorded as
  ``try_rollouts`` in the iteration's ``proposer_usage`` and as its ``proposer_rollouts``, apart from
  the candidates' scoring rollouts, and capped per iteration by ``agent.try_budget``;
* ``validate_candidate(source)``: the search's gates (AST rules, prompt-only rule, ``check_harness``);
* ``submit_candidate(source, hypothesis, axis)``: one candidate per slot, one mechanism each.

The instructions (the proposer skill) are built from the env's ``Domain``. Every tool call is logged to
``search/proposer/<iteration>.jsonl`` of the archive (refused commands included) and the agent's
``NOTES.md`` from its scratch folder is kept as ``search/notes/<iteration>.md`` for later iterations.
Per iteration the measured proposer lands in the iteration record's ``proposer_usage``: requests
(turns), tool calls, prototype runs, tries and their rollouts, tokens, cost and wall seconds.

Errors: a server failure is a ``ProposerError`` (the iteration goes on with the candidates submitted so
far); a tool the agent misuses answers ``error: ...`` and the conversation goes on.
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

import gymnasium as gym

from harnesses.loader import harness_from_source
from harnesses.validate import HarnessValidationError
from whale_envs.sandbox import IsolationUnavailable
from whale_train.domains import domain_for
from whale_train.meta_harness import evaluate
from whale_train.meta_harness.archive import SEARCH_DIR, atomic_write_text, public_trace
from whale_train.meta_harness.config import MetaHarnessConfig
from whale_train.meta_harness.jail import JailLimits, ProposerJail
from whale_train.meta_harness.llm_api import ChatAPI, Conversation, ToolCall, ToolSpec, make_api
from whale_train.meta_harness.llm_proposer import harness_facts
from whale_train.meta_harness.proposer import Proposal, ProposalContext, ProposerError
from whale_train.meta_harness.tools import ArchiveTools, ToolError
from whale_train.rollout import run_rollouts

SKILL = """You are a harness engineer running ONE iteration of Meta-Harness, an outer loop that improves \
the harness of a language model. A harness is the Python code around the model: it builds the \
prompts, calls the model, parses what it says and drives the environment ({env_id}). You write \
candidate harnesses; the outer loop scores each one on held-out search tasks under the current model \
(version {version}) and keeps a candidate only when it beats the incumbent by more than noise. You do \
not score candidates yourself.

## What you have
- The archive, read-only: with list_files/read_file/grep (paths relative to it), and in your shell at \
/archive. One folder per harness tried: <id>/harness.py, <id>/meta.json (parents, hypothesis, status \
and reason), <id>/evals/<v>.json (score under model version v: per-task rewards, failure counts, calls, \
tokens), <id>/traces/<v>.jsonl (one JSON line per episode: every prompt and completion, every env step \
and error; gold answers hidden). search/iterations/*.json: every past decision with its numbers. \
search/notes/*.md: the notes earlier iterations left. search/proposer/*.jsonl: earlier tool logs.
- run(command): a shell (/bin/sh) in a jail. The working directory /sandbox/scratch is yours for this \
iteration (it is gone at the next one). python has the harness SDK and the env package importable \
(`import harnesses.base`, `import whale_envs`; no stored tasks, no answers, no test split) and the \
installed packages. No network. Each command: {run_s:g} s wall clock, {run_s:g} s CPU, \
{memory_mb} MiB per process.
- try_candidate(source, n): rolls your candidate out on n (at most {try_tasks}) train tasks under the \
current model and shows what happened; the traces are also written to your scratch folder (tries/). \
{try_budget} try rollouts are left for this iteration; they cost real compute, use them to check a \
mechanism end to end, not to tune constants.
- validate_candidate(source): the outer loop's gates (AST rules, null-model check), no score.
- submit_candidate(source, hypothesis, axis): records a candidate for one slot.

## Rules
- One mechanism per candidate, each candidate a different one. A mechanism, not a constant: how the \
context is built, how the output is constrained and parsed, retries with the env's feedback, choosing \
among listed options by likelihood (llm.choose), self-consistency votes (llm.sample), tool use, query \
rewriting, memory of solved examples. A candidate that only changes a number or a word is wasted.
- No dataset-specific hints: never hard-code anything about particular tasks, questions, answers or \
ids, and never branch on question text. The harness is also measured on held-out tasks.
- The harness must not solve tasks itself (no chess engine, sympy or solver logic): with a model that \
answers nothing it must stay at chance level, or it is rejected.
{prompt_only}
## Workflow
1. Read search/notes/ and the latest search/iterations/ record, then the incumbent's source and traces. \
Find where episodes fail: unparseable replies, illegal actions, wrong answers, wasted calls.
2. For each slot form one falsifiable hypothesis tied to a failure you saw in the traces.
3. Prototype before writing the candidate (mandatory for any parsing, feedback or control-flow change): \
with run, put real failing completions from the traces in a script and run your new parser or logic on \
them; try variants and keep the best. Optionally try_candidate on a few train tasks.
4. Write the full module (exactly one harness class), validate_candidate it and fix what it reports.
5. Before your last submission, write NOTES.md in your scratch folder: what you tried, what the \
prototypes showed, what to try next. It is kept for the next iteration.
6. submit_candidate(source, hypothesis, axis) for each slot. The hypothesis says what changed, why, and \
what you expect in the traces; axis names the mechanism family (e.g. parsing, context, retry, voting).

## The harness contract (harnesses/base.py)
{contract}
Imports allowed in a harness: {imports}{shipped}.
Actions of this env: {actions}
The env's info dict has: {info}
"""

PROMPT_ONLY = """- PROMPT-ONLY MODE: you may change only the string constants (prompt text) of the seed harness \
{seed_id}/harness.py. Any other difference in the code is rejected.
"""


def _spec(name: str, description: str, required: tuple[str, ...] = (), **props: tuple[str, str]) -> ToolSpec:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {k: {"type": t, "description": d} for k, (t, d) in props.items()},
    }
    if required:
        schema["required"] = list(required)
    return ToolSpec(name, description, schema)


TOOLS = [
    _spec("list_files", "List a folder of the archive (folders end with /).", path=("string", "default .")),
    _spec(
        "read_file",
        "Read a text file of the archive from a character offset.",
        ("path",),
        path=("string", "relative to the archive"),
        offset=("integer", "default 0"),
        length=("integer", "characters (default and most: 20000)"),
    ),
    _spec(
        "grep",
        "Lines matching a Python regular expression in the archive's text files.",
        ("pattern",),
        pattern=("string", "a Python regular expression"),
        path=("string", "a file or folder of the archive (default .)"),
    ),
    _spec(
        "run",
        "Run a shell command in your jail (cwd: your scratch folder; /archive read-only; no network).",
        ("command",),
        command=("string", "a /bin/sh command line"),
    ),
    _spec(
        "try_candidate",
        "Check a candidate, then roll it out on n train tasks under the current model; returns the outcomes.",
        ("source",),
        source=("string", "the full harness module"),
        n=("integer", "train tasks (default 4)"),
    ),
    _spec(
        "validate_candidate",
        "Check harness source against the outer loop's rules and run it with null models (no score).",
        ("source",),
        source=("string", "the full harness module"),
    ),
    _spec(
        "submit_candidate",
        "Record a candidate for one slot: its full source, the hypothesis, the mechanism axis.",
        ("source", "hypothesis", "axis"),
        source=("string", "the full harness module"),
        hypothesis=("string", "what changed, why, and what the traces should show"),
        axis=("string", "the mechanism family, e.g. parsing, context, retry, voting"),
        parent=("string", "the id it builds on (default: the incumbent)"),
    ),
]

#: Measured per iteration (summed into the iteration record's ``proposer_usage``).
COUNTERS = (
    "requests",
    "prompt_tokens",
    "completion_tokens",
    "cost_usd",
    "tool_calls",
    "runs",
    "runs_failed",
    "tries",
    "try_rollouts",
    "validations",
    "wall_seconds",
)


class AgentProposer:
    """See the module docstring. ``api`` is a :class:`.llm_api.ChatAPI` (or a stand-in for tests)."""

    name = "agent"

    def __init__(
        self,
        api: ChatAPI,
        *,
        check: MetaHarnessConfig | None = None,
        env_kwargs: dict[str, Any] | None = None,
        jail_limits: JailLimits | None = None,
    ):
        self.api = api
        self.check = check or MetaHarnessConfig()
        self.env_kwargs = env_kwargs or {}
        self.jail_limits = jail_limits or JailLimits(
            wall_s=self.check.agent.run_seconds,
            memory_mb=self.check.agent.memory_mb,
            scratch_mb=self.check.agent.scratch_mb,
        )

    @classmethod
    def from_config(
        cls, config: MetaHarnessConfig, env_kwargs: dict[str, Any] | None = None
    ) -> AgentProposer:
        key_env = config.llm.api_key_env
        if config.llm.api == "anthropic" and key_env == "OPENAI_API_KEY":
            key_env = "ANTHROPIC_API_KEY"
        api = make_api(
            config.llm.api,
            config.llm.base_url,
            config.llm.model or "",
            api_key_env=key_env,
            temperature=config.llm.temperature,
            max_tokens=config.llm.max_tokens,
            timeout=config.llm.timeout,
        )
        return cls(api, check=config, env_kwargs=env_kwargs)

    # ------------------------------------------------------------------ one iteration

    def propose(self, ctx: ProposalContext) -> list[Proposal]:
        session = _Session(self, ctx)
        try:
            return session.work()
        finally:
            session.close()

    def skill(self, ctx: ProposalContext, try_budget: int) -> str:
        """The instructions for one iteration, from the env's domain."""
        return SKILL.format(
            **harness_facts(ctx),
            run_s=self.jail_limits.wall_s,
            memory_mb=self.jail_limits.memory_mb,
            try_tasks=self.check.agent.try_tasks,
            try_budget=try_budget,
            prompt_only=PROMPT_ONLY.format(seed_id=ctx.seed_id) if ctx.prompt_only else "",
            actions=domain_for(ctx.env_id).actions or "(see the seed harness)",
        )


class _Session:
    """One iteration's conversation, jail, counters and log."""

    def __init__(self, proposer: AgentProposer, ctx: ProposalContext):
        self.p = proposer
        self.ctx = ctx
        self.files = ArchiveTools(ctx.archive.root)
        self.jail = ProposerJail(ctx.archive.root, proposer.jail_limits)
        self.proposals: list[Proposal] = []
        self.now = dict.fromkeys(COUNTERS, 0)
        self.now["cost_usd"] = 0.0
        self.clock = time.monotonic()
        self.try_left = proposer.check.agent.try_budget if ctx.llm is not None else 0
        self.log: list[dict[str, Any]] = []
        tag = f"{ctx.iteration:03d}"
        self.log_path = ctx.archive.root / SEARCH_DIR / "proposer" / f"{tag}.jsonl"
        self.notes_path = ctx.archive.root / SEARCH_DIR / "notes" / f"{tag}.md"

    def work(self) -> list[Proposal]:
        ctx, api, check = self.ctx, self.p.api, self.p.check
        convo = Conversation(self.p.skill(ctx, self.try_left))
        convo.user(self._task())
        for turn in range(check.llm.max_turns):
            if len(self.proposals) >= len(ctx.slots):
                break
            reply = api.chat(convo, TOOLS)
            self.now["requests"] += 1
            self.now["prompt_tokens"] += reply.input_tokens
            self.now["completion_tokens"] += reply.output_tokens
            self.now["cost_usd"] += (
                reply.input_tokens * check.llm.price_prompt + reply.output_tokens * check.llm.price_completion
            ) / 1e6
            convo.assistant(reply)
            if not reply.tool_calls:
                convo.user(
                    "Use the tools: read the archive, prototype with run, then call submit_candidate "
                    f"({len(ctx.slots) - len(self.proposals)} slot(s) left)."
                )
                continue
            results = []
            for call in reply.tool_calls:
                self.now["tool_calls"] += 1
                text = self._tool(call)
                self.log.append(
                    {
                        "turn": turn,
                        "tool": call.name,
                        "arguments": _short(call.arguments if call.arguments is not None else call.error),
                        "result": text[:2000],
                    }
                )
                results.append((call, text))
            convo.results(results)
        if not self.proposals:
            raise ProposerError(f"the agent proposer submitted no candidate in {check.llm.max_turns} turns")
        return self.proposals[: len(ctx.slots)]

    def close(self) -> None:
        """Keep the notes and the tool log in the archive, end the jail, book the rest of the usage."""
        notes = self.jail.get("NOTES.md")
        self.jail.close()
        if notes:
            atomic_write_text(self.notes_path, notes)
        if self.log:
            atomic_write_text(
                self.log_path,
                "".join(json.dumps(e, ensure_ascii=False, default=str) + "\n" for e in self.log),
            )
        if self.proposals:
            last = self.proposals[-1]
            rest = self._take()
            last.usage = {k: (last.usage or {}).get(k, 0) + v for k, v in rest.items()}

    # ------------------------------------------------------------------ tools

    def _tool(self, call: ToolCall) -> str:
        if call.arguments is None:
            return f"error: {call.error}"
        args = call.arguments
        try:
            if call.name == "list_files":
                return self.files.list_files(str(args.get("path", ".")))
            if call.name == "read_file":
                return self.files.read_file(str(args["path"]), args.get("offset", 0), args.get("length"))
            if call.name == "grep":
                return self.files.grep(str(args["pattern"]), str(args.get("path", ".")))
            if call.name == "run":
                return self._run(str(args["command"]))
            if call.name == "validate_candidate":
                return self._validate(str(args["source"]))
            if call.name == "try_candidate":
                return self._try(str(args["source"]), args.get("n", 4))
            if call.name == "submit_candidate":
                return self._submit(args)
        except ToolError as exc:
            return f"error: {exc}"
        except KeyError as exc:
            return f"error: missing argument {exc}"
        except (TypeError, ValueError) as exc:
            return f"error: bad argument: {exc}"
        return f"error: unknown tool {call.name!r}"

    def _run(self, command: str) -> str:
        self.now["runs"] += 1
        result = self.jail.run(command)
        if not result.ok:
            self.now["runs_failed"] += 1
        return result.observation(self.p.jail_limits.output_chars)

    def _validation(self, source: str) -> evaluate.Validation:
        ctx = self.ctx
        self.now["validations"] += 1
        seed_source = ctx.archive.get(ctx.seed_id).source if ctx.prompt_only else None
        return evaluate.validate(
            source, "prototype", ctx.env_id, self.p.env_kwargs, self.p.check, seed_source
        )

    def _validate(self, source: str) -> str:
        v = self._validation(source)
        if v.ok:
            return f"ok: passes validation and check_harness (null-model scores {v.check.get('null_scores')})"
        return f"rejected: {v.reason}"

    def _try(self, source: str, n: Any) -> str:
        ctx, check = self.ctx, self.p.check
        if ctx.llm is None:
            return "error: no model to roll out with in this search"
        n = min(int(n), check.agent.try_tasks, self.try_left)
        if n < 1:
            return (
                f"error: no try rollouts left in this iteration (agent.try_budget {check.agent.try_budget})"
            )
        v = self._validation(source)
        if not v.ok:
            return f"rejected before any rollout: {v.reason}"
        ref = harness_from_source(source, f"try{self.now['tries']}")
        env = gym.make(ctx.env_id, split="train", **self.p.env_kwargs).unwrapped
        ids = list(env.task_ids)
        rng = random.Random(f"try/{ctx.seed}/{ctx.iteration}/{self.now['tries']}")
        picks = sorted(rng.sample(ids, min(n, len(ids))))
        self.now["tries"] += 1
        trajs = run_rollouts(
            ref,
            ctx.env_id,
            ctx.llm,
            picks,
            env_kwargs={**self.p.env_kwargs, "split": "train"},
            config=evaluate.rollout_config(check),
        )
        self.now["try_rollouts"] += len(trajs)
        self.try_left -= len(trajs)
        lines = [public_trace(t) for t in trajs]
        path = f"tries/try-{self.now['tries']}.jsonl"
        try:
            self.jail.put(path, "".join(json.dumps(d, ensure_ascii=False, default=str) + "\n" for d in lines))
            where = f"traces in your scratch folder: {path}"
        except (RuntimeError, IsolationUnavailable) as exc:  # the outcomes below still count
            where = f"the traces could not be written to your scratch folder ({exc})"
        solved = sum(t.solved for t in trajs)
        out = [f"{solved} of {len(trajs)} train episodes solved; {where}"]
        for t in trajs:
            last = t.calls[-1].completion if t.calls else ""
            out.append(
                f"- {t.task_id}: reward {t.reward:g}, {t.failure or 'solved'}, {len(t.calls)} calls; "
                f"last completion: {last[-300:]!r}"
            )
        out.append(f"({self.try_left} try rollouts left in this iteration)")
        return "\n".join(out)

    def _submit(self, args: dict[str, Any]) -> str:
        ctx = self.ctx
        if len(self.proposals) >= len(ctx.slots):
            return "error: all candidates of this iteration are submitted already"
        source, hypothesis = str(args["source"]), str(args["hypothesis"]).strip()
        axis = str(args.get("axis") or "").strip()[:80]
        try:
            harness_from_source(source, "submission")
        except HarnessValidationError as exc:
            return f"error: not recorded, the source breaks the rules: {exc}"
        parent = args.get("parent") or ctx.incumbent
        if parent not in ctx.archive:
            parent = ctx.incumbent
        self.proposals.append(
            Proposal(
                source=source,
                hypothesis=hypothesis or "(no hypothesis given)",
                parents=[parent],
                change="prompt" if ctx.prompt_only else "rewrite",
                summary=axis,
                components={"model": self.p.api.model, "api": self.p.api.name, "axis": axis},
                usage=self._take(),
            )
        )
        left = len(ctx.slots) - len(self.proposals)
        more = f"Propose {left} more, each a different mechanism." if left else "That is all, thank you."
        return f"recorded ({len(self.proposals)} of {len(ctx.slots)}). {more}"

    def _take(self) -> dict[str, Any]:
        """The counters since the last recorded candidate (so the candidates' usage sums to the iteration's)."""
        out = dict(self.now)
        tick = time.monotonic()
        out["wall_seconds"] = round(tick - self.clock, 3)
        out["cost_usd"] = round(out["cost_usd"], 6)
        self.clock = tick
        self.now = dict.fromkeys(COUNTERS, 0)
        self.now["cost_usd"] = 0.0
        return out

    def _task(self) -> str:
        ctx = self.ctx
        return ctx.standing() + f"\nPropose {len(ctx.slots)} candidate(s), each a different mechanism."


def _short(value: Any, n: int = 2000) -> Any:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return value if len(text) <= n else text[:n] + " ..."
