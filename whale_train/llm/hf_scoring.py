"""Scoring for the transformers backend: the summed log-likelihood of continuations after a prompt
(``score`` / ``score_many``: a chess move's options, an answer's choices), in as few forward passes as
fit. A mixin of :class:`~whale_train.llm.hf.TransformersLLM`, which holds the model, tokenizer and the
flags this reads (``compactable``: the cache can select rows; ``packable``: options can be packed after
their prompt with a 4D mask)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from whale_train.llm.base import Completion, Prompt, TokenizerPrompts
from whale_train.llm.hf_cache import left_padded, out_cache, select_rows, token_logprobs


class SharedPrefixScoring(TokenizerPrompts):
    """``score`` and ``score_many`` over a transformers model: each prompt encoded once, its cache shared
    by its continuations (see ``score_many``)."""

    model: Any
    device: torch.device
    pad_id: int
    max_batch_size: int
    compactable: bool
    packable: bool
    _cache_arg: str

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
        input_ids, mask, positions = left_padded(prompts, self.pad_id, self.device)
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
            tok = torch.tensor(common, device=at.device)
            common_lp.append(float(token_logprobs(at, tok).double().sum()))
        prompt_cache = out_cache(out)
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
                picked = token_logprobs(logits, target)
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
        picked = token_logprobs(logits, target).double().cpu()
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
            tok = torch.tensor(cont, device=rows.device)
            out.append(float(token_logprobs(rows, tok).double().sum()))
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
