"""The weight update of an RSFT step: fine-tune a transformers model (all weights, or LoRA adapters) on a
step's examples with TRL's ``SFTTrainer`` (completion-only loss), one AdamW state carried from step to
step."""

from __future__ import annotations

import gc
import logging
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from whale_train.distributed import (
    already_sharded,
    full_state_dict,
    full_tensors,
    gathered,
    per_device_batch,
    shard_like,
    training_rows,
    world,
)
from whale_train.rsft.config import RSFTConfig
from whale_train.rsft.examples import Example

log = logging.getLogger(__name__)


class RSFTUpdater:
    """The weight update of an RSFT step: fine-tunes a transformers model in place on examples, with TRL's
    ``SFTTrainer`` (``RSFT`` is the whole operator: sampling, filtering, this update, versions)."""

    def __init__(self, model: Any, tokenizer: Any, config: RSFTConfig):
        import torch

        self.config = config
        self.tokenizer = tokenizer
        self.model = model
        if config.lora:
            from peft import LoraConfig, get_peft_model

            lora = LoraConfig(
                r=config.lora_r,
                lora_alpha=config.lora_alpha,
                lora_dropout=config.lora_dropout,
                target_modules=lora_targets(model, config.lora_target_modules),
                task_type="CAUSAL_LM",
            )
            # The adapters' initialization draws from the global RNG, whose state depends on what ran
            # before in this process: seed it, so a run and its resumed rerun start from the same adapters.
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(config.seed)
                self.model = get_peft_model(model, lora)
        self.bf16 = config.bf16 if config.bf16 is not None else torch.cuda.is_available()
        # The AdamW state carried from step to step (``keep_optimizer``), saved and resumed with the run.
        # The HF Trainer builds the optimizer itself each step (it refuses a pre-built one under FSDP).
        # Under FSDP2 each rank holds its share of it (sharded like the parameters).
        self.optimizer_state: dict[str, Any] | None = None
        self._scratch = tempfile.TemporaryDirectory(prefix="whale-rsft-")

    def gathered(self) -> Any:
        """A context with the full parameters in ``self.model`` (one process: as they are; under
        sharding every rank enters it, ``distributed.DistributedUpdater.gathered``)."""
        return gathered(self.model)

    def full_state_dict(self) -> dict[str, Any] | None:
        """The model's whole ``state_dict`` when it is sharded (None: ``state_dict()`` is whole)."""
        return full_state_dict(self.model)

    def full_optimizer_state(self) -> dict[str, Any] | None:
        """The whole optimizer state, as one process holds it (under FSDP2: gathered from all ranks).
        Under DeepSpeed ZeRO-3 the state is DeepSpeed's own flat partitions, which this does not gather:
        None (a checkpoint then resumes with a fresh AdamW, and says so)."""
        if any(hasattr(p, "ds_id") for p in self.model.parameters()):
            log.warning("ZeRO-3: the checkpoint holds no optimizer state; a resumed run starts a fresh AdamW")
            return None
        return full_tensors(self.optimizer_state)

    def train(self, examples: list[Example]) -> tuple[float, int]:
        """One fine-tuning pass; returns (mean training loss, completion tokens trained on)."""
        import datasets
        from transformers.trainer_callback import PrinterCallback
        from trl import SFTConfig, SFTTrainer

        datasets.disable_progress_bars()
        cfg = self.config
        rows, distributed_args = training_rows(examples, cfg, self.tokenizer)  # (under accelerate: see there)
        kwargs = sft_arguments(cfg, self._scratch.name, self.bf16)
        kwargs["per_device_train_batch_size"] = per_device_batch(cfg.train_batch_size, world()[1])  # a share
        args = SFTConfig(**kwargs)
        for key, value in distributed_args.items():
            setattr(args, key, value)
        # (already_sharded: FSDP2's first step sharded the model in place)
        with already_sharded(self.model), fingerprint_warnings_off():
            trainer = SFTTrainer(
                model=self.model,
                args=args,
                train_dataset=datasets.Dataset.from_list(rows),
                processing_class=self.tokenizer,
            )
        trainer.remove_callback(PrinterCallback)  # the step report carries the loss
        if cfg.keep_optimizer:
            trainer.add_callback(carry_optimizer_state(self))
        self.last_dataset = trainer.train_dataset
        self.model.train()
        with step_garbage_only() if cfg.keep_optimizer else nullcontext():
            result = trainer.train()
        self.model.eval()
        tokens = sum(len(ex.completion_ids) for ex in examples)
        return float(result.training_loss), tokens


@contextmanager
def fingerprint_warnings_off() -> Iterator[None]:
    """While an SFTTrainer maps its dataset: datasets' warnings about fingerprints off, then as before.

    A Ctrl-C that lands while datasets hashes the transform is swallowed by datasets' bare ``except:``
    (the trainer's INTERRUPTED flag still stops the run), which then warns that the transform "couldn't
    be hashed properly": a second line under ``whale train``'s one line on Ctrl-C. These datasets live
    in memory, never in a cache file, so the random fingerprint it falls back to changes nothing."""
    log = logging.getLogger("datasets.fingerprint")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


#: Set by :func:`heap_frozen_for_good`: this process froze its heap and never unfreezes it.
_FROZEN_FOR_GOOD = False


