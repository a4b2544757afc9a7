"""The shipped CPU default model: it is in the package, loads offline, its checksums match, its card's
calibration holds and is reproduced by `whale eval`, and every command that takes --model defaults to it."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from whale_train import pretrain as pt
from whale_train.cli import build_parser, main
from whale_train.llm import SHIPPED_MODEL, default_model, load_llm

ROOT = Path(__file__).resolve().parents[2]
INFO = json.loads((SHIPPED_MODEL / "whale_pretrain.json").read_text())
CAL = INFO["calibration"]
H0 = {"chess": "chess_puzzles/h0", "math": "math/h0", "search": "search_qa/h0"}


def test_shipped_model_loads_offline_and_its_checksums_match(monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert set(INFO["sha256"]) == set(pt.HASHED_FILES)
    for name, digest in INFO["sha256"].items():
        assert pt.sha256(SHIPPED_MODEL / name) == digest, f"{name} differs from the card: regenerate it"
    model = AutoModelForCausalLM.from_pretrained(SHIPPED_MODEL)
    tok = AutoTokenizer.from_pretrained(SHIPPED_MODEL)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == INFO["model"]["parameters"]
    assert tok.chat_template and len(tok) == INFO["model"]["vocab_size"]
    assert default_model() == str(SHIPPED_MODEL)


def test_shipped_model_answers_in_the_trained_format():
    from whale_train.llm.base import Request, SamplingParams
    from whale_train.llm.hf import TransformersLLM

    llm = TransformersLLM(str(SHIPPED_MODEL))
    prompt = [{"role": "user", "content": "Problem: What is 2 + 3?\nPut the final answer in \\boxed{}."}]
    (out,) = llm.complete([Request(prompt, SamplingParams(temperature=0.0, max_tokens=16), seed=0)])
    assert out.text.startswith("\\boxed{") and out.finish_reason == "stop"


def test_the_card_is_docs_model_card_and_states_the_recipe():
    card = (SHIPPED_MODEL / "README.md").read_text()
    assert (ROOT / "docs" / "MODEL_CARD.md").read_text() == card
    assert card == pt.render_card(INFO)
    assert (
        INFO["command"].startswith("whale pretrain") and f"--seed {INFO['config']['seed']}" in INFO["command"]
    )
    assert INFO["config"]["size"] == "tiny" and not INFO["training"]["interrupted"]


def test_the_package_ships_the_model_files():
    setup = (ROOT / "setup.cfg").read_text()
    assert "whale_train = models/*/*" in setup
    for name in ("config.json", "model.safetensors", "tokenizer.json", "README.md", "whale_pretrain.json"):
        assert (SHIPPED_MODEL / name).is_file()
    assert (SHIPPED_MODEL / "model.safetensors").stat().st_size < 8_000_000


def test_card_calibration_h0_in_band_in_every_domain():
    for h0 in H0.values():
        base = CAL[h0]
        assert base["tasks"] >= 200 and base["k"] == 8
        assert 0.05 <= base["mean"] <= 0.50, f"{h0}: {base['mean']:.3f} outside 5-50%"


def _z(name: str, h0: str) -> float:
    return (CAL[name]["mean"] - CAL[h0]["mean"]) / math.hypot(CAL[name]["se"], CAL[h0]["se"])


@pytest.mark.parametrize("domain", ["chess", "math", "search"])
def test_card_a_stronger_harness_beats_h0_beyond_the_noise(domain):
    h0, *others = pt.EVAL_HARNESSES[domain]
    assert max(_z(name, h0) for name in others) > 2, f"{domain}: no shipped harness beats h0 by 2 SE"


def _commands_with_model(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found = {}
    for name, p in sub.choices.items():
        for action in p._actions:
            if "--model" in action.option_strings:
                found[name] = action
    return found


def test_every_command_that_takes_model_defaults_to_the_shipped_model(tmp_path):
    commands = _commands_with_model(build_parser())
    assert "eval" in commands
    for name, action in commands.items():
        assert action.default is None, f"whale {name} --model must default to None (the shipped model)"
    assert load_llm("transformers").name == str(SHIPPED_MODEL)  # what every command loads for None
    out = tmp_path / "eval"
    argv = [
        "eval",
        "--env",
        "whale/Math-v0",
        "--harness",
        "math/h0",
        "--limit",
        "2",
        "--k",
        "1",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    assert json.loads((out / "results.json").read_text())["model"] == str(SHIPPED_MODEL)


@pytest.mark.slow
@pytest.mark.parametrize("harness", list(H0.values()))
def test_card_numbers_are_reproduced_by_whale_eval(harness, tmp_path):
    card = CAL[harness]
    out = tmp_path / "eval"
    argv = ["eval", "--env", card["env"], "--harness", harness, "--split", "test", "--limit", "48"]
    assert main([*argv, "--k", "8", "--seed", "0", "--trusted", "--out", str(out)]) == 0
    small = json.loads((out / "results.json").read_text())
    assert small["tasks"] == 48 and small["model"] == str(SHIPPED_MODEL)
    bound = 2 * math.hypot(small["se"], card["se"])
    assert abs(small["mean"] - card["mean"]) <= bound, (small["mean"], card["mean"], bound)
