"""The generated search worlds: valid hop chains, distractors, seeding, knobs and splits."""

from __future__ import annotations

import random

import pytest

from whale_envs.search.generator import LEVELS, SearchGenConfig, chains, generate_sample
from whale_envs.search.scoring import normalize_answer
from whale_envs.tasks import TaskSourceError, make_source, split_of


def samples(n: int, **kwargs):
    for i in range(n):
        yield generate_sample(random.Random(i), LEVELS[i % 3], **kwargs)


def test_every_hop_chain_is_stated_in_the_passages():
    for s in samples(300, distractors=2, corpus_size=30):
        passages = {p.id: p for p in s.passages}
        assert len(passages) == len(s.passages)  # unique ids
        assert len(s.steps) == s.hops == len(s.supporting)
        assert s.steps[0].entity in s.question
        for i, step in enumerate(s.steps):
            assert step.passage_id == s.supporting[i] == step.entity
            assert step.sentence in passages[step.passage_id].text  # the fact is in that passage
            assert step.value in step.sentence
            if i + 1 < len(s.steps):
                assert s.steps[i + 1].entity == step.value  # the next hop reads the entity just found
        assert s.answer == s.steps[-1].value
        assert normalize_answer(s.answer) not in normalize_answer(s.question)
        assert all(p.text.isascii() and p.title == p.id for p in s.passages)


def test_facts_are_stated_once_so_answers_are_unique():
    for s in samples(100):
        last = s.steps[-1]
        # The subject of the last hop has exactly one passage, and no other passage claims its fact.
        assert sum(p.title == last.entity for p in s.passages) == 1
        stated = [p for p in s.passages if last.sentence in p.text]
        assert [p.id for p in stated] == [last.passage_id]


def test_distractors_are_look_alikes_of_the_chain_entities():
    for s in samples(60, distractors=3, corpus_size=20):
        titles = [p.title for p in s.passages]
        start = s.steps[0].entity
        parts = start.split()
        if len(parts) == 2:  # a person or a company: another entity shares the first or the last word
            look = [t for t in titles if t != start and len(t.split()) == 2 and (set(t.split()) & set(parts))]
        else:  # a city or a country: another shares the first letters
            look = [t for t in titles if t != start and t[:3] == start[:3]]
        assert len(look) >= 3, (start, titles)


def test_knobs_change_the_world():
    small = generate_sample(random.Random(1), 2, distractors=0, corpus_size=10)
    big = generate_sample(random.Random(1), 2, distractors=5, corpus_size=200)
    assert len(small.passages) < 20 and len(big.passages) >= 200 + 5 * 2
    for hops in LEVELS:
        assert generate_sample(random.Random(3), hops).hops == hops
    assert len(chains(1)) == 13 and all(len(c) == 3 for c in chains(3))


def test_the_source_is_seeded_and_lazy():
    a = make_source("search", "generated?seed=5&size=30")
    b = make_source("search", "generated?seed=5&size=30")
    c = make_source("search", "generated?seed=6&size=30")
    ids = a.ids()
    assert ids == b.ids() and ids[0] == "search-gen-s5-h1-00000" and len(ids) == 30
    for task_id in ids[:10]:
        ta, tb = a.get(task_id), b.get(task_id)
        assert ta.payload.question == tb.payload.question and ta.payload.answers == tb.payload.answers
        assert [p.text for p in ta.payload.corpus.passages] == [p.text for p in tb.payload.corpus.passages]
        assert split_of(ta.payload.question) == split_of(task_id)  # content never crosses splits
    assert [a.get(i).payload.question for i in ids[:5]] != [c.get(i).payload.question for i in c.ids()[:5]]


def test_difficulty_is_hops_and_meta_reports_it():
    src = make_source("search", "generated?difficulty=2-3&distractors=1&corpus_size=12&size=20")
    for task_id in src.ids():
        task = src.get(task_id)
        assert task.meta["difficulty"] == task.meta["hops"] == len(task.payload.supporting)
        assert task.meta["hops"] in (2, 3) and f"-h{task.meta['hops']}-" in task_id
        assert task.payload.corpus.persist is False


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ("difficulty=4", "within 1-3"),
        ("difficulty=0-2", "within 1-3"),
        ("difficulty=hard", "hop count"),
        ("distractors=-1", "distractors must be an integer in 0-20"),
        ("corpus_size=3", "corpus_size must be an integer in 8-5000"),
        ("size=0", "size must be a positive integer"),
        ("seed=x", "seed must be an integer"),
        ("hops=2", "unknown option"),
    ],
)
def test_bad_options_are_clear_errors(options, words):
    with pytest.raises(TaskSourceError, match=words):
        make_source("search", f"generated?{options}")


def test_config_defaults_validate():
    SearchGenConfig().validate()
    with pytest.raises(TaskSourceError, match="takes no file"):
        make_source("search", "generated:some/file.json")
