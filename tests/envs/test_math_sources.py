"""Math task sources: GSM8K / MATH loaders, their errors, and the generator families and levels."""

from __future__ import annotations

import hashlib
import json
import re
from fractions import Fraction

import pytest

from whale_envs.data import bundled_path
from whale_envs.math.generators import FAMILIES, LEVELS, generate_pairs, make_generated
from whale_envs.math.generators.arithmetic import ArithmeticConfig, problems
from whale_envs.math.sources import load_gsm8k, load_math
from whale_envs.math.verify import check
from whale_envs.tasks import TaskSourceError, make_source, split_ids, split_of

# ------------------------------------------------------------------------------------ bundled files


@pytest.mark.parametrize(
    ("folder", "sha256"),
    [
        ("gsm8k", "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14"),
        ("math500", "35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132"),
    ],
)
def test_bundled_files_are_the_unchanged_originals(folder, sha256):
    data = bundled_path(folder, "test.jsonl").read_bytes()
    assert hashlib.sha256(data).hexdigest() == sha256
    assert sha256 in bundled_path(folder, "SOURCE.md").read_text()


def test_gsm8k_ids_answers_and_difficulty():
    source = load_gsm8k()
    ids = source.ids()
    assert len(ids) == 1319 and ids[0] == "gsm8k-test-0000" and ids[1] == "gsm8k-test-0001"
    first = source.get("gsm8k-test-0000")
    assert first.payload.question.startswith("Janet") and first.payload.answer == "18"
    assert first.meta["difficulty"] == 2 and first.meta["row"] == 1
    assert "####" not in first.payload.question


def test_math_ids_levels_subjects_and_filters():
    source = load_math()
    task = source.get("test/precalculus/807.json")
    assert task.payload.answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert task.meta["difficulty"] == 2 and task.meta["subject"] == "Precalculus"
    hard = load_math(levels="4-5", subjects="Algebra,Geometry")
    assert 0 < len(hard) < 200
    assert all(t.meta["level"] in (4, 5) and t.meta["subject"] in ("Algebra", "Geometry") for t in hard)
    via_spec = make_source("math", "math?levels=1")
    assert len(via_spec.ids()) == 43  # SOURCE.md: 43 level-1 rows


def write(tmp_path, name, rows):
    path = tmp_path / name
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return str(path)


def test_user_files_load_with_the_original_math_format(tmp_path):
    path = write(
        tmp_path,
        "mine.jsonl",
        [
            {"problem": "1+1?", "solution": "It is $\\boxed{2}$.", "level": "Level 2", "type": "Algebra"},
            {"problem": "2+2?", "answer": "4"},
        ],
    )
    source = make_source("math", f"math:{path}")
    assert source.ids() == ["math-0", "math-1"]
    first = source.get("math-0")
    assert first.payload.answer == "2" and first.meta["level"] == 2 and first.meta["subject"] == "Algebra"


@pytest.mark.parametrize(
    ("kind", "rows", "message"),
    [
        ("gsm8k", [{"question": "q", "answer": "a\n#### 3"}, "{not json"], "line 2: not valid JSON"),
        (
            "gsm8k",
            [{"question": "q", "answer": "no final answer"}],
            "line 1: the 'answer' field has no final",
        ),
        ("gsm8k", [{"answer": "#### 3"}], "line 1: missing or empty field 'question'"),
        ("math", [{"problem": "p", "solution": "no box"}], "line 1: no 'answer' field"),
        ("math", [{"problem": "p", "answer": "1", "level": "hard"}], "line 1: 'level' must be"),
        ("math", [[1, 2]], "line 1: expected a JSON object"),
    ],
)
def test_malformed_rows_name_the_file_the_row_and_the_problem(tmp_path, kind, rows, message):
    path = write(tmp_path, "bad.jsonl", rows)
    with pytest.raises(TaskSourceError) as err:
        make_source("math", f"{kind}:{path}")
    assert path in str(err.value) and message in str(err.value)


def test_missing_file_and_bad_options_are_clear():
    with pytest.raises(TaskSourceError, match="file not found"):
        make_source("math", "gsm8k:/nonexistent/file.jsonl")
    with pytest.raises(TaskSourceError, match="unknown families"):
        make_source("math", "generated?families=calculus")
    with pytest.raises(TaskSourceError, match="within 1-5"):
        make_source("math", "generated?difficulty=0-9")
    with pytest.raises(TaskSourceError, match="takes no file"):
        make_source("math", "generated:some.jsonl")


# ------------------------------------------------------------------------------------ generators


