"""The README and docs are executed, not only read: every ```python and ```bash block runs on the CPU,
except those marked in the markdown, on the line before the block, with

    <!-- no-run: why (e.g. needs a GPU) -->

and a block may be run with small, stated overrides (the doc says so beside it) with

    <!-- run-with: OLD => NEW; OLD2 => NEW2 -->

The python blocks of one file run in order as one script (a page is one session: later blocks use
what earlier ones defined) in a fresh interpreter in a temporary folder; each bash line runs there too,
with the repository's paths and the `whale` command reachable. Also here: the numbers docs/RESULTS.md quotes
from the decisive grid are the committed results' (benchmarks/results/compare/decisive/compare.md)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"(?:<!-- (no-run|run-with): (.*?) -->\n)?```(python|bash)\n(.*?)```", re.S)


def blocks(doc: Path) -> list[tuple[str, str, str, int]]:
    """(language, code with its overrides applied, no-run reason or "", line) for every block of ``doc``."""
    text = doc.read_text(encoding="utf-8")
    out = []
    for m in BLOCK.finditer(text):
        marker, arg, lang, code = m.groups()
        line = text[: m.start(3)].count("\n") + 1
        if marker == "run-with":
            for pair in arg.split(";"):
                old, new = (part.strip() for part in pair.split("=>"))
                assert old in code, (
                    f"{doc.name}:{line}: run-with names {old!r}, which the block does not hold"
                )
                code = code.replace(old, new)
        out.append((lang, code, arg if marker == "no-run" else "", line))
    return out


def test_every_python_and_bash_block_is_run_or_marked_with_a_reason():
    """A block the test skips says why in the markdown; nothing is skipped silently."""
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in re.finditer(r"(<!-- no-run: (.*?) -->\n)?```(python|bash)\n", text):
            if m.group(1):
                assert len(m.group(2).strip()) > 10, f"{doc.name}: a no-run marker without a reason"
    counted = [b for doc in DOCS for b in blocks(doc)]
    assert sum(1 for b in counted if not b[2]) >= 5  # the docs show runnable code, and this test runs it


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    env["HF_HUB_OFFLINE"] = "1"
    env["COLUMNS"] = "200"
    return env


RUNNABLE = [doc for doc in DOCS if any(not b[2] for b in blocks(doc))]


@pytest.mark.slow
@pytest.mark.parametrize("doc", RUNNABLE, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_docs_code_blocks_run(doc, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    for name in ("tests", "examples", "configs", "benchmarks"):  # the paths the docs name, read-only use
        (work / name).symlink_to(ROOT / name)
    env = _env(tmp_path)
    python = [code for lang, code, skip, _ in blocks(doc) if lang == "python" and not skip]
    if python:
        script = work / "doc_blocks.py"
        script.write_text("\n\n".join(python))
        proc = subprocess.run(
            [sys.executable, str(script)], cwd=work, env=env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, f"{doc.name}'s python blocks failed:\n{proc.stderr[-3000:]}"
    for lang, code, skip, line in blocks(doc):
        if lang != "bash" or skip:
            continue
        proc = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", code],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, (
            f"{doc.name}:{line} failed:\n{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}"
        )
    shutil.rmtree(work / "runs", ignore_errors=True)


# ------------------------------------------------------- the numbers of docs/RESULTS.md are the results'

COMPARE = ROOT / "benchmarks" / "results" / "compare" / "decisive" / "compare.md"
NUMBER = re.compile(r"[+\-−]?\d+(?:\.\d+)?")


def _decisive_section() -> str:
    results = (ROOT / "docs" / "RESULTS.md").read_text(encoding="utf-8")
    start = results.index("## Method comparison at equal rollout budgets")
    end = results.find("\n## ", start + 1)
    return results[start : None if end < 0 else end]


def test_the_readme_schedule_ablation_rows_are_compare_mds():
    committed = COMPARE.read_text(encoding="utf-8")
    rows = [line for line in _decisive_section().splitlines() if re.match(r"\| 0\.[26] \| [26] \|", line)]
    assert len(rows) == 4
    for row in rows:
        assert row in committed, f"RESULTS.md's schedule ablation row is not compare.md's: {row}"


def test_every_number_in_the_readmes_decisive_tables_is_in_the_committed_results():
    """Each number of a table row (a mean, an SD, an interval end, a seed count, rollouts) appears in
    compare.md, as written there or rounded to a whole number (the ledger table rounds steps)."""
    have = {n.lstrip("+-−") for n in NUMBER.findall(COMPARE.read_text(encoding="utf-8"))}
    have |= {str(round(float(n))) for n in have}
    stale = []
    for row in _decisive_section().splitlines():
        if row.startswith("| ") and not row.startswith("|---"):
            stale += [f"{n} in {row[:60]}" for n in NUMBER.findall(row) if n.lstrip("+-−") not in have]
    assert not stale, stale
