"""The warm pool: for the limits of a call it has seen, :func:`pool_size` sandboxes started in advance
through the fork server (jail, limits, uid and seccomp as for any call, the interpreter started and
:func:`pool_preload` imported), each waiting for its code on stdin
(:mod:`whale_envs.sandbox.programs.pool_child`). A call takes the oldest, sends it the code and waits
for nothing else; the pool is refilled when the call is done, in a thread of its own. A pooled sandbox
is started from the limits alone: it knows nothing of the call it will serve until the code comes.
"""

from __future__ import annotations

import atexit
import os
import selectors
import socket
import threading
import time

from whale_envs.sandbox import bundle, forkserver
from whale_envs.sandbox.config import boot_config, sandbox_uid
from whale_envs.sandbox.forkserver import CALLS_LOCK, _ForkServer, _ServedCall
from whale_envs.sandbox.process import Limits

#: The program of a pooled call, its ``main.py`` until the code comes.
POOL_CHILD = f"{bundle.PROGRAMS}.pool_child"

#: CPU seconds a pooled program may spend before its code comes (start-up and the preloaded imports).
_POOL_BOOT_CPU_S = 30
#: Pooled calls: taken (those whose program was ready at once: ``ready``), and given up (a pooled call
#: that had died or could not be sent its code; the call then took another or started cold).
POOL_CALLS = {"taken": 0, "ready": 0, "lost": 0}


def pool_size() -> int:
    """Warm sandboxes kept per limits (``WHALE_SANDBOX_POOL``; 0 turns the pool off). Default: 2, or
    4 on more than 4 CPUs. Each is a jailed interpreter waiting for its code (about 10 MB resident)."""
    raw = os.environ.get(POOL_ENV, "").strip()
    if raw:
        try:
            return max(0, int(raw))
        except ValueError:
            raise ValueError(f"{POOL_ENV} must be a whole number, got {raw!r}") from None
    return 2 if (os.cpu_count() or 1) <= 4 else 4


def pool_preload() -> tuple[str, ...]:
    """Modules a pooled interpreter imports before its code comes (``WHALE_SANDBOX_PRELOAD``, comma
    separated; ``-`` for none). Default: ``math`` and ``itertools``, built into the interpreter (their
    import costs nothing). Every pooled sandbox imports them, whether its code uses them or not, so a
    module pays only where most calls import it and cores are spare: ``fractions`` (with ``decimal``,
    ``numbers`` and ``re``) added about 15 ms of CPU to every call, half again the 30 ms a call costs,
    and ``collections`` with ``functools`` about 5 ms (200 ``print(2+2)`` calls on 2 cores, side by
    side); heavy libraries (``sympy``) about a second each."""
    raw = os.environ.get(PRELOAD_ENV)
    if raw is None:
        return _DEFAULT_PRELOAD
    return tuple(n.strip() for n in raw.split(",") if n.strip() and n.strip() != "-")


POOL_ENV = "WHALE_SANDBOX_POOL"
PRELOAD_ENV = "WHALE_SANDBOX_PRELOAD"
_DEFAULT_PRELOAD = ("math", "itertools")


