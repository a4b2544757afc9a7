"""vLLM in-process, for GPUs (``pip install whale[gpu]``). Import-guarded: nothing here runs on a CPU.

Each request becomes its own ``SamplingParams`` with its seed, so rollouts are reproducible as with the
transformers backend. ``load_weights`` pushes a trained model's weights into the running engine
(no round trip through disk), which is what the trainer calls after an RSFT step. It is exercised by
``benchmarks/gpu_check.sh`` on a GPU machine.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from whale_train.llm.base import Completion, Prompt, Request, cut_at_stop


def vllm_available() -> bool:
    try:
        import torch
        import vllm  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


class VLLMLLM:
    """``LLM`` over an in-process ``vllm.LLM`` engine.

    Args:
        model: a local directory or hub id.
        engine_kwargs: passed to ``vllm.LLM`` (e.g. ``gpu_memory_utilization``, ``dtype``, ``max_model_len``).
    """

    def __init__(self, model: str, **engine_kwargs: Any):
        if not vllm_available():
            raise RuntimeError("the vllm backend needs a CUDA GPU and `pip install whale[gpu]` (vllm)")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # keep the model in this process
        from vllm import LLM

        engine_kwargs.setdefault("gpu_memory_utilization", 0.4)
        engine_kwargs.setdefault("enable_prefix_caching", True)
        self.engine = LLM(model=model, **engine_kwargs)
        self.tokenizer = self.engine.get_tokenizer()
        self.name = model
        self.version = 0

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def render(self, prompt: Prompt) -> str:
        if isinstance(prompt, str):
            return prompt
        return self.tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)

    def complete(self, requests: list[Request]) -> list[Completion]:
        from vllm import SamplingParams

        texts = [self.render(r.prompt) for r in requests]
        ids = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        params = [
            SamplingParams(
                temperature=r.params.temperature,
                top_p=r.params.top_p,
                max_tokens=r.params.max_tokens,
                stop=list(r.params.stop) or None,
                seed=int(r.seed % 2**31),
            )
            for r in requests
        ]
        outs = self.engine.generate([{"prompt_token_ids": i} for i in ids], params, use_tqdm=False)
        results = []
        for req, text, pids, out in zip(requests, texts, ids, outs, strict=True):
            o = out.outputs[0]
            body, _ = cut_at_stop(o.text, req.params.stop)
            results.append(
                Completion(
                    text=body,
                    prompt_text=text,
                    prompt_ids=list(pids),
                    completion_ids=list(o.token_ids),
                    finish_reason="length" if o.finish_reason == "length" else "stop",
                    prompt_tokens=len(pids),
                    completion_tokens=len(o.token_ids),
                )
            )
        return results

    def score(self, prompt: Prompt, continuations: list[str]) -> list[Completion]:
        from vllm import SamplingParams

        text = self.render(prompt)
        pids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        conts = [self.tokenizer(c, add_special_tokens=False)["input_ids"] for c in continuations]
        sp = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0)
        outs = self.engine.generate([{"prompt_token_ids": pids + c} for c in conts], sp, use_tqdm=False)
        results = []
        for cont, c_ids, out in zip(continuations, conts, outs, strict=True):
            lps = out.prompt_logprobs or []
            total = 0.0
            for pos, tok in enumerate(c_ids, start=len(pids)):
                entry = lps[pos] if pos < len(lps) else None
                if entry and tok in entry:
                    total += float(entry[tok].logprob)
            results.append(
                Completion(cont, text, list(pids), list(c_ids), "stop", len(pids), len(c_ids), logprob=total)
            )
        return results

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Copy trained weights into the engine in place (no disk), then drop cached prefixes."""
        weights = list(named_tensors)
        engine = self.engine.llm_engine
        try:  # single-process engine: reach the model directly (as TRL's colocate mode does)
            runner = engine.model_executor.driver_worker.worker.model_runner
            runner.model.load_weights(weights)
        except AttributeError:
            engine.collective_rpc("load_weights", kwargs={"weights": weights})
        reset = getattr(self.engine, "reset_prefix_cache", None)
        if reset is not None:
            reset()
        self.version += 1
