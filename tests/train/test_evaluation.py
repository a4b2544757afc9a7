"""``whale_train.evaluation``: task sets built once, one result (trajectories, outputs, scores, summary per
data source, errors), the same samples as the rollout engine, the seeds and the trainer's cache key pinned."""

from __future__ import annotations

from types import SimpleNamespace

import gymnasium as gym
import pytest
import torch

from harnesses.loader import load_harness
from tests.train.test_paper_eval_sets import aime_files
from tests.train.test_rollout import LICHESS, lichess_oracle
from tests.train.test_trainer import MODEL, smoke
from whale_train.eval_cache import evaluation_key, weights_digest
from whale_train.evaluation import (
    EVAL_SEED_OFFSET,
    SELECT_SEED_OFFSET,
    TaskSet,
    eval_seed,
    evaluate,
    select_seed,
    task_set,
)
from whale_train.files import release_folder
from whale_train.llm.scripted import ScriptedLLM
from whale_train.rollout import RolloutConfig, read_jsonl, run_rollouts, summarize
from whale_train.trainer import RUN_LOCK, Run

CHESS = "whale/Chess-v0"


def test_the_seeds_are_the_runs_seed_plus_fixed_offsets():
    # part of the evaluation cache's key and of every recorded test score: never to change
    assert (EVAL_SEED_OFFSET, SELECT_SEED_OFFSET) == (10_000, 20_000)
    assert eval_seed(3) == 10_003 and select_seed(3) == 20_003


def test_a_task_set_is_the_first_tasks_of_its_split():
    env = gym.make(CHESS, **LICHESS).unwrapped
    tasks = task_set(CHESS, LICHESS, limit=5)
    assert tasks.ids == env.task_ids[:5] and tasks.env_kwargs == LICHESS
    assert tasks.source.name == env.source.name
    assert task_set(CHESS, LICHESS).ids == env.task_ids  # limit 0: all of them
    assert TaskSet.of(env, LICHESS, 2).ids == env.task_ids[:2]


class DataSources:
    """The chess source, its tasks labelled with a data source by position (as Search-R1's rows are)."""

    def __init__(self, source, ids):
        self.source, self.label = source, {t: "even" if i % 2 == 0 else "odd" for i, t in enumerate(ids)}

    def get(self, task_id):
        return SimpleNamespace(meta={**self.source.get(task_id).meta, "data_source": self.label[task_id]})


def test_evaluate_runs_every_set_and_summarises_per_data_source(tmp_path):
    first, second = task_set(CHESS, LICHESS, 6), task_set(CHESS, LICHESS, 10)
    second.ids = second.ids[6:]
    for tasks in (first, second):
        tasks.source = DataSources(tasks.source, first.ids + second.ids)
    seen = []
    result = evaluate(
        load_harness("chess_puzzles/h0"),
        CHESS,
        lichess_oracle(),
        [first, second],
        k=2,
        seed=7,
        trusted=True,
        progress=seen.append,
    )
    trajs = result.trajectories
    assert [t.task_id for t in trajs[::2]] == first.ids + second.ids and len(seen) == 20
    assert result.scores == [1.0] * 20 and all(out and len(out) >= 4 for out in result.outputs)
    assert result.outputs == [t.steps[-1].action for t in trajs]
    summary = dict(result.summary)
    by_source = summary.pop("by_data_source")
    assert summary == summarize(trajs)
    assert by_source == {
        "even": {"tasks": 5, "mean": 1.0},
        "odd": {"tasks": 5, "mean": 1.0},
        "average": {"tasks": 10, "mean": 1.0},
    }
    assert result.errors == {} and result.wall_seconds > 0
    path = result.write_traces(tmp_path / "traces.jsonl")
    assert [t.to_dict() for t in read_jsonl(path)] == [t.to_dict() for t in trajs]


def test_evaluate_gives_the_samples_of_the_rollout_engine():
    """The same seed, the same episodes: an evaluation is ``run_rollouts`` over its sets, nothing more."""
    tasks = task_set(CHESS, LICHESS, 4)
    model = ScriptedLLM(lambda prompt: "<move>e2e4</move>", chat=True)
    harness = load_harness("chess_puzzles/h0")
    ours = evaluate(harness, CHESS, model, [tasks], k=2, seed=11, concurrency=4, trusted=True)
    config = RolloutConfig(k=2, seed=11, concurrency=4, trusted=True)
    theirs = run_rollouts(harness, CHESS, model, tasks.ids, env_kwargs=LICHESS, config=config)
    keep = ("task_id", "sample", "seed", "solved", "failure", "reset_observation")
    assert [[t.to_dict()[k] for k in keep] for t in ours.trajectories] == [
        [t.to_dict()[k] for k in keep] for t in theirs
    ]
    assert [[s.action for s in t.steps] for t in ours.trajectories] == [
        [s.action for s in t.steps] for t in theirs
    ]


class Broken(ScriptedLLM):
    def complete(self, requests):
        raise RuntimeError("the server is down")


def test_errors_are_counted_by_category_with_the_first_message():
    tasks = task_set(CHESS, LICHESS, 3)
    result = evaluate(load_harness("chess_puzzles/h0"), CHESS, Broken(""), [tasks], k=2, trusted=True)
    assert result.summary["failures"] == {"model_error": 6} and result.scores == [0.0] * 6
    error = result.errors["model_error"]
    assert error["episodes"] == 6 and error["task_id"] == tasks.ids[0]
    assert "the server is down" in error["first"]


class Weights:
    """A backend whose weights are a torch module here (what the cache digests), with no model to run."""

    version = 0
    name = "weights"

    def __init__(self):
        torch.manual_seed(0)
        self.model = torch.nn.Linear(3, 2)


@pytest.mark.parametrize("separate", [False, True])
def test_the_trainers_eval_cache_key_is_the_one_runs_always_had(tmp_path, separate):
    """A changed key would make every cached evaluation of every user a miss: the settings, spelled out."""
    sets = {"tasks": list(aime_files(tmp_path)), "limit": 0} if separate else {"limit": 4}
    config = smoke(MODEL, seed=3, eval={"k": 2, "select_limit": 2, "select_k": 1, **sets})
    run = Run(config, tmp_path / "run", llm=Weights(), eval_cache=tmp_path / "cache", log=lambda *_: None)
    try:
        ids = [tasks.ids for tasks in run.test_sets]
        where = (
            {"eval_sets": config.eval_sets, "ids": ids}
            if separate
            else {"env_kwargs": config.env_kwargs, "split": "test", "ids": ids[0]}
        )
        expected = evaluation_key(
            weights_digest(run.llm),
            run.harness,
            env=config.env,
            **where,
            k=2,
            seed=10_003,
            concurrency=config.concurrency,
            select=[2, 1, 20_003],
        )
        assert run._eval_cache_key(ids) == expected
        assert (
            run.select_set.ids
            == gym.make(config.env, split="harness", **config.env_kwargs).unwrapped.task_ids[:2]
        )
    finally:
        release_folder(run.dir, RUN_LOCK)
