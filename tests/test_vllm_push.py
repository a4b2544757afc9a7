"""The vLLM backend against a fake engine that enforces vLLM 0.33.0's rules (tests/fake_vllm.py names
the vLLM source of each): weight pushes from a transformers training copy into the engine a hub
Qwen3.5 checkpoint builds (in-process and multiprocess), LoRA merged before the push, the check of
every pushed tensor, and prompts longer than ``max_model_len``."""

from __future__ import annotations

import fake_vllm
import pytest
import torch
import trl  # noqa: F401  (imported before the fake vllm is installed: TRL probes for vllm when first imported)
from transformers import AutoModelForCausalLM, AutoTokenizer

from harnesses.loader import load_harness
from whale_train.llm import SHIPPED_MODEL
from whale_train.llm.base import Request, SamplingParams, fit_prompt
from whale_train.rsft import RSFT, Example, RSFTConfig
from whale_train.tiny import build_qwen3_5, save

PROMPTS = ["What is 2+3? Answer:", "The capital of France is"]


@pytest.fixture
def vllm(monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    return fake_vllm.install(monkeypatch)


def engine_llm(model: str, **kwargs):
    from whale_train.llm.vllm_backend import VLLMLLM

    return VLLMLLM(model, **kwargs)


def greedy(llm) -> list[list[int]]:
    reqs = [Request(p, SamplingParams(temperature=0, max_tokens=6)) for p in PROMPTS]
    return [c.completion_ids for c in llm.complete(reqs)]


def perturb(model, seed: int = 1) -> dict[str, torch.Tensor]:
    original = {n: p.detach().clone() for n, p in model.named_parameters()}
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.5)
    return original


def restore(model, original) -> None:
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(original[n])


def round_trip(llm, model_dir: str) -> None:
    """Pushing changed weights changes greedy output; pushing the originals restores it exactly."""
    train = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)  # as the trainer loads it
    before = greedy(llm)
    original = perturb(train)
    llm.load_weights(train.named_parameters())
    changed = greedy(llm)
    assert changed != before
    restore(train, original)
    llm.load_weights(train.named_parameters())
    assert greedy(llm) == before
    assert llm.version == 2 and llm.engine.prefix_resets == 2


@pytest.mark.slow
def test_a_causal_lm_training_copy_pushes_into_the_conditional_generation_engine(vllm, hub_qwen3_5):
    # vLLM builds Qwen3_5ForConditionalGeneration (config.json); the trainer trains Qwen3_5ForCausalLM.
    llm = engine_llm(hub_qwen3_5)
    assert llm.engine.architecture == "Qwen3_5ForConditionalGeneration"
    round_trip(llm, hub_qwen3_5)
    loaded = llm.engine.model.loads[-1]
    assert loaded and all(name.startswith("language_model.") for name in loaded)


@pytest.mark.slow
def test_the_multiprocess_engine_takes_pushes_through_a_worker_method(vllm, hub_qwen3_5, monkeypatch):
    # vLLM's default: the engine core in its own process; no model_executor to reach into, and only
    # the worker's own methods can be called (collective_rpc).
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    llm = engine_llm(hub_qwen3_5)
    assert llm.engine.multiprocess
    round_trip(llm, hub_qwen3_5)
    assert set(llm.engine.rpcs) <= fake_vllm.WORKER_METHODS | llm.engine.extension_methods
    assert "whale_load_weights_file" in llm.engine.rpcs  # a file path crosses the RPC, tensors do not


def test_tensors_handed_to_a_multiprocess_engines_rpc_arrive_as_lists(vllm, monkeypatch):
    # The defect the real engine showed (tests/test_vllm_real.py): the old push handed tensors to
    # reload_weights through collective_rpc, and the worker in the other process got plain lists.
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    llm = engine_llm(str(SHIPPED_MODEL))
    name, tensor = next(iter(AutoModelForCausalLM.from_pretrained(SHIPPED_MODEL).named_parameters()))
    with pytest.raises((AttributeError, TypeError, ValueError)):
        llm.engine.collective_rpc(
            "reload_weights",
            kwargs={"weights_iterator": [(name, tensor.detach())], "is_checkpoint_format": True},
        )


@pytest.mark.slow
def test_a_text_only_qwen3_5_engine_takes_the_copys_names(vllm, tmp_path):
    # An engine built from a text-only checkpoint (a WHALE checkpoint: Qwen3_5ForCausalLM, model.layers.*)
    tok = AutoTokenizer.from_pretrained(SHIPPED_MODEL)
    save(build_qwen3_5(tok, seed=0), tok, tmp_path)
    llm = engine_llm(str(tmp_path))
    assert llm.engine.architecture == "Qwen3_5ForCausalLM"
    round_trip(llm, str(tmp_path))


