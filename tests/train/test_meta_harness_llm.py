"""The LLM proposer against a scripted OpenAI-compatible server started here: it reads the archive
through the tools (and is refused outside it), prototypes, submits one bad and one good candidate; the
bad one is recorded as failed with its reason, the good one scored, usage and cost recorded."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.http_fake import send_json
from tests.train.test_meta_harness import FAST, MATH, tool_shy_math_model
from whale_train.meta_harness import HarnessSearch, MetaHarnessConfig

BAD = "import os\nfrom harnesses.base import Harness\n\n\nclass Sneaky(Harness):\n    pass\n"
GOOD = (
    "from harnesses.math.h0 import MathH0\n\n\nclass NoTool(MathH0):\n"
    "    def build_prompt(self, text, info):\n"
    '        return text + "\\nPut the final answer in \\\\boxed{}."\n'
)


def tool_call(i: int, name: str, **args) -> dict:
    return {"id": f"call{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


SCRIPT = [
    {"tool_calls": [tool_call(1, "list_files", path=".")]},
    {
        "tool_calls": [
            tool_call(2, "read_file", path="h0/harness.py"),
            tool_call(3, "grep", pattern="out_of_turns"),
        ]
    },
    {"tool_calls": [tool_call(4, "read_file", path="../secret.txt")]},
    {"tool_calls": [tool_call(5, "validate_candidate", source=BAD)]},
    {"tool_calls": [tool_call(6, "submit_candidate", source=BAD, hypothesis="read files with os")]},
    {"content": f"Here it is.\nHypothesis: the tool offer distracts the model.\n```python\n{GOOD}```\n"},
]


class Server:
    """An OpenAI-compatible /chat/completions endpoint that answers from a script, recording requests."""

    def __init__(self, script: list[dict], status: int = 200):
        self.script, self.status, self.requests, self.headers = script, status, [], []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                outer.headers.append(dict(self.headers))
                n = len(outer.requests)
                message = {
                    "role": "assistant",
                    "content": None,
                    **outer.script[min(n, len(outer.script)) - 1],
                }
                reply = {
                    "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
                    "usage": {"prompt_tokens": 100 * n, "completion_tokens": 10},
                }
                send_json(self, outer.status, reply)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


@pytest.fixture
def server():
    s = Server(SCRIPT)
    yield s
    s.close()


def config(url: str, **kw) -> MetaHarnessConfig:
    return MetaHarnessConfig(
        **{**FAST, "candidates": 2},
        proposer="llm",
        llm_base_url=url,
        llm_model="scripted-proposer",
        llm_api_key_env="WHALE_TEST_PROPOSER_KEY",
        llm_price_prompt=2.0,
        llm_price_completion=8.0,
        **kw,
    )


def test_llm_proposer_reads_the_archive_through_tools_and_failed_candidates_keep_their_reason(
    server, tmp_path, monkeypatch
):
    monkeypatch.setenv("WHALE_TEST_PROPOSER_KEY", "sk-test")
    (tmp_path / "secret.txt").write_text("test split answers")
    search = HarnessSearch(config(server.url), tmp_path / "archive", tool_shy_math_model(), MATH)
    search.rescore()
    report = search.iterate()

    # the conversation: instructions, tools, and what each tool returned
    first = server.requests[0]
    assert first["model"] == "scripted-proposer" and server.headers[0]["Authorization"] == "Bearer sk-test"
    assert {t["function"]["name"] for t in first["tools"]} == {
        "list_files",
        "read_file",
        "grep",
        "validate_candidate",
        "submit_candidate",
    }
    system = first["messages"][0]["content"]
    for rule in ("Prefer changing a mechanism", "No dataset-specific hints", "Prototype before proposing"):
        assert rule in system
    assert "Propose 2 candidate(s)" in first["messages"][1]["content"]

    def tool_results(i):
        return [m["content"] for m in server.requests[i]["messages"] if m["role"] == "tool"]

    assert "h0/" in tool_results(1)[0] and "search/" in tool_results(1)[0]
    assert "class MathH0" in tool_results(2)[1] and "h0/evals/0.json" in tool_results(2)[2]
    assert "outside the archive" in tool_results(3)[3] and "test split answers" not in json.dumps(
        server.requests
    )
    assert tool_results(4)[4].startswith("rejected: validation:") and "'os'" in tool_results(4)[4]
    assert tool_results(5)[5].startswith("recorded (1 of 2)")
    assert len(server.requests) == 6

    # the candidates: the bad one failed with its reason, the good one was scored and accepted
    bad, good = report.candidates
    assert bad.id == "i001-c0" and bad.status == "invalid" and bad.proposer == "llm"
    assert bad.reason.startswith("validation:") and "import of 'os' is not allowed" in bad.reason
    assert bad.hypothesis == "read files with os" and bad.mean is None and bad.rollouts == 0
    assert (
        good.status == "valid"
        and good.mean == 1.0
        and good.hypothesis == "the tool offer distracts the model."
    )
    assert report.accepted and search.incumbent_id == "i001-c1"
    assert search.archive.get("i001-c1").source == GOOD and search.archive.get("i001-c1").meta["parents"] == [
        "h0"
    ]

    # usage and cost, per candidate and per iteration
    u0 = search.archive.get("i001-c0").meta["proposer_usage"]
    u1 = search.archive.get("i001-c1").meta["proposer_usage"]
    assert u0 == {
        "requests": 5,
        "prompt_tokens": 1500,
        "completion_tokens": 50,
        "cost_usd": pytest.approx(0.0034),
    }
    assert u1["requests"] == 1 and u1["prompt_tokens"] == 600
    assert report.proposer_usage["requests"] == 6 and report.proposer_usage["prompt_tokens"] == 2100
    assert report.proposer_usage["cost_usd"] == pytest.approx((2100 * 2.0 + 60 * 8.0) / 1e6)
    stored = json.loads((tmp_path / "archive" / "search" / "iterations" / "001.json").read_text())
    assert stored["proposer_usage"]["completion_tokens"] == 60


@pytest.mark.slow
def test_a_proposer_that_submits_nothing_or_fails_leaves_an_iteration_without_candidates(tmp_path):
    chatty = Server([{"content": "I would rather talk about the weather."}])
    broken = Server([{"content": "x"}], status=400)
    try:
        search = HarnessSearch(
            config(chatty.url, llm_max_turns=3), tmp_path / "a", tool_shy_math_model(), MATH
        )
        report = search.iterate()
        assert report.candidates == [] and not report.accepted and len(chatty.requests) == 3
        assert "submitted no candidate in 3 turns" in report.proposer_error
        assert "call submit_candidate" in chatty.requests[-1]["messages"][-1]["content"]
        search = HarnessSearch(config(broken.url), tmp_path / "b", tool_shy_math_model(), MATH)
        report = search.iterate()
        assert report.candidates == [] and "HTTP 400" in report.proposer_error and len(broken.requests) == 1
    finally:
        chatty.close()
        broken.close()
