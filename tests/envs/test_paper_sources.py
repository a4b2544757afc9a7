"""The paper's data files load: Search-R1, DAPO, AIME and Lichess files built here in the
real schemas with pyarrow (nothing third-party is bundled), with the documented filters and splits."""

from __future__ import annotations

import csv
import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from whale_envs.tasks import TaskSourceError, make_source, split_ids

DAPO_WRAP = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)


def searchr1_rows():
    """Rows as Search-R1's qa_search_*_merge.py writes them."""
    rows = []
    for i, (source, q, answers) in enumerate(
        [
            ("nq", "who wrote the hobbit", ["J. R. R. Tolkien", "Tolkien"]),
            ("nq", "capital of france", ["Paris"]),
            ("hotpotqa", "which river flows through paris", ["Seine"]),
            ("bamboogle", "who founded the city of lyon", ["Lucius Munatius Plancus"]),
        ]
    ):
        rows.append(
            {
                "id": f"train_{i % 2}",  # the merged files repeat ids across data sources
                "question": q,
                "golden_answers": answers,
                "data_source": source,
                "prompt": [{"role": "user", "content": f"Answer the question... Question: {q}\n"}],
                "ability": "fact-reasoning",
                "reward_model": {"style": "rule", "ground_truth": {"target": answers}},
                "extra_info": {"split": "train", "index": i},
            }
        )
    return rows


def write_parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def test_searchr1_parquet_keeps_questions_answers_and_data_source(tmp_path):
    path = write_parquet(tmp_path / "train.parquet", searchr1_rows())
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "0", "contents": '"Paris"\nParis is the capital of France.'}) + "\n")
    src = make_source("search", f"searchr1:{path}?corpus={corpus}")
    ids = list(src.ids())
    assert ids == ["nq-train_0", "nq-train_1", "hotpotqa-train_0", "bamboogle-train_1"]
    task = src.get("nq-train_0")
    assert task.payload.question == "who wrote the hobbit"
    assert task.payload.answers == ("J. R. R. Tolkien", "Tolkien")
    assert task.meta["data_source"] == "nq" and len(task.payload.corpus) == 1
    only = make_source("search", f"searchr1:{path}?corpus={corpus}&data_sources=hotpotqa")
    assert list(only.ids()) == ["hotpotqa-train_0"]


def test_searchr1_answers_from_reward_model_when_no_golden_answers(tmp_path):
    rows = [{k: v for k, v in r.items() if k != "golden_answers"} for r in searchr1_rows()]
    path = write_parquet(tmp_path / "test.parquet", rows)
    src = make_source("search", f"searchr1:{path}?retriever=http://127.0.0.1:9/retrieve")
    qa = src.get("hotpotqa-train_0").payload
    assert qa.answers == ("Seine",) and qa.corpus is None and qa.retriever == "http://127.0.0.1:9/retrieve"


def test_searchr1_errors_name_file_and_row(tmp_path):
    rows = searchr1_rows()
    rows[2] = {
        **rows[2],
        "golden_answers": [],
        "reward_model": {"style": "rule", "ground_truth": {"target": []}},
    }
    path = write_parquet(tmp_path / "bad.parquet", rows)
    with pytest.raises(TaskSourceError, match=r"bad\.parquet, row 3: no gold answers"):
        make_source("search", f"searchr1:{path}?retriever=http://127.0.0.1:9/retrieve")
    with pytest.raises(TaskSourceError, match="retriever must be a URL"):
        make_source("search", f"searchr1:{path}?retriever=localhost")


def test_searchr1_without_corpus_or_retriever_is_a_clear_env_error(tmp_path):
    import gymnasium as gym

    path = write_parquet(tmp_path / "q.parquet", searchr1_rows())
    with pytest.raises(ValueError, match="no local corpus: pass retriever=URL"):
        gym.make("whale/SearchQA-v0", tasks=f"searchr1:{path}", split="all")


def dapo_rows(repeat=3):
    problems = [("What is 2+3?", "5"), ("Find x if 2x = 10.", "5"), ("Compute 7*6.", "42")]
    rows = []
    for _ in range(repeat):  # the released file repeats every problem
        for i, (problem, answer) in enumerate(problems):
            rows.append(
                {
                    "data_source": "math_dapo",
                    "prompt": [{"content": DAPO_WRAP.format(problem), "role": "user"}],
                    "ability": "MATH",
                    "reward_model": {"ground_truth": answer, "style": "rule-lighteval/MATH_v2"},
                    "extra_info": {"index": f"uuid-{i}"},
                }
            )
    return rows


