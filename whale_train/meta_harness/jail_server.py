"""The proposer jail's server: the program :class:`.jail.ProposerJail` runs inside the jail.

Standard library only (the jail's interpreter starts with ``-S``, and nothing of the project is
importable there): :mod:`.jail` hands this file's text to ``whale_envs.sandbox.spawn_jailed``, which
runs it as the jail's ``main.py``. Importing it runs nothing; the pieces are functions so that tests
can call them outside a jail.

The protocol: one JSON request per line on stdin, one JSON answer per line on stdout, each answer
carrying its request's ``nonce``. Requests (``op``):

* ``run``: ``command`` with ``/bin/sh -c`` in the scratch folder, within ``wall_s`` seconds,
  ``cpu_s`` CPU seconds and ``output_bytes`` of output; answers ``exit``, ``output``, ``limit``
  (``wall``, ``output``, ``cpu`` or None), ``wall_s`` and ``swept`` (what :func:`sweep` killed);
* ``put``: write ``text`` to ``path`` under the scratch folder; answers ``ok``;
* ``get``: up to ``max`` characters of ``path`` under the scratch folder; answers ``text`` (None
  when it is not a file).

A request that fails answers ``error`` (the exception's type and message); the server goes on.
"""

import json
import os
import resource
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TextIO

#: The command's working directory and ``HOME``: the jail's private scratch folder.
SCRATCH = "/sandbox/scratch"
#: Where ``python`` points for the commands (the jail's interpreter).
BIN = "/sandbox/bin"
#: On every command's ``PYTHONPATH``, first: the harness SDK's copy (:func:`.jail.sdk_copy`).
SDK = "/sdk"


def command_env(environ: Mapping[str, str], scratch: str = SCRATCH) -> dict[str, str]:
    """The environment of every command: the server's, with the SDK first on ``PYTHONPATH``,
    ``/sandbox/bin`` first on ``PATH``, ``HOME`` the scratch folder, and byte-code written again."""
    env = dict(environ)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([SDK, *paths])
    env["PATH"] = BIN + ":" + env.get("PATH", "/usr/bin:/bin")
    env["HOME"] = scratch
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def inside(rel: str, scratch: str = SCRATCH) -> str:
    """``rel`` as a path under ``scratch``; ValueError for one that leads out of it."""
    path = os.path.normpath(os.path.join(scratch, rel))
    if path != scratch and not path.startswith(scratch + "/"):
        raise ValueError("outside the scratch folder")
    return path


def sweep() -> int:
    """SIGKILL every process of the jail's PID namespace but its init (PID 1) and this server.

    What a command started ends with it, however it detached (setsid, a double fork, a user namespace
    of its own). Passes until none is left (one forked during a pass is caught by the next); returns
    how many were killed, or -1 if some survived 200 passes. Only ever called inside the jail: outside
    one it would kill every process the caller may signal.
    """
    me, killed = os.getpid(), 0
    for _ in range(200):
        found = 0
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) in (1, me):
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as fh:
                    state = fh.read().rpartition(b")")[2].split()[0]
            except (OSError, IndexError):
                continue
            if state in (b"Z", b"X"):  # dead already (the server or PID 1 reaps it)
                continue
            found += 1
            try:
                os.kill(int(name), signal.SIGKILL)
            except OSError:
                pass
        if not found:
            return killed
        killed += found
        time.sleep(0.002)
    return -1


def run(
    req: Mapping[str, Any], env: Mapping[str, str], scratch: str, sweeper: Callable[[], int]
) -> dict[str, Any]:
    """One ``run`` request (:func:`answer` passes on its scratch folder and sweeper): the command's exit
    status, output and the limit that stopped it.

    After the command (or its limit) its process group is killed, then ``sweeper`` ends whatever left
    the group (a test outside a jail passes one that kills nothing)."""
    start = time.monotonic()
    cpu = int(req["cpu_s"])

    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))

    proc = subprocess.Popen(
        ["/bin/sh", "-c", req["command"]],
        cwd=scratch,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=limits,
    )
    assert proc.stdout is not None
    out, limit = bytearray(), None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = start + float(req["wall_s"])
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            limit = "wall"
            break
        if not sel.select(left):
            continue
        chunk = os.read(proc.stdout.fileno(), 65536)
        if not chunk:
            break
        out += chunk
        if len(out) > int(req["output_bytes"]):
            limit = "output"
            break
    sel.close()
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever the command left running in its group
    except OSError:
        pass
    swept = sweeper()  # and whatever left the group (setsid, a double fork)
    status = proc.wait()
    proc.stdout.close()
    if limit is None and status in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
        limit = "cpu"
    return {
        "exit": status,
        "output": out.decode("utf-8", "replace"),
        "limit": limit,
        "wall_s": round(time.monotonic() - start, 3),
        "swept": swept,
    }


def answer(
    req: Mapping[str, Any],
    env: Mapping[str, str],
    scratch: str = SCRATCH,
    sweeper: Callable[[], int] = sweep,
) -> dict[str, Any]:
    """The answer to one request (never raises: a failure is ``{"error": ...}``), with its nonce."""
    try:
        op = req["op"]
        if op == "run":
            ans = run(req, env, scratch, sweeper)
        elif op == "put":
            path = inside(req["path"], scratch)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(req["text"])
            ans = {"ok": True}
        elif op == "get":
            path = inside(req["path"], scratch)
            text = None
            if os.path.isfile(path):
                with open(path, encoding="utf-8", errors="replace") as fh:
                    text = fh.read(int(req["max"]))
            ans = {"text": text}
        else:
            ans = {"error": "unknown op"}
    except Exception as exc:
        ans = {"error": type(exc).__name__ + ": " + str(exc)}
    ans["nonce"] = req.get("nonce")
    return ans


def serve(
    lines: Iterable[str],
    out: TextIO,
    env: Mapping[str, str],
    scratch: str = SCRATCH,
    sweeper: Callable[[], int] = sweep,
) -> None:
    """Answer each request line of ``lines`` on ``out``, one line each, flushed."""
    for line in lines:
        req = json.loads(line)
        out.write(json.dumps(answer(req, env, scratch, sweeper)) + "\n")
        out.flush()


def main() -> None:
    """In the jail: the scratch folder, ``python`` on the commands' ``PATH``, then serve stdin."""
    os.makedirs(SCRATCH, exist_ok=True)
    os.makedirs(BIN, exist_ok=True)
    if not os.path.exists(BIN + "/python"):
        os.symlink(sys.executable, BIN + "/python")
    serve(sys.stdin, sys.stdout, command_env(os.environ))


if __name__ == "__main__":
    main()
