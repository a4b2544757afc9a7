"""One sandboxed run, started the fastest way that gives the same jail: a pooled sandbox, a call of the
fork server, or a fresh boot interpreter (the only way for long code, ``isolation="none"`` and the
long-running programs of :func:`start_program`). The isolation is decided by the caller
(:mod:`whale_envs.sandbox.policy`); nothing here asks the policy.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import asdict
from pathlib import Path

from whale_envs.sandbox import bundle, config, scratch
from whale_envs.sandbox.forkserver import (
    BOOT,
    CALLS,
    CALLS_LOCK,
    SERVED_CODE_MAX,
    _ServedCall,
    served_call,
)
from whale_envs.sandbox.pool import pooled_call, refill
from whale_envs.sandbox.process import (
    BOOT_SETUP_FAILED,
    Limits,
    SandboxProcess,
    SandboxResult,
    collect,
    kill_tree,
    limit_from_exit,
)


def _popen(tmp: Path, cfg: dict, **streams) -> subprocess.Popen:
    """A fresh boot interpreter on ``cfg`` (the call's own folder ``tmp`` as its working directory)."""
    return subprocess.Popen(
        bundle.command(config.boot_python(), BOOT, json.dumps(cfg)),
        start_new_session=True,
        close_fds=True,
        cwd=str(tmp),
        env=config.BOOT_ENV,
        **streams,
    )


def run(
    code: str,
    limits: Limits,
    *,
    isolation: str = "namespaces",
    probing: bool = False,
    fork_server: bool = True,
) -> SandboxResult:
    details = asdict(limits)
    problem = config.root_problem(isolation)
    if problem:
        return SandboxResult(limit="setup", error=problem + " (the code was not run)", details=details)
    tmp = proc = pooled = None
    try:
        start = time.monotonic()
        if isolation == "namespaces" and fork_server and len(code) <= SERVED_CODE_MAX:
            # no temporary folder: the code travels with the request, and the jail's root is mounted
            # on the server's empty directory (in the call's own mount namespace)
            pooled = None if probing else pooled_call(code, limits, isolation, start + limits.wall_s)
            if pooled is not None:  # a sandbox started before the call, waiting for its code
                proc, uid = pooled
            else:
                uid = config.sandbox_uid() if os.geteuid() == 0 else None
                cfg = config.boot_config(
                    None, None, limits, isolation, uid, code=code, root=""
                )  # the server's
                proc = served_call(cfg, start + limits.wall_s)
        with CALLS_LOCK:
            CALLS["served" if proc is not None else "fresh"] += 1
        if proc is None:
            tmp, cfg = config.prepare(code, limits, isolation)
            uid = cfg["uid"]
            try:
                proc = _popen(
                    tmp, cfg, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
                )
            except OSError as exc:
                return SandboxResult(
                    limit="setup", error=f"cannot start the interpreter: {exc}", details=details
                )
        try:
            out, err, limit, truncated = collect(proc, limits, start)
        finally:
            kill_tree(proc.pid, uid)  # before its pipes close (collect's docstring says why)
            proc.stdout.close()
            proc.stderr.close()
        proc.wait()
        wall = time.monotonic() - start
        code_ = proc.returncode
        exit_code = code_ if code_ >= 0 else 128 - code_
        stdout = out.decode("utf-8", errors="replace")
        stderr = err.decode("utf-8", errors="replace")
        error = None
        if exit_code == BOOT_SETUP_FAILED and stderr.startswith("SANDBOX-SETUP:"):
            limit, error = "setup", stderr.removeprefix("SANDBOX-SETUP:").strip()
            stderr = ""
        elif limit is None:
            limit = limit_from_exit(exit_code, stderr)
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
            refill(limits, isolation)
        if tmp is not None:
            scratch.remove(tmp)


def start_program(tmp: Path, cfg: dict, isolation: str) -> SandboxProcess:
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
        scratch.remove(tmp)
        raise RuntimeError(f"cannot start the interpreter: {exc}") from None
    return SandboxProcess(proc, tmp, cfg["uid"], isolation, stderr_file)
