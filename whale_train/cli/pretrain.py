"""``whale pretrain``: the tiny CPU default model from scratch, one option per ``PretrainConfig`` field
(the job itself: :func:`whale_train.pretrain.pretrain`)."""

from __future__ import annotations

import argparse
from typing import Any

from whale_train.cli.registry import command
from whale_train.errors import CLIError
from whale_train.pretrain import PretrainConfig, command_line, pretrain


@command("pretrain", help="train the tiny CPU default model from scratch on generated domain text")
def arguments(p: argparse.ArgumentParser) -> None:
    """Train a byte-level BPE tokenizer and a tiny Qwen3-architecture model on text generated from
    the chess, math and search generators (several presentation formats per domain), save it with
    save_pretrained, and write a model card (README.md) with its measured accuracy. Ctrl-C stops
    training and saves what is done."""
    for f in PretrainConfig.__dataclass_fields__.values():
        flag = "--" + f.name.replace("_", "-")
        default = f.default
        kind = {"steps": int}.get(f.name, type(default))
        kwargs: dict[str, Any] = {"default": default, "type": kind, "help": f.metadata["help"]}
        if f.name == "out":
            kwargs = {"required": True, "help": f.metadata["help"]}
        elif f.name == "size":
            kwargs["choices"] = ["tiny", "small"]
        elif f.name == "eval_harnesses":
            kwargs["choices"] = ["h0", "all"]
        if "default" in kwargs and kwargs["default"] is not None:
            kwargs["help"] += f" (default: {kwargs['default']})"
        p.add_argument(flag, **kwargs)
    p.set_defaults(func=cmd_pretrain)


def cmd_pretrain(args: argparse.Namespace) -> int:
    from rich.console import Console

    config = PretrainConfig(**{f: getattr(args, f) for f in PretrainConfig.__dataclass_fields__})
    try:
        config.validate()
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    pretrain(config, command=command_line(config), console=Console())
    return 0
