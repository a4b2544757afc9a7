"""The weight phase: online rejection-sampling fine-tuning (RSFT) under the current harness.

One RSFT step: take the next ``batch_tasks`` tasks of an epoch-ordered stream over the ``train``
split, roll out ``samples`` episodes each under the current harness, keep the trajectories whose
reward passes ``reward_threshold``, turn every model call in them into a prompt-completion example on
the *exact token ids that were sampled*, and fine-tune with TRL's ``SFTTrainer`` (completion-only
loss). The model is trained in place, so the rollout backend (transformers) sees the new weights at
once; a vLLM backend gets them through ``load_weights`` (no round trip through disk).

A step with no accepted trajectory is a logged no-op: the weights and the version stay.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym

from harnesses.loader import HarnessRef
from whale_train.config_io import Config, at_least, option
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
from whale_train.rollout import LLMCall, RolloutConfig, Trajectory, run_rollouts, summarize

log = logging.getLogger(__name__)


@dataclass
class RSFTConfig(Config):
    """Options of the weight operator (``rsft:`` of a train config)."""

    batch_tasks: int = option(64, "tasks per step (B)")
    samples: int = option(8, "rollouts per task (k)")
    reward_threshold: float = option(
        1.0, "a trajectory is accepted when its reward is at least this (1.0 = solved)"
    )
    per_task_cap: int | None = option(None, "at most this many accepted trajectories per task (None = all)")
    dedup: bool = option(True, "drop repeated (prompt, completion) examples within a step")
    require_stop: bool = option(
        True,
        "keep only completions that ended by themselves (end-of-sequence or a stop string), not cut at max_tokens",
    )
    learning_rate: float = option(
        1e-4, "AdamW learning rate (CALIBRATION: ~1e-4 on the tiny model; >2e-4 collapses)"
    )
    epochs: int = option(1, "passes over a step's examples")
    train_batch_size: int = option(16, "examples per optimizer step")
    max_grad_norm: float = option(1.0, "gradient clipping")
    weight_decay: float = option(0.0, "AdamW weight decay")
    keep_optimizer: bool = option(True, "keep one AdamW state across steps (as in the calibration runs)")
    lora: bool = option(
        False, "train LoRA adapters (PEFT) instead of all weights; lora_r / lora_alpha / lora_dropout"
    )
    lora_r: int = option(16, "LoRA rank")
    lora_alpha: int = option(32, "LoRA alpha")
    lora_dropout: float = option(0.0, "LoRA dropout")
    lora_target_modules: list[str] | str | None = option(
        None,
        "the modules LoRA adapts (PEFT's target_modules); default: PEFT's choice for the architecture where it "
        'has one (Qwen3: q_proj, v_proj), else "all-linear" (Qwen3.5)',
    )
    bf16: bool | None = option(None, "bf16 autocast for training (default: on on CUDA, off on CPU)")
    gradient_checkpointing: bool = option(
        False, "trade compute for memory (off: the tiny model does not need it)"
    )
    max_length: int = option(2048, "longest training sequence (longer examples are dropped, not cut)")
    concurrency: int = option(128, "episodes in flight while sampling")
    save_checkpoints: bool = option(True, "save every model version with save_pretrained")
    seed: int = option(0, "task-stream order, sampling and training seed")

    def validate(self) -> None:
        at_least(self, 1, "batch_tasks", "samples", "epochs", "train_batch_size", "max_length", "concurrency")
        if not 0 < self.learning_rate < 1:
            raise ValueError(f"RSFTConfig.learning_rate must be in (0, 1), got {self.learning_rate}")


# ------------------------------------------------------------------------------------------ data


@dataclass(frozen=True)
class Example:
    """One training example: the exact ids the model saw (prompt) and produced (completion)."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    task_id: str

    def row(self) -> dict[str, list[int]]:
        ids = list(self.prompt_ids) + list(self.completion_ids)
        return {
            "input_ids": ids,
            "completion_mask": [0] * len(self.prompt_ids) + [1] * len(self.completion_ids),
        }


