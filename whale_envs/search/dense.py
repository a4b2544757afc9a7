"""Dense retrieval: encoder, resumable index builds, flat and approximate indexes.

    whale retriever build --corpus wiki.jsonl --encoder ./e5-base-v2 --out wiki-e5 [--kind ivfpq]
    whale retriever serve --corpus wiki.jsonl --index wiki-e5

Encoder (:class:`Encoder`): any local Hugging Face encoder folder (``intfloat/e5-base-v2`` as the
paper) or sentence-transformers folder, embedded the way its authors meant:

* **prefixes**: the ``prompts`` of a sentence-transformers folder (``config_sentence_transformers.json``:
  ``query``, and ``document`` / ``passage`` / ``corpus`` for passages, as ``encode_query`` /
  ``encode_document`` pick them); else e5's ``query: `` / ``passage: `` for an e5 model (its folder
  name or ``config.json``'s ``_name_or_path`` says ``e5``); else none. ``query_prefix`` /
  ``passage_prefix`` override either (``""`` = none).
* **pooling**: the folder's ``modules.json``: a Transformer, a Pooling module (``1_Pooling/config.json``:
  mean, CLS or last-token pooling) and, when listed, Normalize. Any other module (Dense, LayerNorm,
  ...) or pooling (max, weighted mean, several at once, ``include_prompt: false``) is refused in one
  line naming the encoder and the module. A plain Hugging Face folder (no ``modules.json``) is
  mean-pooled and L2-normalized, e5's convention. Vectors are also L2-normalized when
  ``similarity_fn_name`` is ``cosine`` (inner product over unit vectors = the cosine the model was
  trained for); otherwise the index scores the raw inner product, as a dot-product model wants.
* ``max_seq_length`` (``sentence_bert_config.json``) caps the tokens per text (default 256, the
  paper's), and its ``do_lower_case`` lowercases the texts.

Passages are embedded as Search-R1 stores them, ``"Title"\\ntext`` (the corpus ``contents``).
Nothing is downloaded: the folder must be on disk.

Index folder (:func:`build_index`): ``embeddings.f32`` (a raw float32 matrix, row i = passage i,
written chunk by chunk and memory-mapped), ``progress.json`` (rows done: a build stopped at any point
resumes there), ``index.faiss`` (``flat``: exact inner product; ``ivf``/``ivfpq``: approximate, for
corpora whose vectors do not fit in RAM) and ``meta.json`` (written last; a folder without it is an
unfinished build; it records the encoder, its prefixes, pooling and normalization, which the query
encoder of :class:`DenseIndex` must match). Loading memory-maps what it can: the flat matrix, and
FAISS's IVF lists.

FAISS (``pip install 'whale-harness[retrieval]'``, faiss-cpu) is needed for ``ivf``/``ivfpq``; a
``flat`` index works without it (exact search over the memory-mapped matrix with numpy).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from whale_envs.search.corpus import Corpus, Passage

INDEX_FORMAT = 1
KINDS = ("flat", "ivf", "ivfpq")
QUERY_PREFIX = "query: "
PASSAGE_PREFIX = "passage: "
POOLINGS = ("mean", "cls", "lasttoken")
DEFAULT_MAX_LENGTH = 256
#: sentence-transformers' legacy pooling flags (1_Pooling/config.json) -> its pooling mode names
_POOLING_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
_E5_NAME = re.compile(r"(?:^|[^a-z0-9])e5(?:[^a-z0-9]|$)", re.I)


class DenseIndexError(ValueError):
    """A dense index cannot be built or loaded; the message names the folder or file and why."""


def passage_text(p: Passage) -> str:
    """How a passage is embedded: Search-R1's ``contents`` (``"Title"\\ntext``)."""
    return f'"{p.title}"\n{p.text}'


@dataclass(frozen=True)
class EncoderConfig:
    """How an encoder folder says to embed (see the module docstring): :func:`encoder_config`."""

    model_dir: Path  # the transformer's weights, config and tokenizer
    pooling: str  # one of POOLINGS
    normalize: bool
    query_prefix: str
    passage_prefix: str
    prefixes_from: str  # "sentence-transformers prompts", "e5 model" or "none"
    pooling_from: str  # "sentence-transformers modules.json" or "default (no modules.json)"
    max_seq_length: int | None = None
    lowercase: bool = False


