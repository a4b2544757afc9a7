"""The agent proposer against scripted local servers that speak the OpenAI chat API (tool_calls) and
Anthropic's Messages API (tool_use / tool_result blocks) the way the real ones do (a request the real
API would refuse gets HTTP 400 here too). A whole iteration: prototype commands in the jail that work,
escape attempts that must fail (the test split, the network, writing outside the scratch folder,
another iteration's scratch, the project checkout), a try_candidate charged apart, and a submission
that lands in the archive as a valid candidate; the measured proposer in the record and the lineage."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.http_fake import send_json
from tests.train.test_meta_harness import FAST, MATH, tool_shy_math_model
from whale_train.meta_harness import HarnessSearch, MetaHarnessConfig
from whale_train.meta_harness.lineage import lineage_report

REPO = Path(__file__).resolve().parents[2]
GOOD = (
    "from harnesses.math.h0 import MathH0\n\n\nclass NoTool(MathH0):\n"
    "    def build_prompt(self, text, info):\n"
    '        return text + "\\nPut the final answer in \\\\boxed{}."\n'
)
PARSER = (
    "import glob, json, re\n"
    "rows = [json.loads(l) for f in glob.glob('/archive/h0/traces/*.jsonl') for l in open(f)]\n"
    "calls = [c['completion'] for r in rows for c in r['calls']]\n"
    "boxed = [c for c in calls if re.search(r'boxed', c)]\n"
    "print('episodes', len(rows), 'completions', len(calls), 'boxed', len(boxed))\n"
    "print('failures', sorted({r['failure'] for r in rows}))\n"
)


def check_anthropic_turns(messages: list[dict], results: dict[str, str]) -> str | None:
    """What Anthropic's Messages API refuses in a conversation (its error message), else None: roles out of
    turn, or a user message that does not open with a tool_result block for each tool_use of the message
    before it. The tool results, as text, are kept in ``results`` by tool_use id."""
    pending: set[str] = set()
    for i, m in enumerate(messages):
        if m["role"] != ("user" if i % 2 == 0 else "assistant"):
            return "roles must alternate between user and assistant, starting with user"
        blocks = m["content"] if isinstance(m["content"], list) else [{"type": "text", "text": m["content"]}]
        if m["role"] == "user":
            got = [b for b in blocks if b["type"] == "tool_result"]
            if {b["tool_use_id"] for b in got} != pending:
                return "tool_use ids were found without tool_result blocks immediately after"
            if blocks[: len(got)] != got:
                return "tool_result blocks must come first in the user message"
            for b in got:
                c = b.get("content")
                results[b["tool_use_id"]] = (
                    c if isinstance(c, str) else "".join(x.get("text", "") for x in c or [])
                )
            pending = set()
        else:
            pending = {b["id"] for b in blocks if b["type"] == "tool_use"}
    return None


def anthropic_blocks(turn: list | str, lead: str, n: int) -> list[dict]:
    """A scripted turn as Messages API content blocks: a string is one text block; a list of (tool name,
    input) pairs is the text ``lead``, then a tool_use block each, with ids ``toolu_<n>_<i>``."""
    if isinstance(turn, str):
        return [{"type": "text", "text": turn}]
    uses = [
        {"type": "tool_use", "id": f"toolu_{n}_{i}", "name": name, "input": a}
        for i, (name, a) in enumerate(turn)
    ]
    return [{"type": "text", "text": lead}, *uses]


class AgentServer:
    """A scripted chat server. ``api``: ``openai`` (POST /v1/chat/completions) or ``anthropic`` (POST
    /v1/messages). Each request gets the next scripted turn: a list of (tool name, arguments) calls, or
    a string (a text-only reply). The tool results the client sends back are kept by call id."""

    def __init__(self, api: str, key: str = "sk-test"):
        self.api, self.key = api, key
        self.script: list = []
        self.requests: list[dict] = []
        self.results: dict[str, str] = {}
        self.refusals: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status, answer = outer.answer(
                    self.path, {k.lower(): v for k, v in self.headers.items()}, body
                )
                send_json(self, status, answer)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        base = f"http://127.0.0.1:{self.port}"
        self.url = base + "/v1" if api == "openai" else base
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()

    # --------------------------------------------------------------- the two wire formats

    def answer(self, path: str, headers: dict, body: dict) -> tuple[int, dict]:
        want = "/v1/chat/completions" if self.api == "openai" else "/v1/messages"
        if path != want:
            return 404, {"error": {"message": f"no route {path}"}}
        check = self.check_openai if self.api == "openai" else self.check_anthropic
        problem = check(headers, body)
        if problem:
            self.refusals.append(problem)
            return 400, {"error": {"type": "invalid_request_error", "message": problem}}
        self.requests.append(body)
        n = len(self.requests)
        turn = self.script[n - 1] if n <= len(self.script) else "I have nothing more to add."
        usage = (1000 * n, 50)
        if self.api == "openai":
            message: dict = {"role": "assistant", "content": turn if isinstance(turn, str) else None}
            if not isinstance(turn, str):
                message["tool_calls"] = [
                    {
                        "id": f"call_{n}_{i}",
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(a)},
                    }
                    for i, (name, a) in enumerate(turn)
                ]
            return 200, {
                "id": f"chatcmpl-{n}",
                "object": "chat.completion",
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
                "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1]},
            }
        content = anthropic_blocks(turn, "Let me look.", n)
        return 200, {
            "id": f"msg_{n}",
            "type": "message",
            "role": "assistant",
            "content": content,
            "stop_reason": "end_turn" if isinstance(turn, str) else "tool_use",
            "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
        }

    def check_openai(self, headers: dict, body: dict) -> str | None:
        if headers.get("authorization") != f"Bearer {self.key}":
            return "bad key"
        msgs = body.get("messages") or []
        if not msgs or msgs[0]["role"] != "system":
            return "the first message must be the system prompt here"
        for t in body.get("tools") or []:
            if t.get("type") != "function" or "parameters" not in t.get("function", {}):
                return "tools[].function.parameters is required"
        open_ids: set[str] = set()
        for m in msgs:
            if m["role"] == "tool":
                if m.get("tool_call_id") not in open_ids:
                    return "messages with role 'tool' must be a response to a preceding message with 'tool_calls'"
                open_ids.discard(m["tool_call_id"])
                self.results[m["tool_call_id"]] = m["content"]
            else:
                if open_ids:
                    return "an assistant message with 'tool_calls' must be followed by tool messages"
                open_ids = {c["id"] for c in m.get("tool_calls") or []}
        return None

    def check_anthropic(self, headers: dict, body: dict) -> str | None:
        if headers.get("x-api-key") != self.key or not headers.get("anthropic-version"):
            return "x-api-key and anthropic-version headers are required"
        if not isinstance(body.get("max_tokens"), int) or not isinstance(body.get("system"), str):
            return "max_tokens and a top-level system are required"
        for t in body.get("tools") or []:
            if set(t) != {"name", "description", "input_schema"}:
                return f"tools: unexpected fields {sorted(t)}"
        return check_anthropic_turns(body.get("messages") or [], self.results)

    def result(self, n: int, i: int = 0) -> str:
        """What the client answered to call ``i`` of scripted turn ``n`` (1-based)."""
        return self.results[f"call_{n}_{i}" if self.api == "openai" else f"toolu_{n}_{i}"]


def first_iteration(config: MetaHarnessConfig, folder: Path, server, api_key: str | None = None):
    """The report of a search's first iteration on the math env against ``server`` (closed afterwards);
    ``api_key`` given to the proposer when set."""
    try:
        search = HarnessSearch(config, folder, tool_shy_math_model(), MATH)
        if api_key is not None:
            search.proposer.api_key = api_key
        search.rescore()
        return search.iterate()
    finally:
        server.close()


def agent_config(server: AgentServer, **kw) -> MetaHarnessConfig:
    return MetaHarnessConfig(
        **{**FAST, "candidates": 1},
        proposer="agent",
        llm_api=server.api,
        llm_base_url=server.url,
        llm_model="scripted-agent",
        llm_api_key_env="WHALE_TEST_AGENT_KEY",
        llm_price_prompt=3.0,
        llm_price_completion=15.0,
        agent_run_seconds=20.0,
        agent_try_tasks=2,
        agent_try_budget=4,
        **kw,
    )


def escape_attempts(server: AgentServer, archive: Path, out: Path) -> list[tuple[str, dict]]:
    """Commands that must fail in the jail (each paired with what proves it did)."""
    connect = f"socket.create_connection(('127.0.0.1', {server.port}), timeout=3)"
    net = f"python -c \"import socket; {connect}; print('CONNECTED')\""
    return [
        ("run", {"command": f"cat {out}/test/answers.json; echo rc=$?"}),  # the test split's results
        (
            "run",
            {
                "command": "python -c \"import gymnasium as gym, whale_envs; gym.make('whale/Math-v0', split='test')\""
            },
        ),
        (
            "run",
            {"command": f"ls {REPO / 'whale_envs' / 'data'} /sdk/whale_envs/data; ls {REPO}"},
        ),  # answers, checkout
        ("run", {"command": net}),  # the network (the very server the proposer talks to)
        ("run", {"command": f"touch /archive/h0/pwned {archive}/h0/pwned; echo hi > /usr/pwned; echo rc=$?"}),
    ]


@pytest.fixture
def openai_server():
    s = AgentServer("openai")
    yield s
    s.close()


def test_agent_iteration_on_the_openai_api_prototypes_in_the_jail_and_every_escape_fails(
    openai_server, tmp_path, monkeypatch
):
    server = openai_server
    monkeypatch.setenv("WHALE_TEST_AGENT_KEY", server.key)
    out = tmp_path / "out"
    archive = out / "archive"
    (out / "test").mkdir(parents=True)
    (out / "test" / "answers.json").write_text('{"secret": 42}')
    search = HarnessSearch(agent_config(server), archive, tool_shy_math_model(), MATH)
    search.rescore()
    server.script = [
        [("list_files", {"path": "."}), ("read_file", {"path": "h0/harness.py"})],  # 1
        [("run", {"command": f"cat > parse.py <<'EOF'\n{PARSER}EOF\npython parse.py"})],  # 2: a prototype
        escape_attempts(server, archive, out),  # 3
        [
            ("run", {"command": "echo 'iteration 1 scratch' > mine.txt; echo tried NoTool > NOTES.md; ls"})
        ],  # 4
        [("try_candidate", {"source": GOOD, "n": 2})],  # 5
        [("validate_candidate", {"source": GOOD})],  # 6
        [
            (
                "submit_candidate",
                {"source": GOOD, "hypothesis": "the tool offer distracts", "axis": "context"},
            )
        ],  # 7
        # iteration 2: the last iteration's scratch is gone, its notes are in the archive
        [
            (
                "run",
                {"command": "cat mine.txt /sandbox/scratch/mine.txt; ls; cat /archive/search/notes/001.md"},
            )
        ],  # 8
        [
            (
                "submit_candidate",
                {"source": GOOD.replace("NoTool", "NoTool2"), "hypothesis": "again", "axis": "x"},
            )
        ],
    ]
    report = search.iterate()
    assert not server.refusals

    # the instructions: the proposer skill, built from the domain
    system = server.requests[0]["messages"][0]["content"]
    for rule in ("One mechanism per candidate", "No dataset-specific hints", "Prototype before writing"):
        assert rule in system
    assert "whale/Math-v0" in system and "NOTES.md" in system
    assert {t["function"]["name"] for t in server.requests[0]["tools"]} == {
        "list_files", "read_file", "grep", "run", "try_candidate", "validate_candidate", "submit_candidate",
    }  # fmt: skip

    # a prototype that works: a script written in the scratch folder, run on the archive's real traces
    assert "class MathH0" in server.result(1, 1)
    proto = server.result(2)
    assert proto.startswith("episodes 16 completions") and "failures" in proto and "exit status" not in proto

    # every escape attempt fails
    test_split, test_env, answers, network, write = (server.result(3, i) for i in range(5))
    assert "42" not in test_split and "No such file" in test_split and "rc=1" in test_split
    assert "not available in the proposer's jail" in test_env
    assert "gsm8k" not in answers and "harnesses" not in answers and "__init__.py" in answers
    assert "CONNECTED" not in network and "Network is unreachable" in network
    assert write.count("Read-only file system") == 3 and "rc=2" in write
    assert not (archive / "h0" / "pwned").exists()

    # try_candidate: train tasks under the current model, traces in the scratch folder, charged apart
    tried = server.result(5)
    assert "train episodes solved; traces in your scratch folder: tries/try-1.jsonl" in tried
    assert "ok: passes validation" in server.result(6)

    # the submission landed as a valid, scored candidate
    assert [c.id for c in report.candidates] == ["i001-c0"] and report.candidates[0].status == "valid"
    meta = search.archive.get("i001-c0").meta
    assert meta["proposer"] == "agent" and meta["summary"] == "context"
    assert meta["components"] == {"model": "scripted-agent", "api": "openai", "axis": "context"}
    assert report.rollouts == 16 and report.proposer_rollouts == 2

    # the measured proposer: in the record, the tool log and the notes kept in the archive
    usage = report.proposer_usage
    assert usage["requests"] == 7 and usage["tool_calls"] == 12 and usage["runs"] == 7
    assert usage["runs_failed"] == 2 and usage["tries"] == 1 and usage["try_rollouts"] == 2
    assert usage["prompt_tokens"] == 1000 * (1 + 2 + 3 + 4 + 5 + 6 + 7) and usage["completion_tokens"] == 350
    assert usage["cost_usd"] == pytest.approx((28_000 * 3.0 + 350 * 15.0) / 1e6)
    assert usage["wall_seconds"] > 0
    record = json.loads((archive / "search" / "iterations" / "001.json").read_text())
    assert record["proposer_rollouts"] == 2 and record["proposer_usage"]["runs"] == 7
    log = [json.loads(x) for x in (archive / "search" / "proposer" / "001.jsonl").read_text().splitlines()]
    assert [e["tool"] for e in log].count("run") == 7 and "Read-only file system" in log[7]["result"]
    assert (archive / "search" / "notes" / "001.md").read_text().strip() == "tried NoTool"

    # iteration 2: a fresh scratch folder; the notes of iteration 1 readable
    report2 = search.iterate()
    second = server.result(8)
    assert "iteration 1 scratch" not in second and "No such file" in second and "tried NoTool" in second
    assert report2.candidates[0].id == "i002-c0"

    text = lineage_report(archive)
    assert "Proposer (agent): " in text and "prototype runs" in text and "2 try rollouts" in text


def test_agent_on_the_anthropic_api_through_whale_search(tmp_path, monkeypatch):
    """``whale search --proposer agent --llm-api anthropic``: tool_use/tool_result blocks, x-api-key."""
    from whale_train.cli import common, main

    server = AgentServer("anthropic", key="sk-ant-test")
    monkeypatch.setenv("ANTHROPIC_API_KEY", server.key)
    monkeypatch.setattr(common, "load_llm", lambda args: tool_shy_math_model())
    out = tmp_path / "out"
    server.script = [
        [
            ("grep", {"pattern": "boxed", "path": "h0/harness.py"}),
            ("run", {"command": "python -c 'print(6*7)'"}),
        ],
        [("run", {"command": "ls /archive; touch /archive/x; echo rc=$?"})],
        "I will now write the candidate.",  # a text-only turn: the client nudges, the API sees alternation
        [("submit_candidate", {"source": GOOD, "hypothesis": "no tool offer", "axis": "context"})],
    ]
    try:
        argv = ["search", "--env", MATH, "--iterations", "1", "--out", str(out), "--proposer", "agent"]
        argv += ["--llm-api", "anthropic", "--llm-base-url", server.url, "--llm-model", "claude-scripted"]
        argv += ["--harness-tasks", "16", "--candidates", "1", "--set", "check_tasks=4", "--test-limit", "4"]
        assert main(argv) == 0
    finally:
        server.close()
    assert not server.refusals and len(server.requests) == 4
    assert (
        server.requests[0]["model"] == "claude-scripted" and "One mechanism" in server.requests[0]["system"]
    )
    assert server.result(1, 1).strip() == "42"
    assert "h0" in server.result(2) and "Read-only file system" in server.result(2)
    record = json.loads((out / "archive" / "search" / "iterations" / "001.json").read_text())
    assert record["candidates"][0]["status"] == "valid" and record["proposer_usage"]["runs"] == 2
    assert record["proposer_usage"]["requests"] == 4 and record["proposer_rollouts"] == 0
    assert "Proposer (agent): " in (out / "lineage.md").read_text()


def test_agent_reports_a_server_error_as_a_proposer_failure(tmp_path, monkeypatch):
    server = AgentServer("anthropic", key="right")
    monkeypatch.setenv("WHALE_TEST_AGENT_KEY", "wrong")
    report = first_iteration(agent_config(server), tmp_path / "a", server)
    assert report.candidates == [] and "HTTP 400" in report.proposer_error
    assert "x-api-key" in report.proposer_error


@pytest.mark.slow
def test_try_candidate_rollouts_are_charged_to_the_trainers_ledger_apart(
    openai_server, tmp_path, monkeypatch
):
    """Under ``whale train`` the tries count against the budget and the ledger shows them apart."""
    from tests.train.test_trainer import MODEL, ledger, smoke, units
    from whale_train.trainer import Run

    server = openai_server
    monkeypatch.setenv("WHALE_TEST_AGENT_KEY", server.key)
    one = [
        [("try_candidate", {"source": GOOD, "n": 2})],
        [("submit_candidate", {"source": GOOD, "hypothesis": "no tool offer", "axis": "context"})],
    ]
    server.script = one * 4
    search = {
        "proposer": "agent",
        "llm_base_url": server.url,
        "llm_model": "scripted-agent",
        "llm_api_key_env": "WHALE_TEST_AGENT_KEY",
        "agent_try_tasks": 2,
        "agent_try_budget": 2,
    }
    config = smoke(MODEL, method="harness-only", budget_rollouts=20, search=search)
    assert config.harness_iteration_cost == 4 * 1 * 2 + 2  # the tries are planned for
    Run(config, tmp_path, log=lambda *_: None).run()
    iterations = [u for u in units(ledger(tmp_path)) if u["signals"].get("kind") == "iteration"]
    assert iterations and all(u["signals"]["proposer_rollouts"] == 2 for u in iterations)
    for u in iterations:  # the unit's rollouts: its scoring (on the record) plus the tries
        n = int(u["signals"]["candidates"][0]["id"][1:4])
        record = json.loads((tmp_path / "archive" / "search" / "iterations" / f"{n:03d}.json").read_text())
        assert u["rollouts"] == record["rollouts"] + 2 and record["proposer_rollouts"] == 2
    assert sum(u["rollouts"] for u in units(ledger(tmp_path))) <= 20


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "proposer 'agent' needs llm_model"),
        (["--llm-model", "m"], "proposer 'agent' with llm_api openai needs llm_base_url"),
        (["--llm-model", "m", "--set", "llm_api=gemini"], "unknown llm_api 'gemini'"),
    ],
)
def test_agent_settings_errors_are_one_line(extra, message, tmp_path, capsys):
    from whale_train.cli import main

    argv = ["search", "--env", MATH, "--iterations", "1", "--out", str(tmp_path), "--proposer", "agent"]
    assert main(argv + extra) != 0
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
