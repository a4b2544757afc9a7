"""The LLM backends: the transformers sampler (stop strings, token ids, scores, seeds) and the
OpenAI-compatible client against a small local HTTP server (a boundary we do not own)."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import gymnasium as gym
import pytest
import torch

import whale_envs  # noqa: F401
from harnesses.loader import load_harness
from whale_train.llm import ModelNotFound, load_llm
from whale_train.llm.base import Request, SamplingParams, ScoreUnsupported
from whale_train.llm.hf import TransformersLLM
from whale_train.llm.openai_compat import OpenAIError, OpenAILLM
from whale_train.rollout import RolloutConfig, run_rollouts, summarize


@pytest.fixture(scope="module")
def llm(fresh_model_dir) -> TransformersLLM:
    return TransformersLLM(fresh_model_dir)


def test_completions_keep_the_exact_sampled_ids(llm):
    reqs = [Request("Problem: What is 3 + 5?", SamplingParams(max_tokens=12), seed=s) for s in range(4)]
    for req, c in zip(reqs, llm.complete(reqs), strict=True):
        assert c.prompt_ids == llm.encode(req.prompt)
        assert 1 <= len(c.completion_ids) <= 12 and c.completion_tokens == len(c.completion_ids)
        body = [t for t in c.completion_ids if t not in llm.eos_ids]
        assert c.text == llm.tokenizer.decode(body, skip_special_tokens=True)
        assert c.finish_reason == ("length" if len(c.completion_ids) == 12 else "stop")


def test_stop_strings_cut_the_text_but_not_the_ids(llm):
    # With temperature 0 the untrained model repeats itself; pick a stop string from its own output.
    free = llm.complete([Request("Legal moves:", SamplingParams(temperature=0, max_tokens=24))])[0]
    stop = free.text[4:6]
    assert stop.strip()
    cut = llm.complete([Request("Legal moves:", SamplingParams(temperature=0, max_tokens=24, stop=(stop,)))])[
        0
    ]
    assert cut.finish_reason == "stop" and stop not in cut.text and free.text.startswith(cut.text)
    assert stop in llm.tokenizer.decode(cut.completion_ids)  # the ids end with the token that completed it


def test_a_request_samples_the_same_whatever_its_batch(llm):
    req = Request("FEN: 8/8/8/8/8/8/8/8 w - - 0 1", SamplingParams(max_tokens=10), seed=42)
    alone = llm.complete([req])[0].completion_ids
    mates = [
        Request(f"other prompt {i} " * (i + 1), SamplingParams(max_tokens=5 + i), seed=i) for i in range(6)
    ]
    assert llm.complete(mates[:3] + [req] + mates[3:])[3].completion_ids == alone
    twins = [
        Request(req.prompt, req.params, seed=s) for s in (7, 8)
    ]  # same prompt: encoded once, then copied
    assert llm.complete([twins[0], req, twins[1]])[1].completion_ids == alone
    assert llm.complete([Request(req.prompt, req.params, seed=43)])[0].completion_ids != alone


def test_long_prompts_prefilled_in_slices_sample_the_same(llm, monkeypatch):
    """A batch of long prompts is prefilled a few rows at a time and the caches joined: the same
    completions as one prefill of the whole batch."""
    reqs = [
        Request(f"Legal moves: e2e4 g1f3 {i} " * (3 + i), SamplingParams(max_tokens=6 + i), seed=i)
        for i in range(7)
    ]
    whole = [c.completion_ids for c in llm.complete(reqs)]
    assert llm._joinable
    monkeypatch.setattr(llm, "prefill_tokens", 40)  # two or three rows per slice
    calls = []
    forward = llm.model.forward
    monkeypatch.setattr(
        llm.model, "forward", lambda *a, **k: calls.append(k["input_ids"].shape) or forward(*a, **k)
    )
    assert [c.completion_ids for c in llm.complete(reqs)] == whole
    assert sum(1 for shape in calls if shape[1] > 1) > 1  # the prompts went in more than one slice


def test_score_is_the_summed_log_likelihood(llm):
    prompt, conts = "Answer: ", ["<move>e2e4</move>", "\\boxed{7}"]
    scored = llm.score(prompt, conts)
    for cont, c in zip(conts, scored, strict=True):
        ids = llm.encode(prompt) + llm.encode(cont)
        with torch.no_grad():
            logp = torch.log_softmax(llm.model(torch.tensor([ids])).logits[0].float(), -1)
        n = len(llm.encode(prompt))
        manual = sum(float(logp[n + i - 1, tok]) for i, tok in enumerate(ids[n:]))
        assert c.logprob == pytest.approx(manual, abs=1e-3)
        assert c.completion_ids == llm.encode(cont)


def naive_scores(llm, prompt, conts) -> list[float]:
    """Every option on the full sequence, a log-softmax over the vocabulary at every position."""
    n = llm.encode(llm.render(prompt))
    out = []
    for cont in conts:
        ids = n + llm.encode(cont)
        with torch.no_grad():
            logp = torch.log_softmax(llm.model(torch.tensor([ids])).logits[0].float(), -1)
        out.append(sum(float(logp[len(n) + i - 1, tok]) for i, tok in enumerate(ids[len(n) :])))
    return out


SCORE_ITEMS = [
    ("2+3=", ["5", "5 6 7", "<move>e2e4</move>"]),
    ("A longer prompt, left-padded against the others: ", ["x", "\\boxed{12}"]),
    ([{"role": "user", "content": "hi there"}], ["a b", "c"]),
    # Options that share their first tokens (scored once, with the prompt), one alone (all but its
    # last token shared), one that is the start of another (nothing shared beyond it).
    ("Legal moves: e2e4 g1f3 a7a8q\n", ["<move>e2e4</move>", "<move>g1f3</move>", "<move>a7a8q</move>"]),
    ("One option: ", ["<move>e2e4</move>"]),
    ("Nested: ", ["<move>", "<move>e2e4</move>"]),
]


def test_shared_prefix_scoring_gives_the_naive_numbers(llm, monkeypatch):
    # Many prompts in one pass, the options of each packed after its cache (in chunks of prompts
    # when max_batch is small), or the caches repeated per option (in chunks of 2 rows: the prompt
    # cache is then copied per chunk), and on full sequences for a cache without row selection.
    want = [naive_scores(llm, p, c) for p, c in SCORE_ITEMS]
    assert llm.packable
    for max_batch, compactable, packable in (
        (128, True, True),
        (2, True, True),
        (2, True, False),
        (2, False, False),
    ):
        monkeypatch.setattr(llm, "max_batch_size", max_batch)
        monkeypatch.setattr(llm, "compactable", compactable)
        monkeypatch.setattr(llm, "packable", packable)
        got = llm.score_many(SCORE_ITEMS)
        for (prompt, conts), scored, ref in zip(SCORE_ITEMS, got, want, strict=True):
            assert [c.logprob for c in scored] == pytest.approx(ref, abs=1e-4)
            assert [c.completion_ids for c in scored] == [llm.encode(c) for c in conts]
            assert all(c.prompt_ids == llm.encode(llm.render(prompt)) for c in scored)


def test_chat_messages_go_through_the_chat_template(llm):
    c = llm.complete([Request([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=4))])[0]
    assert c.prompt_text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_missing_model_is_a_clear_error(tmp_path):
    with pytest.raises(ModelNotFound, match="no such directory"):
        load_llm("transformers", str(tmp_path / "nothing"))
    with pytest.raises(ValueError, match="needs base_url"):
        load_llm("openai", "m")


# ------------------------------------------------------------------------------- OpenAI-compatible


class _Server:
    """A scripted OpenAI-compatible server: plays the first legal move of any chess prompt."""

    def __init__(self, fail_first: int = 0):
        self.bodies: list[dict] = []
        self.fail_left = fail_first
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.bodies.append({"path": self.path, **body})
                if server.fail_left > 0:
                    server.fail_left -= 1
                    self.send_response(503)
                    self.end_headers()
                    return
                if self.path.endswith("/chat/completions"):
                    prompt = body["messages"][-1]["content"]
                    choice = {
                        "message": {"role": "assistant", "content": server.reply(prompt)},
                        "finish_reason": "stop",
                    }
                elif self.path.endswith("/completions"):
                    if body.get("echo"):
                        self.send_response(400)
                        self.end_headers()
                        return
                    choice = {"text": server.reply(body["prompt"]), "finish_reason": "stop"}
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                out = json.dumps(
                    {"choices": [choice], "usage": {"prompt_tokens": 11, "completion_tokens": 3}}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    @staticmethod
    def reply(prompt: str) -> str:
        moves = re.search(r"Legal moves: (\S+)", prompt)
        return f"<move>{moves.group(1)}</move> trailing" if moves else "hello"

    def close(self):
        self.httpd.shutdown()


@pytest.fixture
def server():
    s = _Server()
    yield s
    s.close()


def test_openai_backend_sends_params_and_reads_usage(server):
    llm = OpenAILLM(server.url, "tiny", api_key="")
    reqs = [
        Request(
            "Legal moves: e2e4 d2d4", SamplingParams(temperature=0.5, max_tokens=7, stop=("</move>",)), seed=5
        ),
        Request([{"role": "user", "content": "Legal moves: g1f3"}], SamplingParams(), seed=6),
    ]
    text, chat = llm.complete(reqs)
    assert text.text == "<move>e2e4" and chat.text == "<move>g1f3</move> trailing"
    assert text.prompt_tokens == 11 and text.completion_tokens == 3 and text.completion_ids is None
    first = next(b for b in server.bodies if b["path"].endswith("/v1/completions"))
    assert first["model"] == "tiny" and first["seed"] == 5 and first["max_tokens"] == 7
    assert first["temperature"] == 0.5 and first["stop"] == ["</move>"]
    assert any(b["path"].endswith("/chat/completions") and b["seed"] == 6 for b in server.bodies)


def test_openai_backend_retries_server_errors_and_reports_the_rest():
    flaky = _Server(fail_first=2)
    try:
        llm = OpenAILLM(flaky.url, "tiny", retries=3)
        assert llm.complete([Request("hi")])[0].text == "hello"
        with pytest.raises(ScoreUnsupported):
            llm.score("hi", ["a", "b"])
    finally:
        flaky.close()
    with pytest.raises(OpenAIError, match="cannot reach"):
        OpenAILLM("http://127.0.0.1:9/v1", "tiny", retries=1, timeout=2).complete([Request("hi")])


def test_a_rollout_through_the_openai_backend(server):
    ids = gym.make("whale/Chess-v0", tasks="lichess", split="test").unwrapped.task_ids[:8]
    trajs = run_rollouts(
        load_harness("chess_puzzles/h0"),
        "whale/Chess-v0",
        OpenAILLM(server.url, "tiny"),
        ids,
        env_kwargs={"tasks": "lichess", "split": "test"},
        config=RolloutConfig(k=1, concurrency=8),
    )
    assert len(trajs) == 8 and all(t.steps and t.calls for t in trajs)
    assert all(t.steps[0].error is None for t in trajs)  # every move the server played was legal
    assert summarize(trajs)["llm_calls"] >= 8
