"""The supervised warm-start pass of ``whale pretrain``: its config, the example stream over the
registered domains' formats, tokens and length-bucketed batches, the learning-rate schedule, training."""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from whale_train.config_io import option
from whale_train.domains import registered
from whale_train.pretrain.formats import Example, TextFormats, _pick

#: The domains pretrained on (those registered with pretraining formats; the built-in three).
DOMAINS = tuple(d.name for d in registered() if d.pretrain_formats)


@dataclass
class PretrainConfig:
    """Everything that decides the model ``whale pretrain`` writes (recorded in the card); one
    ``whale pretrain`` option per field, its help text in the field."""

    out: str = option(
        "tiny-model",
        "the output directory (save_pretrained files, README.md, whale_pretrain.json)",
    )
    size: str = option("tiny", "tiny (~0.9M parameters) or small (~5M); see whale_train.tiny.SIZES")
    minutes: float = option(
        30.0,
        "wall-clock budget of the supervised pass (data generation included); ignored when steps is set",
    )
    steps: int | None = option(
        None,
        "a fixed number of optimizer steps instead of a time budget (replays a recorded run)",
    )
    seed: int = option(0, "seeds the tokenizer sample, the data stream and order, and the initialization")
    lr: float = option(
        3e-3,
        "peak learning rate (AdamW); linear warm-up over warmup_steps, then cosine decay to lr * min_lr_ratio",
    )
    min_lr_ratio: float = option(0.05, "final learning rate as a fraction of lr")
    warmup_steps: int = option(100, "linear warm-up steps; with minutes, the step count is fixed after them")
    weight_decay: float = option(0.05, "AdamW weight decay (not on norms or biases)")
    batch_tokens: int = option(4096, "about this many tokens (padding included) per optimizer step")
    max_len: int = option(768, "examples longer than this many tokens are cut from the left")
    prompt_loss_weights: str = option(
        "chess=0.1,math=0.05,search=1",
        "loss weight of prompt tokens per domain (reply tokens weigh 1)",
    )
    mix: str = option(
        "chess=0.06,math=0.72,search=0.22",
        'share of examples per domain, "chess=0.4,math=0.3,search=0.3"',
    )
    chess_levels: str = option(
        "1=0.95,2=0.05",
        'share of chess generator levels, "1=0.9,2=0.1" (mate-in-1 levels only)',
    )
    math_levels: str = option(
        "1=0.45,2=0.35,3=0.15,4=0.05",
        "share of math generator levels (1-5); the four families are equally likely",
    )
    search_hops: str = option("1=0.5,2=0.3,3=0.2", "share of search hop counts (1-3)")
    vocab_size: int = option(1024, "tokenizer vocabulary size (special tokens included)")
    tokenizer_docs: int = option(3000, "examples the tokenizer is trained on")
    eval_tasks: int = option(0, "tasks of each domain's test split in the card's calibration (0 = none)")
    eval_k: int = option(8, "samples per task (mean@k)")
    eval_harnesses: str = option("h0", "h0 (each domain's base harness) or all (every shipped harness)")
    eval_domains: str = option("chess,math,search", "comma-separated domains to calibrate")
    threads: int = option(
        0,
        "torch CPU threads for training and calibration (0 = torch's default). On a machine shared with other work, 1 thread is steadier than 2",
    )

    def validate(self) -> None:
        from whale_train.tiny import SIZES

        if self.size not in SIZES:
            raise ValueError(f"size must be one of {', '.join(SIZES)}, got {self.size!r}")
        if self.steps is None and not self.minutes > 0:
            raise ValueError(f"minutes must be positive, got {self.minutes!r}")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"steps must be at least 1, got {self.steps!r}")
        if self.eval_harnesses not in ("h0", "all"):
            raise ValueError(f"eval_harnesses must be 'h0' or 'all', got {self.eval_harnesses!r}")
        domains = pretrain_domains()
        unknown = set(self.domain_list()) - set(domains)
        if unknown:
            raise ValueError(f"unknown eval domains {sorted(unknown)}; known: {', '.join(domains)}")
        levels = [(f.levels_field, f.level_keys) for f in domains.values() if f.levels_field]
        for name, keys in (("mix", tuple(domains)), *levels, ("prompt_loss_weights", tuple(domains))):
            shares = parse_shares(getattr(self, name))
            if set(shares) - set(keys) or (not shares and name != "prompt_loss_weights"):
                raise ValueError(f"{name}: keys must be among {', '.join(keys)}, got {getattr(self, name)!r}")

    def domain_list(self) -> list[str]:
        return [d for d in self.eval_domains.replace(" ", "").split(",") if d]