class _Pooled:
    """One pooled call: sent to the fork server before any call asked for it, its program waiting for
    the code. The caller holds its stdin (``code_w``), stdout, stderr and report socket."""

    def __init__(self, server: _ForkServer, template: dict, settings: bytes) -> None:
        self.uid = sandbox_uid() if os.geteuid() == 0 else None  # its own, as for any call
        cfg = {**template, "uid": self.uid, "root": server.root}
        code_r, self.code_w = os.pipe()
        self.out_r, out_w = os.pipe()
        self.err_r, err_w = os.pipe()
        self.report, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.ready = False
        self._pid: int | None = None
        try:
            server.submit(cfg, [out_w, err_w, theirs.fileno(), code_r])
            _send(self.code_w, settings)  # within the pipe's buffer: read when the program starts
        except OSError:
            self.close()
            raise
        finally:  # the server's child holds them now
            for fd in (code_r, out_w, err_w):
                os.close(fd)
            theirs.close()

    def supervisor(self, timeout: float) -> int | None:
        """The pid of its supervisor (as for a served call), once it has reported it; None if it died."""
        if self._pid is None:
            self.report.settimeout(max(timeout, 0.001))
            msg = self.report.recv(64)
            self._pid = int(msg.split()[1]) if msg.startswith(b"pid ") else 0
        return self._pid or None

    def _wait_ready(self, timeout: float) -> bool:
        """Whether the program said it is ready within ``timeout`` (False: not yet, or it died)."""
        if not self.ready:
            with selectors.DefaultSelector() as sel:
                sel.register(self.out_r, selectors.EVENT_READ)
                if not sel.select(max(timeout, 0)):
                    return False
            self.ready = os.read(self.out_r, 1) == b"\0"  # else the end of the pipe: it died
        return self.ready

    def _waiting(self) -> bool:
        """Still waiting for its code: nothing more on stdout or the report socket (an end of file, or
        the exit status of a program that died)."""
        with selectors.DefaultSelector() as sel:
            sel.register(self.out_r, selectors.EVENT_READ)
            sel.register(self.report, selectors.EVENT_READ)
            return not sel.select(0)

    def take(self, code: bytes, deadline: float) -> _ServedCall | None:
        """Send ``code`` to the program and return the running call; None (and closed) when it died."""
        try:
            pid = self.supervisor(deadline - time.monotonic())
            if pid and self._wait_ready(deadline - time.monotonic()) and self._waiting():
                _send(self.code_w, code)  # within the pipe's buffer
                os.close(self.code_w)
                self.code_w = -1
                return _ServedCall(self.report, pid, self.out_r, self.err_r)
        except OSError:
            pass
        self.close()
        return None

    def close(self) -> None:
        """Give it up: its supervisor sees the report socket close and kills its PID 1."""
        for fd in (self.code_w, self.out_r, self.err_r):
            if fd >= 0:
                os.close(fd)
        self.code_w = self.out_r = self.err_r = -1
        self.report.close()


#: Code longer than this (in UTF-8 bytes) is not sent to a pooled call: it must fit the pipe's buffer.
_POOLED_CODE_MAX = 60_000


class _Pool:
    """Pooled calls of one configuration (limits and isolation), oldest first."""

    def __init__(self, limits: Limits, isolation: str, size: int) -> None:
        self.size = size
        self.calls: list[_Pooled] = []
        self.starting = 0  # being sent by fill()
        self.closed = False
        program = bundle.program(POOL_CHILD)
        #: The configuration of its calls, but for each one's uid and the server's root.
        self.template = boot_config(None, None, limits, isolation, None, code=program, root="")
        #: What each one's program is told first: the code's CPU seconds and the modules to preload.
        self.settings = f"{self.template['limits']['cpu_s']} {','.join(pool_preload())}".encode()
        self.template["limits"]["cpu_s"] += _POOL_BOOT_CPU_S  # the program lowers it when the code comes

    def fill(self) -> None:
        """Send new pooled calls to the fork server until there are ``size`` (their start-up runs in
        the server's children: nobody waits for it). Called without ``_POOL_LOCK``."""
        while True:
            with _POOL_LOCK:
                if self.closed or len(self.calls) + self.starting >= self.size:
                    return
                self.starting += 1
            try:
                new = _Pooled(forkserver.fork_server(), self.template, self.settings)
            except OSError:
                new = None
            with _POOL_LOCK:
                self.starting -= 1
                if new is not None and not self.closed:
                    self.calls.append(new)
                    continue
            if new is not None:
                new.close()
            return

    def fill_later(self) -> None:
        """:meth:`fill` in a thread of its own: off the path of the call that asks for it."""
        threading.Thread(target=self.fill, name="whale-sandbox-pool", daemon=True).start()

    def close(self) -> None:
        self.closed = True
        for call in self.calls:
            call.close()
        self.calls.clear()


_POOLS: dict[tuple, _Pool] = {}
_POOL_LOCK = threading.Lock()  # taken before _SERVER_LOCK, never after
_POOLS_MAX = 2  # configurations kept warm at once (the least recently used one is given up)


