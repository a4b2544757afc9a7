"""Warm starts for the runs of a local grid: each ``whale train`` forked from a process that has already
imported PyTorch, transformers, TRL and datasets, instead of a fresh interpreter importing them again.

Those imports are about 6 s of CPU per run on a CPU (half of a smoke-sized run); a grid of short runs
pays them once. Within ``whale compare`` (``run_grid``, local jobs without ``--gpus-per-run``),
:func:`whale_train.placement.train_one` hands each run to the **zygote** (``python -m
whale_train.warm_start SOCKET``), started by the first run it can take; anything it cannot take starts
fresh as before.

What a warm-started run gets is what a fresh one gets:

* **Its own process**, forked from the zygote before any run: no run's state reaches another. The
  zygote imports third-party libraries and nothing of this project's that reads the environment, so
  every run imports WHALE under its own; and it runs no model code (nothing of torch beyond the import).
* **Its environment, working folder, log and arguments**: the run's environment replaces the
  zygote's, its ``train.log`` is its stdout and stderr (the caller's open file, passed over the socket),
  stdin is ``/dev/null``, and ``whale_train.cli`` runs as ``__main__`` with ``train CONFIG ...``. The run
  exits as an interpreter does (threads joined, ``atexit``, its exit code or signal reported back).
* **A run that needs an interpreter start of its own starts fresh**: one whose environment differs
  from the zygote's in anything but ``WHALE_*`` variables (another ``PYTHONPATH``, thread counts, CUDA
  devices: what is read at start-up or at import), or when the zygote could not start or has died.
  ``WHALE_WARM_START=0`` turns warm starts off.
* **Lifetimes as before**: the zygote dies with the thread that started it (``PR_SET_PDEATHSIG``) and
  each run with the zygote, so a killed ``whale compare`` leaves no run writing its folder; a run whose
  caller hangs up is killed. Ctrl-C reaches the runs (same process group) and not the zygote.

Linux only (fork, ``PR_SET_PDEATHSIG``, file descriptors over a Unix socket); elsewhere every run starts
fresh. ``ps`` shows a warm-started run under the zygote's command line.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import Any

ENV = "WHALE_WARM_START"
#: What the zygote imports before it forks (what every ``whale train`` run imports, and most of its start),
#: then the envs' Gymnasium and python-chess, which every run imports too (:func:`main` adds matplotlib's
#: pyplot): together 0.2-0.5 s of CPU that each warm run of the ``smoke`` config spent importing them.
PRELOAD = ("torch", "transformers", "datasets", "trl", "gymnasium", "chess")
#: Variables a run may set differently from the zygote: read by WHALE's own modules, which each run
#: imports itself.
RUN_VARIABLES = "WHALE_"


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Run the block (a process's start-up imports) with Python's cyclic garbage collector paused.
    Importing PyTorch and transformers makes about a million long-lived objects, and the collector
    walked the growing heap again and again meanwhile: 1.1-1.5 s of the 7 s of CPU those imports took
    here. Nothing is frozen here (the zygote freezes its heap itself, once, before its first fork)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def parent_death_signal() -> Callable[[], Any] | None:
    """A ``preexec_fn`` for a child that must not outlive the thread that starts it (Linux:
    ``PR_SET_PDEATHSIG``, SIGKILL); None where there is no ``prctl``. libc is loaded here, in the parent:
    between fork and exec the child only calls the function (a ``dlopen`` there could deadlock on a lock
    another thread held at the fork)."""
    try:
        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: a retried run may then overlap a leftover child
        return None
    return functools.partial(prctl, 1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG = 1


class WarmStarter:
    """The caller's side: the zygote process and :meth:`run`, which any thread may call."""

    def __init__(self, env: dict[str, str]):
        self.env = dict(env)
        self.problem: str | None = None
        self.proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._ready: bool | None = None

    def _start(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="whale-warm-")
        self.socket_path = os.path.join(self._dir.name, "zygote")
        self._errors = open(os.path.join(self._dir.name, "zygote.err"), "w+b")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "whale_train.warm_start", self.socket_path],
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._errors,
            preexec_fn=parent_death_signal(),
        )

    def ready(self) -> bool:
        """Whether the zygote has finished its imports and listens. The first call starts it and waits
        for it: the zygote then dies with the calling thread (a worker of ``whale compare``'s pool, which
        lives as long as the grid's runs)."""
        with self._lock:
            if self._ready is None:
                self._start()
                line = self.proc.stdout.readline()
                self._ready = line == b"ready\n"
                if not self._ready:
                    self._errors.seek(0)
                    tail = self._errors.read().decode(errors="replace").strip().splitlines()[-1:]
                    self.problem = tail[0] if tail else (line.decode(errors="replace").strip() or "it exited")
            return self._ready

    def takes(self, env: dict[str, str]) -> bool:
        """Whether a run with environment ``env`` may be forked from the zygote (see the module)."""
        keys = set(env) | set(self.env)
        return all(k.startswith(RUN_VARIABLES) or env.get(k) == self.env.get(k) for k in keys)

    def run(self, args: list[str], env: dict[str, str], log_fd: int, cwd: str | None = None) -> int | None:
        """``whale ARGS`` in a child of the zygote, its stdout and stderr on ``log_fd``; its exit code
        (minus the signal that killed it, as ``subprocess``), or None when the zygote cannot take it (the
        caller starts it fresh)."""
        if not self.takes(env) or not self.ready():
            return None
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            try:
                conn.connect(self.socket_path)
                socket.send_fds(conn, [b"r"], [log_fd])
                request = {"args": args, "env": env, "cwd": cwd or os.getcwd()}
                conn.sendall(json.dumps(request).encode() + b"\n")
            except OSError:  # the zygote died before it took the run
                return None
            answer = conn.makefile("rb").readline()
        if not answer:  # the zygote died while the run ran: the run died with it
            return -int(signal.SIGKILL)
        return int(json.loads(answer)["exit"])

    def close(self) -> None:
        """Ends the zygote, if it was started (no run may be in flight), and removes its folder."""
        if self.proc is None:
            return
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self._errors.close()
        self._dir.cleanup()