def parse_shares(text: str) -> dict[str, float]:
    """``"a=0.4,b=0.6"`` -> ``{"a": 0.4, "b": 0.6}`` (shares need not sum to 1; zeros are dropped)."""
    out = {}
    for part in text.replace(" ", "").split(","):
        if part:
            key, _, value = part.partition("=")
            if float(value) < 0:
                raise ValueError(f"negative share in {text!r}")
            if float(value) > 0:
                out[key] = float(value)
    return out


def pretrain_domains() -> dict[str, TextFormats]:
    """Domain name -> its ``TextFormats``, for every registered domain that has pretraining formats."""
    return {d.name: d.load_pretrain_formats() for d in registered() if d.pretrain_formats}


def examples(config: PretrainConfig, stream: str = "train") -> Iterator[Example]:
    """The endless warm-start stream: a pure function of ``config`` (seed, shares) and ``stream``."""
    rng = random.Random(f"whale-pretrain/{stream}/{config.seed}")
    mix = parse_shares(config.mix)
    domains = pretrain_domains()
    levels = {
        d: parse_shares(getattr(config, f.levels_field)) if f.levels_field else {"1": 1.0}
        for d, f in domains.items()
    }
    makers = {d: f.maker() for d, f in domains.items()}
    while True:
        domain = _pick(rng, mix)
        level = int(_pick(rng, levels[domain]))
        yield makers[domain](rng, level)


# ============================================================================ tokens and batches


def chat_prompt(user: str) -> str:
    """The ChatML text of one user turn and the assistant header (what ``tiny.CHAT_TEMPLATE`` renders)."""
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def example_text(ex: Example) -> tuple[str, str]:
    """(prompt text, reply text) as the model sees them, end-of-turn token included in the reply."""
    if ex.chat:
        return chat_prompt(ex.prompt), ex.reply + "<|im_end|>"
    return ex.prompt, ex.reply + "<|endoftext|>"


@dataclass
class Batch:
    input_ids: Any  # LongTensor [n, width], right-padded
    attention_mask: Any  # LongTensor [n, width]
    weights: Any  # FloatTensor [n, width]: the loss weight of predicting each token (0 on padding)
    tokens: int  # real (unpadded) tokens
    domains: Counter


def batches(config: PretrainConfig, tokenizer, chunk: int = 1024) -> Iterator[Batch]:
    """Length-bucketed batches of about ``config.batch_tokens`` tokens (padding included), in an order
    fixed by the seed: ``chunk`` examples are tokenized, sorted by length, cut into batches, shuffled."""
    import torch

    rng = random.Random(f"whale-pretrain/batches/{config.seed}")
    stream = examples(config)
    pad = tokenizer.pad_token_id
    prompt_weight = {d: 0.0 for d in pretrain_domains()} | parse_shares(config.prompt_loss_weights)
    while True:
        exs = [next(stream) for _ in range(chunk)]
        texts = [example_text(e) for e in exs]
        prompts = tokenizer([p for p, _ in texts], add_special_tokens=False)["input_ids"]
        replies = tokenizer([r for _, r in texts], add_special_tokens=False)["input_ids"]
        rows = []
        for ex, p, r in zip(exs, prompts, replies, strict=True):
            ids = (p + r)[-config.max_len :]
            w = ([prompt_weight[ex.domain]] * len(p) + [1.0] * len(r))[-config.max_len :]
            w[0] = 0.0  # nothing predicts the first token
            rows.append((ids, w, ex.domain))
        rows.sort(key=lambda row: len(row[0]))
        groups, current = [], []
        for row in rows:
            if current and (len(current) + 1) * len(row[0]) > config.batch_tokens:
                groups.append(current)
                current = []
            current.append(row)
        groups.append(current)
        rng.shuffle(groups)
        for group in groups:
            width = max(len(ids) for ids, _, _ in group)
            input_ids = torch.full((len(group), width), pad, dtype=torch.long)
            mask = torch.zeros((len(group), width), dtype=torch.long)
            weights = torch.zeros((len(group), width), dtype=torch.float32)
            for i, (ids, w, _) in enumerate(group):
                input_ids[i, : len(ids)] = torch.tensor(ids)
                mask[i, : len(ids)] = 1
                weights[i, : len(ids)] = torch.tensor(w)
            domains: Counter = Counter()
            for ids, _, domain in group:
                domains[domain] += len(ids)
            yield Batch(input_ids, mask, weights, int(mask.sum()), domains)


