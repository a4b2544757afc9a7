"""Red team of the task-file loaders: a 100 KB ``.jsonl.gz`` with one 100 MB row used to cost
400 MB in the trusted process, and a CSV field over 128 KB was a raw ``_csv.Error`` traceback. Rows are
now read a capped line at a time and compressed files under a decompressed-size cap, so the cap is hit
before the memory is spent; every bad file is one TaskSourceError line naming the file and row."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from whale_envs.tabular import read_rows
from whale_envs.tasks import MAX_ROW_CHARS, TaskSourceError, json_lines


def gz_bomb_row(path: Path, row_mb: int = 100) -> Path:
    """A ``.jsonl.gz`` of one good row, then one ``row_mb`` MB row (about 100 KB compressed)."""
    chunk = b"a" * (1 << 20)
    with gzip.open(path, "wb", compresslevel=9) as fh:
        fh.write(b'{"problem": "1+1", "answer": "2", "title": "t", "text": "x"}\n{"problem": "')
        for _ in range(row_mb):
            fh.write(chunk)
        fh.write(b'", "answer": "2"}\n')
    return path


def one_line(exc: pytest.ExceptionInfo, *needles: str) -> str:
    message = str(exc.value)
    assert "\n" not in message and len(message) < 400, message
    for needle in needles:
        assert needle in message, message
    return message


MEASURE = textwrap.dedent(
    """
    import json, resource, sys, tracemalloc
    from whale_envs.tabular import read_rows
    from whale_envs.tasks import TaskSourceError
    tracemalloc.start()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        for _ in read_rows(sys.argv[1], "redteam"):
            pass
        error = None
    except TaskSourceError as exc:
        error = str(exc)
    peak = tracemalloc.get_traced_memory()[1]
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print(json.dumps({"error": error, "peak": peak, "rss_kb": grown}))
    """
)


def test_gz_bomb_row_is_refused_with_bounded_memory(tmp_path):
    bomb = gz_bomb_row(tmp_path / "bomb.jsonl.gz")
    assert bomb.stat().st_size < 200_000  # ~100 KB on disk, 100 MB decompressed
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, str(bomb)], capture_output=True, text=True, timeout=120, check=True
    )
    result = json.loads(out.stdout)
    print(
        f"gz bomb row: tracemalloc peak {result['peak'] / 2**20:.1f} MiB, max RSS grew {result['rss_kb'] / 1024:.1f} MiB"
    )
    assert result["error"] and "\n" not in result["error"]
    assert f"{bomb}, line 2: longer than {MAX_ROW_CHARS} characters" in result["error"]
    assert result["peak"] < 32 << 20  # was ~400 MB; the cap is 1 MiB characters (4 MiB as a str at most)
    assert result["rss_kb"] < 64 << 10


def test_decompressed_size_cap_names_file_and_line(tmp_path, monkeypatch):
    path = tmp_path / "many.jsonl.gz"
    with gzip.open(path, "wb") as fh:
        for i in range(50_000):
            fh.write(b'{"problem": "%d+1", "answer": "x"}\n' % i)
    monkeypatch.setenv("WHALE_MAX_DECOMPRESSED_BYTES", "100000")
    with pytest.raises(TaskSourceError) as exc:
        for _ in read_rows(path, "redteam"):
            pass
    message = one_line(exc, str(path), "decompresses to over 100000 bytes", "WHALE_MAX_DECOMPRESSED_BYTES")
    expected = gzip.decompress(path.read_bytes())[:100_000].count(b"\n") + 1  # the line the cap fell in
    assert f"{path}, line {expected}: " in message
    monkeypatch.delenv("WHALE_MAX_DECOMPRESSED_BYTES")
    assert sum(1 for _ in read_rows(path, "redteam")) == 50_000  # 1.8 MB: under the 64 MiB default


def test_rows_up_to_the_cap_pass_and_one_over_fails(tmp_path, monkeypatch):
    monkeypatch.setenv("WHALE_MAX_ROW_CHARS", "40")
    path = tmp_path / "rows.jsonl"
    ok = json.dumps({"problem": "x" * 25})  # 40 characters exactly
    assert len(ok) == 40
    path.write_text(ok + "\n" + ok + "\n")
    assert [r for r, _, _ in read_rows(path, "redteam")] == [1, 2]
    path.write_text(ok + "\n" + json.dumps({"problem": "x" * 26}) + "\n")
    with pytest.raises(TaskSourceError) as exc:
        list(read_rows(path, "redteam"))
    one_line(exc, f"{path}, line 2: longer than 40 characters")
    assert [v for _, v in json_lines(['{"a": 1}', "", '{"b": 2}'], "list")] == [{"a": 1}, {"b": 2}]


@pytest.mark.parametrize("suffix", [".csv", ".csv.gz"])
def test_long_csv_field_is_one_line(tmp_path, suffix):
    path = tmp_path / f"puzzles{suffix}"
    text = (
        'PuzzleId,FEN,Moves,Rating,Themes\n00008,fen,e2e4,1500,mate\n00009,"' + "x" * 200_000 + '",e2e4,1,m\n'
    )
    if suffix.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    with pytest.raises(TaskSourceError) as exc:
        list(read_rows(path, "lichess"))
    one_line(exc, f"{path}, row 3", "field larger than field limit")  # was a raw _csv.Error


def test_long_csv_field_through_the_cli_is_one_line_exit_2(tmp_path, capsys):
    from whale_train.cli import main

    path = tmp_path / "puzzles.csv"
    path.write_text('PuzzleId,FEN,Moves,Rating,Themes\n00008,"' + "x" * 200_000 + '",e2e4,1500,mate\n')
    try:
        code = main(["tasks", "--env", "whale/Chess-v0", "--tasks", f"lichess:{path}"])
    except SystemExit as exc:
        code = int(exc.code)
    captured = capsys.readouterr()
    assert code == 2 and "Traceback" not in captured.err + captured.out
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and f"{path}, row 2" in err, err


def test_search_loaders_keep_the_caps(tmp_path, monkeypatch):
    from whale_envs.search.sources import load_corpus

    tsv = tmp_path / "wiki.tsv"
    tsv.write_text("id\ttitle\ttext\n1\tA\t" + "y" * 200_000 + "\n")
    with pytest.raises(TaskSourceError) as exc:
        load_corpus(tsv)
    one_line(exc, f"{tsv}, row 2", "field larger than field limit")
    bomb = gz_bomb_row(tmp_path / "wiki.jsonl.gz", row_mb=4)
    with pytest.raises(TaskSourceError) as exc:
        load_corpus(bomb)
    one_line(exc, f"{bomb}, line 2: longer than")


def test_bundled_rows_fit_the_cap():
    """The default caps admit every bundled file (the longest JSON Lines row is MATH-500's 4.1 KB)."""
    from whale_envs.data import bundled_path

    root = bundled_path("math500").parent
    longest = max(
        max((len(line) for line in p.read_text(encoding="utf-8").splitlines()), default=0)
        for p in root.rglob("*.jsonl")
    )
    assert longest * 100 < MAX_ROW_CHARS
    for p in list(root.rglob("*.jsonl")) + list(root.rglob("*.csv")):
        assert sum(1 for _ in read_rows(p, "bundled")) > 0
