"""RSFT checkpoints: ``save_pretrained`` weights (or a LoRA adapter), tokenizer and ``rsft_state.pt``
(the optimizer state, the step count and the task stream's position), written so a run resumes exactly;
and their reading back, which never unpickles a state file unless ``--trust-state`` says so."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


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
