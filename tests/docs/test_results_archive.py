"""benchmarks/results.py: the run outputs the README's numbers are rebuilt from live in one deterministic
archive (benchmarks/results.tar.xz), the tree keeps what the README and docs cite, `unpack` puts the
archive's files back where the commands look for them, and the decisive grid's table rebuilds from them
byte for byte. Every test unpacks into its own temporary folder: nothing is written into the tree."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("whale_results_archive", ROOT / "benchmarks" / "results.py")
results = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(results)

DECISIVE = ROOT / "benchmarks" / "results" / "compare" / "decisive"
CITING = [
    ROOT / "README.md",
    ROOT / "Makefile",
    *sorted((ROOT / "docs").rglob("*.md")),
    *sorted((ROOT / "benchmarks").glob("*.py")),
    *sorted((ROOT / "benchmarks" / "results").rglob("*.md")),
    *sorted((ROOT / "configs").rglob("*.yaml")),
]
CITED = re.compile(r"benchmarks/results(?:/[\w.\-]+)*")


def _git(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the git checkout")
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def _tracked() -> list[str]:
    return _git("ls-files", "benchmarks/results").stdout.split()


@pytest.fixture(scope="module")
def archived() -> dict[str, bytes]:
    return results.read_archive()


def test_the_tree_keeps_the_cited_files_and_the_archive_the_rest(archived):
    tracked = _tracked()
    assert 0 < len(tracked) <= 200
    assert not [t for t in tracked if results._archived(t.removeprefix("benchmarks/results/"))]
    assert len(archived) > 1000 and all(results._archived(n) for n in archived)
    assert results.ARCHIVE.stat().st_size < 2_000_000  # xz of ~14 MB of ledgers and summaries


def test_git_ignores_the_unpacked_folders_and_nothing_the_tree_keeps(archived):
    name = next(iter(archived))
    assert _git("check-ignore", "-q", f"benchmarks/results/{name}").returncode == 0
    kept = _git(
        "check-ignore", "--no-index", *_tracked(), "benchmarks/results.tar.xz", "benchmarks/results.py"
    )
    assert kept.returncode == 1 and not kept.stdout, kept.stdout  # 1: none of them is ignored


def test_every_results_path_the_docs_cite_is_in_the_tree_or_the_archive(archived):
    tracked = set(_tracked())
    folders = {str(Path(t).parent.as_posix()) for t in tracked}
    folders |= {p.as_posix() for t in tracked for p in Path(t).parents}
    in_archive = {f"benchmarks/results/{n}" for n in archived}
    archive_folders = {p.as_posix() for n in in_archive for p in Path(n).parents}
    missing = []
    for doc in CITING:
        for cited in CITED.findall(doc.read_text(encoding="utf-8")):
            cited = cited.rstrip(".")
            if not (cited in tracked or cited in folders or cited in in_archive or cited in archive_folders):
                missing.append(f"{doc.relative_to(ROOT)}: {cited}")
    assert not missing, missing


def test_unpack_is_idempotent_and_never_overwrites_a_file_it_did_not_write(tmp_path, archived):
    dest = tmp_path / "results"
    assert f"{len(archived)} written" in results.unpack(dest)
    assert results.on_disk(dest).keys() == archived.keys()
    assert "0 written" in results.unpack(dest)
    name = next(iter(archived))
    (dest / name).write_text("a run not packed yet")
    with pytest.raises(SystemExit, match="differ"):
        results.unpack(dest)
    assert (dest / name).read_text() == "a run not packed yet"
    assert "1 written" in results.unpack(dest, force=True)
    assert (dest / name).read_bytes() == archived[name]


def test_the_command_unpacks_into_a_given_folder(tmp_path, archived):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "results.py"), "unpack", "--dest", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert len(results.on_disk(tmp_path)) == len(archived)


def test_pack_refuses_to_drop_files_not_unpacked(tmp_path):
    archive = tmp_path / "results.tar.xz"
    shutil.copyfile(results.ARCHIVE, archive)
    with pytest.raises(SystemExit, match="unpack"):
        results.pack(tmp_path / "empty", archive)
    assert archive.read_bytes() == results.ARCHIVE.read_bytes()


@pytest.mark.slow
def test_packing_the_unpacked_files_again_gives_the_committed_bytes(tmp_path):
    """Deterministic: sorted names, fixed mode, mtime and owners, a fixed xz preset."""
    results.unpack(tmp_path / "results")
    archive = tmp_path / "results.tar.xz"
    shutil.copyfile(results.ARCHIVE, archive)
    os.utime(tmp_path / "results", (1, 1))  # times on disk do not matter
    assert "0 added, 0 changed" in results.pack(tmp_path / "results", archive)
    assert archive.read_bytes() == results.ARCHIVE.read_bytes()


@pytest.mark.slow
def test_the_decisive_table_rebuilds_byte_identical_from_the_archive(tmp_path):
    """What the README lists: `make results`, then `whale compare configs/compare/decisive.yaml --hours 0`
    (here with the record unpacked into a temporary folder) writes the committed compare.md and
    compare.json, running nothing."""
    results.unpack(tmp_path / "results")
    data = yaml.safe_load((ROOT / "configs" / "compare" / "decisive.yaml").read_text())
    record = Path(data["record"])
    data["record"] = str(tmp_path / "results" / record.relative_to("benchmarks/results"))
    for d in data["domains"].values():
        d["config"] = str(ROOT / d["config"])
    grid = tmp_path / "decisive.yaml"
    grid.write_text(yaml.safe_dump(data, sort_keys=False))
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "whale_train.cli", "compare", str(grid), "--hours", "0", "--out", str(out)],
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "179 finished, 0 to continue, 0 to start" in proc.stdout + proc.stderr
    for name in ("compare.md", "compare.json"):
        assert (out / name).read_bytes() == (DECISIVE / name).read_bytes(), name
