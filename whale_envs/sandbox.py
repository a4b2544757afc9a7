"""Run untrusted Python code (written by a model) in a separate, limited, isolated process.

One call, one fresh process::

    from whale_envs.sandbox import Limits, run_python
    result = run_python("print(2**100)", Limits(wall_s=5))
    result.stdout, result.limit, result.observation()

Guarantees (``isolation="namespaces"``, Linux; what :func:`isolation_available` checks):

* **Separate process, nothing shared**: a fresh interpreter started with a clean environment; the
  caller's memory (the task, the answer) is never copied into it. Each call starts from scratch.
* **Time**: a wall-clock limit enforced by the caller (SIGKILL), and an RLIMIT_CPU limit.
* **Memory**: RLIMIT_AS (address space) per process; the process count is capped, so the total is
  bounded by ``memory_mb * max_processes`` (8 GiB with the defaults; cgroups, which could cap the
  total directly, are not assumed to be available).
* **Processes**: RLIMIT_NPROC. When the caller is root (where RLIMIT_NPROC does not apply) the code
  runs as a fresh unprivileged uid of its own, so the cap holds and all capabilities are gone.
  Everything runs in a new PID namespace: when the program exits or is killed, the kernel kills every
  process it left behind (a background or daemonized process cannot outlive the call).
* **No network**: a new network namespace with no interfaces (only a down loopback).
* **Syscalls**: a seccomp allow-list (``SYSCALLS`` in :mod:`whale_envs._children`: each call, and the
  ``fcntl``/``ioctl``/``prctl``/``socket`` values, with its reason) installed just before the code's
  interpreter starts; the rest fails with EPERM. The namespaces separate names, not inodes: every call
  sees the same read-only interpreter files, and watching or locking them (inotify, dnotify, fanotify,
  leases, locks) let the samples of a task talk; those calls are not on the list.
* **Episodes of the harness worker alone**: the probe of the worker's configuration
  (``site_packages=False``) also checks that each episode the worker forks can enter user, mount,
  network, IPC, UTS and PID namespaces of its own (``_children.isolate_episode``); the worker is told
  the run's isolation (``WHALE_SANDBOX_ISOLATION``) and refuses an episode it cannot isolate unless the
  run is unisolated by the opt-in.
* **Files**: a new mount namespace whose root holds only read-only views of the interpreter (and,
  with ``site_packages``, the installed packages, minus this project's own packages). No ``/etc``,
  no home, no project, no task files. The working directory ``/sandbox`` (also ``/tmp``) is a private
  tmpfs of ``file_mb`` that disappears with the call.
* **Output**: stdout and stderr are captured up to ``output_bytes``; a program that writes more is
  stopped and the result says so.
* A crash, a timeout or any limit hit is a :class:`SandboxResult`, never an exception.

Fallback (``isolation="none"``: not Linux, or namespaces refused, e.g. in a container without
CAP_SYS_ADMIN and with user namespaces off): the code still runs in its own session with the same
rlimits, a clean environment, a private temporary working directory and (as root) an unprivileged
uid when the interpreter is readable by one, and the whole process group is killed at the end. It
does **not** get network or file-system isolation, and a process that calls ``setsid`` can escape the
group kill unless it runs under the sandbox uid (then a sweep of ``/proc`` by uid kills it).
``isolation="auto"`` (the default) uses namespaces when available and warns once when it falls back;
``isolation="namespaces"`` refuses to run code without them.

How a call starts (namespaces): the jail is built by a *boot interpreter* running
``_sandbox_boot.py`` (namespaces, mounts, PID 1, limits, uid), which then ``exec``s a fresh interpreter
on the code. Starting that boot interpreter and importing what it needs was about half the cost of a
call, so ``run_python`` starts it once per process as a **fork server** and, for each call, a child of
it forked in advance takes the call and does exactly what a freshly started boot interpreter does. The
guarantees above hold per call unchanged: the server never reads a call's configuration and never runs
code (the code still starts in a freshly ``exec``'d interpreter, with only stdin, stdout and stderr
open), and each call gets its own namespaces, tmpfs, fresh uid and limits. The server holds nothing of
the caller (it is started with a clean environment like the boot interpreter) and exits when the
caller does; a forked child of the caller starts its own. When the server cannot take a call (it
died), a new one is started, and failing that the call starts its own boot interpreter;
``run_python(..., fork_server=False)`` always does (the old path, for comparison). ``spawn_python``
and ``isolation="none"`` start their own boot interpreter.

Warm pool: for the limits of a call it has seen, ``run_python`` keeps :func:`pool_size` sandboxes
(``WHALE_SANDBOX_POOL``, default 2, 4 on more than 4 CPUs; 0 turns it off) started in advance through
the fork server: jail, limits, uid and seccomp as for any call, the interpreter started and
:func:`pool_preload` imported, each waiting for its code on stdin. A call takes the oldest, sends it
the code and waits for nothing else; it runs that one program as ``main.py`` and exits (single-use);
the pool is refilled when the call is done, in a thread of its own. A pooled sandbox is started from
the limits alone: it knows nothing of the call it will serve until the code comes, and nothing of any
other. What the code sees (environment, files, descriptors, limits, command line, tracebacks) is what
a cold start shows; ``tests/test_sandbox_fork_server.py`` compares them.

The pieces a later user needs separately are public: :class:`Limits`, :func:`isolation_available`,
:func:`kill_tree`, and :func:`spawn_python`, which starts a long-running sandboxed program that talks
over pipes (the harness worker).
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import math
import os
import secrets
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path

_BOOT_SETUP_FAILED = 120
#: Packages of this project: hidden from the sandbox even when the installed packages are visible.
_OWN_PACKAGES = ("whale_envs", "whale_train", "harnesses")


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


# ------------------------------------------------------------------------------------ isolation

#: The explicit opt-in to run untrusted code without namespaces (the CLI's ``--allow-unisolated`` sets it).
OPT_IN_ENV = "WHALE_ALLOW_UNISOLATED"
OPT_IN_FLAG = "--allow-unisolated"


class IsolationUnavailable(RuntimeError):
    """Untrusted code was about to run, namespaces are unavailable and the opt-in is not given."""


def unisolated_opt_in() -> bool:
    """Whether the user explicitly allowed untrusted code to run without namespaces."""
    return os.environ.get(OPT_IN_ENV, "").strip().lower() in ("1", "true", "yes")


def allow_unisolated(allowed: bool = True) -> None:
    """Set the opt-in for this process and its children (what ``--allow-unisolated`` does)."""
    if allowed:
        os.environ[OPT_IN_ENV] = "1"
    else:
        os.environ.pop(OPT_IN_ENV, None)


_PROBES: dict[tuple, str | None] = {}
_PROBE_LOCK = threading.Lock()


def isolation_problem(site_packages: bool = True) -> str | None:
    """Why untrusted code cannot run in namespaces here, or None when it can.

    The probe runs the configuration that will actually be used (this interpreter, the same bind
    mounts with or without the installed packages, the same uid switch) and checks that the code ran
    jailed and not as uid 0. Cached per configuration.
    """
    if not sys.platform.startswith("linux"):
        return f"Linux namespaces are not available on {sys.platform}"
    key = (_boot_python(), site_packages, tuple(_site_dirs()) if site_packages else (), os.geteuid())
    with _PROBE_LOCK:  # one probe per configuration, however many threads ask at once
        if key not in _PROBES:
            problem, lasting = _probe(site_packages)
            if not lasting:  # a probe stopped by its time limit (a busy machine) is asked again later
                return problem
            _PROBES[key] = problem
        return _PROBES[key]


#: The harness worker's part of the probe: an episode's namespaces (``_children.isolate_episode``) can be
#: made, and the isolated process is PID 1 of its own namespace, sees no other process and no network.
_EPISODE_PROBE = """
try:
    pid = isolate_episode()
