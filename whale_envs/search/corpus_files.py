"""Reading the search env's files: question records (a JSON array or JSON Lines, ``.gz`` read
transparently) and their fields, and passage corpora (:func:`load_corpus`).

Corpus files: a JSON object ``{title: text or [sentences]}``, a JSON list or JSON Lines of ``{"title",
"text"}`` records (``"id"`` optional; Pyserini-style ``{"id", "contents"}`` with the title on the first
line also works), or a DPR-style TSV with ``id``, ``text`` and ``title`` columns. A corpus is parsed once
per process per file (path, mtime, size). Every mistake is a ``TaskSourceError`` of one line naming the
file and row. Which datasets read these files, and how, is sources.py's.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from whale_envs.search.corpus import Corpus, Passage, unique_ids
from whale_envs.tabular import csv_records, open_text
from whale_envs.tasks import TaskSourceError, capped_lines, existing, json_lines

# ("corpus", file key) -> corpus: one parse per process.
_CORPORA: dict[tuple, Corpus] = {}


def file_key(path: Path) -> tuple:
    st = path.stat()
    return (str(path.resolve()), st.st_mtime_ns, st.st_size)


def _open_text(path: Path) -> io.TextIOBase:
    """The text of ``path``, a ``.gz`` decompressed on the fly under the decompressed-size cap."""
    if path.suffix == ".gz":
        return open_text(path)
    return open(path, encoding="utf-8")


def _base_suffix(path: Path) -> str:
    """``.json``, ``.jsonl`` or ``.tsv``, looking through a ``.gz``."""
    return Path(path.stem).suffix if path.suffix == ".gz" else path.suffix


def read_records(path: Path) -> Iterator[tuple[int, str, Any]]:
    """Yield ``(row, where, record)`` for a JSON array or JSON Lines file: ``row`` is the 1-based line
    (JSON Lines) or record number (JSON array), ``where`` names file and row for messages."""
    if _base_suffix(path) == ".jsonl":
        with _open_text(path) as fh:
            for line_no, record in json_lines(fh, str(path)):
                yield line_no, f"{path}, line {line_no}", record
        return
    with _open_text(path) as fh:
        try:
            data = json.load(fh)
        except json.JSONDecodeError as exc:
            raise TaskSourceError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, list):
        raise TaskSourceError(f"{path}: expected a JSON list of records, got a JSON {type(data).__name__}")
    for i, record in enumerate(data, start=1):
        yield i, f"{path}, record {i}", record


def record_field(
    record: Any, where: str, name: str, kind: type | tuple[type, ...] = str, *, empty: bool = False
):
    if not isinstance(record, dict):
        raise TaskSourceError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if name not in record:
        raise TaskSourceError(f"{where}: missing field {name!r}")
    value = record[name]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise TaskSourceError(f"{where}: field {name!r} should be {_kind_name(kind)}, got {value!r:.80}")
    if not empty and isinstance(value, str) and not value.strip():
        raise TaskSourceError(f"{where}: field {name!r} is empty")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(
        {str: "a string", list: "a list", int: "an integer", bool: "true/false"}[k] for k in kinds
    )


def text_of(value: Any, where: str) -> str:
    """A passage text given as a string or as a list of sentences (HotpotQA: joined as they are)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return "".join(value)
    raise TaskSourceError(f"{where}: a passage text must be a string or a list of strings, got {value!r:.80}")


def _passage_record(record: Any, where: str) -> tuple[str | None, str, str]:
    """(id or None, title, text) of one corpus record."""
    if not isinstance(record, dict):
        raise TaskSourceError(f"{where}: expected a JSON object with 'title' and 'text', got {record!r:.80}")
    pid = record.get("id", record.get("_id"))
    if "text" in record:
        title = record.get("title", "")
        if not isinstance(title, str):
            raise TaskSourceError(f"{where}: field 'title' should be a string, got {title!r:.80}")
        text = text_of(record["text"], where)
    elif "contents" in record:  # Pyserini / Search-R1 style: '"Title"\ntext'
        contents = text_of(record["contents"], where)
        first, _, rest = contents.partition("\n")
        title, text = first.strip().strip('"'), rest.strip()
    else:
        raise TaskSourceError(f"{where}: a corpus record needs 'text' (and 'title') or 'contents'")
    if not (title.strip() or text.strip()):
        raise TaskSourceError(f"{where}: the passage has neither title nor text")
    return (None if pid is None else str(pid)), title, text


def build_corpus(name: str, rows: list[tuple[str | None, str, str]], where: str) -> Corpus:
    titles = [t for _, t, _ in rows]
    fallback = unique_ids(titles)
    passages = [Passage(pid if pid is not None else fallback[i], t, x) for i, (pid, t, x) in enumerate(rows)]
    try:
        return Corpus(name, passages)
    except ValueError as exc:
        raise TaskSourceError(f"{where}: {exc}") from None


def load_corpus(path: str | Path) -> Corpus:
    """Load a corpus file (formats in the module docstring). Cached per file (path, mtime, size)."""
    file = existing(path, "search corpus")
    key = ("corpus", *file_key(file))
    if key in _CORPORA:
        return _CORPORA[key]
    suffix = _base_suffix(file)
    rows: list[tuple[str | None, str, str]] = []
    if suffix == ".tsv":
        with _open_text(file) as fh:
            reader = csv.DictReader(capped_lines(fh, str(file)), delimiter="\t")
            try:
                fieldnames = reader.fieldnames
            except csv.Error as exc:
                raise TaskSourceError(f"{file}, row 1: not a readable TSV header: {exc}") from None
            if "text" not in (fieldnames or []):
                raise TaskSourceError(
                    f"{file}: a TSV corpus needs a header with a 'text' column (and 'title', 'id')"
                )
            for _, where, row in csv_records(reader, file):
                rows.append(_passage_record(row, where))
    elif suffix == ".json" and _json_is_object(file):
        with _open_text(file) as fh:
            data = json.load(fh)
        for title, value in data.items():
            rows.append((None, title, text_of(value, f"{file}, entry {title!r}")))
    else:
        rows = [_passage_record(record, where) for _, where, record in read_records(file)]
    if not rows:
        raise TaskSourceError(f"{file}: the corpus has no passages")
    corpus = build_corpus(str(path), rows, str(file))
    _CORPORA[key] = corpus
    return corpus


def _json_is_object(file: Path) -> bool:
    with _open_text(file) as fh:
        while True:
            ch = fh.read(1)
            if not ch or not ch.isspace():
                return ch == "{"


def clear_corpora() -> None:
    """Forget the corpora loaded so far (their files are read again on next use)."""
    _CORPORA.clear()
