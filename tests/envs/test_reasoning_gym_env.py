"""``whale/ReasoningGym-v0`` on the real reasoning-gym package, and the ``generic/h0`` harness that drives it.

Two datasets throughout, one of them composite: the env passes the conformance checks, scores the entry's
own answer 1 and a wrong one 0 by the dataset's own ``score_answer``, shows a harness the question alone,
keeps its test tasks out of reach of anyone who has the package and the user's seed but not the split
secret, and ``whale eval`` / ``whale train`` run on it with the shipped tiny model.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

from harnesses.loader import harness_from_source, load_harness
from tests.lazy import LazyModule
from tests.small_train import run_train, small_train_config
from tests.train.test_trainer import units
from whale_envs import REASONING_GYM_ID
from whale_envs.reasoning_gym import parse_answer
from whale_envs.reasoning_gym.seeds import generation_seed
from whale_envs.splits import split_key
from whale_envs.tasks import TaskSourceError
from whale_envs.text_env import ActionError
from whale_train.cli import main
from whale_train.domains import domain_for
from whale_train.errors import CLIError
from whale_train.harness_for import load_harness_for
from whale_train.llm.scripted import ScriptedLLM
from whale_train.meta_harness.archive import Archive
from whale_train.meta_harness.library import library_for
from whale_train.rollout import RolloutConfig, run_rollouts

reasoning_gym = LazyModule("reasoning_gym")  # imported by the first test using it

ROOT = Path(__file__).resolve().parents[2]
COMPOSITE = {"leg_counting": 1, "basic_arithmetic": 1}
#: The two datasets of every check: one reasoning-gym dataset, and a composite of two.
SPECS = {
    "single": {"dataset": "leg_counting", "size": 60, "seed": 3},
    "composite": {"dataset": "composite", "datasets": COMPOSITE, "size": 60, "seed": 3},
}


def make(spec: str, **kwargs) -> gym.Env:
    return gym.make(REASONING_GYM_ID, **SPECS[spec], **kwargs)


def entries(env: gym.Env, split_ids) -> list:
    """The (id, entry) of each task id, as the env's source holds them."""
    return [(i, env.unwrapped.source.get(i).payload) for i in split_ids]


# ------------------------------------------------------------------------------------------ the env


@pytest.mark.parametrize("spec", SPECS)
def test_conformance_checker_passes_and_a_bad_reply_changes_nothing(spec):
    env = make(spec).unwrapped
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a gymnasium warning is a failure too
        check_env(env, skip_render_check=False)
    for action in (
        "no tags here",
        "<answer>",
        "<answer> </answer>",
        "answer:",
        42,
        None,
        "<answer>1</answer><answer>",
    ):
        obs0, info0 = env.reset(seed=5)
        obs, reward, terminated, truncated, info = env.step(action)
        assert info["error"] and obs.startswith("Error: ") and reward == 0.0 and not terminated, action
        assert obs.endswith(obs0) and info["question"] == info0["question"]
    assert env.turn_limit == 2 and make(spec, max_turns=4).spec.max_episode_steps == 4


@pytest.mark.parametrize("spec", SPECS)
def test_the_entrys_own_answer_scores_1_and_a_wrong_one_0_by_the_datasets_score_answer(spec):
    env = make(spec).unwrapped
    seen_sources = set()
    for task_id in env.task_ids[:12]:
        entry = env.source.get(task_id).payload
        seen_sources.add(entry.metadata["source_dataset"])
        env.reset(options={"task_id": task_id})
        _obs, reward, terminated, _, info = env.step(f"Thinking it over.\n<answer>{entry.answer}</answer>")
        assert (reward, terminated, info["solved"], info["extracted"]) == (1.0, True, True, entry.answer)
        env.reset(options={"task_id": task_id})
        wrong = str(int(entry.answer) + 1)  # both datasets' answers are whole numbers
        _obs, reward, terminated, _, info = env.step(f"answer: {wrong}")
        assert (reward, terminated, info["solved"]) == (0.0, True, False)
        # the reward is the dataset's own score_answer, asked directly
        own = reasoning_gym.get_score_answer_fn(entry.metadata["source_dataset"])
        as_given = {"question": entry.question, "answer": entry.answer, "metadata": dict(entry.metadata)}
        assert own(entry.answer, as_given) == 1.0 and own(wrong, as_given) == 0.0
    expected = set(COMPOSITE) if spec == "composite" else {"leg_counting"}
    assert seen_sources == expected  # the composite draws from both of its datasets


