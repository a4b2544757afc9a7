"""Fault injection for the resume tests, outside the package: ``WHALE_CRASH_AT=POINT@UNIT`` SIGKILLs a
``whale train`` subprocess at one point of one unit, as a power cut would.

Python imports ``sitecustomize`` at start-up from the first folder of ``sys.path`` that has one; the
tests put this folder first on ``PYTHONPATH`` (``tests/crash.py``; every run of ``tests/warm.py``, so
that killed and straight runs can be forked from one warm zygote). It reads ``WHALE_CRASH_AT`` when the
process imports ``whale_train.trainer``, not at start-up: a run forked from a zygote gets its
environment after the zygote's start-up and imports WHALE's modules itself. Without the variable
nothing of this reaches the trainer. The points:

    unit_start@U    before unit U runs (an RSFT step or a harness iteration)
    unit_done@U     after unit U ran, before the trainer records it
    before_state@U  after unit U's checkpoint is saved, before state.json points at it
"""

from __future__ import annotations

import os
import signal
import sys


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _install(point: str, unit: int) -> None:
    import json

    from whale_train import trainer

    if point in ("unit_start", "unit_done"):
        for name in ("_weight_unit", "_harness_unit"):
            original = getattr(trainer.Run, name)

            def wrapped(self, *args, _original=original, **kwargs):
                if point == "unit_start" and self.units == unit:
                    _kill()
                result = _original(self, *args, **kwargs)
                if point == "unit_done" and self.units == unit:
                    _kill()
                return result

            setattr(trainer.Run, name, wrapped)
    elif point == "before_state":
        from whale_train.trainer import state as records  # the module that writes state.json

        write = records.atomic_write_text

        def atomic_write_text(path, text):
            if path.name == "state.json" and json.loads(text)["units"] == unit:
                _kill()
            return write(path, text)

        records.atomic_write_text = atomic_write_text
    else:
        raise SystemExit(f"WHALE_CRASH_AT: unknown point {point!r} (unit_start, unit_done, before_state)")


class _WhenTrainerLoads:
    """A meta-path finder that wraps the loader of ``whale_train.trainer``: once the package has run,
    it installs the fault that ``WHALE_CRASH_AT`` names (if any) and steps aside."""

    def find_spec(self, name, path=None, target=None):
        if name != "whale_train.trainer":
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_install(module):
            exec_module(module)
            sys.meta_path.remove(self)
            at = os.environ.get("WHALE_CRASH_AT", "")
            if at:
                point, _, unit = at.partition("@")
                _install(point, int(unit))

        spec.loader.exec_module = exec_and_install
        return spec


sys.meta_path.insert(0, _WhenTrainerLoads())
