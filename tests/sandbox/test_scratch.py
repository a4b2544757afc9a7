"""A call's private folder outlives no process: the folders a SIGKILLed trusted process left in the temp
dir are swept by the next process that makes one, and a living process's folder never is."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from whale_envs.sandbox import scratch

MAKE = (
    "import os, sys\n"
    "from whale_envs.sandbox import scratch\n"
    "path = scratch.private_dir()\n"
    "(path / 'code.py').write_text('print(1)')\n"
    "print(path, flush=True)\n"
    "if sys.argv[1] == 'die':\n"
    "    os.kill(os.getpid(), 9)\n"
    "sys.stdin.read()\n"
)


def _maker(tmp_path: Path, how: str) -> tuple[subprocess.Popen, Path]:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", MAKE, how], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    return proc, Path(proc.stdout.readline().strip())


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_a_killed_processs_folder_is_swept_and_a_living_ones_is_not(tmp_path):
    dead, left = _maker(tmp_path, "die")
    assert dead.wait() == -signal.SIGKILL and (left / "code.py").exists()
    alive, held = _maker(tmp_path, "wait")
    try:
        _age(left, 2 * scratch.SWEEP_AGE_S)
        _age(held, 2 * scratch.SWEEP_AGE_S)
        assert scratch.sweep(str(tmp_path)) == [str(left)]
        assert not left.exists() and (held / "code.py").exists()
    finally:
        alive.stdin.close()
        alive.wait()
    _age(held, 2 * scratch.SWEEP_AGE_S)  # its process is gone now
    assert scratch.sweep(str(tmp_path)) == [str(held)]


def test_young_folders_and_other_names_are_left(tmp_path):
    dead, left = _maker(tmp_path, "die")
    dead.wait()
    other = tmp_path / "whale-other"
    other.mkdir()
    _age(other, 2 * scratch.SWEEP_AGE_S)
    assert scratch.sweep(str(tmp_path)) == []  # one just made (it may not be locked yet), one not ours
    assert left.exists() and other.exists()


def test_remove_deletes_the_folder_and_lets_go_of_it(tmp_path, monkeypatch):
    monkeypatch.setattr(scratch.tempfile, "tempdir", str(tmp_path))
    path = scratch.private_dir()
    assert str(path) in scratch._HELD and path.parent == tmp_path
    scratch.remove(path)
    assert not path.exists() and str(path) not in scratch._HELD