def heap_frozen_for_good() -> None:
    """Record that this process's heap stays frozen (``gc.freeze()``) for the rest of its life, as a run
    forked from the warm-start zygote's frozen heap does: :func:`step_garbage_only` then leaves the
    freeze alone without counting it."""
    global _FROZEN_FOR_GOOD
    _FROZEN_FOR_GOOD = True


@contextmanager
def step_garbage_only() -> Iterator[None]:
    """The garbage collection the HF Trainer runs at the start of every ``train()`` (accelerate's
    ``free_memory``: a full ``gc.collect()``) looks only at the objects made since this was entered.

    That collection walks every object the process holds, so its cost grows with the process, not with
    the step: 0.6 s in a fresh ``whale train`` on the CPU, beside a step of the shipped model that takes
    about as long, and more in a longer-lived process. Everything alive on entry is frozen
    (``gc.freeze``) and unfrozen on exit, back in the oldest generation, where Python's own collections
    reach its garbage as before. What the collection is there for on an accelerator, an earlier step's
    device memory, an earlier step holds none of when the optimizer state is carried (``keep_optimizer``,
    the only case this is used in): its state is the carried one and its parameters are the model's.
    Without it, the earlier step's AdamW state is garbage that this collection frees, so it stays whole.
    Where something else froze the heap already (vLLM does, after its start-up), nothing is changed:
    unfreezing would undo its freeze too. A process whose heap stays frozen for its whole life says so
    once (:func:`heap_frozen_for_good`; a warm-started run does, before it starts): counting the
    frozen objects walks them all (45 ms a step in a warm run of the shipped model)."""
    if _FROZEN_FOR_GOOD or gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def carry_optimizer_state(holder: Any) -> Any:
    """A ``TrainerCallback`` that keeps one optimizer state across ``train()`` calls without handing the
    HF Trainer a pre-built optimizer (which it refuses under FSDP): when training begins, the optimizer
    the Trainer just built (after ``accelerator.prepare``: under FSDP2 its state is sharded like the
    parameters) loads ``holder.optimizer_state``; when it ends, its ``state_dict()`` goes back there.
    Every step builds its optimizer over the same parameters in the same groups, so the state fits; a
    state saved by the earlier one-group AdamW (a resume checkpoint of an older run) is regrouped."""
    from transformers import TrainerCallback

    class CarryOptimizerState(TrainerCallback):
        def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
            saved = holder.optimizer_state
            if saved is None:
                return
            if len(saved["param_groups"]) != len(optimizer.param_groups):
                saved = _regroup(saved, optimizer, [p for p in holder.model.parameters() if p.requires_grad])
            optimizer.load_state_dict(
                shard_like(saved, optimizer)
            )  # a checkpoint's full state: this rank's share

        def on_train_end(self, args, state, control, optimizer=None, **kwargs):
            holder.optimizer_state = optimizer.state_dict()

    return CarryOptimizerState()


def _regroup(saved: dict[str, Any], optimizer: Any, old_order: list[Any]) -> dict[str, Any]:
    """A one-group optimizer state (parameters numbered in ``old_order``) in the groups of ``optimizer``."""
    if len(saved["param_groups"]) != 1 or len(saved["param_groups"][0]["params"]) != len(old_order):
        raise ValueError("the saved optimizer state does not match the model's parameters")
    index = {id(p): i for i, p in enumerate(old_order)}
    groups, states, at = [], {}, 0
    for group in optimizer.param_groups:
        ids = []
        for p in group["params"]:
            entry = saved["state"].get(index[id(p)])
            if entry is not None:
                states[at] = entry
            ids.append(at)
            at += 1
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": ids})
    return {"state": states, "param_groups": groups}


def lora_targets(model: Any, targets: list[str] | str | None) -> list[str] | str | None:
    """LoRA's ``target_modules``: as given; else PEFT's default for the model type; else all linear layers
    (PEFT knows no default for qwen3_5, and ``get_peft_model`` would refuse)."""
    if targets is not None:
        return targets
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

    return None if getattr(model.config, "model_type", None) in DEFAULTS else "all-linear"


def sft_arguments(cfg: RSFTConfig, output_dir: str, bf16: bool) -> dict[str, Any]:
    """``SFTConfig`` keyword arguments, valid on every transformers the project supports: 5.20 (what
    vllm 0.33 allows) calls gradient checkpointing ``gradient_checkpointing``, 5.23 and later
    ``activation_checkpointing`` (the old name is a deprecated alias there)."""
    import dataclasses as dc

    import torch
    from trl import SFTConfig

    names = {f.name for f in dc.fields(SFTConfig)}
    checkpointing = (
        "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    )
    return dict(
        output_dir=output_dir,
        learning_rate=cfg.learning_rate,
        num_train_epochs=cfg.epochs,
        per_device_train_batch_size=cfg.train_batch_size,
        gradient_accumulation_steps=1,
        max_grad_norm=cfg.max_grad_norm,
        weight_decay=cfg.weight_decay,
        lr_scheduler_type="constant",
        warmup_steps=0,
        completion_only_loss=True,
        max_length=cfg.max_length,
        packing=False,
        bf16=bf16,
        **{checkpointing: cfg.gradient_checkpointing},
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        eval_strategy="no",
        disable_tqdm=True,
        optim="adamw_torch",
        seed=cfg.seed,
        data_seed=cfg.seed,
        use_cpu=not torch.cuda.is_available(),
        dataloader_num_workers=0,
        dataset_num_proc=None,
    )
