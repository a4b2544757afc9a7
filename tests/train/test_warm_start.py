"""Warm starts (whale_train/warm_start.py): a run forked from the zygote gets the arguments, environment,
working folder and log a fresh ``whale`` would, and reports its exit code; what needs an interpreter start
of its own is refused (the caller starts it fresh). The smoke grid's runs are warm-started and its Ray
grid's are not: tests/train/test_scale_compare.py finds their ledgers equal."""

from __future__ import annotations

import subprocess
import sys

from tests.procs import carrying, running, running_children
from whale_train import placement, warm_start


def fresh(args: list[str], env: dict[str, str], cwd) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "whale_train.cli", *args]
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)


def test_a_warm_started_run_gets_its_arguments_environment_folder_and_log(tmp_path, monkeypatch):
    monkeypatch.delenv(warm_start.ENV, raising=False)
    env = {**placement._train_env(), "COLUMNS": "200"}
    tasks = ["tasks", "--env", "whale/Math-v0", "--tasks", "generated?difficulty=1&size=30", "--split", "all"]
    (tmp_path / "cfg.yaml").write_text("name: x\nbudget_rollouts: 0\n")
    starter = warm_start.starter(env)
    try:
        outputs = {}
        for args, extra in (
            (
                tasks,
                {"WHALE_SPLIT_SECRET": "one"},
            ),  # task ids depend on the secret: the run's, not the zygote's
            (tasks, {"WHALE_SPLIT_SECRET": "two"}),
            (["train", "cfg.yaml"], {}),  # a relative path: the run's folder
            (["no-such-command"], {}),
        ):
            log = tmp_path / f"log{len(outputs)}"
            with open(log, "w") as fh:
                code = starter.run(args, {**env, **extra}, fh.fileno(), cwd=str(tmp_path))
            want = fresh(args, {**env, **extra}, tmp_path)
            assert (code, log.read_text()) == (want.returncode, want.stdout + want.stderr), args
            outputs[len(outputs)] = log.read_text()
        assert outputs[0] != outputs[1]
        assert "cfg.yaml: TrainConfig.budget_rollouts must be >= 1, got 0" in outputs[2]
        assert "invalid choice: 'no-such-command'" in outputs[3]
        assert starter.problem is None
        (zygote,) = carrying(starter.socket_path)
        assert not running_children(zygote)  # every run reaped

        # refused (the caller starts these fresh): what an interpreter reads when it starts or imports
        assert starter.run(["--help"], {**env, "PYTHONPATH": str(tmp_path)}, 1) is None
        assert starter.run(["--help"], {**env, "OMP_NUM_THREADS": "2"}, 1) is None
        assert starter.run(["--help"], {k: v for k, v in env.items() if k != "HF_HUB_OFFLINE"}, 1) is None
    finally:
        starter.close()
    assert not running(zygote)


def test_warm_starts_are_off_on_request(monkeypatch):
    monkeypatch.setenv(warm_start.ENV, "0")
    assert warm_start.starter(placement._train_env()) is None