def pooled_call(
    code: str, limits: Limits, isolation: str, deadline: float
) -> tuple[_ServedCall, int | None] | None:
    """Run ``code`` in a pooled sandbox: (the call, its uid), or None (no pool, or none of its calls
    took it: the caller starts one as before). The oldest pooled call is taken even if it is still
    starting (it is ahead of a cold start). The pool is refilled when the call is done
    (:func:`refill`), not while its code runs, and by a thread of its own: on a busy machine a
    sandbox starting meanwhile takes CPU from the call (and from those running beside it)."""
    data = code.encode("utf-8", errors="replace")
    size = pool_size()
    if size == 0 or len(data) > _POOLED_CODE_MAX or not limits.writable_files:
        return None
    key = (limits, isolation)
    for _ in range(size + 1):
        with _POOL_LOCK:
            pool = _POOLS.pop(key, None) or _Pool(limits, isolation, size)
            _POOLS[key] = pool  # the most recently used last
            while len(_POOLS) > _POOLS_MAX:
                _POOLS.pop(next(iter(_POOLS))).close()
            pooled = pool.calls.pop(0) if pool.calls else None
        if pooled is None:
            pool.fill_later()
            return None
        ready = pooled._wait_ready(0)
        call = pooled.take(data, deadline)
        with CALLS_LOCK:
            if call is None:
                POOL_CALLS["lost"] += 1
            else:
                POOL_CALLS["taken"] += 1
                POOL_CALLS["ready"] += ready
        if call is not None:
            return call, pooled.uid
        if time.monotonic() >= deadline:
            return None
    return None


def refill(limits: Limits, isolation: str) -> None:
    """After a pooled call: bring its pool back to its size (the new sandboxes start in the
    background, in the fork server's children)."""
    with _POOL_LOCK:
        pool = _POOLS.get((limits, isolation))
    if pool is not None:
        pool.fill_later()


def pool_ready(limits: Limits, timeout: float = 0.0) -> int:
    """How many pooled sandboxes for ``limits`` are ready (waiting for their code), after waiting up
    to ``timeout`` seconds for each (tests and benchmarks: a warm pool)."""
    deadline = time.monotonic() + timeout
    while True:  # a refill may still be on its way (fill_later)
        with _POOL_LOCK:
            pool = _POOLS.get((limits, "namespaces"))  # the only isolation a pool serves
            calls = list(pool.calls) if pool else []
            if not pool or len(calls) >= pool.size or not pool.starting or time.monotonic() >= deadline:
                break
        time.sleep(0.01)
    return sum(c._wait_ready(deadline - time.monotonic()) for c in calls)


def warm(limits: Limits, isolation: str) -> None:
    """Start the pool of ``limits`` now (else the first call with them does)."""
    if isolation != "namespaces" or pool_size() == 0:
        return
    with _POOL_LOCK:
        pool = _POOLS.get((limits, isolation)) or _Pool(limits, isolation, pool_size())
        _POOLS[(limits, isolation)] = pool
    pool.fill()


def pooled_now() -> int:
    """Pooled sandboxes started or being started now, over every pool: children of the fork server that
    belong to no call yet (a check of the server's children counts them beside its spare child)."""
    with _POOL_LOCK:
        return sum(len(pool.calls) + pool.starting for pool in _POOLS.values())


def pool_uids() -> set[int]:
    """The jail uids of the pooled sandboxes now waiting for their code (as root; each has its own).
    Their interpreters look like any call's (``python -S -B -u main.py``) but belong to no call yet:
    a check for processes a call left behind skips them, as it skips the verifier's helper."""
    with _POOL_LOCK:
        return {c.uid for pool in _POOLS.values() for c in pool.calls if c.uid is not None}


@atexit.register  # after forkserver's handler: run before it, so the pools close before the server
def _close_pools() -> None:
    """Give up every pooled call (at exit; in a forked child, its copies of their descriptors)."""
    while _POOLS:
        _POOLS.popitem()[1].close()


def _forget_pools_in_child() -> None:
    """After ``os.fork`` in this process: the parent's pools are not the child's (only this process's
    copies of their descriptors are closed)."""
    global _POOL_LOCK
    _close_pools()
    _POOL_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools_in_child)


def _send(fd: int, data: bytes) -> None:
    """One message to a pooled program's stdin: 8 bytes of length, then ``data``."""
    os.write(fd, len(data).to_bytes(8, "big") + data)