def _read_json(file: Path, encoder: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DenseIndexError(f"encoder {encoder}: {file.name} unreadable: {exc}") from None


def _pooling_mode(cfg: dict[str, Any], where: str, folder: Path) -> str:
    """The one pooling mode of a sentence-transformers Pooling config (new or legacy keys)."""
    if "pooling_mode" in cfg:
        mode = cfg["pooling_mode"]
        modes = [mode] if isinstance(mode, str) else list(mode)
    else:
        modes = [name for key, name in _POOLING_FLAGS.items() if cfg.get(key)] or ["mean"]
    if len(modes) != 1 or modes[0] not in POOLINGS:
        raise DenseIndexError(
            f"encoder {folder}: its Pooling module ({where}) uses {' + '.join(map(str, modes))} pooling; "
            f"only {', '.join(POOLINGS)} pooling is supported"
        )
    if cfg.get("include_prompt", True) is False:
        raise DenseIndexError(
            f"encoder {folder}: its Pooling module ({where}) excludes the prompt tokens "
            "(include_prompt: false), which is not supported"
        )
    return modes[0]


def encoder_config(path: str | os.PathLike) -> EncoderConfig:
    """Read how the encoder folder ``path`` embeds: prefixes, pooling, normalization, max length.
    DenseIndexError (one line naming the folder and the module) for what cannot be honoured."""
    folder = Path(path).expanduser()
    model_dir, pooling, normalize, pooling_from = folder, "mean", True, "default (no modules.json)"
    bert_config: dict[str, Any] = {}
    st_config: dict[str, Any] = {}
    if (folder / "config_sentence_transformers.json").is_file():
        st_config = _read_json(folder / "config_sentence_transformers.json", folder) or {}
    if (folder / "modules.json").is_file():
        modules = _read_json(folder / "modules.json", folder)
        if not isinstance(modules, list):
            raise DenseIndexError(f"encoder {folder}: modules.json is not a list of modules")
        modules = sorted(modules, key=lambda m: int(m.get("idx", 0)))
        expected = ("Transformer", "Pooling", "Normalize")
        for i, module in enumerate(modules):
            kind = str(module.get("type", "")).rsplit(".", 1)[-1]
            if i >= len(expected) or kind != expected[i]:
                raise DenseIndexError(
                    f"encoder {folder}: unsupported sentence-transformers module {module.get('type')!r} "
                    f"({module.get('path') or 'module ' + str(i)}): only Transformer, Pooling "
                    "(mean, cls or lasttoken) and Normalize, in that order, are supported"
                )
        if len(modules) < 2:
            raise DenseIndexError(f"encoder {folder}: modules.json lists no Pooling module")
        model_dir = folder / modules[0].get("path", "")
        pool_dir = folder / modules[1].get("path", "")
        pool_cfg = (
            _read_json(pool_dir / "config.json", folder) if (pool_dir / "config.json").is_file() else {}
        )
        where = f"{modules[1].get('path') or '.'}/config.json"
        pooling = _pooling_mode(pool_cfg, where, folder)
        normalize = len(modules) == 3 or st_config.get("similarity_fn_name") == "cosine"
        pooling_from = "sentence-transformers modules.json"
        if (model_dir / "sentence_bert_config.json").is_file():
            bert_config = _read_json(model_dir / "sentence_bert_config.json", folder) or {}
    if not (model_dir / "config.json").is_file():
        raise DenseIndexError(f"encoder {model_dir}: not a model folder (no config.json)")
    prompts = st_config.get("prompts") or {}
    passage_key = next((k for k in ("document", "passage", "corpus") if k in prompts), None)
    if "query" in prompts or passage_key:
        query_prefix, passage_prefix = prompts.get("query") or "", prompts.get(passage_key) or ""
        prefixes_from = "sentence-transformers prompts"
    else:
        hf_config = _read_json(model_dir / "config.json", folder)
        names = [folder.name, model_dir.name, str(hf_config.get("_name_or_path", ""))]
        is_e5 = any(_E5_NAME.search(name.rsplit("/", 1)[-1]) for name in names)
        query_prefix, passage_prefix = (QUERY_PREFIX, PASSAGE_PREFIX) if is_e5 else ("", "")
        prefixes_from = "e5 model" if is_e5 else "none"
    max_seq = bert_config.get("max_seq_length")
    return EncoderConfig(
        model_dir=model_dir,
        pooling=pooling,
        normalize=normalize,
        query_prefix=str(query_prefix),
        passage_prefix=str(passage_prefix),
        prefixes_from=prefixes_from,
        pooling_from=pooling_from,
        max_seq_length=int(max_seq) if isinstance(max_seq, int) and max_seq > 0 else None,
        lowercase=bool(bert_config.get("do_lower_case", False)),
    )


class Encoder:
    """A text encoder from a local folder, embedding as the folder says (see the module docstring).

    Args:
        path: a Hugging Face model folder (``config.json``, weights, tokenizer) or a sentence-transformers
            folder (``modules.json`` and the rest).
        max_length: tokens per text (longer texts are cut); default the folder's ``max_seq_length``,
            at most 256.
        batch_size: texts per forward pass.
        query_prefix / passage_prefix: override the folder's prefixes (``""`` = none); None = resolved
            from the folder (sentence-transformers prompts, else e5's for an e5 model, else none).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        max_length: int | None = None,
        batch_size: int = 64,
        query_prefix: str | None = None,
        passage_prefix: str | None = None,
        device: str = "cpu",
    ):
        import torch
        from transformers import AutoModel, AutoTokenizer

        folder = Path(path).expanduser()
        if not (folder / "config.json").is_file() and not (folder / "modules.json").is_file():
            raise DenseIndexError(f"encoder {folder}: not a model folder (no config.json)")
        self.config = config = encoder_config(folder)
        self.path = str(folder)
        if max_length is None:
            max_length = min(DEFAULT_MAX_LENGTH, config.max_seq_length or DEFAULT_MAX_LENGTH)
        self.max_length = max_length
        self.batch_size = batch_size
        self.query_prefix = config.query_prefix if query_prefix is None else query_prefix
        self.passage_prefix = config.passage_prefix if passage_prefix is None else passage_prefix
        self.prefixes_from = (
            config.prefixes_from if query_prefix is None and passage_prefix is None else "given"
        )
        self.pooling = config.pooling
        self.normalize = config.normalize
        self.device = device
        model_dir = str(config.model_dir)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
            self.model = AutoModel.from_pretrained(model_dir, local_files_only=True).to(device).eval()
        except (OSError, ValueError) as exc:
            raise DenseIndexError(f"encoder {folder}: cannot load model/tokenizer: {exc}") from None
        self._torch = torch

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    def describe(self) -> str:
        """One line: the prefixes, the pooling and where each came from."""
        norm = "normalized" if self.normalize else "not normalized (inner product)"
        return (
            f"prefixes query {self.query_prefix!r} / passage {self.passage_prefix!r} ({self.prefixes_from}); "
            f"{self.pooling} pooling, {norm} ({self.config.pooling_from}); max {self.max_length} tokens"
        )

    def encode(self, texts: Sequence[str], *, query: bool) -> np.ndarray:
        """float32 ``(len(texts), dim)`` (rows L2-normalized when the encoder normalizes); ``query``
        picks the prefix."""
        torch = self._torch
        prefix = self.query_prefix if query else self.passage_prefix
        out = []
        for start in range(0, len(texts), self.batch_size):
            batch = [prefix + t for t in texts[start : start + self.batch_size]]
            if self.config.lowercase:
                batch = [t.lower() for t in batch]
            enc = self.tokenizer(
                batch, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
            ).to(self.device)
            with torch.no_grad():
                hidden = self.model(**enc).last_hidden_state
            pooled = self._pool(hidden, enc["attention_mask"])
            if self.normalize:
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=-1)
            out.append(pooled.float().cpu().numpy())
        if not out:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.concatenate(out).astype(np.float32, copy=False)

    def _pool(self, hidden, attention_mask):
        """One vector per text from its token states, over the attention mask (either padding side)."""
        torch = self._torch
        if self.pooling == "mean":
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
        if self.pooling == "cls":
            first = attention_mask.to(torch.int).argmax(dim=1)  # the first real token
            return hidden[torch.arange(len(hidden), device=hidden.device), first]
        length = attention_mask.size(1)
        last = length - 1 - attention_mask.to(torch.int).flip(1).argmax(dim=1)  # the last real token
        return hidden[torch.arange(len(hidden), device=hidden.device), last]


def _faiss():
    try:
        import faiss
    except ImportError:
        raise DenseIndexError(
            "this index kind needs FAISS: pip install 'whale-harness[retrieval]' (faiss-cpu)"
        ) from None
    return faiss


def build_index(
    corpus: Corpus,
    encoder: Encoder,
    out: str | os.PathLike,
    *,
    kind: str = "flat",
    chunk: int = 1024,
    nlist: int | None = None,
    pq_m: int = 16,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """Embed ``corpus`` into ``out`` and build its index (layout in the module docstring); resumes a
    stopped build of the same corpus and encoder. ``progress(done, total)`` after every chunk."""
    if kind not in KINDS:
        raise DenseIndexError(f"index kind must be one of {', '.join(KINDS)}, got {kind!r}")
    folder = Path(out).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    n, dim = len(corpus), encoder.dim
    plan = {"format": INDEX_FORMAT, "fingerprint": corpus.fingerprint, "passages": n, "dim": dim,
            "encoder": encoder.path, "query_prefix": encoder.query_prefix,
            "passage_prefix": encoder.passage_prefix, "max_length": encoder.max_length,
            "pooling": encoder.pooling, "normalize": encoder.normalize}  # fmt: skip
    state_file = folder / "progress.json"
    done = 0
    if state_file.is_file():
        state = json.loads(state_file.read_text(encoding="utf-8"))
        if state.get("plan") == plan:
            done = int(state.get("done", 0))
    (folder / "meta.json").unlink(missing_ok=True)  # unfinished until written again
    matrix_file = folder / "embeddings.f32"
    mode = "r+" if done and matrix_file.is_file() else "w+"
    if mode == "w+":
        done = 0
    matrix = np.memmap(matrix_file, dtype=np.float32, mode=mode, shape=(n, dim))
    start = time.perf_counter()
    while done < n:
        stop = min(n, done + chunk)
        matrix[done:stop] = encoder.encode([passage_text(p) for p in corpus.passages[done:stop]], query=False)
        matrix.flush()
        done = stop
        state_file.write_text(json.dumps({"plan": plan, "done": done}), encoding="utf-8")
        if progress is not None:
            progress(done, n)
    del matrix
    vectors = np.memmap(matrix_file, dtype=np.float32, mode="r", shape=(n, dim))
    if kind != "flat" or _has_faiss():
        index = _train_index(np.asarray(vectors), kind, nlist, pq_m)
        _faiss().write_index(index, str(folder / "index.faiss"))
    meta = {**plan, "kind": kind, "build_seconds": round(time.perf_counter() - start, 2)}
    (folder / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
    return folder


def _has_faiss() -> bool:
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


def _train_index(vectors: np.ndarray, kind: str, nlist: int | None, pq_m: int) -> Any:
    faiss = _faiss()
    n, dim = vectors.shape
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    else:
        lists = nlist or max(1, min(65536, int(4 * np.sqrt(n))))
        lists = min(lists, n)
        quantizer = faiss.IndexFlatIP(dim)
        if kind == "ivf":
            index = faiss.IndexIVFFlat(quantizer, dim, lists, faiss.METRIC_INNER_PRODUCT)
        else:
            if dim % pq_m:
                raise DenseIndexError(f"ivfpq: pq_m={pq_m} must divide the embedding size {dim}")
            bits = 8 if n >= 256 * 39 else max(1, min(8, int(np.log2(max(2, n // 39)))))
            index = faiss.IndexIVFPQ(quantizer, dim, lists, pq_m, bits, faiss.METRIC_INNER_PRODUCT)
        sample = vectors[np.random.default_rng(0).permutation(n)[: max(lists * 39, 256 * 39)]]
        index.train(np.ascontiguousarray(sample))
        index.nprobe = min(lists, 16)
    for start in range(0, n, 65536):
        index.add(np.ascontiguousarray(vectors[start : start + 65536]))
    return index


class DenseIndex:
    """A built index folder over its corpus, ready to search (thread-safe for queries).

    Args:
        folder: what :func:`build_index` wrote.
        corpus: the same corpus (checked by fingerprint).
        encoder: the query encoder; default the one named in ``meta.json``.
        nprobe: lists visited per query by an IVF index (recall against speed).
        rerank: for an ``ivfpq`` index, candidates per result re-scored exactly from the memory-mapped
            vectors (``embeddings.f32``; only those rows are read): PQ's coarse scores find them, the
            exact ones order them. 0 = off. Default 10 when the vectors are there.
    """

    name = "dense"

    def __init__(
        self,
        folder: str | os.PathLike,
        corpus: Corpus,
        encoder: Encoder | None = None,
        *,
        nprobe: int | None = None,
        rerank: int | None = None,
    ):
        self.folder = Path(folder).expanduser()
        self.meta = self.read_meta(self.folder)
        if self.meta.get("format") != INDEX_FORMAT:
            raise DenseIndexError(
                f"{self.folder}: index format {self.meta.get('format')} != {INDEX_FORMAT}: rebuild"
            )
        if self.meta.get("fingerprint") != corpus.fingerprint:
            raise DenseIndexError(
                f"{self.folder}: built over another corpus than {corpus.name!r} (fingerprints differ)"
            )
        self.corpus = corpus
        self.kind = self.meta["kind"]
        self.encoder = encoder or Encoder(
            self.meta["encoder"], query_prefix=self.meta["query_prefix"],
            passage_prefix=self.meta["passage_prefix"], max_length=self.meta["max_length"],
        )  # fmt: skip
        if self.encoder.dim != self.meta["dim"]:
            raise DenseIndexError(
                f"{self.folder}: the encoder's size {self.encoder.dim} != the index's {self.meta['dim']}"
            )
        self._check_encoder()
        self.index = None
        self.matrix = None
        vectors = self.folder / "embeddings.f32"
        self.vectors = None
        if vectors.is_file():
            n, dim = self.meta["passages"], self.meta["dim"]
            self.vectors = np.memmap(vectors, dtype=np.float32, mode="r", shape=(n, dim))
        self.rerank = (10 if self.vectors is not None else 0) if rerank is None else rerank
        if self.kind != "ivfpq" or self.vectors is None:
            self.rerank = 0
        if (self.folder / "index.faiss").is_file() and _has_faiss():
            faiss = _faiss()
            try:
                self.index = faiss.read_index(str(self.folder / "index.faiss"), faiss.IO_FLAG_MMAP)
            except RuntimeError:
                self.index = faiss.read_index(str(self.folder / "index.faiss"))
            if nprobe is not None and hasattr(self.index, "nprobe"):
                self.index.nprobe = nprobe
        elif self.kind == "flat":
            n, dim = self.meta["passages"], self.meta["dim"]
            self.matrix = np.memmap(
                self.folder / "embeddings.f32", dtype=np.float32, mode="r", shape=(n, dim)
            )
        else:
            _faiss()  # raises the install hint

    def _check_encoder(self) -> None:
        """The query encoder embeds as the passages were (an index from before pooling was recorded:
        mean pooling, normalized)."""
        built = {"query_prefix": self.meta["query_prefix"], "passage_prefix": self.meta["passage_prefix"],
                 "pooling": self.meta.get("pooling", "mean"), "normalize": self.meta.get("normalize", True)}  # fmt: skip
        for key, value in built.items():
            if getattr(self.encoder, key) != value:
                raise DenseIndexError(
                    f"{self.folder}: built with {key}={value!r}, but the query encoder "
                    f"{self.encoder.path} gives {getattr(self.encoder, key)!r}: rebuild the index"
                )

    @staticmethod
    def read_meta(folder: str | os.PathLike) -> dict[str, Any]:
        """The ``meta.json`` of an index folder; DenseIndexError when it is not a finished index."""
        meta_file = Path(folder).expanduser() / "meta.json"
        if not meta_file.is_file():
            raise DenseIndexError(
                f"{folder}: no meta.json (not an index, or an unfinished build: run build again)"
            )
        try:
            return json.loads(meta_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise DenseIndexError(f"{meta_file}: unreadable: {exc}") from None

    def __len__(self) -> int:
        return len(self.corpus)

    def search_vectors(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, row ids) of the ``k`` nearest passages of each query vector; ids -1 = none."""
        k = min(k, len(self.corpus))
        if self.index is not None and self.rerank:
            _, found = self.index.search(
                np.ascontiguousarray(queries, dtype=np.float32), min(len(self.corpus), k * self.rerank)
            )
            return self._exact(queries, found, k)
        if self.index is not None:
            return self.index.search(np.ascontiguousarray(queries, dtype=np.float32), k)
        scores = queries @ np.asarray(self.matrix).T
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        order = np.take_along_axis(scores, top, axis=1).argsort(axis=1)[:, ::-1]
        ids = np.take_along_axis(top, order, axis=1)
        return np.take_along_axis(scores, ids, axis=1), ids

    def _exact(self, queries: np.ndarray, found: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` best of each row's candidates by exact inner product (missing ones: id -1)."""
        scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
        ids = np.full((len(queries), k), -1, dtype=np.int64)
        for row, (query, candidates) in enumerate(zip(queries, found, strict=True)):
            candidates = candidates[candidates >= 0]
            if not len(candidates):
                continue
            order = np.sort(candidates)  # sorted reads of the memory map
            exact = np.asarray(self.vectors[order]) @ query
            best = np.argsort(-exact, kind="stable")[:k]
            scores[row, : len(best)], ids[row, : len(best)] = exact[best], order[best]
        return scores, ids

    def search_batch(self, queries: Sequence[str], k: int) -> list[list[tuple[Passage, float]]]:
        if not queries:
            return []
        scores, ids = self.search_vectors(self.encoder.encode(list(queries), query=True), k)
        return [
            [(self.corpus[int(i)], float(s)) for s, i in zip(row_s, row_i, strict=True) if i >= 0]
            for row_s, row_i in zip(scores, ids, strict=True)
        ]
