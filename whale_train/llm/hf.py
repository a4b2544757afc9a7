"""The transformers backend: the CPU default, and the trainer's in-place model on GPUs without vLLM.

A small sampling loop over the model's forward pass instead of ``generate()``, for three reasons:
every row samples from its own ``torch.Generator`` seeded by its request (a rollout does not depend on
its batch mates), rows have their own temperature / top-p / max_tokens / stop strings, and finished
rows leave the batch (the cache is compacted, hybrid linear-attention caches included) so one long
completion does not slow the rest down. Over-long prompts keep their end (``base.fit_prompt``).
Prompts are left-padded; positions come from the attention mask.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from whale_train.llm.base import Completion, Prompt, Request, TokenizerPrompts, cut_at_stop, fit_prompt


class TransformersLLM(TokenizerPrompts):
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
        cache = _out_cache(self.model(input_ids=ids, use_cache=True, logits_to_keep=1))
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
        width = max(len(ids) for ids in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, ids in enumerate(prompts):
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            mask[row, width - len(ids) :] = 1
        reqs = [req for _, req in batch]
        gens = [torch.Generator().manual_seed(int(req.seed) % (2**63)) for req in reqs]
        temps = torch.tensor([req.params.temperature for req in reqs], dtype=torch.float32)
        top_ps = torch.tensor([req.params.top_p for req in reqs], dtype=torch.float32)
        out_ids: list[list[int]] = [[] for _ in range(n)]
        active = list(range(n))  # original row index of each row still being sampled
        rows = list(
            range(n)
        )  # original row index of each row of the batch (finished rows stay without compaction)

        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
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
            cache = _out_cache(out)
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
            return _out_cache(out), out.logits[:, -1, :].float().cpu()
        caches, logits = [], []
        for s in range(0, rows, per):
            out = self.model(
                input_ids=input_ids[s : s + per],
                attention_mask=mask[s : s + per],
                position_ids=positions[s : s + per],
                use_cache=True,
                logits_to_keep=1,
            )
            caches.append(_out_cache(out))
            logits.append(out.logits[:, -1, :].float().cpu())
        cache = caches[0]
        for i, layer in enumerate(cache.layers):
            layer.keys = torch.cat([c.layers[i].keys for c in caches])
            layer.values = torch.cat([c.layers[i].values for c in caches])
        return cache, torch.cat(logits)

    def _hit_stop(self, ids: list[int], stop: tuple[str, ...]) -> bool:
        tail = self.tokenizer.decode(ids[-16:], skip_special_tokens=True)
        return any(s and s in tail for s in stop)

    # ------------------------------------------------------------------------------ scoring

    def score(self, prompt: Prompt, continuations: list[str]) -> list[Completion]:
        """Summed log-likelihood of each continuation after ``prompt`` (see ``score_many``)."""
        return self.score_many([(prompt, continuations)])[0]

    @torch.inference_mode()
    def score_many(self, items: Sequence[tuple[Prompt, list[str]]]) -> list[list[Completion]]:
        """``score`` of many (prompt, continuations) pairs at once, in as few forward passes as fit.

        Shared prefix: each prompt is encoded once (prompts batched, left-padded), its cache is
        repeated once per continuation, and all continuations of all prompts run in one more forward
        pass on those caches (right-padded: a causal model's outputs at real positions never see the
        padding after them). Only the log-probabilities of the continuation tokens are computed
        (logit minus logsumexp at those positions), not a log-softmax over every position of the
        prompt. The tokens every continuation of a prompt begins with (``<move>`` of every chess
        move) go with the prompt, once, not once per continuation. A model whose cache cannot select
        rows is scored on full sequences instead."""
        prepared = []
        for prompt, continuations in items:
            text = self.render(prompt)
            conts = (
                self.tokenizer(list(continuations), add_special_tokens=False)["input_ids"]
                if continuations
                else []
            )
            prepared.append((text, self.encode(text), [list(c) for c in conts]))
        results: list[list[Completion]] = []
        if not self.compactable:
            for text, ids, conts in prepared:
                lps = [
                    lp
                    for i in range(0, len(conts), self.max_batch_size)
                    for lp in self._score_full(ids, conts[i : i + self.max_batch_size])
                ]
                results.append(self._scored(text, ids, conts, lps, items[len(results)][1]))
            return results
        # Groups of prompts whose continuations together fit in ``4 * max_batch_size`` rows.
        group: list[int] = []
        rows = 0
        budget = 4 * self.max_batch_size
        lps_of: dict[int, list[float]] = {}
        for k, (_, _, conts) in enumerate(prepared):
            if group and rows + len(conts) > budget:
                lps_of.update(self._score_shared([prepared[i] for i in group], group))
                group, rows = [], 0
            group.append(k)
            rows += len(conts)
        if group:
            lps_of.update(self._score_shared([prepared[i] for i in group], group))
        return [
            self._scored(text, ids, conts, lps_of[k], items[k][1])
            for k, (text, ids, conts) in enumerate(prepared)
        ]

    def _scored(self, text, prompt_ids, conts, lps, continuations) -> list[Completion]:
        return [
            Completion(
                text=continuations[j],
                prompt_text=text,
                prompt_ids=list(prompt_ids),
                completion_ids=list(cont),
                finish_reason="stop",
                prompt_tokens=len(prompt_ids),
                completion_tokens=len(cont),
                logprob=lp,
            )
            for j, (cont, lp) in enumerate(zip(conts, lps, strict=True))
        ]

    def _score_shared(self, group: list, keys: list[int]) -> dict[int, list[float]]:
        """Log-likelihoods for one group of (text, prompt ids, continuation ids): one forward of the
        prompts, each followed by the tokens all its continuations share, then the rest of every
        continuation on the repeated caches, in chunks of ``max_batch_size`` rows."""
        shared = [_common_prefix(conts) for _, _, conts in group]
        prompts = [(ids or [self.pad_id]) + common for (_, ids, _), common in zip(group, shared, strict=True)]
        width = max(map(len, prompts))
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, ids in enumerate(prompts):
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            mask[row, width - len(ids) :] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        keep = 1 + max(map(len, shared))
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=keep,
        )
        logits = out.logits[:, -keep:, :].float()
        last = logits[:, -1, :]
        first_lp = last - torch.logsumexp(last, dim=-1, keepdim=True)  # [prompts, vocab]: the next token
        common_lp = []  # each prompt's shared tokens, scored once
        for row, common in enumerate(shared):
            if not common:
                common_lp.append(0.0)
                continue
            at = logits[row, keep - 1 - len(common) : keep - 1]
            tok = torch.tensor(common, device=at.device).unsqueeze(-1)
            common_lp.append(
                float((at.gather(-1, tok).squeeze(-1) - torch.logsumexp(at, dim=-1)).double().sum())
            )
        prompt_cache = _out_cache(out)
        rest = [[cont[len(shared[p]) :] for cont in conts] for p, (_, _, conts) in enumerate(group)]
        if self.packable:
            sums = self._score_packed(rest, prompt_cache, mask, positions, first_lp, common_lp)
            return _by_key(keys, group, sums)
        flat = [(p, cont) for p, conts in enumerate(rest) for cont in conts]
        sums: list[float] = []
        for start in range(0, len(flat), self.max_batch_size):
            chunk = flat[start : start + self.max_batch_size]
            owner = torch.tensor([p for p, _ in chunk], device=self.device)
            head = first_lp[owner, torch.tensor([c[0] if c else 0 for _, c in chunk], device=self.device)]
            tail = [0.0] * len(chunk)
            length = max(len(c) for _, c in chunk)
            if length > 1:
                cache = prompt_cache if start + len(chunk) >= len(flat) else copy.deepcopy(prompt_cache)
                select_rows(cache, owner)
                ids = torch.full((len(chunk), length - 1), self.pad_id, dtype=torch.long)
                cmask = torch.zeros_like(ids)
                for row, (_, c) in enumerate(chunk):
                    ids[row, : len(c) - 1] = torch.tensor(c[:-1], dtype=torch.long)
                    cmask[row, : len(c) - 1] = 1
                ids, cmask = ids.to(self.device), cmask.to(self.device)
                cpos = positions[owner, -1:] + 1 + torch.arange(length - 1, device=self.device)
                logits = self.model(
                    input_ids=ids,
                    attention_mask=torch.cat([mask[owner], torch.ones_like(cmask)], dim=1),
                    position_ids=cpos,
                    use_cache=True,
                    **{self._cache_arg: cache},
                ).logits.float()
                target = torch.full((len(chunk), length - 1), 0, dtype=torch.long)
                for row, (_, c) in enumerate(chunk):
                    target[row, : len(c) - 1] = torch.tensor(c[1:], dtype=torch.long)
                target = target.to(self.device)
                picked = logits.gather(-1, target.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
                tail = (picked * cmask).sum(-1).double().cpu().tolist()
            head = head.double().cpu().tolist()
            sums += [
                (common_lp[p] + h + t) if c else common_lp[p]
                for h, t, (p, c) in zip(head, tail, chunk, strict=True)
            ]
        return _by_key(keys, group, sums)

    def _score_packed(self, rest, prompt_cache, mask, positions, first_lp, common_lp) -> list[float]:
        """The continuations of each prompt packed into one sequence after its cache (each option
        sees the prompt and its own earlier tokens only: a 4D mask, positions restarting after the
        prompt), so the prompt's cache is never repeated per option. Prompts in chunks of about
        ``8 * max_batch_size`` packed tokens; the summed log-likelihoods in the order of ``rest``."""
        budget = 8 * self.max_batch_size
        sums: list[float] = []
        n = len(rest)
        start = 0
        while start < n:
            stop, longest = start, 0
            while stop < n:
                length = sum(max(0, len(c) - 1) for c in rest[stop])
                if stop > start and max(longest, length) * (stop - start + 1) > budget:
                    break
                longest = max(longest, length)
                stop += 1
            sums += self._packed_chunk(
                rest[start:stop],
                start,
                stop == n,
                longest,
                prompt_cache,
                mask,
                positions,
                first_lp,
                common_lp,
            )
            start = stop
        return sums

    def _packed_chunk(
        self, rest, start, last, width, prompt_cache, mask, positions, first_lp, common_lp
    ) -> list[float]:
        rows = len(rest)
        heads = []
        for p, conts in enumerate(rest):
            for c in conts:
                heads.append(
                    float(first_lp[start + p, c[0]]) + common_lp[start + p] if c else common_lp[start + p]
                )
        if width == 0:
            return heads
        ids = torch.full((rows, width), self.pad_id, dtype=torch.long)
        offset = torch.zeros((rows, width), dtype=torch.long)
        option = torch.full((rows, width), -1, dtype=torch.long)
        target = torch.zeros((rows, width), dtype=torch.long)
        for p, conts in enumerate(rest):
            at = 0
            for o, c in enumerate(conts):
                k = len(c) - 1
                if k <= 0:
                    continue
                ids[p, at : at + k] = torch.tensor(c[:-1], dtype=torch.long)
                target[p, at : at + k] = torch.tensor(c[1:], dtype=torch.long)
                offset[p, at : at + k] = torch.arange(k)
                option[p, at : at + k] = o
                at += k
        select = torch.arange(start, start + rows, device=self.device)
        cache = prompt_cache if last else copy.deepcopy(prompt_cache)  # the last chunk may use it up
        if rows != mask.shape[0]:
            select_rows(cache, select)
        prompt_mask = mask[select].bool()  # [rows, prompt width]
        option, offset = option.to(self.device), offset.to(self.device)
        own = (option.unsqueeze(2) == option.unsqueeze(1)) & (option.unsqueeze(1) >= 0)
        step = torch.arange(width, device=self.device)
        own &= step.view(1, 1, -1) <= step.view(1, -1, 1)  # a key at or before its query
        allowed = torch.cat([prompt_mask.unsqueeze(1).expand(-1, width, -1), own], dim=2)
        dtype = self.model.dtype
        mask4d = torch.zeros(allowed.shape, dtype=dtype, device=self.device)
        mask4d.masked_fill_(~allowed, torch.finfo(dtype).min)
        logits = self.model(
            input_ids=ids.to(self.device),
            attention_mask=mask4d.unsqueeze(1),
            position_ids=positions[select, -1:] + 1 + offset,
            use_cache=True,
            **{self._cache_arg: cache},
        ).logits.float()
        target = target.to(self.device)
        picked = logits.gather(-1, target.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
        picked = picked.double().cpu()
        out, i = [], 0
        for p, conts in enumerate(rest):
            at = 0
            for c in conts:
                k = max(0, len(c) - 1)
                out.append(heads[i] + float(picked[p, at : at + k].sum()))
                at += k
                i += 1
        return out

    def _score_full(self, prompt_ids: list[int], chunk: list[list[int]]) -> list[float]:
        """Log-likelihoods of ``chunk`` on full prompt + continuation sequences (no shared cache)."""
        seqs = [prompt_ids + c for c in chunk]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, s in enumerate(seqs):
            ids[row, : len(s)] = torch.tensor(s)
            mask[row, : len(s)] = 1
        logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits.float()
        n = len(prompt_ids)
        out = []
        for row, cont in enumerate(chunk):
            if not cont:
                out.append(0.0)
                continue
            rows = logits[row, n - 1 : n - 1 + len(cont)]
            tok = torch.tensor(cont, device=rows.device).unsqueeze(-1)
            out.append(
                float((rows.gather(-1, tok).squeeze(-1) - torch.logsumexp(rows, dim=-1)).double().sum())
            )
        return out


def _by_key(keys: list[int], group: list, sums: list[float]) -> dict[int, list[float]]:
    """The flat ``sums`` of a group's continuations, per prompt key (an empty continuation scores 0)."""
    out: dict[int, list[float]] = {}
    i = 0
    for key, (_, _, conts) in zip(keys, group, strict=True):
        out[key] = [lp if cont else 0.0 for lp, cont in zip(sums[i : i + len(conts)], conts, strict=True)]
        i += len(conts)
    return out


