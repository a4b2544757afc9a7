"""The fork server: the boot program (:mod:`whale_envs.sandbox.programs.boot`) started once per
process and kept, and the calls it runs (:class:`_ServedCall`, :func:`served_call`).

Starting a boot interpreter and importing what it needs was about half the cost of a call; the server
has that done and a child forked in advance, which takes the next call and builds its jail exactly as
a fresh boot interpreter would. The server never reads a call's configuration and never runs code; it
exits when this process does (or closes its socket); a forked child of this process starts its own.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import threading
import time

from whale_envs.sandbox import bundle, scratch
from whale_envs.sandbox.config import BOOT_ENV, boot_python
from whale_envs.sandbox.process import kill_tree

#: The boot program, run by every boot interpreter (a fresh one per call, or the fork server).
BOOT = f"{bundle.PROGRAMS}.boot"


class _ForkServer:
    """The boot interpreter, started once and kept: the boot program with ``--fork-server``.

    It has the boot script's imports done and a child forked in advance; each call is one message on
    the control socket (the configuration, plus stdout, stderr and a report socket as file
    descriptors), taken by that child, which builds the call's jail exactly as a fresh boot
    interpreter would. The server never reads a request and never runs code. It exits when this
    process closes the control socket (at exit, or when a forked child of this process drops it).
    """

    def __init__(self) -> None:
        #: An empty directory each call mounts its root on, in its own mount namespace (the server
        #: removes it when it exits; a private folder: no sweep takes it while this process lives).
        self.root = str(scratch.private_dir())
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                bundle.command(boot_python(), BOOT, "--fork-server", str(theirs.fileno()), self.root),
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                cwd="/",
                env=BOOT_ENV,
            )
        except BaseException:
            mine.close()
            scratch.remove(self.root)
            raise
        finally:
            theirs.close()
        self.sock = mine
        self.lock = threading.Lock()

    def submit(self, cfg: dict, fds: list[int]) -> None:
        with self.lock:  # one message at a time (SEQPACKET keeps each whole)
            socket.send_fds(self.sock, [json.dumps(cfg).encode()], fds)

    def close(self) -> None:
        self.sock.close()  # the server's waiting child sees the end of the socket; both exit
        try:
            self.proc.wait(timeout=5)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):  # Ctrl-C at exit: no traceback for it
            self.proc.kill()
            self.proc.wait()
        scratch.remove(self.root)  # the server removes it itself, unless it was killed


class _ServedCall:
    """One call run by the fork server, with the part of :class:`subprocess.Popen` that ``_run`` uses.

    ``pid`` is the call's supervisor (the boot interpreter's role), leader of its own process group; it
    stays alive until :meth:`close`, so ``kill_tree(pid)`` never reaches a reused pid.
    """

    def __init__(self, report: socket.socket, pid: int, out_fd: int, err_fd: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.stdout = open(out_fd, "rb", buffering=0)  # noqa: SIM115 - closed by execute.run after the kill
        self.stderr = open(err_fd, "rb", buffering=0)  # noqa: SIM115 - closed by execute.run after the kill
        self._report = report
        report.setblocking(False)  # poll() must never wait

    def _take(self, msg: bytes) -> int:
        # "exit <status>"; the end of the socket: the supervisor was killed before it reported
        self.returncode = int(msg.split()[1]) if msg.startswith(b"exit ") else -signal.SIGKILL
        return self.returncode

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        try:
            return self._take(self._report.recv(64))
        except BlockingIOError:
            return None
        except OSError:
            return self._take(b"")

    def wait(self) -> int:
        if self.returncode is not None:
            return self.returncode
        self._report.setblocking(True)
        try:
            return self._take(self._report.recv(64))
        except OSError:
            return self._take(b"")

    def close(self) -> None:
        if self.returncode is None:  # interrupted before the end (an exception in the caller)
            kill_tree(self.pid)
        self._report.close()  # the supervisor exits; its pid may be reused from now on


_SERVER: _ForkServer | None = None
_SERVER_LOCK = threading.Lock()
#: Longer code goes the old way (a file): a request is one socket message, which has a size limit.
SERVED_CODE_MAX = 16_384  # characters: at most ~100 KB as JSON, well inside a socket buffer
#: Calls of this process by how they started: through the fork server or a fresh boot interpreter.
CALLS = {"served": 0, "fresh": 0}
CALLS_LOCK = threading.Lock()


def _forget_server_in_child() -> None:
    """After ``os.fork`` in this process: the child starts its own server when it needs one."""
    global _SERVER, _SERVER_LOCK
    if _SERVER is not None:
        _SERVER.sock.close()
    _SERVER = None
    _SERVER_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_server_in_child)


def fork_server(stale: _ForkServer | None = None) -> _ForkServer:
    """The running fork server, started on first use; ``stale``: that one failed, start another."""
    global _SERVER
    with _SERVER_LOCK:
        if _SERVER is not None and (_SERVER is stale or _SERVER.proc.poll() is not None):
            _SERVER.close()
            _SERVER = None
        if _SERVER is None:
            _SERVER = _ForkServer()
        return _SERVER


@atexit.register
def _stop_server() -> None:
    """At exit: stop the server and wait for it, so that its CPU time (the calls') is counted in ours
    (the pools' exit handler, registered after this one, runs before it)."""
    if _SERVER is not None:
        _SERVER.close()


def served_call(cfg: dict, deadline: float) -> _ServedCall | None:
    """Hand one call to the fork server; None when it cannot take it (the caller then starts a fresh
    boot interpreter: the same jail). A server that died before a child took the call is replaced
    once; the code had not run (a supervisor reports its pid before anything else)."""
    stale = None
    for _ in range(2):
        try:
            server = fork_server(stale)
        except OSError:
            return None
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        report, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        msg = b""
        try:
            try:
                server.submit({**cfg, "root": server.root}, [out_w, err_w, theirs.fileno()])
            finally:  # the server's child holds them now; ours would hide its death (no end of file)
                for fd in (out_w, err_w):
                    os.close(fd)
                theirs.close()
            report.settimeout(max(deadline - time.monotonic(), 0.001))
            msg = report.recv(64)
        except OSError:  # a dead server, or one too slow to answer within the wall time
            pass
        if msg.startswith(b"pid "):
            return _ServedCall(report, int(msg.split()[1]), out_r, err_r)
        stale = server
        for fd in (out_r, err_r):
            os.close(fd)
        report.close()
        if time.monotonic() >= deadline:
            return None
    return None
