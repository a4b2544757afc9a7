"""What a run directory records of a run (a part of :class:`whale_train.trainer.Run`), and how
``--resume`` reads it back: ``ledger.jsonl`` (one line per event, also sent to the experiment trackers),
``state.json`` (where the run stands, written atomically after each unit, pointing at the resume
checkpoint of that unit) and the config a resumed run must match. None of them names the folder they
are in, so a run directory can be moved or copied and resumed there."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import yaml

from whale_train import distributed
from whale_train.files import atomic_write_text
from whale_train.rsft import RSFT
from whale_train.tracking import Tracker, event_metrics
from whale_train.trainer.config import TrainConfig
from whale_train.trainer.part import RunPart

#: The lock file of a run directory: one ``whale train`` writes it at a time.
RUN_LOCK = ".train.lock"


def _comparable(config: TrainConfig) -> Any:
    """What must match for a run to resume: every field, with the defaults of fields added since the run
    started and the evaluation's split as it resolves (``eval.split`` unset is ``test`` of the run's tasks)."""
    data = json.loads(json.dumps(config.to_dict()))
    data["eval"]["split"] = config.eval_sets[0]["split"]
    return data


def record_config(run_dir: Path, config: TrainConfig, resume: bool) -> None:
    """Write ``config.yaml``; on ``--resume``, first refuse a config that differs from the one the run
    recorded (a ValueError in one line)."""
    saved_path = run_dir / "config.yaml"
    if resume and saved_path.exists():
        saved = yaml.safe_load(saved_path.read_text())
        if _comparable(TrainConfig.from_dict(saved)) != _comparable(config):
            raise ValueError(f"{saved_path} differs from the config given: resume with the same config")
    atomic_write_text(saved_path, yaml.safe_dump(config.to_dict(), sort_keys=False))


def _truncate_lines(path: Path, n: int) -> None:
    if not path.exists():
        return
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    if len(lines) != n:
        atomic_write_text(path, "".join(lines[:n]))


class RunRecords(RunPart):
    """The ledger and the state of a run: ``_ledger`` appends an event, ``_save_state`` ends a unit,
    ``_restore`` (on ``--resume``) takes the run back to the last saved state. The rsft operator and the
    search come from the run's ``_rsft`` and ``_search``."""

    trust_state: bool  # --trust-state: a resume may unpickle an older rsft_state.pt
    rsft: RSFT | None
    units: int
    ledger_lines: int
    evaluated: set[str]
    rescored: set[int]
    iterations: int
    started: float  # time.monotonic() when this process started the run
    elapsed_before: float  # wall seconds of the earlier processes of this run
    tracker: Tracker | None
    #: ``((steps_done, stream position), folder)`` of the last resume checkpoint written or restored.
    resume_saved: tuple[tuple[int, int], str] | None = None

    def _ledger(self, event: dict[str, Any]) -> None:
        event = {
            "event": event.pop("event"),
            "unit": self.units,
            "rollouts_total": self.state.rollouts,
            **event,
        }
        with open(self.dir / "ledger.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(event, default=str) + "\n")
        self.ledger_lines += 1
        if self.tracker is None:
            self.tracker = Tracker(
                self.config.report_to, self.dir, name=self.dir.name, config=self.config.to_dict()
            )
        self.tracker.log(event_metrics(event), event["rollouts_total"])

    def _ledger_unit(
        self,
        phase: str,
        phase_index: int,
        rollouts: int,
        seconds: float,
        signals: dict[str, Any],
        **more: Any,
    ) -> None:
        """The ledger line of a unit of ``phase`` that spent ``rollouts`` in ``seconds`` and showed
        ``signals``; ``more`` adds the fields of the lanes (``lane``, ``t_start``, ``t_end``, ``proposal``)."""
        self._ledger(
            {
                "event": "unit",
                "phase": phase,
                "phase_index": phase_index,
                "rollouts": rollouts,
                "model_version": int(getattr(self.llm, "version", 0)),
                "harness": self.harness.name,
                "seconds": round(seconds, 2),
                "signals": signals,
                **more,
            }
        )

    def _save_state(self) -> None:
        """Save the model state of this unit under its own name, then point state.json at it (atomically),
        then drop older ones: a kill at any moment leaves a state.json whose checkpoint is complete.
        A unit after which the RSFT state is the one saved last (no step since: a harness unit, the
        run's end) points at that checkpoint again instead of writing the same weights, optimizer state
        and stream position once more."""
        resume_dir = None
        if self.rsft is not None and self.rsft.steps_done:
            mark = (self.rsft.steps_done, self.rsft.stream.position)
            last = self.resume_saved
            if last is not None and last[0] == mark and (self.dir / "checkpoints" / last[1]).is_dir():
                resume_dir = last[1]
            else:
                resume_dir = f"resume-{self.units}"
                self.rsft.save(self.dir / "checkpoints" / resume_dir)
                self.resume_saved = (mark, resume_dir)
        state = {
            "units": self.units,
            "ledger_lines": self.ledger_lines,
            "schedule": self.state.to_dict(),
            "model_version": int(getattr(self.llm, "version", 0)),
            "rsft_steps": self.rsft.steps_done if self.rsft else 0,
            "harness": self.harness.name,
            "evaluated": sorted(self.evaluated),
            "rescored": sorted(self.rescored),
            "iterations": self.iterations,
            "elapsed": self.elapsed_before + time.monotonic() - self.started,
            "resume_from": resume_dir,
        }
        atomic_write_text(self.dir / "state.json", json.dumps(state, indent=1))
        for old in (self.dir / "checkpoints").glob("resume-*"):
            if old.name != resume_dir:
                shutil.rmtree(old, ignore_errors=True)

    def _restore(self) -> None:
        state = json.loads((self.dir / "state.json").read_text())
        self.units = state["units"]
        self.ledger_lines = state["ledger_lines"]
        self.evaluated = set(state["evaluated"])
        self.rescored = set(state.get("rescored", []))
        self.iterations = int(state.get("iterations", 0))
        self.elapsed_before = float(state.get("elapsed", 0.0))
        for key, value in state["schedule"].items():
            setattr(self.state, key, value)
        _truncate_lines(self.dir / "ledger.jsonl", self.ledger_lines)  # drop events of an unfinished unit
        if state.get("resume_from"):
            checkpoint = self.dir / "checkpoints" / state["resume_from"]
            if self._rsft().restore(checkpoint, trust=self.trust_state):  # recorded in the run
                note = f"{checkpoint / 'rsft_state.pt'} unpickled in full under --trust-state"
                with open(self.dir / "trusted_state.log", "a", encoding="utf-8") as fh:
                    fh.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {note}\n")
                self.log(note)
            if isinstance(self.rsft.trainer, distributed.DistributedUpdater):
                self.rsft.trainer.load(self.dir / "checkpoints" / state["resume_from"])
            if self.rsft.pushes:  # vLLM, or a rollout copy: the engine gets the restored weights
                self.rsft.push()
            self.resume_saved = ((self.rsft.steps_done, self.rsft.stream.position), state["resume_from"])
        self.llm.version = state["model_version"]
        if state["harness"] != self.harness.name:
            self.harness = self._search().incumbent
            if self.rsft is not None:
                self.rsft.harness = self.harness
        self.log(
            f"resumed {self.dir} at unit {self.units}: {self.state.rollouts} rollouts, model version {self.llm.version}"
        )
