"""Row readers for the dataset files of the field: parquet, JSON Lines, JSON, CSV (``.gz`` / ``.zst``),
folders of them (a Hugging Face dataset saved with ``save_to_disk`` or a folder of parquet shards), and
datasets already in the Hugging Face cache, named as on the hub (:data:`HUB_PREFIX`)::

    hf://ORG/NAME[/CONFIG][:SPLIT]     e.g. "dapo:hf://BytedTsinghua-SIA/DAPO-Math-17k:train"

A hub name is read offline only (the hub is never asked, nothing is downloaded): from the ``datasets``
cache a former ``datasets.load_dataset(name)`` filled (``HF_DATASETS_CACHE``, default
``$HF_HOME/datasets``), else from the hub file cache a ``huggingface-cli download`` filled
(``HF_HUB_CACHE``, default ``$HF_HOME/hub``). Without ``:SPLIT`` the dataset's only split is read (a
dataset with several is an error listing them). A name in neither cache is a one-line error saying how
to fetch it once on a machine with network.

Every reader yields ``(row number, where, record)``: ``row`` is 1-based, ``where`` names the file and
row for messages, ``record`` is a dict of plain Python values (nested structs become dicts, lists stay
lists). Nothing here evaluates a value; a broken file is a :class:`~whale_envs.tasks.TaskSourceError`
naming the file (and the row where there is one).

``pyarrow`` reads parquet (it comes with ``datasets``); ``zstandard`` reads ``.zst``. Both are imported
only when such a file is read, with a clear error when missing.

Size caps, enforced while reading (before the memory is spent), each a one-line error naming the file
and line: a line (row) of JSON Lines or CSV over :data:`~whale_envs.tasks.MAX_ROW_CHARS` (1 MiB of
characters; ``WHALE_MAX_ROW_CHARS``); a ``.gz`` / ``.zst`` file that decompresses to more than
:func:`max_decompressed_bytes` (64 MiB or 50 times the compressed file, whichever is larger;
``WHALE_MAX_DECOMPRESSED_BYTES``), and a parquet file whose row groups' uncompressed size passes the
same cap. A CSV field over the ``csv`` module's 128 KiB field limit is such an error too.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import json
import os
import re
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from whale_envs.tasks import TaskSourceError, capped_lines, json_lines

Row = tuple[int, str, dict[str, Any]]

#: The least decompressed size a ``.gz`` / ``.zst`` file may reach (:func:`max_decompressed_bytes`).
MIN_DECOMPRESSED_CAP = 64 << 20
#: ... and the compression ratio allowed beyond it (text and JSON compress 3-10x; a bomb 1000x).
MAX_COMPRESSION_RATIO = 50


def max_decompressed_bytes(path: Path) -> int:
    """How many bytes a compressed ``path`` may decompress to: ``$WHALE_MAX_DECOMPRESSED_BYTES`` when
    set, else :data:`MIN_DECOMPRESSED_CAP` or :data:`MAX_COMPRESSION_RATIO` times its size, the larger."""
    value = os.environ.get("WHALE_MAX_DECOMPRESSED_BYTES", "").strip()
    if value:
        if not value.isdigit() or int(value) < 1:
            raise TaskSourceError(f"WHALE_MAX_DECOMPRESSED_BYTES must be a positive integer, got {value!r}")
        return int(value)
    return max(MIN_DECOMPRESSED_CAP, MAX_COMPRESSION_RATIO * path.stat().st_size)


class _CappedReader(io.RawIOBase):
    """A decompressing stream that fails, naming the file and line, once it has given ``cap`` bytes."""

    def __init__(self, inner: Any, path: Path, cap: int):
        self.inner, self.path, self.cap = inner, path, cap
        self.total = 0
        self.lines = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.inner.read(len(buffer))
        n = len(data)
        if self.total + n > self.cap:
            line = self.lines + data[: self.cap - self.total].count(b"\n") + 1
            raise TaskSourceError(
                f"{self.path}, line {line}: decompresses to over {self.cap} bytes (the cap for a "
                f"{self.path.stat().st_size}-byte file; decompress it first, or set WHALE_MAX_DECOMPRESSED_BYTES)"
            )
        self.total += n
        self.lines += data.count(b"\n")
        buffer[:n] = data
        return n

    def close(self) -> None:
        if not self.closed:
            self.inner.close()
        super().close()


def base_suffix(path: Path) -> str:
    """The format suffix looking through a compression suffix: ``x.csv.zst`` -> ``.csv``."""
    return Path(path.stem).suffix.lower() if path.suffix.lower() in (".gz", ".zst") else path.suffix.lower()


def open_text(path: Path) -> io.TextIOBase:
    """A text stream of ``path``, decompressing ``.gz`` and ``.zst`` on the fly (streamed, never whole)."""
    suffix = path.suffix.lower()
    if suffix == ".gz":
        capped = _CappedReader(gzip.open(path, "rb"), path, max_decompressed_bytes(path))
        return io.TextIOWrapper(io.BufferedReader(capped), encoding="utf-8", newline="")
    if suffix == ".zst":
        try:
            import zstandard
        except ImportError:
            raise TaskSourceError(
                f"{path}: reading .zst needs the 'zstandard' package (pip install zstandard)"
            ) from None
        raw = open(path, "rb")  # noqa: SIM115 (closed with the wrapper)
        reader = zstandard.ZstdDecompressor().stream_reader(raw, closefd=True)
        capped = _CappedReader(reader, path, max_decompressed_bytes(path))
        return io.TextIOWrapper(io.BufferedReader(capped), encoding="utf-8", newline="")
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
        meta = table.metadata
        size = sum(meta.row_group(i).total_byte_size or 0 for i in range(meta.num_row_groups))
        cap = max_decompressed_bytes(path)
        if size > cap:  # checked from the footer, before a row group is decoded
            raise TaskSourceError(
                f"{path}: its rows decompress to {size} bytes, over the cap of {cap} for a "
                f"{path.stat().st_size}-byte file (set WHALE_MAX_DECOMPRESSED_BYTES to read it)"
            )
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
        yield from csv_records(csv.DictReader(capped_lines(fh, str(path))), path)


def csv_records(reader: csv.DictReader, path: Path) -> Iterator[Row]:
    """The records of a ``csv.DictReader`` (over :func:`~whale_envs.tasks.capped_lines` of ``path``):
    a malformed row or a field over the ``csv`` module's limit is a TaskSourceError naming file and row."""
    row_no = 1  # row 1 is the header
    records = iter(reader)
    while True:
        try:
            record = next(records)
        except StopIteration:
            return
        except csv.Error as exc:
            raise TaskSourceError(f"{path}, row {row_no + 1}: not a readable CSV row: {exc}") from None
        row_no += 1
        yield row_no, f"{path}, row {row_no}", dict(record)


