"""`whale pretrain`: the warm-start text, its formats and seeding, batching, the schedule, and the command
end to end (a model `whale eval` can use, a card whose checksums match, Ctrl-C saving what is done)."""

from __future__ import annotations

import itertools
import json
import random
from fractions import Fraction

import gymnasium as gym
import pytest

import whale_envs  # noqa: F401
from harnesses.math.calculator import MathCalculator
from harnesses.math.vote import MathVote
from whale_envs.math.generators import FAMILIES
from whale_envs.math.problem import MathProblem
from whale_envs.splits import public_split_of
from whale_envs.tasks import ListSource, Task
from whale_train import pretrain as pt
from whale_train.cli import main

FAST = dict(tokenizer_docs=300, warmup_steps=2, batch_tokens=2048)


def first(n: int, **overrides) -> list[pt.Example]:
    return list(itertools.islice(pt.examples(pt.PretrainConfig(**overrides)), n))


# ------------------------------------------------------------------------------------------ the text


def test_math_expressions_compute_the_answer_for_every_family_and_level():
    for family, generate in FAMILIES.items():
        for level in range(1, 6):
            rng = random.Random(level)
            for _ in range(150):
                question, answer = generate(rng, level)
                expr = pt.math_expression(family, level, question)
                assert expr is not None, question
                if family == "fractions":  # Python prints a float: the value is right, the form is not
                    assert abs(eval(expr) - float(Fraction(answer))) < 1e-9
                else:
                    assert pt._python_value(expr) == answer, (question, expr)


def test_stream_covers_every_format_of_every_domain_and_uses_only_train_content():
    exs = first(1500)
    seen = {(e.domain, e.format) for e in exs}
    for domain, formats in (
        ("chess", pt.CHESS_FORMATS),
        ("math", pt.MATH_FORMATS),
        ("search", pt.SEARCH_FORMATS),
    ):
        assert {(domain, f) for f in formats} <= seen
    assert all(public_split_of(e.content) == "train" for e in exs)  # the unkeyed train share only
    assert {e.chat for e in exs} == {True, False}  # chat turns and plain text
    assert all(e.reply.strip() for e in exs)


def test_same_seed_same_stream_other_seed_other_stream():
    a, b, c = first(60), first(60), first(60, seed=1)
    assert a == b
    assert a != c


class _Recorder:
    """An LLM handle that records the prompts it gets and always answers ``reply``."""

    has_chat_template = True

    def __init__(self, reply: str):
        self.reply, self.prompts = reply, []

    def complete(self, prompt, **params):
        self.prompts.append(prompt[0]["content"])
        return self.reply

    def sample(self, prompt, n, **params):
        return [self.complete(prompt) for _ in range(n)]


class _Handle:
    def __init__(self, env):
        self.env = env

    def reset(self):
        return self.env.reset(options={"task_id": "t"})

    def step(self, action):
        return self.env.step(action)


def test_math_prompts_built_inline_by_harnesses_are_the_ones_trained_on():
    """math/calculator and math/vote write their prompt text themselves: the warm start must match it."""
    source = ListSource("t", [Task("t", MathProblem("What is 3 + 5?", "8"), {})])
    env = gym.make("whale/Math-v0", tasks=source).unwrapped
    obs, info = env.reset(options={"task_id": "t"})
    for harness, expected in (
        (MathCalculator(), pt.calculator_prompt("What is 3 + 5?", info)),
        (MathVote(), pt.vote_prompt(obs, info)),
    ):
        llm = _Recorder("\\boxed{8}")
        harness.run(_Handle(env), llm)
        assert llm.prompts[0] == expected


def test_chat_prompt_is_the_tokenizers_chat_template():
    from whale_train.tiny import train_tokenizer

    tok = train_tokenizer(["hello world 123"] * 10, vocab_size=300)
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": "Q?"}], tokenize=False, add_generation_prompt=True
    )
    assert rendered == pt.chat_prompt("Q?")


def test_same_seed_same_tokenizer():
    from whale_train.tiny import train_tokenizer

    config = pt.PretrainConfig(tokenizer_docs=200)
    a = train_tokenizer(pt.tokenizer_corpus(config)).get_vocab()
    b = train_tokenizer(pt.tokenizer_corpus(config)).get_vocab()
    assert a == b and len(a) == 1024


# ------------------------------------------------------------------------------------------ batches, schedule


