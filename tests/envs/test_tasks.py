"""Task sources: spec strings, clear errors, stable disjoint splits."""

from __future__ import annotations

import gymnasium as gym
import pytest

import whale_envs  # noqa: F401
from whale_envs.tasks import SPLITS, TaskSourceError, make_source, parse_spec, split_ids, split_of


def test_parse_spec():
    assert parse_spec("generated") == ("generated", None, {})
    assert parse_spec("lichess:data/p.csv") == ("lichess", "data/p.csv", {})
    assert parse_spec("generated?difficulty=2&seed=7&flag=true&rate=0.5&name=x") == (
        "generated",
        None,
        {"difficulty": 2, "seed": 7, "flag": True, "rate": 0.5, "name": "x"},
    )
    assert parse_spec("lichess:p.csv?themes=mateIn1,fork") == ("lichess", "p.csv", {"themes": "mateIn1,fork"})
    with pytest.raises(TaskSourceError, match="not key=value"):
        parse_spec("generated?difficulty")
    with pytest.raises(TaskSourceError, match="non-empty"):
        parse_spec("  ")


def test_split_is_a_pure_function_of_the_id():
    assert split_of("tewjc") == split_of("tewjc")
    counts = {name: 0 for name in SPLITS}
    for i in range(20_000):
        counts[split_of(f"task-{i}")] += 1
    for name, share in SPLITS.items():
        assert abs(counts[name] / 20_000 - share) < 0.02, counts


@pytest.mark.parametrize("spec", ["lichess", "epd", "generated?size=500"])
def test_splits_are_disjoint_and_cover_the_source(spec):
    source = make_source("chess", spec)
    parts = {name: set(split_ids(source, name)) for name in SPLITS}
    assert sum(len(p) for p in parts.values()) == len(set(source.ids())) == len(split_ids(source, "all"))
    assert not (parts["train"] & parts["test"]) and not (parts["train"] & parts["harness"])
    assert not (parts["harness"] & parts["test"])
    assert all(parts.values())


def test_unknown_kind_names_the_known_ones():
    with pytest.raises(TaskSourceError, match=r"unknown task source kind 'nope'.*epd, generated, lichess"):
        make_source("chess", "nope")
    with pytest.raises(TaskSourceError, match="unknown domain"):
        make_source("cooking", "generated")


def test_missing_file_is_named():
    with pytest.raises(TaskSourceError, match=r"file not found: .*missing\.csv"):
        gym.make("whale/Chess-v0", tasks="lichess:missing.csv")


def test_malformed_rows_are_named_with_file_and_row(tmp_path):
    header = "PuzzleId,FEN,Moves,Rating,RatingDeviation,Popularity,NbPlays,Themes,GameUrl,OpeningTags\n"
    good = "ok1,r5k1/pp3p1p/2b2qp1/3pr3/8/4P2P/R1PN1PP1/Q3K2R w K - 0 19,a2a7 e5e3,1493,76,94,1,fork,u,\n"
    cases = {
        "bad FEN": "bad1,not-a-fen w - - 0 1,a2a7 e5e3,1500,1,1,1,fork,u,\n",
        "not legal": "bad2,r5k1/pp3p1p/2b2qp1/3pr3/8/4P2P/R1PN1PP1/Q3K2R w K - 0 19,a2a7 e5e1,1500,1,1,1,x,u,\n",
        "not an integer": "bad3,r5k1/pp3p1p/2b2qp1/3pr3/8/4P2P/R1PN1PP1/Q3K2R w K - 0 19,a2a7 e5e3,high,1,1,1,x,u,\n",
        "at least one solver move": "bad4,r5k1/pp3p1p/2b2qp1/3pr3/8/4P2P/R1PN1PP1/Q3K2R w K - 0 19,a2a7,1500,1,1,1,x,u,\n",
    }
    for what, row in cases.items():
        path = tmp_path / "p.csv"
        path.write_text(header + good + row)
        with pytest.raises(TaskSourceError) as err:
            make_source("chess", f"lichess:{path}")
        assert str(path) in str(err.value) and "row 3" in str(err.value) and what in str(err.value)
    path.write_text("a,b\n1,2\n")
    with pytest.raises(TaskSourceError, match="missing column"):
        make_source("chess", f"lichess:{path}")
    epd = tmp_path / "x.epd"
    epd.write_text('6k1/5ppp/8/8/8/8/5PPP/R5K1 w - - bm Ra8; id "a";\n6k1/8/8/8/8/8/8/R5K1 w - - bm Qz9;\n')
    with pytest.raises(TaskSourceError, match=r"x\.epd, line 2: malformed EPD"):
        make_source("chess", f"epd:{epd}")


def test_bad_options_are_clear_errors():
    with pytest.raises(TaskSourceError, match=r"unknown option\(s\) 'colour'"):
        make_source("chess", "lichess?colour=white")
    with pytest.raises(TaskSourceError, match=r"difficulty \(level\) must be within 1-4"):
        make_source("chess", "generated?difficulty=9")
    with pytest.raises(TaskSourceError, match="size must be a positive integer"):
        gym.make("whale/Chess-v0", task_options={"size": 0})
    with pytest.raises(ValueError, match="unknown split 'validation'"):
        gym.make("whale/Chess-v0", split="validation")
    with pytest.raises(TaskSourceError, match="no puzzle passes the filters"):
        make_source("chess", "lichess?min_rating=5000")


def test_reset_by_task_id_and_unknown_id():
    env = gym.make("whale/Chess-v0", tasks="lichess", split="test")
    task_id = env.unwrapped.task_ids[3]
    _, info = env.reset(options={"task_id": task_id})
    assert info["task_id"] == task_id
    with pytest.raises(ValueError, match="not in task source"):
        env.reset(options={"task_id": "no-such-puzzle"})
