"""BM25 retrieval over a :class:`~whale_envs.search.corpus.Corpus`, with `bm25s` and Snowball stemming.

Indexing happens once per corpus: :func:`get_retriever` keeps every retriever in a process-wide cache
keyed by the corpus fingerprint (so any number of envs share one), and corpora marked ``persist`` have
their index saved on disk under ``<cache_dir>/search/bm25/<key>/``, where the key hashes the corpus
fingerprint and the BM25 settings. A later process loads the saved index instead of rebuilding it.

The cache folder is, in order: the ``cache_dir`` argument, ``$WHALE_CACHE_DIR``, ``~/.cache/whale``.
Saving is atomic (build in a temporary folder, then rename), so concurrent processes are safe; an
unwritable cache folder only costs the speed-up (a warning, never an error).

Each passage is indexed as ``title + " " + text``. Tokens: lowercase words of two or more characters,
English stopwords removed, English Snowball stems (PyStemmer).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from whale_envs.search.corpus import Corpus, Passage

if TYPE_CHECKING:
    import bm25s

# bm25s (with scipy.sparse) and PyStemmer are imported where an index is built, loaded or a text
# tokenized: a process that imports the search env without retrieving (a math run, `whale --help`)
# does not pay their half second.

#: Bumped whenever the on-disk index layout or the tokenization changes (old caches are then ignored).
INDEX_FORMAT = 1
#: How many non-persisted (small, per-question) retrievers the process keeps.
SMALL_CACHE_SIZE = 256

_local = threading.local()


def _stem_words(words: list[str]) -> list[str]:
    # PyStemmer objects are not safe to share between threads: one per thread.
    stemmer = getattr(_local, "stemmer", None)
    if stemmer is None:
        import Stemmer

        stemmer = _local.stemmer = Stemmer.Stemmer("english")
    return stemmer.stemWords(words)


def tokenize(texts: list[str]) -> list[list[str]]:
    """The retriever's tokens for each text (the same function indexes passages and queries)."""
    import bm25s

    return bm25s.tokenize(texts, stopwords="en", stemmer=_stem_words, return_ids=False, show_progress=False)