def starter(env: dict[str, str]) -> WarmStarter | None:
    """A :class:`WarmStarter` (its zygote starts with the first run it can take), or None where warm
    starts are off (``WHALE_WARM_START=0``) or cannot work (not Linux)."""
    if os.environ.get(ENV, "1") == "0" or not sys.platform.startswith("linux"):
        return None
    return WarmStarter(env)


# ---------------------------------------------------------------------------------------- the zygote


def _serve(path: str) -> dict[str, Any]:
    """The zygote's loop: a child forked per connection; returns only in a child, with its request.
    Exits when its stdin closes (the caller is done) after killing any run still in flight."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the runs and whale compare
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    runs: dict[int, socket.socket] = {}  # pid -> its caller's connection
    hung_up: set[int] = set()
    while True:
        waiting = [c for pid, c in runs.items() if pid not in hung_up]
        readable, _, _ = select.select([listener, sys.stdin, *waiting], [], [], 0.2)
        for ready in readable:
            if ready is sys.stdin:
                if not os.read(sys.stdin.fileno(), 1):  # the caller is done (or gone)
                    for pid in runs:
                        os.kill(pid, signal.SIGKILL)
                    raise SystemExit(0)
            elif ready is listener:
                conn, _ = listener.accept()
                try:
                    _, fds, _, _ = socket.recv_fds(conn, 1, 1)
                    request = json.loads(conn.makefile("rb").readline())
                except (OSError, ValueError):
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    _become_run(fds[0], [listener, conn, *runs.values()])
                    return request
                os.close(fds[0])
                runs[pid] = conn
            else:  # a caller hung up (its thread died): its run goes too
                pid = next(p for p, c in runs.items() if c is ready)
                os.kill(pid, signal.SIGKILL)
                hung_up.add(pid)
        while runs:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = runs.pop(pid)
            hung_up.discard(pid)
            try:
                conn.sendall(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            except OSError:
                pass
            conn.close()


def _become_run(log_fd: int, sockets: list[socket.socket]) -> None:
    """In a freshly forked child: dies with the zygote, takes the default Ctrl-C, drops the zygote's
    sockets, and writes to the run's log."""
    set_death_signal = parent_death_signal()
    if set_death_signal is not None:
        set_death_signal()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for s in sockets:
        s.close()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(devnull)
    os.close(log_fd)


def main() -> None:
    import importlib

    with gc_paused():
        for name in PRELOAD:
            importlib.import_module(name)
        import matplotlib
        from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401 - the lazy modules a run loads
        from trl import SFTConfig, SFTTrainer  # noqa: F401

        matplotlib.use("Agg")  # as whale_train.report.pyplot() sets it for the report's plots
        import matplotlib.pyplot  # noqa: F401

    if sys.modules["torch"].cuda.is_initialized():  # a forked child could not use CUDA: none of this
        raise SystemExit("the imports initialised CUDA")
    # What the imports made (about half a million objects) lives as long as every run forked from here:
    # frozen for good, as Python's docs advise for a process that forks without exec. Made with the
    # collector paused, those objects were still young at the fork, and each run's collections walked
    # them (0.4 s) and wrote to their pages, each page then copied: measured side by side (CPU of the
    # run and everything it started), a warm run of the ``smoke`` config took 2.8 s with the freeze,
    # 4.6 s without it, and 4.3 s when a run's first RSFT step undid it. So no step undoes it:
    # ``rsft.update.step_garbage_only`` leaves a frozen heap as it finds it, and each step's collection
    # walks what the run made since the fork (about 0.1 s a step of the shipped model; a run of 15
    # steps still took 0.7 s less).
    gc.freeze()
    zygote = os.getpid()
    request = _serve(sys.argv[1])
    if os.getppid() != zygote:  # the zygote died between the fork and the death signal
        raise SystemExit(1)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = ["whale", *request["args"]]
    import runpy

    from whale_train.rsft.update import heap_frozen_for_good  # (imported by the run, under its environment)

    heap_frozen_for_good()  # each RSFT step then leaves the freeze alone without counting it
    runpy.run_module("whale_train.cli", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
