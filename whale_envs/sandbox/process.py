"""One sandboxed process seen from the caller: its limits (:class:`Limits`), what it did
(:class:`SandboxResult`), reading its output within the limits (:func:`collect`), a long-running one
(:class:`SandboxProcess`), and killing whatever it left (:func:`kill_tree`)."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from whale_envs.sandbox import scratch

#: The boot program's exit status when the jail itself could not be built (``SANDBOX-SETUP:`` on stderr).
BOOT_SETUP_FAILED = 120


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed run (all per call).

    Attributes:
        wall_s: wall-clock seconds before the whole process tree is killed.
        cpu_s: CPU seconds per process (RLIMIT_CPU).
        memory_mb: address space per process (RLIMIT_AS), in MiB.
        max_processes: processes and threads the code may have at once (RLIMIT_NPROC).
        output_bytes: stdout + stderr kept; writing more stops the program.
        file_mb: size of the private working directory (and of any one file written).
        open_files: file descriptors per process (RLIMIT_NOFILE).
        isolation: "auto", "namespaces" (refuse to run without them) or "none" (rlimits only).
        site_packages: let the code import the installed packages (numpy, sympy, ...) read-only.
        writable_files: the working directory (and /tmp) is writable; False makes the whole file
            system read-only (namespaces only), for programs that need no files (the harness worker).
    """

    wall_s: float = 10.0
    cpu_s: int = 10
    memory_mb: int = 512
    max_processes: int = 16
    output_bytes: int = 65_536
    file_mb: int = 16
    open_files: int = 64
    isolation: str = "auto"
    site_packages: bool = True
    writable_files: bool = True

    def validate(self) -> None:
        for name in (
            "wall_s",
            "cpu_s",
            "memory_mb",
            "max_processes",
            "output_bytes",
            "file_mb",
            "open_files",
        ):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"Limits.{name} must be a positive number, got {value!r}")
        if self.isolation not in ("auto", "namespaces", "none"):
            raise ValueError(
                f"Limits.isolation must be 'auto', 'namespaces' or 'none', got {self.isolation!r}"
            )


@dataclass
class SandboxResult:
    """What one run did. ``limit`` names the limit that stopped it, if any.

    ``limit`` is one of None, "wall" (wall-clock), "cpu", "memory" (a MemoryError or an allocation
    failure), "output" (too much output), "file" (a file over ``file_mb``) or "setup" (the sandbox
    itself could not start; ``error`` says why, and the code did not run).
    """

    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    limit: str | None = None
    output_truncated: bool = False
    wall_s: float = 0.0
    isolation: str = "none"
    error: str | None = None
    details: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """The program ran to completion and exited with status 0."""
        return self.exit_code == 0 and self.limit is None

    def observation(self, max_chars: int = 4000) -> str:
        """The result as text for an agent: output (cut with a note), then a status line if not ok."""
        parts = []
        out, err = self.stdout, self.stderr
        body = out if not err else (f"{out}\n[stderr]\n{err}" if out else f"[stderr]\n{err}")
        if len(body) > max_chars:
            body = cut_middle(body, max_chars)
        elif self.output_truncated:
            body += "\n[... output cut: more output was produced than the sandbox keeps]"
        parts.append(body if body.strip() else "(no output)")
        status = _STATUS.get(self.limit)
        if status:
            parts.append(status.format(r=self))
        elif self.exit_code not in (0, None):
            parts.append(f"[exit status {self.exit_code}]")
        return "\n".join(parts)


def cut_middle(text: str, max_chars: int) -> str:
    """Keep the head and the tail of ``text`` (a traceback's last line matters most), note the cut."""
    if len(text) <= max_chars:
        return text
    head = max_chars * 2 // 3
    tail = max_chars - head
    return f"{text[:head]}\n[... output cut: {len(text) - max_chars} characters left out ...]\n{text[-tail:]}"


