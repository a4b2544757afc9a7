"""A search killed with SIGKILL mid-iteration resumes without losing or duplicating any candidate: twice
killed (while proposing and checking, then while scoring) and resumed, it ends with exactly the archive
and the step records of an uninterrupted run with the same seed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from whale_train.meta_harness import Archive
from whale_train.meta_harness.archive import STAGING_DIR

ROOT = Path(__file__).resolve().parents[2]

DRIVER = """
import sys, time
sys.path.insert(0, {root!r})
from tests.train.test_meta_harness import FAST, MATH, tool_shy_math_model
from whale_train.meta_harness import HarnessSearch, MetaHarnessConfig

llm = tool_shy_math_model()
complete = llm.complete
llm.complete = lambda requests: (time.sleep(0.01), complete(requests))[1]  # a slower model: time to kill
HarnessSearch(MetaHarnessConfig(**FAST), sys.argv[1], llm, MATH).run(3)
print("finished")
"""


def start(driver: Path, archive: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(driver), str(archive)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def kill_when(proc: subprocess.Popen, marker: Path) -> None:
    while proc.poll() is None:
        if marker.exists():
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            return
        time.sleep(0.005)
    raise AssertionError(f"the run ended before {marker} appeared: {proc.stderr.read().decode()[-2000:]}")


def finish(proc: subprocess.Popen) -> None:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0 and b"finished" in out, err.decode()[-2000:]


def snapshot(folder: Path) -> dict:
    """Everything a run decides, without timestamps and timings."""
    archive = Archive(folder, readonly=True)
    cands = {}
    for c in archive.candidates():
        meta = {k: v for k, v in c.meta.items() if k not in ("created",)}
        evals = {}
        for v in c.versions():
            e = c.eval(v)
            evals[v] = {k: e[k] for k in ("mean", "per_task", "rollouts", "origin", "failures", "llm_calls")}
        cands[c.id] = {"meta": meta, "source": c.source, "evals": evals, "traces": len(c.traces(0))}
    records = [
        {k: v for k, v in r.items() if k not in ("wall_seconds", "created")} for r in archive.records()
    ]
    return {"candidates": cands, "records": records}


@pytest.mark.slow
def test_sigkill_mid_iteration_then_resume_equals_an_uninterrupted_run(tmp_path):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER.format(root=str(ROOT)))

    clean = tmp_path / "clean"
    finish(start(driver, clean))

    killed = tmp_path / "killed"
    kill_when(start(driver, killed), killed / "i002-c1" / "meta.json")  # while proposing / checking
    assert not (killed / "search" / "iterations" / "002.json").exists()
    assert (killed / "search" / "iterations" / "001.json").exists()
    kill_when(start(driver, killed), killed / "i003-c0" / "evals" / "0.json")  # while scoring
    assert not (killed / "search" / "iterations" / "003.json").exists()
    finish(start(driver, killed))

    assert not (killed / STAGING_DIR).exists()
    assert not [p for p in killed.rglob("*") if ".tmp-" in p.name]
    a, b = snapshot(clean), snapshot(killed)
    ids = ["h0"] + [f"i00{i}-c{s}" for i in (1, 2, 3) for s in range(3)]
    assert list(a["candidates"]) == list(b["candidates"]) == ids  # none lost, none duplicated
    assert a == b
    assert [r["kind"] for r in b["records"]] == ["rescore", "iteration", "iteration", "iteration"]
    total = sum(r["rollouts"] for r in b["records"])
    assert total == sum(e["rollouts"] for c in b["candidates"].values() for e in c["evals"].values())
    assert json.loads((killed / "search" / "iterations" / "003.json").read_text())["iteration"] == 3
