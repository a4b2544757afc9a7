"""SearchQA answer scoring: SQuAD normalization, exact match against aliases, token F1."""

from __future__ import annotations

import pytest

from whale_envs.search.scoring import contains_answer, exact_match, f1_score, normalize_answer


@pytest.mark.parametrize(
    ("text", "normalized"),
    [
        ("The Eiffel Tower", "eiffel tower"),  # article and case
        ("an apple a day", "apple day"),  # every article, anywhere
        ("  Paris \n\t France  ", "paris france"),  # whitespace collapsed
        ("U.S.A.", "usa"),  # punctuation removed, not replaced
        ("Eiffel-Tower!", "eiffeltower"),
        ("“Ocean’s Eleven”", "oceans eleven"),  # Unicode quotes are punctuation too
        ("Théâtre", "théâtre"),  # accents are letters, kept
        ("ＡＢＣ", "abc"),  # full-width forms (NFKC)
        ("Theatre", "theatre"),  # 'the' inside a word is not an article
        ("anna", "anna"),
        ("3,677 seated", "3677 seated"),
        ("", ""),
    ],
)
def test_normalize_answer(text, normalized):
    assert normalize_answer(text) == normalized


@pytest.mark.parametrize(
    ("prediction", "answers"),
    [
        ("the eiffel tower", ["Eiffel Tower"]),
        ("EIFFEL TOWER.", ["Eiffel Tower"]),
        ("Eiffel   Tower", ["The Eiffel Tower"]),
        ("Stanley Hall", ["G. Stanley Hall", "Stanley Hall"]),  # any alias
        ("g stanley hall", ["G. Stanley Hall", "Stanley Hall"]),
        ("yes", ["yes"]),
    ],
)
def test_exact_match_accepts_every_surface_form(prediction, answers):
    assert exact_match(prediction, answers)
    assert f1_score(prediction, answers) == 1.0


@pytest.mark.parametrize(
    ("prediction", "answers"),
    [
        ("Eiffel", ["Eiffel Tower"]),  # partial is not exact
        ("Lee Hazlewood", ["Barton Lee Hazlewood"]),
        ("Paris", ["London"]),  # a wrong entity
        ("no", ["yes"]),
        ("", ["Paris"]),
    ],
)
def test_exact_match_rejects(prediction, answers):
    assert not exact_match(prediction, answers)


def test_f1_partial_credit_and_yes_no_rule():
    assert f1_score("Lee Hazlewood", ["Barton Lee Hazlewood"]) == pytest.approx(0.8)
    assert f1_score("the Eiffel", ["Eiffel Tower"]) == pytest.approx(2 / 3)
    assert f1_score("Paris", ["London"]) == 0.0
    assert f1_score("yes it is", ["yes"]) == 0.0  # HotpotQA: yes/no only match themselves
    assert f1_score("no", ["yes"]) == 0.0
    assert f1_score("Paris", []) == 0.0
    assert f1_score("Paris France", ["London", "Paris"]) == pytest.approx(2 / 3)  # best alias


def test_contains_answer_needs_whole_tokens():
    assert contains_answer("It was built by Gustave Eiffel in 1889.", ["1889"])
    assert contains_answer("The tower (Eiffel-Tower) is tall.", ["Eiffel Tower", "eiffel-tower"])
    assert not contains_answer("In 18890 BC.", ["1889"])
    assert not contains_answer("anything", ["the"])  # an alias that normalizes to nothing never matches


def test_a_gold_that_normalizes_to_nothing_is_matched_literally():
    assert normalize_answer("A+") == ""  # "a" is an article, "+" punctuation
    assert exact_match("a+", ["A+", "AB+"]) and exact_match("AB+", ["A+", "AB+"])
    assert f1_score(" A+ ", ["A+"]) == 1.0
    for empty_ish in ("the", "?", "a", "---"):
        assert not exact_match(empty_ish, ["A+"]) and f1_score(empty_ish, ["A+"]) == 0.0