_STATUS = {
    "wall": "[stopped: wall-clock limit of {r.details[wall_s]:g} s reached]",
    "cpu": "[stopped: CPU time limit of {r.details[cpu_s]} s reached]",
    "memory": "[stopped: memory limit of {r.details[memory_mb]} MiB reached]",
    "output": "[stopped: output limit of {r.details[output_bytes]} bytes reached]",
    "file": "[stopped: file size limit of {r.details[file_mb]} MiB reached]",
    "setup": "[the sandbox could not start: {r.error}]",
}


class SandboxProcess:
    """A long-running sandboxed program that talks over pipes (the harness worker uses one).

    ``stdin`` / ``stdout`` are text pipes (UTF-8, line-buffered); stderr goes to a private file
    (``stderr_tail()``). The wall-clock limit is the caller's business: ``close()`` kills the whole
    process tree and removes the program's files; it is safe to call twice.
    """

    def __init__(self, proc: subprocess.Popen, tmp: Path, uid: int | None, isolation: str, stderr_file):
        self.proc = proc
        self.isolation = isolation
        self._tmp = tmp
        self._uid = uid
        self._stderr = stderr_file

    @property
    def stdin(self):
        return self.proc.stdin

    @property
    def stdout(self):
        return self.proc.stdout

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def stderr_tail(self, n: int = 2000) -> str:
        try:
            with open(self._tmp / "stderr.log", "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - n))
                return fh.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        kill_tree(self.proc.pid, self._uid)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass
        self._stderr.close()
        scratch.remove(self._tmp)


def collect(proc: subprocess.Popen, limits: Limits, start: float) -> tuple[bytes, bytes, str | None, bool]:
    """Read stdout/stderr until the process exits, the wall clock runs out or the output cap is hit. The
    pipes are left open for the caller to close once the process is dead: closed first, a writer stopped
    at the output cap would die of the broken pipe (exit 1) or of the kill (137), whichever came first."""
    assert proc.stdout is not None and proc.stderr is not None
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    bufs = {out_fd: bytearray(), err_fd: bytearray()}
    sel = selectors.DefaultSelector()
    for pipe in (proc.stdout, proc.stderr):
        os.set_blocking(pipe.fileno(), False)
        sel.register(pipe.fileno(), selectors.EVENT_READ)
    limit = None
    truncated = False
    deadline = start + limits.wall_s
    try:
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                limit = "wall"
                break
            if proc.poll() is not None:
                remaining = min(remaining, 0.05)  # exited: drain what is there, do not wait for orphans
            events = sel.select(timeout=remaining)
            if not events and proc.poll() is not None:
                break
            for key, _ in events:
                try:
                    chunk = os.read(key.fd, 65_536)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                buf = bufs[key.fd]
                room = limits.output_bytes - sum(len(b) for b in bufs.values())
                buf += chunk[: max(room, 0)]
                if len(chunk) > room:
                    truncated = True
                    limit = "output"
            if limit == "output":
                break
    finally:
        sel.close()  # the pipes stay open: the caller kills what runs first (see ``execute``)
    return bytes(bufs[out_fd]), bytes(bufs[err_fd]), limit, truncated


def limit_from_exit(exit_code: int, stderr: str) -> str | None:
    """Which limit a finished run hit, judged from its exit status and the last line of stderr."""
    if exit_code == 128 + signal.SIGXCPU:
        return "cpu"
    if exit_code == 128 + signal.SIGXFSZ:
        return "file"
    last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    if last.startswith("MemoryError") or "Cannot allocate memory" in last:
        return "memory"
    return None


def kill_tree(pgid: int, uid: int | None = None) -> None:
    """SIGKILL the process group ``pgid`` and, when ``uid`` is given, every process owned by ``uid``.

    ``uid`` is the sandbox's own uid (never a real user's): the sweep catches processes that left the
    group with ``setsid``. Processes already gone are ignored.
    """
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if uid is None:
        return
    for _ in range(3):  # a process forking during the sweep is caught by the next pass
        found = False
        for pid in pids_of_uid(uid):
            found = True
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if not found:
            return


def pids_of_uid(uid: int) -> list[int]:
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids
