"""Search QA task sources: HotpotQA, MuSiQue and NQ-open files (bundled samples or the user's), plus
the generator.

Spec strings (``tasks=`` of the env, or any ``--tasks``)::

    generated[?difficulty=1-3&distractors=2&corpus_size=40&seed=0&size=4000]   (the default, no files)
    hotpotqa                       bundled: 100 HotpotQA train questions + their 994-passage corpus
    hotpotqa?sample=dev            bundled: the first 53 questions of the official distractor dev set
    hotpotqa:QUESTIONS.json[?corpus=CORPUS]
    musique                        bundled: 100 MuSiQue-Ans train questions + their 1890-passage corpus
    musique:QUESTIONS.json[l][?corpus=CORPUS]
    nq:QUESTIONS.jsonl?corpus=CORPUS   NQ-open questions over the user's corpus (or ?retriever=URL)
    ...&retriever=URL              any of these (not generated): searched through a retrieval server
    searchr1:FILE[?corpus=CORPUS][&retriever=URL][&data_sources=nq,hotpotqa]
                                   Search-R1's verl parquet (the paper's NQ+HotpotQA train mixture and
                                   its seven-benchmark test file); also jsonl, a folder of parquet
                                   shards, a datasets.save_to_disk folder, or a dataset in the
                                   Hugging Face cache by name (hf://ORG/NAME[/CONFIG][:SPLIT],
                                   offline). ``verl:`` is the same reader under the generic name.

Search-R1 files: ``question``, ``golden_answers`` (else ``reward_model.ground_truth.target``),
``data_source`` (``nq``, ``hotpotqa``, ... kept in ``meta["data_source"]``: ``whale eval`` reports each
benchmark apart), ``id`` (task id ``<data_source>-<id>``; else ``extra_info.index``; else the row). The
passages are the ``corpus=`` file searched in process, or, with ``retriever=URL``, whatever a retrieval
server speaking Search-R1's API serves (``whale retriever serve``, or Search-R1's own server over its
21M-passage Wikipedia); one of the two is needed (the env's ``retriever=`` also works). The paper uses
each file whole: pass ``split="all"`` (the hash splits still apply to any other split name).

The corpus of a HotpotQA or MuSiQue question file is, in order: the ``corpus=`` file; else a file
``<stem>_corpus.json`` (or ``.jsonl``) beside the question file; else every context paragraph of the
question file. NQ-open has no passages, so ``corpus=`` is required (the 3610 NQ-open dev questions are
bundled: ``bundled_path("nq_open", "NQ-open.dev.jsonl")``, or ``load_nq(corpus=...)``). Corpus files (see
:func:`load_corpus`): a JSON object ``{title: text or [sentences]}``, a JSON list or JSON Lines of
``{"title", "text"}`` records (``"id"`` optional; Pyserini-style ``{"id", "contents"}`` with the title on
the first line also works), or a DPR-style TSV with ``id``, ``text`` and ``title`` columns. ``.gz`` is read
transparently (reading them: corpus_files.py).

Task ids are the dataset's own: HotpotQA ``_id``, MuSiQue ``id``, the 0-based row index for NQ-open.
A source built from the same files is built once per process and shared, corpus and all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from pathlib import Path

from whale_envs.data import bundled_path
from whale_envs.search.corpus import Corpus, SearchQuestion
from whale_envs.search.corpus_files import (  # load_corpus, read_records: importable from here as before
    build_corpus,
    clear_corpora,
    file_key,
    load_corpus,
    read_records,
    record_field,
    text_of,
)
from whale_envs.tabular import hf_cache_dirs, is_hub_name, nested, read_rows, user_prompt
from whale_envs.tasks import ListSource, Task, TaskSourceError, existing

HOTPOT_SAMPLES = {
    "train": "hotpotqa_train_sample100.json",
    "dev": "hotpot_dev_distractor_v1.first53.json",
}
MUSIQUE_SAMPLE = "musique_train_sample100.json"
NQ_SAMPLE = "NQ-open.dev.jsonl"

# (kind, question file, corpus file, options) -> source: one parse per process.
_SOURCES: dict[tuple, ListSource[SearchQuestion]] = {}


def _sibling_corpus(questions: Path) -> Path | None:
    for suffix in (".json", ".jsonl"):
        candidate = questions.with_name(f"{questions.name.split('.')[0]}_corpus{suffix}")
        if candidate.is_file():
            return candidate
    return None


class _Lookup:
    """Find supporting passages in a corpus by (title, text), falling back to a unique title."""

    def __init__(self, corpus: Corpus):
        self.corpus = corpus
        self.exact: dict[tuple[str, str], str] = {}
        self.titles: dict[str, list[str]] = {}
        for p in corpus.passages:
            self.exact.setdefault((p.title, p.text.strip()), p.id)
            self.titles.setdefault(p.title, []).append(p.id)

    def find(self, title: str, text: str | None, where: str) -> str:
        if text is not None and (title, text.strip()) in self.exact:
            return self.exact[(title, text.strip())]
        ids = self.titles.get(title, [])
        if len(ids) == 1:
            return ids[0]
        problem = "is not in" if not ids else f"matches {len(ids)} passages of"
        raise TaskSourceError(f"{where}: supporting passage {title!r} {problem} corpus {self.corpus.name!r}")


def _load(
    kind: str,
    path: str | None,
    bundled: tuple[str, str],
    corpus: str | None,
    build: Callable[[Path, str, Path | None], ListSource[SearchQuestion]],
    name: str | None = None,
    retriever: str | None = None,
) -> ListSource[SearchQuestion]:
    """The source of the question file ``path`` (default: the ``bundled`` one) over its corpus, built
    once per (kind, files) by ``build(file, name, corpus_file)`` and cached. ``retriever``: a retrieval
    server's URL that every question searches instead of the corpus (:func:`_with_retriever`)."""
    check_retriever(kind, retriever)
    file, default_name = _resolve(path, bundled, kind)
    corpus_file = _corpus_for(file, corpus)
    key = (kind, file_key(file), corpus_file and file_key(corpus_file))
    if key not in _SOURCES:
        _SOURCES[key] = build(file, name or default_name, corpus_file)
    return _with_retriever(_SOURCES[key], retriever)


def check_retriever(kind: str, retriever: str | None) -> None:
    """A ``retriever=`` option must be an http(s) URL (TaskSourceError naming the source otherwise)."""
    if retriever is None:
        return
    from whale_envs.search.remote import check_url

    try:
        check_url(retriever)
    except ValueError as exc:
        raise TaskSourceError(f"{kind}: {exc}") from None


def _with_retriever(source: ListSource[SearchQuestion], retriever: str | None) -> ListSource[SearchQuestion]:
    """``source`` with every question searching ``retriever`` (a server speaking Search-R1's API) instead
    of its local corpus, as the env's ``retriever=`` option does; the corpus stays for the supporting
    passages. Cached per (source, URL)."""
    if retriever is None:
        return source
    key = ("retriever", id(source), retriever)
    if key not in _SOURCES:
        tasks = [Task(t.id, dataclasses.replace(t.payload, retriever=retriever), t.meta) for t in source]
        sep = "&" if "?" in source.name else "?"
        _SOURCES[key] = ListSource(f"{source.name}{sep}retriever={retriever}", tasks)
    return _SOURCES[key]


def _resolve(path: str | None, bundled: tuple[str, str], what: str) -> tuple[Path, str]:
    if path:
        return existing(path, what), f"{what}:{path}"
    return bundled_path(*bundled), what


def _corpus_for(questions: Path, corpus: str | None) -> Path | None:
    if corpus is not None:
        return existing(corpus, "search corpus")
    return _sibling_corpus(questions)


def _question_corpus(
    file: Path, name: str, corpus_file: Path | None, paragraphs: Iterable[tuple[str, str]]
) -> Corpus:
    """The corpus file when there is one, else every (title, text) paragraph of the question file,
    once, in order of first appearance."""
    if corpus_file is not None:
        return load_corpus(corpus_file)
    rows = [(None, title, text) for title, text in dict.fromkeys(paragraphs)]
    if not rows:
        raise TaskSourceError(f"{file}: no paragraphs to search and no corpus file; pass corpus=PATH")
    return build_corpus(f"{name} (paragraphs of the question file)", rows, str(file))


# ------------------------------------------------------------------------------ HotpotQA


