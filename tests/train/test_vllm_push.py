"""The vLLM backend against a fake engine that enforces vLLM 0.33.0's rules (tests/fake_vllm.py names
the vLLM source of each): weight pushes from a transformers training copy into the engine a hub
Qwen3.5 checkpoint builds (in-process and multiprocess), LoRA merged before the push, the check of
every pushed tensor, and prompts longer than ``max_model_len``."""

from __future__ import annotations

import pytest
import torch
import trl  # noqa: F401  (imported before the fake vllm is installed: TRL probes for vllm when first imported)
from transformers import AutoModelForCausalLM, AutoTokenizer

from harnesses.loader import load_harness
from tests import fake_vllm
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
    # The defect the real engine showed (tests/train/test_vllm_real.py): the old push handed tensors to
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


# ------------------------------------------------------------------ a tied output head, every push checked

TIED = str(SHIPPED_MODEL)  # the shipped tiny model ties lm_head to its input embeddings
CONTINUATIONS = [" 5", " 6", " Paris is big"]


def transformers_scores(model, prompt: str = "What is 2+3? Answer:") -> list[float]:
    from whale_train.llm.hf import TransformersLLM

    return [
        c.logprob
        for c in TransformersLLM(model, AutoTokenizer.from_pretrained(TIED)).score(prompt, CONTINUATIONS)
    ]


def tied_engine(mode: str, monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1" if mode == "multiprocess" else "0")
    return engine_llm(TIED, continuous=mode == "continuous")


def lora_trained(model):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(3)
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # adapters as if trained (B starts at zero)
        for n, p in peft.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    return peft


@pytest.mark.parametrize("mode", ["in_process", "multiprocess", "continuous", "lora"])
def test_a_tied_head_computes_with_the_pushed_embedding(vllm, mode, monkeypatch):
    # The defect the real engine showed: the push carried the embedding, vLLM's reload left the tied
    # head's packed copy old ("ParallelLMHead: Failed to load weights"): new body, old head.
    import copy

    from whale_train.llm.weights import trained_weights

    llm = tied_engine(mode, monkeypatch)
    assert llm.engine.model.tied
    train = AutoModelForCausalLM.from_pretrained(TIED, dtype=torch.float32)
    if mode == "lora":
        train = lora_trained(train)
        reference = copy.deepcopy(train).merge_and_unload()
    else:
        perturb(train, seed=2)
        reference = train
    llm.load_weights(trained_weights(train))
    assert "model.embed_tokens.weight" in llm.engine.model.loads[-1]
    check = llm.verify_push(train)
    assert check["ok"] and check["max_abs_diff"] <= 2e-3 and check["tokens"] > 10, check
    ours = [c.logprob for c in llm.score("What is 2+3? Answer:", CONTINUATIONS)]
    assert ours == pytest.approx(transformers_scores(reference), abs=2e-3)
    llm.close()


def test_a_lone_tied_head_is_pushed_under_the_embeddings_name():
    # named_parameters() keeps one name for a tied tensor; whichever it keeps, the push names the
    # embedding (vLLM's loader of a tied model skips lm_head.*).
    from whale_train.llm.weights import trained_weights

    model = AutoModelForCausalLM.from_pretrained(TIED, dtype=torch.float32)
    names = [n for n, _ in trained_weights(model)]
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    head_first = model.__class__.__new__(model.__class__)  # a module that registers the head first
    torch.nn.Module.__init__(head_first)
    head_first.lm_head = model.lm_head
    head_first.model = model.model
    head_first.config = model.config
    head_first.get_input_embeddings = lambda: model.model.embed_tokens
    head_first.get_output_embeddings = lambda: model.lm_head
    assert next(head_first.named_parameters())[0] == "lm_head.weight"
    names = [n for n, _ in trained_weights(head_first)]
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names


def broken_push(monkeypatch) -> None:
    """The push as it was: the tied head's layer not processed again after the reload."""
    import whale_train.llm.vllm_backend as backend

    monkeypatch.setattr(backend, "refresh_tied_layers", lambda model: [])


def test_without_the_fix_the_fake_engine_keeps_the_old_head_and_the_check_names_it(vllm, monkeypatch):
    from whale_train.llm.vllm_backend import PushCheckError
    from whale_train.llm.weights import trained_weights

    broken_push(monkeypatch)
    llm = engine_llm(TIED)
    train = AutoModelForCausalLM.from_pretrained(TIED, dtype=torch.float32)
    perturb(train, seed=2)
    llm.load_weights(trained_weights(train))
    assert llm.engine.model.warnings[-1] == "ParallelLMHead: Failed to load weights"
    with pytest.raises(PushCheckError) as err:
        llm.verify_push(train)
    line = str(err.value)
    assert "\n" not in line and "lm_head" in line and "tolerance 0.002" in line, line
    assert llm.last_push_check["ok"] is False and llm.last_push_check["max_abs_diff"] > 2e-3


def weight_only_config(tmp_path, **extra):
    import yaml

    from tests.train.test_trainer import SMOKE

    config = tmp_path / "vllm.yaml"
    data = {"model": TIED, "method": "weight-only", **SMOKE, "budget_rollouts": 16, "backend": "vllm"}
    data["rsft"] = {**SMOKE["rsft"], "reward_threshold": 0.0, "learning_rate": 1e-3}
    config.write_text(yaml.safe_dump({**data, **extra}))
    return config


def test_every_push_of_a_run_is_checked_and_recorded_in_the_ledger(vllm, tmp_path):
    from tests.train.test_trainer import ledger, units
    from whale_train.cli import main

    out = tmp_path / "run"
    assert main(["train", str(weight_only_config(tmp_path)), "--out", str(out), "--no-report"]) == 0
    weight = [u for u in units(ledger(out)) if u.get("signals", {}).get("push_seconds") is not None]
    assert weight, units(ledger(out))
    for unit in weight:
        check = unit["signals"]["push_check"]
        assert check["ok"] and check["max_abs_diff"] <= check["tolerance"] == 2e-3, check


def test_a_push_the_engine_does_not_take_stops_whale_train_in_one_line(vllm, monkeypatch, tmp_path, capsys):
    from whale_train.cli import main

    broken_push(monkeypatch)
    out = tmp_path / "run"
    assert main(["train", str(weight_only_config(tmp_path)), "--out", str(out), "--no-report"]) == 1
    captured = capsys.readouterr()
    text = captured.out + captured.err
    error = " ".join(text[text.index("error: weight push") :].split())  # (rich wraps at the console's width)
    assert text.count("error:") == 1 and "check failed" in error and "lm_head" in error, text[-2000:]
    assert "Traceback" not in text, text[-2000:]


def test_resume_pushes_and_checks_before_the_first_rollout(vllm, monkeypatch, tmp_path):
    from tests.train.test_trainer import smoke
    from whale_train.trainer import Run

    config = smoke(
        TIED, method="weight-only", budget_rollouts=8, backend="vllm", rsft={"reward_threshold": 0.0}
    )
    Run(config, tmp_path, log=lambda *_: None).run()
    llm = engine_llm(TIED)
    checked = []
    real = llm.verify_push
    monkeypatch.setattr(llm, "verify_push", lambda model: checked.append(real(model)) or checked[-1])
    resumed = Run(config, tmp_path, llm=llm, resume=True, log=lambda *_: None)
    assert checked and checked[0]["ok"], checked  # re-pushed and checked while resuming
    assert resumed.llm is llm