def test_dapo_unwraps_the_prompt_and_dedups(tmp_path):
    path = write_parquet(tmp_path / "dapo.parquet", dapo_rows())
    src = make_source("math", f"dapo:{path}")
    assert list(src.ids()) == ["uuid-0", "uuid-1", "uuid-2"]
    task = src.get("uuid-2")
    assert task.payload.question == "Compute 7*6." and task.payload.answer == "42"
    assert task.meta["data_source"] == "math_dapo"
    every = make_source("math", f"dapo:{path}?dedup=false")
    assert len(every.ids()) == 9 and "dapo-9" in every.ids()  # repeated indexes fall back to the row


def test_verl_math_reads_jsonl_too(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in dapo_rows(1)) + "\n")
    src = make_source("math", f"verl:{path}")
    assert [src.get(i).payload.answer for i in src.ids()] == ["5", "5", "42"]


def test_aime_both_releases(tmp_path):
    a24 = write_parquet(
        tmp_path / "aime24.parquet",
        [{"ID": "2024-I-1", "Problem": "Find 1+1.", "Solution": "...", "Answer": 2}],
    )
    a25 = tmp_path / "aime25.jsonl"
    a25.write_text(json.dumps({"id": 0, "problem": "Find 2+2.", "answer": "4", "year": 2025}) + "\n")
    s24, s25 = make_source("math", f"aime:{a24}"), make_source("math", f"aime:{a25}")
    assert list(s24.ids()) == ["aime-2024-I-1"] and s24.get("aime-2024-I-1").payload.answer == "2"
    assert s24.get("aime-2024-I-1").meta["data_source"] == "aime2024"
    assert list(s25.ids()) == ["aime2025-0"] and s25.get("aime2025-0").meta["data_source"] == "aime2025"
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"id": 1, "problem": "x", "answer": ""}) + "\n")
    with pytest.raises(TaskSourceError, match=r"empty\.jsonl, line 1: missing or empty field 'answer'"):
        make_source("math", f"aime:{empty}")


# ------------------------------------------------------------------------------ Lichess database

HEADER = ["PuzzleId", "FEN", "Moves", "Rating", "RatingDeviation", "Popularity", "NbPlays", "Themes",
          "GameUrl", "OpeningTags"]  # fmt: skip
# Scholar's-mate setups: the setup move, then the solver's moves.
PUZZLES = [
    ("p1", "r1bqkbnr/pppp1ppp/2n5/4p3/2B1P3/5Q2/PPPP1PPP/RNB1K1NR b KQkq - 3 3", "a7a6 f3f7", 900, "mate mateIn1"),
    ("p3", "rnbqkbnr/pppp1ppp/8/4p3/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 0 2", "g1f3 b8c6 f1b5 a7a6", 1500, "opening"),
    ("p5", "rnbqkbnr/pppp1ppp/8/4p3/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 0 2",
     "g1f3 b8c6 f1b5 a7a6 b5a4 g8f6", 1700, "opening long"),
]  # fmt: skip


def lichess_csv() -> str:
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(HEADER)
    for pid, fen, moves, rating, themes in PUZZLES:
        w.writerow([pid, fen, moves, rating, 80, 95, 1000, themes, f"https://lichess.org/{pid}", ""])
    return out.getvalue()


def test_lichess_csv_zst_and_parquet_with_ply_filters(tmp_path):
    import zstandard

    plain = tmp_path / "lichess_db_puzzle.csv"
    plain.write_text(lichess_csv())
    zst = tmp_path / "lichess_db_puzzle.csv.zst"
    zst.write_bytes(zstandard.ZstdCompressor().compress(lichess_csv().encode()))
    rows = [
        dict(zip(HEADER, [p[0], p[1], p[2], p[3], 80, 95, 1000, p[4].split(), "", ""], strict=True))
        for p in PUZZLES
    ]
    parquet = write_parquet(tmp_path / "puzzles.parquet", rows)  # Themes as a list, as the HF export
    for path in (plain, zst, parquet):
        src = make_source("chess", f"lichess:{path}")
        assert list(src.ids()) == ["p1", "p3", "p5"], path
        assert [src.get(i).meta["plies"] for i in src.ids()] == [1, 3, 5]
        short = make_source("chess", f"lichess:{path}?min_plies=2&max_plies=4")
        assert list(short.ids()) == ["p3"]
        assert make_source("chess", f"lichess:{path}?themes=mateIn1").ids() == ["p1"]
    with pytest.raises(TaskSourceError, match="max_plies must be a positive whole number"):
        make_source("chess", f"lichess:{plain}?max_plies=0")


