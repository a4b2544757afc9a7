"""``whale compare`` placement: disjoint GPUs per concurrent local job, and the grid on a local Ray
cluster giving the same results as the local grid, also after a Ray worker is killed mid-run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.train.conftest import SMOKE_KILLED
from whale_train.compare import CompareConfig, plan, run_grid
from whale_train.placement import DevicePool, RayPlacement

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "configs" / "compare" / "smoke.yaml"


def _finished_run(run_dir: Path, config) -> None:
    """A run directory whose ledger ends with ``stop`` (what a finished ``whale train`` leaves)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
    events = [
        {"event": "start", "unit": 0, "rollouts_total": 0},
        {"event": "eval", "unit": 0, "rollouts_total": 0, "mean": 0.5, "se": 0.1},
        {"event": "stop", "unit": 0, "rollouts_total": 0, "reason": "budget"},
    ]
    (run_dir / "ledger.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def test_local_jobs_get_disjoint_gpus(tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text(
        yaml.safe_dump(
            {
                "domains": {"math": {"set": {"env": "whale/Math-v0"}}},
                "methods": ["whale", "weight-only", "harness-only", "stagewise", "fst"],
                "seeds": [0, 1],
                "set": {"budget_rollouts": 100},
            }
        )
    )
    cfg = CompareConfig.load(grid)
    specs = {r.config.name: r.config for r in plan(cfg)}
    holding: dict[str, list[str]] = {}
    seen: list[tuple[str, str]] = []
    lock = threading.Lock()
    overlaps: list[str] = []
    most = [0]

    def train(config_path: Path, run_dir: Path, env: dict[str, str]) -> int:
        mine = env["CUDA_VISIBLE_DEVICES"].split(",")
        with lock:
            busy = {d for devs in holding.values() for d in devs}
            if busy & set(mine):
                overlaps.append(run_dir.name)
            holding[run_dir.name] = mine
            most[0] = max(most[0], len(holding))
            seen.append((run_dir.name, env["CUDA_VISIBLE_DEVICES"]))
        time.sleep(0.05)
        with lock:
            del holding[run_dir.name]
        _finished_run(run_dir, specs[run_dir.name])
        return 0

    pool = DevicePool(["0", "1", "2", "3", "4"], 2)  # two jobs fit; GPU 4 is left over
    table = run_grid(cfg, tmp_path / "out", jobs=8, log=lambda _l: None, train=train, devices=pool)
    assert len(seen) == 10 and not overlaps and most[0] == 2 and table["invocation"]["jobs"] == 2
    for _name, devs in seen:  # two distinct GPUs of the pool each
        assert len(set(devs.split(","))) == 2 and set(devs.split(",")) <= {"0", "1", "2", "3", "4"}
    assert sorted(pool.free) == ["0", "1", "2", "3", "4"]  # every lease went back
    placements = [
        json.loads(line)
        for p in (tmp_path / "out" / "runs").glob("*/placement.jsonl")
        for line in p.read_text().splitlines()
    ]
    assert len(placements) == 10 and all(p["via"] == "local" and p["devices"] for p in placements)
    with pytest.raises(ValueError, match="needs more GPUs"):
        DevicePool(["0"], 2)


@pytest.mark.slow  # starts a local Ray instance for the last case
def test_placement_options_are_user_errors(tmp_path):
    def compare(*extra: str) -> subprocess.CompletedProcess:
        whale = Path(sys.executable).parent / "whale"  # the entry point (``-m whale_train.cli`` runs the
        cmd = [str(whale), "compare", str(SMOKE), "--out", str(tmp_path), *extra]  # CLI as __main__)
        return subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})

    few = compare("--gpus-per-run", "3", "--devices", "0,1")
    assert few.returncode == 2 and "needs more GPUs than are visible (0,1)" in few.stderr
    assert "Traceback" not in few.stderr and len(few.stderr.strip().splitlines()) == 1
    half = compare("--gpus-per-run", "0.5", "--devices", "0,1")
    assert half.returncode == 2 and "whole number" in half.stderr
    ray = compare("--ray", "local", "--gpus-per-run", "1", "--devices", "")  # a task no node could take
    assert ray.returncode == 2 and "has 0 GPU(s) in all" in ray.stderr and "Traceback" not in ray.stderr


# ------------------------------------------------------------------------------------------ Ray


def _results(out: Path) -> dict[str, list[dict]]:
    """Every run's ledger without wall-clock fields, nor ``cached`` (which run of the grid scored a shared
    evaluation first depends on the order they ran in): what must not depend on where a run ran."""

    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if not k.endswith("seconds") and k != "cached"}
        return x

    return {
        p.parent.name: [strip(json.loads(line)) for line in p.read_text().splitlines()]
        for p in sorted((out / "runs").glob("*/ledger.jsonl"))
    }


def _sub_grid() -> CompareConfig:
    """The smoke grid's first seed with two of its methods: as small as a grid with a comparison gets."""
    cfg = CompareConfig.load(SMOKE)
    cfg.methods, cfg.seeds, cfg.ablation = ["whale", "weight-only"], [0], None
    return cfg


@pytest.mark.slow
@pytest.mark.xdist_group("smoke-grid")  # the worker that builds `smoke_grid` (tests/train/conftest.py)
def test_ray_grid_matches_the_local_grid_after_a_killed_worker(tmp_path, smoke_grid):
    cfg = _sub_grid()
    # the local grid: these runs of the smoke grid (run locally, 2 jobs, by train_one; the smoke grid's
    # killed run is another one, so these ran straight), not run a second time here
    names = sorted({r.config.name for r in plan(cfg)})
    assert names == ["math-weight-only-s0", "math-whale-s0"] and SMOKE_KILLED not in names
    assert not set(names) & set(smoke_grid.first["invocation"]["failed"])
    local_results = {n: events for n, events in _results(smoke_grid.out).items() if n in names}
    local_best = {
        m: [c["best"][c["seeds"].index(s)] for s in cfg.seeds]
        for m, c in smoke_grid.table["domains"]["math"]["methods"].items()
        if m in cfg.methods
    }

    out = tmp_path / "ray"
    victim = out / "runs" / "math-whale-s0"
    killed: list[int] = []

    def kill_when_midway() -> None:  # SIGKILL the victim's Ray worker once two units are in its ledger
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not killed:
            try:
                units = sum(
                    '"event": "unit"' in ln for ln in (victim / "ledger.jsonl").read_text().splitlines()
                )
                pid = json.loads((victim / "placement.jsonl").read_text().splitlines()[0])["pid"]
            except (FileNotFoundError, IndexError, json.JSONDecodeError):
                units = 0
            if units >= 2:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            time.sleep(0.1)

    ray = RayPlacement("local", local_cpus=2, max_retries=2)
    killer = threading.Thread(target=kill_when_midway, daemon=True)
    try:
        killer.start()
        table = run_grid(cfg, out, log=lambda _l: None, ray=ray)
    finally:
        ray.close()
    killer.join(timeout=5)
    assert killed, "the victim finished before its worker could be killed"
    assert not table["invocation"]["failed"]
    attempts = [json.loads(line) for line in (victim / "placement.jsonl").read_text().splitlines()]
    assert len(attempts) == 2 and attempts[0]["pid"] == killed[0] != attempts[1]["pid"]
    assert all(a["via"] == "ray" for a in attempts)
    # the killed run resumed: one start, every unit once, and the same results as the local grid
    events = _results(out)["math-whale-s0"]
    assert sum(e["event"] == "start" for e in events) == 1 and events[-1]["event"] == "stop"
    units = [e["unit"] for e in events if e["event"] == "unit"]
    assert units == list(range(len(units))) and len(units) > 2
    assert _results(out) == local_results and len(_results(out)) == 2
    same = {m: c["best"] for m, c in table["domains"]["math"]["methods"].items()}
    assert same == local_best


def test_the_gpu_grid_resolves_to_one_gpu_runs():
    old = Path.cwd()
    os.chdir(ROOT)  # its domain configs are named relative to the project
    try:
        runs = plan(CompareConfig.load(ROOT / "configs" / "compare" / "gpu.yaml"))
    finally:
        os.chdir(old)
    assert len({r.config.name for r in runs}) == 3 * 5 * 3 + 3 * 3
    assert all(r.config.backend == "vllm" and r.config.tensor_parallel_size == 1 for r in runs)
    assert {r.config.model for r in runs} == {"Qwen/Qwen3.5-2B", "Qwen/Qwen3.5-4B"}
