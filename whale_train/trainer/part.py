"""What every part of :class:`whale_train.trainer.Run` reads of the run: ``Run`` is put together from
``RunLanes``, ``RunUnits``, ``RunEvaluation`` and ``RunRecords`` (one concern a module), and sets these
attributes when it opens the run directory."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from harnesses.loader import HarnessRef
from whale_train.schedule import RunState
from whale_train.trainer.config import TrainConfig


class RunPart:
    """The attributes a part of ``Run`` shares with the others (each part declares those only it needs)."""

    config: TrainConfig
    dir: Path  # the run directory
    llm: Any  # the rollout backend
    log: Callable[[str], None]  # where the run's progress lines go
    harness: HarnessRef  # the current (incumbent) harness
    state: RunState  # where the schedule stands: phase, units, rollouts