def test_batches_pad_with_zero_weight_and_weigh_replies_fully():
    from whale_train.tiny import train_tokenizer

    config = pt.PretrainConfig(
        tokenizer_docs=200, batch_tokens=2048, prompt_loss_weights="chess=0.25,math=0.25,search=0.25"
    )
    tok = train_tokenizer(pt.tokenizer_corpus(config))
    for batch in itertools.islice(pt.batches(config, tok, chunk=64), 5):
        n, width = batch.input_ids.shape
        assert n * width <= config.batch_tokens or n == 1
        pad = batch.attention_mask == 0
        assert (batch.weights[pad] == 0).all() and (batch.input_ids[pad] == tok.pad_token_id).all()
        assert set(batch.weights[~pad].unique().tolist()) <= {0.0, 0.25, 1.0}
        assert batch.tokens == int(batch.attention_mask.sum())
        ends = {tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
        for row in range(n):  # every example ends with its end token, and that is learned in full
            last = int(batch.attention_mask[row].sum()) - 1
            assert int(batch.input_ids[row, last]) in ends and float(batch.weights[row, last]) == 1.0


def test_learning_rate_warms_up_then_decays_to_the_floor():
    config = pt.PretrainConfig(lr=1e-3, warmup_steps=10, min_lr_ratio=0.1)
    lrs = [pt.lr_at(s, 100, config) for s in range(1, 101)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:], strict=False))
    assert lrs[-1] == pytest.approx(1e-4)


def test_config_is_validated():
    with pytest.raises(ValueError, match="size"):
        pt.PretrainConfig(size="huge").validate()
    with pytest.raises(ValueError, match="mix"):
        pt.PretrainConfig(mix="chess=1,poker=1").validate()
    with pytest.raises(ValueError, match="chess_levels"):
        pt.PretrainConfig(chess_levels="3=1").validate()


# ------------------------------------------------------------------------------------------ the command


@pytest.mark.slow
def test_pretrain_command_writes_a_model_whale_eval_can_use(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "model"
    argv = [
        "pretrain",
        "--out",
        str(out),
        "--minutes",
        "0.1",
        "--seed",
        "3",
        "--eval-tasks",
        "2",
        "--eval-k",
        "1",
    ]
    argv += ["--tokenizer-docs", "300", "--warmup-steps", "2", "--batch-tokens", "2048"]
    assert main(argv) == 0
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert type(model).__name__ == "Qwen3ForCausalLM" and len(tok) == 1024 and tok.chat_template
    info = json.loads((out / "whale_pretrain.json").read_text())
    assert info["config"]["seed"] == 3 and info["training"]["steps"] >= 1
    assert info["sha256"] == {name: pt.sha256(out / name) for name in pt.HASHED_FILES}
    assert set(info["calibration"]) == {"chess_puzzles/h0", "math/h0", "search_qa/h0"}
    card = (out / "README.md").read_text()
    assert (
        "whale pretrain" in card
        and "Measured accuracy" in card
        and info["sha256"]["model.safetensors"] in card
    )

    results = tmp_path / "eval"
    argv = ["eval", "--env", "whale/Math-v0", "--harness", "math/h0", "--model", str(out), "--limit", "3"]
    assert main([*argv, "--k", "2", "--trusted", "--out", str(results)]) == 0
    assert json.loads((results / "results.json").read_text())["episodes"] == 6


@pytest.mark.slow
def test_same_seed_and_steps_give_the_same_weights(tmp_path):
    digests = []
    for name in ("a", "b"):
        config = pt.PretrainConfig(out=str(tmp_path / name), steps=3, **FAST)
        digests.append(pt.pretrain(config)["sha256"])
    assert digests[0] == digests[1]


@pytest.mark.slow
def test_ctrl_c_saves_what_is_done(tmp_path, monkeypatch):
    real = pt.batches

    def interrupted(config, tokenizer, chunk=1024):
        stream = real(config, tokenizer, chunk=64)
        yield next(stream)
        yield next(stream)
        raise KeyboardInterrupt

    monkeypatch.setattr(pt.training, "batches", interrupted)  # train() reads its own module's name
    info = pt.pretrain(pt.PretrainConfig(out=str(tmp_path / "m"), steps=50, eval_tasks=4, **FAST))
    assert info["training"]["interrupted"] and info["training"]["steps"] == 2
    assert info["calibration"] == {}  # an interrupted run is saved, not measured
    assert (tmp_path / "m" / "model.safetensors").exists()
    assert "interrupted" in (tmp_path / "m" / "README.md").read_text()
