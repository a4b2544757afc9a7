"""Shared fixtures: freshly initialized tiny Qwen3 and Qwen3.5 models (real tokenizer and model classes),
built once per run (on pytest-xdist workers too), and the order and grouping `make test` runs tests in."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import pytest
from filelock import FileLock

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One split secret for every test, on every machine (whale_envs.splits): the same tasks land in the same
# splits everywhere, so a test may name a task of a split. Tests of the secret itself set their own.
os.environ["WHALE_SPLIT_SECRET"] = "whale-tests"


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> str:
    """The folder ``name``, filled by ``build(folder)`` once per run: the first worker of a pytest-xdist
    run builds it under a file lock, the others wait and read it (their temporary folders share a parent).
    Read only: copy it to change it."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # pytest-N/, the parent of every worker's popen-gwN/
    path = base / f"shared-{name}"
    with FileLock(str(path) + ".lock"):
        if not (path / ".built").is_file():
            path.mkdir(exist_ok=True)
            build(path)
            (path / ".built").touch()
    return str(path)


@pytest.fixture(scope="session")
def fresh_model_dir(tmp_path_factory) -> str:
    """An untrained ~1M-parameter Qwen3 model with a tokenizer trained on the three envs' observations."""

    def build(path: Path) -> None:
        import whale_envs
        from whale_train.tiny import build_model, save, train_tokenizer

        texts = []
        for env_id in (whale_envs.CHESS_ID, whale_envs.MATH_ID, whale_envs.SEARCH_QA_ID):
            env = gym.make(env_id)
            texts += [env.reset(seed=i)[0] for i in range(40)]
        texts += ["<move>e2e4</move> \\boxed{12} <search>x</search> <answer>y</answer> python: print(1)"] * 20
        tok = train_tokenizer(texts, vocab_size=1024)
        save(build_model(tok, "tiny", seed=0), tok, path)

    return built_once(tmp_path_factory, "fresh-model", build)


@pytest.fixture(scope="session")
def hub_qwen3_5(tmp_path_factory) -> str:
    """A tiny random Qwen3.5 saved as the hub checkpoints are (Qwen3_5ForConditionalGeneration,
    ``model.language_model.*``, the image processor's ``preprocessor_config.json``), with the shipped
    model's tokenizer. Read only: copy it to change it."""

    def build(path: Path) -> None:
        from transformers import AutoTokenizer

        from whale_train.llm import SHIPPED_MODEL
        from whale_train.tiny import build_qwen3_5, save, save_qwen3_5_processor

        tok = AutoTokenizer.from_pretrained(SHIPPED_MODEL)
        model = build_qwen3_5(tok, seed=0, hub_layout=True)
        save(model, tok, path)
        save_qwen3_5_processor(path, model)  # the hub checkpoints' preprocessor_config.json

    return built_once(tmp_path_factory, "hub-qwen3_5", build)


# ------------------------------------------------------------------ the order and grouping of a run

#: Scheduled first, longest expected first, so that no long test starts last on a worker that is
#: otherwise done (pytest-xdist hands tests out in collection order).
FIRST = ("effect", "slow")


def _module_fixture(item: pytest.Item) -> str | None:
    """The first (by name) module- or class-scoped fixture the test uses, or None."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    for name in sorted(info.name2fixturedefs):
        if info.name2fixturedefs[name][-1].scope in ("module", "class"):
            return name
    return None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a pytest-xdist worker (`make test`), two rules; a plain run keeps the file order:

    - tests that share a module-scoped fixture (a search archive, a built wheel, a served index) run on
      one worker, so it is built once, not once per worker: they get the xdist_group
      ``<file>::<fixture>`` unless they name a group themselves;
    - tests marked ``effect`` or ``slow`` are scheduled first (the order is the same on every worker).
    """
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    for item in items:
        fixture = _module_fixture(item)
        if fixture and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(f"{item.nodeid.split('::')[0]}::{fixture}"))

    def rank(item: pytest.Item) -> int:
        return next((i for i, mark in enumerate(FIRST) if item.get_closest_marker(mark)), len(FIRST))

    items.sort(key=rank)  # stable: the file order within each rank
    if getattr(config.option, "loadgroup", False):
        for item in items:
            _join_group(item)


def _join_group(item: pytest.Item) -> None:
    """``--dist loadgroup`` puts the tests whose node ids end with the same ``@<group>`` on one worker.
    pytest-xdist (3.8) appends it to ``item._nodeid``, which pytest 9.2 no longer reads (a node's id is
    ``item._id``, a NodeId): there every xdist_group was ignored, its tests (and the fixtures they share)
    spread over the workers. So the suffix goes on ``_id`` here, as pytest-xdist names it (the sorted group
    names joined by ``_``); where ``_id`` does not exist (older pytest) pytest-xdist's own suffix works."""
    names = sorted(
        {
            str(m.args[0] if m.args else m.kwargs.get("name", "default"))
            for m in item.iter_markers("xdist_group")
        }
    )
    if names and hasattr(item, "_id") and not item.nodeid.endswith(suffix := "@" + "_".join(names)):
        item._id = type(item._id).parse(item.nodeid + suffix)
