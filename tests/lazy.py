"""A module imported at its first use in a test, not when pytest collects the file that names it: some
packages take seconds of CPU to import, and every pytest-xdist worker collects every test file."""

from __future__ import annotations

import importlib
from types import ModuleType


class LazyModule:
    """``LazyModule("verifiers.v1")`` stands for that module; its attributes import it. A missing
    package fails the test that uses it (it is never skipped)."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        if attr.startswith("_") or attr == "pytestmark":  # pytest's own probes while it collects
            raise AttributeError(attr)
        module: ModuleType = importlib.import_module(self._name)
        return getattr(module, attr)
