"""The Claude Code proposer (``proposer: claude-code``): the real Claude Code CLI as Meta-Harness's proposer.

The paper's reference runs Claude Code over the archive. Here one iteration is one non-interactive
session of the CLI (``claude -p ... --output-format stream-json``), run **in the agent proposer's jail**
(:class:`.jail.ProposerJail`: the archive read-only at ``/archive``, the harness SDK and the env
package at ``/sdk``, a private scratch folder for the iteration, no project checkout, no ``test``
split, no answers; CPU, memory, time and output limits). What the CLI gets:

* the workspace ``/sandbox/scratch`` (its working directory), holding ``SKILL.md``: the agent
  proposer's instructions built from the env's ``Domain`` (:meth:`.AgentProposer.skill`), plus how to
  hand in candidates in this mode; the archive is added to its file tools (``--add-dir /archive``);
* its own tools (Bash, Read, Write, Edit, Glob, Grep), with permission checks off: the jail is the
  boundary, not the CLI's prompts;
* exactly one way out, to the Messages API, through a relay:

  - inside the jail, a launcher (standard library only) enters a user and network namespace of its
    own whose only interface is its loopback, brings it up, and listens on one loopback port; each
    connection there is forwarded to a Unix socket, the one file of a read-only folder bound into the
    jail (Unix sockets are files: they cross network namespaces, nothing else does);
  - outside, in the search's process, :class:`~.api_relay.ApiRelay` accepts on that socket and sends each request
    on to the configured API (``llm.base_url``, default Anthropic's), one request per connection, with
    the ``Host`` header set for it and the **API key added there**: the key never enters the jail (the
    CLI holds a placeholder), and is masked in whatever the upstream answers. Only the API's own routes
    and methods are forwarded (``POST /v1/messages``, its ``count_tokens``, ``GET /v1/models``), written
    plainly (no escapes, dot segments or other queries); anything else is answered 4xx and goes nowhere.
    One thread serves every connection; pending and forwarded connections are capped.

  So the CLI (and anything its Bash tool runs) can reach the API and nothing else: no other address,
  no other port of the host.

Candidates: the CLI writes ``candidates/<k>.py`` (one harness module each) and ``candidates/<k>.json``
(``{"hypothesis": ..., "axis": ...}``) in its workspace, ``k`` = 1..M; after the session the search
picks them up (the same rule check as the agent proposer's ``submit_candidate``, then the search's
usual validation). ``NOTES.md`` from the workspace is kept as ``search/notes/<iteration>.md``.

Measured per iteration (the iteration record's ``proposer_usage``, shown by ``whale lineage``): the API
requests the relay forwarded (``requests``), the CLI's turns, tool calls by tool, Bash commands
(``runs``, ``runs_failed``), tokens and cost (from the CLI's result: with ``llm.price_*`` set the cost is
computed from the tokens at those prices, else the CLI's own ``total_cost_usd``), wall seconds. The
request count is the relay's (outside the jail); turns, tools and tokens are read by the launcher from
the CLI's own stream inside the jail, so a hostile session could misstate them. The CLI
is pinned (``make install-claude-code``, :data:`PINNED_VERSION`); it runs on Node >= 20 (the jail
needs ``--disable-wasm-trap-handler``).

Errors (the contract): a missing CLI or ``node`` is a one-line ``ProposerError`` naming what to install;
a session that fails, times out or writes no candidate is a ``ProposerError`` naming why (the search
records it and goes on); a candidate file that breaks the harness rules is skipped with its reason
logged, never raised.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harnesses.loader import harness_from_source
from harnesses.validate import HarnessValidationError
from whale_train.meta_harness import claude_code_launcher
from whale_train.meta_harness.agent_proposer import AgentProposer
from whale_train.meta_harness.api_relay import ApiRelay
from whale_train.meta_harness.archive import SEARCH_DIR, atomic_write_text
from whale_train.meta_harness.config import MetaHarnessConfig
from whale_train.meta_harness.jail import JailLimits, ProposerJail
from whale_train.meta_harness.proposer import Proposal, ProposalContext, ProposerError

#: The release ``make install-claude-code`` installs (the newest plain-JavaScript one; later ones ship
#: a native binary and need Node >= 22).
PINNED_VERSION = "2.1.112"
#: Where ``make install-claude-code`` puts it, relative to the project folder.
LOCAL_INSTALL = Path(".tools/claude-code/node_modules/@anthropic-ai/claude-code/cli.js")
PROJECT = Path(__file__).resolve().parents[2]
ANTHROPIC_URL = "https://api.anthropic.com"
#: The CLI's tools in this mode (no web tools: there is no network).
CLI_TOOLS = "Bash,Read,Write,Edit,Glob,Grep"
#: The placeholder key the CLI holds in the jail; the relay swaps in the real one.
PLACEHOLDER_KEY = "sk-ant-held-by-the-relay"

HANDING_IN = """
## In this session (Claude Code)
Your tools are Claude Code's own: Bash (this is `run`: cwd /sandbox/scratch, the same jail and limits, \
no network), Read, Write, Edit, Glob and Grep; the archive is at /archive (read-only). try_candidate \
is not available here. To check a module against the harness rules, run \
`python -c "from harnesses.loader import harness_from_source as h; h(open('candidates/1.py').read(), 'x')"`.
Hand in candidate k (k = 1 .. {slots}) as two files in /sandbox/scratch:
- candidates/<k>.py: the full harness module (exactly one harness class);
- candidates/<k>.json: {{"hypothesis": "what changed, why, what the traces should show", \
"axis": "the mechanism family", "parent": "the id it builds on (optional)"}}.
Write NOTES.md in /sandbox/scratch before you finish. When the files are written, stop.
"""

#: Runs inside the jail (:mod:`.claude_code_launcher`, standard library only): own network namespace
#: with loopback up, a forwarder from one loopback port to the relay's Unix socket, then the CLI; prints
#: one JSON summary line. Its text is written into the scratch folder and run as a file.
LAUNCHER = Path(claude_code_launcher.__file__).read_text(encoding="utf-8")


def find_cli(configured: str | None = None) -> tuple[Path, Path]:
    """``(node, cli.js)`` of the Claude Code CLI: ``configured`` (``claude_code.path``: the cli.js or
    its package folder), else ``$WHALE_CLAUDE_CODE``, else the project's ``make install-claude-code``.
    Raises ``ProposerError`` (one line) when either is missing."""
    where = configured or os.environ.get("WHALE_CLAUDE_CODE") or str(PROJECT / LOCAL_INSTALL)
    cli = Path(where).expanduser()
    if cli.is_dir():
        cli = cli / "cli.js"
    if not cli.is_file():
        raise ProposerError(
            f"the Claude Code CLI is not installed at {cli}: run `make install-claude-code` "
            f"(@anthropic-ai/claude-code@{PINNED_VERSION}), or set claude_code.path to its cli.js"
        )
    node = shutil.which("node")
    if node is None:
        raise ProposerError("proposer claude-code needs Node.js >= 20 (`node` is not on PATH)")
    return Path(node).resolve(), cli.resolve()


# ------------------------------------------------------------------------------------ the proposer


@dataclass
class SessionResult:
    """What one CLI session left: its summary line (None when the launcher printed none) and output."""

    summary: dict[str, Any] | None
    output: str
    limit: str | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class ClaudeCodeProposer:
    """See the module docstring."""

    name = "claude-code"

    def __init__(
        self,
        config: MetaHarnessConfig | None = None,
        env_kwargs: dict[str, Any] | None = None,
        *,
        api_key: str | None = None,
    ):
        self.check = config or MetaHarnessConfig(proposer="claude-code")
        self.env_kwargs = env_kwargs or {}
        self.api_key = api_key
        c = self.check
        self.jail_limits = JailLimits(
            wall_s=c.claude_code.seconds,
            output_chars=200_000,
            memory_mb=c.claude_code.memory_mb,
            processes=256,
            scratch_mb=c.agent.scratch_mb,
        )
        # the agent proposer's skill, at this mode's limits (its per-command limits are the session's)
        self._skill = AgentProposer(None, check=c, env_kwargs=self.env_kwargs, jail_limits=self.jail_limits)  # type: ignore[arg-type]

    @classmethod
    def from_config(
        cls, config: MetaHarnessConfig, env_kwargs: dict[str, Any] | None = None
    ) -> ClaudeCodeProposer:
        key_env = config.llm.api_key_env
        if key_env == "OPENAI_API_KEY":  # the default name: the CLI speaks Anthropic's API
            key_env = "ANTHROPIC_API_KEY"
        find_cli(config.claude_code.path)  # a missing CLI fails here, before any work
        return cls(config, env_kwargs, api_key=os.environ.get(key_env))

    def skill(self, ctx: ProposalContext) -> str:
        """The agent proposer's instructions, and how to hand in candidates in this mode."""
        return self._skill.skill(ctx, 0) + HANDING_IN.format(slots=len(ctx.slots))

    def propose(self, ctx: ProposalContext) -> list[Proposal]:
        node, cli = find_cli(self.check.claude_code.path)
        c = self.check
        relay = ApiRelay(c.llm.base_url or ANTHROPIC_URL, self.api_key)
        mounts = {"/whale-relay": str(relay.folder), "/whale-cli": str(cli.parent)}
        node_in_jail = str(node)
        if not any(str(node).startswith(p) for p in ("/usr/", "/bin/", "/lib")):  # not in the jail's view
            mounts["/whale-node"] = str(node.parent)
            node_in_jail = f"/whale-node/{node.name}"
        jail = ProposerJail(ctx.archive.root, self.jail_limits, mounts=mounts)
        tag = f"{ctx.iteration:03d}"
        start = time.monotonic()
        try:
            session = self._session(ctx, jail, node_in_jail)
            proposals, skipped = self._pick_up(ctx, jail)
            notes = jail.get("NOTES.md")
        finally:
            jail.close()
            relay.close()
        if notes:
            atomic_write_text(ctx.archive.root / SEARCH_DIR / "notes" / f"{tag}.md", notes)
        usage = self._usage(session, relay, time.monotonic() - start)
        log = {"session": session.summary, "relay": {"forwarded": relay.requests, "refused": relay.refused}}
        log["skipped"] = skipped
        if session.error or session.limit:
            log["error"] = session.error or f"stopped: {session.limit} limit"
        atomic_write_text(
            ctx.archive.root / SEARCH_DIR / "proposer" / f"{tag}.jsonl",
            json.dumps(log, ensure_ascii=False, default=str) + "\n",
        )
        if not proposals:
            raise ProposerError(self._why_none(session, skipped))
        proposals[-1].usage = usage  # the iteration's usage, once (the search sums the candidates')
        for p in proposals[:-1]:
            p.usage = dict.fromkeys(usage, 0)
        return proposals

    # ------------------------------------------------------------------ pieces

    def _session(self, ctx: ProposalContext, jail: ProposerJail, node: str) -> SessionResult:
        c = self.check
        jail.put("SKILL.md", self.skill(ctx))
        jail.put(".whale-launch.py", LAUNCHER)
        prompt = (
            f"{ctx.standing()}\nYour instructions are in SKILL.md (read it first). Write "
            f"{len(ctx.slots)} candidate(s) as candidates/<k>.py and candidates/<k>.json, and NOTES.md."
        )
        # Node reserves ~10 GB of address space per WebAssembly memory for its trap handler (the HTTP
        # parser is one): under the jail's address-space limit it must bounds-check instead
        argv = [
            node,
            "--disable-wasm-trap-handler",
            "/whale-cli/cli.js",
            "-p",
            prompt,
            "--output-format",
            "stream-json",
            "--verbose",
        ]
        argv += ["--no-session-persistence", "--dangerously-skip-permissions", "--setting-sources", ""]
        argv += ["--tools", CLI_TOOLS, "--add-dir", "/archive", "--max-turns", str(c.llm.max_turns)]
        argv += ["--append-system-prompt", "Follow SKILL.md in your working directory exactly."]
        if c.llm.model:
            argv += ["--model", c.llm.model]
        launch = json.dumps({"argv": argv, "key": PLACEHOLDER_KEY})
        result = jail.run(f"exec python -I .whale-launch.py {_quote(launch)}")
        summary = None
        for line in reversed(result.output.splitlines()):
            if line.startswith("{"):
                try:
                    summary = json.loads(line)
                    break
                except ValueError:
                    continue
        return SessionResult(summary, result.output, result.limit, result.error)

    def _pick_up(self, ctx: ProposalContext, jail: ProposerJail) -> tuple[list[Proposal], list[str]]:
        """The candidates the CLI wrote (the agent proposer's submission rule check on each)."""
        proposals: list[Proposal] = []
        skipped: list[str] = []
        for k in range(1, len(ctx.slots) + 1):
            source = jail.get(f"candidates/{k}.py")
            if not source:
                skipped.append(f"candidates/{k}.py: not written")
                continue
            try:
                harness_from_source(source, "submission")
            except HarnessValidationError as exc:
                skipped.append(f"candidates/{k}.py: breaks the rules: {exc}")
                continue
            try:
                meta = json.loads(jail.get(f"candidates/{k}.json") or "{}")
            except ValueError:
                meta = {}
            meta = meta if isinstance(meta, dict) else {}
            axis = str(meta.get("axis") or "").strip()[:80]
            parent = meta.get("parent") or ctx.incumbent
            if parent not in ctx.archive:
                parent = ctx.incumbent
            proposals.append(
                Proposal(
                    source=source,
                    hypothesis=str(meta.get("hypothesis") or "").strip() or "(no hypothesis given)",
                    parents=[parent],
                    change="prompt" if ctx.prompt_only else "rewrite",
                    summary=axis,
                    components={"model": self.check.llm.model or "(the CLI's default)", "api": "claude-code"}
                    | {"axis": axis},
                )
            )
        return proposals, skipped

    def _usage(self, session: SessionResult, relay: ApiRelay, wall: float) -> dict[str, Any]:
        c = self.check
        s = session.summary or {}
        result = s.get("result") or {}
        u = result.get("usage") or {}
        prompt = sum(
            int(u.get(k) or 0)
            for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        )
        completion = int(u.get("output_tokens") or 0)
        tools = s.get("tools") or {}
        if c.llm.price_prompt or c.llm.price_completion:
            cost = (prompt * c.llm.price_prompt + completion * c.llm.price_completion) / 1e6
        else:
            cost = float(result.get("total_cost_usd") or 0.0)
        return {
            "requests": sum(1 for m, p in relay.requests if p.startswith("/v1/messages")),
            "turns": int(result.get("num_turns") or 0),
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "cost_usd": round(cost, 6),
            "cli_cost_usd": float(result.get("total_cost_usd") or 0.0),
            "tool_calls": sum(tools.values()),
            **{f"tool_{name.lower()}": int(n) for name, n in sorted(tools.items())},
            "runs": int(tools.get("Bash", 0)),
            "runs_failed": int(s.get("bash_failed") or 0),
            "tries": 0,
            "try_rollouts": 0,
            "validations": 0,
            "relay_refused": len(relay.refused),
            "wall_seconds": round(wall, 3),
        }

    def _why_none(self, session: SessionResult, skipped: list[str]) -> str:
        s = session.summary or {}
        result = s.get("result") or {}
        if session.error:
            why = f"the session did not run: {session.error}"
        elif session.limit:
            why = f"the session was stopped by the {session.limit} limit"
        elif "launcher_error" in s:
            why = f"the jail's network could not be set up: {s['launcher_error']}"
        elif not s:
            why = (
                "the session printed no summary: "
                + (session.output.strip().splitlines() or ["(no output)"])[-1]
            )
        elif result.get("is_error") or s.get("exit"):
            text = result.get("result") or result.get("subtype") or (s.get("stderr") or "").strip()
            why = f"the CLI failed (exit {s.get('exit')}): {str(text).strip().splitlines()[-1] if text else '?'}"
        else:
            why = "the CLI finished"
        return f"claude-code wrote no usable candidate ({why}; {'; '.join(skipped) or 'nothing written'})"[
            :600
        ]


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"
