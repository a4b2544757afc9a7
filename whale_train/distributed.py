"""The weight phase on several processes under ``accelerate launch`` (DDP, FSDP2 or ZeRO-3 through TRL's
``SFTTrainer``): one rank drives, all ranks train.

    accelerate launch --num_processes 8 --config_file configs/accelerate/fsdp2.yaml \\
        -m whale_train.cli train configs/math/whale.yaml --out runs/math8

Rank 0 runs the whole trainer as in one process: rollouts, the harness phase, the ledger, checkpoints.
Each RSFT step it hands its examples to every rank (``DistributedUpdater.train``) and all ranks call
the same ``SFTTrainer.train`` on them, each on its share of the global batch
(``per_device_train_batch_size`` is ``rsft.train_batch_size / world_size``; the rows are filled up to
whole global batches with rows that train on nothing, ``training_rows``), so each update is that of one
process on the whole batch (the loss is normalized by the tokens of all ranks). The
other ranks run ``follow``: wait for a command from rank 0, do it, wait again, until ``stop``. Their
model starts as rank 0's: the Trainer's DDP wrapper broadcasts rank 0's parameters when it wraps
the model (every step); under FSDP2 every rank loaded the same checkpoint (LoRA adapters from the same
seed), so the shards fit together; a resumed run sends its checkpoint path to every rank (``load``).

Under sharding (FSDP2, or ZeRO-3 through accelerate's DeepSpeed plugin: ``sharded()``) a rank holds only
its share of each parameter and of the AdamW state, so anything that reads the whole model is a
collective every rank must join: rank 0 announces it and the others follow. The commands are
``train`` (one RSFT step's examples), ``gather`` (the full parameters for a moment, in place: rank 0
pushes the weights to vLLM or its rollout copy meanwhile; ``gathered``), ``state_dict`` (the full
``state_dict`` on rank 0, for a checkpoint; ``full_state_dict``), ``optimizer``
(the full AdamW state, for a checkpoint; ``full_tensors``), ``load`` (a resumed run's checkpoint) and
``stop``. Checkpoints stay what one process writes (``save_pretrained`` plus ``rsft_state.pt`` with the
full optimizer state), so a run resumes on any number of ranks; on resume each rank cuts its share out
of the full state (``shard_like``).

A follower that loses rank 0 (killed, crashed) leaves with :class:`RankLost` naming the rank, instead of
waiting forever: the collective fails at once when the peer's connection drops, else after
``WHALE_RANK_TIMEOUT`` seconds (default 12 hours, long enough for rank 0's rollouts and harness phases).

Commands travel with ``torch.distributed.broadcast_object_list`` on the process group accelerate set up
(gloo on CPU, NCCL on GPUs); they are pickled Python objects between processes of the same trusted run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any


def world() -> tuple[int, int]:
    """(rank, world size) of this process: from ``accelerate launch`` / torchrun's environment, else (0, 1)."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def is_main() -> bool:
    return world()[0] == 0


# followers wait through rank 0's rollouts and harness phases
WAIT = timedelta(seconds=float(os.environ.get("WHALE_RANK_TIMEOUT", 12 * 3600)))


class RankLost(RuntimeError):
    """A collective with rank 0 failed: rank 0 died or timed out; this rank stops."""


def sharded() -> bool:
    """Whether the launcher shards the parameters (accelerate's FSDP, or DeepSpeed ZeRO stage 3): then
    reading the full weights (a save, a push, a ``state_dict``) needs every rank."""
    env = os.environ
    if env.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        return True
    deepspeed = env.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
    return deepspeed and env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE") == "3"


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
    try:
        dist.broadcast_object_list(box, src=0)
    except (RuntimeError, dist.DistError) as exc:  # gloo/NCCL: a peer is gone, or the wait timed out
        rank = world()[0]
        who = "rank 0 (the driver) is gone or stopped answering" if rank else "a training rank is gone"
        raise RankLost(f"rank {rank}: {who} ({str(exc).splitlines()[0][:200]}); this rank stops") from None
    return box[0]


@contextmanager
def gathered(model: Any) -> Iterator[None]:
    """The full parameters of ``model`` in place while the block runs, sharded again after it; a model
    that is not sharded (one process, DDP, before the first step) as it is. Every rank must enter it at
    the same time: all-gathers. FSDP2: each ``FSDPModule`` ``unshard()``s (its modules then hold the
    whole tensors as plain parameters) and ``reshard()``s after. ZeRO-3: DeepSpeed's
    ``GatheredParameters`` (read-only)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        FSDPModule = ()  # noqa: N806
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if units:
        for unit in units:
            unit.unshard()
        try:
            yield
        finally:
            for unit in units:
                unit.reshard()
        return
    params = list(model.parameters())
    if any(hasattr(p, "ds_id") for p in params):  # partitioned by DeepSpeed ZeRO-3
        import deepspeed

        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            yield
        return
    yield


def full_state_dict(model: Any) -> dict[str, Any] | None:
    """The whole ``state_dict`` of a sharded ``model``, on CPU, on rank 0 (``{}`` on the others): every
    rank must call it at the same time. ``None`` when the model is not sharded (its own ``state_dict``
    is whole). FSDP2: torch's ``get_model_state_dict(full_state_dict=True, cpu_offload=True)``; under
    ``gathered`` the modules hold whole parameters, but ``state_dict()`` of an FSDP module still gives
    the shards (its state-dict hooks), so a save needs this. ZeRO-3: the parameters gathered."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        FSDPModule = ()  # noqa: N806
    if any(isinstance(m, FSDPModule) for m in model.modules()):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if any(hasattr(p, "ds_id") for p in model.parameters()):
        with gathered(model):
            return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    return None


