"""The two lanes of a run that overlaps its phases (``schedule.overlap``, docs/TRAINING.md).

* The **accelerator lane** runs everything that uses the model: RSFT steps, the scoring of candidates,
  re-scoring, test evaluation, and the agent proposer's tries (through :class:`LaneLLM`, between units).
* The **proposer lane** runs one harness iteration's proposer at a time, on a thread of its own
  (:class:`ProposerLane`): it reads the archive and writes candidates, and uses no model of the run.

A proposal *arrives* at the first unit boundary of the accelerator lane after the proposer answered, and
after its injected latency (``schedule.proposer_latency``) has passed on the lane's clock
(:data:`CLOCKS`): ``wall`` counts seconds, ``rollouts`` counts the rollouts the accelerator lane spends,
so that a run with it repeats exactly, arrivals included.

:func:`lane_metrics` reads the timings the trainer writes into the ledger (``t_start``/``t_end`` of every
accelerator unit and evaluation, seconds since the run started; the requests, replies and arrivals of
proposals) and measures the accelerator's idle share, the share of the run spent waiting for a proposer,
the wall-clock per cycle and the version gap of every scored iteration.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Generic, Protocol, TypeVar

from whale_train.registry import registrar

T = TypeVar("T")


class Clock(Protocol):
    """The time a proposer's latency is measured on."""

    def now(self) -> float: ...

    def spent(self, rollouts: int) -> None:
        """The accelerator lane finished a unit that spent ``rollouts``."""

    def wait_until(self, t: float) -> None:
        """Return once the clock reads ``t`` or later (a wall clock sleeps; a rollout clock jumps there:
        the accelerator spends nothing while it waits)."""


#: name -> clock class (``schedule.latency_clock``); a class registers itself with ``@clock(name)``.
CLOCKS: dict[str, type] = {}
clock = registrar(CLOCKS)


@clock("wall")
class WallClock:
    """Seconds, going on from ``start`` (what a resumed run had counted)."""

    def __init__(self, start: float = 0.0):
        self._origin = time.monotonic() - start

    def now(self) -> float:
        return time.monotonic() - self._origin

    def spent(self, rollouts: int) -> None:
        pass

    def wait_until(self, t: float) -> None:
        while (left := t - self.now()) > 0:
            time.sleep(min(left, 0.1))  # short sleeps: a Ctrl-C lands at once


@clock("rollouts")
class RolloutClock:
    """Rollouts the accelerator lane spent, going on from ``start``: deterministic."""

    def __init__(self, start: float = 0.0):
        self.t = float(start)

    def now(self) -> float:
        return self.t

    def spent(self, rollouts: int) -> None:
        self.t += rollouts

    def wait_until(self, t: float) -> None:
        self.t = max(self.t, t)


def make_clock(name: str, start: float = 0.0) -> Clock:
    if name not in CLOCKS:
        raise ValueError(f"unknown clock {name!r}; known: {', '.join(CLOCKS)}")
    return CLOCKS[name](start)


@dataclass
class Request:
    """A proposal asked of the proposer lane: what ``state.json`` keeps of it, so that a resumed run asks
    again (the archive then replays the proposer's recorded reply) with the same deadline."""

    iteration: int
    traces_version: int  # the model version whose scores and traces the proposer reads
    requested_at: float  # on the lane's clock
    deadline: float | None  # requested_at + the injected latency (None: none injected)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Arrival(Generic[T]):
    """A reply taken by the accelerator lane: the reply, its request, and how long the lane waited."""

    request: Request
    reply: T
    waited_seconds: float  # wall seconds the accelerator lane was blocked on it
    replied_wall: float  # time.monotonic() when the proposer answered


class ProposerLane(Generic[T]):
    """One proposal in flight at a time, worked on a daemon thread (a run that stops leaves it behind)."""

    def __init__(self, clock: Clock, latency: float | None):
        self.clock = clock
        self.latency = latency
        self.pending: Request | None = None
        self._done = threading.Event()
        self._reply: T | None = None
        self._error: BaseException | None = None
        self._replied_wall = 0.0

    def request(
        self, iteration: int, traces_version: int, work: Callable[[], T], requested_at: float | None = None
    ) -> Request:
        """Start ``work`` (the proposer's part of ``iteration``); ``requested_at`` restores a resumed one's."""
        if self.pending is not None:
            raise RuntimeError(f"iteration {self.pending.iteration} is still being proposed")
        at = self.clock.now() if requested_at is None else requested_at
        deadline = None if self.latency is None else at + self.latency
        self.pending = Request(iteration, traces_version, at, deadline)
        done, box = threading.Event(), self

        def run() -> None:
            try:
                box._reply = work()
            except BaseException as exc:  # noqa: BLE001 - handed to the accelerator lane by take()
                box._error = exc
            box._replied_wall = time.monotonic()
            done.set()

        self._done, self._reply, self._error = done, None, None
        threading.Thread(target=run, name=f"proposer-{iteration}", daemon=True).start()
        return self.pending

    def ready(self) -> bool:
        """Whether the pending proposal arrives at this boundary (without waiting)."""
        if self.pending is None:
            return False
        if self.pending.deadline is not None:
            return self.clock.now() >= self.pending.deadline
        return self._done.is_set()

    def take(self) -> Arrival[T]:
        """The pending proposal's reply, waiting out its latency and the proposer as needed; an error the
        proposer's work raised is raised here."""
        if self.pending is None:
            raise RuntimeError("no proposal in flight")
        start = time.monotonic()
        if self.pending.deadline is not None:
            self.clock.wait_until(self.pending.deadline)
        while not self._done.wait(0.1):  # short waits: a Ctrl-C lands at once
            pass
        request, self.pending = self.pending, None
        if self._error is not None:
            raise self._error
        return Arrival(request, self._reply, round(time.monotonic() - start, 3), self._replied_wall)

    def drop(self) -> None:
        """Forget the pending proposal (the run stops; its thread ends on its own)."""
        self.pending = None