def test_partial_credit_is_the_datasets_own():
    """reasoning-gym's default scorer gives len(gold)/len(answer) when the gold is inside the answer."""
    env = make("single").unwrapped
    task_id = env.task_ids[0]
    entry = env.source.get(task_id).payload
    env.reset(options={"task_id": task_id})
    answer = entry.answer * 2  # "326326": the gold inside, half the length
    _obs, reward, *_, info = env.step(f"<answer>{answer}</answer>")
    as_given = {"question": entry.question, "answer": entry.answer, "metadata": dict(entry.metadata)}
    assert 0.0 < reward < 1.0 and not info["solved"]
    assert reward == reasoning_gym.get_score_answer_fn("leg_counting")(answer, as_given) == 0.5


def test_answer_forms():
    assert parse_answer("so <answer>1</answer> no, <answer> 2 </answer>") == "2"  # the last pair counts
    assert parse_answer("Answer: [[1, 2],\n [3, 4]]") == "[[1, 2],\n [3, 4]]"  # a grid spans lines
    for bad, message in [
        ("<answer>3", "not closed"),
        ("<answer>1</answer> then <answer>2", "not closed"),
        ("<answer>\n</answer>", "empty"),
        ("answer:   ", "must be followed"),
        ("42", "unrecognized action"),
    ]:
        with pytest.raises(ActionError, match=message):
            parse_answer(bad)


def test_same_seed_same_tasks_in_a_fresh_process_and_another_seed_others():
    def questions(**kw) -> dict[str, str]:
        env = gym.make(REASONING_GYM_ID, dataset="leg_counting", size=30, **kw).unwrapped
        return {task_id: entry.question for task_id, entry in entries(env, env.task_ids)}

    first = questions(seed=3)
    assert first == questions(seed=3) and list(first)[:2] == ["leg_counting-s3-0", "leg_counting-s3-1"]
    code = (
        "import json, gymnasium as gym, whale_envs\n"
        "env = gym.make('whale/ReasoningGym-v0', dataset='leg_counting', size=30, seed=3).unwrapped\n"
        "print(json.dumps({i: env.source.get(i).payload.question for i in env.task_ids}))\n"
    )
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert json.loads(fresh.stdout) == first  # the same split secret (conftest pins it): the same tasks
    other = questions(seed=4)
    assert not set(other.values()) & set(first.values())
    # a config option is part of the task id, so the same seed with another config names other tasks
    env = gym.make(REASONING_GYM_ID, dataset="leg_counting", size=30, seed=3, min_animals=4).unwrapped
    assert env.task_ids[0].startswith("leg_counting.") and env.task_ids[0] not in first


def test_splits_are_disjoint_in_their_questions():
    envs = {s: make("composite", split=s).unwrapped for s in ("train", "harness", "test")}
    questions = {s: {e.question for _, e in entries(env, env.task_ids)} for s, env in envs.items()}
    assert all(questions.values())
    for a, b in itertools.combinations(questions, 2):
        assert not questions[a] & questions[b], (a, b)


HOLD_OUT = """
import json, sys
import reasoning_gym
from reasoning_gym.composite import DatasetSpec
name, seed, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
questions = []
for s in range(seed - 5, seed + 50):  # the user's seed, its neighbours, the composite's sub-seeds
    if name == "composite":
        parts = [DatasetSpec("leg_counting", 1, {}), DatasetSpec("basic_arithmetic", 1, {})]
        dataset = reasoning_gym.create_dataset("composite", size=size, seed=s, datasets=parts)
    else:
        dataset = reasoning_gym.create_dataset(name, size=size, seed=s)
    questions += [dataset[i]["question"] for i in range(size)]
print(json.dumps(questions))
"""


@pytest.mark.parametrize("spec", SPECS)
def test_held_out_tasks_cannot_be_rebuilt_from_the_users_seed_without_the_split_secret(spec, tmp_path):
    """The hold-out rule (whale_envs/reasoning_gym/seeds.py): a plain process with the package installed
    and the user's seed, as in a sandbox or the jail, regenerates the dataset and finds none of the env's
    test tasks; the env's tasks are reasoning-gym's own entries for a seed keyed by the split secret."""
    options = SPECS[spec]
    env = make(spec, split="test").unwrapped
    test = entries(env, env.task_ids)
    assert test
    name = "leg_counting" if spec == "single" else "composite"
    clean = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)}  # no split secret in here
    out = subprocess.run(
        [sys.executable, "-c", HOLD_OUT, name, str(options["seed"]), str(options["size"])],
        capture_output=True,
        text=True,
        check=True,
        env=clean,
        cwd=tmp_path,
    )
    rebuilt = set(json.loads(out.stdout))
    assert len(rebuilt) > 100 and not rebuilt & {e.question for _, e in test}
    # ... while the split key rebuilds them: reasoning-gym's entries for the keyed seed
    if spec == "single":
        task_id, entry = test[0]
        index = int(task_id.rsplit("-", 1)[1])
        dataset = reasoning_gym.create_dataset("leg_counting", size=options["size"], seed=entry.seed)
        assert dataset[index]["question"] == entry.question
        keyed = [generation_seed(split_key(), "leg_counting", options["seed"], a) for a in range(200)]
        assert entry.seed in keyed


def test_another_split_secret_gives_other_tasks(monkeypatch):
    env = make("single").unwrapped
    mine = {e.question for _, e in entries(env, env.task_ids[:10])}
    monkeypatch.setenv("WHALE_SPLIT_SECRET", "someone else's secret")
    theirs = {e.question for _, e in entries(env, env.task_ids[:10])}  # the same source, another key
    assert not mine & theirs


def test_bad_options_are_one_line_naming_the_option():
    cases = [
        (
            {"dataset": "leg_countin"},
            "unknown reasoning-gym dataset 'leg_countin'; close names: leg_counting",
        ),
        ({"dataset": "leg_counting", "min_animal": 3}, "unknown option(s) ['min_animal']"),
        ({"dataset": "leg_counting", "min_animals": 30, "max_animals": 2}, "reasoning-gym leg_counting:"),
        ({"dataset": "composite"}, "dataset=composite needs datasets"),
        ({"datasets": {"leg_counting": -1}}, "datasets.leg_counting: weight must be positive"),
        ({"datasets": {"leg_counting": 1, "basic_arithmeti": 1}}, "close names: basic_arithmetic"),
        ({"datasets": "leg_counting", "min_animals": 3}, "give each dataset its config in datasets"),
        ({"dataset": "leg_counting", "size": 0}, "size must be a positive integer"),
    ]
    for options, message in cases:
        with pytest.raises(TaskSourceError) as err:
            gym.make(REASONING_GYM_ID, **options)
        assert message in str(err.value) and "\n" not in str(err.value), (options, str(err.value))


def test_without_the_package_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # an import of it fails, as when missing
    with pytest.raises(TaskSourceError, match=r"needs? the reasoning-gym package .*whale-harness\[envs\]"):
        gym.make(REASONING_GYM_ID, dataset="gcd", size=7)


def test_composite_forms_name_the_same_tasks():
    forms = [
        COMPOSITE,
        "leg_counting:1,basic_arithmetic",
        {"leg_counting": {"weight": 1}, "basic_arithmetic": {"weight": 1, "config": {}}},
        [{"name": "leg_counting", "weight": 1}, "basic_arithmetic"],
    ]
    ids = {tuple(gym.make(REASONING_GYM_ID, datasets=f, size=20).unwrapped.task_ids) for f in forms}
    assert len(ids) == 1
    spec = gym.make(REASONING_GYM_ID, tasks="generated?datasets=leg_counting:1,basic_arithmetic:1&size=20")
    assert tuple(spec.unwrapped.task_ids) in ids  # the task-spec form too


# ------------------------------------------------------------------------------------------ harnesses


SPY = """
import json
from harnesses.base import Harness


class Spy(Harness):
    name = "spy"

    def run(self, env, llm):
        obs, info = env.reset()
        end = env.step("<answer>0</answer>")
        llm.complete(json.dumps({"reset": info, "end": end[4]}))
"""


def test_a_harness_is_shown_the_question_alone():
    env = make("composite", split="harness").unwrapped
    ids = env.task_ids[:3]
    trajs = run_rollouts(
        harness_from_source(SPY, "spy"),
        REASONING_GYM_ID,
        ScriptedLLM([""]),
        ids,
        env_kwargs={**SPECS["composite"], "split": "harness"},
        config=RolloutConfig(k=1, seed=0, concurrency=1),
    )
    common = {"task_id", "turn", "max_turns", "error", "error_kind"}
    for traj in trajs:
        seen = json.loads(traj.calls[-1].prompt_text)
        assert set(seen["reset"]) == common | {"question"}
        assert set(seen["end"]) == common | {"question", "solved"}  # no gold, no score, no metadata
        assert seen["reset"]["task_id"] not in env.task_ids
        assert set(traj.final_info) >= {"answer", "score", "extracted"}  # the trusted record keeps them


def test_generic_h0_is_the_default_and_the_generic_mechanisms_apply():
    domain = domain_for(REASONING_GYM_ID)
    assert domain.base_harness == "generic/h0" and domain.info_fields[0] == "question"
    seed = load_harness("generic/h0")
    assert seed.shipped and seed.class_name == "GenericH0"
    lib = library_for(domain, seed.source)
    assert set(lib.slots["action"]) == {"generate", "vote"} and lib.h0["constants"]["max_tokens"] == 256
    for combo in itertools.product(*lib.slots.values()):
        genome = copy.deepcopy(lib.h0)
        genome["slots"] = dict(zip(lib.slots, combo, strict=True))
        source = lib.render(genome, "c", "A candidate.")
        assert harness_from_source(source).class_name == "Candidate" and source.startswith(
            seed.source.rstrip()
        )
    # generic/* drives any env; another domain's harness is refused, naming what fits
    assert load_harness_for("generic/h0", "whale/Math-v0").name == "generic/h0"
    with pytest.raises(CLIError, match="use one of: generic/h0"):
        load_harness_for("math/h0", REASONING_GYM_ID)


