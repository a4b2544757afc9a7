"""The one atomic file write of the package: a reader sees the old file or the new one, never half.

The text goes to a temporary file beside the target (its name holds ``TMP_MARKER``, so a folder's
owner can sweep what a killed writer left) and is renamed into place.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from pathlib import Path
from typing import Any

#: In the name of every temporary file an atomic write leaves behind when it is killed.
TMP_MARKER = ".tmp-"

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def replace_lone_surrogates(text: str) -> str:
    """``text`` with every lone surrogate (a code point UTF-8 cannot encode: a JSON ``"\\ud800"`` decodes
    to one) replaced by U+FFFD, so it can always be written as UTF-8."""
    return _LONE_SURROGATE.sub("\ufffd", text) if _LONE_SURROGATE.search(text) else text


def without_lone_surrogates(value: Any) -> Any:
    """Decoded JSON (``value``) with every lone surrogate in its strings replaced by U+FFFD: what a reader
    hands on (to a console, to a writer) after ``json.loads`` of text that holds a ``"\\ud800"`` escape."""
    if isinstance(value, str):
        return replace_lone_surrogates(value)
    if isinstance(value, list):
        return [without_lone_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {without_lone_surrogates(k): without_lone_surrogates(v) for k, v in value.items()}
    return value


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` beside ``path`` and rename it into place (readers see the old file or the new one).
    Text from episodes or a model may hold lone surrogates: they are written as U+FFFD, never a crash."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}{TMP_MARKER}{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(replace_lone_surrogates(text))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def atomic_write_json(path: str | Path, data: Any) -> Path:
    """``data`` as indented JSON (non-JSON values by ``str``), written atomically."""
    return atomic_write_text(path, json.dumps(data, indent=1, ensure_ascii=False, default=str) + "\n")


# ------------------------------------------------------------------------------ one writer per folder

_held: dict[Path, int] = {}  # lock file -> its descriptor, for the locks this process holds


def hold_folder(folder: str | Path, name: str, writer: str) -> Path:
    """Make this process the one writer of ``folder``: an exclusive ``flock`` on ``folder/name``, held
    until :func:`release_folder` or the process ends, so a killed writer leaves nothing stale. Another
    process holding it: ``FileExistsError`` naming ``writer`` and its pid. Taken again by the process that
    holds it (a resume in the same process), it is kept."""
    path = (Path(folder) / name).resolve()
    if path in _held:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by the processes it starts
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise FileExistsError(f"another {writer} (pid {pid}) is writing to {Path(folder)}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    _held[path] = fd
    return path


def release_folder(folder: str | Path, name: str) -> None:
    """Give up the lock :func:`hold_folder` took (the file stays: removing it would race a new holder)."""
    fd = _held.pop((Path(folder) / name).resolve(), None)
    if fd is not None:
        os.close(fd)
