"""Option scoring through the OpenAI-compatible backend: every option of one ``choose`` (and every option
of a batch's pending scores) in ONE ``/completions`` request as a list prompt, with the numbers the
one-request-per-option path gives; a server that refuses a list prompt is scored per option after a
one-line notice. Against ``FakeCompletions`` (tests/http_fake.py), which scores as vLLM's server does
and counts the requests it answers."""

from __future__ import annotations

import gymnasium as gym
import pytest

import whale_envs  # noqa: F401
from harnesses.loader import load_harness
from tests.http_fake import FakeCompletions, fake_logprob
from whale_train.llm import SHIPPED_MODEL
from whale_train.llm.base import ScoreUnsupported
from whale_train.llm.openai_compat import OpenAILLM
from whale_train.rollout import RolloutConfig, run_rollouts

PROMPT = [{"role": "user", "content": "Legal moves: e2e4 d2d4 g1f3. Your move?"}]
OPTIONS = ["<move>e2e4</move>", "<move>d2d4</move>", "<move>g1f3</move>", "<move>b1c3</move>"]


@pytest.fixture
def fake():
    s = FakeCompletions()
    yield s
    s.close()


@pytest.fixture
def refusing():
    s = FakeCompletions(refuse_lists=True)
    yield s
    s.close()


def expected_ids(llm: OpenAILLM, prompt, options) -> list[float]:
    """The fake's log-likelihood of each option's tokens after the prompt's, computed here."""
    assert llm.prompts is not None
    pids = llm.prompts.encode(llm.prompts.render(prompt))
    out = []
    for option in options:
        seq = pids + llm.prompts.encode(option)
        out.append(sum(fake_logprob(seq[i - 1], seq[i]) for i in range(len(pids), len(seq))))
    return out


def test_one_choose_is_one_request_with_the_per_option_numbers(fake):
    llm = OpenAILLM(fake.url, "tiny", tokenizer=SHIPPED_MODEL)
    got = llm.score(PROMPT, OPTIONS)
    assert fake.requests == 1 and fake.prompts == [len(OPTIONS)]
    assert [c.logprob for c in got] == pytest.approx(expected_ids(llm, PROMPT, OPTIONS))
    assert [c.text for c in got] == OPTIONS and all(c.prompt_ids == got[0].prompt_ids for c in got)
    per_option = OpenAILLM(fake.url, "tiny", tokenizer=SHIPPED_MODEL)
    per_option.list_prompts = False  # the path a server without list prompts gets
    again = per_option.score(PROMPT, OPTIONS)
    assert fake.requests == 1 + len(OPTIONS)
    assert [c.to_dict() for c in again] == [c.to_dict() for c in got]


def test_text_prompts_without_a_tokenizer_go_as_one_list_too(fake):
    llm = OpenAILLM(fake.url, "tiny")
    prompt = "Legal moves: e2e4 d2d4. Answer: "
    got = llm.score(prompt, ["e2e4", "d2d4", "d2d44"])
    assert fake.requests == 1
    for c in got:  # one token per character: the continuation's characters after the prompt's
        seq = prompt + c.text
        want = sum(fake_logprob(seq[i - 1], seq[i]) for i in range(len(prompt), len(seq)))
        assert c.logprob == pytest.approx(want)
        assert (c.prompt_tokens, c.completion_tokens) == (len(prompt), len(c.text))
    with pytest.raises(ScoreUnsupported, match="local tokenizer"):
        llm.score(PROMPT, OPTIONS)  # chat messages need the local tokenizer; nothing sent
    assert fake.requests == 1


def test_a_batch_of_chooses_is_one_request_and_a_cap_splits_it(fake):
    llm = OpenAILLM(fake.url, "tiny", tokenizer=SHIPPED_MODEL)
    items = [(PROMPT, OPTIONS), ("Legal moves: a2a3", ["a2a3", "a2a4"]), (PROMPT, OPTIONS[:1])]
    got = llm.score_many(items)
    assert fake.requests == 1 and fake.prompts == [7]
    for (prompt, options), mine in zip(items, got, strict=True):
        assert [c.logprob for c in mine] == pytest.approx(expected_ids(llm, prompt, options))
    capped = OpenAILLM(fake.url, "tiny", tokenizer=SHIPPED_MODEL, score_prompts_per_request=3)
    again = capped.score_many(items)
    assert sorted(fake.prompts[1:]) == [1, 3, 3]
    assert [[c.logprob for c in m] for m in again] == [[c.logprob for c in m] for m in got]
    assert capped.score_many([]) == [] and capped.score(PROMPT, []) == []


def test_a_server_that_refuses_list_prompts_is_scored_per_option_after_one_notice(refusing, fake, capsys):
    llm = OpenAILLM(refusing.url, "tiny", tokenizer=SHIPPED_MODEL)
    got = llm.score(PROMPT, OPTIONS)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "refused a list prompt" in err and "one request each" in err
    assert refusing.requests == len(OPTIONS) and not llm.list_prompts  # the refused list is not counted
    assert [c.logprob for c in got] == pytest.approx(expected_ids(llm, PROMPT, OPTIONS))
    llm.score(PROMPT, OPTIONS[:2])  # from now on per option, no list tried, no second notice
    assert refusing.requests == len(OPTIONS) + 2 and capsys.readouterr().err == ""
    # a server that scores nothing still raises ScoreUnsupported (no notice: nothing was scored)
    dead = OpenAILLM("http://127.0.0.1:9/v1", "tiny", tokenizer=SHIPPED_MODEL, retries=1, timeout=2)
    with pytest.raises(ScoreUnsupported):
        dead.score(PROMPT, OPTIONS)
    assert dead.list_prompts and capsys.readouterr().err == ""


def choices(trajs) -> list[list[str]]:
    return [[c.completion for c in t.calls if c.kind == "choice"] for t in trajs]


def test_chess_choose_rollouts_send_one_request_per_choose_or_fewer(fake):
    env = {"tasks": "lichess", "split": "test"}
    ids = gym.make("whale/Chess-v0", **env).unwrapped.task_ids[:6]

    def rollouts(concurrency: int):
        llm = OpenAILLM(fake.url, "tiny", tokenizer=SHIPPED_MODEL)
        return run_rollouts(
            load_harness("chess_puzzles/choose"), "whale/Chess-v0", llm, ids, env_kwargs=env,
            config=RolloutConfig(k=1, concurrency=concurrency),
        )  # fmt: skip

    one = rollouts(1)
    n_choose = sum(map(len, choices(one)))
    assert n_choose >= len(ids) and all(t.error is None for t in one)
    assert fake.requests == n_choose  # one request per choose (was one per legal move)
    assert sum(fake.prompts) == sum(c.params["options"] for t in one for c in t.calls if c.kind == "choice")
    before = fake.requests
    batched = rollouts(6)  # the chooses of episodes pending together: one request for all of them
    assert choices(batched) == choices(one)
    assert fake.requests - before <= n_choose