def load_hotpotqa(
    path: str | None = None,
    *,
    corpus: str | None = None,
    sample: str | None = None,
    retriever: str | None = None,
) -> ListSource[SearchQuestion]:
    """HotpotQA questions (``_id``, ``question``, ``answer``, ``supporting_facts``, ``context``).

    ``sample`` picks a bundled file when no path is given: ``train`` (default) or ``dev``. ``retriever``:
    a retrieval server's URL searched instead of the corpus (as for every search source).
    """
    if path and sample is not None:
        raise TaskSourceError("hotpotqa: 'sample' picks a bundled file; it cannot be used with a path")
    if sample is not None and sample not in HOTPOT_SAMPLES:
        raise TaskSourceError(f"hotpotqa: unknown sample {sample!r}; choose one of {sorted(HOTPOT_SAMPLES)}")
    bundled = ("hotpotqa", HOTPOT_SAMPLES[sample or "train"])
    name = f"hotpotqa?sample={sample}" if sample is not None else None
    return _load("hotpotqa", path, bundled, corpus, _build_hotpotqa, name, retriever)


def _build_hotpotqa(file: Path, name: str, corpus_file: Path | None) -> ListSource[SearchQuestion]:
    records = []
    for row, where, record in read_records(file):
        task_id = record_field(record, where, "_id")
        question = record_field(record, where, "question")
        answer = record_field(record, where, "answer")
        facts = record_field(record, where, "supporting_facts", list)
        titles = []
        for fact in facts:
            if not (isinstance(fact, list) and fact and isinstance(fact[0], str)):
                raise TaskSourceError(
                    f"{where} ({task_id}): a supporting fact should be [title, index], got {fact!r:.80}"
                )
            titles.append(fact[0])
        context: dict[str, str] = {}
        for item in record.get("context", []):
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
                raise TaskSourceError(
                    f"{where} ({task_id}): a context entry should be [title, sentences], got {item!r:.80}"
                )
            context[item[0]] = text_of(item[1], f"{where} ({task_id}), context {item[0]!r}")
        meta = {"difficulty": record.get("level"), "type": record.get("type"), "source": name, "row": row}
        records.append((where, task_id, question, answer, list(dict.fromkeys(titles)), context, meta))
    pairs = ((title, text) for *_, context, _ in records for title, text in context.items())
    corpus = _question_corpus(file, name, corpus_file, pairs)
    lookup = _Lookup(corpus)
    tasks = []
    for where, task_id, question, answer, titles, context, meta in records:
        where = f"{where} ({task_id})"
        supporting = tuple(lookup.find(t, context.get(t), where) for t in titles)
        tasks.append(Task(task_id, SearchQuestion(question, (answer,), corpus, supporting), meta))
    return _list_source(name, tasks, file)


def _list_source(name: str, tasks: list[Task[SearchQuestion]], file: Path) -> ListSource[SearchQuestion]:
    if not tasks:
        raise TaskSourceError(f"{file}: no questions")
    return ListSource(name, tasks)


# ------------------------------------------------------------------------------ MuSiQue


def load_musique(
    path: str | None = None, *, corpus: str | None = None, retriever: str | None = None
) -> ListSource[SearchQuestion]:
    """MuSiQue questions (``id``, ``question``, ``answer``, ``answer_aliases``, ``paragraphs``), JSON or
    JSON Lines. Unanswerable questions (``answerable`` false, MuSiQue-Full) are skipped. ``retriever``: a
    retrieval server's URL searched instead of the corpus."""
    return _load("musique", path, ("musique", MUSIQUE_SAMPLE), corpus, _build_musique, None, retriever)


