"""The environment of a ``whale train`` subprocess that is SIGKILLed at one point of one unit (the
resume tests): ``tests/faults/sitecustomize.py`` does it, so the trainer carries no fault injection."""

from __future__ import annotations

import os
from pathlib import Path

FAULTS = Path(__file__).resolve().parent / "faults"


def crash_env(at: str) -> dict[str, str]:
    """``{"WHALE_CRASH_AT": at, "PYTHONPATH": tests/faults first}``, to merge into a subprocess's env;
    ``at`` is ``POINT@UNIT`` (unit_start, unit_done or before_state)."""
    path = os.pathsep.join(p for p in (str(FAULTS), os.environ.get("PYTHONPATH", "")) if p)
    return {"WHALE_CRASH_AT": at, "PYTHONPATH": path}
