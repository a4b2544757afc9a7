"""The weight phase: online rejection-sampling fine-tuning (RSFT) under the current harness.

One RSFT step: take the next ``batch_tasks`` tasks of an epoch-ordered stream over the ``train``
split, roll out ``samples`` episodes each under the current harness, keep the trajectories whose
reward passes ``reward_threshold``, turn every model call in them into a prompt-completion example on
the *exact token ids that were sampled*, and fine-tune with TRL's ``SFTTrainer`` (completion-only
loss). The model is trained in place, so the rollout backend (transformers) sees the new weights at
once; a vLLM backend gets them through ``load_weights`` (no round trip through disk).

A step with no accepted trajectory is a logged no-op: the weights and the version stay.

The modules, one job each (every name is importable from here):

    config.py      RSFTConfig, the options of the weight operator
    examples.py    sample selection: accepted trajectories, the calls they used, examples on token ids
    update.py      the SFT step: RSFTUpdater (TRL's SFTTrainer, LoRA, the carried AdamW state)
    checkpoint.py  saving a checkpoint and reading it back (never unpickled without --trust-state)
    operator.py    RSFT, the operator: the task stream, a step, pushing weights, its report
"""

from whale_train.rsft.checkpoint import (
    TRUST_STATE_FLAG,
    UntrustedState,
    load_checkpoint,
    load_state,
    save_checkpoint,
)
from whale_train.rsft.config import RSFTConfig
from whale_train.rsft.examples import Example, accept, examples_from, used_calls
from whale_train.rsft.operator import RSFT, ModelFailure, StepReport, TaskStream, check_model
from whale_train.rsft.update import RSFTUpdater, carry_optimizer_state, lora_targets, sft_arguments

__all__ = [
    "RSFT",
    "TRUST_STATE_FLAG",
    "Example",
    "ModelFailure",
    "RSFTConfig",
    "RSFTUpdater",
    "StepReport",
    "TaskStream",
    "UntrustedState",
    "accept",
    "carry_optimizer_state",
    "check_model",
    "examples_from",
    "load_checkpoint",
    "load_state",
    "lora_targets",
    "save_checkpoint",
    "sft_arguments",
    "used_calls",
]
