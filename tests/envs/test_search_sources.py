"""SearchQA task sources: bundled samples, the question + corpus file layouts, corpus formats, errors."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from whale_envs.data import bundled_path
from whale_envs.search.sources import load_corpus, load_hotpotqa, load_musique, load_nq
from whale_envs.tasks import TaskSourceError, make_source, source_kinds

HOTPOT_DEV = bundled_path("hotpotqa", "hotpot_dev_distractor_v1.first53.json")
HOTPOT_TRAIN = bundled_path("hotpotqa", "hotpotqa_train_sample100.json")
MUSIQUE = bundled_path("musique", "musique_train_sample100.json")
NQ = bundled_path("nq_open", "NQ-open.dev.jsonl")


def write_json(path: Path, data) -> str:
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


def write_jsonl(path: Path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def hotpot_record(i: int, **changes) -> dict:
    record = {
        "_id": f"q{i}",
        "question": f"Who founded company {i}?",
        "answer": f"Founder {i}",
        "supporting_facts": [[f"Company {i}", 0], [f"Founder {i}", 0]],
        "context": [
            [f"Company {i}", [f"Company {i} is a firm.", f" It was founded by Founder {i}."]],
            [f"Founder {i}", [f"Founder {i} is a person."]],
            ["Other", ["Something else."]],
        ],
        "type": "bridge",
        "level": "easy",
    }
    record.update(changes)
    return record


# ------------------------------------------------------------------------------ bundled samples


def test_search_kinds_are_registered():
    kinds = {k.kind: k for k in source_kinds("search")}
    assert set(kinds) == {"generated", "hotpotqa", "musique", "nq", "searchr1", "verl"}
    assert kinds["nq"].path_required and not kinds["generated"].takes_path
    assert kinds["hotpotqa"].usage == "hotpotqa[:PATH]" and kinds["nq"].usage == "nq:PATH"


def test_bundled_hotpotqa_train_uses_its_corpus_file():
    src = make_source("search", "hotpotqa")
    assert len(src.ids()) == 100
    task = src.get("5a77ec115542992a6e59dff7")  # ids are the dataset's _id
    qa = task.payload
    assert qa.question == "If Gallu is a demon Lilu is what?" and qa.answers == ("a spirit",)
    assert len(qa.corpus) == 994 and qa.supporting == ("Alû", "Lilu (mythology)")
    assert task.meta["difficulty"] == "easy" and task.meta["row"] == 1
    # One corpus object shared by every question.
    assert all(src.get(i).payload.corpus is qa.corpus for i in src.ids())


def test_bundled_hotpotqa_dev_corpus_is_every_context_paragraph():
    src = make_source("search", "hotpotqa?sample=dev")
    assert len(src.ids()) == 53 and src.ids()[0] == "5a8b57f25542995d1e6f1371"
    corpus = src.get(src.ids()[0]).payload.corpus
    records = json.loads(HOTPOT_DEV.read_text(encoding="utf-8"))
    titles = {title for r in records for title, _ in r["context"]}
    assert {p.title for p in corpus.passages} == titles and len(corpus) == len(titles) == 521
    for task_id in src.ids():
        qa = src.get(task_id).payload
        assert len(qa.supporting) == 2 and all(s in corpus for s in qa.supporting)


def test_bundled_musique_with_aliases_and_supporting_paragraphs():
    src = make_source("search", "musique")
    assert len(src.ids()) == 100
    task = src.get("2hop__150763_14904")
    qa = task.payload
    assert qa.answers == ("G. Stanley Hall", "Stanley Hall") and len(qa.corpus) == 1890
    assert task.meta["difficulty"] == 2
    titles = [qa.corpus.get(s).title for s in qa.supporting]
    assert len(titles) == 2
    record = next(r for r in json.loads(MUSIQUE.read_text(encoding="utf-8")) if r["id"] == task.id)
    gold = [p for p in record["paragraphs"] if p["is_supporting"]]
    assert sorted(titles) == sorted(p["title"] for p in gold)
    assert {qa.corpus.get(s).text for s in qa.supporting} == {p["paragraph_text"] for p in gold}
    # Titles repeat in MuSiQue (several "Namibia" paragraphs): ids stay unique and stable.
    ids = [p.id for p in qa.corpus.passages]
    assert len(set(ids)) == len(ids) and "Namibia (1)" in ids


def test_sources_from_the_same_files_are_shared():
    assert make_source("search", "musique") is make_source("search", "musique")
    assert make_source("search", f"hotpotqa:{HOTPOT_TRAIN}") is make_source(
        "search", f"hotpotqa:{HOTPOT_TRAIN}"
    )


# ------------------------------------------------------------------------------ question + corpus layouts


def test_hotpotqa_file_corpus_resolution(tmp_path):
    questions = write_json(tmp_path / "qs.json", [hotpot_record(i) for i in range(3)])
    # 1. no corpus file: the context paragraphs of the question file
    src = make_source("search", f"hotpotqa:{questions}")
    corpus = src.get("q0").payload.corpus
    assert len(corpus) == 7 and src.get("q1").payload.supporting == ("Company 1", "Founder 1")
    # 2. a sibling <stem>_corpus.json is found by itself
    sibling = {f"Company {i}": [f"Company {i} text."] for i in range(3)}
    sibling.update({f"Founder {i}": f"Founder {i} text." for i in range(3)})
    write_json(tmp_path / "qs_corpus.json", sibling)
    corpus = make_source("search", f"hotpotqa:{questions}").get("q0").payload.corpus
    assert len(corpus) == 6 and corpus.get("Company 0").text == "Company 0 text."
    # 3. corpus= wins over the sibling
    other = write_jsonl(
        tmp_path / "other.jsonl",
        [{"id": f"d{i}", "title": t, "text": "x"} for i, t in enumerate(sorted(sibling))],
    )
    src = make_source("search", f"hotpotqa:{questions}?corpus={other}")
    qa = src.get("q2").payload
    assert len(qa.corpus) == 6 and [qa.corpus.get(s).title for s in qa.supporting] == [
        "Company 2",
        "Founder 2",
    ]
    assert qa.supporting[0].startswith("d")  # the corpus file's own ids


def test_musique_jsonl_questions_and_corpus_option(tmp_path):
    rows = []
    for i in range(2):
        rows.append(
            {
                "id": f"2hop__{i}_{i}",
                "question": f"Question {i}?",
                "answer": f"Answer {i}",
                "answer_aliases": [f"Alias {i}"],
                "answerable": True,
                "paragraphs": [
                    {"idx": 0, "title": "T", "paragraph_text": f"Gold text {i}.", "is_supporting": True},
                    {"idx": 1, "title": "T", "paragraph_text": f"Other text {i}.", "is_supporting": False},
                ],
            }
        )
    rows.append({"id": "3hop__x", "question": "Q?", "answer": "", "answerable": False, "paragraphs": []})
    questions = write_jsonl(tmp_path / "musique_dev.jsonl", rows)
    src = load_musique(questions)
    assert src.ids() == ["2hop__0_0", "2hop__1_1"]  # the unanswerable one is skipped
    qa = src.get("2hop__1_1").payload
    assert qa.answers == ("Answer 1", "Alias 1") and qa.corpus.get(qa.supporting[0]).text == "Gold text 1."
    assert [p.id for p in qa.corpus.passages] == ["T (1)", "T (2)", "T (3)", "T (4)"]


def test_nq_needs_a_corpus_and_uses_row_ids(tmp_path):
    with pytest.raises(TaskSourceError, match="needs a file"):
        make_source("search", "nq")
    with pytest.raises(TaskSourceError, match="corpus"):
        make_source("search", f"nq:{NQ}")
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"title": "Moon", "text": "People walked on it in 1972."}])
    src = make_source("search", f"nq:{NQ}?corpus={corpus}")
    assert len(src.ids()) == 3610 and src.ids()[:2] == ["0", "1"]
    qa = src.get("1").payload
    assert qa.question == "who wrote he ain't heavy he's my brother lyrics"
    assert qa.answers == ("Bobby Scott", "Bob Russell") and qa.supporting is None
    assert load_nq(corpus=corpus).ids() == src.ids()  # from Python the bundled questions are the default


# ------------------------------------------------------------------------------ corpus formats


def test_corpus_formats(tmp_path):
    as_dict = load_corpus(write_json(tmp_path / "a.json", {"A": ["One.", " Two."], "B": "Three."}))
    assert [(p.id, p.title, p.text) for p in as_dict.passages] == [
        ("A", "A", "One. Two."),
        ("B", "B", "Three."),
    ]

    as_list = load_corpus(
        write_json(tmp_path / "b.json", [{"title": "A", "text": "x"}, {"title": "A", "text": "y"}])
    )
    assert [p.id for p in as_list.passages] == ["A (1)", "A (2)"]

    pyserini = load_corpus(
        write_jsonl(tmp_path / "c.jsonl", [{"id": "7", "contents": '"Title"\nBody text.'}])
    )
    assert (pyserini[0].id, pyserini[0].title, pyserini[0].text) == ("7", "Title", "Body text.")

    tsv = tmp_path / "d.tsv"
    tsv.write_text("id\ttext\ttitle\n1\tFirst passage.\tOne\n2\tSecond passage.\tTwo\n", encoding="utf-8")
    dpr = load_corpus(tsv)
    assert [(p.id, p.title, p.text) for p in dpr.passages] == [
        ("1", "One", "First passage."),
        ("2", "Two", "Second passage."),
    ]

    gz = tmp_path / "e.jsonl.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as fh:
        fh.write(json.dumps({"title": "Z", "text": "zipped"}) + "\n")
    assert load_corpus(gz)[0].text == "zipped"


def test_equal_corpora_have_equal_fingerprints(tmp_path):
    a = load_corpus(write_json(tmp_path / "a.json", {"A": "x", "B": "y"}))
    b = load_corpus(
        write_jsonl(tmp_path / "b.jsonl", [{"title": "A", "text": "x"}, {"title": "B", "text": "y"}])
    )
    c = load_corpus(write_json(tmp_path / "c.json", {"A": "x", "B": "y!"}))
    assert a.fingerprint == b.fingerprint != c.fingerprint


# ------------------------------------------------------------------------------ errors name file, row and problem


@pytest.mark.parametrize(
    ("records", "words"),
    [
        ([hotpot_record(0), hotpot_record(1, answer=3)], ["record 2", "'answer'", "a string"]),
        ([hotpot_record(0), {"question": "q"}], ["record 2", "missing field '_id'"]),
        ([hotpot_record(0, question="  ")], ["record 1", "'question' is empty"]),
        (
            [hotpot_record(0, supporting_facts=[["Nowhere", 0]])],
            ["record 1", "(q0)", "'Nowhere' is not in corpus"],
        ),
        ([hotpot_record(0, supporting_facts="Company 0")], ["record 1", "'supporting_facts'", "a list"]),
        ([hotpot_record(0), hotpot_record(0)], ["duplicate task id 'q0'"]),
        ([], ["no paragraphs to search"]),
        ({"not": "a list"}, ["expected a JSON list"]),
    ],
)
def test_hotpotqa_errors(tmp_path, records, words):
    path = write_json(tmp_path / "bad.json", records)
    with pytest.raises(TaskSourceError) as err:
        load_hotpotqa(path)
    for word in words:
        assert word in str(err.value)
    if "duplicate" not in words[0]:
        assert path in str(err.value)


def test_corpus_and_jsonl_errors(tmp_path):
    bad_line = tmp_path / "q.jsonl"
    bad_line.write_text('{"question": "q", "answer": ["a"]}\n{oops\n', encoding="utf-8")
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"title": "T", "text": "t"}])
    with pytest.raises(TaskSourceError, match=r"q\.jsonl, line 2: not valid JSON"):
        load_nq(str(bad_line), corpus=corpus)
    no_answer = write_jsonl(tmp_path / "q2.jsonl", [{"question": "q", "answer": []}])
    with pytest.raises(TaskSourceError, match=r"q2\.jsonl, line 1: 'answer' should be a non-empty list"):
        load_nq(no_answer, corpus=corpus)
    with pytest.raises(TaskSourceError, match=r"c2\.jsonl, line 2: a corpus record needs 'text'"):
        load_corpus(write_jsonl(tmp_path / "c2.jsonl", [{"title": "T", "text": "t"}, {"title": "U"}]))
    with pytest.raises(TaskSourceError, match="duplicate passage id '1'"):
        load_corpus(write_jsonl(tmp_path / "c3.jsonl", [{"id": 1, "text": "a"}, {"id": 1, "text": "b"}]))
    with pytest.raises(TaskSourceError, match="file not found"):
        load_corpus(tmp_path / "missing.jsonl")
    with pytest.raises(TaskSourceError, match="file not found"):
        make_source("search", f"musique:{tmp_path / 'missing.json'}")
    with pytest.raises(TaskSourceError, match="unknown sample 'test'"):
        make_source("search", "hotpotqa?sample=test")
    with pytest.raises(TaskSourceError, match="cannot be used with a path"):
        make_source("search", f"hotpotqa:{HOTPOT_DEV}?sample=dev")
    with pytest.raises(TaskSourceError, match="unknown option"):
        make_source("search", "musique?corpus_size=3")
