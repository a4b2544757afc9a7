"""CPU proxies of the real model path: a tiny random Qwen3.5 (hybrid linear-attention + full-attention
layers, saved in the hub checkpoints' layout) and the tiny Qwen3 go through sampling, scoring,
``whale eval``, RSFT steps, save, SIGKILL + resume, LoRA; model failures are model errors; a server
backend cannot start a weight phase. These tests run on both transformers versions of ``make test``
(the newest and the one vLLM allows)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from harnesses.loader import load_harness
from tests.warm import whale_train
from whale_train.cli import main
from whale_train.llm.base import Request, SamplingParams
from whale_train.llm.hf import TransformersLLM
from whale_train.llm.scripted import ScriptedLLM
from whale_train.rollout import RolloutConfig, run_rollouts
from whale_train.trainer import TrainConfig


def requests() -> list[Request]:
    # Mixed lengths and budgets: rows finish at different steps, so the cache is compacted mid-batch;
    # two identical prompts share one prefill (the cache rows are copied).
    hot = SamplingParams(temperature=1.0, max_tokens=10)
    return [
        Request("What is 2+3? Answer:", hot, seed=1),
        Request("What is 2+3? Answer:", hot, seed=2),
        Request("Mate in one: the white queen", SamplingParams(temperature=1.0, max_tokens=3), seed=3),
        Request(
            "A longer prompt, to be left-padded against the others",
            SamplingParams(temperature=0, max_tokens=6),
        ),
    ]


def test_qwen3_5_samples_per_row_whatever_the_batch_and_scores(hub_qwen3_5):
    llm = TransformersLLM(hub_qwen3_5)
    assert type(llm.model).__name__ == "Qwen3_5ForCausalLM" and llm.compactable
    assert not llm.packable  # linear-attention layers: options are scored on repeated caches, not packed
    assert not llm._joinable  # nor are prefill slices joined: the batch is prefilled whole
    together = llm.complete(requests())
    alone = [llm.complete([r])[0] for r in requests()]
    assert [c.completion_ids for c in together] == [c.completion_ids for c in alone]
    assert [len(c.completion_ids) for c in together] == [10, 10, 3, 6]  # a random model rarely stops early
    assert together[0].completion_ids != together[1].completion_ids  # same prompt, own seeds
    # The fallback for caches without row selection gives the same tokens.
    llm.compactable = False
    assert [c.completion_ids for c in llm.complete(requests())] == [c.completion_ids for c in together]
    scores = llm.score("2+3=", ["5", "5 6 7"])
    assert all(s.logprob < 0 for s in scores) and scores[1].logprob < scores[0].logprob
    # Shared-prefix scoring on the hybrid cache (linear-attention states repeated per option) gives
    # the numbers of full sequences.
    llm.compactable = True
    items = [("2+3=", ["5", "5 6 7"]), ("A longer prompt, left-padded:", ["x y", "z"])]
    full = []
    for prompt, conts in items:
        n = llm.encode(prompt)
        for cont in conts:
            ids = n + llm.encode(cont)
            with torch.no_grad():
                logp = torch.log_softmax(llm.model(torch.tensor([ids])).logits[0].float(), -1)
            full.append(sum(float(logp[len(n) + i - 1, t]) for i, t in enumerate(ids[len(n) :])))
    shared = [c.logprob for scored in llm.score_many(items) for c in scored]
    assert shared == pytest.approx(full, abs=1e-4)


def test_whale_eval_runs_the_qwen3_5_model(hub_qwen3_5, tmp_path, capsys):
    out = tmp_path / "eval"
    args = ["eval", "--env", "whale/Math-v0", "--harness", "math/h0", "--model", hub_qwen3_5, "--limit", "3"]
    code = main([*args, "--k", "2", "--trusted", "--out", str(out), "--tasks", "generated?difficulty=1"])
    assert code == 0, capsys.readouterr().out
    results = json.loads((out / "results.json").read_text())
    assert results["episodes"] == 6 and results["llm_calls"] >= 6
    assert "model_error" not in results["failures"] and "harness_error" not in results["failures"]
    traces = [json.loads(line) for line in (out / "traces.jsonl").read_text().splitlines()]
    assert all(c["completion_ids"] for t in traces for c in t["calls"])


class Broken(ScriptedLLM):
    """A backend that raises on prompts holding ``bad`` (as vLLM does for a whole batch)."""

    def __init__(self, bad: str):
        super().__init__(lambda _p: "\\boxed{1}")
        self.bad = bad

    def complete(self, reqs):
        texts = [
            r.prompt if isinstance(r.prompt, str) else " ".join(m["content"] for m in r.prompt) for r in reqs
        ]
        if any(self.bad in t for t in texts):
            raise ValueError("the engine refused a request")
        return super().complete(reqs)


def test_a_failing_model_call_is_a_model_error_and_fails_its_episode_only():
    harness = load_harness("math/h0")
    env = {"tasks": "generated?difficulty=1&size=40"}
    config = RolloutConfig(k=1, seed=0, concurrency=8, trusted=True)
    import gymnasium as gym

    ids = gym.make("whale/Math-v0", **env).unwrapped.task_ids[:6]
    prompts = {i: gym.make("whale/Math-v0", **env).reset(options={"task_id": i})[1]["question"] for i in ids}
    bad = prompts[ids[0]]  # one task's question (its prompt holds it)
    assert sum(bad in p for p in prompts.values()) == 1
    trajs = run_rollouts(harness, "whale/Math-v0", Broken(bad), ids, env_kwargs=env, config=config)
    failed = [t for t in trajs if t.failure == "model_error"]
    assert [t.task_id for t in failed] == [ids[0]]  # its batch mates were retried alone and ran
    assert failed[0].error.startswith("model_error: ValueError: the engine refused a request")
    assert all(t.failure != "harness_error" for t in trajs)


def test_whale_eval_with_a_broken_model_exits_non_zero(monkeypatch, capsys, tmp_path):
    from whale_train.cli import common

    monkeypatch.setattr(common, "load_llm", lambda _args: Broken(""))
    args = ["eval", "--env", "whale/Math-v0", "--harness", "math/h0", "--limit", "2", "--k", "1", "--trusted"]
    assert main(args) == 1
    captured = capsys.readouterr()
    out = captured.out + captured.err  # the table on stdout, the error line on stderr
    assert "model_error" in out and "the model failed in 2 of 2 episodes" in out


def test_a_server_backend_cannot_start_a_weight_phase():
    with pytest.raises(ValueError, match="backend 'openai' serves a model this process cannot train"):
        TrainConfig.from_dict(
            {"backend": "openai", "base_url": "http://localhost:8000/v1", "method": "whale"}
        )
    TrainConfig.from_dict(
        {"backend": "openai", "base_url": "http://localhost:8000/v1", "method": "harness-only"}
    )


# ------------------------------------------------------------------------------------------ train + resume


def run_config(model: str, lora: bool) -> dict:
    return {
        "model": model,
        "method": "weight-only",
        "env": "whale/Chess-v0",  # short replies (16 tokens at most): the cheapest episodes to train on
        "tasks": "generated?difficulty=1&seed=0&size=200",
        "budget_rollouts": 8,  # 2 RSFT steps of 2 tasks x 2 samples
        # accept everything: a random model solves nothing, and the test is about training and resuming
        "rsft": {"batch_tasks": 2, "samples": 2, "reward_threshold": 0.0, "require_stop": False, "lora": lora}
        | ({"lora_r": 4, "learning_rate": 1e-3} if lora else {}),
        "eval": {"k": 1, "limit": 2, "every": "unit"},
        "concurrency": 4,
    }


def train(config: Path, out: Path, crash: str | None = None, resume: bool = False) -> int:
    """``whale train`` in a subprocess (forked warm: ``tests/warm.py``), SIGKILLed at ``crash``."""
    args = [str(config), "--out", str(out), "--no-report", *(["--resume"] if resume else [])]
    return whale_train(args, {"WHALE_CRASH_AT": crash} if crash else {}).returncode


def evaluations(run: Path) -> list:
    """Every test evaluation: its mean and the exact completions of every episode."""
    out = []
    for line in (run / "ledger.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["event"] == "eval":
            key = f"v{event['model_version']}_{event['harness'].replace('/', '_')}"
            traces = (run / "eval" / f"{key}.traces.jsonl").read_text().splitlines()
            calls = [[c["completion_ids"] for c in json.loads(t)["calls"]] for t in traces]
            out.append((event["model_version"], event["mean"], calls))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_qwen3_5_rsft_killed_with_sigkill_resumes_to_identical_evaluations(hub_qwen3_5, tmp_path, lora):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(run_config(hub_qwen3_5, lora)))
    assert train(config, tmp_path / "straight") == 0
    straight = evaluations(tmp_path / "straight")
    assert [v for v, _, _ in straight] == [0, 1, 2]  # every step trained (and was evaluated)
    assert straight[0][2] != straight[-1][2]  # training changed what the model samples
    out = tmp_path / "crashed"
    # SIGKILL after the second step trained, before its record: the resume restores the first step's
    # checkpoint (weights, optimizer, task stream) and redoes the second.
    assert train(config, out, crash="unit_done@1") == -9
    assert train(config, out, resume=True) == 0
    assert evaluations(out) == straight
    last = out / "checkpoints" / "2"
    assert (last / ("adapter_config.json" if lora else "config.json")).exists()
    if not lora:  # a checkpoint is a model transformers loads as it is
        from transformers import AutoModelForCausalLM

        assert type(AutoModelForCausalLM.from_pretrained(last)).__name__ == "Qwen3_5ForCausalLM"


def test_resume_restores_weights_in_place_through_from_pretrained(hub_qwen3_5, tmp_path):
    from whale_train.rsft import RSFT, Example, RSFTConfig

    def make():
        llm = TransformersLLM(hub_qwen3_5)
        cfg = RSFTConfig(batch_tasks=1, samples=1, save_checkpoints=False, learning_rate=1e-3)
        return RSFT(cfg, llm, load_harness("math/h0"), "whale/Math-v0", {"tasks": "generated?difficulty=1"})

    a = make()
    ids = a.llm.encode("What is 2+3? Answer:")
    a.trainer.train([Example(tuple(ids), tuple(a.llm.encode(" 5")), "t")])
    a.steps_done = 1
    a.save(tmp_path / "ck")
    b = make()
    params = [p for p in b.trainer.model.parameters()]
    b.restore(tmp_path / "ck")
    assert [p for p in b.trainer.model.parameters()] == params  # the same objects: the sampler sees them
    for (n, p), (_, q) in zip(
        a.trainer.model.named_parameters(), b.trainer.model.named_parameters(), strict=True
    ):
        assert torch.equal(p, q), n
    assert (
        b.steps_done == 1
        and b.trainer.optimizer_state is not None
        and b.trainer.optimizer_state["state"].keys() == a.trainer.optimizer_state["state"].keys()
    )


# ------------------------------------------------------------------------------------------ versions, device check

ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_extra_the_pinned_test_environment_and_the_supported_range_agree():
    import configparser
    import re

    import transformers
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    from whale_train.llm.vllm_backend import VLLM_VERSION

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert cfg["options.extras_require"]["gpu"].split() == [f"vllm=={VLLM_VERSION}"]
    requires = [r.strip() for r in cfg["options"]["install_requires"].splitlines() if r.strip()]
    supported = SpecifierSet(next(r for r in requires if r.startswith("transformers"))[len("transformers") :])
    pinned = re.search(r"^PINNED_TRANSFORMERS = (\S+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    # vllm 0.33.0's metadata: Requires-Dist: transformers<5.21.0,>=5.16.1
    assert Version(pinned) in SpecifierSet(">=5.16.1,<5.21.0") and Version(pinned) in supported
    assert Version(transformers.__version__) in supported


def test_the_device_check_parses_and_refuses_to_run_without_a_gpu():
    script = ROOT / "benchmarks" / "gpu_check.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    if not torch.cuda.is_available():
        done = subprocess.run(
            ["bash", str(script)],
            env={**os.environ, "PYTHON": sys.executable},
            capture_output=True,
            text=True,
        )
        assert done.returncode == 3 and "no CUDA GPU here" in done.stderr


def test_the_hub_qwen3_5_fixture_ships_the_processor_config_a_hub_checkpoint_has(hub_qwen3_5):
    """vLLM refused the fixture without it; transformers' own loader reads it and it fits the vision tower."""
    from transformers import AutoConfig, AutoImageProcessor

    config = AutoConfig.from_pretrained(hub_qwen3_5)
    processor = AutoImageProcessor.from_pretrained(hub_qwen3_5)
    assert processor.patch_size == config.vision_config.patch_size
    assert processor.merge_size == config.vision_config.spatial_merge_size
    assert json.loads((Path(hub_qwen3_5) / "preprocessor_config.json").read_text())["processor_class"] == (
        "Qwen3VLProcessor"
    )
