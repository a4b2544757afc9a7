"""Trained weights as an inference engine expects them: merged, renamed, detached, checked.

The trainer trains a transformers ``*ForCausalLM`` (with LoRA: a PEFT model around it); the engine
(vLLM) was built from a checkpoint, maybe of another class. For Qwen3.5 the hub checkpoints declare
``Qwen3_5ForConditionalGeneration`` (text weights under ``model.language_model.*``, a vision tower under
``model.visual.*``), while ``AutoModelForCausalLM`` trains ``Qwen3_5ForCausalLM`` (``model.layers.*``).
A push therefore:

1. ``trained_weights``: takes every parameter once (tied ones once, under the input embedding's name:
   vLLM's ``load_weights`` of a tied model skips ``lm_head.*`` and its head shares the embedding's
   tensor, so a lone ``lm_head.weight`` would be dropped), merges LoRA adapters into their base
   weights (W + scale * B @ A, computed, the training model is not touched) under the base names, and
   detaches;
2. ``engine_names``: renames them into the checkpoint naming of the engine's architecture;
3. ``check_push``: checks that every pushed tensor is exactly one tensor of the engine's checkpoint, of
   the same shape, and fails naming the first one that is not. The engine loads pushed tensors through
   the same loader (and name mapping) as that checkpoint, so a tensor that matches it lands in exactly
   one engine parameter.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch


class WeightPushError(ValueError):
    """A trained tensor has no place in the engine (a name or shape the engine's checkpoint lacks)."""


def trained_weights(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of every weight of ``model`` in the base model's naming, LoRA merged, detached.

    For a PEFT model the adapter parameters (``lora_A`` / ``lora_B``) are not yielded; each adapted base
    weight is yielded as ``W + delta`` under its plain name (``...q_proj.weight``, not
    ``base_model.model....q_proj.base_layer.weight``)."""
    deltas: dict[str, torch.Tensor] = {}
    base = model
    if hasattr(model, "get_base_model"):  # PEFT
        from peft.tuners.lora import LoraLayer

        base = model.get_base_model()
        for name, module in base.named_modules():
            if isinstance(module, LoraLayer) and not getattr(module, "merged", False):
                with torch.no_grad():
                    delta = sum(
                        module.get_delta_weight(a) for a in module.active_adapters if a in module.lora_A
                    )
                if isinstance(delta, torch.Tensor):
                    deltas[f"{name}.base_layer.weight"] = delta
    tied = tied_embedding_name(base)
    for name, param in base.named_parameters():  # tied parameters come once
        if ".lora_" in name or "lora_embedding" in name:
            continue
        tensor = param.detach()
        if name in deltas:
            tensor = tensor + deltas[name].to(tensor.dtype)
        if tied is not None and param is tied[1]:
            name = tied[0]  # the embedding's name, whichever name named_parameters kept
        yield name.replace(".base_layer.", "."), tensor


def tied_embedding_name(model: Any) -> tuple[str, Any] | None:
    """``(name, parameter)`` of the input embedding when the output head shares it (a tied head), else
    None. The name is the embedding module's, so a tied model's push always carries the embedding."""
    try:
        embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    weight = getattr(embed, "weight", None)
    if weight is None or head is None or getattr(head, "weight", None) is not weight:
        return None
    for module_name, module in model.named_modules():
        if module is embed:
            return f"{module_name}.weight", weight
    return None


#: Engine architectures built from a composite (vision-language) checkpoint whose text model sits under
#: ``model.language_model.``, and the ``*ForCausalLM`` classes that train that text model under ``model.``.
#: vLLM 0.33 maps these checkpoint names onto its modules (``hf_to_vllm_mapper`` of
#: ``Qwen3_5ForConditionalGeneration`` in vllm/model_executor/models/qwen3_5.py, inherited from
#: ``Qwen3VLForConditionalGeneration`` in qwen3_vl.py: ``model.language_model.`` -> ``language_model.model.``,
#: ``lm_head.`` -> ``language_model.lm_head.``).
COMPOSITE_TEXT_PREFIX = {
    "Qwen3_5ForConditionalGeneration": "model.language_model.",
    "Qwen3_5MoeForConditionalGeneration": "model.language_model.",
    "Qwen3VLForConditionalGeneration": "model.language_model.",
    "Qwen3VLMoeForConditionalGeneration": "model.language_model.",
}


def engine_names(
    weights: Iterable[tuple[str, torch.Tensor]], architecture: str | None
) -> Iterator[tuple[str, torch.Tensor, str]]:
    """``(checkpoint name, tensor, trained name)``: a ``*ForCausalLM`` training copy's names in the
    checkpoint naming of ``architecture`` (the engine's; unchanged for a text-only engine)."""
    prefix = COMPOSITE_TEXT_PREFIX.get(architecture or "")
    for name, tensor in weights:
        out = name
        if prefix and name.startswith("model.") and not name.startswith(prefix):
            out = prefix + name[len("model.") :]
        yield out, tensor, name


def checkpoint_tensors(model_dir: str | Path) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor of the safetensors checkpoint in ``model_dir`` (headers only)."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    shapes: dict[str, tuple[int, ...]] = {}
    for f in files:
        with open(f, "rb") as fh:
            size = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(size))
        for name, meta in header.items():
            if name != "__metadata__":
                shapes[name] = tuple(meta["shape"])
    return shapes


def check_push(
    named: Iterable[tuple[str, torch.Tensor, str]], expected: dict[str, tuple[int, ...]], architecture: str
) -> list[tuple[str, torch.Tensor]]:
    """The pushed ``(name, tensor)`` list, after checking each against the engine's checkpoint tensors."""
    out: list[tuple[str, torch.Tensor]] = []
    seen: set[str] = set()
    for name, tensor, trained in named:
        was = f" (trained as {trained!r})" if trained != name else ""
        if name not in expected:
            near = sorted(expected)[:3]
            raise WeightPushError(
                f"pushed weight {name!r}{was} is not a weight of the engine's {architecture} checkpoint "
                f"(it has e.g. {near}): the push would fail or be dropped"
            )
        if name in seen:
            raise WeightPushError(f"pushed weight {name!r}{was} twice")
        if tuple(tensor.shape) != expected[name]:
            raise WeightPushError(
                f"pushed weight {name!r}{was} has shape {tuple(tensor.shape)}, the engine's {expected[name]}"
            )
        seen.add(name)
        out.append((name, tensor.detach()))
    return out
