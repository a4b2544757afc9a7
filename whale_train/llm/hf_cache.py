"""The transformers model's forward-pass plumbing that sampling (hf.py) and scoring (hf_scoring.py)
share: the cache argument and returned cache across transformers versions, selecting a cache's batch
rows, left-padded prompt batches, and a token's log-probability from logits."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch


def cache_argument(model: Any) -> str:
    """The name of the forward pass's cache argument: ``cache`` from transformers 5.23 on
    (``past_key_values`` is a deprecated alias there), ``past_key_values`` before (5.20: what vLLM allows)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def out_cache(out: Any) -> Any:
    """The cache a forward pass returned (``out.cache`` from transformers 5.23 on, ``past_key_values`` before)."""
    cache = out.get("cache")
    return cache if cache is not None else out.get("past_key_values")


def select_rows(cache: Any, rows: torch.Tensor) -> None:
    """Keep (or repeat) batch rows ``rows`` of ``cache`` in place. ``reorder_cache`` selects along the batch
    dimension in every layer type, linear-attention conv and recurrent states included;
    ``batch_select_indices`` does not exist on linear-attention layers, and a hybrid layer inherits the
    key/value-only one of ``DynamicLayer`` (it would leave the recurrent states of dropped rows behind)."""
    cache.reorder_cache(rows)


def left_padded(
    prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``prompts`` as one left-padded batch on ``device``: (input ids, attention mask, positions from
    the mask: a row's first real token at position 0)."""
    width = max(len(ids) for ids in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, ids in enumerate(prompts):
        input_ids[row, width - len(ids) :] = torch.tensor(list(ids), dtype=torch.long)
        mask[row, width - len(ids) :] = 1
    input_ids, mask = input_ids.to(device), mask.to(device)
    return input_ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The log-probability of each of ``tokens`` under ``logits`` (``[..., vocab]``, ``tokens``
    ``[...]``): the logit minus the logsumexp, without a log-softmax over the whole vocabulary."""
    return logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
