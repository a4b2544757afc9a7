"""The units a run is made of, one per phase: an RSFT step of the weight operator (``whale_train.rsft``),
and an iteration, or the re-scoring of the incoming harness, of the harness operator
(``whale_train.meta_harness``). Each unit returns its signals (what the ledger records) and the rollouts
it spent; the operators are built on first use, so a run that never enters a phase never builds its
operator. A phase's unit is a method registered with :func:`unit_of`, which the run loop looks up by the
phase the schedule decides."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from harnesses.loader import HarnessRef, load_harness
from whale_train import distributed
from whale_train.rsft import RSFT
from whale_train.trainer.backend import train_model
from whale_train.trainer.config import TrainConfig
from whale_train.trainer.part import RunPart

#: The unit of each phase: phase name -> the name of the ``Run`` method that runs one (``unit_of``).
UNIT_KINDS: dict[str, str] = {}


def unit_of(phase: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a ``Run`` method as the unit of ``phase``; it returns ``(signals, rollouts)``."""

    def register(method: Callable[..., Any]) -> Callable[..., Any]:
        UNIT_KINDS[phase] = method.__name__
        return method

    return register


class HarnessPhase(Protocol):
    """What the trainer needs from the harness operator (``whale_train.meta_harness``)."""

    @property
    def incumbent(self) -> HarnessRef: ...

    def rescore(self, model_version: int) -> Any:
        """Score the incumbent (and frontier) under a model version (idempotent per version); a report
        with ``to_dict()`` holding ``rollouts``, ``improved``, ``summary``."""
        ...

    def iterate(self, model_version: int, iteration: int | None = None) -> Any:
        """Search iteration ``iteration`` (default: the next); idempotent once complete (a rerun returns the
        stored report); a report as for ``rescore``."""
        ...


def make_harness_phase(config: TrainConfig, run_dir: Path, llm: Any) -> HarnessPhase:
    from whale_train.meta_harness import HarnessSearch

    search_config = config.search.seeded(config.seed)
    if config.method == "fst":
        search_config = dataclasses.replace(search_config, prompt_only=True)
    return HarnessSearch(
        search_config,
        run_dir / "archive",
        llm,
        config.env,
        config.env_kwargs,
        seed_harness=load_harness(config.harness_name),
        log=lambda _line: None,  # the trainer logs a line per unit
        scored_sources=config.eval_sets if config.eval.tasks else None,
    )


class RunUnits(RunPart):
    """The units of :class:`whale_train.trainer.Run` (a part of it): the operators, built on first use, and
    one unit of each phase, which updates the schedule's state with what the unit showed."""

    rsft: RSFT | None
    search: HarnessPhase | None
    rescored: set[int]  # model versions whose harness re-scoring the ledger has charged
    iterations: int  # search iterations finished (a rerun unit asks for the same iteration again)

    def _rsft(self) -> RSFT:
        if self.rsft is None:
            rsft_config = dataclasses.replace(
                self.config.rsft, seed=self.config.seed, concurrency=self.config.concurrency
            )
            self.rsft = RSFT(
                rsft_config,
                self.llm,
                self.harness,
                self.config.env,
                self.config.env_kwargs,
                checkpoint_dir=self.dir / "checkpoints",
                train_model=train_model(self.config, self.llm),
            )
            if distributed.world()[1] > 1:  # under accelerate launch: every rank trains (distributed.py)
                self.rsft.trainer = distributed.DistributedUpdater(self.rsft.trainer)
        return self.rsft

    def _search(self) -> HarnessPhase:
        if self.search is None:
            self.search = make_harness_phase(self.config, self.dir, self.llm)
        return self.search

    @property
    def harness_label(self) -> str:
        """The harness as the log shows it: the seed keeps the name it was given (``math/h0``) after the
        search copies it into its archive (as ``h0``); a candidate is its archive id."""
        if self.search is not None and self.harness.name == getattr(self.search, "seed_id", None):
            return self.config.harness_name
        return self.harness.name

    def _costs(self) -> None:
        """Rollouts per unit, for the budget check."""
        cfg = self.config
        self.state.weight_step_cost = cfg.weight_step_cost
        self.state.harness_iteration_cost = cfg.harness_iteration_cost
        if cfg.method != "harness-only":
            self.state.steps_per_epoch = self._rsft().steps_per_epoch

    @unit_of("weight")
    def _weight_unit(self) -> tuple[dict[str, Any], int]:
        rsft = self._rsft()
        rsft.harness = self.harness
        report = rsft.step()
        self.state.train_rewards.append(report.train_reward)
        self.state.weight_rollouts += report.rollouts
        self.log(
            f"  RSFT step {report.step}: train reward {report.train_reward:.3f}, accepted {report.accepted}, "
            f"loss {report.loss if report.loss is None else round(report.loss, 3)}, model v{report.model_version}"
        )
        signals = report.to_dict()
        signals.pop("failures", None)
        push = getattr(self.llm, "last_push_seconds", None)
        if report.updated and push is not None:  # weights pushed to the rollout engine(s) this step
            signals["push_seconds"] = push
            if getattr(self.llm, "last_push_check", None):  # the engine's probe log-probs vs the trainer's
                signals["push_check"] = self.llm.last_push_check
        return signals, report.rollouts

    @unit_of("harness")
    def _harness_unit(self) -> tuple[dict[str, Any], int]:
        search = self._search()
        version = int(getattr(self.llm, "version", 0))
        if (
            self.state.phase_units == 0
        ):  # the first iteration of a harness phase re-scores the incoming harness
            result = search.rescore(version).to_dict()
            kind = "rescore"
            if version in self.rescored:  # scored and charged already (a weight phase that changed nothing)
                result["rollouts"] = 0
            self.rescored.add(version)
        else:
            result = search.iterate(version, iteration=self.iterations + 1).to_dict()
            kind = "iteration"
            self.iterations += 1
        self.state.harness_improved.append(bool(result.get("improved")))
        self.harness = search.incumbent
        self.log(f"  harness {kind}: {result.get('summary', '')}")
        signals = harness_signals(kind, result)
        if kind == "iteration":  # iterations in a row that proposed nothing: the search is exhausted
            self.state.empty_iterations = 0 if signals["candidates"] else self.state.empty_iterations + 1
        return signals, int(result["rollouts"]) + int(result.get("proposer_rollouts") or 0)


def harness_signals(kind: str, result: dict[str, Any]) -> dict[str, Any]:
    """A harness unit's signals for the ledger (strict alternation and the overlapped lanes alike)."""
    signals = {
        "kind": kind,
        "improved": bool(result.get("improved")),
        "accepted": bool(result.get("accepted")),
        "incumbent": result.get("incumbent"),
        "reason": result.get("reason"),
        "candidates": [
            {k: c.get(k) for k in ("id", "status", "mean", "reason") if k in c}
            for c in result.get("candidates", [])
        ],
    }
    if result.get("proposer_rollouts"):  # the agent proposer's tries: charged, and shown apart
        signals["proposer_rollouts"] = int(result["proposer_rollouts"])
    return signals
