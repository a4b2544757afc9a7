"""Two RSFT training calls on the shipped tiny model, on fixed examples, in one process or under
``accelerate launch --cpu --num_processes N``: rank 0 drives (``DistributedTrainer``), the others follow.
Writes the trained weights and the optimizer's step counts to OUT (used by tests/test_scale_accelerate.py).

    python tests/accelerate_equivalence.py OUT [--keep-optimizer 0|1] [--examples 8] [--batch 8]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from whale_train import distributed
from whale_train.llm import default_model
from whale_train.rsft import Example, RSFTConfig, RSFTUpdater


def examples(tokenizer, step: int, n: int) -> list[Example]:
    """``n`` prompt-completion pairs of different lengths (so per-rank token counts differ)."""
    out = []
    for i in range(n):
        a, b = 3 + i + 10 * step, 2 * i + 1
        prompt = tokenizer(f"Q: what is {a} + {b}?" + " please" * (i % 3) + "\nA:", add_special_tokens=False)
        answer = tokenizer(f" {a + b}" + " ok" * (i % 2), add_special_tokens=False)
        out.append(Example(tuple(prompt["input_ids"]), tuple(answer["input_ids"]), f"t{i}"))
    return out


def main(out: Path, keep_optimizer: bool, n: int, batch: int) -> None:
    torch.manual_seed(0)
    path = default_model()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    config = RSFTConfig(
        learning_rate=1e-3, train_batch_size=batch, keep_optimizer=keep_optimizer, seed=0, bf16=False
    )
    trainer = RSFTUpdater(model, tokenizer, config)
    rank, world_size = distributed.world()
    if rank != 0:
        distributed.follow(trainer)
        return
    driver = distributed.DistributedTrainer(trainer) if world_size > 1 else trainer
    losses = [driver.train(examples(tokenizer, step, n))[0] for step in range(2)]
    if world_size > 1:
        driver.stop()
    out.mkdir(parents=True, exist_ok=True)
    steps = [int(s["step"]) for s in trainer.optimizer_state["state"].values()] if keep_optimizer else []
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    torch.save(
        {"weights": state, "losses": losses, "adam_steps": steps, "world_size": world_size}, out / "result.pt"
    )


if __name__ == "__main__":

    def option(name: str, default: int) -> int:
        return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default

    main(
        Path(sys.argv[1]), bool(option("--keep-optimizer", 1)), option("--examples", 8), option("--batch", 8)
    )
