"""What a call's jail is made of on this machine: the boot program's configuration (``cfg``: mounts,
uid, environment, limits), the facts of the host it is built from, and the call's private folder."""

from __future__ import annotations

import importlib.util
import math
import os
import secrets
import sys
import sysconfig
from pathlib import Path

from whale_envs.sandbox import scratch
from whale_envs.sandbox.process import Limits

#: Packages of this project: hidden from the sandbox even when the installed packages are visible.
OWN_PACKAGES = ("whale_envs", "whale_train", "harnesses")
#: The environment of the boot interpreter (the code gets its own, ``cfg["env"]``).
BOOT_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


def boot_python() -> str:
    """The interpreter every sandboxed program runs on: this one's base interpreter (not a venv's link)."""
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


def root_problem(isolation: str) -> str | None:
    """Why the code would run as uid 0 (it never may), or None. Only the unisolated path can: there the
    sandbox uid must be able to read the interpreter where it lies on the host."""
    if isolation == "none" and os.geteuid() == 0 and not _world_readable(boot_python()):
        return (
            f"the interpreter {boot_python()} is not readable by an unprivileged uid, and untrusted code "
            "never runs as uid 0"
        )
    return None


def site_dirs() -> list[str]:
    """The installed packages' folders (shown read-only with ``Limits.site_packages``)."""
    dirs = []
    for key in ("purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path and os.path.isdir(path) and path not in dirs:
            dirs.append(os.path.realpath(path))
    return dirs


def hidden_dirs() -> list[str]:
    """This project's package dirs (they hold bundled answers), wherever they are installed.

    Found with ``find_spec``, which locates a top-level package without importing it.
    """
    hidden = []
    for name in OWN_PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        for path in (spec.submodule_search_locations or []) if spec else []:
            path = os.path.realpath(path)
            if os.path.isdir(path) and path not in hidden:
                hidden.append(path)
    return hidden


def sandbox_uid() -> int:
    """A fresh unprivileged uid for one run (root only): its RLIMIT_NPROC count starts at zero."""
    return 1_900_000_000 + secrets.randbelow(100_000_000)


def prepare(code: str, limits: Limits, isolation: str) -> tuple[Path, dict]:
    """A private temporary folder holding the code, and the boot configuration for it."""
    tmp = scratch.private_dir()
    uid = sandbox_uid() if os.geteuid() == 0 else None
    code_path = tmp / "code.py"
    code_path.write_text(code, encoding="utf-8", errors="replace")
    cfg = boot_config(tmp, code_path, limits, isolation, uid)
    if cfg["uid"] is not None:
        tmp.chmod(0o755)
    return tmp, cfg


def boot_config(
    tmp: Path | None,
    code_path: Path | None,
    limits: Limits,
    isolation: str,
    uid: int | None,
    *,
    code: str | None = None,
    root: str | None = None,
) -> dict:
    """The boot program's configuration. ``tmp``/``code_path``: the call's temporary folder and code
    file; or (a fork-server call, namespaces only) ``code`` itself and an empty directory ``root`` to
    mount the jail's root on (in the call's own mount namespace: one directory serves every call)."""
    python = boot_python()
    prefix = os.path.realpath(sys.base_prefix)
    site = site_dirs() if limits.site_packages else []
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
    hidden = [h for h in hidden_dirs() if any(h.startswith(b + "/") for b in ro_binds)]
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
