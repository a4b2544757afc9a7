"""Procedurally generated search questions (``tasks="generated"``): small fictional worlds.

Each question gets a world of its own, so nothing can be memorized across tasks: people, companies,
cities and countries with made-up names, linked by relations and rendered as one plain passage per
entity, every fact stated once, in its subject's passage::

    Mira Talven is a painter. Mira Talven was born in Oskaro in 1952. Mira Talven works for Brellin Works.
    Brellin Works is a company that makes glass. Brellin Works was founded by Dara Kesh in 1921. ...
    Oskaro is a city in Velmaria. Oskaro lies on the Tamel river. The mayor of Oskaro is Dara Kesh.
    Velmaria is a country. The capital of Velmaria is Oskaro. The main language of Velmaria is Velsic.

A question of ``h`` hops follows ``h`` facts from a named entity, one passage per hop, e.g. (3 hops)
"In what year was the founder of the company that Mira Talven works for born?". Its supporting passages
are those of the entities on the chain. Distractors are extra entities whose names share a part with
an entity of the chain (``Mira Tolvan``, ``Brellin Mills``), so a search returns near misses next to
the right passage.

The knobs (see :class:`SearchGenConfig`): ``difficulty`` = hops (1-3), ``distractors`` per chain
entity, and ``corpus_size`` (background entities). The text is deliberately plain and regular.
For pretraining, :func:`generate_sample` gives ``(passages, question, answer)`` samples with the hop
chain spelled out (:class:`SearchSample`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from whale_envs.search.corpus import Corpus, Passage, SearchQuestion
from whale_envs.search.scoring import normalize_answer
from whale_envs.tasks import GeneratedSource, GeneratorConfig, Task, config_from_options

LEVELS = (1, 2, 3)
TYPES = ("person", "company", "city", "country")

PROFESSIONS = (
    "painter teacher farmer doctor baker sailor engineer writer singer lawyer "
    "pilot nurse carpenter tailor chemist architect soldier judge miner fisher"
).split()
PRODUCTS = (
    "glass paper bicycles shoes bread cars toys ships soap radios clocks tea cheese rope lamps maps".split()
)
COMPANY_SUFFIXES = "Works Mills Labs Foods Motors Press Bank Studios Trading Shipping".split()
COUNTRY_SUFFIXES = ("ia", "land", "mark", "ora", "stan")
LANGUAGE_SUFFIXES = ("ic", "ish", "ese")

_ONSETS = "b d f g k l m n p r s t v z br dr kr tr st th sh".split()
_VOWELS = "a e i o u a e o".split()
_CODAS = ("", "", "n", "r", "l", "s", "k", "th")


@dataclass(frozen=True)
class Relation:
    """A fact of an entity type: a relation to another entity (``target`` is a type) or an attribute."""

    name: str
    subject: str
    target: str | None  # entity type, or None for an attribute (a plain value)
    phrase: str | None  # noun phrase naming the target, for chaining: "the founder of {x}"
    question: str  # the question asking for it: "Who founded {x}?"


RELATIONS: dict[str, Relation] = {
    r.name: r
    for r in (
        Relation("born_in", "person", "city", "the city where {x} was born", "In which city was {x} born?"),
        Relation(
            "works_for",
            "person",
            "company",
            "the company that {x} works for",
            "Which company does {x} work for?",
        ),
        Relation("founded_by", "company", "person", "the founder of {x}", "Who founded {x}?"),
        Relation("based_in", "company", "city", "the city where {x} is based", "In which city is {x} based?"),
        Relation("in_country", "city", "country", "the country of {x}", "In which country is {x}?"),
        Relation("mayor", "city", "person", "the mayor of {x}", "Who is the mayor of {x}?"),
        Relation("capital", "country", "city", "the capital of {x}", "What is the capital of {x}?"),
        Relation("birth_year", "person", None, None, "In what year was {x} born?"),
        Relation("profession", "person", None, None, "What is the job of {x}?"),
        Relation("founded_year", "company", None, None, "In what year was {x} founded?"),
        Relation("product", "company", None, None, "What does {x} make?"),
        Relation("river", "city", None, None, "Which river does {x} lie on?"),
        Relation("language", "country", None, None, "What is the main language of {x}?"),
    )
}


#: How the plain value of a person's or a company's attribute is drawn (a relation to an entity picks
#: one of its target type). Cities and countries are drawn by ``_World.fill`` itself: a city's country
#: may be set already, and a country's capital is one of its cities.
ATTRIBUTES: dict[str, Callable[[random.Random], str]] = {
    "birth_year": lambda rng: str(rng.randint(1900, 1999)),
    "profession": lambda rng: rng.choice(PROFESSIONS),
    "founded_year": lambda rng: str(rng.randint(1850, 2010)),
    "product": lambda rng: rng.choice(PRODUCTS),
}


def chains(hops: int) -> list[tuple[Relation, ...]]:
    """Every type-correct chain of ``hops`` facts: ``hops - 1`` entity relations, then any final fact."""
    out: list[tuple[Relation, ...]] = [(r,) for r in RELATIONS.values()]
    for _ in range(hops - 1):
        out = [(r, *c) for c in out for r in RELATIONS.values() if r.target == c[0].subject]
    return out


_CHAINS = {h: chains(h) for h in LEVELS}


@dataclass
class Entity:
    name: str
    kind: str
    facts: dict[str, Entity | str] = field(default_factory=dict)


@dataclass(frozen=True)
class HopStep:
    """One hop of a generated question: the fact ``relation`` of ``entity`` is ``value``, stated in the
    passage ``passage_id`` by ``sentence``."""

    entity: str
    relation: str
    value: str
    passage_id: str
    sentence: str


@dataclass(frozen=True)
class SearchSample:
    """A generated question with its world: what a pretraining step needs.

    ``passages`` is the whole (shuffled) world; ``supporting`` the ids of the passages read along the
    chain, in hop order; ``steps`` the chain itself.
    """

    question: str
    answer: str
    passages: tuple[Passage, ...]
    supporting: tuple[str, ...]
    steps: tuple[HopStep, ...]
    hops: int


# ---------------------------------------------------------------------------------- names


class _Namer:
    """Made-up, pronounceable names, unique (after answer normalization) within one world."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def _word(self, syllables: int, coda: bool = True) -> str:
        rng = self.rng
        word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables))
        return (word + (rng.choice(_CODAS) if coda else "")).capitalize()

    def _claim(self, make: Callable[[], str]) -> str:
        for _ in range(1000):
            name = make()
            key = normalize_answer(name)
            if key not in self.used:
                self.used.add(key)
                return name
        raise RuntimeError("name space exhausted")  # not reached with the sizes validate() allows

    def _two_part(self, like: str | None, first: Callable[[], str], second: Callable[[], str]) -> str:
        """A new ``first() second()`` name; with ``like``, one like it: half the time its first part
        kept and a new second part, else a new first part and its second part kept."""
        if like is None:
            return self._claim(lambda: f"{first()} {second()}")
        kept_first, kept_second = like.split(" ", 1)
        if self.rng.random() < 0.5:
            return self._claim(lambda: f"{kept_first} {second()}")
        return self._claim(lambda: f"{first()} {kept_second}")

    def person(self, like: str | None = None) -> str:
        return self._two_part(like, lambda: self._word(2), lambda: self._word(self.rng.choice((2, 3))))

    def company(self, like: str | None = None) -> str:
        return self._two_part(like, lambda: self._word(2), lambda: self.rng.choice(COMPANY_SUFFIXES))

    def city(self, like: str | None = None) -> str:
        if like is None:
            return self._claim(lambda: self._word(self.rng.choice((2, 3))))
        stem = like[:3]  # same beginning, different rest: "Oskaro" -> "Oskelin"
        return self._claim(lambda: stem + self._word(self.rng.choice((1, 2))).lower())

    def country(self, like: str | None = None) -> str:
        rng = self.rng
        if like is None:
            return self._claim(lambda: self._word(2, coda=False) + rng.choice(COUNTRY_SUFFIXES))
        stem = like[:4]
        return self._claim(lambda: stem + self._word(1, coda=False).lower() + rng.choice(COUNTRY_SUFFIXES))

    def river(self) -> str:
        return self._claim(lambda: self._word(2))

    def language(self) -> str:
        return self._claim(lambda: self._word(2, coda=False) + self.rng.choice(LANGUAGE_SUFFIXES))

    def make(self, kind: str, like: str | None = None) -> str:
        return getattr(self, kind)(like)


