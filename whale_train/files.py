"""The one atomic file write of the package: a reader sees the old file or the new one, never half.

The text goes to a temporary file beside the target (its name holds ``TMP_MARKER``, so a folder's
owner can sweep what a killed writer left) and is renamed into place.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

#: In the name of every temporary file an atomic write leaves behind when it is killed.
TMP_MARKER = ".tmp-"


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` beside ``path`` and rename it into place (readers see the old file or the new one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}{TMP_MARKER}{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def atomic_write_json(path: str | Path, data: Any) -> Path:
    """``data`` as indented JSON (non-JSON values by ``str``), written atomically."""
    return atomic_write_text(path, json.dumps(data, indent=1, ensure_ascii=False, default=str) + "\n")