def _as_object(record: Any, where: str) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise TaskSourceError(f"{where}: expected a JSON object, got {type(record).__name__}")
    return record


_READERS = {".parquet": read_parquet, ".jsonl": read_jsonl, ".json": read_json, ".csv": read_csv}


def read_rows(path: str | Path, what: str) -> Iterator[Row]:
    """The rows of a file, folder or cached hub dataset (see the module docstring); ``what`` names the
    source kind in errors.

    A folder is read as every ``*.parquet`` in it (sorted; a ``datasets`` ``save_to_disk`` folder has
    ``*.arrow`` shards instead, read through ``datasets.load_from_disk``). A ``hf://`` name is read from
    the Hugging Face caches, offline (:func:`read_hub`).
    """
    if is_hub_name(path):
        yield from read_hub(parse_hub_name(str(path), what), what)
        return
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


# ------------------------------------------------------------------ datasets in the Hugging Face cache

#: The prefix that names a dataset as on the hub instead of a path.
HUB_PREFIX = "hf://"
_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*")
_OFFLINE_LOCK = threading.Lock()


@dataclass(frozen=True)
class HubName:
    """A dataset named as on the hub: ``repo_id`` (``ORG/NAME``), its ``config`` and ``split`` (None:
    the default config, the only split)."""

    repo_id: str
    config: str | None = None
    split: str | None = None

    def __str__(self) -> str:
        config = f"/{self.config}" if self.config else ""
        split = f":{self.split}" if self.split else ""
        return f"{HUB_PREFIX}{self.repo_id}{config}{split}"


def is_hub_name(path: str | Path | None) -> bool:
    """Whether ``path`` names a dataset of the hub (``hf://ORG/NAME...``) rather than a file."""
    return isinstance(path, str) and path.startswith(HUB_PREFIX)


def parse_hub_name(text: str, what: str) -> HubName:
    """``hf://ORG/NAME[/CONFIG][:SPLIT]`` as a :class:`HubName`; anything else a one-line error."""
    body, _, split = text[len(HUB_PREFIX) :].partition(":")
    parts = body.split("/")
    if len(parts) not in (2, 3) or not all(_HUB_NAME.fullmatch(p) for p in parts) or ":" in split:
        raise TaskSourceError(
            f"{what}: {text!r} is not a hub dataset name; expected hf://ORG/NAME[/CONFIG][:SPLIT], "
            f"e.g. hf://BytedTsinghua-SIA/DAPO-Math-17k:train"
        )
    if split and not _HUB_NAME.fullmatch(split):
        raise TaskSourceError(f"{what}: {text}: split {split!r} is not a split name (train, test, ...)")
    return HubName("/".join(parts[:2]), parts[2] if len(parts) == 3 else None, split or None)


