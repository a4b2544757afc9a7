"""What the real-engine suite (``make test-vllm``: tests/train/test_vllm_real*.py, in .venv-vllm) shares:
the tiny random Qwen3s it loads into vLLM, and vLLM's OpenAI server started as a subprocess. The session
fixtures built from these (one random model, one ``vllm serve`` of the shipped model for every file) are in
tests/train/conftest.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import torch

from whale_train.llm import SHIPPED_MODEL


def random_qwen3(tmp_path_factory, tied: bool) -> str:
    """The shipped tiny Qwen3's shape and tokenizer, fresh weights (head_dim 32)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(SHIPPED_MODEL)
    config.tie_word_embeddings = tied
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # sharper logits than the init's: greedy ties are unlikely
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(4.0)
    out = tmp_path_factory.mktemp("tied-qwen3" if tied else "untied-qwen3")
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(SHIPPED_MODEL).save_pretrained(out)
    return str(out)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_server(proc: subprocess.Popen, url: str, deadline: float) -> None:
    """Until vLLM's server at ``url`` answers ``/health``; RuntimeError if it exits or ``deadline``
    (``time.monotonic()``) passes first."""
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM's server exited: {proc.stderr.read()[-2000:]}")
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError("vLLM's server did not start in time") from None
            time.sleep(1)


def serve(cmd: list[str], port: int, start_s: float, env: dict | None = None):
    """For a fixture to ``yield from``: runs ``cmd`` (a vLLM OpenAI server on ``port``), yields its base
    URL once it answers (within ``start_s`` seconds), and stops it afterwards."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_server(proc, url, time.monotonic() + start_s)
    except RuntimeError:
        proc.kill()
        raise
    yield url + "/v1"
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def engine_env() -> dict[str, str]:
    """The environment of an engine started as a subprocess: a small KV cache (GiB) and the loopback
    address for its sockets, as the Makefile's VLLM_ENV (what the caller's environment sets wins), offline."""
    return {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": "127.0.0.1", **os.environ, "HF_HUB_OFFLINE": "1"}


#: The flags docs/GPU.md gives for parity with transformers on a CPU (vLLM's default dtype is bfloat16).
PARITY_FLAGS = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "2048"]


def vllm_serve(model_dir: str, port: int) -> list[str]:
    """``vllm serve`` (the console script beside this Python) on ``model_dir`` as the model ``tiny``, with
    :data:`PARITY_FLAGS`: the command docs/GPU.md gives."""
    vllm = str(Path(sys.executable).parent / "vllm")
    return [vllm, "serve", model_dir, "--served-model-name", "tiny", "--host", "127.0.0.1",
            "--port", str(port), *PARITY_FLAGS]  # fmt: skip