def default_cache_dir() -> Path:
    """``$WHALE_CACHE_DIR`` if set, else ``~/.cache/whale`` (read at call time)."""
    env = os.environ.get("WHALE_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "whale"


@dataclass(frozen=True)
class Hit:
    """One retrieved passage with its BM25 score and its rank (0 = best)."""

    passage: Passage
    score: float
    rank: int


class Retriever:
    """A BM25 index over one corpus. Thread-safe for queries; build it with :func:`get_retriever`.

    Attributes:
        corpus: the indexed corpus (document ``i`` of the index is ``corpus[i]``).
        loaded_from_disk: True when the index came from the disk cache rather than being built.
        build_seconds: time spent building or loading the index.
    """

    def __init__(self, corpus: Corpus, *, k1: float = 1.5, b: float = 0.75):
        self.corpus = corpus
        self.k1 = k1
        self.b = b
        self.bm25: bm25s.BM25 | None = None
        self.loaded_from_disk = False
        self.build_seconds = 0.0

    @property
    def key(self) -> str:
        """Cache key: the corpus fingerprint plus everything that changes the index."""
        import bm25s

        text = f"{INDEX_FORMAT}|{bm25s.__version__}|k1={self.k1}|b={self.b}|{self.corpus.fingerprint}"
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    # ------------------------------------------------------------------ building

    def build(self) -> Retriever:
        """Index the corpus in memory."""
        start = time.perf_counter()
        tokens = tokenize([f"{p.title} {p.text}" for p in self.corpus.passages])
        import bm25s

        bm25 = bm25s.BM25(k1=self.k1, b=self.b)
        bm25.index(tokens, show_progress=False)
        self.bm25 = bm25
        self.loaded_from_disk = False
        self.build_seconds = time.perf_counter() - start
        return self

    def load_or_build(self, cache_dir: str | os.PathLike | None = None) -> Retriever:
        """Load the index from ``cache_dir`` when it is there, else build it and save it there."""
        folder = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        target = folder / "search" / "bm25" / self.key
        start = time.perf_counter()
        if self._load(target):
            self.build_seconds = time.perf_counter() - start
            return self
        self.build()
        self._save(target)
        return self

    def _load(self, target: Path) -> bool:
        meta_path = target / "whale_meta.json"
        if not meta_path.is_file():
            return False
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            if meta.get("num_docs") != len(self.corpus) or meta.get("format") != INDEX_FORMAT:
                return False
            import bm25s

            bm25 = bm25s.BM25.load(str(target), show_progress=False)
        except (OSError, ValueError, KeyError) as exc:
            warnings.warn(f"ignoring unreadable search index cache {target}: {exc}", stacklevel=3)
            return False
        self.bm25 = bm25
        self.loaded_from_disk = True
        return True

    def _save(self, target: Path) -> None:
        assert self.bm25 is not None
        tmp: Path | None = None
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
            self.bm25.save(str(tmp), show_progress=False)
            meta = {
                "format": INDEX_FORMAT,
                "num_docs": len(self.corpus),
                "corpus": self.corpus.name,
                "fingerprint": self.corpus.fingerprint,
                "k1": self.k1,
                "b": self.b,
            }
            # Written last: a folder without it is never trusted.
            (tmp / "whale_meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
            try:
                os.replace(tmp, target)
                tmp = None
            except OSError:
                pass  # another process saved the same index first; ours is identical
        except OSError as exc:
            warnings.warn(f"could not save the search index cache in {target.parent}: {exc}", stacklevel=3)
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)

    # ------------------------------------------------------------------ querying

    def search(self, query: str, k: int) -> list[Hit]:
        """The ``k`` best passages for ``query``, best first; ties go to the earlier passage.

        Only passages sharing at least one (stemmed, non-stopword) term with the query are returned,
        so the list is shorter than ``k`` (maybe empty) when few passages match.
        """
        if self.bm25 is None:
            raise RuntimeError("the retriever has no index yet: call build() or load_or_build()")
        terms = tokenize([query])[0]
        if not terms or k < 1:
            return []
        scores = self.bm25.get_scores(terms)
        candidates = np.flatnonzero(scores > 0)
        if len(candidates) > k:
            part = candidates[np.argpartition(-scores[candidates], k - 1)[:k]]
            # argpartition breaks ties arbitrarily: keep every passage tied with the k-th score too.
            candidates = candidates[scores[candidates] >= scores[part].min()]
        order = sorted(candidates.tolist(), key=lambda i: (-float(scores[i]), i))[:k]
        return [Hit(self.corpus[i], float(scores[i]), rank) for rank, i in enumerate(order)]

    def has_terms(self, query: str) -> bool:
        """Whether ``query`` has any searchable term (not only stopwords, punctuation or one-letter words)."""
        return bool(tokenize([query])[0])


# ------------------------------------------------------------------------------ the process cache

_SHARED: dict[str, Retriever] = {}
_SMALL: OrderedDict[str, Retriever] = OrderedDict()
_LOCK = threading.Lock()


def get_retriever(
    corpus: Corpus, *, cache_dir: str | os.PathLike | None = None, k1: float = 1.5, b: float = 0.75
) -> Retriever:
    """The retriever of ``corpus``, built at most once per process (and once per cache dir on disk).

    Persisted corpora are kept for the life of the process and saved to / loaded from the disk cache;
    the others (the generator's per-question worlds) are kept in a small LRU cache and never saved.
    """
    retriever = Retriever(corpus, k1=k1, b=b)
    key = retriever.key
    with _LOCK:
        found = _SHARED.get(key) or _SMALL.get(key)
        if found is not None:
            if not corpus.persist:
                _SMALL.move_to_end(key)
            return found
    if corpus.persist:
        retriever.load_or_build(cache_dir)
    else:
        retriever.build()
    with _LOCK:
        if corpus.persist:
            return _SHARED.setdefault(key, retriever)
        _SMALL[key] = retriever
        while len(_SMALL) > SMALL_CACHE_SIZE:
            _SMALL.popitem(last=False)
        return retriever


def clear_memory_cache() -> None:
    """Forget every retriever of this process (the disk cache stays): the next start is a 'second start'."""
    with _LOCK:
        _SHARED.clear()
        _SMALL.clear()