def _build_musique(file: Path, name: str, corpus_file: Path | None) -> ListSource[SearchQuestion]:
    records = []
    for row, where, record in read_records(file):
        task_id = record_field(record, where, "id")
        if record.get("answerable") is False:
            continue
        question = record_field(record, where, "question")
        answer = record_field(record, where, "answer")
        aliases = record_field(record, where, "answer_aliases", list) if "answer_aliases" in record else []
        if not all(isinstance(a, str) for a in aliases):
            raise TaskSourceError(f"{where} ({task_id}): answer_aliases should be a list of strings")
        paragraphs = []
        for i, par in enumerate(record_field(record, where, "paragraphs", list)):
            at = f"{where} ({task_id}), paragraph {i}"
            title = record_field(par, at, "title", empty=True)
            text = record_field(par, at, "paragraph_text", empty=True)
            paragraphs.append((title, text, bool(par.get("is_supporting"))))
        hops = task_id.split("hop", 1)[0]
        meta = {"difficulty": int(hops) if hops.isdigit() else None, "source": name, "row": row}
        answers = tuple(dict.fromkeys([answer, *aliases]))
        records.append((where, task_id, question, answers, paragraphs, meta))
    pairs = ((title, text) for *_, paragraphs, _ in records for title, text, _ in paragraphs)
    corpus = _question_corpus(file, name, corpus_file, pairs)
    lookup = _Lookup(corpus)
    tasks = []
    for where, task_id, question, answers, paragraphs, meta in records:
        at = f"{where} ({task_id})"
        supporting = tuple(dict.fromkeys(lookup.find(t, x, at) for t, x, gold in paragraphs if gold))
        tasks.append(Task(task_id, SearchQuestion(question, answers, corpus, supporting or None), meta))
    return _list_source(name, tasks, file)


# ------------------------------------------------------------------------------ NQ-open


def load_nq(
    path: str | None = None, *, corpus: str | None = None, retriever: str | None = None
) -> ListSource[SearchQuestion]:
    """NQ-open questions (JSON Lines of ``question`` and ``answer`` list) over the corpus ``corpus=``, or
    searched through a retrieval server (``retriever=URL``) instead.

    Without a path (only when called from Python) the bundled NQ-open dev questions are used."""
    if corpus is None and retriever is None:
        raise TaskSourceError(
            "nq: NQ-open has no passages, so it needs a corpus or a retrieval server: "
            "'nq:QUESTIONS.jsonl?corpus=PATH' (a JSON/JSON Lines file of title+text records, or a DPR-style "
            "TSV) or 'nq:QUESTIONS.jsonl?retriever=URL'"
        )
    if corpus is None:  # the questions alone, every one searching the server
        check_retriever("nq", retriever)
        file, name = _resolve(path, ("nq_open", NQ_SAMPLE), "nq")
        key = ("nq", file_key(file), None, retriever)
        if key not in _SOURCES:
            _SOURCES[key] = _build_nq(file, name, None, retriever)
        return _SOURCES[key]
    return _load("nq", path, ("nq_open", NQ_SAMPLE), corpus, _build_nq, None, retriever)


def _build_nq(
    file: Path, name: str, corpus_file: Path | None, retriever: str | None = None
) -> ListSource[SearchQuestion]:
    shared = load_corpus(corpus_file) if corpus_file is not None else None
    tasks = []
    for index, (row, where, record) in enumerate(read_records(file)):
        question = record_field(record, where, "question")
        answers = record_field(record, where, "answer", list)
        if not answers or not all(isinstance(a, str) and a.strip() for a in answers):
            raise TaskSourceError(f"{where}: 'answer' should be a non-empty list of non-empty strings")
        meta = {"difficulty": None, "source": name, "row": row}
        tasks.append(
            Task(
                str(index),
                SearchQuestion(question, tuple(dict.fromkeys(answers)), shared, None, retriever),
                meta,
            )
        )
    where = f"corpus={corpus_file}" if corpus_file is not None else f"retriever={retriever}"
    return _list_source(f"{name}?{where}", tasks, file)


# ------------------------------------------------------------------------------ Search-R1 (verl parquet)


def _answers_of(record: dict, where: str) -> tuple[str, ...]:
    answers = record.get("golden_answers")
    if answers is None:
        answers = nested(record, "reward_model.ground_truth.target")
    if isinstance(answers, str):
        answers = [answers]
    if not isinstance(answers, (list, tuple)) or not answers:
        raise TaskSourceError(
            f"{where}: no gold answers ('golden_answers' or reward_model.ground_truth.target)"
        )
    clean = [str(a).strip() for a in answers if isinstance(a, (str, int, float)) and str(a).strip()]
    if not clean:
        raise TaskSourceError(f"{where}: the gold answers are all empty")
    return tuple(dict.fromkeys(clean))


def _question_of(record: dict, where: str) -> str:
    question = record.get("question")
    if not isinstance(question, str) or not question.strip():
        prompt = user_prompt(record) or ""
        question = prompt.rsplit("Question:", 1)[1] if "Question:" in prompt else ""
    if not question.strip():
        raise TaskSourceError(f"{where}: missing or empty field 'question'")
    return " ".join(question.split())