def hf_cache_dirs() -> tuple[Path, Path, Path]:
    """``(HF_HOME, datasets cache, hub file cache)`` as the Hugging Face libraries resolve them, read
    from the environment at each call (so a change after ``datasets`` was imported is seen)."""
    env = os.environ
    default_home = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    home = Path(env.get("HF_HOME") or default_home).expanduser()
    datasets_cache = Path(env.get("HF_DATASETS_CACHE") or home / "datasets").expanduser()
    hub_cache = Path(env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or home / "hub").expanduser()
    return home, datasets_cache, hub_cache


def _in_datasets_cache(name: HubName, cache: Path) -> bool:
    """Whether ``datasets`` has prepared ``name`` in ``cache`` (``ORG___name/CONFIG/VERSION/HASH/``, the
    folder its ``cache`` builder reloads; the name part is snake-cased as ``datasets`` does)."""
    from datasets.naming import camelcase_to_snakecase

    org, dataset = name.repo_id.split("/")
    root = cache / f"{org}___{camelcase_to_snakecase(dataset)}"
    return any(p.is_dir() for p in root.glob("*/*/*"))


def _hub_snapshot(name: HubName, hub_cache: Path) -> Path | None:
    """The folder of the files ``huggingface-cli download`` put in the hub cache for ``name`` (the
    revision ``refs/main`` points at, else the newest snapshot); None when there is none."""
    repo = hub_cache / ("datasets--" + name.repo_id.replace("/", "--"))
    ref = repo / "refs" / "main"
    if ref.is_file():
        snapshot = repo / "snapshots" / ref.read_text(encoding="utf-8").strip()
        if snapshot.is_dir():
            return snapshot
    snapshots = sorted((repo / "snapshots").glob("*"), key=lambda p: p.stat().st_mtime)
    return snapshots[-1] if snapshots else None


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """Offline mode for the Hugging Face libraries for the span of one call: their flags are read when
    they are imported, so the module constants are set (and restored) as well as the environment."""
    import datasets.config
    import huggingface_hub.constants

    keys = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    with _OFFLINE_LOCK:
        saved_env = {k: os.environ.get(k) for k in keys}
        saved = (datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE)
        os.environ.update(dict.fromkeys(keys, "1"))
        datasets.config.HF_HUB_OFFLINE = huggingface_hub.constants.HF_HUB_OFFLINE = True
        try:
            yield
        finally:
            datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE = saved
            for k, v in saved_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def read_hub(name: HubName, what: str) -> Iterator[Row]:
    """The rows of the hub dataset ``name`` from the local Hugging Face caches, offline (see the module
    docstring). Never downloads; a dataset in neither cache, a missing config or split is a one-line
    :class:`~whale_envs.tasks.TaskSourceError` naming the dataset."""
    try:
        import datasets
    except ImportError:
        raise TaskSourceError(f"{what}: {name}: reading a hub dataset needs 'datasets'") from None
    home, datasets_cache, hub_cache = hf_cache_dirs()
    if _in_datasets_cache(name, datasets_cache):
        target = name.repo_id
    else:
        snapshot = _hub_snapshot(name, hub_cache)
        if snapshot is None:
            config = f", {name.config!r}" if name.config else ""
            raise TaskSourceError(
                f"{what}: {name}: not in the Hugging Face cache (HF_HOME={home}; looked in {datasets_cache} "
                f'and {hub_cache}): fetch it once with `python -c "import datasets; '
                f"datasets.load_dataset('{name.repo_id}'{config})\"` (or `huggingface-cli download "
                f"--repo-type dataset {name.repo_id}`) on a machine with network, with the same HF_HOME"
            )
        target = str(snapshot)
    try:
        with _offline():
            data = datasets.load_dataset(target, name.config, split=name.split, cache_dir=str(datasets_cache))
    except (ValueError, KeyError, OSError, ConnectionError) as exc:
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise TaskSourceError(
            f"{what}: {name}: cannot be read from the Hugging Face cache: {detail}"
        ) from None
    if isinstance(data, datasets.DatasetDict):
        if len(data) != 1:
            raise TaskSourceError(
                f"{what}: {name} has several splits ({', '.join(data)}); name one: {name}:<split>"
            )
        data = next(iter(data.values()))
    for i, record in enumerate(data, start=1):
        yield i, f"{name}, row {i}", dict(record)


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