def full_tensors(state: Any) -> Any:
    """``state`` (an optimizer ``state_dict``) with every sharded tensor (``DTensor``) replaced by the
    whole tensor on CPU: an all-gather per tensor, in the dict's order, so every rank must call it on
    its own share at the same time. Anything else is returned as it is."""
    from torch.distributed.tensor import DTensor

    if isinstance(state, DTensor):
        return state.full_tensor().cpu()
    if isinstance(state, dict):
        return {k: full_tensors(v) for k, v in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(full_tensors(v) for v in state)
    return state


def shard_like(state: dict[str, Any], optimizer: Any) -> dict[str, Any]:
    """A full optimizer ``state_dict`` (a checkpoint's) cut to this rank's share of ``optimizer``, whose
    parameters are sharded (``DTensor``): each state tensor of a parameter's shape becomes a DTensor
    laid out like that parameter (each rank takes its own chunk: no communication). Unchanged when
    the parameters are not sharded or the state already is."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    params = [p for group in optimizer.param_groups for p in group["params"]]
    if not any(isinstance(p, DTensor) for p in params):
        return state
    out = {}
    for index, entry in state["state"].items():
        param = params[int(index)]
        shaped = {}
        for key, value in entry.items():
            if isinstance(param, DTensor) and not isinstance(value, DTensor) and value.shape == param.shape:
                value = distribute_tensor(
                    value.to(param.device_mesh.device_type),
                    param.device_mesh,
                    param.placements,
                    src_data_rank=None,
                )
            shaped[key] = value
        out[index] = shaped
    return {"state": out, "param_groups": state["param_groups"]}


@contextmanager
def already_sharded(model: Any) -> Iterator[None]:
    """Build a Trainer around a model that an earlier RSFT step sharded in place (FSDP2's ``fully_shard``
    turns every wrapped module into an ``FSDP<Class>``). Each ``TrainingArguments`` resets accelerate's
    state, so each step's Trainer makes a fresh FSDP plugin from the launcher's environment, and its
    transformer-based wrap policy looks the layer classes up by name (``Qwen3DecoderLayer``), which the
    sharded model no longer has: accelerate would refuse. The model needs no more wrapping
    (``fsdp2_prepare_model`` returns an ``FSDPModule`` as it is), so that plugin is told ``NO_WRAP``."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP2
        FSDPModule = ()  # noqa: N806
    if not isinstance(model, FSDPModule):
        yield
        return
    saved = os.environ.get("FSDP_AUTO_WRAP_POLICY")
    os.environ["FSDP_AUTO_WRAP_POLICY"] = "NO_WRAP"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("FSDP_AUTO_WRAP_POLICY", None)
        else:
            os.environ["FSDP_AUTO_WRAP_POLICY"] = saved


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


class DistributedUpdater:
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

    @contextmanager
    def gathered(self) -> Iterator[None]:
        """The full parameters on this rank while the block runs (a save, a weight push)."""
        _broadcast(("gather", None))
        with self.inner.gathered():
            yield

    def full_state_dict(self) -> dict[str, Any] | None:
        """The whole model ``state_dict`` (None: not sharded), gathered from every rank's share."""
        _broadcast(("state_dict", None))
        return self.inner.full_state_dict()

    def full_optimizer_state(self) -> Any:
        """The whole AdamW state, gathered from every rank's share (for a checkpoint)."""
        _broadcast(("optimizer", None))
        return self.inner.full_optimizer_state()

    def stop(self) -> None:
        stop_followers()


def stop_followers() -> None:
    """Rank 0 is done (or failed): every other rank leaves :func:`follow`, and every rank its process
    group."""
    _broadcast(("stop", None))
    _leave()


def _leave() -> None:
    """Every rank together, after ``stop``: tear the process group down before the interpreter exits.
    A rank left to exit with it running has died at exit ("terminate called without an active
    exception", SIGABRT: gloo's threads destroyed while running), failing a run that had finished. The
    barrier first: no rank tears down its connections while another still reads ``stop`` from them."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    try:
        dist.barrier()
    except (RuntimeError, dist.DistError):  # a peer is gone: nothing left to wait for
        pass
    dist.destroy_process_group()


def follow(trainer: Any, load: Any = None) -> int:
    """A non-zero rank's loop: do what rank 0 broadcasts until ``stop``. ``load(path)`` restores a
    checkpoint into ``trainer`` (for ``load``). Returns the number of training calls done; raises
    :class:`RankLost` when rank 0 is gone."""
    calls = 0
    while True:
        command, arg = _broadcast()
        if command == "stop":
            _leave()
            return calls
        if command == "train":
            trainer.train(arg)
            calls += 1
        elif command == "gather":  # rank 0 reads the full weights meanwhile
            with trainer.gathered():
                pass
        elif command == "state_dict":
            trainer.full_state_dict()
        elif command == "optimizer":
            trainer.full_optimizer_state()  # rank 0 keeps the whole state; this rank only sends its share
        elif command == "load" and load is not None:
            load(arg)
        elif command != "load":
            raise RuntimeError(f"unknown command from rank 0: {command!r}")
