"""What the tests read of ``/proc``: which processes carry a marker, which are another's live children,
whether one is still running."""

from __future__ import annotations

import os
from collections.abc import Iterator


def proc_files(name: str) -> Iterator[tuple[int, bytes]]:
    """``(pid, contents of /proc/<pid>/<name>)`` of every process that can be read (others vanish or
    hide while we look: skipped)."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/{name}", "rb") as fh:
                    yield int(entry.name), fh.read()
            except OSError:
                continue


def carrying(marker: str) -> list[int]:
    """Pids of the processes whose command line carries ``marker``."""
    return [pid for pid, argv in proc_files("cmdline") if marker.encode() in argv]


def running_children(parent: int) -> list[int]:
    """Pids of ``parent``'s children that have not exited (zombies left out)."""
    kids = []
    for pid, stat in proc_files("stat"):
        state, ppid = stat.rsplit(b")", 1)[1].split()[:2]
        if int(ppid) == parent and state != b"Z":
            kids.append(pid)
    return kids


def running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False
