"""A folder packed as one byte-reproducible ``.tar.gz`` (sorted names, no times, owners or modes of the
machine that packed it), and unpacked again: how a committed run folder travels in ``tests/fixtures``
(its files stay exactly as written, but are not source files of the tree: no linter or duplicate finder
reads them)."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path


def _member(name: str, size: int, is_dir: bool) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE if is_dir else tarfile.REGTYPE
    info.size = 0 if is_dir else size
    info.mode = 0o755 if is_dir else 0o644
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    return info


def pack(folder: Path) -> bytes:
    """``folder``'s tree (named from its own name down) as gzip-compressed tar bytes; the same tree always
    packs to the same bytes."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in [folder, *sorted(folder.rglob("*"), key=lambda p: p.relative_to(folder).parts)]:
            name = path.relative_to(folder.parent).as_posix()
            if path.is_dir():
                tar.addfile(_member(name, 0, True))
            else:
                data = path.read_bytes()
                tar.addfile(_member(name, len(data), False), io.BytesIO(data))
    packed = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=packed, mtime=0) as gz:
        gz.write(raw.getvalue())
    return packed.getvalue()


def unpack(archive: Path, into: Path) -> Path:
    """Unpacks ``archive`` (made by :func:`pack`) below ``into`` and returns the folder it held."""
    with tarfile.open(archive, mode="r:gz") as tar:
        top = {Path(name).parts[0] for name in tar.getnames()}
        if len(top) != 1:
            raise ValueError(f"{archive}: holds {sorted(top)}, not one folder")
        tar.extractall(into, filter="data")
    return into / top.pop()


if __name__ == "__main__":  # python -m tests.folder_archive FOLDER ARCHIVE: (re)pack a fixture
    import sys

    Path(sys.argv[2]).write_bytes(pack(Path(sys.argv[1])))