except OSError as exc:
    sys.stdout.write(' episodes: ' + str(exc)[:300])
    sys.exit(0)
if pid == 0:
    alone = [p for p in os.listdir('/proc') if p.isdigit()] == ['1'] and os.getpid() == 1
    with open('/proc/net/dev') as fh:  # its network namespace's links (if_nameindex needs netlink: refused)
        links = [line.split(':')[0].strip() for line in fh.readlines()[2:]]
    os._exit(0 if alone and links == ['lo'] else 3)
_, status = os.waitpid(pid, 0)
sys.stdout.write(' episodes-alone' if status == 0 else ' episodes: the isolated process was not alone')
"""


def _probe(site_packages: bool) -> tuple[str | None, bool]:
    """(why isolation is unavailable or None, whether the answer lasts). Without the installed packages
    (the harness worker's configuration) the probe also checks that each episode can run alone."""
    code = "import os, sys; sys.stdout.write('ok %d %d' % (os.getuid(), os.path.exists('/etc/passwd')))"
    if not site_packages:
        children = (resources.files("whale_envs") / "_children.py").read_text(encoding="utf-8")
        code = f"{children}\n{code}\n{_EPISODE_PROBE}"
    limits = Limits(wall_s=30, cpu_s=10, isolation="namespaces", site_packages=site_packages)
    result = _run(code, limits, isolation="namespaces", probing=True)
    if result.limit in ("wall", "cpu"):
        return f"the sandboxed probe hit its {result.limit} limit (a busy machine?)", False
    if result.limit == "setup":
        return f"the sandbox cannot be built here: {result.error}", True
    if result.exit_code != 0 or not result.stdout.startswith("ok "):
        detail = (result.stderr or result.stdout).strip().splitlines()[-1:] or [f"exit {result.exit_code}"]
        return f"the sandboxed probe did not run: {detail[0][:300]}", True
    _, uid, etc, *episodes = result.stdout.split(maxsplit=3)
    if os.geteuid() == 0 and uid == "0":
        return "the sandboxed probe ran as uid 0", True
    if etc != "0":
        return "the sandboxed probe could see the host's /etc", True
    if not site_packages and episodes != ["episodes-alone"]:
        why = episodes[0].removeprefix("episodes: ") if episodes else "no answer"
        return f"the harness worker's episodes cannot run alone (namespaces of their own): {why}", True
    return None, True


def isolation_available(site_packages: bool = True) -> bool:
    """Whether untrusted code runs in namespaces here (see :func:`isolation_problem` for why not)."""
    return isolation_problem(site_packages) is None


def refusal(problem: str, what: str = "untrusted code") -> str:
    """The one-line error for a refused unisolated run: the cause and the opt-in."""
    return (
        f"refusing to run {what} without isolation: {problem}. To run it anyway with resource limits "
        f"only (no network or file-system isolation), pass {OPT_IN_FLAG} or set {OPT_IN_ENV}=1"
    )


def require_isolation(what: str = "untrusted code", *, site_packages: bool = True) -> str:
    """The isolation ``what`` will run under: ``"namespaces"``, or ``"none (opt-in)"`` when the user
    opted in; raises :class:`IsolationUnavailable` (cause + opt-in) otherwise."""
    problem = isolation_problem(site_packages)
    if problem is None:
        return "namespaces"
    if unisolated_opt_in():
        return UNISOLATED_LABEL
    raise IsolationUnavailable(refusal(problem, what))


#: How a run under the opt-in is labelled in results.json, the ledger and the report.
UNISOLATED_LABEL = f"none (unisolated by opt-in {OPT_IN_ENV})"


def isolation_label(site_packages: bool | None = None) -> str:
    """``"namespaces"``, :data:`UNISOLATED_LABEL` (a run under the opt-in), or ``"unavailable"``.

    ``site_packages=None``: both configurations (the tool's and the harness worker's) must be isolated.
    """
    configs = (True, False) if site_packages is None else (site_packages,)
    if all(isolation_problem(c) is None for c in configs):
        return "namespaces"
    return UNISOLATED_LABEL if unisolated_opt_in() else "unavailable"


_WARNED = False


def _choose_isolation(limits: Limits) -> tuple[str, str | None]:
    """(isolation to use, None) or ("unavailable", why): fails closed unless the user opted in."""
    global _WARNED
    if limits.isolation == "none":
        if unisolated_opt_in():
            return "none", None
        return "unavailable", refusal("isolation='none' was asked for")
    problem = isolation_problem(limits.site_packages)
    if problem is None:
        return "namespaces", None
    if limits.isolation == "namespaces" or not unisolated_opt_in():
        return "unavailable", refusal(problem)
    if not _WARNED:
        _WARNED = True
        warnings.warn(
            f"whale_envs.sandbox: {problem}; untrusted code runs with resource limits only (no network or "
            f"file-system isolation) because {OPT_IN_ENV} is set",
            RuntimeWarning,
            stacklevel=3,
        )
    return "none", None


# ------------------------------------------------------------------------------------ the run


def run_python(code: str, limits: Limits | None = None, *, fork_server: bool = True) -> SandboxResult:
    """Run ``code`` as ``main.py`` in a fresh sandboxed interpreter and return what happened.

    Never raises for anything the code does (see :class:`SandboxResult`); raises ``ValueError`` only
    for invalid ``limits``. ``fork_server=False`` starts the jail from a fresh boot interpreter instead
    of the fork server (same jail and guarantees, slower; see "How a call starts" in the module docs).
    """
    limits = limits or Limits()
    limits.validate()
    isolation, why = _choose_isolation(limits)
    if isolation == "unavailable":
        return SandboxResult(
            exit_code=None, limit="setup", isolation="none", error=why, details=asdict(limits)
        )
    return _run(code, limits, isolation=isolation, fork_server=fork_server)


def _root_problem(isolation: str) -> str | None:
    """Why the code would run as uid 0 (it never may), or None. Only the unisolated path can: there the
    sandbox uid must be able to read the interpreter where it lies on the host."""
    if isolation == "none" and os.geteuid() == 0 and not _world_readable(_boot_python()):
        return (
            f"the interpreter {_boot_python()} is not readable by an unprivileged uid, and untrusted code "
            "never runs as uid 0"
        )
    return None


def _prepare(code: str, limits: Limits, isolation: str) -> tuple[Path, dict]:
    """A private temporary folder holding the code, and the boot configuration for it."""
    tmp = Path(tempfile.mkdtemp(prefix="whale-sandbox-"))
    uid = _sandbox_uid() if os.geteuid() == 0 else None
    code_path = tmp / "code.py"
    code_path.write_text(code, encoding="utf-8", errors="replace")
    cfg = _boot_config(tmp, code_path, limits, isolation, uid)
    if cfg["uid"] is not None:
        tmp.chmod(0o755)
    return tmp, cfg


#: The environment of the boot interpreter (the code gets its own, ``cfg["env"]``).
_BOOT_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


def _popen(tmp: Path, cfg: dict, **streams) -> subprocess.Popen:
    return subprocess.Popen(
        [_boot_python(), "-I", "-S", "-c", _boot_source(), json.dumps(cfg)],
        start_new_session=True,
        close_fds=True,
        cwd=str(tmp),
        env=_BOOT_ENV,
        **streams,
    )


def _run(
    code: str,
    limits: Limits,
    *,
    isolation: str = "namespaces",
    probing: bool = False,
    fork_server: bool = True,
) -> SandboxResult:
    details = asdict(limits)
    problem = _root_problem(isolation)
    if problem:
        return SandboxResult(limit="setup", error=problem + " (the code was not run)", details=details)
    tmp = proc = pooled = None
    try:
        start = time.monotonic()
        if isolation == "namespaces" and fork_server and len(code) <= _SERVED_CODE_MAX:
            # no temporary folder: the code travels with the request, and the jail's root is mounted
            # on the server's empty directory (in the call's own mount namespace)
            pooled = None if probing else _pooled_call(code, limits, isolation, start + limits.wall_s)
            if pooled is not None:  # a sandbox started before the call, waiting for its code
                proc, uid = pooled
            else:
                uid = _sandbox_uid() if os.geteuid() == 0 else None
                cfg = _boot_config(None, None, limits, isolation, uid, code=code, root="")  # the server's
                proc = _served_call(cfg, start + limits.wall_s)
        with _CALLS_LOCK:
            CALLS["served" if proc is not None else "fresh"] += 1
        if proc is None:
            tmp, cfg = _prepare(code, limits, isolation)
            uid = cfg["uid"]
            try:
                proc = _popen(
                    tmp, cfg, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
                )
            except OSError as exc:
                return SandboxResult(
                    limit="setup", error=f"cannot start the interpreter: {exc}", details=details
                )
        out, err, limit, truncated = _collect(proc, limits, start)
        kill_tree(proc.pid, uid)
        proc.wait()
        wall = time.monotonic() - start
        code_ = proc.returncode
        exit_code = code_ if code_ >= 0 else 128 - code_
        stdout = out.decode("utf-8", errors="replace")
        stderr = err.decode("utf-8", errors="replace")
        error = None
        if exit_code == _BOOT_SETUP_FAILED and stderr.startswith("SANDBOX-SETUP:"):
            limit, error = "setup", stderr.removeprefix("SANDBOX-SETUP:").strip()
            stderr = ""
        elif limit is None:
            limit = _limit_from_exit(exit_code, stderr)
        if not probing and limit == "setup" and isolation == "namespaces":
            error = f"{error} (the code was not run)"
        return SandboxResult(
            stdout=stdout,
            stderr=stderr,
            exit_code=exit_code,
            limit=limit,
            output_truncated=truncated,
            wall_s=wall,
            isolation=isolation,
            error=error,
            details=details,
        )
    finally:
        if isinstance(proc, _ServedCall):
            proc.close()
        if pooled is not None:
            _refill(limits, isolation)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


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
        shutil.rmtree(self._tmp, ignore_errors=True)


def spawn_python(code: str, limits: Limits | None = None) -> SandboxProcess:
    """Start ``code`` in the sandbox as a long-running program with stdin/stdout pipes.

    Same jail and limits as :func:`run_python` (choose ``wall_s`` / ``cpu_s`` for the program's whole
    life; count threads in ``max_processes``). Raises ``RuntimeError`` when ``isolation="namespaces"``
    is required but unavailable, or when the interpreter cannot start.
    """
    limits = limits or Limits()
    limits.validate()
    isolation, why = _choose_isolation(limits)
    if isolation == "unavailable":
        raise IsolationUnavailable(why)
    problem = _root_problem(isolation)
    if problem:
        raise IsolationUnavailable(problem)
    tmp, cfg = _prepare(code, limits, isolation)
    return _start_program(tmp, cfg, isolation)


def spawn_jailed(
    code: str,
    limits: Limits | None = None,
    *,
    mounts: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
) -> SandboxProcess:
    """:func:`spawn_python` with host folders shown read-only in the jail: ``mounts`` maps a path of the
    jail (``/archive``) to a host folder (bound read-only at its own path, the jail path a link to it);
    ``env`` adds environment variables. The working directory ``/sandbox`` lives as long as the
    program (its private scratch). Namespaces only, even under the opt-in (a view of chosen folders
    needs a mount namespace): raises :class:`IsolationUnavailable` without them."""
    limits = limits or Limits()
    limits.validate()
    problem = isolation_problem(limits.site_packages)
    if problem:
        raise IsolationUnavailable(refusal(problem, "a jailed program"))
    tmp, cfg = _prepare(code, limits, "namespaces")
    for link, host in (mounts or {}).items():
        if not link.startswith("/") or link.rstrip("/") in ("", "/sandbox", "/tmp", "/proc", "/dev"):
            raise ValueError(f"spawn_jailed: {link!r} is not a free absolute path of the jail")
        cfg["ro_binds"].append(os.path.realpath(host))
        cfg["symlinks"].append((link.rstrip("/"), os.path.realpath(host)))
    cfg["hide"] = [h for h in _hidden_dirs() if any(h.startswith(b + "/") for b in cfg["ro_binds"])]
    cfg["env"].update(env or {})
    # A shell for the meta-harness proposer (not a sample of a task): the namespaces only; the syscall
    # allow-list is sized for Python tool code and harness episodes, not for every command-line tool.
    cfg["seccomp"] = None
    return _start_program(tmp, cfg, "namespaces")


def _start_program(tmp: Path, cfg: dict, isolation: str) -> SandboxProcess:
    """Start the prepared jail as a long-running program with text pipes (spawn_python, spawn_jailed)."""
    stderr_file = open(tmp / "stderr.log", "wb")  # noqa: SIM115 - closed by SandboxProcess.close
    try:
        proc = _popen(
            tmp,
            cfg,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr_file,
            text=True,
            encoding="utf-8",
            bufsize=1,
        )
    except OSError as exc:
        stderr_file.close()
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"cannot start the interpreter: {exc}") from None
    return SandboxProcess(proc, tmp, cfg["uid"], isolation, stderr_file)


