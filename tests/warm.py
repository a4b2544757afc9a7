"""``whale`` subprocesses of the tests, forked warm where they can be.

Each fresh ``whale`` interpreter spends about 5 s of CPU importing PyTorch, transformers and TRL before
it does anything, and the resume tests start a run again and again (killed at one point, resumed,
killed at the next). :func:`whale` hands each command to a zygote of :mod:`whale_train.warm_start`,
the same mechanism ``whale compare`` uses for its grids: a command forked from it gets its own process,
environment, folder, arguments, stdout, stderr and exit status, so a SIGKILL at a fault point
(``tests/crash.py``) still ends a run as it ends a fresh one (-9). A zygote takes only commands of the
environment it was started with (anything but ``WHALE_*`` variables: what an interpreter reads at start
or import), so a test process keeps one for each of the last two environments its commands came with.
``WHALE_WARM_START=0`` makes every command start fresh. A command's stdin is ``/dev/null``.

What a fresh interpreter itself does (the installed entry point, Ctrl-C, what it prints at exit) is
tested where the tests start ``whale`` themselves (tests/train/test_wheel.py, test_bad_inputs.py,
test_first_contact.py).
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import tempfile

from tests.crash import FAULTS


def base_env() -> dict[str, str]:
    """The environment of a test's ``whale`` run: this process's, offline, with the fault-injection
    folder first on ``PYTHONPATH`` (inert until a run sets ``WHALE_CRASH_AT``), so that a killed run and
    a straight one have the same environment and both are forked from the same zygote."""
    env = {
        k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST" and not k.startswith("WHALE_CRASH")
    }
    path = os.pathsep.join(p for p in (str(FAULTS), os.environ.get("PYTHONPATH", "")) if p)
    return {**env, "HF_HUB_OFFLINE": "1", "PYTHONPATH": path}


#: This process's warm starters, one for each environment a command came with (the last two; a third
#: environment ends the oldest zygote): an earlier test may have changed this process's environment
#: (a tracker sets its variables), and a zygote takes only runs of its own environment.
_STARTERS: dict[tuple, object] = {}
KEEP = 2


def _starter(env: dict[str, str]):
    """The warm starter for ``env`` (its zygote starts with the first command it takes), or None where
    warm starts are off; the caller starts a command fresh when it does not take the command's
    environment."""
    from whale_train import warm_start

    key = tuple(sorted((k, v) for k, v in env.items() if not k.startswith(warm_start.RUN_VARIABLES)))
    if key not in _STARTERS:
        if len(_STARTERS) >= KEEP:
            oldest = _STARTERS.pop(next(iter(_STARTERS)))
            if oldest is not None:
                oldest.close()
        _STARTERS[key] = warm_start.starter(env)
    return _STARTERS[key]


@atexit.register
def _close() -> None:
    for starter in _STARTERS.values():
        if starter is not None:
            starter.close()


def whale(
    args: list[str], env: dict[str, str] | None = None, cwd: str | None = None, *, apart: bool = True
) -> subprocess.CompletedProcess:
    """``whale ARGS`` with :func:`base_env` plus ``env``, in ``cwd`` (this process's by default): warm
    where the zygote takes it, fresh otherwise; its exit code (-9 for a SIGKILL), its stdout and its
    stderr (both in ``stdout`` when not ``apart``), as text. For the tests whose subject is what a
    command does, not the interpreter it starts in (those run ``whale`` themselves)."""
    run_env = {**base_env(), **(env or {})}
    cmd = [sys.executable, "-m", "whale_train.cli", *args]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        starter = _starter(run_env)
        err_fd = err.fileno() if apart else None
        code = starter.run(args, run_env, out.fileno(), cwd, err_fd) if starter is not None else None
        if code is None:
            code = subprocess.run(
                cmd, env=run_env, cwd=cwd, stdout=out, stderr=err if apart else subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            ).returncode  # fmt: skip
        texts = []
        for fh in (out, err):
            fh.seek(0)
            texts.append(fh.read().decode("utf-8", "replace"))
    return subprocess.CompletedProcess(cmd, code, *texts)


def whale_train(
    args: list[str], env: dict[str, str] | None = None, cwd: str | None = None
) -> subprocess.CompletedProcess:
    """``whale train ARGS`` as :func:`whale` runs it, its stdout and stderr together in ``stdout``."""
    return whale(["train", *args], env, cwd, apart=False)
