"""docs/ARCHITECTURE.md's count of the files one episode runs is what a profiler finds
(benchmarks/episode_files.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _doc_list() -> tuple[int, list[str]]:
    """The count the doc claims for the trusted process and the files it lists under it."""
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = doc[doc.index("## The life of an episode") : doc.index("## Layering")]
    claim = re.search(r"\*\*(\d+) files in the trusted process\*\*:\n\n(.*?)\n\n", section, re.S)
    assert claim, "the section no longer states the trusted process's count"
    return int(claim.group(1)), sorted(set(re.findall(r"`([\w/]+\.py)`", claim.group(2))))


@pytest.mark.slow
def test_the_life_of_an_episode_lists_the_files_its_code_runs_in():
    claimed, listed = _doc_list()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "episode_files.py")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    *found, count = proc.stdout.strip().splitlines()
    assert count == f"{len(found)} files"
    assert sorted(found) == listed and claimed == len(listed), (sorted(set(found) ^ set(listed)), claimed)
