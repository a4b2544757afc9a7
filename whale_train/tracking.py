"""Experiment tracking for ``whale train``: the config's ``report_to`` names where the run's numbers go.

    report_to: tensorboard            # the default: event files in <run>/tb/ (`tensorboard --logdir runs`)
    report_to: [tensorboard, wandb]   # several at once
    report_to: none                   # nothing but the ledger

=============  ======================================================================================
tracker        where, and how to look
=============  ======================================================================================
tensorboard    ``<run>/tb/``: ``tensorboard --logdir runs``
wandb          offline, ``<run>/wandb/offline-run-*``: ``wandb sync <run>/wandb/offline-run-*`` uploads it
               later (``pip install 'whale-harness[tracking]'``)
trackio        local (no Space): ``<run>/trackio/`` unless ``TRACKIO_DIR`` is set;
               ``TRACKIO_DIR=<run>/trackio trackio show`` opens the dashboard
=============  ======================================================================================

Every tracker gets the same numbers at the same step (the ledger's ``rollouts_total``): ``test/mean_at_k``
and ``test/se`` after every test evaluation, and each unit's numeric signals under ``weight/...``
(RSFT: train reward, accepted, loss) or ``harness/...``. Nothing here talks to a server.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import Any

TRACKERS = ("tensorboard", "wandb", "trackio")


def parse_report_to(value: Any) -> list[str]:
    """``"none"`` / ``"tensorboard"`` / ``"wandb,trackio"`` / a list -> the tracker names (ValueError if unknown)."""
    if value is None or value is False:
        return []
    items = [value] if isinstance(value, str) else list(value)
    names = [n.strip() for item in items for n in str(item).split(",") if n.strip()]
    names = [n for n in names if n != "none"]
    bad = [n for n in names if n not in TRACKERS]
    if bad:
        raise ValueError(f"report_to: unknown tracker(s) {bad}; known: none, {', '.join(TRACKERS)}")
    return list(dict.fromkeys(names))


class Tracker:
    """The trackers of one run. ``log(metrics, step)`` sends numbers to all of them; ``close()`` at the end."""

    def __init__(
        self, report_to: Any, run_dir: str | Path, *, name: str, config: dict[str, Any] | None = None
    ):
        self.run_dir = Path(run_dir)
        self.names = parse_report_to(report_to)
        self._open: dict[str, Any] = {}
        for tracker in self.names:
            self._open[tracker] = getattr(self, f"_open_{tracker}")(name, config or {})

    def _open_tensorboard(self, name: str, config: dict[str, Any]) -> Any:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ImportError(
                "report_to: tensorboard needs the tensorboard package (pip install tensorboard), "
                "or set report_to: none"
            ) from None
        return SummaryWriter(str(self.run_dir / "tb"))

    def _open_wandb(self, name: str, config: dict[str, Any]) -> Any:
        try:
            import wandb
        except ImportError:
            raise ImportError(
                "report_to: wandb needs `pip install 'whale-harness[tracking]'` (or pip install wandb)"
            ) from None
        # one id per run directory, so --resume continues the same wandb run
        run_id = hashlib.sha256(str(self.run_dir.resolve()).encode()).hexdigest()[:12]
        return wandb.init(
            project="whale",
            name=name,
            id=run_id,
            dir=str(self.run_dir),
            mode="offline",
            config=config,
            resume="allow",
            reinit="create_new",
            settings=wandb.Settings(silent=True, console="off"),
        )

    def _open_trackio(self, name: str, config: dict[str, Any]) -> Any:
        if "trackio" not in sys.modules:  # where trackio stores its database is read when it is imported
            os.environ.setdefault("TRACKIO_DIR", str(self.run_dir / "trackio"))
        try:
            import trackio
        except ImportError:
            raise ImportError(
                "report_to: trackio needs `pip install 'whale-harness[tracking]'` (or pip install trackio)"
            ) from None
        return trackio.init(project="whale", name=name, config=config, resume="allow", embed=False)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        numbers = {
            k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)
        }
        if not numbers:
            return
        for tracker, handle in self._open.items():
            if tracker == "tensorboard":
                for key, value in numbers.items():
                    handle.add_scalar(key, value, step)
                handle.flush()
            else:  # wandb and trackio runs share the log(dict, step=) call
                handle.log(numbers, step=step)

    def close(self) -> None:
        for tracker, handle in self._open.items():
            if tracker == "tensorboard":
                handle.close()
            else:
                handle.finish()
        self._open = {}


def event_metrics(event: dict[str, Any]) -> dict[str, Any]:
    """The numbers of a ledger event for the trackers (empty for events without any)."""
    if event["event"] == "eval":
        per_source = {f"test/{name}": mean for name, mean in event.get("by_data_source", {}).items()}
        return {"test/mean_at_k": event["mean"], "test/se": event["se"], **per_source}
    if event["event"] == "unit":
        signals = {f"{event['phase']}/{k}": v for k, v in event.get("signals", {}).items()}
        return {**signals, "rollouts/unit": event.get("rollouts"), "seconds/unit": event.get("seconds")}
    return {}
