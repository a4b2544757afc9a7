"""The device checks of benchmarks/gpu_check.sh, one per subcommand, each printing one line
``<check>: PASS|FAIL <numbers>`` and exiting 0 (pass) or 1 (fail). Each runs in its own process
(started by gpu_check.sh with a time limit), because a vLLM engine's settings (multiprocess mode,
batch invariance) are fixed when it is created and its memory is only freed when the process ends.

    python benchmarks/gpu_check.py CHECK --model MODEL [--out DIR]

CHECK: versions, push (load, in-process push round trip, LoRA push, over-long prompt, one RSFT step,
save + resume), push-multiprocess, push-continuous, parity-float32, parity-bfloat16, batch-invariant.

Every push check asks for parity with the trained weights, not only a changed output: after a push
the engine's log-probabilities of fixed continuations must equal (within the precision's tolerance)
those transformers computes from the training copy, and be far from those of the weights before the
push. A push that reaches the engine only in part (a shard, a pre-packed output head kept from
before, a dropped tensor) fails it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PROMPTS = [
    "What is 17 + 25? Put the final answer in \\boxed{}.",
    "Name the capital of France.",
    "White to move: Qh5. What does the queen attack?",
    "Write a Python expression for 2 to the power 10.",
]


def say(check: str, ok: bool, detail: str) -> bool:
    print(f"{check}: {'PASS' if ok else 'FAIL'} {detail}", flush=True)
    return ok


def greedy(llm, n: int = 24) -> list[list[int]]:
    from whale_train.llm.base import Request, SamplingParams

    reqs = [
        Request([{"role": "user", "content": p}], SamplingParams(temperature=0, max_tokens=n))
        for p in PROMPTS
    ]
    return [c.completion_ids for c in llm.complete(reqs)]


def engine(model: str, **options):
    from whale_train.llm.vllm_backend import VLLMLLM

    options.setdefault("gpu_memory_utilization", 0.35)
    options.setdefault("max_model_len", 4096)
    options.setdefault("enforce_eager", True)  # no CUDA-graph capture: a faster start for a short check
    return VLLMLLM(model, chat_template_kwargs={"enable_thinking": False}, **options)


def training_copy(model: str, dtype: str = "float32"):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype)).to("cuda")


PARITY_PROMPT = "Question: what is 6 times 7?\nAnswer:"
PARITY_CONTS = [" 42", " 42.", " forty-two", " 36", " 48", " The answer is 42", " 6*7 = 42", " I do not know"]


def logprobs_of(llm) -> list[float]:
    return [c.logprob for c in llm.score(PARITY_PROMPT, PARITY_CONTS)]


def transformers_logprobs(llm, model) -> list[float]:
    """What transformers computes from ``model`` (a training copy) in the engine's dtype."""
    import copy

    import torch

    from whale_train.llm.hf import TransformersLLM

    dtype = llm.dtype if isinstance(llm.dtype, torch.dtype) else torch.float32
    twin = copy.deepcopy(model).to(dtype)
    try:
        return logprobs_of(TransformersLLM(twin, llm.tokenizer))
    finally:
        del twin
        torch.cuda.empty_cache()


def push_parity(llm, trained_lp: list[float], before_lp: list[float]) -> tuple[bool, str]:
    """The engine computes with the pushed weights: its log-probs match transformers' on them (float32:
    0.05, else 0.5) and are closer to them than to its own before the push (by a factor of 2)."""
    import torch

    tol = 0.05 if llm.dtype == torch.float32 else 0.5
    engine = logprobs_of(llm)
    d_trained = max(abs(a - b) for a, b in zip(engine, trained_lp, strict=True))
    d_before = max(abs(a - b) for a, b in zip(engine, before_lp, strict=True))
    ok = d_trained <= tol and d_before > 2 * d_trained
    return (
        ok,
        f"max |logp engine - logp trained| {d_trained:.4f} (tolerance {tol}), vs before the push {d_before:.3f}",
    )


