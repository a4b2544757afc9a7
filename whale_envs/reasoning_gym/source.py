"""reasoning-gym datasets as a WHALE task source (the ``generated`` kind of domain ``reasoning_gym``).

Task ``i`` of a source is entry ``i`` of a reasoning-gym dataset built with ``size`` and a *keyed* seed
(:mod:`whale_envs.reasoning_gym.seeds`); its id, ``<label>-s<seed>-<i>`` (``leg_counting-s0-17``), names
the dataset, its config (a digest), the user's seed and the index, so it is stable across runs. As for
every generated source (``whale_envs.tasks.GeneratedSource``) an entry is kept only when its question
falls in the same split as its id; otherwise the next attempt (the same index of the dataset built
with the next keyed seed) is drawn, so one question never sits in two splits.

The payload (:class:`Entry`) holds the whole reasoning-gym entry: question, answer and metadata. Only
the env reads it, and only the question is shown; ``score`` is the dataset's own ``score_answer``.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from whale_envs.reasoning_gym.seeds import fit, generation_seed, part_seed
from whale_envs.reasoning_gym.spec import COMPOSITE, DatasetSpec, parse_spec
from whale_envs.tasks import Task, TaskSourceError, register_generator, split_key, split_of

#: The dataset of ``gym.make("whale/ReasoningGym-v0")`` without options, and the default size
#: (reasoning-gym's own default).
DEFAULT_DATASET = "basic_arithmetic"
DEFAULT_SIZE = 500
#: Attempts per task before giving up on an entry whose question falls in the task id's split (each
#: attempt matches with the split's share, 15% at the least: 200 fail together with odds of 1e-14).
MAX_ATTEMPTS = 200


@dataclass(frozen=True)
class Entry:
    """One reasoning-gym entry, and the generation seed of the dataset object that made it."""

    question: str
    answer: Any
    metadata: Mapping[str, Any]
    seed: int

    def as_entry(self) -> dict[str, Any]:
        """The entry as reasoning-gym's ``score_answer`` takes it (a copy: a scorer may write to it)."""
        return copy.deepcopy(
            {"question": self.question, "answer": self.answer, "metadata": dict(self.metadata)}
        )


class ReasoningGymSource:
    """``size`` tasks of one reasoning-gym dataset spec (a ``TaskSource``)."""

    def __init__(self, spec: DatasetSpec, *, size: int, seed: int):
        self.spec = spec
        self.size = size
        self.seed = seed
        self.name = f"reasoning_gym({spec.label}, size={size}, seed={seed})"
        self._ids = [f"{spec.label}-s{seed}-{i}" for i in range(size)]
        self._index = {task_id: i for i, task_id in enumerate(self._ids)}
        self._datasets: dict[int, Any] = {}
        self._tasks: dict[tuple[bytes, str], Task[Entry]] = {}
        # some datasets draw from numpy's global generator: one generation at a time
        self._lock = threading.RLock()
        self._dataset(generation_seed(split_key(), spec.label, seed, 0))  # a bad config fails here

    def ids(self) -> list[str]:
        return list(self._ids)

    def __len__(self) -> int:
        return self.size

    def get(self, task_id: str) -> Task[Entry]:
        key = split_key()
        with self._lock:
            cached = self._tasks.get((key, task_id))
            if cached is not None:
                return cached
            try:
                idx = self._index[task_id]
            except KeyError:
                raise KeyError(f"{self.name}: no task with id {task_id!r}") from None
            want = split_of(task_id, key)
            for attempt in range(MAX_ATTEMPTS):
                seed = generation_seed(key, self.spec.label, self.seed, attempt)
                item = self._generate(seed, idx, task_id)
                if split_of(str(item["question"]), key) == want:
                    task = self._task(task_id, item, seed)
                    self._tasks[(key, task_id)] = task
                    return task
        raise TaskSourceError(
            f"{self.name}: no entry for task {task_id!r} in its split after {MAX_ATTEMPTS} attempts"
        )

    def score(self, entry: Entry, answer: str) -> float:
        """The dataset's own ``score_answer(answer, entry)`` (a composite asks the entry's dataset)."""
        dataset = self._dataset(entry.seed)
        return float(dataset.score_answer(answer=answer, entry=entry.as_entry()))

    # ------------------------------------------------------------------ building

    def _dataset(self, seed: int) -> Any:
        with self._lock:
            if seed not in self._datasets:
                self._datasets[seed] = self._build(seed)
            return self._datasets[seed]

    def _build(self, seed: int) -> Any:
        import reasoning_gym
        from reasoning_gym.composite import DatasetSpec as RGPart

        spec = self.spec
        try:
            if not spec.composite:
                part = spec.parts[0]
                return reasoning_gym.create_dataset(
                    part.name, size=self.size, seed=fit(part.name, seed), **part.config
                )
            parts = [
                RGPart(p.name, p.weight, {**p.config, "seed": part_seed(seed, p.name), "size": self.size})
                for p in spec.parts
            ]
            return reasoning_gym.create_dataset(COMPOSITE, size=self.size, seed=seed, datasets=parts)
        except (AssertionError, TypeError, ValueError) as exc:
            raise TaskSourceError(f"reasoning-gym {', '.join(spec.names)}: {_one_line(exc)}") from None

    def _generate(self, seed: int, idx: int, task_id: str) -> dict[str, Any]:
        try:
            item = self._dataset(seed)[idx]
        except Exception as exc:  # a generator's own failure: one line naming the task, not a traceback
            raise TaskSourceError(
                f"{self.name}: reasoning-gym could not generate {task_id!r}: {_one_line(exc)}"
            ) from None
        if not isinstance(item, Mapping) or not isinstance(item.get("question"), str):
            raise TaskSourceError(f"{self.name}: reasoning-gym entry {task_id!r} has no question text")
        return dict(item)

    def _task(self, task_id: str, item: Mapping[str, Any], seed: int) -> Task[Entry]:
        metadata = dict(item.get("metadata") or {})
        entry = Entry(item["question"], item.get("answer"), metadata, seed)
        data_source = metadata.get("source_dataset") or self.spec.parts[0].name
        return Task(task_id, entry, {"data_source": data_source})


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def generated(
    path: str | None = None,
    dataset: str | None = None,
    datasets: Any = None,
    size: int = DEFAULT_SIZE,
    seed: int = 0,
    **config: Any,
) -> ReasoningGymSource:
    """The source a spec names: ``dataset`` (or a composite's ``datasets``), ``size``, ``seed``, and the
    dataset's config options as the remaining keywords (:mod:`whale_envs.reasoning_gym.spec`)."""
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise TaskSourceError(f"size must be a positive integer, got {size!r}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TaskSourceError(f"seed must be an integer, got {seed!r}")
    if dataset is None and datasets is None:
        dataset = DEFAULT_DATASET
    return ReasoningGymSource(parse_spec(dataset, datasets, config), size=size, seed=seed)


register_generator(
    "reasoning_gym",
    generated,
    doc=f"reasoning-gym datasets (options dataset=NAME or datasets=..., size, seed, the dataset's config; "
    f"default {DEFAULT_DATASET})",
)
