"""The models of a run: the rollout backend its config names (``backend``: transformers, an in-process
vLLM engine, or OpenAI-compatible servers), and the module RSFT trains when that backend cannot be
trained in place."""

from __future__ import annotations

from typing import Any

from whale_train import distributed
from whale_train.trainer.config import TrainConfig


def load_backend(config: TrainConfig) -> Any:
    """The rollout backend of ``config``: ``whale_train.llm.load_llm`` with the backend's options, or
    several ``vllm serve`` replicas (``base_url`` lists more than one, or ``backend_options.weight_sync``)."""
    from whale_train.llm import load_llm

    kwargs = dict(config.backend_options)
    if config.backend == "openai":
        urls = [u.strip() for u in (config.base_url or "").split(",") if u.strip()]
        if len(urls) > 1 or "weight_sync" in kwargs:  # several vllm serve replicas
            from whale_train.llm.replicas import make_replicas

            return make_replicas(urls, config.model or "default", **kwargs)
        kwargs["base_url"] = config.base_url
    if config.backend == "vllm":
        kwargs.setdefault("tensor_parallel_size", config.tensor_parallel_size)
    return load_llm(config.backend, config.model, **kwargs)


def train_model(config: TrainConfig, llm: Any) -> Any:
    """The module RSFT trains: the transformers backend's own model (None: trained in place), or for a
    backend that takes pushed weights (vLLM) a transformers copy on the GPU in float32 (bf16 autocast
    comes from ``rsft.bf16``; float32 master weights keep updates at lr ~1e-6 from rounding away).
    Under sharding (FSDP2 / ZeRO-3) the transformers backend also gets a separate training copy: the
    sharded module can only run a forward with every rank, and rank 0 samples alone."""
    if not hasattr(llm, "load_weights") and not distributed.sharded():
        return None
    import torch
    from transformers import AutoModelForCausalLM

    from whale_train.llm import default_model

    model = AutoModelForCausalLM.from_pretrained(config.model or default_model(), dtype=torch.float32)
    return model.to("cuda" if torch.cuda.is_available() else "cpu")
