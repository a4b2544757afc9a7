"""The sandbox's public calls: run code once (:func:`run_python`), start a long-running program
(:func:`spawn_python`, :func:`spawn_jailed`), warm a pool (:func:`warm_pool`). Each asks the isolation
policy first (:mod:`whale_envs.sandbox.policy`), then starts the run (:mod:`whale_envs.sandbox.execute`).
"""

from __future__ import annotations

import os
from dataclasses import asdict

from whale_envs.sandbox import config, execute, policy, pool
from whale_envs.sandbox.policy import IsolationUnavailable
from whale_envs.sandbox.process import Limits, SandboxProcess, SandboxResult


def run_python(code: str, limits: Limits | None = None, *, fork_server: bool = True) -> SandboxResult:
    """Run ``code`` as ``main.py`` in a fresh sandboxed interpreter and return what happened.

    Never raises for anything the code does (see :class:`SandboxResult`); raises ``ValueError`` only
    for invalid ``limits``. ``fork_server=False`` starts the jail from a fresh boot interpreter instead
    of the fork server (same jail and guarantees, slower; see "How a call starts" in :mod:`whale_envs.sandbox`).
    """
    limits = limits or Limits()
    limits.validate()
    isolation, why = policy.choose_isolation(limits)
    if isolation == "unavailable":
        return SandboxResult(
            exit_code=None, limit="setup", isolation="none", error=why, details=asdict(limits)
        )
    return execute.run(code, limits, isolation=isolation, fork_server=fork_server)


def spawn_python(code: str, limits: Limits | None = None) -> SandboxProcess:
    """Start ``code`` in the sandbox as a long-running program with stdin/stdout pipes.

    Same jail and limits as :func:`run_python` (choose ``wall_s`` / ``cpu_s`` for the program's whole
    life; count threads in ``max_processes``). Raises ``RuntimeError`` when ``isolation="namespaces"``
    is required but unavailable, or when the interpreter cannot start.
    """
    limits = limits or Limits()
    limits.validate()
    isolation, why = policy.choose_isolation(limits)
    if isolation == "unavailable":
        raise IsolationUnavailable(why)
    problem = config.root_problem(isolation)
    if problem:
        raise IsolationUnavailable(problem)
    tmp, cfg = config.prepare(code, limits, isolation)
    return execute.start_program(tmp, cfg, isolation)


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
    problem = policy.isolation_problem(limits.site_packages)
    if problem:
        raise IsolationUnavailable(policy.refusal(problem, "a jailed program"))
    tmp, cfg = config.prepare(code, limits, "namespaces")
    for link, host in (mounts or {}).items():
        if not link.startswith("/") or link.rstrip("/") in ("", "/sandbox", "/tmp", "/proc", "/dev"):
            raise ValueError(f"spawn_jailed: {link!r} is not a free absolute path of the jail")
        cfg["ro_binds"].append(os.path.realpath(host))
        cfg["symlinks"].append((link.rstrip("/"), os.path.realpath(host)))
    cfg["hide"] = [h for h in config.hidden_dirs() if any(h.startswith(b + "/") for b in cfg["ro_binds"])]
    cfg["env"].update(env or {})
    # A shell for the meta-harness proposer (not a sample of a task): the namespaces only; the syscall
    # allow-list is sized for Python tool code and harness episodes, not for every command-line tool.
    cfg["seccomp"] = None
    return execute.start_program(tmp, cfg, "namespaces")


def warm_pool(limits: Limits) -> None:
    """Start the pool of ``limits`` now (else the first call with them does)."""
    isolation, _ = policy.choose_isolation(limits)
    pool.warm(limits, isolation)