def test_generic_h0_replies_until_the_env_ends_the_episode():
    """A scripted model first replies without tags: the env's error comes back with the question, the
    harness replies to that, and the right answer ends the episode with reward 1."""
    env = make("single", split="harness").unwrapped
    answers = {e.question.rstrip(): e.answer for _, e in entries(env, env.task_ids)}

    def model(prompt: str) -> str:
        if "Error:" not in prompt:
            return "I think it is many legs."
        question = next(q for q in answers if q in prompt)
        return f"<answer>{answers[question]}</answer>"

    trajs = run_rollouts(
        load_harness("generic/h0"),
        REASONING_GYM_ID,
        ScriptedLLM(model),
        env.task_ids[:3],
        env_kwargs={**SPECS["single"], "split": "harness"},
        config=RolloutConfig(k=1, seed=0, concurrency=1),
    )
    assert [t.reward for t in trajs] == [1.0, 1.0, 1.0] and all(len(t.calls) == 2 for t in trajs)


# ------------------------------------------------------------------------------------------ the CLI


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [["dataset=leg_counting"], ["dataset=composite", "datasets={leg_counting: 1, basic_arithmetic: 1}"]],
    ids=["single", "composite"],
)
def test_whale_eval_runs_generic_h0_on_a_reasoning_gym_dataset(options, tmp_path):
    argv = ["eval", "--env", REASONING_GYM_ID, "--harness", "generic/h0", "--limit", "4", "--k", "1"]
    for option in [*options, "size=100"]:
        argv += ["--env-option", option]
    assert main([*argv, "--out", str(tmp_path)]) == 0  # the shipped tiny model
    results = json.loads((tmp_path / "results.json").read_text())
    assert (results["env"], results["harness"], results["split"]) == (REASONING_GYM_ID, "generic/h0", "test")
    assert results["task_source"].startswith("reasoning_gym(")
    traces = [json.loads(line) for line in (tmp_path / "traces.jsonl").read_text().splitlines()]
    assert len(traces) == 4 and all(t["env_id"] == REASONING_GYM_ID and t["calls"] for t in traces)


def test_whale_eval_names_an_unknown_dataset_in_one_line(capsys):
    argv = [
        "eval",
        "--env",
        REASONING_GYM_ID,
        "--harness",
        "generic/h0",
        "--env-option",
        "dataset=leg_countng",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "close names: leg_counting" in err and len(err.splitlines()) == 1


@pytest.mark.slow
def test_whale_search_proposes_generic_mechanisms_on_generic_h0(tmp_path):
    """No harness named: the offline proposer extends generic/h0 with the generic mechanisms."""
    tasks = "generated?datasets=leg_counting:1,basic_arithmetic:1&size=100"
    argv = [
        "search",
        "--env",
        REASONING_GYM_ID,
        "--tasks",
        tasks,
        "--iterations",
        "1",
        "--harness-tasks",
        "8",
    ]
    assert main([*argv, "--set", "check_tasks=2", "--test-limit", "0", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["env"] == REASONING_GYM_ID and results["seed"] == "h0"
    archive = Archive(tmp_path / "archive")
    seed = load_harness("generic/h0").source.rstrip()
    candidates = [archive.get(f"i001-c{i}") for i in range(3)]
    assert all(c.meta["status"] == "valid" and c.source.startswith(seed) for c in candidates)
    slots = {c.meta["summary"].split(":")[0] for c in candidates}
    assert slots <= {"action", "retry", "temperature", "max_tokens", "format_retries", "samples"} and slots


@pytest.mark.slow
def test_whale_train_on_a_reasoning_gym_dataset_reaches_a_harness_phase(tmp_path):
    """No harness named: generic/h0 is the seed; both operators run on one ledger."""
    env_options = {"dataset": "leg_counting", "size": 120}
    config = small_train_config("legs", REASONING_GYM_ID, env_options=env_options)
    events = run_train(tmp_path, config, "--no-report")
    us = units(events)
    assert "harness" in {u["phase"] for u in us}
    assert sum(u["rollouts"] for u in us) == us[-1]["rollouts_total"] <= 40
    assert [e for e in events if e["event"] == "eval"]