def numbers_in(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", text)]


def solve_independently(family: str, question: str) -> Fraction:
    """Recompute a generated answer from the question text alone (not with the generator's code)."""
    if family in ("arithmetic", "fractions"):
        expr = question.removeprefix("What is ").removesuffix("?")
        return Fraction(eval(expr.replace("/", "*Fraction(1)/"), {"Fraction": Fraction}))  # noqa: S307
    if family == "linear":
        lhs, rhs = question.removeprefix("Solve for x: ").split(" = ")

        def value(side: str, x: Fraction) -> Fraction:
            code = re.sub(r"(\d)x", r"\1*x", side).replace(")(", ")*(")
            code = re.sub(r"(\d)\(", r"\1*(", code)
            return Fraction(eval(code, {"x": x}))  # noqa: S307

        f0 = value(lhs, Fraction(0)) - value(rhs, Fraction(0))
        f1 = value(lhs, Fraction(1)) - value(rhs, Fraction(1))
        return -f0 / (f1 - f0)
    raise AssertionError(family)


@pytest.mark.parametrize("family", ["arithmetic", "fractions", "linear"])
@pytest.mark.parametrize("level", LEVELS)
def test_generated_answers_are_right(family, level):
    for question, answer in generate_pairs(family, 60, difficulty=level, seed=3):
        assert solve_independently(family, question) == Fraction(answer), (question, answer)
        assert check(answer, answer).solved
        assert not check(str(Fraction(answer) + 1), answer).solved


@pytest.mark.parametrize("level", LEVELS)
def test_word_problem_answers_are_non_negative_integers_that_verify(level):
    for question, answer in generate_pairs("word", 60, difficulty=level, seed=3):
        assert int(answer) >= 0 and question.endswith("?")
        assert check(f"\\boxed{{{answer}}}", answer).solved


def test_difficulty_spans_single_digits_to_tool_sized_numbers():
    for family in FAMILIES:
        level1 = generate_pairs(family, 100, difficulty=1, seed=0)
        assert all(max(numbers_in(q)) <= 18 for q, _ in level1), family  # single-digit inputs
        level5 = generate_pairs(family, 30, difficulty=5, seed=0)
        assert sum(len(q) for q, _ in level5) > 2 * sum(len(q) for q, _ in level1[:30]), family
    arithmetic1 = generate_pairs("arithmetic", 200, difficulty=1)
    assert all(max(numbers_in(q)) <= 9 and 0 <= int(a) <= 18 for q, a in arithmetic1)
    medium = generate_pairs("arithmetic", 200, difficulty=2)
    for q, a in medium:  # CALIBRATION's "medium" band: numbers 5-20 and a third number 1-9
        a1, a2, a3 = numbers_in(q)
        assert 5 <= a1 <= 20 and 5 <= a2 <= 20 and 1 <= a3 <= 9 and int(a) >= 0
    big = generate_pairs("arithmetic", 50, difficulty=5)
    assert all(len(a.lstrip("-")) >= 8 for _, a in big)


def test_same_seed_same_problems_and_family_configs_validate():
    assert generate_pairs("linear", 20, difficulty=3, seed=9) == generate_pairs(
        "linear", 20, difficulty=3, seed=9
    )
    assert generate_pairs("linear", 20, difficulty=3, seed=9) != generate_pairs(
        "linear", 20, difficulty=3, seed=8
    )
    assert generate_pairs("word", 5, seed=1) == generate_pairs("word", 10, seed=1)[:5]
    assert problems(ArithmeticConfig(difficulty=2, seed=4), 5) == generate_pairs(
        "arithmetic", 5, difficulty=2, seed=4
    )
    with pytest.raises(ValueError, match="difficulty"):
        problems(ArithmeticConfig(difficulty=6))
    with pytest.raises(ValueError, match="unknown math family"):
        generate_pairs("calculus", 3)


def test_generated_source_ids_families_levels_and_splits():
    source = make_generated(families="arithmetic,linear", difficulty="2-3", seed=5, size=40)
    ids = source.ids()
    assert ids[0] == "math-gen-s5-arithmetic-d2-00000" and ids[1] == "math-gen-s5-linear-d2-00001"
    assert ids[2] == "math-gen-s5-arithmetic-d3-00002"
    tasks = [source.get(i) for i in ids]
    assert {(t.meta["family"], t.meta["difficulty"]) for t in tasks} == {
        (f, d) for f in ("arithmetic", "linear") for d in (2, 3)
    }
    again = make_generated(families="arithmetic,linear", difficulty="2-3", seed=5, size=40)
    assert [again.get(i).payload for i in ids] == [t.payload for t in tasks]
    by_split: dict[str, set[str]] = {}
    for t in tasks:  # the same question never lands in two splits
        by_split.setdefault(split_of(t.id), set()).add(t.payload.question)
    for a in by_split:
        for b in by_split:
            assert a == b or not (by_split[a] & by_split[b])
    assert set(split_ids(source, "test")) <= set(ids)
