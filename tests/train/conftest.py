"""Shared fixtures of the training suites: the smoke grid of ``whale compare``, run once per session (on
pytest-xdist, once per worker: the tests that read it carry ``xdist_group("smoke-grid")`` so that one
worker runs them all and builds it once); and the real-engine suite's model and vLLM server, one each
per session of ``make test-vllm``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.crash import crash_env
from whale_train.compare import CompareConfig, plan, run_grid, run_state, train_one

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "configs" / "compare" / "smoke.yaml"
#: The smoke grid's run that is SIGKILLed in the middle of its third unit. Seed 1: the seed-0 whale and
#: weight-only runs stay straight runs, the local grid that tests/train/test_scale_compare.py compares
#: its Ray grid with.
SMOKE_KILLED = "math-whale-s1"


@dataclass
class SmokeGrid:
    """The smoke grid after two invocations: ``run_grid`` with :data:`SMOKE_KILLED` SIGKILLed (``first``,
    its table; ``killed_state``, that run's state right after it), then ``whale compare`` in a new process
    (``second``, its result; ``table``, the compare.json it wrote)."""

    out: Path
    first: dict[str, Any]
    killed_state: str
    second: subprocess.CompletedProcess
    table: dict[str, Any]

    def compare(self, *extra: str) -> subprocess.CompletedProcess:
        """``whale compare configs/compare/smoke.yaml --out OUT --jobs 2 EXTRA...`` in a subprocess."""
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        cmd = [sys.executable, "-m", "whale_train.cli", "compare", str(SMOKE), "--out", str(self.out)]
        return subprocess.run(
            [*cmd, "--jobs", "2", *extra], env=env, capture_output=True, text=True, cwd=ROOT
        )


@pytest.fixture(scope="session")
def smoke_grid(tmp_path_factory) -> SmokeGrid:
    """The smoke grid (11 runs), run once: the most expensive grid of the suite, read by the smoke grid's
    test (which goes on invoking ``whale compare`` on it: no new work, its ledgers unchanged) and by the
    Ray grid's test (which reads two straight runs' ledgers and ``table``)."""
    cfg = CompareConfig.load(SMOKE)
    out = tmp_path_factory.mktemp("smoke-grid") / "smoke"

    def train(config_path: Path, run_dir: Path) -> int:  # SIGKILL one run in the middle of its third unit
        extra = crash_env("unit_done@2") if run_dir.name == SMOKE_KILLED else {}
        return train_one(config_path, run_dir, extra)

    first = run_grid(cfg, out, jobs=2, log=lambda _line: None, train=train)
    spec = next(r for r in plan(cfg) if r.id == SMOKE_KILLED)
    killed_state = run_state(out / "runs" / SMOKE_KILLED, spec.config)
    grid = SmokeGrid(out, first, killed_state, subprocess.CompletedProcess([], 0), {})
    grid.second = grid.compare()
    if (out / "compare.json").exists():
        grid.table = json.loads((out / "compare.json").read_text())
    return grid


# ------------------------------------------------------------------ the real-engine suite (make test-vllm)


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory) -> str:
    """The untied random Qwen3 of tests/train/test_vllm_real*.py (tests/vllm_real.py), built once."""
    from tests.vllm_real import random_qwen3

    return random_qwen3(tmp_path_factory, tied=False)


@pytest.fixture(scope="session")
def vllm_server():
    """``vllm serve`` on the shipped tiny model with the CPU parity flags (tests/vllm_real.py), started once
    for the files of the real-engine suite that talk to an OpenAI server (a start is 20-50 s of the 2
    cores): its ``/v1`` URL."""
    from tests.vllm_real import engine_env, free_port, serve, vllm_serve
    from whale_train.llm import SHIPPED_MODEL

    port = free_port()
    yield from serve(
        vllm_serve(SHIPPED_MODEL, port), port, start_s=420, env=engine_env()
    )  # minutes on a busy CI
