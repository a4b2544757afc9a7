"""Real public data bundled with the package: small samples a user can load by kind alone.

Each folder holds unchanged copies of the files and a SOURCE.md with the source, commit and license.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def bundled_path(*parts: str) -> Path:
    """Path of a bundled data file or folder, e.g. ``bundled_path("lichess_puzzles", "puzzles.csv")``."""
    path = Path(str(resources.files("whale_envs") / "data" / "/".join(parts)))
    if not path.exists():
        raise FileNotFoundError(f"no bundled data at {'/'.join(parts)!r}")
    return path
