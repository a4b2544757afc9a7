"""Row readers for the dataset files of the field: parquet, JSON Lines, JSON, CSV (``.gz`` / ``.zst``),
and folders of them (a Hugging Face dataset saved with ``save_to_disk`` or a folder of parquet shards).

Every reader yields ``(row number, where, record)``: ``row`` is 1-based, ``where`` names the file and
row for messages, ``record`` is a dict of plain Python values (nested structs become dicts, lists stay
lists). Nothing here evaluates a value; a broken file is a :class:`~whale_envs.tasks.TaskSourceError`
naming the file (and the row where there is one).

``pyarrow`` reads parquet (it comes with ``datasets``); ``zstandard`` reads ``.zst``. Both are imported
only when such a file is read, with a clear error when missing.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from whale_envs.tasks import TaskSourceError, json_lines

Row = tuple[int, str, dict[str, Any]]


def base_suffix(path: Path) -> str:
    """The format suffix looking through a compression suffix: ``x.csv.zst`` -> ``.csv``."""
    return Path(path.stem).suffix.lower() if path.suffix.lower() in (".gz", ".zst") else path.suffix.lower()


def open_text(path: Path) -> io.TextIOBase:
    """A text stream of ``path``, decompressing ``.gz`` and ``.zst`` on the fly (streamed, never whole)."""
    suffix = path.suffix.lower()
    if suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    if suffix == ".zst":
        try:
            import zstandard
        except ImportError:
            raise TaskSourceError(
                f"{path}: reading .zst needs the 'zstandard' package (pip install zstandard)"
            ) from None
        raw = open(path, "rb")  # noqa: SIM115 (closed with the wrapper)
        reader = zstandard.ZstdDecompressor().stream_reader(raw, closefd=True)
        return io.TextIOWrapper(reader, encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def read_parquet(path: Path) -> Iterator[Row]:
    """The rows of a parquet file, batch by batch (a 17k-row file never sits in memory twice)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise TaskSourceError(
            f"{path}: reading parquet needs the 'pyarrow' package (pip install pyarrow)"
        ) from None
    try:
        table = pq.ParquetFile(path)
        batches = table.iter_batches(batch_size=4096)
        row = 0
        for batch in batches:
            for record in batch.to_pylist():
                row += 1
                yield row, f"{path}, row {row}", record
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise TaskSourceError(f"{path}: not a readable parquet file: {exc}") from None


def read_jsonl(path: Path) -> Iterator[Row]:
    with open_text(path) as fh:
        for line_no, record in json_lines(fh, str(path)):
            yield line_no, f"{path}, line {line_no}", _as_object(record, f"{path}, line {line_no}")


def read_json(path: Path) -> Iterator[Row]:
    with open_text(path) as fh:
        try:
            data = json.load(fh)
        except json.JSONDecodeError as exc:
            raise TaskSourceError(f"{path}: not valid JSON: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]  # {"data": [...]}: a common wrapper
    if not isinstance(data, list):
        raise TaskSourceError(f"{path}: expected a JSON list of records, got a JSON {type(data).__name__}")
    for i, record in enumerate(data, start=1):
        yield i, f"{path}, record {i}", _as_object(record, f"{path}, record {i}")


def read_csv(path: Path) -> Iterator[Row]:
    with open_text(path) as fh:
        reader = csv.DictReader(fh)
        for row_no, record in enumerate(reader, start=2):  # row 1 is the header
            yield row_no, f"{path}, row {row_no}", dict(record)


def _as_object(record: Any, where: str) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise TaskSourceError(f"{where}: expected a JSON object, got {type(record).__name__}")
    return record


_READERS = {".parquet": read_parquet, ".jsonl": read_jsonl, ".json": read_json, ".csv": read_csv}


def read_rows(path: str | Path, what: str) -> Iterator[Row]:
    """The rows of a file or folder (see the module docstring); ``what`` names the source kind in errors.

    A folder is read as every ``*.parquet`` in it (sorted; a ``datasets`` ``save_to_disk`` folder has
    ``*.arrow`` shards instead, read through ``datasets.load_from_disk``).
    """
    p = Path(path).expanduser()
    if p.is_dir():
        yield from _read_folder(p, what)
        return
    if not p.is_file():
        raise TaskSourceError(f"{what}: file not found: {p}")
    reader = _READERS.get(base_suffix(p))
    if reader is None:
        known = ", ".join(sorted(_READERS))
        raise TaskSourceError(f"{what}: {p}: unknown file type; expected one of {known} (.gz/.zst allowed)")
    yield from reader(p)


def _read_folder(folder: Path, what: str) -> Iterator[Row]:
    shards = sorted(folder.glob("*.parquet"))
    if shards:
        row = 0
        for shard in shards:
            for _, where, record in read_parquet(shard):
                row += 1
                yield row, where, record
        return
    if (folder / "dataset_info.json").is_file() or (folder / "state.json").is_file():
        try:
            import datasets
        except ImportError:
            raise TaskSourceError(f"{what}: {folder}: reading a saved dataset needs 'datasets'") from None
        try:
            data = datasets.load_from_disk(str(folder))
        except (OSError, ValueError, FileNotFoundError) as exc:
            raise TaskSourceError(f"{what}: {folder}: not a readable saved dataset: {exc}") from None
        if isinstance(data, datasets.DatasetDict):
            raise TaskSourceError(
                f"{what}: {folder} holds several splits ({', '.join(data)}); name one: {folder}/<split>"
            )
        for i, record in enumerate(data, start=1):
            yield i, f"{folder}, row {i}", dict(record)
        return
    raise TaskSourceError(f"{what}: {folder}: no *.parquet files and not a saved dataset folder")


def nested(record: Mapping[str, Any], dotted: str) -> Any:
    """``record["a"]["b"]`` for ``"a.b"``; None when any step is missing. A JSON string on the way is
    decoded (some exports store ``reward_model`` / ``extra_info`` as JSON text)."""
    value: Any = record
    for key in dotted.split("."):
        if isinstance(value, str) and value.lstrip().startswith("{"):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                return None
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    return value


def field_ci(record: Mapping[str, Any], *names: str) -> Any:
    """The value of the first of ``names`` present in ``record``, matching names case-insensitively."""
    lower = {str(k).lower(): v for k, v in record.items()}
    for name in names:
        if name.lower() in lower and lower[name.lower()] is not None:
            return lower[name.lower()]
    return None


def user_prompt(record: Mapping[str, Any]) -> str | None:
    """The last user message of a verl-style ``prompt`` (a chat list), or the prompt itself if text."""
    prompt = record.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        users = [m.get("content") for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"]
        if users and isinstance(users[-1], str):
            return users[-1]
    return None