def perturbed_round_trip(llm, train, check: str) -> bool:
    """Push changed weights: the engine must compute with them (``push_parity``) and its greedy output
    must change; then push the originals: the greedy output must come back exactly."""
    import torch

    from whale_train.llm.weights import trained_weights

    before = greedy(llm)
    before_lp = logprobs_of(llm)
    gen = torch.Generator(device="cuda").manual_seed(0)
    noise = {}
    with torch.no_grad():
        for name, p in train.named_parameters():
            if p.ndim == 2:
                noise[name] = torch.randn(p.shape, generator=gen, device=p.device, dtype=p.dtype) * 0.02
                p.add_(noise[name])
    trained_lp = transformers_logprobs(llm, train)
    start = time.monotonic()
    llm.load_weights(trained_weights(train))
    push_s = time.monotonic() - start
    changed = greedy(llm)
    parity, parity_detail = push_parity(llm, trained_lp, before_lp)
    with torch.no_grad():
        for name, p in train.named_parameters():
            if name in noise:
                p.sub_(noise[name])
    llm.load_weights(trained_weights(train))
    restored = greedy(llm)
    same = sum(a == b for a, b in zip(before, restored, strict=True))
    return say(
        check,
        parity and changed != before and same == len(before),
        f"{parity_detail}; changed {sum(a != b for a, b in zip(before, changed, strict=True))}/{len(before)} "
        f"greedy outputs, restored {same}/{len(before)}; push {push_s:.2f} s",
    )


def check_versions(args) -> bool:
    import peft
    import torch
    import transformers
    import trl
    import vllm

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return say(
        "versions",
        torch.cuda.is_available(),
        f"vllm {vllm.__version__}, torch {torch.__version__} (CUDA {torch.version.cuda}), transformers "
        f"{transformers.__version__}, trl {trl.__version__}, peft {peft.__version__}; GPU {gpu}",
    )


def check_push(args) -> bool:
    """One in-process engine for: load, push round trip, LoRA push, long prompt, RSFT step, save+resume."""
    import torch

    from whale_train.llm.base import Request, SamplingParams
    from whale_train.llm.weights import trained_weights

    ok = True
    start = time.monotonic()
    llm = engine(args.model)
    ok &= say("load", bool(greedy(llm)[0]), f"{llm.architecture} in vLLM in {time.monotonic() - start:.0f} s")
    train = training_copy(args.model)
    ok &= perturbed_round_trip(llm, train, "push in-process")

    # LoRA: adapters merged into the base weights before the push; the plain base restores the output.
    from peft import LoraConfig, get_peft_model

    before = greedy(llm)
    before_lp = logprobs_of(llm)
    lora = get_peft_model(
        train, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
    )
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    merged_lp = transformers_logprobs(llm, lora)  # the PEFT model computes with the adapters applied
    llm.load_weights(trained_weights(lora))
    changed = greedy(llm)
    parity, parity_detail = push_parity(llm, merged_lp, before_lp)
    base = lora.unload()  # the base model without adapters (weights untouched)
    llm.load_weights(trained_weights(base))
    ok &= say(
        "push LoRA",
        parity and changed != before and greedy(llm) == before,
        f"merged adapters: {parity_detail}; they change greedy output, the base weights restore it",
    )
    train = base

    # A batch with one prompt longer than max_model_len (4096): cut like the transformers backend cuts.
    long = "1 2 3 4 5 6 7 8 9 " * 2000
    params = SamplingParams(temperature=0, max_tokens=16)
    outs = llm.complete([Request(PROMPTS[0], params), Request(long, params), Request(PROMPTS[1], params)])
    ok &= say(
        "long prompt",
        all(o.completion_ids for o in outs) and outs[1].prompt_tokens <= llm.max_model_len - 16,
        f"prompt of {len(llm.encode(long))} tokens cut to {outs[1].prompt_tokens}; the batch ran",
    )

    # One RSFT step of the model in bf16 autocast over float32 weights, then save + resume.
    from harnesses.loader import load_harness
    from whale_train.rsft import RSFT, RSFTConfig

    config = RSFTConfig(
        batch_tasks=16,
        samples=4,
        reward_threshold=0.0,  # train on what comes back: this checks the machinery, not learning
        learning_rate=1e-6,
        bf16=True,
        gradient_checkpointing=True,
        train_batch_size=8,
        save_checkpoints=False,
        concurrency=64,
    )
    rsft = RSFT(config, llm, load_harness("math/h0"), "whale/Math-v0", {}, train_model=train)
    torch.cuda.reset_peak_memory_stats()
    report = rsft.step()
    peak = torch.cuda.max_memory_allocated() / 2**30
    start = time.monotonic()
    rsft.push()
    push_s = time.monotonic() - start
    ok &= say(
        "rsft step",
        report.updated and report.loss is not None,
        f"{report.rollouts} rollouts in {report.sample_seconds:.1f} s, {report.examples} examples, loss "
        f"{report.loss}, training {report.train_seconds:.1f} s, peak training memory {peak:.1f} GiB "
        f"(+ vLLM's share), push {push_s:.2f} s",
    )
    out = Path(args.out) / "resume"
    rsft.save(out)
    after_step = greedy(llm)
    fresh = training_copy(args.model)
    llm.load_weights(trained_weights(fresh))  # the engine back at the original weights, as after a restart
    rsft2 = RSFT(config, llm, load_harness("math/h0"), "whale/Math-v0", {}, train_model=fresh)
    rsft2.restore(out)
    equal = all(
        torch.equal(a, b)
        for (_, a), (_, b) in zip(
            trained_weights(rsft.trainer.model), trained_weights(rsft2.trainer.model), strict=True
        )
    )
    rsft2.push()
    ok &= say(
        "save + resume",
        equal and greedy(llm) == after_step and rsft2.stream.position == rsft.stream.position,
        "restored weights equal the saved ones; pushed, greedy output equals the output before the save",
    )
    return ok