# ------------------------------------------------------------------------------------ fork server


class _ForkServer:
    """The boot interpreter, started once and kept: ``_sandbox_boot.py --fork-server``.

    It has the boot script's imports done and a child forked in advance; each call is one message on
    the control socket (the configuration, plus stdout, stderr and a report socket as file
    descriptors), taken by that child, which builds the call's jail exactly as a fresh boot
    interpreter would. The server never reads a request and never runs code. It exits when this
    process closes the control socket (at exit, or when a forked child of this process drops it).
    """

    def __init__(self) -> None:
        #: An empty directory each call mounts its root on, in its own mount namespace (the server
        #: removes it when it exits).
        self.root = tempfile.mkdtemp(prefix="whale-sandbox-root-")
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [
                    _boot_python(),
                    "-I",
                    "-S",
                    "-c",
                    _boot_source(),
                    "--fork-server",
                    str(theirs.fileno()),
                    self.root,
                ],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                cwd="/",
                env=_BOOT_ENV,
            )
        except BaseException:
            mine.close()
            os.rmdir(self.root)
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
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        try:
            os.rmdir(self.root)  # the server removes it itself, unless it was killed
        except OSError:
            pass


class _ServedCall:
    """One call run by the fork server, with the part of :class:`subprocess.Popen` that ``_run`` uses.

    ``pid`` is the call's supervisor (the boot interpreter's role), leader of its own process group; it
    stays alive until :meth:`close`, so ``kill_tree(pid)`` never reaches a reused pid.
    """

    def __init__(self, report: socket.socket, pid: int, out_fd: int, err_fd: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.stdout = open(out_fd, "rb", buffering=0)  # noqa: SIM115 - closed by _collect
        self.stderr = open(err_fd, "rb", buffering=0)  # noqa: SIM115 - closed by _collect
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
_SERVED_CODE_MAX = 16_384  # characters: at most ~100 KB as JSON, well inside a socket buffer
#: Calls of this process by how they started: through the fork server or a fresh boot interpreter.
CALLS = {"served": 0, "fresh": 0}
_CALLS_LOCK = threading.Lock()


def _forget_server_in_child() -> None:
    """After ``os.fork`` in this process: the child starts its own server when it needs one."""
    global _SERVER, _SERVER_LOCK, _POOL_LOCK
    _close_pools()  # the parent's: only this process's copies of their descriptors are closed
    if _SERVER is not None:
        _SERVER.sock.close()
    _SERVER = None
    _SERVER_LOCK = threading.Lock()
    _POOL_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_server_in_child)