def accept(trajs: list[Trajectory], config: RSFTConfig) -> list[Trajectory]:
    """The trajectories whose reward passes the threshold, at most ``per_task_cap`` per task."""
    kept: list[Trajectory] = []
    per_task: dict[str, int] = {}
    for t in trajs:
        if t.reward < config.reward_threshold or t.error:
            continue
        if config.per_task_cap is not None and per_task.get(t.task_id, 0) >= config.per_task_cap:
            continue
        per_task[t.task_id] = per_task.get(t.task_id, 0) + 1
        kept.append(t)
    return kept


def examples_from(trajs: list[Trajectory], config: RSFTConfig, tokenizer: Any) -> list[Example]:
    """Every trainable call of the accepted trajectories as an example on its sampled token ids.

    Only what the model sampled is trained on: ``sample`` calls, on their completion ids as generated
    (a call without token ids, from a remote backend that does not return them, is re-tokenized from
    its text). Scoring calls (``score``, and ``choice``: ``llm.choose`` of any number of options) are
    never examples: their text is the harness's, which the model only scored, and a one-option choice
    would otherwise turn any text a harness writes into training data.
    """
    out: list[Example] = []
    seen: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
    for t in trajs:
        for call in used_calls(t):
            ex = _example(call, t.task_id, tokenizer, config)
            if ex is None:
                continue
            key = (ex.prompt_ids, ex.completion_ids)
            if config.dedup and key in seen:
                continue
            seen.add(key)
            out.append(ex)
    return out


def used_calls(t: Trajectory) -> list[LLMCall]:
    """The calls of a trajectory whose output the episode used.

    - A call whose completion holds only what the env rejected (the argument of an action that came back
      with an error, e.g. the illegal move before a retry) is not used: an accepted episode may contain
      a mistake it recovered from, and the mistake is not what to learn.
    - Calls that share a prompt within one episode are alternatives a harness chose among (a vote, a
      best-of-n): of those, only a completion that holds what the env accepted (the argument of one of
      the episode's actions, e.g. ``7`` of ``answer: 7`` or ``print(3*4)`` of ``python: print(3*4)``) is
      used, so a losing vote or a discarded sample is never trained on as if it had solved the task.
    - Any other call (its prompt is its own) is used, and so is every call of an episode whose actions
      the env all rejected (kept only with a reward threshold of 0)."""
    good: set[str] = set()
    bad: set[str] = set()
    for step in t.steps:
        action = " ".join(step.action.split())
        if not action:
            continue
        _head, colon, rest = action.partition(":")
        forms = {action, rest.strip()} if colon and rest.strip() else {action}
        (bad if step.error else good).update(forms)
    if not good:  # the env accepted no action at all (reward threshold 0): nothing to prefer
        return list(t.calls)
    bad -= good
    groups = Counter(call.prompt_text for call in t.calls if call.kind == "sample")
    kept = []
    for call in t.calls:
        text = " ".join((call.completion or "").split())
        holds_good = any(p in text for p in good)
        if any(p in text for p in bad) and not holds_good:
            continue
        if call.kind == "sample" and groups[call.prompt_text] > 1 and not holds_good:
            continue
        kept.append(call)
    return kept


def _example(call: LLMCall, task_id: str, tokenizer: Any, config: RSFTConfig) -> Example | None:
    if call.kind != "sample":  # scoring calls (score, choice): the model sampled nothing
        return None
    if config.require_stop and call.finish_reason != "stop":
        return None
    prompt = call.prompt_ids
    completion = call.completion_ids
    if prompt is None:
        prompt = tokenizer(call.prompt_text, add_special_tokens=False)["input_ids"]
    if completion is None:
        completion = tokenizer(call.completion, add_special_tokens=False)["input_ids"]
    completion = list(completion)
    if not completion or len(prompt) + len(completion) > config.max_length:
        return None
    return Example(tuple(prompt), tuple(completion), task_id)


