"""The run loop of a run with two lanes (``whale_train.lanes``): with ``schedule.overlap`` (or method
``whale-overlap``), and with an injected proposer latency (``schedule.proposer_latency``), which strict
alternation runs here too so that its timings compare with overlap's.

The units are those of strict alternation, asked of the same schedule policy:

* a weight phase of RSFT steps; at its end the harness phase begins with the re-scoring of the incoming
  harness, on the accelerator lane;
* each later iteration of the harness phase is asked of the proposer lane (``HarnessSearch.propose``, at
  the model version of that moment: ``traces_version``). Strictly, the accelerator waits for it. With
  overlap, the next weight phase opens at once and its steps run under the incumbent harness while the
  proposer works; the proposal arrives at the first step boundary after it answered (and after its
  injected latency), and is scored there, pinned to the model version of that moment (no step runs while
  it is scored; the incumbent is re-scored there first when the version is new): ``HarnessSearch.score``.
  The policy then says whether the harness phase asks for another iteration;
* a weight step is not started while the version gap of the proposal in flight would pass
  ``schedule.max_version_gap``, nor once the weight phase is done: the accelerator then waits for the
  proposer; the next harness phase begins once the last one has ended.

Every unit is one ledger line, charged as in strict alternation, with its lane and its start and end in
seconds since the run started (``t_start``, ``t_end``); a scored iteration also records its proposal
(requested, replied, arrived, the wait, the version gap). The state saved after each unit holds the
proposal in flight and the proposer lane's clock: ``--resume`` asks for it again with the same deadline,
and the archive replays the proposer's recorded reply, so a run on the ``rollouts`` clock resumes to the
ledger it would have written uninterrupted.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

from whale_train.lanes import Arrival, LaneLLM, ProposerLane, lane_metrics, make_clock
from whale_train.meta_harness.search import Proposed
from whale_train.schedule import RunState, Schedule, ScheduleDecision, overlaps
from whale_train.trainer.config import TrainConfig
from whale_train.trainer.interrupt import stop_if_interrupted
from whale_train.trainer.part import RunPart
from whale_train.trainer.units import harness_signals


def uses_lanes(config: TrainConfig) -> bool:
    """Whether a run of ``config`` runs on two lanes (overlap, or a proposer latency to measure)."""
    return overlaps(config.method, config.schedule) or config.schedule.proposer_latency is not None


class RunLanes(RunPart):
    """The two-lane loop of :class:`whale_train.trainer.Run` (a part of it; see the module docstring)."""

    schedule: Schedule
    rescored: set[int]
    units: int
    started: float
    elapsed_before: float

    _accelerator: Any = None  # the accelerator lane's lock (an RLock) while the run uses lanes
    _eval_started: float | None = None
    _side_reason: str = ""

    # -------------------------------------------------------------- time and the lanes

    def _t(self, mono: float | None = None) -> float:
        """Seconds since the run started (its earlier processes included)."""
        return round(self.elapsed_before + (time.monotonic() if mono is None else mono) - self.started, 3)

    def _lanes_on(self) -> bool:
        return self._accelerator is not None

    def evaluate(self) -> dict[str, Any] | None:
        if not self._lanes_on():
            return super().evaluate()  # type: ignore[misc]
        self._eval_started = self._t()
        with self._accelerator:
            return super().evaluate()  # type: ignore[misc]

    def _ledger(self, event: dict[str, Any]) -> None:
        if self._lanes_on() and event.get("event") == "eval" and self._eval_started is not None:
            event.update(lane="accelerator", t_start=self._eval_started, t_end=self._t())
            self._eval_started = None
        super()._ledger(event)  # type: ignore[misc]

    def _ledger_lane_unit(
        self,
        phase: str,
        phase_index: int,
        rollouts: int,
        t_start: float,
        signals: dict[str, Any],
        **more: Any,
    ) -> None:
        """The ledger line of a unit the accelerator lane ran from ``t_start`` (run seconds) to now."""
        t_end = self._t()
        self._ledger_unit(  # type: ignore[attr-defined]
            phase,
            phase_index,
            rollouts,
            t_end - t_start,
            signals,
            lane="accelerator",
            t_start=t_start,
            t_end=t_end,
            **more,
        )

    def _save(self) -> None:
        self.state.lane_clock = self.clock.now()
        self._save_state()  # type: ignore[attr-defined]

    def _run_lanes(self) -> None:
        """Run to the end on two lanes (the caller lists the test ids and returns the summary)."""
        sc = self.config.schedule
        self.overlap = overlaps(self.config.method, sc)
        self.clock = make_clock(sc.latency_clock, self.state.lane_clock)
        self.lane: ProposerLane[Proposed] = ProposerLane(self.clock, sc.proposer_latency)
        self._accelerator = threading.RLock()
        self._costs()  # type: ignore[attr-defined]
        if self.units == 0:
            self._start()  # type: ignore[attr-defined]
        if self.state.pending:  # resumed with a proposal in flight: asked again, with its deadline
            p = self.state.pending
            self._request(p["iteration"], p["traces_version"], p["requested_at"], p["requested_t"])
        while True:
            if self.state.side_open and self._take_now():
                if not self._score_arrival():
                    decision = ScheduleDecision("stop", self._over_budget("harness iteration"))
                    break
                continue
            decision = self.schedule.decide(self.state)
            if decision.action == "harness" and self.state.phase == "harness":  # its iterations are over
                decision = ScheduleDecision("stop", f"the harness phase ended: {self._side_reason}")
            if decision.action == "stop":
                break
            if decision.action == "weight":
                if self.state.phase != "weight":
                    self._switch(decision)  # type: ignore[attr-defined]
                self._weight_lane_unit()
            else:
                self._switch(decision)  # type: ignore[attr-defined]  # the weight phase ends (evaluated)
                self._rescore_unit()
        self.lane.drop()
        self.state.pending, self.state.side_open = None, False
        self._end_phase(decision)  # type: ignore[attr-defined]
        metrics = lane_metrics(_read_ledger(self.dir))
        self._ledger({"event": "stop", "reason": decision.reason, "lanes": metrics})
        self._save()
        self.log(
            f"lanes: accelerator idle {100 * (metrics or {}).get('accelerator_idle_share', 0):.0f}%, "
            f"waiting for the proposer {100 * (metrics or {}).get('proposer_wait_share', 0):.0f}%"
        )

    # -------------------------------------------------------------- the proposer lane

    def _iteration_cost(self, version: int) -> int:
        """What scoring an iteration under model ``version`` costs at most: its candidates, plus the
        incumbent (and the frontier) re-scored when the search has not scored them under it yet (with
        overlap, the weights may have moved on since the phase's re-scoring)."""
        s = self.config.search
        sets = s.candidates
        if self._search().archive.record("rescore", version) is None:  # type: ignore[attr-defined]
            sets += 1 + (s.frontier_size if s.rescore_frontier else 0)
        tries = s.agent.try_budget if s.proposer == "agent" else 0
        return s.harness_tasks * s.rollouts_per_task * sets + tries

    def _over_budget(self, what: str) -> str:
        return f"budget: {self.state.rollouts} of {self.state.budget} rollouts spent, the next {what} would overspend"

    def _side_view(self) -> RunState:
        """The schedule's view of the harness phase in flight (its units and signals)."""
        return dataclasses.replace(
            self.state,
            phase="harness",
            phase_units=self.state.side_units,
            harness_improved=list(self.state.side_improved),
        )

    def _request(
        self, iteration: int, version: int, at: float | None = None, at_t: float | None = None
    ) -> None:
        search = self._search()  # type: ignore[attr-defined]
        proposer_llm = LaneLLM(self.llm, self._accelerator)
        request = self.lane.request(
            iteration, version, lambda: search.propose(version, iteration, llm=proposer_llm), at
        )
        self.state.pending = {**request.to_dict(), "requested_t": self._t() if at_t is None else at_t}
        self.log(f"  proposer lane: iteration {iteration} asked for (model v{version})")

    def _take_now(self) -> bool:
        """Whether the accelerator lane takes the proposal in flight now (waiting for it if need be)."""
        if self.lane.pending is None:
            return True
        if not self.overlap or self.lane.ready():
            return True
        if self.schedule.decide(self.state).action != "weight":  # the weight phase is done: wait
            return True
        gap = self.config.schedule.max_version_gap
        version = int(getattr(self.llm, "version", 0))
        return gap is not None and version + 1 - self.lane.pending.traces_version > gap

    def _score_arrival(self) -> bool:
        """Score the proposal in flight (False: the budget does not afford it; nothing is spent)."""
        if self.lane.pending is None:  # a harness phase whose proposal was never asked for: it ends
            self._close_side(ScheduleDecision("weight", "no proposal in flight"))
            return True
        version = int(getattr(self.llm, "version", 0))
        if self.state.rollouts + self._iteration_cost(version) > self.state.budget:
            return False
        arrival: Arrival[Proposed] = self.lane.take()
        t_start, version = self._t(), int(getattr(self.llm, "version", 0))
        search = self._search()  # type: ignore[attr-defined]
        before = search.incumbent_id
        with self._accelerator:  # pinned: no weight step runs (or pushes) while it is scored
            result = search.score(arrival.reply, version).to_dict()
        stop_if_interrupted()
        if result.get("rescore_rollouts"):
            self.rescored.add(version)  # charged to this iteration: a later re-scoring of it costs nothing
        rollouts = int(result["rollouts"]) + int(result.get("proposer_rollouts") or 0)
        signals = harness_signals("iteration", result)
        signals.update(traces_version=result["traces_version"], version_gap=result["version_gap"])
        # what the candidates were paired with: the incumbent before them, re-scored under the same version
        # (the search's own gain, free of weight updates, is the accepted mean minus this one)
        signals["paired_with"] = {"id": before, "mean": search.result(before, version).mean}
        request = arrival.request
        requested_t = self.state.pending["requested_t"] if self.state.pending else t_start
        replied_t = self._t(arrival.replied_wall)
        if request.deadline is not None:  # the injected latency is part of the proposer's time
            latency = request.deadline - request.requested_at
            wall = self.config.schedule.latency_clock == "wall"
            replied_t = max(replied_t, requested_t + latency if wall else t_start)
        proposal = {
            "iteration": request.iteration,
            "traces_version": request.traces_version,
            "scored_version": version,
            "version_gap": version - request.traces_version,
            "requested_t": requested_t,
            "replied_t": round(replied_t, 3),  # on the rollouts clock: when it arrived
            "arrived_t": t_start,
            "waited_seconds": arrival.waited_seconds,
            "requested_clock": request.requested_at,
            "arrived_clock": self.clock.now(),
        }
        self.state.pending = None
        self.state.empty_iterations = 0 if signals["candidates"] else self.state.empty_iterations + 1
        self._record_harness(signals, rollouts, t_start, proposal)
        return True

    def _rescore_unit(self) -> None:
        """The first unit of a harness phase: the incoming harness re-scored under the new weights."""
        search = self._search()  # type: ignore[attr-defined]
        version = int(getattr(self.llm, "version", 0))
        t_start = self._t()
        with self._accelerator:
            result = search.rescore(version).to_dict()
        stop_if_interrupted()
        if version in self.rescored:  # scored and charged already
            result["rollouts"] = 0
            if result["incumbent"] != search.incumbent_id:
                # an arrival scored under this version (the incumbent re-scored with it) and was accepted:
                # the stored re-scoring names the incumbent it replaced; the phase opens with the one that
                # holds now, as scored under this version (strict alternation's phase-start re-score)
                current = dataclasses.asdict(search.result(search.incumbent_id, version))
                result.update(
                    incumbent=search.incumbent_id, candidates=[current], reason="scored by the arrival"
                )
        self.rescored.add(version)
        self.state.side_open, self.state.side_index = True, self.state.phases
        self.state.side_units, self.state.side_improved = 0, []
        self._record_harness(harness_signals("rescore", result), int(result["rollouts"]), t_start, None)

    def _record_harness(
        self, signals: dict[str, Any], rollouts: int, t_start: float, proposal: dict[str, Any] | None
    ) -> None:
        search = self._search()  # type: ignore[attr-defined]
        self.harness = search.incumbent
        self.state.rollouts += rollouts
        self.clock.spent(rollouts)
        self.state.side_units += 1
        self.state.side_improved.append(signals["improved"])
        if self.state.phase == "harness":  # strict: the harness phase is the schedule's current phase
            self.state.phase_units = self.state.side_units
            self.state.harness_improved = list(self.state.side_improved)
        self.log(f"  harness {signals['kind']}: {signals['reason']}")
        more = {"proposal": proposal} if proposal else {}
        self._ledger_lane_unit("harness", self.state.side_index, rollouts, t_start, signals, **more)
        self.units += 1
        decision = self.schedule.decide(self._side_view())
        if decision.action == "harness":
            self._request(search.next_iteration, int(getattr(self.llm, "version", 0)))
            if self.overlap and self.state.phase == "harness":
                self._ledger(
                    {
                        "event": "switch",
                        "from": "harness",
                        "to": "weight",
                        "reason": f"overlap: the next weight phase trains while the proposer of iteration "
                        f"{search.next_iteration} works",
                    }
                )
                self.state.start_phase("weight")
        else:
            self._close_side(decision)
        if self._evaluates_after(rollouts):  # type: ignore[attr-defined]
            self.evaluate()
        self._save()

    def _close_side(self, decision: ScheduleDecision) -> None:
        """The harness phase in flight ends (the policy says so)."""
        self.state.side_open = False
        self.state.pending = None
        self._side_reason = decision.reason
        if self.overlap:
            self._ledger({"event": "harness_end", "reason": decision.reason})
            if self.config.eval.every == "phase":
                self.evaluate()

    # -------------------------------------------------------------- the accelerator lane's weight units

    def _weight_lane_unit(self) -> None:
        t_start = self._t()
        with self._accelerator:
            signals, rollouts = self._weight_unit()  # type: ignore[attr-defined]
        stop_if_interrupted()
        self.state.rollouts += rollouts
        self.state.phase_units += 1
        self.clock.spent(rollouts)
        self._ledger_lane_unit("weight", self.state.phases, rollouts, t_start, signals)
        self.units += 1
        if self._evaluates_after(rollouts):  # type: ignore[attr-defined]
            self.evaluate()
        self._save()


def _read_ledger(run_dir: Path) -> list[dict[str, Any]]:
    from whale_train.report import read_ledger

    return read_ledger(run_dir)
