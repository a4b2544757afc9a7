"""``whale pretrain``'s job: tokenizer, model, supervised pass, save, card, calibration
(:func:`pretrain`), and the command line that reproduces a config (:func:`command_line`). The command's
flags, one per ``PretrainConfig`` field, are in ``whale_train.cli.pretrain``."""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from whale_train.pretrain.card import HASHED_FILES, calibrate, sha256, write_card
from whale_train.pretrain.training import PretrainConfig, pretrain_domains, tokenizer_corpus, train


def pretrain(config: PretrainConfig, command: str | None = None, console=None) -> dict[str, Any]:
    """Tokenizer, model, supervised pass, save, card (and calibration): the whole ``whale pretrain``."""
    import torch

    from whale_train.tiny import build_model, save, train_tokenizer

    config.validate()
    if config.threads:
        torch.set_num_threads(config.threads)
    out = Path(config.out)
    say = console.print if console is not None else (lambda *_a, **_k: None)
    t0 = time.monotonic()
    tokenizer = train_tokenizer(tokenizer_corpus(config), vocab_size=config.vocab_size)
    say(f"tokenizer: {len(tokenizer)} tokens ({time.monotonic() - t0:.0f} s)")
    model = build_model(tokenizer, config.size, seed=config.seed)
    n_params = sum(p.numel() for p in model.parameters())
    say(f"model: {config.size}, {n_params / 1e6:.2f}M parameters, {torch.get_num_threads()} threads")
    record = train(model, tokenizer, config, console=console)
    save(model, tokenizer, out)
    say(f"saved to {out} after {record.steps} steps ({record.seconds / 60:.1f} min)")
    c = model.config
    info: dict[str, Any] = {
        "command": command or command_line(config),
        "machine": f"a {os.cpu_count()}-core CPU machine ({_threads(torch.get_num_threads())})",
        "config": asdict(config),
        "model": {
            "architecture": type(model).__name__,
            "parameters": n_params,
            "hidden_size": c.hidden_size,
            "layers": c.num_hidden_layers,
            "heads": c.num_attention_heads,
            "kv_heads": c.num_key_value_heads,
            "intermediate_size": c.intermediate_size,
            "vocab_size": c.vocab_size,
        },
        "training": asdict(record),
        "formats": {d: f.formats for d, f in pretrain_domains().items()},
        "calibration": {},
        "sha256": {name: sha256(out / name) for name in HASHED_FILES},
    }
    info["config"]["out"] = out.name
    write_card(out, info)
    if config.eval_tasks and not record.interrupted:

        def keep(name: str, result: dict[str, Any]) -> None:  # the card grows as results come in
            info["calibration"][name] = result
            write_card(out, info)

        info["calibration"] = {}
        info["calibration"] = calibrate(out, config, console=console, on_result=keep)
        write_card(out, info)
    say(f"model card: {out / 'README.md'}")
    return info


def _threads(n: int) -> str:
    return f"{n} torch thread" + ("" if n == 1 else "s")


def command_line(config: PretrainConfig) -> str:
    """The ``whale pretrain`` command that reproduces ``config``: the seed, the budget, and every option
    that differs from its default. An absolute ``--out`` is shown by its last part only."""
    import shlex

    out = Path(config.out)
    parts = ["whale", "pretrain", "--out", out.name if out.is_absolute() else config.out]
    parts += ["--seed", str(config.seed)]
    parts += ["--steps", str(config.steps)] if config.steps else ["--minutes", f"{config.minutes:g}"]
    defaults = PretrainConfig()
    for name in PretrainConfig.__dataclass_fields__:
        value = getattr(config, name)
        if name not in ("out", "seed", "steps", "minutes") and value != getattr(defaults, name):
            parts += ["--" + name.replace("_", "-"), f"{value:g}" if isinstance(value, float) else str(value)]
    return shlex.join(parts)
