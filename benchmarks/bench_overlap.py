"""Overlapped alternation against strict alternation, on the shipped model: the wall-clock of the same
rollout budget, and the accelerator lane's idle share, with a proposer that takes as long per iteration
as a weight phase takes (its latency, set at each request, is the last weight phase's steps x their
median time on this machine: the same rule in both runs). One harness iteration per phase, the offline
proposer, 2 harness tasks (scoring short beside a weight phase, as on a GPU at the paper's settings).

Over n cycles the first weight phase and the last proposal have nothing to overlap with, so the whole
run can at best take (n + 1) / 2n of strict alternation's time (docs/TRAINING.md): ``make bench`` runs
10 cycles at the paper's E = 0.6 epochs (9 RSFT steps a weight phase), where that bound is 0.55, in the
order strict, overlap, overlap, strict; ``run_ratio`` is overlap's wall-clock over strict's, summed over
both pairs. The numbers are in the benchmark's extra_info and printed; ``make test`` runs one short pair
and checks only what the lanes record."""

from __future__ import annotations

from statistics import median

import pytest

import whale_envs  # noqa: F401
from whale_train.llm import SHIPPED_MODEL
from whale_train.report import read_ledger
from whale_train.trainer import Run, TrainConfig
from whale_train.trainer.lanes_run import RunLanes


def _config(method: str, weight_epochs: float, budget: int) -> TrainConfig:
    return TrainConfig.from_dict(
        {
            "model": str(SHIPPED_MODEL),
            "method": method,
            "env": "whale/Math-v0",
            "tasks": "generated?difficulty=1&size=80",
            "budget_rollouts": budget,
            "report_to": "none",
            # weight phases of weight_epochs; harness phases of a re-scoring and one iteration; the
            # proposer's latency is set per request (below)
            "schedule": {"weight_epochs": weight_epochs, "harness_iterations": 2, "proposer_latency": 0.0},
            "rsft": {"batch_tasks": 4, "samples": 2},
            "search": {
                "candidates": 1,
                "harness_tasks": 2,
                "frontier_size": 1,
                "check_tasks": 2,
                "concurrency": 8,
            },
            "eval": {"k": 1, "limit": 4, "every": 1_000_000},  # at the start and the end only, in both
            "concurrency": 8,
        }
    )


def _as_long_as_a_weight_phase(ask):
    def request(self, iteration, version, at=None, at_t=None):
        steps = [e for e in read_ledger(self.dir) if e["event"] == "unit" and e["phase"] == "weight"]
        last = [u for u in steps if u["phase_index"] == steps[-1]["phase_index"]]
        self.lane.latency = len(last) * median(u["seconds"] for u in last)
        return ask(self, iteration, version, at, at_t)

    return request


@pytest.mark.benchmark(group="overlap")
def test_overlap_against_strict_wall_clock(benchmark, tmp_path, monkeypatch):
    small = benchmark.disabled  # `make test`: two short cycles
    weight_epochs, budget = (0.1, 64) if small else (0.6, 800)
    monkeypatch.setattr(RunLanes, "_request", _as_long_as_a_weight_phase(RunLanes._request))
    # ABBA (strict, overlap, overlap, strict): a machine that drifts during the runs weighs on both alike
    order = ["whale", "whale-overlap"] if small else ["whale", "whale-overlap", "whale-overlap", "whale"]
    runs: dict[str, list[dict]] = {"whale": [], "whale-overlap": []}

    def all_runs():
        for i, method in enumerate(order):
            out = tmp_path / f"{i}-{method}"
            Run(_config(method, weight_epochs, budget), out, log=lambda *_: None).run()
            runs[method].append(read_ledger(out)[-1]["lanes"])

    benchmark.pedantic(all_runs, rounds=1, iterations=1)
    strict, overlap = runs["whale"][0], runs["whale-overlap"][0]
    n = overlap["cycles"]

    def total(method: str, key: str) -> float:
        return sum(r[key] for r in runs[method])

    def cycles(method: str) -> list[float]:
        return [c for r in runs[method] for c in r["cycle_seconds"]]

    numbers = {
        "cycles": n,
        "run_ratio": round(total("whale-overlap", "span_seconds") / total("whale", "span_seconds"), 3),
        "run_ratios": [
            round(o["span_seconds"] / s["span_seconds"], 3)
            for s, o in zip(runs["whale"], runs["whale-overlap"], strict=True)
        ],
        "run_bound": round((n + 1) / (2 * n), 3),
        "cycle_ratio": round(median(cycles("whale-overlap")) / median(cycles("whale")), 3)
        if cycles("whale") and cycles("whale-overlap")
        else None,
        "span_seconds": {m: [r["span_seconds"] for r in runs[m]] for m in runs},
        "idle_share": {m: [r["accelerator_idle_share"] for r in runs[m]] for m in runs},
        "steady_idle_share": {m: [r["steady_idle_share"] for r in runs[m]] for m in runs},
        "mean_version_gap": overlap["mean_version_gap"],
    }
    benchmark.extra_info.update(numbers)
    print(f"\noverlap against strict alternation: {numbers}")
    # The same budget, not always the same cycles: a candidate scored under newer weights than its traces
    # re-scores the incumbent there (charged to its iteration), which overlap pays whenever a proposal
    # outlasts the weight phase beside it (the short version's 1-2 steps are shorter than the proposer
    # lane's own validation and stand-ins).
    assert all(r["cycles"] >= 2 for r in runs["whale"] + runs["whale-overlap"]), {
        m: [r["cycles"] for r in runs[m]] for m in runs
    }
    assert all(r["version_gaps"] and set(r["version_gaps"]) == {0} for r in runs["whale"])
    assert overlap["span_seconds"] > 0 and strict["span_seconds"] > 0
