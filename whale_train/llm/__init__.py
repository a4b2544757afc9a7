"""LLM backends behind one interface (see ``base.py``): transformers (CPU default), an OpenAI-compatible
server, vLLM in-process (GPU), and model-free LLMs for checks (``scripted.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from whale_train.llm.base import LLM, Completion, Prompt, Request, SamplingParams, ScoreUnsupported

BACKENDS = ("transformers", "openai", "vllm")

#: Engine options only the vllm backend has: a config written for vLLM (configs/gpu) also runs with
#: ``backend: transformers``, which ignores them.
VLLM_ONLY = {
    "gpu_memory_utilization",
    "enable_prefix_caching",
    "max_model_len",
    "batch_invariant",
    "multiprocess",
    "continuous",
    "tensor_parallel_size",
    "enforce_eager",
    "push_check",
}

#: Where the shipped tiny model lives (``whale pretrain`` writes it; see docs/MODEL_CARD.md).
SHIPPED_MODEL = Path(__file__).resolve().parent.parent / "models" / "tiny"


class ModelNotFound(FileNotFoundError):
    """The model named by ``--model`` cannot be loaded (offline, so only local directories work)."""


def default_model() -> str:
    """The shipped tiny model, the default ``--model`` of every command."""
    if not (SHIPPED_MODEL / "config.json").exists():
        raise ModelNotFound(f"the shipped model is missing at {SHIPPED_MODEL}; pass --model PATH")
    return str(SHIPPED_MODEL)


def load_llm(backend: str = "transformers", model: str | None = None, **kwargs: Any) -> LLM:
    """Build the ``backend`` LLM for ``model`` (default: the shipped tiny model).

    transformers: ``model`` is a local directory (or a cached hub id); vllm: the same, on a GPU;
    openai: ``model`` is the served name and ``base_url=`` is required.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
    if backend == "openai":
        from whale_train.llm.openai_compat import OpenAILLM

        if not kwargs.get("base_url"):
            raise ValueError("the openai backend needs base_url (e.g. http://localhost:8000/v1)")
        llm = OpenAILLM(kwargs.pop("base_url"), model or "default", **kwargs)
        llm.preflight()  # a missing server or model: one line now, not a failure in every episode
        return llm
    model = model or default_model()
    if backend == "vllm":
        from whale_train.llm.vllm_backend import VLLMLLM

        return VLLMLLM(model, **kwargs)
    from whale_train.llm.hf import TransformersLLM

    kwargs = {k: v for k, v in kwargs.items() if k not in VLLM_ONLY}
    try:
        return TransformersLLM(model, **kwargs)
    except OSError as exc:
        hint = "" if Path(model).exists() else " (no such directory; hub downloads are off: HF_HUB_OFFLINE=1)"
        raise ModelNotFound(f"cannot load model {model!r}{hint}: {str(exc).splitlines()[0]}") from None


__all__ = [
    "BACKENDS",
    "LLM",
    "Completion",
    "ModelNotFound",
    "Prompt",
    "Request",
    "SamplingParams",
    "ScoreUnsupported",
    "default_model",
    "load_llm",
]
