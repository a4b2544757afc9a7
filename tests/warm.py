"""``whale train`` subprocesses of the tests, forked warm where they can be.

The resume tests start a run again and again (killed at one point, resumed, killed at the next), and
each fresh ``whale`` interpreter spends about 5 s of CPU importing PyTorch, transformers and TRL before
it does anything. :func:`whale_train` hands each run to the zygote of :mod:`whale_train.warm_start`
(one per test process, started by the first run), the same mechanism ``whale compare`` uses for its
grids: a run forked from it gets its own process, environment, folder, arguments and exit status, so a
SIGKILL at a fault point (``tests/crash.py``) still ends the run as it ends a fresh one (-9). A run
whose environment the zygote cannot take (another ``PYTHONPATH``, thread counts: anything but
``WHALE_*`` variables that differs from the test process's) starts fresh, as ``WHALE_WARM_START=0``
makes every run start. stdout and stderr come back together in ``stdout``.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import tempfile

from tests.crash import FAULTS

_STARTERS: list = []


def base_env() -> dict[str, str]:
    """The environment of a test's ``whale`` run: this process's, offline, with the fault-injection
    folder first on ``PYTHONPATH`` (inert until a run sets ``WHALE_CRASH_AT``), so that a killed run and
    a straight one have the same environment and both are forked from the same zygote."""
    env = {
        k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST" and not k.startswith("WHALE_CRASH")
    }
    path = os.pathsep.join(p for p in (str(FAULTS), os.environ.get("PYTHONPATH", "")) if p)
    return {**env, "HF_HUB_OFFLINE": "1", "PYTHONPATH": path}


def _starter(env: dict[str, str]):
    """This process's warm starter (made for the environment of its first run), or None where warm
    starts are off; the caller starts a run fresh when it does not take the run's environment."""
    from whale_train import warm_start

    if not _STARTERS:
        _STARTERS.append(warm_start.starter(env))
    return _STARTERS[0]


@atexit.register
def _close() -> None:
    for starter in _STARTERS:
        if starter is not None:
            starter.close()


def whale_train(
    args: list[str], env: dict[str, str] | None = None, cwd: str | None = None
) -> subprocess.CompletedProcess:
    """``whale train ARGS`` with :func:`base_env` plus ``env``, in ``cwd`` (this process's by default):
    warm where the zygote takes it, fresh otherwise; its exit code (-9 for a SIGKILL) and its output
    (stdout and stderr together)."""
    run_env = {**base_env(), **(env or {})}
    cmd = [sys.executable, "-m", "whale_train.cli", "train", *args]
    with tempfile.TemporaryFile() as log:
        starter = _starter(run_env)
        code = starter.run(["train", *args], run_env, log.fileno(), cwd) if starter is not None else None
        if code is None:
            code = subprocess.run(
                cmd, env=run_env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            ).returncode
        log.seek(0)
        out = log.read().decode("utf-8", "replace")
    return subprocess.CompletedProcess(cmd, code, out, "")
