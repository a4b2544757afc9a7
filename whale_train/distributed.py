"""The weight phase on several processes under ``accelerate launch`` (DDP, FSDP2 or ZeRO-3 through TRL's
``SFTTrainer``): one rank drives, all ranks train.

    accelerate launch --num_processes 8 --config_file configs/accelerate/fsdp2.yaml \\
        -m whale_train.cli train configs/math/whale.yaml --out runs/math8

Rank 0 runs the whole trainer as in one process: rollouts, the harness phase, the ledger, checkpoints.
Each RSFT step it hands its examples to every rank (``DistributedTrainer.train``) and all ranks call
the same ``SFTTrainer.train`` on them, each on its share of the global batch
(``per_device_train_batch_size`` is ``rsft.train_batch_size / world_size``; the rows are filled up to
whole global batches with rows that train on nothing, ``training_rows``), so each update is that of one
process on the whole batch (the loss is normalized by the tokens of all ranks). The
other ranks run ``follow``: wait for a command from rank 0, do it, wait again, until ``stop``. Their
model starts as rank 0's: the Trainer's DDP wrapper broadcasts rank 0's parameters when it wraps
the model (every step), and a resumed run sends its checkpoint path to every rank (``load``).

Commands travel with ``torch.distributed.broadcast_object_list`` on the process group accelerate set up
(gloo on CPU, NCCL on GPUs); they are pickled Python objects between processes of the same trusted run.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any


def world() -> tuple[int, int]:
    """(rank, world size) of this process: from ``accelerate launch`` / torchrun's environment, else (0, 1)."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def is_main() -> bool:
    return world()[0] == 0


WAIT = timedelta(hours=12)  # followers wait through rank 0's rollouts and harness phases


def _group() -> None:
    """Make sure the default process group exists (accelerate's ``PartialState`` creates it), with a
    timeout long enough for the other ranks to wait while rank 0 samples and searches harnesses."""
    import torch.distributed as dist

    if not dist.is_initialized():
        from accelerate import PartialState

        PartialState(timeout=WAIT)


def _broadcast(obj: Any = None) -> Any:
    import torch.distributed as dist

    _group()
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def per_device_batch(global_batch: int, world_size: int) -> int:
    """Examples per rank and optimizer step, so that the global batch stays ``global_batch``."""
    if global_batch % world_size:
        raise ValueError(
            f"rsft.train_batch_size {global_batch} is not a multiple of the {world_size} training processes"
        )
    return global_batch // world_size


def training_rows(examples: list[Any], config: Any, tokenizer: Any) -> tuple[list[dict], dict[str, Any]]:
    """The ``SFTTrainer`` rows of one RSFT step's ``examples``, and the ``SFTConfig`` fields to change.

    One process: ``Example.row()`` (input ids and completion mask; TRL builds the labels), nothing changed.

    Several ranks: every optimizer step must be the one process's step on the same global batch. So the
    rows come in the order the one-process Trainer draws them (accelerate's seeded sampler: a
    ``torch.randperm`` seeded with ``seed + epoch`` per epoch), each epoch filled up to whole global
    batches with rows that train on nothing (every label -100: no loss, no gradient, no token counted),
    and the Trainer reads them in that order (``train_sampling_strategy="sequential"``, one pass), each
    rank taking its share of each global batch. Without the filling, accelerate evens the ranks out by
    repeating examples, which would weigh those twice; since TRL drops fully masked rows when it
    prepares a dataset, the rows carry their labels and skip that preparation."""
    if world()[1] == 1 or not examples:
        return [ex.row() for ex in examples], {}
    import torch

    pad_id = getattr(tokenizer, "eos_token_id", None) or 0
    n, rows = len(examples), []
    for epoch in range(config.epochs):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(config.seed + epoch)).tolist()
        for i in order:
            ex = examples[i]
            ids = list(ex.prompt_ids) + list(ex.completion_ids)
            rows.append({"input_ids": ids, "labels": [-100] * len(ex.prompt_ids) + list(ex.completion_ids)})
        rows += [{"input_ids": [pad_id, pad_id], "labels": [-100, -100]}] * (-n % config.train_batch_size)
    overrides = {
        "dataset_kwargs": {"skip_prepare_dataset": True},
        "train_sampling_strategy": "sequential",
        "num_train_epochs": 1,
    }
    return rows, overrides


class DistributedTrainer:
    """Rank 0's side: the ``rsft.RSFTUpdater`` interface, each call done by every rank."""

    def __init__(self, trainer: Any):
        self.inner = trainer

    def __getattr__(self, name: str) -> Any:  # model, tokenizer, optimizer_state, ...
        return getattr(self.inner, name)

    def train(self, examples: list[Any]) -> tuple[float, int]:
        _broadcast(("train", examples))
        return self.inner.train(examples)

    def load(self, path: str) -> None:
        """Every other rank loads the weights and optimizer state of a checkpoint (a resumed run)."""
        _broadcast(("load", str(path)))

    def stop(self) -> None:
        stop_followers()


def stop_followers() -> None:
    """Rank 0 is done (or failed): every other rank leaves :func:`follow`."""
    _broadcast(("stop", None))


def follow(trainer: Any, load: Any = None) -> int:
    """A non-zero rank's loop: do what rank 0 broadcasts until ``stop``. ``load(path)`` restores a
    checkpoint into ``trainer`` (for ``load``). Returns the number of training calls done."""
    calls = 0
    while True:
        command, arg = _broadcast()
        if command == "stop":
            return calls
        if command == "train":
            trainer.train(arg)
            calls += 1
        elif command == "load" and load is not None:
            load(arg)
        elif command != "load":
            raise RuntimeError(f"unknown command from rank 0: {command!r}")