def check_push_multiprocess(args) -> bool:
    llm = engine(args.model, multiprocess=True)
    return perturbed_round_trip(llm, training_copy(args.model), "push multiprocess")


def check_push_continuous(args) -> bool:
    llm = engine(args.model, continuous=True)
    try:
        return perturbed_round_trip(llm, training_copy(args.model), "push continuous")
    finally:
        llm.close()


def check_parity(args, dtype: str) -> bool:
    """vLLM's and transformers' summed log-probabilities of 8 continuations, in the same precision."""
    import torch

    from whale_train.llm.hf import TransformersLLM

    llm = engine(args.model, dtype=dtype)
    hf = TransformersLLM(args.model, dtype=getattr(torch, dtype), device="cuda")
    v = logprobs_of(llm)
    t = logprobs_of(hf)
    diff = max(abs(a - b) for a, b in zip(v, t, strict=True))
    tol = 0.05 if dtype == "float32" else 0.5
    same_order = sorted(range(8), key=lambda i: v[i]) == sorted(range(8), key=lambda i: t[i])
    return say(
        f"parity {dtype}",
        diff <= tol,
        f"max |logp vLLM - logp transformers| over 8 continuations {diff:.4f} (tolerance {tol}); "
        f"same ranking: {same_order}",
    )


def check_batch_invariant(args) -> bool:
    from whale_train.llm.base import Request, SamplingParams

    llm = engine(args.model, batch_invariant=True)
    target = Request(PROMPTS[0], SamplingParams(temperature=1.0, max_tokens=48), seed=7)
    alone = llm.complete([target])[0].completion_ids
    others = [
        Request(p * (i + 1), SamplingParams(temperature=1.0, max_tokens=48), seed=i)
        for i, p in enumerate(PROMPTS * 8)
    ]
    batched = llm.complete([*others[:16], target, *others[16:]])[16].completion_ids
    again = llm.complete([target])[0].completion_ids
    return say(
        "batch-invariant",
        alone == batched == again,
        f"a seeded sample alone, in a batch of 33 and again: {'identical' if alone == batched == again else 'different'}",
    )


CHECKS = {
    "versions": check_versions,
    "push": check_push,
    "push-multiprocess": check_push_multiprocess,
    "push-continuous": check_push_continuous,
    "parity-float32": lambda a: check_parity(a, "float32"),
    "parity-bfloat16": lambda a: check_parity(a, "bfloat16"),
    "batch-invariant": check_batch_invariant,
}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("check", choices=sorted(CHECKS))
    parser.add_argument("--model", default="Qwen/Qwen3.5-2B")
    parser.add_argument("--out", default="gpu_check_out")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    return 0 if CHECKS[args.check](args) else 1


if __name__ == "__main__":
    sys.exit(main())