def load_searchr1(
    path: str,
    *,
    corpus: str | None = None,
    retriever: str | None = None,
    data_sources: str | None = None,
) -> ListSource[SearchQuestion]:
    """Search-R1 / verl question files (see the module docstring)."""
    return _load_searchr1("searchr1", path, corpus, retriever, data_sources)


def load_verl_search(
    path: str, *, corpus: str | None = None, retriever: str | None = None, data_sources: str | None = None
) -> ListSource[SearchQuestion]:
    """Any verl-format QA file: the ``searchr1`` reader under the generic name."""
    return _load_searchr1("verl", path, corpus, retriever, data_sources)


def _load_searchr1(
    kind: str, path: str, corpus: str | None, retriever: str | None, data_sources: str | None
) -> ListSource[SearchQuestion]:
    check_retriever(kind, retriever)
    hub = is_hub_name(path)  # hf://ORG/NAME: read from the Hugging Face cache, keyed by its name
    file = Path(path).expanduser()
    if not hub and not file.exists():
        raise TaskSourceError(f"{kind}: file not found: {file}")
    corpus_file = existing(corpus, "search corpus") if corpus is not None else None
    keep = {s.strip() for s in str(data_sources).split(",") if s.strip()} if data_sources else None
    key = (
        kind,
        path if hub else str(file.resolve()),
        hf_cache_dirs() if hub else file.stat().st_mtime_ns,
        corpus_file and file_key(corpus_file),
        retriever,
        data_sources,
    )
    if key in _SOURCES:
        return _SOURCES[key]
    shared = load_corpus(corpus_file) if corpus_file is not None else None
    tasks: list[Task[SearchQuestion]] = []
    seen: set[str] = set()
    for row, where, record in read_rows(path if hub else file, kind):
        source = str(record.get("data_source") or kind)
        if keep is not None and source not in keep:
            continue
        raw = record.get("id")
        if raw is None:
            raw = nested(record, "extra_info.index")
        task_id = f"{source}-{raw}" if raw is not None else f"{source}-row{row}"
        if task_id in seen:
            task_id = f"{task_id}-row{row}"
        seen.add(task_id)
        qa = SearchQuestion(_question_of(record, where), _answers_of(record, where), shared, None, retriever)
        meta = {"difficulty": source, "data_source": source, "source": f"{kind}:{path}", "row": row}
        tasks.append(Task(task_id, qa, meta))
    if not tasks:
        wanted = f" with data_source in {sorted(keep)}" if keep else ""
        raise TaskSourceError(f"{kind}:{path}: no questions{wanted}")
    options = "&".join(f"{k}={v}" for k, v in (("corpus", corpus), ("retriever", retriever)) if v)
    source = ListSource(f"{kind}:{path}" + (f"?{options}" if options else ""), tasks)
    _SOURCES[key] = source
    return source


def clear_cache() -> None:
    """Forget the sources and corpora loaded so far (files are read again on next use)."""
    _SOURCES.clear()
    clear_corpora()


#: The search env's file sources, in the order ``--help`` lists them: kind -> (loader, whether a path
#: is required, what it reads). This module caches each, keyed by every file it reads (registered with
#: ``shared=False``).
FILE_SOURCES: dict[str, tuple[Callable[..., ListSource[SearchQuestion]], bool, str]] = {
    "hotpotqa": (load_hotpotqa, False, "HotpotQA json (bundled: 100 train questions; sample=dev: 53 dev)"),
    "musique": (load_musique, False, "MuSiQue json/jsonl (bundled: 100 train questions)"),
    "searchr1": (load_searchr1, True, "Search-R1 verl parquet (corpus=PATH or retriever=URL)"),
    "verl": (load_verl_search, True, "any verl-format QA parquet (corpus=PATH or retriever=URL)"),
    "nq": (load_nq, True, "NQ-open jsonl questions over the user's corpus=PATH"),
}


def _register() -> None:
    from whale_envs.search.generator import make_generated
    from whale_envs.tasks import register_generator, register_source

    register_generator("search", make_generated, "fictional worlds, 1-3 hop questions")
    for kind, (loader, path_required, doc) in FILE_SOURCES.items():
        register_source("search", kind, loader, path_required=path_required, doc=doc, shared=False)


_register()
