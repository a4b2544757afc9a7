"""The run outputs behind the README's and docs' numbers, kept as one archive instead of a thousand files.

    python benchmarks/results.py unpack     # `make results`: the archived folders, in place
    python benchmarks/results.py check      # do the folders on disk hold exactly the archive's files?
    python benchmarks/results.py list       # the archive's files
    python benchmarks/results.py pack       # maintainers: after adding runs to an archived folder

``benchmarks/results/`` keeps in the tree what the README and docs cite: tables (``compare.md``),
summaries (``compare.json``, ``results.json``), plots and the accepted harnesses. The raw outputs those
are rebuilt from, the folders of ``ARCHIVED`` (the decisive and overlap grids' records: every finished run's config,
ledger, state and evaluation summaries), live in ``benchmarks/results.tar.xz``, and git ignores them
once unpacked. After ``unpack`` every command the README lists finds them where it always did, e.g.
``whale compare configs/compare/decisive.yaml --hours 0`` rebuilds ``compare.md`` byte for byte.

The archive is deterministic: names sorted, every member a regular file with mode 0644, mtime 0,
owner 0/0 and no owner names, xz at a fixed preset; packing the same files again gives the same bytes.
Only the standard library is used, so it runs before the package is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import lzma
import os
import sys
import tarfile
from pathlib import Path, PurePosixPath

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
ARCHIVE = HERE / "results.tar.xz"
#: The folders under ``benchmarks/results`` that live in the archive (and that .gitignore ignores).
ARCHIVED = ("compare/decisive/runs", "compare/overlap/runs")
PRESET = 9 | lzma.PRESET_EXTREME


def _archived(name: str) -> bool:
    """Whether ``name`` (a path relative to the results folder) lies in an archived folder."""
    return any(name.startswith(folder + "/") for folder in ARCHIVED)


def _safe(name: str) -> bool:
    path = PurePosixPath(name)
    return not path.is_absolute() and ".." not in path.parts and _archived(name)


def on_disk(root: Path = RESULTS) -> dict[str, Path]:
    """The files of the archived folders under ``root``, by their name in the archive (hidden ones, e.g. a
    record's ``.<run>.partial`` folder mid-copy, left out)."""
    files = {}
    for folder in ARCHIVED:
        base = root / folder
        if not base.is_dir():
            continue
        for path in base.rglob("*"):
            rel = path.relative_to(root).as_posix()
            if path.is_file() and not any(part.startswith(".") for part in PurePosixPath(rel).parts):
                files[rel] = path
    return dict(sorted(files.items()))


def read_archive(archive: Path = ARCHIVE) -> dict[str, bytes]:
    """Every file of the archive, by name; ValueError on a member that is not a regular file in an
    archived folder (the archive is only ever written by ``pack``)."""
    out = {}
    with tarfile.open(archive, "r:xz") as tar:
        for member in tar:
            if not member.isreg() or not _safe(member.name):
                raise ValueError(f"{archive}: unexpected member {member.name!r}")
            out[member.name] = tar.extractfile(member).read()
    return out


def archive_bytes(files: dict[str, bytes]) -> bytes:
    """The deterministic .tar.xz of ``files`` (name -> content)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name in sorted(files):
            data = files[name]
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    return lzma.compress(raw.getvalue(), format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=PRESET)


def pack(root: Path = RESULTS, archive: Path = ARCHIVE) -> str:
    """Write the archived folders under ``root`` to ``archive``. Refuses when a file of the present archive
    is missing on disk (packing a tree never unpacked would drop those runs): ``unpack`` first."""
    files = {name: path.read_bytes() for name, path in on_disk(root).items()}
    old = read_archive(archive) if archive.exists() else {}
    missing = sorted(set(old) - set(files))
    if missing:
        raise SystemExit(
            f"pack: {len(missing)} file(s) of {archive.name} are not on disk (e.g. {missing[0]}); "
            "run `python benchmarks/results.py unpack` first, so packing keeps them"
        )
    if not files:
        raise SystemExit(f"pack: nothing under {root} in {', '.join(ARCHIVED)}")
    data = archive_bytes(files)
    tmp = archive.with_name(archive.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, archive)
    added = sum(1 for n in files if n not in old)
    changed = sum(1 for n in files if n in old and old[n] != files[n])
    return (
        f"packed {len(files)} files ({sum(map(len, files.values())):,} bytes) into {archive} "
        f"({len(data):,} bytes; {added} added, {changed} changed)"
    )


def unpack(dest: Path = RESULTS, archive: Path = ARCHIVE, force: bool = False) -> str:
    """Write the archive's files under ``dest`` (the results folder by default: in place). A file already
    there with the same content is left alone; one with other content is an error (it may be a run not
    packed yet) unless ``force``."""
    files = read_archive(archive)
    differ = [n for n in files if (dest / n).is_file() and (dest / n).read_bytes() != files[n]]
    if differ and not force:
        raise SystemExit(
            f"unpack: {len(differ)} file(s) under {dest} differ from {archive.name} (e.g. {differ[0]}); "
            "`pack` them, or pass --force to overwrite them with the archive's"
        )
    written = 0
    for name, data in files.items():
        path = dest / name
        if path.is_file() and path.read_bytes() == data:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        written += 1
    return (
        f"unpacked {len(files)} files into {dest} ({written} written, {len(files) - written} already there)"
    )


def check(root: Path = RESULTS, archive: Path = ARCHIVE) -> list[str]:
    """What differs between the archived folders under ``root`` and the archive (empty: the same files)."""
    files = read_archive(archive)
    disk = on_disk(root)
    problems = [f"missing on disk: {n}" for n in files if n not in disk]
    problems += [f"differs: {n}" for n in files if n in disk and disk[n].read_bytes() != files[n]]
    problems += [f"not in the archive (pack it): {n}" for n in disk if n not in files]
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    u = sub.add_parser("unpack", help="write the archive's files under --dest (default: in place)")
    u.add_argument("--dest", type=Path, default=RESULTS, help="the results folder to unpack into")
    u.add_argument("--force", action="store_true", help="overwrite files that differ from the archive's")
    sub.add_parser("pack", help=f"write {', '.join(ARCHIVED)} to {ARCHIVE.name} (maintainers)")
    sub.add_parser("check", help="exit 1 unless the folders on disk hold exactly the archive's files")
    sub.add_parser("list", help="the archive's files, with their size and sha256")
    args = p.parse_args(argv)
    if args.command == "unpack":
        print(unpack(args.dest, force=args.force))
    elif args.command == "pack":
        print(pack())
    elif args.command == "check":
        problems = check()
        for line in problems[:50]:
            print(line)
        if problems:
            print(f"{len(problems)} difference(s) between {RESULTS} and {ARCHIVE.name}")
            return 1
        print(f"{RESULTS} holds exactly the files of {ARCHIVE.name}")
    else:
        for name, data in read_archive().items():
            print(f"{hashlib.sha256(data).hexdigest()[:16]}  {len(data):>9}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
