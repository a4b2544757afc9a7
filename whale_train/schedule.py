"""When to switch between the weight phase and the harness phase: the methods as schedule policies.

The trainer works in *units*: one RSFT step (weight phase) or one harness iteration (harness phase).
Before every unit it asks the schedule ``decide(state)`` and gets ``weight``, ``harness`` or ``stop``
with a reason that names the signal and its values; a switch is logged with that reason.

=============  =============================================================================================
method         policy
=============  =============================================================================================
weight-only    RSFT steps under the fixed seed harness until the budget is spent
harness-only   harness iterations under the fixed model until the budget is spent
whale          fixed phase lengths ``(E, I)``: E epochs of RSFT steps, then I harness iterations, where the
               first iteration of a harness phase is the re-scoring of the incoming harness (as in the paper)
adaptive       a weight phase runs at least ``min_weight_epochs``, then ends once the training reward
               averaged over a sliding ``window`` has not improved for ``patience`` steps; a harness phase
               runs at least ``min_iterations``, ends after ``iteration_patience`` iterations without a new
               best, and at ``max_iterations``
stagewise      all the weight budget first (``stagewise_weight_share`` of the rollouts), then harness search
fst            Fast-Slow Training: short fixed phases, with a prompt-only harness search
whale-overlap  whale with ``overlap: true``: each harness iteration's proposer works while the next weight
               phase trains (below)
=============  =============================================================================================

With ``overlap: true`` (methods that alternate: whale, adaptive, fst) a harness iteration's proposer works
on a lane of its own while the accelerator runs the next weight phase's units under the incumbent harness
(``whale_train.lanes``): the same units, asked of the same policy, so (E, I) and the budget split stay
what strict alternation has; only when they run changes.

Every policy stops when the next unit would overspend the rollout budget; harness-only and stagewise's
harness stage also stop once the proposer proposed no candidate in ``EXHAUSTED_AFTER`` iterations in a
row (such an iteration costs no rollouts, so the budget alone would never end them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from whale_train.config_io import Config, option
from whale_train.registry import registrar

METHODS = ("whale", "adaptive", "weight-only", "harness-only", "stagewise", "fst", "whale-overlap")
#: The methods that alternate weight and harness phases: the ones ``overlap`` can pipeline.
ALTERNATING = ("whale", "adaptive", "fst", "whale-overlap")
#: Methods that always overlap (``whale-overlap``: whale's ``(E, I)`` with ``overlap: true``).
OVERLAPPED = ("whale-overlap",)
#: The clocks an injected proposer latency is measured on (``ScheduleConfig.latency_clock``).
LATENCY_CLOCKS = ("wall", "rollouts")


@dataclass
class ScheduleDecision:
    """What the schedule says the next unit is, and why (logged at a phase switch)."""

    action: str  # "weight" | "harness" | "stop"
    reason: str


@dataclass
class RunState:
    """What the schedule sees. Updated by the trainer after every unit; saved for resume."""

    budget: int
    rollouts: int = 0
    phase: str = ""  # the phase of the last unit ("" before the first)
    phase_units: int = 0  # units done in the current phase
    phases: int = 0  # phases started so far
    weight_step_cost: int = 0  # rollouts of one RSFT step
    harness_iteration_cost: int = 0  # rollouts of one harness iteration (an estimate for the budget check)
    steps_per_epoch: float = 1.0
    train_rewards: list[float] = field(default_factory=list)  # this weight phase, one per step
    harness_improved: list[bool] = field(default_factory=list)  # this harness phase: a new best?
    weight_rollouts: int = 0  # all weight-phase rollouts so far
    empty_iterations: int = 0  # harness iterations in a row whose proposer proposed no candidate at all
    # lanes (``overlap`` or an injected proposer latency: whale_train.trainer.lanes_run): the harness phase
    # whose iterations go on beside the weight phase, the proposal in flight and the proposer lane's clock
    side_open: bool = False
    side_index: int = 0  # its phase index (``phases`` when it began)
    side_units: int = 0  # its units so far, the re-scoring included
    side_improved: list[bool] = field(default_factory=list)
    pending: dict | None = None  # the proposal asked for and not yet scored (``lanes.Request`` + requested_t)
    lane_clock: float = 0.0  # the proposer lane's clock when this state was saved

    def start_phase(self, phase: str) -> None:
        self.phase, self.phase_units, self.phases = phase, 0, self.phases + 1
        self.train_rewards, self.harness_improved = [], []

    def to_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, list) else v) for k, v in self.__dict__.items()}


class Schedule(Protocol):
    def decide(self, state: RunState) -> ScheduleDecision: ...


@dataclass
class ScheduleConfig(Config):
    """Phase lengths and adaptive thresholds (paper defaults; ``schedule:`` of a train config)."""

    weight_epochs: float = option(0.6, "E, the length of a weight phase in epochs of the train split")
    harness_iterations: int = option(
        6, "I, harness iterations per phase, the re-scoring of the incoming harness included"
    )
    min_weight_epochs: float = option(0.2, "adaptive: the shortest weight phase, in epochs")
    window: int = option(3, "adaptive: the sliding window of steps whose train rewards are averaged")
    patience: int = option(2, "adaptive: steps without a higher window average before a weight phase ends")
    min_iterations: int = option(5, "adaptive: the fewest harness iterations of a phase")
    iteration_patience: int = option(2, "adaptive: iterations without a new best before a harness phase ends")
    max_iterations: int = option(15, "adaptive: the most harness iterations of a phase")
    stagewise_weight_share: float = option(
        0.5, "the share of the budget stagewise spends on weights before searching"
    )
    fst_weight_epochs: float = option(0.1, "FST's short weight phases, in epochs")
    fst_iterations: int = option(2, "FST's short harness phases, in iterations")
    overlap: bool = option(
        False,
        "while a harness iteration's proposer works, train the next weight phase's units (whale, adaptive, "
        "fst); candidates are scored when they arrive, under the weights of that moment",
    )
    max_version_gap: int | None = option(
        None,
        "overlap: the most model versions a candidate may be scored past the version its proposer read (a "
        "weight step that would pass it waits for the proposer); unset: no bound",
    )
    proposer_latency: float | None = option(
        None,
        "an injected proposer latency: each iteration's candidates arrive this long after they were asked "
        "for (or when the proposer answers, if later), on latency_clock; unset: when the proposer answers",
    )
    latency_clock: str = option(
        "wall",
        "what proposer_latency counts: wall (seconds) or rollouts (rollouts the accelerator spends meanwhile: "
        "deterministic, so runs and resumes repeat exactly)",
    )

    def validate(self) -> None:
        if self.weight_epochs <= 0 or self.harness_iterations < 1:
            raise ValueError("weight_epochs must be > 0 and harness_iterations >= 1")
        if not 0 < self.stagewise_weight_share < 1:
            raise ValueError("stagewise_weight_share must be in (0, 1)")
        if self.min_iterations > self.max_iterations:
            raise ValueError("min_iterations must not exceed max_iterations")
        if self.max_version_gap is not None and self.max_version_gap < 0:
            raise ValueError("max_version_gap must be >= 0 (unset: no bound)")
        if self.proposer_latency is not None and self.proposer_latency < 0:
            raise ValueError("proposer_latency must be >= 0 (unset: none injected)")
        if self.latency_clock not in LATENCY_CLOCKS:
            raise ValueError(f"latency_clock must be one of {', '.join(LATENCY_CLOCKS)}")


def _within_budget(state: RunState, action: str, reason: str) -> ScheduleDecision:
    """``action`` for ``reason`` when the budget affords one more unit of it, else a stop saying why."""
    cost = state.weight_step_cost if action == "weight" else state.harness_iteration_cost
    if state.rollouts + cost > state.budget:
        return ScheduleDecision(
            "stop",
            f"budget: {state.rollouts} of {state.budget} rollouts spent, the next {action} unit would overspend",
        )
    return ScheduleDecision(action, reason)


class WeightOnly:
    def decide(self, state: RunState) -> ScheduleDecision:
        return _within_budget(state, "weight", "weight-only: always train the weights")


EXHAUSTED_AFTER = 3  # empty iterations in a row after which a search-until-the-budget method stops


def _search_exhausted(state: RunState) -> ScheduleDecision | None:
    """A stop for a method that searches until the budget is spent, once its proposer has nothing left:
    an iteration that proposes no candidate costs no rollouts, so without this it would loop forever."""
    if state.empty_iterations >= EXHAUSTED_AFTER:
        return ScheduleDecision(
            "stop",
            f"search exhausted: the proposer proposed no candidate in {state.empty_iterations} iterations in a "
            f"row ({state.rollouts} of {state.budget} rollouts spent)",
        )
    return None


class HarnessOnly:
    def decide(self, state: RunState) -> ScheduleDecision:
        return _search_exhausted(state) or _within_budget(
            state, "harness", "harness-only: always search harnesses"
        )


class Fixed:
    """``(E, I)``: E epochs of weights, then I harness iterations, repeated. Starts with weights."""

    def __init__(self, weight_epochs: float, harness_iterations: int):
        self.weight_epochs = weight_epochs
        self.harness_iterations = harness_iterations

    def weight_steps(self, state: RunState) -> int:
        return max(1, round(self.weight_epochs * state.steps_per_epoch))

    def decide(self, state: RunState) -> ScheduleDecision:
        if state.phase in ("", "harness"):
            if state.phase == "harness" and state.phase_units < self.harness_iterations:
                action, reason = (
                    "harness",
                    f"harness phase: iteration {state.phase_units + 1} of I={self.harness_iterations}",
                )
            else:
                n = self.weight_steps(state)
                why = (
                    "start"
                    if not state.phase
                    else f"harness phase done: {state.phase_units} of I={self.harness_iterations} iterations"
                )
                action, reason = "weight", f"{why}; weight phase of E={self.weight_epochs} epochs = {n} steps"
        elif state.phase_units < self.weight_steps(state):
            action, reason = (
                "weight",
                f"weight phase: step {state.phase_units + 1} of {self.weight_steps(state)}",
            )
        else:
            action = "harness"
            reason = (
                f"weight phase done: {state.phase_units} steps = E={self.weight_epochs} epochs; "
                f"harness phase of I={self.harness_iterations} iterations (the first re-scores the incumbent)"
            )
        return _within_budget(state, action, reason)


class Adaptive:
    """Phase ends driven by the signals (see the module docstring)."""

    def __init__(self, config: ScheduleConfig):
        self.c = config

    def _weight_done(self, state: RunState) -> tuple[bool, str]:
        min_steps = max(1, round(self.c.min_weight_epochs * state.steps_per_epoch))
        steps = state.phase_units
        if steps < min_steps:
            return (
                False,
                f"weight phase: step {steps + 1}, minimum {min_steps} steps ({self.c.min_weight_epochs} epochs)",
            )
        r, w = state.train_rewards, self.c.window
        averages = [sum(r[i - w + 1 : i + 1]) / w for i in range(w - 1, len(r))]
        if len(averages) <= self.c.patience:
            return False, f"weight phase: step {steps + 1}, {len(averages)} window averages so far"
        best_before = max(averages[: -self.c.patience])
        recent = averages[-self.c.patience :]
        if max(recent) <= best_before:
            return True, (
                f"train reward stopped improving: window-{w} averages {[round(a, 3) for a in recent]} over the last "
                f"{self.c.patience} steps <= earlier best {best_before:.3f}"
            )
        return (
            False,
            f"weight phase: step {steps + 1}, train reward still improving (window average {averages[-1]:.3f})",
        )

    def _harness_done(self, state: RunState) -> tuple[bool, str]:
        n = state.phase_units
        if n < self.c.min_iterations:
            return False, f"harness phase: iteration {n + 1}, minimum {self.c.min_iterations}"
        if n >= self.c.max_iterations:
            return True, f"harness phase: the maximum of {self.c.max_iterations} iterations reached"
        recent = state.harness_improved[-self.c.iteration_patience :]
        if len(recent) == self.c.iteration_patience and not any(recent):
            return (
                True,
                f"no new best harness in the last {self.c.iteration_patience} iterations ({n} iterations run)",
            )
        return (
            False,
            f"harness phase: iteration {n + 1}, a new best within the last {self.c.iteration_patience}",
        )

    def decide(self, state: RunState) -> ScheduleDecision:
        if state.phase == "":
            action, reason = "weight", "start with a weight phase"
        elif state.phase == "weight":
            done, why = self._weight_done(state)
            action, reason = ("harness", why) if done else ("weight", why)
        else:
            done, why = self._harness_done(state)
            action, reason = ("weight", why) if done else ("harness", why)
        return _within_budget(state, action, reason)


class Stagewise:
    """All weight steps first (until ``share`` of the budget), then harness search until the end."""

    def __init__(self, share: float):
        self.share = share

    def decide(self, state: RunState) -> ScheduleDecision:
        weight_budget = int(self.share * state.budget)
        if state.phase in ("", "weight") and state.weight_rollouts + state.weight_step_cost <= weight_budget:
            return ScheduleDecision(
                "weight", f"stagewise: weight stage, {state.weight_rollouts} of {weight_budget} rollouts"
            )
        return _search_exhausted(state) or _within_budget(
            state, "harness", f"stagewise: harness stage after {state.weight_rollouts} weight rollouts"
        )


#: method -> the policy it runs (a factory of its ``ScheduleConfig``); registered with
#: ``@policy(method, ...)``.
POLICIES: dict[str, Callable[[ScheduleConfig], Schedule]] = {}
policy = registrar(POLICIES)


@policy("weight-only")
def _weight_only(_c: ScheduleConfig) -> Schedule:
    return WeightOnly()


@policy("harness-only")
def _harness_only(_c: ScheduleConfig) -> Schedule:
    return HarnessOnly()


@policy("whale", "whale-overlap")
def _whale(c: ScheduleConfig) -> Schedule:
    return Fixed(c.weight_epochs, c.harness_iterations)


@policy("fst")
def _fst(c: ScheduleConfig) -> Schedule:
    return Fixed(c.fst_weight_epochs, c.fst_iterations)


@policy("adaptive")
def _adaptive(c: ScheduleConfig) -> Schedule:
    return Adaptive(c)


@policy("stagewise")
def _stagewise(c: ScheduleConfig) -> Schedule:
    return Stagewise(c.stagewise_weight_share)


def overlaps(method: str, config: ScheduleConfig) -> bool:
    """Whether a run of ``method`` overlaps a harness phase's proposer with the next weight phase."""
    return method in OVERLAPPED or (config.overlap and method in ALTERNATING)


def make_schedule(method: str, config: ScheduleConfig) -> Schedule:
    config.validate()
    if config.overlap and method not in ALTERNATING:
        raise ValueError(
            f"schedule.overlap: method {method!r} does not alternate phases; overlap pipelines "
            f"{', '.join(ALTERNATING)}"
        )
    if method not in POLICIES:
        raise ValueError(f"unknown method {method!r}; known: {', '.join(METHODS)}")
    return POLICIES[method](config)
