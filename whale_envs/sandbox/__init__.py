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

How a call starts (namespaces): the jail is built by a *boot interpreter* running the boot program
(:mod:`.programs.boot`: namespaces, mounts, PID 1, limits, uid), which then ``exec``s a fresh interpreter
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
a cold start shows; ``tests/sandbox/test_sandbox_fork_server.py`` compares them.

The pieces a later user needs separately are public: :class:`Limits`, :func:`isolation_available`,
:func:`kill_tree`, and :func:`spawn_python`, which starts a long-running sandboxed program that talks
over pipes (the harness worker).

The modules, one job each: :mod:`.policy` (may untrusted code run here, and how: the probe, the
opt-in, the labels), :mod:`.run` (the public calls), :mod:`.execute` (one run: pooled, served or
fresh), :mod:`.process` (limits, results, output, killing), :mod:`.config` (the jail's configuration
on this host), :mod:`.forkserver`, :mod:`.pool`, and :mod:`.bundle`, the one way the programs run in a
child interpreter (:mod:`.programs`: the boot program, the probe, a pooled sandbox's program) are
started.
"""

from whale_envs.sandbox.config import boot_python as _boot_python  # noqa: F401 - the benchmarks'
from whale_envs.sandbox.forkserver import CALLS
from whale_envs.sandbox.policy import (
    OPT_IN_ENV,
    OPT_IN_FLAG,
    UNISOLATED_LABEL,
    IsolationUnavailable,
    allow_unisolated,
    isolation_available,
    isolation_label,
    isolation_problem,
    refusal,
    require_isolation,
    unisolated_opt_in,
)
from whale_envs.sandbox.pool import (
    POOL_CALLS,
    POOL_ENV,
    PRELOAD_ENV,
    pool_preload,
    pool_ready,
    pool_size,
    pool_uids,
    pooled_now,
)
from whale_envs.sandbox.process import (
    Limits,
    SandboxProcess,
    SandboxResult,
    cut_middle,
    kill_tree,
)
from whale_envs.sandbox.process import pids_of_uid as _pids_of_uid  # noqa: F401 - a test's
from whale_envs.sandbox.run import run_python, spawn_jailed, spawn_python, warm_pool

__all__ = [
    "CALLS",
    "OPT_IN_ENV",
    "OPT_IN_FLAG",
    "POOL_CALLS",
    "POOL_ENV",
    "PRELOAD_ENV",
    "UNISOLATED_LABEL",
    "IsolationUnavailable",
    "Limits",
    "SandboxProcess",
    "SandboxResult",
    "allow_unisolated",
    "cut_middle",
    "isolation_available",
    "isolation_label",
    "isolation_problem",
    "kill_tree",
    "pool_preload",
    "pool_ready",
    "pool_size",
    "pool_uids",
    "pooled_now",
    "refusal",
    "require_isolation",
    "run_python",
    "spawn_jailed",
    "spawn_python",
    "unisolated_opt_in",
    "warm_pool",
]
