"""Overlapped alternation (issue 53): the proposer lane, its clocks and measurements, and whole runs that
overlap a harness phase's proposer with the next weight phase (wall-clock against strict alternation, an
instant proposer, kill and resume in the middle of an overlapped phase)."""

from __future__ import annotations

import threading
import time

import pytest

from whale_train.lanes import LaneLLM, ProposerLane, RolloutClock, WallClock, lane_metrics, make_clock
from whale_train.schedule import ScheduleConfig, make_schedule

# ------------------------------------------------------------------------------ the lane alone


def test_a_rollout_clock_arrives_after_the_rollouts_spent_and_jumps_when_the_lane_waits():
    clock = RolloutClock(10)
    lane = ProposerLane(clock, latency=100)
    lane.request(1, 0, lambda: "reply")
    assert lane.pending.deadline == 110 and not lane.ready()
    clock.spent(64)
    assert not lane.ready()
    clock.spent(64)
    assert lane.ready()
    arrival = lane.take()
    assert (arrival.reply, arrival.request.iteration, lane.pending) == ("reply", 1, None)
    # the accelerator lane has nothing left to do: it waits, and the clock jumps to the deadline
    lane.request(2, 1, lambda: "second")
    assert lane.take().reply == "second" and clock.now() == 138 + 100


def test_without_an_injected_latency_a_reply_arrives_when_the_proposer_answers():
    go = threading.Event()
    lane = ProposerLane(WallClock(), latency=None)
    lane.request(1, 0, lambda: go.wait(5) and "late")
    time.sleep(0.05)
    assert not lane.ready()
    go.set()
    deadline = time.monotonic() + 5
    while not lane.ready() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert lane.ready() and lane.take().reply == "late"


def test_a_wall_latency_is_waited_out_and_measured_and_a_proposer_error_reaches_the_trainer():
    lane = ProposerLane(WallClock(), latency=0.3)
    lane.request(1, 0, lambda: "x")
    arrival = lane.take()
    assert arrival.reply == "x" and 0.25 <= arrival.waited_seconds < 2
    lane.request(2, 0, lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        lane.take()
    assert lane.pending is None


def test_a_resumed_request_keeps_its_deadline_and_clocks_are_named():
    clock = make_clock("rollouts", start=500)
    lane = ProposerLane(clock, latency=200)
    assert lane.request(3, 2, lambda: None, requested_at=400).deadline == 600
    assert not lane.ready()
    clock.spent(100)
    assert lane.ready()
    with pytest.raises(ValueError, match="unknown clock 'sundial'"):
        make_clock("sundial")


def test_the_proposers_model_calls_wait_for_the_accelerator_lane():
    class Model:
        version = 3

        def complete(self, prompt):
            return prompt.upper()

    lock = threading.Lock()
    llm = LaneLLM(Model(), lock)
    assert llm.version == 3 and llm.complete("a") == "A"
    got = []
    with lock:  # a unit runs: the proposer's try waits for its end
        t = threading.Thread(target=lambda: got.append(llm.complete("b")))
        t.start()
        time.sleep(0.1)
        assert got == []
    t.join(5)
    assert got == ["B"]


def test_lane_metrics_measure_idle_wait_cycles_and_gaps():
    events = [
        {"event": "eval", "t_start": 0.0, "t_end": 1.0},
        {"event": "unit", "phase": "weight", "t_start": 1.0, "t_end": 3.0, "signals": {}},
        {"event": "unit", "phase": "harness", "t_start": 3.0, "t_end": 4.0, "signals": {"kind": "rescore"}},
        {"event": "unit", "phase": "weight", "t_start": 4.0, "t_end": 6.0, "signals": {}},
        # waited 2 s (6 -> 8) for the proposer asked at 4, who answered at 8
        {
            "event": "unit",
            "phase": "harness",
            "t_start": 8.0,
            "t_end": 10.0,
            "signals": {"kind": "iteration"},
            "proposal": {
                "iteration": 1,
                "requested_t": 4.0,
                "replied_t": 8.0,
                "waited_seconds": 2.0,
                "version_gap": 1,
            },
        },
    ]
    m = lane_metrics(events)
    assert m["span_seconds"] == 10.0 and m["accelerator_idle_share"] == pytest.approx(0.2)
    assert m["proposer_wait_share"] == pytest.approx(0.2) and m["cycles"] == 1 and m["wall_per_cycle"] == 10.0
    assert m["version_gaps"] == [1] and m["max_version_gap"] == 1
    assert lane_metrics([{"event": "unit", "phase": "weight", "rollouts": 8}]) is None


def test_overlap_is_refused_for_a_method_that_does_not_alternate_and_bad_settings_are_named():
    with pytest.raises(ValueError, match="'weight-only' does not alternate"):
        make_schedule("weight-only", ScheduleConfig(overlap=True))
    make_schedule("adaptive", ScheduleConfig(overlap=True))
    for field, value, words in [
        ("max_version_gap", -1, "max_version_gap must be >= 0"),
        ("proposer_latency", -2.0, "proposer_latency must be >= 0"),
        ("latency_clock", "sundial", "latency_clock must be one of wall, rollouts"),
    ]:
        with pytest.raises(ValueError, match=words):
            ScheduleConfig(**{field: value}).validate()
