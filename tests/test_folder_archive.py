"""``tests/folder_archive.py``: a packed folder unpacks to the same files, and packs again to the same
bytes (so a committed fixture archive can be rebuilt and checked)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from tests.folder_archive import pack, unpack

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_folder_round_trips_to_the_same_files_and_the_same_bytes(tmp_path):
    folder = tmp_path / "run"
    (folder / "sub" / "deeper").mkdir(parents=True)
    (folder / "b.txt").write_text("b\n")
    (folder / "a.bin").write_bytes(bytes(range(256)))
    (folder / "sub" / "deeper" / "c.json").write_text('{"c": 1}')
    (folder / ".lock").write_bytes(b"")
    archive = tmp_path / "run.tar.gz"
    archive.write_bytes(pack(folder))
    out = unpack(archive, tmp_path / "out")
    assert out == tmp_path / "out" / "run" and tree(out) == tree(folder) and len(tree(out)) == 4
    (out / "b.txt").touch()  # times, owners and modes of the machine are not packed
    assert pack(out) == archive.read_bytes()
    (out / "b.txt").write_text("changed\n")
    assert pack(out) != archive.read_bytes()


def test_the_committed_old_run_archive_is_byte_reproducible(tmp_path):
    archive = FIXTURES / "old_run.tar.gz"
    out = unpack(archive, tmp_path)
    assert (out / "state.json").is_file() and (out / "archive" / "h0" / "harness.py").is_file()
    assert pack(out) == archive.read_bytes()


def test_an_archive_of_two_folders_is_refused_in_one_line(tmp_path):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name in ("one/x", "two/y"):
            tar.addfile(tarfile.TarInfo(name), io.BytesIO(b""))
    archive = tmp_path / "two.tar.gz"
    archive.write_bytes(raw.getvalue())
    with pytest.raises(ValueError, match=r"two\.tar\.gz: holds \['one', 'two'\], not one folder"):
        unpack(archive, tmp_path / "out")