# ---------------------------------------------------------------------------------- the world


def _article(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


class _World:
    def __init__(self, rng: random.Random, size: int):
        self.rng = rng
        self.names = _Namer(rng)
        self.by_kind: dict[str, list[Entity]] = {k: [] for k in TYPES}
        n_country = max(2, size // 10)
        n_city = max(n_country + 1, size // 4)
        n_company = max(2, size // 5)
        n_person = max(3, size - n_country - n_city - n_company)
        for kind, n in (
            ("country", n_country),
            ("city", n_city),
            ("company", n_company),
            ("person", n_person),
        ):
            for _ in range(n):
                self.add(kind)
        countries = self.by_kind["country"]
        for i, city in enumerate(self.by_kind["city"]):  # every country gets at least one city
            city.facts["in_country"] = countries[i] if i < len(countries) else rng.choice(countries)
        for entity in self.entities():
            self.fill(entity)

    def entities(self) -> list[Entity]:
        return [e for kind in TYPES for e in self.by_kind[kind]]

    def add(self, kind: str, like: str | None = None) -> Entity:
        entity = Entity(self.names.make(kind, like), kind)
        self.by_kind[kind].append(entity)
        return entity

    def fill(self, e: Entity) -> None:
        """Draw the facts of ``e`` (relations point at entities already in the world)."""
        rng, pick = self.rng, lambda kind: self.rng.choice(self.by_kind[kind])
        if e.kind in ("person", "company"):  # every fact drawn afresh, in RELATIONS' order
            for r in RELATIONS.values():
                if r.subject == e.kind:
                    e.facts[r.name] = pick(r.target) if r.target else ATTRIBUTES[r.name](rng)
        elif e.kind == "city":
            if "in_country" not in e.facts:
                e.facts["in_country"] = pick("country")
            e.facts.update(river=self.names.river(), mayor=pick("person"))
        else:
            e.facts["language"] = self.names.language()
            cities = [c for c in self.by_kind["city"] if c.facts.get("in_country") is e]
            if not cities:  # a new (distractor) country: give it a capital of its own
                city = self.add("city")
                city.facts["in_country"] = e
                self.fill(city)
                cities = [city]
            e.facts["capital"] = rng.choice(cities)


def _value(fact: Entity | str) -> str:
    return fact.name if isinstance(fact, Entity) else fact


# The sentences of each kind's passage, in order: (the facts a sentence states, the sentence). A fact of
# ``Entity`` fills ``{fact}``; ``{name}`` is the entity's, ``{a_profession}`` the profession with its article.
SENTENCES: dict[str, tuple[tuple[tuple[str, ...], str], ...]] = {
    "person": (
        (("profession",), "{name} is {a_profession}."),
        (("born_in", "birth_year"), "{name} was born in {born_in} in {birth_year}."),
        (("works_for",), "{name} works for {works_for}."),
    ),
    "company": (
        (("product",), "{name} is a company that makes {product}."),
        (("founded_by", "founded_year"), "{name} was founded by {founded_by} in {founded_year}."),
        (("based_in",), "{name} is based in {based_in}."),
    ),
    "city": (
        (("in_country",), "{name} is a city in {in_country}."),
        (("river",), "{name} lies on the {river} river."),
        (("mayor",), "The mayor of {name} is {mayor}."),
    ),
    "country": (
        (("kind",), "{name} is a country."),
        (("capital",), "The capital of {name} is {capital}."),
        (("language",), "The main language of {name} is {language}."),
    ),
}


def sentences(e: Entity) -> dict[str, str]:
    """The sentence stating each fact of ``e``, in passage order."""
    f = {k: _value(v) for k, v in e.facts.items()}
    f["name"] = e.name
    if "profession" in f:
        f["a_profession"] = _article(f["profession"])
    return {fact: text.format(**f) for facts, text in SENTENCES[e.kind] for fact in facts}


def render(e: Entity) -> Passage:
    """The passage of an entity: its title is its name, its text every fact once."""
    text = " ".join(dict.fromkeys(sentences(e).values()))  # born_in/birth_year share a sentence
    return Passage(id=e.name, title=e.name, text=text)


# ---------------------------------------------------------------------------------- questions


def _ask(chain: tuple[Relation, ...], start: str) -> str:
    phrase = start
    for relation in chain[:-1]:
        assert relation.phrase is not None
        phrase = relation.phrase.format(x=phrase)
    return chain[-1].question.format(x=phrase)


def generate_sample(
    rng: random.Random, hops: int, *, distractors: int = 2, corpus_size: int = 40
) -> SearchSample:
    """One question of ``hops`` hops (1-3) with a fresh world of about ``corpus_size`` entities plus
    ``distractors`` look-alike entities per chain entity. Deterministic given the state of ``rng``."""
    if hops not in LEVELS:
        raise ValueError(f"hops must be one of {LEVELS}, got {hops!r}")
    while True:
        world = _World(rng, corpus_size)
        for _ in range(50):
            chain = rng.choice(_CHAINS[hops])
            start = rng.choice(world.by_kind[chain[0].subject])
            path, entity = [start], start
            for relation in chain:
                fact = entity.facts[relation.name]
                if isinstance(fact, Entity):
                    path.append(fact)
                    entity = fact
            answer = _value(path[-1].facts[chain[-1].name]) if len(path) == hops else path[-1].name
            question = _ask(chain, start.name)
            distinct = len({id(e) for e in path}) == len(path)
            if distinct and normalize_answer(answer) not in normalize_answer(question):
                break
        else:
            continue  # no usable chain in this world (tiny worlds): draw another world
        for entity in list(path):
            for _ in range(distractors):
                world.fill(world.add(entity.kind, like=entity.name))
        readers = path[:hops]  # the entities whose passages state the facts
        steps = []
        for entity, relation in zip(readers, chain, strict=True):
            fact = entity.facts[relation.name]
            steps.append(
                HopStep(
                    entity.name, relation.name, _value(fact), entity.name, sentences(entity)[relation.name]
                )
            )
        passages = [render(e) for e in world.entities()]
        rng.shuffle(passages)
        return SearchSample(
            question=question,
            answer=answer,
            passages=tuple(passages),
            supporting=tuple(e.name for e in readers),
            steps=tuple(steps),
            hops=hops,
        )


# ---------------------------------------------------------------------------------- the task source


@dataclass
class SearchGenConfig(GeneratorConfig):
    """Options of ``tasks="generated"``.

    Attributes:
        difficulty: hops per question, one level (1-3) or a range ``"lo-hi"``; task ``idx`` gets
            ``lo + idx % n`` hops.
        distractors: look-alike entities added per entity of the question's chain (0-20).
        corpus_size: background entities of each world (8-5000); the corpus also holds the distractors.
        seed: the generator seed; the same seed gives the same tasks.
        size: number of task ids in the source (tasks are built lazily, on first use).
    """

    LEVELS: ClassVar[tuple[int, ...]] = LEVELS
    LEVEL_NAME: ClassVar[str] = "hop count"

    difficulty: int | str = "1-3"
    distractors: int = 2
    corpus_size: int = 40

    def validate(self) -> None:
        super().validate()
        for name, lo, hi in (("distractors", 0, 20), ("corpus_size", 8, 5000)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
                raise ValueError(f"{name} must be an integer in {lo}-{hi}, got {value!r}")


def make_generated(path: str | None = None, **options) -> GeneratedSource[SearchQuestion]:
    """The ``generated`` task source (see the module docstring and :class:`SearchGenConfig`)."""
    config: SearchGenConfig = config_from_options(SearchGenConfig, "search generated tasks", options)
    if path is not None:
        raise ValueError("the generated search source takes no file")
    levels = config.levels()
    ids = [f"search-gen-s{config.seed}-h{levels[i % len(levels)]}-{i:05d}" for i in range(config.size)]

    def make(rng: random.Random, idx: int) -> tuple[Task[SearchQuestion], str]:
        hops = levels[idx % len(levels)]
        sample = generate_sample(rng, hops, distractors=config.distractors, corpus_size=config.corpus_size)
        corpus = Corpus(f"generated world of {ids[idx]}", sample.passages, persist=False)
        payload = SearchQuestion(sample.question, (sample.answer,), corpus, sample.supporting)
        meta = {"difficulty": hops, "hops": hops, "passages": len(corpus), "seed": config.seed}
        return Task(ids[idx], payload, meta), sample.question

    name = (
        f"generated?difficulty={config.difficulty}&distractors={config.distractors}"
        f"&corpus_size={config.corpus_size}&seed={config.seed}&size={config.size}"
    )
    return GeneratedSource(name, ids, make, seed=config.seed)