def _fork_server(stale: _ForkServer | None = None) -> _ForkServer:
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
    """At exit: stop the server and wait for it, so that its CPU time (the calls') is counted in ours."""
    _close_pools()
    if _SERVER is not None:
        _SERVER.close()


def _served_call(cfg: dict, deadline: float) -> _ServedCall | None:
    """Hand one call to the fork server; None when it cannot take it (the caller then starts a fresh
    boot interpreter: the same jail). A server that died before a child took the call is replaced
    once; the code had not run (a supervisor reports its pid before anything else)."""
    stale = None
    for _ in range(2):
        try:
            server = _fork_server(stale)
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


# ------------------------------------------------------------------------------------ warm pool

#: The program of a pooled call (its ``main.py`` until the code comes): import the preloaded modules,
#: say it is ready (one byte on stdout, which the caller takes out), read the code from stdin (8 bytes
#: of length, then the code), put /dev/null on stdin, write the code over ``main.py``, set the CPU
#: limit of the code (what it has used so far + the call's ``cpu_s``) and run the code as ``__main__``
#: in the module's namespace, emptied first; a traceback shows the code's frames alone, as
#: ``python main.py`` would. The caller's end of stdin is its only input.
_POOL_PROGRAM = """\
def _whale_pool(cpu_s, preload):
    import os
    import resource
    import sys

    for name in preload:
        try:
            __import__(name)
        except Exception:
            pass
    os.write(1, b"\\0")

    def read(n):
        data = b""
        while len(data) < n:
            chunk = os.read(0, n - len(data))
            if not chunk:  # the caller gave the call up before sending it
                os._exit(0)
            data += chunk
        return data

    code = read(int.from_bytes(read(8), "big"))
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    main = sys.modules["__main__"].__dict__
    with open(main["__file__"], "wb") as fh:
        fh.write(code)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = cpu_s + round(usage.ru_utime + usage.ru_stime)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    keep = {k: v for k, v in main.items() if k != "_whale_pool"}  # what `python main.py` starts with
    main.clear()
    main.update(keep)
    try:
        exec(compile(code, main["__file__"], "exec", dont_inherit=True), main)
    except SystemExit:
        raise
    except BaseException as exc:  # as the interpreter would print it, without this function's frame
        exc = exc.with_traceback(exc.__traceback__.tb_next)
        sys.excepthook(type(exc), exc, exc.__traceback__)
        sys.exit(1)


_whale_pool(%(cpu_s)d, %(preload)r)
"""
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
    separated; ``-`` for none). Default: cheap standard-library ones. Heavy libraries (``sympy``: about
    a second of CPU each) pay only where most calls import them and cores are spare: every pooled
    sandbox imports them, whether its code uses them or not."""
    raw = os.environ.get(PRELOAD_ENV)
    if raw is None:
        return _DEFAULT_PRELOAD
    return tuple(n.strip() for n in raw.split(",") if n.strip() and n.strip() != "-")


POOL_ENV = "WHALE_SANDBOX_POOL"
PRELOAD_ENV = "WHALE_SANDBOX_PRELOAD"
_DEFAULT_PRELOAD = ("math", "fractions", "itertools", "functools", "collections")


class _Pooled:
    """One pooled call: sent to the fork server before any call asked for it, its program waiting for
    the code. The caller holds its stdin (``code_w``), stdout, stderr and report socket."""

    def __init__(self, server: _ForkServer, template: dict) -> None:
        self.uid = _sandbox_uid() if os.geteuid() == 0 else None  # its own, as for any call
        cfg = {**template, "uid": self.uid, "root": server.root}
        code_r, self.code_w = os.pipe()
        self.out_r, out_w = os.pipe()
        self.err_r, err_w = os.pipe()
        self.report, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.ready = False
        self._pid: int | None = None
        try:
            server.submit(cfg, [out_w, err_w, theirs.fileno(), code_r])
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
                os.write(self.code_w, len(code).to_bytes(8, "big") + code)  # within the pipe's buffer
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
        program = _POOL_PROGRAM % {"cpu_s": max(1, math.ceil(limits.cpu_s)), "preload": pool_preload()}
        #: The configuration of its calls, but for each one's uid and the server's root.
        self.template = _boot_config(None, None, limits, isolation, None, code=program, root="")
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
                new = _Pooled(_fork_server(), self.template)
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


def _pooled_call(
    code: str, limits: Limits, isolation: str, deadline: float
) -> tuple[_ServedCall, int | None] | None:
    """Run ``code`` in a pooled sandbox: (the call, its uid), or None (no pool, or none of its calls
    took it: the caller starts one as before). The oldest pooled call is taken even if it is still
    starting (it is ahead of a cold start). The pool is refilled when the call is done
    (:func:`_refill`), not while its code runs, and by a thread of its own: on a busy machine a
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
        with _CALLS_LOCK:
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


