"""The package as a user installs it: build the wheel, install it into a fresh virtual environment,
and run ``whale --help``, ``whale eval`` of a shipped harness and ``whale train`` of a shipped config by
name, from a folder outside the repository (so nothing is imported from the source tree).

The fresh environment gets the dependencies from this environment's site-packages through a ``.pth``
line (a ``.pth`` file there is not processed, so this environment's editable install stays out), so the
test needs neither a network nor a second copy of torch.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIP = {
    ".git",
    ".venv",
    "runs",
    "build",
    "dist",
    "__pycache__",
    ".pytest_cache",
    ".ruff_cache",
    ".hypothesis",
    ".tools",
}


def sh(*cmd, cwd: Path, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, f"{cmd} -> {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path, str]:
    """(the fresh environment's bin folder, a work folder, the build log)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"  # a copy, so the build leaves no build/ or egg-info in the checkout
    shutil.copytree(
        ROOT,
        src,
        symlinks=True,
        # every virtual environment (.venv-pinned and .venv-vllm may be being built beside the suite)
        ignore=lambda _d, names: [
            n for n in names if n in SKIP or n.startswith(".venv") or n.endswith(".egg-info")
        ],
    )
    build = sh(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        tmp / "dist",
        src,
        cwd=tmp,
    )
    wheel = next((tmp / "dist").glob("whale_harness-*.whl"))
    venv = tmp / "venv"
    sh(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp)
    py = venv / "bin" / "python"
    site = Path(
        sh(py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=tmp).stdout.strip()
    )
    (site / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    sh(sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--no-index", wheel, cwd=tmp)
    work = tmp / "work"
    work.mkdir()
    return venv / "bin", work, build.stdout + build.stderr


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "COLUMNS": "200"}


@pytest.mark.slow
def test_wheel_holds_every_package_and_data_file(installed):
    _bin, work, log = installed
    assert "warning" not in log.lower(), log  # a clean build log
    wheel = next(work.parent.joinpath("dist").glob("*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for must in (
        "harnesses/chess_puzzles/h0.py",
        "harnesses/search_qa/follow_up.py",
        "whale_train/configs/demo.yaml",
        "whale_train/configs/math/base.yaml",
        "whale_train/models/tiny/config.json",
        "whale_envs/data/lichess_puzzles/puzzles.csv",
        "whale_train/meta_harness/library/math.py",
    ):
        assert must in names, must


@pytest.mark.slow
def test_installed_commands_work_from_outside_the_source_tree(installed):
    bin_dir, work, _log = installed
    where = sh(
        bin_dir / "python", "-c", "import whale_envs, harnesses.math; print(whale_envs.__file__)", cwd=work
    )
    assert str(bin_dir.parent) in where.stdout  # imported from the wheel, not the checkout
    assert "eval" in sh(bin_dir / "whale", "--help", cwd=work, env=_env()).stdout
    assert sh(bin_dir / "whale", "--version", cwd=work, env=_env()).stdout.startswith("whale 0.")
    ev = sh(
        bin_dir / "whale", "eval", "--env", "whale/Math-v0", "--harness", "math/h0", "--limit", "3", "--k", "1",
        "--out", work / "eval", cwd=work, env=_env(),
    )  # fmt: skip
    assert "mean@1" in ev.stdout and (work / "eval" / "results.json").exists()
    _the_worker_program_runs_from_the_wheel(bin_dir, work)
    train = sh(bin_dir / "whale", "train", "smoke", "--out", work / "run", cwd=work, env=_env())
    assert "best test mean@k" in train.stdout
    assert (work / "run" / "report.md").exists() and (work / "run" / "state.json").exists()


def _the_worker_program_runs_from_the_wheel(bin_dir: Path, work: Path) -> None:
    """The harness worker's program, built from the installed files, loads a harness that builds on a
    shipped one in a bare interpreter (no project, no installed packages): the wheel ships what it needs."""
    build = "import sys; from harnesses.worker import worker_program; sys.stdout.write(worker_program())"
    folder = work / "worker"
    folder.mkdir()
    (folder / "main.py").write_text(sh(bin_dir / "python", "-c", build, cwd=work).stdout, encoding="utf-8")
    source = "from harnesses.math.vote import MathVote\nclass Mine(MathVote):\n    samples = 2\n"
    load = json.dumps({"op": "load", "source": source, "filename": "mine.py"}) + "\n"
    ran = subprocess.run(
        [bin_dir / "python", "-I", "-S", "main.py"],
        cwd=folder,
        input=load,
        env={"WHALE_SANDBOX_ISOLATION": "none"},  # an episode may run where the kernel refuses namespaces
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.stdout.splitlines() == ['{"op": "ready"}'], (ran.stdout, ran.stderr[-3000:])
