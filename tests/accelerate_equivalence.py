"""Two RSFT training calls on the shipped tiny model, on fixed examples, in one process or under
``accelerate launch`` with N CPU processes (DDP, or FSDP2 when the launcher asks for it): rank 0 drives
(``DistributedUpdater``), the others follow. Writes the trained weights (gathered from every rank's
share under FSDP2) and the optimizer's step counts to OUT (used by tests/train/test_scale_accelerate.py).
``--save CKPT`` saves a resume checkpoint after the first call (``rsft.save_checkpoint``: every rank
takes part); ``--resume CKPT`` loads one on every rank and makes only the second call. ``--fresh OUT2``
(one process only) then makes the same two calls again from the shipped weights with a new AdamW each
step (``--keep-optimizer 0``), and writes their result to OUT2.

    python tests/accelerate_equivalence.py OUT [--keep-optimizer 0|1] [--examples 8] [--batch 8]
        [--save CKPT | --resume CKPT] [--fresh OUT2]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from whale_train import distributed
from whale_train.llm import default_model
from whale_train.rsft import Example, RSFTConfig, RSFTUpdater, load_checkpoint, save_checkpoint


def examples(tokenizer, step: int, n: int) -> list[Example]:
    """``n`` prompt-completion pairs of different lengths (so per-rank token counts differ)."""
    out = []
    for i in range(n):
        a, b = 3 + i + 10 * step, 2 * i + 1
        prompt = tokenizer(f"Q: what is {a} + {b}?" + " please" * (i % 3) + "\nA:", add_special_tokens=False)
        answer = tokenizer(f" {a + b}" + " ok" * (i % 2), add_special_tokens=False)
        out.append(Example(tuple(prompt["input_ids"]), tuple(answer["input_ids"]), f"t{i}"))
    return out


def main(out: Path, keep_optimizer: bool, n: int, batch: int, save: str | None, resume: str | None) -> None:
    torch.manual_seed(0)
    path = default_model()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    config = RSFTConfig(
        learning_rate=1e-3, train_batch_size=batch, keep_optimizer=keep_optimizer, seed=0, bf16=False
    )
    trainer = RSFTUpdater(model, tokenizer, config)
    if resume:  # every rank, as a resumed run's ranks do (RSFT.restore, trainer.follow_run)
        load_checkpoint(trainer.model, Path(resume))
        trainer.optimizer_state = torch.load(Path(resume) / "rsft_state.pt", weights_only=False)["optimizer"]
    rank, world_size = distributed.world()
    if rank != 0:
        distributed.follow(trainer)
        return
    driver = distributed.DistributedUpdater(trainer) if world_size > 1 else trainer
    losses = []
    for step in range(1 if resume else 0, 2):
        losses.append(driver.train(examples(tokenizer, step, n))[0])
        if save and step == 0:
            save_checkpoint(driver, Path(save))
    state = driver.full_state_dict() or model.state_dict()  # under FSDP2 the model holds a share only
    state = {k: v.detach().cpu().clone() for k, v in state.items()}
    optimizer = driver.full_optimizer_state()
    from torch.distributed.tensor import DTensor

    local = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in model.parameters())
    held = local / sum(p.numel() for p in model.parameters())  # under FSDP2: this rank's share
    if world_size > 1:
        driver.stop()
    out.mkdir(parents=True, exist_ok=True)
    steps = [int(s["step"]) for s in optimizer["state"].values()] if keep_optimizer else []
    torch.save(
        {"weights": state, "losses": losses, "adam_steps": steps, "world_size": world_size, "held": held},
        out / "result.pt",
    )


if __name__ == "__main__":

    def option(name: str, default=None):
        return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default

    shape = int(option("--examples", 8)), int(option("--batch", 8))
    main(
        Path(sys.argv[1]),
        bool(int(option("--keep-optimizer", 1))),
        *shape,
        option("--save"),
        option("--resume"),
    )
    if option("--fresh"):
        main(Path(option("--fresh")), False, *shape, None, None)