def _common_prefix(conts: list[list[int]]) -> list[int]:
    """The tokens every continuation begins with, short of the shortest one's last token (each
    continuation keeps at least one token of its own)."""
    if not conts:
        return []
    n = min(map(len, conts)) - 1
    first = conts[0]
    for i in range(max(0, n)):
        if any(c[i] != first[i] for c in conts):
            return first[:i]
    return first[: max(0, n)]


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


def cache_argument(model: Any) -> str:
    """The name of the forward pass's cache argument: ``cache`` from transformers 5.23 on
    (``past_key_values`` is a deprecated alias there), ``past_key_values`` before (5.20: what vLLM allows)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def _out_cache(out: Any) -> Any:
    """The cache a forward pass returned (``out.cache`` from transformers 5.23 on, ``past_key_values`` before)."""
    cache = out.get("cache")
    return cache if cache is not None else out.get("past_key_values")


def select_rows(cache: Any, rows: torch.Tensor) -> None:
    """Keep (or repeat) batch rows ``rows`` of ``cache`` in place. ``reorder_cache`` selects along the batch
    dimension in every layer type, linear-attention conv and recurrent states included;
    ``batch_select_indices`` does not exist on linear-attention layers, and a hybrid layer inherits the
    key/value-only one of ``DynamicLayer`` (it would leave the recurrent states of dropped rows behind)."""
    cache.reorder_cache(rows)


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids = set()
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (gen_eos, tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(int(v) for v in value)
    return ids
