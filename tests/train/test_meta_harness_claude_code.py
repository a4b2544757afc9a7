"""``proposer: claude-code``: the real Claude Code CLI (``make install-claude-code``) driven end to end
against a scripted server that speaks Anthropic's Messages API the way the real one does: the CLI asks
for ``stream: true``, so answers are server-sent events (message_start, content_block_start/delta/stop
with text_delta and input_json_delta, message_delta, message_stop); a request the real API would refuse
(no key, no anthropic-version, roles out of turn, a tool_use without its tool_result) gets HTTP 400.

The CLI runs in the proposer's jail and reaches this server only through the relay: its Bash tool's
escape attempts (the test split, the answers, the checkout, this server's own port, another address, a
non-API path through the relay) fail, its Write tool writes the candidate, the search picks it up and
scores it as valid, and the usage lands in the iteration record."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.train.test_meta_harness import MATH, tool_shy_math_model
from tests.train.test_meta_harness_agent import anthropic_blocks, check_anthropic_turns, first_iteration
from whale_train.meta_harness import claude_code
from whale_train.meta_harness.lineage import lineage_report

REPO = Path(__file__).resolve().parents[2]
KEY = "sk-ant-scripted-key"
GOOD = (
    "from harnesses.math.h0 import MathH0\n\n\nclass NoTool(MathH0):\n"
    "    def build_prompt(self, text, info):\n"
    '        return text + "\\nPut the final answer in \\\\boxed{}."\n'
)
USAGE_IN, USAGE_OUT = 1200, 40  # per model request


class MessagesServer:
    """A scripted Messages API. ``script[n]`` answers the conversation's turn ``n`` (the number of
    assistant messages already in the request): a list of (tool name, input) tool_use blocks, or a
    string (a text reply that ends the turn). Requests without tools (the CLI's side questions) get a
    short text. Tool results the client sends back are kept by tool_use id."""

    def __init__(self):
        self.script: list = []
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.results: dict[str, str] = {}
        self.refusals: list[str] = []
        self.paths: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                outer.paths.append(self.path)
                outer.answer(self, {k.lower(): v for k, v in self.headers.items()}, body)

            def do_GET(self):
                outer.paths.append(self.path)
                self.send(404, {"type": "error", "error": {"type": "not_found_error", "message": self.path}})

            def send(self, status, body, sse=None):
                data = sse.encode() if sse is not None else json.dumps(body).encode()
                self.send_response(status)
                self.send_header(
                    "Content-Type", "text/event-stream" if sse is not None else "application/json"
                )
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()

    def answer(self, h, headers: dict, body: dict) -> None:
        path = h.path.split("?")[0]
        if path == "/v1/messages/count_tokens":
            return h.send(200, {"input_tokens": 100})
        if path != "/v1/messages":
            return h.send(404, {"type": "error", "error": {"type": "not_found_error", "message": path}})
        problem = self.check(headers, body)
        if problem:
            self.refusals.append(problem)
            return h.send(
                400, {"type": "error", "error": {"type": "invalid_request_error", "message": problem}}
            )
        self.requests.append(body)
        self.headers.append(headers)
        turn: list | str = "ok"
        if body.get("tools"):
            n = sum(m["role"] == "assistant" for m in body["messages"])
            turn = self.script[n] if n < len(self.script) else "Done."
        blocks = anthropic_blocks(turn, "Working.", len(self.requests))
        stop = "end_turn" if isinstance(turn, str) else "tool_use"
        message = {"id": f"msg_{len(self.requests)}", "type": "message", "role": "assistant"}
        message |= {"model": body["model"], "stop_sequence": None}
        if not body.get("stream"):
            usage = {"input_tokens": USAGE_IN, "output_tokens": USAGE_OUT}
            return h.send(200, message | {"content": blocks, "stop_reason": stop, "usage": usage})
        events = [
            ("message_start", {"message": message | {"content": [], "stop_reason": None, "usage": {"input_tokens": USAGE_IN, "output_tokens": 1}}}),
        ]  # fmt: skip
        for i, b in enumerate(blocks):
            if b["type"] == "text":
                events.append(
                    ("content_block_start", {"index": i, "content_block": {"type": "text", "text": ""}})
                )
                events.append(
                    ("content_block_delta", {"index": i, "delta": {"type": "text_delta", "text": b["text"]}})
                )
            else:
                start = {"type": "tool_use", "id": b["id"], "name": b["name"], "input": {}}
                events.append(("content_block_start", {"index": i, "content_block": start}))
                text = json.dumps(b["input"])
                for part in (text[: len(text) // 2], text[len(text) // 2 :]):  # the JSON arrives in pieces
                    events.append(
                        (
                            "content_block_delta",
                            {"index": i, "delta": {"type": "input_json_delta", "partial_json": part}},
                        )
                    )
            events.append(("content_block_stop", {"index": i}))
        events.append(
            (
                "message_delta",
                {
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": USAGE_OUT},
                },
            )
        )
        events.append(("message_stop", {}))  # fmt: skip
        h.send(200, None, "".join(f"event: {e}\ndata: {json.dumps({'type': e, **d})}\n\n" for e, d in events))

    def check(self, headers: dict, body: dict) -> str | None:
        if headers.get("x-api-key") != KEY or not headers.get("anthropic-version"):
            return "x-api-key and anthropic-version headers are required"
        if not isinstance(body.get("max_tokens"), int) or not body.get("model"):
            return "model and max_tokens are required"
        return check_anthropic_turns(body.get("messages") or [], self.results)

    def result(self, n: int, i: int) -> str:
        """What the CLI answered to tool_use ``i`` of the ``n``-th answered request (1-based)."""
        return self.results[f"toolu_{n}_{i}"]


def bash(command: str) -> tuple[str, dict]:
    return ("Bash", {"command": command, "description": "check"})


@pytest.fixture(scope="module")
def installed():
    """The pinned CLI, installed by ``make install-claude-code`` (``make test`` does it)."""
    node, cli = claude_code.find_cli()
    return node, cli


def test_claude_code_writes_a_candidate_in_the_jail_and_every_escape_fails(installed, tmp_path, monkeypatch):
    from whale_train.cli import common, main

    server = MessagesServer()
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.setattr(common, "load_llm", lambda args: tool_shy_math_model())
    out = tmp_path / "out"
    (out / "test").mkdir(parents=True)
    (out / "test" / "answers.json").write_text('{"secret": 42}')
    probe = "import socket\ntry:\n    socket.create_connection(({!r}, {}), timeout=3); print('CONNECTED')\nexcept OSError as e:\n    print('refused:', e)\n"  # fmt: skip
    relay_get = (
        "import os, urllib.request as u\ntry:\n    u.urlopen(os.environ['ANTHROPIC_BASE_URL'] + '/api/hello', timeout=10)\n"
        "except Exception as e:\n    print('relay:', e)\nprint('key:', os.environ['ANTHROPIC_API_KEY'])\n"
    )
    server.script = [
        [
            bash("ls /archive/h0 && python -c 'print(6*7)' && pwd && head -c 300 SKILL.md"),
            bash("python -c \"import gymnasium as gym, whale_envs; gym.make('whale/Math-v0', split='test')\" 2>&1 | tail -1"),
            bash(f"cat {out}/test/answers.json; ls {REPO / 'whale_envs'}; echo rc=$?"),
            ("Write", {"file_path": "/sandbox/scratch/p1.py", "content": probe.format("127.0.0.1", server.port)}),
            ("Write", {"file_path": "/sandbox/scratch/p2.py", "content": probe.format("10.11.12.13", 80)}),
            ("Write", {"file_path": "/sandbox/scratch/p3.py", "content": relay_get}),
        ],
        [
            bash("python p1.py; python p2.py; python p3.py"),
            bash(f"touch /archive/h0/pwned {out}/archive/h0/pwned; echo rc=$?"),
            bash("cat /archive/h0/no-such-file"),  # a command that fails: counted in runs_failed
        ],
        [
            ("Write", {"file_path": "/sandbox/scratch/candidates/1.py", "content": GOOD}),
            ("Write", {"file_path": "/sandbox/scratch/candidates/1.json", "content": json.dumps({"hypothesis": "the tool offer distracts", "axis": "context"})}),
            ("Write", {"file_path": "/sandbox/scratch/NOTES.md", "content": "tried NoTool\n"}),
        ],
        [bash("python -c \"from harnesses.loader import harness_from_source as h; h(open('candidates/1.py').read(), 'x')\" && echo rules-ok")],
        "The candidate and the notes are written.",
    ]  # fmt: skip
    try:
        argv = ["search", "--env", MATH, "--iterations", "1", "--out", str(out), "--proposer", "claude-code"]
        argv += ["--llm-base-url", server.url, "--llm-model", "claude-scripted", "--harness-tasks", "16"]
        argv += ["--candidates", "1", "--set", "check_tasks=4", "--test-limit", "4"]
        argv += ["--set", "llm_price_prompt=3", "--set", "llm_price_completion=15"]
        assert main(argv) == 0
    finally:
        server.close()
    assert not server.refusals, server.refusals
    agent = [(i, r) for i, r in enumerate(server.requests, 1) if r.get("tools")]
    assert len(agent) == 5 and all(r["stream"] is True for _, r in agent)  # the CLI streams
    assert {"Bash", "Write", "Read"} <= {t["name"] for t in agent[0][1]["tools"]}
    assert all(h["host"] == f"127.0.0.1:{server.port}" for h in server.headers)  # set by the relay
    n1, n2 = agent[0][0], agent[1][0]

    # the workspace: the archive read-only, SKILL.md (the agent proposer's skill) in the scratch folder
    listing = server.result(n1, 0)
    assert "harness.py" in listing and "42" in listing and "/sandbox/scratch" in listing
    assert "harness engineer running ONE iteration of Meta-Harness" in listing
    # the test split, the answers, the checkout: out of reach
    assert "not available in the proposer's jail" in server.result(n1, 1)
    blocked = server.result(n1, 2)
    assert "42" not in blocked and "No such file" in blocked and "rc=2" in blocked
    # the network: this server's own port and any other address unreachable; the relay forwards only
    # the API's paths; the key stays outside the jail
    net = server.result(n2, 0)
    assert "CONNECTED" not in net and net.count("refused:") == 2
    assert "Connection refused" in net and "Network is unreachable" in net
    assert "relay: HTTP Error 403" in net and "key: sk-ant-held-by-the-relay" in net and KEY not in net
    assert "/api/hello" not in server.paths
    write = server.result(n2, 1)
    assert write.count("Read-only file system") >= 1 and "rc=1" in write
    assert not (out / "archive" / "h0" / "pwned").exists()

    # the candidate landed as a valid, scored candidate; usage and the tool log in the record
    record = json.loads((out / "archive" / "search" / "iterations" / "001.json").read_text())
    assert record["proposer_error"] is None and record["candidates"][0]["status"] == "valid"
    meta = json.loads((out / "archive" / "i001-c0" / "meta.json").read_text())
    assert meta["proposer"] == "claude-code" and meta["summary"] == "context"
    assert (
        meta["hypothesis"] == "the tool offer distracts"
        and "class NoTool" in (out / "archive" / "i001-c0" / "harness.py").read_text()
    )
    usage = record["proposer_usage"]
    assert usage["requests"] == len(server.requests) == 5 and usage["turns"] >= 5  # the CLI counts its own
    assert usage["tool_calls"] == 13 and usage["tool_write"] == 6 and usage["tool_bash"] == usage["runs"] == 7
    assert usage["runs_failed"] == 1 and "No such file" in server.result(n2, 2)
    assert usage["relay_refused"] >= 1 and usage["wall_seconds"] > 0
    assert usage["prompt_tokens"] == 5 * USAGE_IN and usage["completion_tokens"] == 5 * USAGE_OUT
    assert server.result(agent[3][0], 0).strip() == "rules-ok"  # the rule check SKILL.md names works
    expected = (usage["prompt_tokens"] * 3 + usage["completion_tokens"] * 15) / 1e6
    assert usage["cost_usd"] == pytest.approx(expected, abs=1e-6) and usage["cli_cost_usd"] > 0
    assert (out / "archive" / "search" / "notes" / "001.md").read_text() == "tried NoTool\n"
    log = json.loads((out / "archive" / "search" / "proposer" / "001.jsonl").read_text())
    assert "GET /api/hello" in log["relay"]["refused"]
    assert "Proposer (agent): " in lineage_report(out / "archive")


def test_a_missing_cli_is_a_one_line_error(tmp_path, capsys):
    from whale_train.cli import main

    argv = ["search", "--env", MATH, "--iterations", "1", "--out", str(tmp_path), "--proposer", "claude-code"]
    assert main(argv + ["--set", f"claude_code_path={tmp_path / 'nowhere'}"]) != 0
    err = capsys.readouterr().err.strip()
    assert "the Claude Code CLI is not installed" in err and "make install-claude-code" in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "archive").exists()


def test_a_session_without_candidates_is_a_proposer_failure(installed, tmp_path, monkeypatch):
    """A CLI that ends without writing a candidate: the iteration records why and the search goes on."""
    from tests.train.test_meta_harness import FAST
    from whale_train.meta_harness import MetaHarnessConfig

    server = MessagesServer()
    server.script = ["I have no idea."]
    config = MetaHarnessConfig(
        **{**FAST, "candidates": 1}, proposer="claude-code", llm_base_url=server.url, llm_model="m"
    )
    report = first_iteration(config, tmp_path / "a", server, api_key=KEY)
    assert report.candidates == [] and "claude-code wrote no usable candidate" in report.proposer_error
    assert "candidates/1.py: not written" in report.proposer_error
    assert "(the CLI finished;" in report.proposer_error and len(server.requests) >= 1  # it did talk
