"""A call's private folder in the temp dir, and the sweep of those a killed process left behind.

A sandboxed call (or a harness worker) keeps its code, its log and its root's mount point in a folder
``whale-sandbox-*`` that the trusted process removes when the call is done. A trusted process killed
with SIGKILL (or by the OOM killer) cannot: its folders stay. So each folder is locked by the process
that made it (``flock``, shared, on a descriptor of the folder that only this process holds), for as
long as it lives, and the first folder a process makes sweeps the temp dir for folders that nobody
holds: those of processes that died. The lock is the kernel's, so it holds across PID namespaces
(containers sharing ``/tmp``), where a pid could not be checked. A folder is swept only when it is also
older than :data:`SWEEP_AGE_S` (never one that another process has just made and not locked yet) and
belongs to this user.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import tempfile
import threading
import time
from pathlib import Path

PREFIX = "whale-sandbox-"
#: A folder younger than this is never swept (made, not yet locked, by a process starting a call).
SWEEP_AGE_S = 60.0

_HELD: dict[str, int] = {}  # path -> the descriptor that holds its lock
_LOCK = threading.Lock()
_swept = False


def private_dir() -> Path:
    """A new private folder, locked by this process until :func:`remove`. The first one a process
    makes sweeps the folders that killed processes left (:func:`sweep`)."""
    global _swept
    if not _swept:
        _swept = True
        sweep()
    path = tempfile.mkdtemp(prefix=PREFIX)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)  # close-on-exec: no sandbox inherits it
    fcntl.flock(fd, fcntl.LOCK_SH)
    with _LOCK:
        _HELD[path] = fd
    return Path(path)


def remove(path: Path | str) -> None:
    """Remove a folder made by :func:`private_dir`, and let go of its lock."""
    shutil.rmtree(path, ignore_errors=True)
    with _LOCK:
        fd = _HELD.pop(str(path), None)
    if fd is not None:
        os.close(fd)


def sweep(base: str | None = None) -> list[str]:
    """Remove the ``whale-sandbox-*`` folders in ``base`` (the temp dir) that no living process holds,
    older than :data:`SWEEP_AGE_S` and this user's; the paths removed. Never raises: a folder it cannot
    look at or lock is left."""
    base = base or tempfile.gettempdir()
    removed = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    now = time.time()
    for entry in entries:
        if not entry.name.startswith(PREFIX) or entry.path in _HELD:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or now - st.st_mtime < SWEEP_AGE_S:
                continue
            fd = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held by a living process: not ours to take
        except OSError:
            os.close(fd)
            continue
        try:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
        finally:
            os.close(fd)
    return removed