def _refill(limits: Limits, isolation: str) -> None:
    """After a pooled call: bring its pool back to its size (the new sandboxes start in the
    background, in the fork server's children)."""
    with _POOL_LOCK:
        pool = _POOLS.get((limits, isolation))
    if pool is not None:
        pool.fill_later()


def pool_ready(limits: Limits, timeout: float = 0.0) -> int:
    """How many pooled sandboxes for ``limits`` are ready (waiting for their code), after waiting up
    to ``timeout`` seconds for each (tests and benchmarks: a warm pool)."""
    isolation, _ = _choose_isolation(limits)
    deadline = time.monotonic() + timeout
    while True:  # a refill may still be on its way (fill_later)
        with _POOL_LOCK:
            pool = _POOLS.get((limits, isolation))
            calls = list(pool.calls) if pool else []
            if not pool or len(calls) >= pool.size or not pool.starting or time.monotonic() >= deadline:
                break
        time.sleep(0.01)
    return sum(c._wait_ready(deadline - time.monotonic()) for c in calls)


def warm_pool(limits: Limits) -> None:
    """Start the pool of ``limits`` now (else the first call with them does)."""
    isolation, why = _choose_isolation(limits)
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


def _close_pools() -> None:
    """Give up every pooled call (at exit; in a forked child, its copies of their descriptors)."""
    while _POOLS:
        _POOLS.popitem()[1].close()