def test_lichess_bad_move_names_the_row(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text(lichess_csv().replace("f1b5 a7a6,1500", "f1b5 a7a6 h1h8,1500", 1))
    with pytest.raises(TaskSourceError, match=r"bad\.csv, row 3 \(p3\): move 5 'h1h8' is not legal"):
        make_source("chess", f"lichess:{bad}")


def test_paper_sources_split_by_id_and_whole_files(tmp_path):
    path = write_parquet(tmp_path / "dapo.parquet", dapo_rows(1))
    src = make_source("math", f"dapo:{path}")
    parts = [set(split_ids(src, s)) for s in ("train", "harness", "test")]
    assert set().union(*parts) == set(src.ids()) and sum(map(len, parts)) == len(src.ids())
    assert split_ids(src, "all") == list(src.ids())


def test_saved_dataset_folder_and_shards(tmp_path):
    import datasets

    rows = searchr1_rows()
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    shards = tmp_path / "shards"
    shards.mkdir()
    write_parquet(shards / "part-0.parquet", rows[:2])
    write_parquet(shards / "part-1.parquet", rows[2:])
    url = "retriever=http://127.0.0.1:9/retrieve"
    a = make_source("search", f"searchr1:{tmp_path / 'saved'}?{url}")
    b = make_source("search", f"searchr1:{shards}?{url}")
    assert (
        list(a.ids())
        == list(b.ids())
        == ["nq-train_0", "nq-train_1", "hotpotqa-train_0", "bamboogle-train_1"]
    )


@pytest.mark.slow  # the session's tiny model is built first (about a minute alone; shared in a full run)
def test_eval_reports_each_data_source_and_takes_env_options(tmp_path, fresh_model_dir, capsys):
    from whale_train.cli import main

    rows = dapo_rows(1)
    rows[1] = {**rows[1], "data_source": "aime2024"}
    path = write_parquet(tmp_path / "mixed.parquet", rows)
    out = tmp_path / "eval"
    argv = ["eval", "--env", "whale/Math-v0", "--harness", "math/paper_h0", "--model", fresh_model_dir,
            "--tasks", f"verl:{path}", "--split", "all", "--k", "1", "--out", str(out), "--trusted",
            "--env-option", "verifier=dapo", "--env-option", "max_tool_calls=0"]  # fmt: skip
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    by_source = results["by_data_source"]
    assert by_source["math_dapo"]["tasks"] == 2 and by_source["aime2024"]["tasks"] == 1
    assert by_source["average"]["mean"] == pytest.approx(
        (by_source["math_dapo"]["mean"] + by_source["aime2024"]["mean"]) / 2
    )
    assert "data source average" in capsys.readouterr().out
    assert main([*argv[:-4], "--env-option", "verifier"]) == 2
    assert "expected KEY=VALUE" in capsys.readouterr().err


# ------------------------------------------------------------------ datasets in the Hugging Face cache


def put_in_datasets_cache(cache, repo_id, splits, config="default"):
    """Prepare ``splits`` ({split: rows}) in the ``datasets`` cache ``cache`` as ``load_dataset(repo_id)``
    leaves it after a download: the packaged parquet builder writes the arrow files and dataset_info.json,
    under ``ORG___name/CONFIG/VERSION/HASH/`` (the folder its ``cache`` builder reloads offline)."""
    import shutil

    from datasets.naming import camelcase_to_snakecase
    from datasets.packaged_modules.parquet.parquet import Parquet

    org, name = repo_id.split("/")
    snake = camelcase_to_snakecase(name)
    raw = cache.parent / f"raw-{snake}-{config}"
    raw.mkdir(parents=True)
    files = {s: [write_parquet(raw / f"{s}.parquet", rows)] for s, rows in splits.items()}
    builder = Parquet(cache_dir=str(raw / "build"), dataset_name=snake, data_files=files, hash="0123abcd")
    builder.download_and_prepare()
    target = cache / f"{org}___{snake}" / config / "0.0.0" / "0123abcd"
    shutil.copytree(builder.cache_dir, target)
    info = json.loads((target / "dataset_info.json").read_text())
    (target / "dataset_info.json").write_text(json.dumps({**info, "config_name": config}))


def put_in_hub_cache(hub, repo_id, splits, revision="5f3c0ffee"):
    """The hub file cache as ``huggingface-cli download --repo-type dataset repo_id`` fills it."""
    repo = hub / ("datasets--" + repo_id.replace("/", "--"))
    data = repo / "snapshots" / revision / "data"
    data.mkdir(parents=True)
    for split, rows in splits.items():
        write_parquet(data / f"{split}-00000-of-00001.parquet", rows)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    """An empty HF_HOME for the test; online mode as a user's shell has it (the loader must force offline)."""
    import datasets.config
    import huggingface_hub.constants

    home = tmp_path / "hf"
    for var in ("HF_DATASETS_CACHE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    calls = []
    import huggingface_hub

    for method in ("hf_hub_download", "dataset_info", "list_repo_tree", "snapshot_download"):
        monkeypatch.setattr(huggingface_hub.HfApi, method, lambda *a, _m=method, **k: calls.append(_m))
    yield home
    assert calls == [], f"the hub was asked: {calls}"


def test_hub_names_load_offline_from_the_datasets_cache_for_every_kind(hf_home):
    cache = hf_home / "datasets"
    put_in_datasets_cache(cache, "BytedTsinghua-SIA/DAPO-Math-17k", {"train": dapo_rows(2)})
    aime = [{"id": 60, "problem": "Find 2+2.", "answer": "4", "year": 2025}]
    put_in_datasets_cache(cache, "math-ai/aime25", {"test": aime})
    put_in_datasets_cache(cache, "PeterJinGo/nq_hotpotqa_train", {"train": searchr1_rows()[:2]})
    put_in_datasets_cache(cache, "PeterJinGo/nq_hotpotqa_train", {"test": searchr1_rows()[2:]}, config="eval")
    puzzles = [dict(zip(HEADER, [*p[:4], 80, 95, 1000, p[4].split(), "", ""], strict=True)) for p in PUZZLES]
    put_in_datasets_cache(cache, "Lichess/chess-puzzles", {"train": puzzles})

    dapo = make_source("math", "dapo:hf://BytedTsinghua-SIA/DAPO-Math-17k:train")
    assert list(dapo.ids()) == ["uuid-0", "uuid-1", "uuid-2"]  # deduplicated as from a file
    assert dapo.get("uuid-2").payload.question == "Compute 7*6."
    assert make_source("math", "verl:hf://BytedTsinghua-SIA/DAPO-Math-17k").ids()[-1] == "verl-6"
    assert make_source("math", "aime:hf://math-ai/aime25").get("aime2025-60").payload.answer == "4"
    url = "retriever=http://127.0.0.1:9/retrieve"
    train = make_source("search", f"searchr1:hf://PeterJinGo/nq_hotpotqa_train/default?{url}")
    assert list(train.ids()) == ["nq-train_0", "nq-train_1"]
    test = make_source("search", f"searchr1:hf://PeterJinGo/nq_hotpotqa_train/eval:test?{url}")
    assert list(test.ids()) == ["hotpotqa-train_0", "bamboogle-train_1"]
    chess = make_source("chess", "lichess:hf://Lichess/chess-puzzles?max_plies=3")
    assert list(chess.ids()) == ["p1", "p3"]
    import datasets.config

    assert datasets.config.HF_HUB_OFFLINE is False  # offline only for the loader's call, then restored


def test_hub_names_load_from_the_hub_file_cache(hf_home):
    put_in_hub_cache(hf_home / "hub", "BytedTsinghua-SIA/DAPO-Math-17k", {"train": dapo_rows(1)})
    src = make_source("math", "dapo:hf://BytedTsinghua-SIA/DAPO-Math-17k")
    assert [src.get(i).payload.answer for i in src.ids()] == ["5", "5", "42"]


def test_hub_name_errors_are_one_line_and_name_the_dataset(hf_home):
    with pytest.raises(TaskSourceError) as missing:
        make_source("math", "dapo:hf://BytedTsinghua-SIA/DAPO-Math-17k:train")
    msg = str(missing.value)
    assert "\n" not in msg and msg.startswith("dapo: hf://BytedTsinghua-SIA/DAPO-Math-17k:train: not in")
    assert f"HF_HOME={hf_home}" in msg and "load_dataset('BytedTsinghua-SIA/DAPO-Math-17k')" in msg
    put_in_hub_cache(hf_home / "hub", "org/two", {"train": dapo_rows(1), "test": dapo_rows(1)})
    with pytest.raises(TaskSourceError, match=r"hf://org/two has several splits \(.*\); name one"):
        make_source("math", "dapo:hf://org/two")
    with pytest.raises(TaskSourceError, match=r"hf://org/two:dev: cannot be read .*Unknown split"):
        make_source("math", "dapo:hf://org/two:dev")
    with pytest.raises(TaskSourceError, match=r"expected hf://ORG/NAME\[/CONFIG\]\[:SPLIT\]"):
        make_source("math", "dapo:hf://just-a-name")
