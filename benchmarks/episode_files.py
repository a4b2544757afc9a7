"""The project files whose code runs for one ``whale eval`` episode, in the trusted process.

    .venv/bin/python benchmarks/episode_files.py      # one line per file, then the count

Runs ``whale eval --env whale/Math-v0 --harness math/h0 --limit 1 --k 1`` in this process with a profiler on
and lists the files of this repository whose functions were called while the command ran (from
``cmd_eval`` to the line in ``traces.jsonl``): not the command's start-up (the parser of every
subcommand, the registrations made at import), not module or class bodies, not the standard library
or third-party code. The sandboxed worker is another process and is not traced; it runs
``harnesses/worker.py``, ``harnesses/validate.py``, ``harnesses/base.py`` and the harness file.
docs/ARCHITECTURE.md ("The life of an episode") lists the result; tests/docs/test_architecture_doc.py
keeps the two the same.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import threading
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1])
CO_OPTIMIZED = 0x1  # set on functions; module and class bodies lack it


def episode_files() -> list[str]:
    # the first test task depends on the split secret (whale_envs.splits): pin the tests' one, so the list
    # is the same on every machine
    os.environ.setdefault("WHALE_SPLIT_SECRET", "whale-tests")
    from whale_train import cli
    from whale_train.cli import eval as eval_command

    seen: set[str] = set()
    tracing = threading.Event()

    def profile(frame, event, arg):
        code = frame.f_code
        if event == "call" and tracing.is_set() and code.co_flags & CO_OPTIMIZED:
            name = code.co_filename
            if name.startswith(ROOT + os.sep) and f"{os.sep}.venv{os.sep}" not in name:
                seen.add(os.path.relpath(name, ROOT))

    command = eval_command.cmd_eval

    def traced(args):
        tracing.set()
        try:
            return command(args)
        finally:
            tracing.clear()

    set_defaults = argparse.ArgumentParser.set_defaults

    def swap(self, **kwargs):  # the eval subcommand's handler becomes the traced one
        if kwargs.get("func") is command:
            kwargs["func"] = traced
        return set_defaults(self, **kwargs)

    argparse.ArgumentParser.set_defaults = swap
    # The libraries the command imports on its way (PyTorch, transformers and the model's class: no file of
    # this repository among them), imported before the profiler is on: seconds of calls it would see only
    # to drop them.
    import torch  # noqa: F401
    import transformers.models.qwen3.modeling_qwen3  # noqa: F401

    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        with tempfile.TemporaryDirectory() as out:
            argv = "eval --env whale/Math-v0 --harness math/h0 --limit 1 --k 1 --out".split() + [out]
            with contextlib.redirect_stdout(io.StringIO()):  # its table and summary
                status = cli.main(argv)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
        argparse.ArgumentParser.set_defaults = set_defaults
    if status:
        raise SystemExit(f"whale eval failed with status {status}")
    return sorted(seen)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    files = episode_files()
    print("\n".join(files))
    print(f"{len(files)} files")