class TaskStream:
    """An epoch-ordered stream over task ids: each epoch is a fresh seeded shuffle. ``position`` counts
    the tasks handed out so far, so a stream can be resumed exactly (``TaskStream(ids, seed, position)``)."""

    def __init__(self, task_ids: list[str], seed: int = 0, position: int = 0):
        if not task_ids:
            raise ValueError("the task stream needs at least one task")
        self.task_ids = list(task_ids)
        self.seed = seed
        self.position = position

    def _epoch(self, epoch: int) -> list[str]:
        order = list(self.task_ids)
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def take(self, n: int) -> list[str]:
        out = []
        for _ in range(n):
            epoch, i = divmod(self.position, len(self.task_ids))
            out.append(self._epoch(epoch)[i])
            self.position += 1
        return out

    @property
    def epochs_done(self) -> float:
        return self.position / len(self.task_ids)


# ------------------------------------------------------------------------------------------ training


class ModelFailure(RuntimeError):
    """Every episode of an evaluation or an RSFT step failed in the model (not the harness): the run stops."""


def check_model(trajs: list[Any], what: str) -> None:
    """Stop when every episode's model calls failed (a broken backend); some failures (one bad request)
    only fail their episodes, which are counted as ``model_error``."""
    errors = [t.error for t in trajs if t.failure == "model_error"]
    if trajs and len(errors) == len(trajs):
        raise ModelFailure(
            f"the model failed in all {len(trajs)} episodes of {what}: {errors[0].splitlines()[0]}"
        )


@dataclass
class StepReport:
    """What one RSFT step did (the signals the trainer logs)."""

    step: int
    model_version: int
    tasks: int
    rollouts: int
    train_reward: float
    pass_at_k: float
    accepted: int
    examples: int
    train_tokens: int
    loss: float | None
    sample_seconds: float
    train_seconds: float
    epochs_done: float
    updated: bool
    failures: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


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
        with already_sharded(self.model):  # FSDP2: the first step sharded the model in place
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
        result = trainer.train()
        self.model.eval()
        tokens = sum(len(ex.completion_ids) for ex in examples)
        return float(result.training_loss), tokens


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


