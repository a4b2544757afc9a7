"""The options of the weight operator (``rsft:`` of a train config), every field with its help."""

from __future__ import annotations

from dataclasses import dataclass

from whale_train.config_io import Config, option


@dataclass
class RSFTConfig(Config):
    """Options of the weight operator (``rsft:`` of a train config)."""

    batch_tasks: int = option(64, "tasks per step (B)", minimum=1)
    samples: int = option(8, "rollouts per task (k)", minimum=1)
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
    epochs: int = option(1, "passes over a step's examples", minimum=1)
    train_batch_size: int = option(16, "examples per optimizer step", minimum=1)
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
    max_length: int = option(
        2048, "longest training sequence (longer examples are dropped, not cut)", minimum=1
    )
    concurrency: int = option(128, "episodes in flight while sampling", minimum=1)
    save_checkpoints: bool = option(True, "save every model version with save_pretrained")
    seed: int = option(0, "task-stream order, sampling and training seed")

    def validate(self) -> None:
        super().validate()
        if not 0 < self.learning_rate < 1:
            raise ValueError(f"RSFTConfig.learning_rate must be in (0, 1), got {self.learning_rate}")