@pytest.mark.slow
def test_a_qwen3_engine_takes_its_own_names(vllm):
    round_trip(engine_llm(str(SHIPPED_MODEL)), str(SHIPPED_MODEL))


def test_a_pushed_tensor_that_fits_no_engine_weight_is_named(vllm, hub_qwen3_5):
    from whale_train.llm.weights import WeightPushError

    llm = engine_llm(hub_qwen3_5)
    train = AutoModelForCausalLM.from_pretrained(hub_qwen3_5)
    good = list(train.named_parameters())
    with pytest.raises(WeightPushError, match=r"model\.layers\.0\.extra\.weight"):
        llm.load_weights([*good[:3], ("model.layers.0.extra.weight", torch.zeros(2))])
    name, tensor = good[0]
    with pytest.raises(WeightPushError, match="shape"):
        llm.load_weights([(name, tensor[:-1])])
    assert llm.version == 0 and not llm.engine.model.loads  # nothing reached the engine


@pytest.mark.slow
@pytest.mark.parametrize("model", ["hub_qwen3_5", "qwen3"])
def test_lora_is_merged_and_renamed_before_the_push(vllm, model, request):
    path = request.getfixturevalue(model) if model == "hub_qwen3_5" else str(SHIPPED_MODEL)
    llm = engine_llm(path)
    train = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    config = RSFTConfig(
        batch_tasks=1, samples=1, lora=True, lora_r=4, learning_rate=1e-2, save_checkpoints=False
    )
    env = ("whale/Math-v0", {"tasks": "generated?difficulty=1"})
    rsft = RSFT(config, llm, load_harness("math/h0"), *env, train_model=train)
    base = {n: p.detach().clone() for n, p in train.named_parameters() if "lora_" not in n}
    prompt = llm.encode("What is 2+3? Answer:")
    rsft.trainer.train([Example(tuple(prompt), tuple(llm.encode(" 5")), "t0")])
    rsft.push()  # what an RSFT step does after training
    assert llm.version == 1
    peft = rsft.trainer.model
    engine = llm.engine.model.params
    moved = 0
    for module_name, module in peft.get_base_model().named_modules():
        if not hasattr(module, "lora_A"):
            continue
        w = module.base_layer.weight
        merged = w + module.get_delta_weight("default")
        target = engine[fake_vllm.TEXT_PREFIX.get(llm.engine.architecture, "") + module_name + ".weight"]
        assert torch.allclose(target, merged, atol=1e-6), module_name
        moved += int(not torch.equal(target, base[module_name + ".base_layer.weight"]))
    assert moved > 0  # the adapters changed the engine's weights
    assert not any("lora" in n or "base_layer" in n for n in llm.engine.model.loads[-1])


def test_an_over_long_prompt_is_cut_like_the_transformers_backend_cuts_it(vllm):
    from whale_train.llm.hf import TransformersLLM

    llm = engine_llm(str(SHIPPED_MODEL), max_model_len=64)
    long = "1 2 3 4 5 6 7 8 9 " * 20
    params = SamplingParams(temperature=0, max_tokens=8)
    outs = llm.complete([Request("short prompt", params), Request(long, params)])
    assert [len(o.completion_ids) > 0 for o in outs] == [True, True]
    ids = llm.encode(long)
    assert len(ids) > 64 and outs[1].prompt_ids == fit_prompt(ids, 8, 64) == ids[-56:]
    hf = TransformersLLM(str(SHIPPED_MODEL))
    hf.max_positions = 64
    assert hf.complete([Request(long, params)])[0].prompt_ids == outs[1].prompt_ids


def test_whale_eval_passes_backend_options_to_the_engine(vllm, capsys, tmp_path):
    from whale_train.cli import main

    base = ["eval", "--env", "whale/Math-v0", "--harness", "math/h0", "--backend", "vllm", "--limit", "1"]
    base += ["--k", "1", "--trusted", "--out", str(tmp_path)]
    assert main([*base, "--backend-option", "no_such_setting=1"]) == 2  # vLLM's EngineArgs refuses it
    err = capsys.readouterr().err
    assert "no_such_setting" in err and "Traceback" not in err
    assert main(
        [*base, "--backend-option", "max_model_len=96", "--backend-option", "enforce_eager=true"]
    ) in (0, 1)
    engine = fake_vllm.LLM.instances[-1]
    assert engine.model_config.max_model_len == 96
    assert (tmp_path / "results.json").exists()