def _collect(proc: subprocess.Popen, limits: Limits, start: float) -> tuple[bytes, bytes, str | None, bool]:
    """Read stdout/stderr until the process exits, the wall clock runs out or the output cap is hit."""
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
        sel.close()
        proc.stdout.close()
        proc.stderr.close()
    return bytes(bufs[out_fd]), bytes(bufs[err_fd]), limit, truncated


def _limit_from_exit(exit_code: int, stderr: str) -> str | None:
    """Which limit a finished run hit, judged from its exit status and the last line of stderr."""
    if exit_code == 128 + signal.SIGXCPU:
        return "cpu"
    if exit_code == 128 + signal.SIGXFSZ:
        return "file"
    last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    if last.startswith("MemoryError") or "Cannot allocate memory" in last:
        return "memory"
    return None


# ------------------------------------------------------------------------------------ clean-up


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
        for pid in _pids_of_uid(uid):
            found = True
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if not found:
            return


def _pids_of_uid(uid: int) -> list[int]:
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def _sandbox_uid() -> int:
    """A fresh unprivileged uid for one run (root only): its RLIMIT_NPROC count starts at zero."""
    return 1_900_000_000 + secrets.randbelow(100_000_000)


# ------------------------------------------------------------------------------------ configuration


#: The boot program's one import of this package, replaced by that module's source when it is sent.
_BOOT_IMPORT = (
    "from whale_envs._children import install_syscall_filter, reap_exited"
    "  # spliced in by sandbox._boot_source()\n"
)


