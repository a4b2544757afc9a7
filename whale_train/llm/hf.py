"""The transformers backend: the CPU default, and the trainer's in-place model on GPUs without vLLM.

A small sampling loop over the model's forward pass instead of ``generate()``, for three reasons:
every row samples from its own ``torch.Generator`` seeded by its request (a rollout does not depend on
its batch mates), rows have their own temperature / top-p / max_tokens / stop strings, and finished
rows leave the batch (the cache is compacted, hybrid linear-attention caches included) so one long
completion does not slow the rest down. Over-long prompts keep their end (``base.fit_prompt``).
Prompts are left-padded; positions come from the attention mask. Scoring (``score``, ``score_many``)
is hf_scoring.py's; the forward-pass plumbing both share is hf_cache.py's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from whale_train.llm.base import Completion, Request, cut_at_stop, fit_prompt
from whale_train.llm.hf_cache import cache_argument, left_padded, out_cache, select_rows
from whale_train.llm.hf_scoring import SharedPrefixScoring


class TransformersLLM(SharedPrefixScoring):
    """An ``LLM`` over a transformers causal LM and its tokenizer.

    Args:
        model: a model directory / hub id, or a loaded ``PreTrainedModel``.
        tokenizer: a loaded tokenizer (default: loaded from ``model``).
        max_batch_size: most sequences in one forward pass.
        device, dtype: where and in which precision to run (default: CPU, float32).
        chat_template_kwargs: passed to the chat template (Qwen3.5: ``{"enable_thinking": False}``, or its
            template opens a thinking block in every reply).
    """

    def __init__(
        self,
        model: str | Path | Any,
        tokenizer: Any | None = None,
        *,
        max_batch_size: int = 128,
        device: str | None = None,
        dtype: torch.dtype | None = None,
        name: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ):
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # no per-shard bars in the middle of our own progress output
        if isinstance(dtype, str):  # from a YAML config: "bfloat16", "float32"
            dtype = getattr(torch, dtype)
        if isinstance(model, str | Path):
            path = str(model)
            self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
            self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(path)
            self.name = name or path
        else:
            self.model = model
            self.tokenizer = tokenizer
            self.name = name or getattr(model.config, "_name_or_path", "") or type(model).__name__
        if self.tokenizer is None:
            raise ValueError("a tokenizer is needed when the model is passed as an object")
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model.to(self.device)
        self.model.eval()
        self.max_batch_size = max_batch_size
        #: Prompt tokens per prefill forward pass on a CPU (see ``_prefill``); a GPU takes the batch whole.
        self.prefill_tokens = 2048 if self.device.type == "cpu" else 1 << 30
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.version = 0
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.tokenizer.eos_token_id
        self.eos_ids = _eos_ids(self.model, self.tokenizer)
        text_config = (
            self.model.config.get_text_config() if hasattr(self.model.config, "get_text_config") else None
        )
        self.max_positions = int(getattr(text_config or self.model.config, "max_position_embeddings", 4096))
        self._cache_arg = cache_argument(self.model)
        self.compactable = self._probe_cache()
        #: Score options packed after their prompt (a custom 4D mask): only where every layer is full
        #: attention through sdpa/eager (a linear-attention layer would carry state across options).
        layers = getattr(text_config or self.model.config, "layer_types", None) or ["full_attention"]
        self.packable = (
            self.compactable
            and all(t == "full_attention" for t in layers)
            and getattr(self.model.config, "_attn_implementation", None) in ("sdpa", "eager")
        )

    @torch.inference_mode()
    def _probe_cache(self) -> bool:
        """Whether this model's cache can select batch rows (``reorder_cache``: every cache class of
        transformers, hybrid linear-attention ones included). A model whose cache cannot (a remote-code
        model with a cache of its own) is sampled without compaction: finished rows stay in the batch."""
        ids = torch.tensor([[self.pad_id]], device=self.device)
        cache = out_cache(self.model(input_ids=ids, use_cache=True, logits_to_keep=1))
        from transformers.cache_utils import DynamicLayer

        layers = getattr(cache, "layers", None)
        # Prefill slices can be joined: every layer a plain key/value one (not linear attention).
        self._joinable = bool(layers) and all(type(layer) is DynamicLayer for layer in layers)
        return cache is not None and callable(getattr(cache, "reorder_cache", None))

    # ------------------------------------------------------------------------------ sampling (prompts: TokenizerPrompts)

    #: ``complete`` takes ``on_done``: the batcher hands each finished completion back at once.
    streams = True

    @torch.inference_mode()
    def complete(
        self, requests: Sequence[Request], on_done: Callable[[int, Completion], None] | None = None
    ) -> list[Completion]:
        """Sample every request; ``on_done(i, completion)`` is called as soon as request ``i`` is done,
        while the rest of its batch still decodes (its episode goes on meanwhile: its env step, a tool
        call, its next prompt)."""
        results: list[Completion | None] = [None] * len(requests)
        prepared = []
        for i, req in enumerate(requests):
            text = self.render(req.prompt)
            ids = self.encode(text)
            ids = fit_prompt(ids, req.params.max_tokens, self.max_positions)
            prepared.append((i, text, ids))
        prepared.sort(key=lambda p: len(p[2]))  # similar lengths share a batch: less padding
        for start in range(0, len(prepared), self.max_batch_size):
            chunk = prepared[start : start + self.max_batch_size]

            def finished(row: int, new_ids: list[int], finish: str, chunk=chunk) -> None:
                i, text, ids = chunk[row]
                results[i] = self._completion(requests[i], text, ids, new_ids, finish)
                if on_done is not None:
                    on_done(i, results[i])

            self._sample([(ids, requests[i]) for i, _, ids in chunk], finished)
        return results  # type: ignore[return-value]

    def _completion(self, req: Request, prompt_text: str, prompt_ids, new_ids, finish) -> Completion:
        body = [t for t in new_ids if t not in self.eos_ids]
        text = self.tokenizer.decode(body, skip_special_tokens=True)
        text, _ = cut_at_stop(text, req.params.stop)
        return Completion(
            text=text,
            prompt_text=prompt_text,
            prompt_ids=list(prompt_ids),
            completion_ids=list(new_ids),
            finish_reason=finish,
            prompt_tokens=len(prompt_ids),
            completion_tokens=len(new_ids),
        )

    def _sample(
        self,
        batch: list[tuple[list[int], Request]],
        finished: Callable[[int, list[int], str], None] | None = None,
    ) -> list[tuple[list[int], str]]:
        """Sample each row of ``batch``: (new ids, finish reason) per row; ``finished(row, new ids,
        finish reason)`` is called as each row ends, before the rest of the batch is done."""
        n = len(batch)
        finish = ["length"] * n

        def end(r: int, why: str) -> None:
            finish[r] = why
            if finished is not None:
                finished(r, out_ids[r], why)

        compact = self.compactable
        # Identical prompts (a vote's n samples, retries) are encoded once; the cache is then copied.
        # Without row selection in the cache (see ``compactable``) every row is encoded on its own.
        unique: dict[tuple[int, ...], int] = {}
        if compact:
            row_of = [unique.setdefault(tuple(ids), len(unique)) for ids, _ in batch]
            prompts = list(unique)
        else:
            row_of, prompts = list(range(n)), [tuple(ids) for ids, _ in batch]
        input_ids, mask, positions = left_padded(prompts, self.pad_id, self.device)
        reqs = [req for _, req in batch]
        gens = [torch.Generator().manual_seed(int(req.seed) % (2**63)) for req in reqs]
        temps = torch.tensor([req.params.temperature for req in reqs], dtype=torch.float32)
        top_ps = torch.tensor([req.params.top_p for req in reqs], dtype=torch.float32)
        out_ids: list[list[int]] = [[] for _ in range(n)]
        active = list(range(n))  # original row index of each row still being sampled
        rows = list(
            range(n)
        )  # original row index of each row of the batch (finished rows stay without compaction)

        cache, logits = self._prefill(input_ids, mask, positions)
        if len(prompts) < n:
            expand = torch.tensor(row_of)
            select_rows(cache, expand.to(self.device))
            mask, positions, logits = (
                mask[expand.to(self.device)],
                positions[expand.to(self.device)],
                logits[expand],
            )
        tokens = torch.full((n,), self.pad_id, dtype=torch.long)
        while active:
            at = [rows.index(r) for r in active] if not compact else list(range(len(active)))
            drawn = _draw(logits[at], temps[active], top_ps[active], [gens[r] for r in active])
            keep = []
            for j, r in enumerate(active):
                tok = int(drawn[j])
                out_ids[r].append(tok)
                params = reqs[r].params
                if tok in self.eos_ids or (params.stop and self._hit_stop(out_ids[r], params.stop)):
                    end(r, "stop")
                elif len(out_ids[r]) < params.max_tokens:
                    keep.append(j)
                else:
                    end(r, "length")
            if not keep:
                break
            if compact:
                tokens = drawn
                if len(keep) < len(active):
                    idx = torch.tensor(keep, device=self.device)
                    select_rows(cache, idx)
                    mask, positions, tokens = mask[idx], positions[idx], drawn[keep]
                    rows = [active[j] for j in keep]
                active = [active[j] for j in keep]
            else:  # finished rows stay in the batch and are fed padding; their outputs are ignored
                tokens = tokens.clone()
                tokens[at] = drawn
                active = [active[j] for j in keep]
            mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=mask.dtype, device=self.device)], dim=1)
            positions = positions[:, -1:] + 1
            out = self.model(
                input_ids=tokens.view(-1, 1).to(self.device),
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                **{self._cache_arg: cache},
            )
            cache = out_cache(out)
            logits = out.logits[:, -1, :].float().cpu()
        return list(zip(out_ids, finish, strict=True))

    def _prefill(self, input_ids, mask, positions) -> tuple[Any, torch.Tensor]:
        """The prompts' forward pass: (cache, last logits on the CPU). A batch of long prompts runs in
        slices of about ``prefill_tokens`` tokens whose caches are then joined (128 chess prompts of
        ~340 tokens at once took longer on a CPU than the same prompts 16 at a time: attention
        scores of that size leave the caches); only for plain key/value caches."""
        rows, width = input_ids.shape
        per = max(1, self.prefill_tokens // width)
        if per >= rows or not self._joinable:
            out = self.model(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                logits_to_keep=1,
            )
            return out_cache(out), out.logits[:, -1, :].float().cpu()
        caches, logits = [], []
        for s in range(0, rows, per):
            out = self.model(
                input_ids=input_ids[s : s + per],
                attention_mask=mask[s : s + per],
                position_ids=positions[s : s + per],
                use_cache=True,
                logits_to_keep=1,
            )
            caches.append(out_cache(out))
            logits.append(out.logits[:, -1, :].float().cpu())
        cache = caches[0]
        for i, layer in enumerate(cache.layers):
            layer.keys = torch.cat([c.layers[i].keys for c in caches])
            layer.values = torch.cat([c.layers[i].values for c in caches])
        return cache, torch.cat(logits)

    def _hit_stop(self, ids: list[int], stop: tuple[str, ...]) -> bool:
        tail = self.tokenizer.decode(ids[-16:], skip_special_tokens=True)
        return any(s and s in tail for s in stop)


def _draw(
    logits: torch.Tensor, temps: torch.Tensor, top_ps: torch.Tensor, gens: list[torch.Generator]
) -> torch.Tensor:
    """One token per row: greedy where temperature is 0, else inverse-CDF sampling with the row's generator."""
    greedy = logits.argmax(dim=-1)
    if bool((temps == 0).all()):
        return greedy
    probs = torch.softmax(logits / temps.clamp(min=1e-5).unsqueeze(1), dim=-1)
    if bool((top_ps < 1).any()):
        sorted_p, order = probs.sort(dim=-1, descending=True)
        drop = sorted_p.cumsum(-1) - sorted_p > top_ps.unsqueeze(1)
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    cdf = probs.cumsum(dim=-1)
    u = torch.stack([torch.rand((), generator=g) for g in gens]).unsqueeze(1) * cdf[:, -1:]
    sampled = torch.searchsorted(cdf, u).squeeze(1).clamp(max=logits.shape[-1] - 1)
    return torch.where(temps == 0, greedy, sampled)


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids = set()
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (gen_eos, tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(int(v) for v in value)
    return ids