def tokenizer_corpus(config: PretrainConfig) -> list[str]:
    """The texts the tokenizer is trained on: ``tokenizer_docs`` examples of their own seeded stream."""
    stream = examples(config, stream="tokenizer")
    return ["".join(example_text(next(stream))) for _ in range(config.tokenizer_docs)]


# ============================================================================ training


def lr_at(step: int, total: int, config: PretrainConfig) -> float:
    """Learning rate of optimizer step ``step`` (1-based) of ``total``: linear warm-up, cosine decay."""
    if step <= config.warmup_steps:
        return config.lr * step / config.warmup_steps
    span = max(1, total - config.warmup_steps)
    progress = min(1.0, (step - config.warmup_steps) / span)
    floor = config.lr * config.min_lr_ratio
    return floor + (config.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


@dataclass
class TrainRecord:
    """What the supervised pass did (goes into the card)."""

    steps: int = 0
    planned_steps: int = 0
    seconds: float = 0.0
    tokens: int = 0
    tokens_by_domain: dict[str, int] = field(default_factory=dict)
    final_loss: float | None = None
    interrupted: bool = False


def train(model, tokenizer, config: PretrainConfig, console=None) -> TrainRecord:
    """The supervised pass (see the module docstring). Returns the record; Ctrl-C ends it early."""
    import torch
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr,
        betas=(0.9, 0.95),
    )
    record = TrainRecord(planned_steps=config.steps or 0)
    budget = None if config.steps else config.minutes * 60
    total = (
        config.steps or 10**9
    )  # in minutes mode: fixed at the end of the warm-up (which it does not affect)
    by_domain: Counter = Counter()
    recent: list[float] = []
    log_lines = console is not None and not console.is_terminal
    model.train()
    start = time.monotonic()
    stream = batches(config, tokenizer)
    columns = (
        TextColumn("[bold]pretrain"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}  lr {task.fields[lr]}  {task.fields[tps]} tok/s"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as bar:
        job = bar.add_task("train", total=config.steps, loss="-", lr="-", tps="-")
        step = 0
        try:
            while step < total:
                step += 1
                batch = next(stream)
                lr = lr_at(step, total, config)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
                targets = batch.input_ids[:, 1:]
                w = batch.weights[:, 1:]
                ce = torch.nn.functional.cross_entropy(
                    logits[:, :-1].reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none"
                )
                loss = (ce * w.reshape(-1)).sum() / w.sum().clamp(min=1e-6)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                record.steps = step
                record.tokens += batch.tokens
                by_domain.update(batch.domains)
                recent = (recent + [loss.item()])[-50:]
                elapsed = time.monotonic() - start
                if budget is not None and step == config.warmup_steps:
                    per_step = elapsed / step
                    total = max(step + 1, int(budget / per_step))
                    record.planned_steps = total
                    bar.update(job, total=total)
                if log_lines and step % 100 == 0:  # no live bar in a log file: a line now and then
                    console.print(
                        f"step {step}/{total if total < 10**9 else '?'}  loss {sum(recent) / len(recent):.3f}  "
                        f"lr {lr:.1e}  {record.tokens / elapsed:,.0f} tok/s  {elapsed / 60:.1f} min"
                    )
                bar.update(
                    job,
                    completed=step,
                    loss=f"{sum(recent) / len(recent):.3f}",
                    lr=f"{lr:.1e}",
                    tps=f"{record.tokens / elapsed:,.0f}",
                )
        except KeyboardInterrupt:
            record.interrupted = True
    model.eval()
    record.seconds = round(time.monotonic() - start, 1)
    record.tokens_by_domain = dict(sorted(by_domain.items()))
    record.final_loss = round(sum(recent) / len(recent), 4) if recent else None
    if not record.planned_steps:
        record.planned_steps = total if total < 10**9 else step
    return record
