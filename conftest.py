"""Shared fixtures: freshly initialized tiny Qwen3 and Qwen3.5 models (real tokenizer and model classes)."""

from __future__ import annotations

import os

import gymnasium as gym
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One split secret for every test, on every machine (whale_envs.splits): the same tasks land in the same
# splits everywhere, so a test may name a task of a split. Tests of the secret itself set their own.
os.environ["WHALE_SPLIT_SECRET"] = "whale-tests"


@pytest.fixture(scope="session")
def fresh_model_dir(tmp_path_factory) -> str:
    """An untrained ~1M-parameter Qwen3 model with a tokenizer trained on the three envs' observations."""
    import whale_envs
    from whale_train.tiny import build_model, save, train_tokenizer

    texts = []
    for env_id in (whale_envs.CHESS_ID, whale_envs.MATH_ID, whale_envs.SEARCH_QA_ID):
        env = gym.make(env_id)
        texts += [env.reset(seed=i)[0] for i in range(40)]
    texts += ["<move>e2e4</move> \\boxed{12} <search>x</search> <answer>y</answer> python: print(1)"] * 20
    tok = train_tokenizer(texts, vocab_size=1024)
    path = tmp_path_factory.mktemp("fresh-model")
    save(build_model(tok, "tiny", seed=0), tok, path)
    return str(path)


@pytest.fixture(scope="session")
def hub_qwen3_5(tmp_path_factory) -> str:
    """A tiny random Qwen3.5 saved as the hub checkpoints are (Qwen3_5ForConditionalGeneration,
    ``model.language_model.*``, the image processor's ``preprocessor_config.json``), with the shipped
    model's tokenizer. Read only: copy it to change it."""
    from transformers import AutoTokenizer

    from whale_train.llm import SHIPPED_MODEL
    from whale_train.tiny import build_qwen3_5, save, save_qwen3_5_processor

    tok = AutoTokenizer.from_pretrained(SHIPPED_MODEL)
    path = tmp_path_factory.mktemp("hub-qwen3_5")
    model = build_qwen3_5(tok, seed=0, hub_layout=True)
    save(model, tok, path)
    save_qwen3_5_processor(path, model)  # the hub checkpoints' preprocessor_config.json
    return str(path)
