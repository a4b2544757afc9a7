"""vLLM in-process, for GPUs (``pip install 'whale-harness[gpu]'``). Import-guarded: nothing here runs on a CPU.

Each request becomes its own ``SamplingParams`` with its seed, so rollouts are reproducible as with the
transformers backend. Prompts longer than the engine's ``max_model_len`` allows are cut with the
transformers backend's rule (``base.fit_prompt``), and a batch that vLLM still refuses is retried one
request at a time, so a bad request fails its episode only.

``load_weights`` pushes a trained model's weights into the running engine (no round trip through
disk), which is what the trainer calls after an RSFT step: LoRA merged, names mapped onto the engine's
checkpoint (``weights.py``: a ``Qwen3_5ForCausalLM`` training copy into the ``Qwen3_5ForConditionalGeneration``
engine the hub checkpoints declare), each tensor checked against it, then loaded through vLLM 0.33's
worker method ``reload_weights`` (``collective_rpc``), which works in-process and for multiprocess /
tensor-parallel engines alike (every worker loads its shard through the model's own weight loaders).
Exercised by ``benchmarks/gpu_check.sh`` on a GPU and, against a fake engine that enforces vLLM's rules,
by tests/test_vllm_push.py on a CPU.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from whale_train.llm.base import Completion, Prompt, Request, TokenizerPrompts, cut_at_stop, fit_prompt
from whale_train.llm.weights import check_push, checkpoint_tensors, engine_names

#: The vLLM release the ``gpu`` extra pins and this module is written against.
VLLM_VERSION = "0.33.0"


def vllm_available() -> bool:
    try:
        import torch
        import vllm  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


def model_files(model: str) -> Path:
    """The local directory of ``model`` (a directory, or a hub id already in the Hugging Face cache)."""
    if Path(model).is_dir():
        return Path(model)
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(model, local_files_only=True))


class VLLMLLM(TokenizerPrompts):
    """``LLM`` over an in-process ``vllm.LLM`` engine.

    Args:
        model: a local directory or hub id.
        chat_template_kwargs: passed to the chat template (Qwen3.5: ``{"enable_thinking": False}``, or
            its template opens a thinking block in every reply).
        batch_invariant: run vLLM in batch-invariant mode (``VLLM_BATCH_INVARIANT=1``): a request's output
            does not depend on its batch mates, so rollouts repeat exactly (slower kernels).
        multiprocess: run the engine core in its own process (needed for tensor parallelism). Default:
            ``VLLM_ENABLE_V1_MULTIPROCESSING`` if set, else off, so the engine shares this process (and
            GPU memory accounting) with the training copy.
        continuous: run vLLM's async engine (``vllm.v1.engine.async_llm.AsyncLLM``, its core always in a
            process of its own) and hand it each episode's requests as soon as the episode makes them
            (``submit``): no turn barrier, the engine batches continuously. Same per-request seeds.
        engine_kwargs: passed to ``vllm.LLM`` (e.g. ``gpu_memory_utilization``, ``dtype``, ``max_model_len``,
            ``tensor_parallel_size``). ``dtype`` defaults to vLLM's ``auto`` (a float32 checkpoint runs in
            bfloat16 then); give ``dtype: float32`` for a like-for-like parity check.
    """

    def __init__(
        self,
        model: str,
        *,
        chat_template_kwargs: dict[str, Any] | None = None,
        batch_invariant: bool = False,
        multiprocess: bool | None = None,
        continuous: bool = False,
        **engine_kwargs: Any,
    ):
        if not vllm_available():
            raise RuntimeError(
                "the vllm backend needs a CUDA GPU and `pip install 'whale-harness[gpu]'` (vllm)"
            )
        if multiprocess is not None:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocess else "0"
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if batch_invariant:
            os.environ["VLLM_BATCH_INVARIANT"] = "1"
        engine_kwargs.setdefault("gpu_memory_utilization", 0.4)
        engine_kwargs.setdefault("enable_prefix_caching", True)
        self.continuous = continuous
        self._loop: asyncio.AbstractEventLoop | None = None
        self._request_ids = itertools.count()
        if continuous:
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM

            # The engine's output handler is a task of the running event loop (async_llm.py,
            # _run_output_handler): one loop, in a thread of its own, serves every request.
            self._loop = asyncio.new_event_loop()
            threading.Thread(target=self._loop.run_forever, name="whale-vllm-loop", daemon=True).start()
            self.engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=model, **engine_kwargs))
        else:
            from vllm import LLM

            self.engine = LLM(model=model, **engine_kwargs)
        self.last_push_seconds: float | None = None
        files = model_files(model)
        # A transformers tokenizer of the same files: prompts are encoded here (the engine gets token ids),
        # and RSFT's SFTTrainer needs a transformers tokenizer.
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(files))
        self.name = model
        self.version = 0
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        config = (
            getattr(self.engine, "model_config", None) or self.engine.llm_engine.model_config
        )  # LLM / AsyncLLM
        self.max_model_len = int(config.max_model_len)
        self.dtype = getattr(config, "dtype", None)
        hf = json_file(files / "config.json")
        self.architecture = (hf.get("architectures") or [""])[0]
        self.checkpoint = checkpoint_tensors(files)  # what the engine loaded: each push is checked against it

    def _prepared(self, requests: list[Request], final_only: bool = False) -> tuple[list, list, list]:
        from vllm import SamplingParams

        texts = [self.render(r.prompt) for r in requests]
        # vLLM rejects the whole generate() call if one prompt leaves no room (input_processor.py,
        # _validate_prompt_len): cut over-long prompts as the transformers backend does.
        ids = [
            fit_prompt(self.encode(t), r.params.max_tokens, self.max_model_len)
            for t, r in zip(texts, requests, strict=True)
        ]
        extra: dict[str, Any] = {}
        if final_only:  # the async engine streams by default; one output at the end is all we read
            from vllm.sampling_params import RequestOutputKind

            extra["output_kind"] = RequestOutputKind.FINAL_ONLY
        params = [
            SamplingParams(
                temperature=r.params.temperature,
                top_p=r.params.top_p,
                max_tokens=min(r.params.max_tokens, max(1, self.max_model_len - len(i))),
                stop=list(r.params.stop) or None,
                seed=int(r.seed % 2**31),
                **extra,
            )
            for r, i in zip(requests, ids, strict=True)
        ]
        return texts, ids, params

    def complete(self, requests: list[Request]) -> list[Completion]:
        if self.continuous:
            return self.submit(requests).result()
        texts, ids, params = self._prepared(requests)
        outs = self.engine.generate([{"prompt_token_ids": i} for i in ids], params, use_tqdm=False)
        return self._completions(requests, texts, ids, outs)

    def submit(self, requests: list[Request]) -> Future:
        """Continuous mode: hand ``requests`` to the async engine now; a Future of their completions.
        Each request joins the engine's running batch on its own (a bad one fails this call only)."""
        if not self.continuous or self._loop is None:
            raise RuntimeError("submit() needs VLLMLLM(continuous=True)")
        texts, ids, params = self._prepared(requests, final_only=True)

        async def run() -> list[Completion]:
            outs = await asyncio.gather(*(self._generate(i, sp) for i, sp in zip(ids, params, strict=True)))
            return self._completions(requests, texts, ids, outs)

        return asyncio.run_coroutine_threadsafe(run(), self._loop)

    async def _generate(self, ids: list[int], params: Any) -> Any:
        final = None
        async for out in self.engine.generate(
            {"prompt_token_ids": ids}, params, request_id=f"whale-{next(self._request_ids)}"
        ):
            final = out
        return final

    def _on_loop(self, coro: Any) -> Any:
        """Run a coroutine of the async engine on its loop and wait for it (continuous mode)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()  # type: ignore[arg-type]

    def _completions(self, requests, texts, ids, outs) -> list[Completion]:
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
        pids = self.encode(text)
        conts = [self.encode(c) for c in continuations]
        if self.continuous:
            from vllm.sampling_params import RequestOutputKind

            sp = SamplingParams(
                max_tokens=1, prompt_logprobs=0, temperature=0, output_kind=RequestOutputKind.FINAL_ONLY
            )

            async def run() -> list[Any]:
                return list(await asyncio.gather(*(self._generate(pids + c, sp) for c in conts)))

            outs = self._on_loop(run())
        else:
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
        """Copy trained weights into the engine in place (no disk), then drop cached prefixes.

        ``named_tensors``: ``(name, tensor)`` in the training model's naming with LoRA merged
        (``weights.trained_weights``). They are renamed into the engine checkpoint's naming and checked
        against it (``WeightPushError`` names the first that does not fit), then loaded by every worker
        through ``reload_weights`` (vllm/v1/worker/gpu_worker.py, ``Worker.reload_weights`` ->
        ``GPUModelRunner.reload_weights`` -> the model's ``load_weights``, which shards for tensor
        parallelism). Tensors go in the engine's dtype; to a multiprocess engine as CPU tensors, since
        they travel to the workers serialized."""
        import torch

        start = time.perf_counter()
        weights = check_push(
            engine_names(named_tensors, self.architecture), self.checkpoint, self.architecture
        )
        # vllm/v1/engine/llm_engine.py; the async engine's core is always another process
        in_process = not self.continuous and hasattr(self.engine.llm_engine, "model_executor")
        dtype = self.dtype if isinstance(self.dtype, torch.dtype) else None
        # In the engine's dtype (float32 master weights into a bf16 engine: vLLM's loader would warn per
        # tensor); across a process boundary as CPU tensors (msgpack serializes host memory).
        device = None if in_process else "cpu"
        weights = [
            (n, t.to(device=device or t.device, dtype=dtype or t.dtype).contiguous()) for n, t in weights
        ]
        rpc = self.engine.collective_rpc(
            "reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True}
        )
        if self.continuous:
            self._on_loop(rpc)
        reset = getattr(self.engine, "reset_prefix_cache", None)
        if reset is not None:
            done = reset()
            if self.continuous:
                self._on_loop(done)
        self.version += 1
        self.last_push_seconds = round(time.perf_counter() - start, 3)


def json_file(path: Path) -> dict[str, Any]:
    import json

    return json.loads(path.read_text()) if path.exists() else {}