@lru_cache(maxsize=1)
def _boot_source() -> str:
    """``_sandbox_boot.py`` as one self-contained program: ``_children.py`` spliced in for its import."""
    package = resources.files("whale_envs")
    boot = (package / "_sandbox_boot.py").read_text(encoding="utf-8")
    if _BOOT_IMPORT not in boot:
        raise RuntimeError("whale_envs/_sandbox_boot.py no longer imports _children as sandbox.py expects")
    return boot.replace(_BOOT_IMPORT, (package / "_children.py").read_text(encoding="utf-8"), 1)


def _boot_python() -> str:
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def _world_readable(path: str) -> bool:
    p = Path(path)
    for part in [p, *p.parents]:
        try:
            mode = part.stat().st_mode
        except OSError:
            return False
        if part != p and not mode & 0o001:
            return False
    return bool(p.stat().st_mode & 0o005 == 0o005)


def _site_dirs() -> list[str]:
    dirs = []
    for key in ("purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path and os.path.isdir(path) and path not in dirs:
            dirs.append(os.path.realpath(path))
    return dirs


def _hidden_dirs() -> list[str]:
    """This project's package dirs (they hold bundled answers), wherever they are installed.

    Found with ``find_spec``, which locates a top-level package without importing it.
    """
    hidden = []
    for name in _OWN_PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        for path in (spec.submodule_search_locations or []) if spec else []:
            path = os.path.realpath(path)
            if os.path.isdir(path) and path not in hidden:
                hidden.append(path)
    return hidden


def _boot_config(
    tmp: Path | None,
    code_path: Path | None,
    limits: Limits,
    isolation: str,
    uid: int | None,
    *,
    code: str | None = None,
    root: str | None = None,
) -> dict:
    """The boot script's configuration. ``tmp``/``code_path``: the call's temporary folder and code
    file; or (a fork-server call, namespaces only) ``code`` itself and an empty directory ``root`` to
    mount the jail's root on (in the call's own mount namespace: one directory serves every call)."""
    python = _boot_python()
    prefix = os.path.realpath(sys.base_prefix)
    site = _site_dirs() if limits.site_packages else []
    ro_binds = ["/usr", prefix, os.path.dirname(python), *site]  # the interpreter may lie outside prefix
    for name in ("/etc/ld.so.cache",):
        ro_binds.append(name)
    symlinks = []
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            symlinks.append((top, os.readlink(top)))
        elif os.path.isdir(top):
            ro_binds.append(top)
    ro_binds = sorted(set(ro_binds), key=len)  # parents before children
    ro_binds = [p for p in ro_binds if not any(p != q and p.startswith(q + "/") for q in ro_binds)]
    hidden = [h for h in _hidden_dirs() if any(h.startswith(b + "/") for b in ro_binds)]
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/sandbox" if isolation == "namespaces" else str(tmp / "work"),
        "TMPDIR": "/sandbox" if isolation == "namespaces" else str(tmp / "work"),
        "LANG": "C.UTF-8",
        "PYTHONPATH": os.pathsep.join(site),
        "PYTHONNOUSERSITE": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONIOENCODING": "utf-8",
        "PYTHONHASHSEED": "0",
        "WHALE_SANDBOX_ISOLATION": isolation,  # the harness worker refuses unisolated episodes unless "none"
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    if root is None:
        (tmp / "root").mkdir()
        root = str(tmp / "root")
    return {
        "isolation": isolation,
        "root": root,
        "workdir": "/sandbox" if isolation == "namespaces" else str(tmp / "work"),
        "code_path": None if code_path is None else str(code_path),
        "code": code,
        "python": python,
        "ro_binds": ro_binds,
        "symlinks": symlinks,
        "hide": hidden,
        "uid": uid,
        "work_bytes": limits.file_mb * 1024 * 1024,
        "writable": bool(limits.writable_files),
        # the syscall allow-list (whale_envs._children.SYSCALLS): the harness worker's template (which
        # builds each episode's namespaces, then stacks the episodes' own list) or tool code
        "seccomp": "T" if limits.site_packages else "W",
        "env": env,
        "limits": {
            "cpu_s": max(1, math.ceil(limits.cpu_s)),
            "memory_bytes": int(limits.memory_mb) * 1024 * 1024,
            "file_bytes": int(limits.file_mb) * 1024 * 1024,
            "open_files": int(limits.open_files),
            "processes": int(limits.max_processes),
        },
    }