class RSFT:
    """The weight operator: ``step()`` runs one RSFT step, ``phase(n_steps)`` several.

    Args:
        llm: the rollout backend. A ``TransformersLLM`` is trained in place; any backend with a
            ``load_weights(named_tensors)`` method (vLLM) gets the weights of ``train_model`` after each step.
        harness: the current harness (``HarnessRef``); the trainer swaps it between phases.
        env_id, env_kwargs: the env and its task source; the stream runs over the ``train`` split.
        checkpoint_dir: where model versions are saved (``<dir>/<version>/``), if ``save_checkpoints``.
        train_model: the module to train when it is not ``llm.model`` (vLLM; or a transformers backend
            under sharding, whose rollout model must not be the sharded one: it gets the gathered
            weights after each step).
    """

    def __init__(
        self,
        config: RSFTConfig,
        llm: Any,
        harness: HarnessRef,
        env_id: str,
        env_kwargs: dict[str, Any] | None = None,
        *,
        checkpoint_dir: str | Path | None = None,
        train_model: Any | None = None,
        stream_position: int = 0,
    ):
        config.validate()
        self.config = config
        self.llm = llm
        self.harness = harness
        self.env_id = env_id
        self.env_kwargs = {k: v for k, v in (env_kwargs or {}).items() if k != "split"}
        env = gym.make(env_id, split="train", **self.env_kwargs).unwrapped
        self.stream = TaskStream(env.task_ids, seed=config.seed, position=stream_position)
        model = train_model if train_model is not None else llm.model
        self.tokenizer = getattr(llm, "tokenizer", None)
        self.trainer = RSFTUpdater(model, self.tokenizer, config)
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self.steps_done = 0
        # the rollout backend holds its own weights, which get the trained ones after each step
        self.pushes = hasattr(llm, "load_weights") or train_model is not None

    @property
    def steps_per_epoch(self) -> float:
        return len(self.stream.task_ids) / self.config.batch_tasks

    def steps_for(self, epochs: float) -> int:
        """Steps in ``epochs`` (a fraction of an epoch of the ``train`` split), at least one."""
        return max(1, round(epochs * self.steps_per_epoch))

    def step(self) -> StepReport:
        cfg = self.config
        tasks = self.stream.take(cfg.batch_tasks)
        start = time.monotonic()
        rollout = RolloutConfig(
            k=cfg.samples,
            seed=cfg.seed * 100_003 + self.steps_done,
            concurrency=cfg.concurrency,
            trusted=self.harness.shipped,
        )
        trajs = run_rollouts(
            self.harness,
            self.env_id,
            self.llm,
            tasks,
            env_kwargs={"split": "train", **self.env_kwargs},
            config=rollout,
        )
        sample_seconds = time.monotonic() - start
        check_model(trajs, f"RSFT step {self.steps_done}")
        summary = summarize(trajs)
        accepted = accept(trajs, cfg)
        examples = examples_from(accepted, cfg, self.tokenizer)
        self.last_examples = examples
        loss, tokens, train_seconds = None, 0, 0.0
        if examples:
            start = time.monotonic()
            loss, tokens = self.trainer.train(examples)
            self._publish()
            train_seconds = time.monotonic() - start
        else:
            log.info("RSFT step %d: no accepted trajectory, no update", self.steps_done)
        report = StepReport(
            step=self.steps_done,
            model_version=int(getattr(self.llm, "version", 0)),
            tasks=len(tasks),
            rollouts=len(trajs),
            train_reward=summary["mean"],
            pass_at_k=summary["pass_at_k"],
            accepted=len(accepted),
            examples=len(examples),
            train_tokens=tokens,
            loss=loss,
            sample_seconds=round(sample_seconds, 3),
            train_seconds=round(train_seconds, 3),
            epochs_done=round(self.stream.epochs_done, 4),
            updated=bool(examples),
            failures=summary["failures"],
        )
        self.steps_done += 1
        return report

    def _publish(self) -> None:
        """Hand the new weights to the rollout backend and save the version."""
        if self.pushes:
            self.push()
        else:  # transformers: the same module was trained in place
            self.llm.version = int(getattr(self.llm, "version", 0)) + 1
        if self.config.save_checkpoints and self.checkpoint_dir is not None:
            self.save(self.checkpoint_dir / str(self.llm.version))

    def push(self) -> None:
        """Push the trained weights into a backend that takes them (vLLM): detached, LoRA merged into
        the base weights under the base names (``llm.weights.trained_weights``); under sharding the
        full parameters are gathered from every rank for it. A transformers backend beside a separate
        training model (under sharding) gets them copied into its own model."""
        from whale_train.llm.weights import trained_weights

        with self.trainer.gathered():
            weights = trained_weights(self.trainer.model)
            if hasattr(self.llm, "load_weights"):
                self.llm.load_weights(weights)
                if hasattr(self.llm, "verify_push") and world()[1] == 1:  # the engine computes with them
                    self.llm.verify_push(self.trainer.model)  # (PushCheckError stops the run in one line)
            else:
                import torch

                own = dict(self.llm.model.named_parameters())
                with torch.no_grad():
                    for name, tensor in weights:
                        own[name].copy_(tensor.to(own[name].device, own[name].dtype))
                self.llm.version = int(getattr(self.llm, "version", 0)) + 1

    def save(self, path: Path) -> Path:
        """``save_pretrained`` the current weights (with LoRA: the adapter, in PEFT's format), plus the
        optimizer state and the stream position, so a run can resume from here exactly
        (``save_checkpoint``)."""
        return save_checkpoint(
            self.trainer, path, {"steps_done": self.steps_done, "stream": self.stream.position}
        )

    def restore(self, path: Path, trust: bool = False) -> bool:
        """Load the weights, optimizer state and stream position saved by ``save``, in place (the rollout
        backend and the optimizer keep their parameter objects). The state file is read as
        :func:`load_state` reads it (``trust``: ``--trust-state``); True when it was unpickled in full."""
        load_checkpoint(self.trainer.model, Path(path))
        extra, unpickled = load_state(path, trust)
        self.trainer.optimizer_state = extra["optimizer"]  # loaded by the optimizer of the next step
        self.steps_done = int(extra["steps_done"])
        self.stream.position = int(extra["stream"])
        return unpickled

    def phase(self, steps: int, on_step=None) -> list[StepReport]:
        reports = []
        for _ in range(steps):
            report = self.step()
            reports.append(report)
            if on_step is not None:
                on_step(report)
        return reports


