"""The run loop (``Run``): ask the schedule for the next phase, run one unit of it, record it, evaluate when
``eval.every`` says so, save the state; until the schedule says stop. ``Run`` is put together from the
parts of a run, one module each: the units of the phases (``units``), the evaluations (``run_eval``), and
what the run directory records and ``--resume`` reads back (``state``), and the loop of a run on two lanes
(``lanes_run``: ``schedule.overlap``, or an injected proposer latency)."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harnesses.loader import load_harness
from whale_envs.sandbox import isolation_label
from whale_train.eval_cache import EvalCache
from whale_train.files import hold_folder, release_folder
from whale_train.rollout import reusing_workers
from whale_train.schedule import RunState, ScheduleDecision, make_schedule
from whale_train.trainer.backend import load_backend
from whale_train.trainer.config import TrainConfig
from whale_train.trainer.interrupt import stop_if_interrupted
from whale_train.trainer.lanes_run import RunLanes, uses_lanes
from whale_train.trainer.run_eval import RunEvaluation
from whale_train.trainer.state import RUN_LOCK, RunRecords, record_config
from whale_train.trainer.test_sets import check_split_secret, list_test_ids
from whale_train.trainer.units import UNIT_KINDS, RunUnits


class Run(RunLanes, RunUnits, RunEvaluation, RunRecords):
    """One training run in a run directory (``whale_train.trainer``'s docstring lists what it holds).

    Args:
        config: the run's config; on ``resume`` it must match the one the directory recorded.
        run_dir: the run directory; one that holds a run needs ``resume``.
        resume: continue the run in ``run_dir`` from its last saved state.
        llm: the rollout backend (default: the one ``config`` names, loaded here).
        log: where the run's progress lines go.
        progress: ``progress(description, total)`` -> a context manager yielding ``advance()`` (evaluations
            show their progress through it); None: no progress shown.
        eval_cache: a folder of evaluations shared with other runs (``whale_train.eval_cache``).
        trust_state: ``--trust-state``: a resume may unpickle an older ``rsft_state.pt`` in full.
        harness: the config's harness already loaded (``whale train``'s pre-flight loaded it); None: loaded here.
    """

    def __init__(
        self,
        config: TrainConfig,
        run_dir: str | Path,
        *,
        resume: bool = False,
        llm: Any = None,
        log: Callable[[str], None] = print,
        progress: Any = None,
        eval_cache: str | Path | None = None,
        trust_state: bool = False,
        harness: Any = None,
    ):
        self.config = config
        self._harness = harness
        self.trust_state = trust_state
        self.dir = Path(run_dir)
        self.eval_cache = EvalCache(eval_cache) if eval_cache else None
        self.log = log
        self.progress = progress
        existing = (self.dir / "state.json").exists()
        if existing and not resume:
            raise FileExistsError(
                f"{self.dir} holds a run already: pass --resume to continue it, or choose another --out"
            )
        # resume without state.json (killed before the first unit finished): start over in place
        # One writer per run directory (two would interleave their units in one ledger), until run() ends.
        fresh = not self.dir.exists()
        hold_folder(self.dir, RUN_LOCK, "whale train")
        try:
            self._open(config, resume, existing, llm)
        except BaseException:
            release_folder(self.dir, RUN_LOCK)
            if fresh:  # a start that failed (the engine, the model) leaves no run folder behind
                shutil.rmtree(self.dir, ignore_errors=True)
            raise

    def _open(self, config: TrainConfig, resume: bool, existing: bool, llm: Any) -> None:
        record_config(self.dir, config, resume)
        check_split_secret(self.dir, resume)
        started = time.monotonic()  # the wall time counts the engine's start-up (vLLM: a minute)
        self.llm = llm if llm is not None else self._load_llm()
        self.startup_seconds = round(time.monotonic() - started, 1)
        self.schedule = make_schedule(config.method, config.schedule)
        self.rsft = None
        self.search = None
        self.harness = self._harness if self._harness is not None else load_harness(config.harness_name)
        self.state = RunState(budget=config.budget_rollouts)
        self.units = 0
        self.ledger_lines = 0
        self.evaluated = set()
        self.rescored = set()
        self.iterations = 0
        self.started = started
        self.elapsed_before = 0.0
        self.tracker = None
        if resume and existing:
            self._restore()

    def _load_llm(self) -> Any:
        return load_backend(self.config)

    # -------------------------------------------------------------- the loop

    def run(self) -> dict[str, Any]:
        try:
            with reusing_workers():  # a unit's rollouts and evaluations start no sandboxed worker anew
                return self._run()
        finally:
            if self.tracker is not None:
                self.tracker.close()
                self.tracker = None
            release_folder(self.dir, RUN_LOCK)

    def _run(self) -> dict[str, Any]:
        if uses_lanes(self.config):  # overlap, or a proposer latency to measure: two lanes (lanes_run)
            self._run_lanes()
            list_test_ids(self.dir, self.config, self.test_sets)
            return self.summary()
        self._costs()
        if self.units == 0:
            self._start()
        while (decision := self.schedule.decide(self.state)).action != "stop":
            if decision.action != self.state.phase:
                self._switch(decision)
            self._unit(decision.action)
        self._end_phase(decision)
        self._ledger({"event": "stop", "reason": decision.reason})
        self._save_state()
        list_test_ids(self.dir, self.config, self.test_sets)
        return self.summary()

    def _start(self) -> None:
        """The start of a run: its first ledger line and the evaluation of the model it starts from."""
        self._ledger(
            {
                "event": "start",
                "method": self.config.method,
                "env": self.config.env,
                "budget": self.config.budget_rollouts,
                "isolation": isolation_label(),
            }
        )
        self.evaluate()
        self._save_state()

    def _switch(self, decision: ScheduleDecision) -> None:
        """End the current phase (evaluating it) and start the one the schedule decided."""
        self._end_phase(decision)
        self._ledger(
            {
                "event": "switch",
                "from": self.state.phase or None,
                "to": decision.action,
                "reason": decision.reason,
            }
        )
        self.log(f"→ {decision.action} phase: {decision.reason}")
        self.state.start_phase(decision.action)

    def _unit(self, phase: str) -> None:
        """One unit of ``phase``, then its ledger line, the evaluation ``eval.every`` asks for, the state."""
        start = time.monotonic()
        signals, rollouts = getattr(self, UNIT_KINDS[phase])()
        stop_if_interrupted()  # a Ctrl-C that a worker or a __del__ swallowed: this unit is not kept
        self.state.rollouts += rollouts
        self.state.phase_units += 1
        self._ledger_unit(phase, self.state.phases, rollouts, time.monotonic() - start, signals)
        self.units += 1
        if self._evaluates_after(rollouts):
            self.evaluate()
        self._save_state()

    def _evaluates_after(self, rollouts: int) -> bool:
        """Whether the unit that just spent ``rollouts`` ends with an evaluation: after every unit
        (``eval.every: unit``), or when it crossed a multiple of ``eval.every`` rollouts."""
        every = self.config.eval.every
        if every == "unit":
            return True
        if every == "phase":
            return False
        return (self.state.rollouts - rollouts) // int(every) < self.state.rollouts // int(every)

    def _end_phase(self, decision: ScheduleDecision) -> None:
        by_rollouts = self.config.eval.every not in ("phase", "unit")
        if self.state.phase and (decision.action == "stop" or not by_rollouts):
            self.evaluate()

    def summary(self) -> dict[str, Any]:
        evals = [json.loads(line) for line in open(self.dir / "ledger.jsonl") if '"event": "eval"' in line]
        best = max(evals, key=lambda e: e["mean"]) if evals else None
        return {
            "run": str(self.dir),
            "method": self.config.method,
            "env": self.config.env,
            "rollouts": self.state.rollouts,
            "budget": self.config.budget_rollouts,
            "best_mean": best["mean"] if best else None,
            "best_se": best["se"] if best else None,
            "best_at_rollouts": best["rollouts_total"] if best else None,
            "final_mean": evals[-1]["mean"] if evals else None,
            "evals": len(evals),
            "wall_seconds": round(self.elapsed_before + time.monotonic() - self.started, 1),
            "startup_seconds": self.startup_seconds,  # of this process: loading the model or starting the engine
        }
