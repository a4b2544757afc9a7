"""``whale retriever recall`` scores BM25 and a dense encoder side by side on the same questions:
the dense column runs through the served index's code (a flat index per corpus) with a tiny
random encoder built here from a config, and BM25's numbers do not move with the flag."""

from __future__ import annotations

import json

import numpy as np
import pytest

from whale_envs.search.evaluate import bm25_ranker, dense_ranker, retrieval_recall
from whale_envs.tasks import make_source
from whale_train.cli import main as whale

SOURCE = "generated?size=8&difficulty=1-2&seed=3"  # eight questions, each over its own small world


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory):
    """A random 1-layer BERT with a word-piece vocabulary of the source's words (nothing downloaded)."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizer

    src = make_source("search", SOURCE)
    words = set()
    for task_id in src.ids():
        qa = src.get(task_id).payload
        for text in [qa.question, *(f"{p.title} {p.text}" for p in qa.corpus.passages)]:
            words |= {w.strip('.,"?').lower() for w in text.split()}
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ":", '"', ".", ",", "?", "query", "passage"]
    vocab = {w: i for i, w in enumerate(dict.fromkeys([*specials, *sorted(words - {""})]))}
    folder = tmp_path_factory.mktemp("tiny-encoder")
    BertTokenizer(vocab=vocab).save_pretrained(folder)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=256)  # fmt: skip
    BertModel(config).save_pretrained(folder)
    return str(folder)


def main(argv: list[str]) -> int:
    """``whale retriever recall ARGV``."""
    return whale(["retriever", "recall", *argv])


def rows(out: str) -> dict[tuple[str, str], list[str]]:
    """{(source, retriever): cells after them} of the command's markdown table."""
    table = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| `"):
            key = (cells[0], cells[1]) if not cells[1].isdigit() else (cells[0], "bm25")
            table[key] = cells[2:] if not cells[1].isdigit() else cells[1:]
    return table


def test_dense_column_runs_and_bm25_numbers_do_not_move(encoder_dir, tmp_path, capsys):
    assert main([SOURCE, "--k", "1", "3"]) == 0
    alone = rows(capsys.readouterr().out)
    index_dir = tmp_path / "indexes"
    assert main([SOURCE, "--k", "1", "3", "--encoder", encoder_dir, "--index-dir", str(index_dir)]) == 0
    both = rows(capsys.readouterr().out)
    name = f"dense ({encoder_dir.rsplit('/', 1)[-1]})"
    assert set(both) == {(f"`{SOURCE}`", "bm25"), (f"`{SOURCE}`", name)}
    assert both[(f"`{SOURCE}`", "bm25")] == alone[(f"`{SOURCE}`", "bm25")]  # BM25 unchanged by the flag
    questions, passages, r1, r3, a1, a3 = both[(f"`{SOURCE}`", name)]
    assert questions == alone[(f"`{SOURCE}`", "bm25")][0] and int(questions) > 0
    assert 0 <= float(r1) <= float(r3) <= 1 and 0 <= float(a1) <= float(a3) <= 1
    metas = [json.loads(p.read_text()) for p in index_dir.glob("*/meta.json")]  # one flat index per corpus
    src = make_source("search", SOURCE)
    corpora = {src.get(t).payload.corpus.fingerprint for t in src.ids() if src.get(t).payload.supporting}
    assert len(metas) == len(corpora) > 1 and {m["kind"] for m in metas} == {"flat"}
    assert {m["fingerprint"] for m in metas} == corpora


def test_dense_ranking_is_the_encoders_cosine_order(encoder_dir, tmp_path):
    """The dense ranker returns, for each question, its own corpus's passages in the order of the
    encoder's cosine similarity (questions grouped by corpus and batched: none mixed up)."""
    from whale_envs.search.dense import Encoder, passage_text

    enc = Encoder(encoder_dir)
    src = make_source("search", SOURCE)
    questions = [src.get(t).payload for t in src.ids()]
    ranked = dense_ranker(enc, tmp_path)(questions, 5)
    for qa, ids in zip(questions, ranked, strict=True):
        passages = enc.encode([passage_text(p) for p in qa.corpus.passages], query=False)
        scores = passages @ enc.encode([qa.question], query=True)[0]
        want = [qa.corpus.passages[i].id for i in np.argsort(-scores, kind="stable")[:5]]
        got_scores = sorted(scores[[qa.corpus.index_of(i) for i in ids]], reverse=True)
        assert len(ids) == 5 and all(i in qa.corpus for i in ids)
        np.testing.assert_allclose(got_scores, sorted(scores, reverse=True)[:5], rtol=1e-5)
        assert ids[0] == want[0] or np.isclose(scores[qa.corpus.index_of(ids[0])], scores.max())
    bm25 = retrieval_recall(SOURCE, (1, 3))
    same = retrieval_recall(SOURCE, (1, 3), ranker=bm25_ranker())
    assert bm25.recall == same.recall and bm25.retriever == "bm25"


def test_bad_encoder_folder_is_one_line(tmp_path, capsys):
    assert main([SOURCE, "--encoder", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--encoder" in err and "no config.json" in err and "Traceback" not in err


def test_rows_print_as_they_finish_and_a_rerun_resumes(encoder_dir, tmp_path, capsys, monkeypatch):
    """A run that stops part way (here: a bad second source) has printed the rows it finished; run again
    with the same --index-dir, it embeds no passage twice."""
    from whale_envs.search import dense

    index_dir = str(tmp_path / "indexes")
    args = [
        SOURCE,
        "musique:no-such-file.json",
        "--k",
        "1",
        "--encoder",
        encoder_dir,
        "--index-dir",
        index_dir,
    ]
    assert main(args) == 2
    captured = capsys.readouterr()
    name = f"dense ({encoder_dir.rsplit('/', 1)[-1]})"
    assert set(rows(captured.out)) == {(f"`{SOURCE}`", "bm25"), (f"`{SOURCE}`", name)}
    assert "no-such-file" in captured.err and "Traceback" not in captured.err
    embedded: list[int] = []
    original = dense.Encoder.encode

    def counting(self, texts, *, query):
        if not query:
            embedded.append(len(texts))
        return original(self, texts, query=query)

    monkeypatch.setattr(dense.Encoder, "encode", counting)
    assert main([SOURCE, "--k", "1", "--encoder", encoder_dir, "--index-dir", index_dir]) == 0
    assert rows(capsys.readouterr().out) == rows(captured.out) and sum(embedded) == 0


def test_prefix_flags(encoder_dir, capsys):
    assert main([SOURCE, "--encoder", encoder_dir, "--no-prefix", "--query-prefix", "query: "]) == 2
    assert "contradict" in capsys.readouterr().err


def test_the_old_module_entry_points_to_the_command():
    """``python -m whale_envs.search.evaluate`` (the docs' command before) says, in one line, what runs it now."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "whale_envs.search.evaluate"], capture_output=True, text=True
    )
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [
        "this table is `whale retriever recall [SOURCE...] [--k 1 3 5] [--encoder PATH]` now"
    ]