def save_checkpoint(trainer: Any, path: Path, extra: dict[str, Any] | None = None) -> Path:
    """Save ``trainer``'s model (``save_pretrained``), tokenizer and optimizer state (``rsft_state.pt``,
    with ``extra``) to ``path``. Under sharding every rank takes part (``trainer`` is then a
    ``distributed.DistributedUpdater``: the full parameters and optimizer state are gathered on rank 0,
    which writes them); the checkpoint is the one one process writes, so it resumes on any number of
    ranks."""
    import torch

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = trainer.full_state_dict()  # None: the model's own state_dict is whole
    if state is not None:  # tied parameters once, under their first name, as save_pretrained writes them
        unique = {name for name, _ in trainer.model.named_parameters()}
        tied = {name for name, _ in trainer.model.named_parameters(remove_duplicate=False)} - unique
        state = {k: v for k, v in state.items() if k not in tied}
    trainer.model.save_pretrained(path, **({} if state is None else {"state_dict": state}))
    if trainer.tokenizer is not None:
        trainer.tokenizer.save_pretrained(path)
    torch.save({"optimizer": trainer.full_optimizer_state(), **(extra or {})}, path / "rsft_state.pt")
    return path


#: The ``whale train`` flag that lets a resume unpickle a state file that needs more than tensors.
TRUST_STATE_FLAG = "--trust-state"


class UntrustedState(ValueError):
    """A checkpoint's ``rsft_state.pt`` that only a full unpickle reads (refused without the flag)."""


def load_state(path: Path, trust: bool = False) -> tuple[dict[str, Any], bool]:
    """The ``rsft_state.pt`` of checkpoint folder ``path``, read with ``weights_only=True``: tensors and
    plain values only, so nothing written in the file runs here (a run folder may come from anyone).
    A file that needs more (pickled objects: an older or a hostile one) raises :class:`UntrustedState`
    (one line naming the file and the flag) unless ``trust`` (``--trust-state``): then it is unpickled
    in full. Returns ``(state, unpickled_in_full)``."""
    import pickle

    import torch

    file = Path(path) / "rsft_state.pt"
    try:
        return torch.load(file, weights_only=True), False
    except pickle.UnpicklingError:
        if not trust:
            raise UntrustedState(
                f"{file} holds more than tensors and plain values, and loading it would unpickle it, "
                f"which runs code written in the file: resume with {TRUST_STATE_FLAG} only if you trust "
                "whoever wrote this run folder"
            ) from None
    log.warning("%s: unpickled in full (%s)", file, TRUST_STATE_FLAG)
    return torch.load(file, weights_only=False), True


def load_checkpoint(model: Any, path: Path) -> None:
    """Copy a ``save_pretrained`` checkpoint into ``model`` in place, through the loaders that wrote it:
    ``from_pretrained`` of the model's own class for full fine-tuning (so any architecture's layout and
    tied weights load as transformers defines them), PEFT's adapter loader for LoRA (its saved keys lack
    the adapter name). Every trainable parameter must get a value."""
    import torch

    if hasattr(model, "get_base_model"):  # PEFT: the adapter only
        from peft import set_peft_model_state_dict
        from peft.utils import load_peft_weights

        result = set_peft_model_state_dict(model, load_peft_weights(str(path), device="cpu"))
        missing = [k for k in result.missing_keys if "lora_" in k]
        if missing or result.unexpected_keys:
            raise ValueError(
                f"adapter {path} does not match the model (missing {missing[:3]}, unexpected "
                f"{list(result.unexpected_keys)[:3]})"
            )
        return
    dtype = next(model.parameters()).dtype
    loaded = type(model).from_pretrained(str(path), dtype=dtype)
    source = dict(loaded.named_parameters())
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name not in source or source[name].shape != param.shape:
                raise ValueError(
                    f"checkpoint {path} does not match the model: no {name!r} of shape {tuple(param.shape)}"
                )
            param.copy_(source[name].to(param.device))