class LaneLLM:
    """The run's model as a proposer sees it: every call waits for the accelerator lane's ``lock`` (held
    by the trainer while a unit runs), so the agent proposer's tries run between units, on the lane that
    owns the model, and are charged as before (to the iteration, ``proposer_rollouts``)."""

    def __init__(self, llm: Any, lock: Any):
        self._llm, self._lock = llm, lock

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._llm, name)
        if not callable(value):
            return value

        def locked(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return value(*args, **kwargs)

        return locked


# ------------------------------------------------------------------------------ measurements


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def lane_intervals(events: list[dict[str, Any]]) -> dict[str, list[tuple[float, float, str]]]:
    """The timeline of a ledger written with lanes: ``accelerator`` (start, end, what: weight, scoring,
    rescore, eval) and ``proposer`` (request, reply, the iteration) in seconds since the run started, and
    ``wait`` (the accelerator lane blocked on a proposer). Empty lists for a ledger without timings."""
    accel, proposer, wait = [], [], []
    for e in events:
        if "t_start" not in e:
            continue
        what = e["event"] if e["event"] != "unit" else (e.get("signals") or {}).get("kind", e.get("phase"))
        accel.append((e["t_start"], e["t_end"], "weight" if e.get("phase") == "weight" else str(what)))
        p = e.get("proposal")
        if p:
            proposer.append((p["requested_t"], p["replied_t"], f"iteration {p['iteration']}"))
            if p.get("waited_seconds"):
                wait.append((e["t_start"] - p["waited_seconds"], e["t_start"], "wait"))
    return {"accelerator": accel, "proposer": proposer, "wait": wait}


def lane_metrics(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What the overlap is measured by, from a ledger with lane timings (None without them):

    * ``accelerator_idle_share``: the share of the run's span (first unit's start to the last unit's
      end) in which the accelerator lane ran no unit or evaluation;
    * ``proposer_wait_share``: the share of that span in which it was blocked on a proposer's reply;
    * ``wall_per_cycle``: the span over the harness phases begun (cycles of weights + harness);
    * ``cycle_seconds``: each full cycle's wall-clock, from one harness phase's re-scoring to the next's;
      ``steady_idle_share``: the idle share over those full cycles (a run's first weight phase and its
      last proposal have nothing to overlap with, so the whole run's share is higher by their part);
    * ``version_gaps``: per scored iteration, the model versions between its proposer's traces and its
      scoring (``mean_version_gap``, ``max_version_gap``).
    """
    lanes = lane_intervals(events)
    accel = lanes["accelerator"]
    if not accel:
        return None
    span = max(b for _, b, _ in accel) - min(a for a, _, _ in accel)
    busy = _union([(a, b) for a, b, _ in accel])
    waited = sum(b - a for a, b, _ in lanes["wait"])
    starts = [
        e["t_start"]
        for e in events
        if e["event"] == "unit" and "t_start" in e and (e.get("signals") or {}).get("kind") == "rescore"
    ]
    cycles = len(starts)
    steady = None
    if cycles > 1:
        a, b = starts[0], starts[-1]
        inside = [(max(x, a), min(y, b)) for x, y, _ in accel if y > a and x < b]
        steady = round(1 - _union(inside) / (b - a), 4)
    gaps = [
        e["proposal"]["version_gap"]
        for e in events
        if e["event"] == "unit" and e.get("proposal") and "version_gap" in e["proposal"]
    ]
    return {
        "span_seconds": round(span, 2),
        "accelerator_idle_share": round(1 - busy / span, 4) if span > 0 else 0.0,
        "proposer_wait_share": round(waited / span, 4) if span > 0 else 0.0,
        "cycles": cycles,
        "wall_per_cycle": round(span / cycles, 2) if cycles else None,
        "cycle_seconds": [round(b - a, 2) for a, b in zip(starts, starts[1:], strict=False)],
        "steady_idle_share": steady,
        "version_gaps": gaps,
        "mean_version_gap": round(sum(gaps) / len(gaps), 3) if gaps else None,
        "max_version_gap": max(gaps) if gaps else None,
    }
