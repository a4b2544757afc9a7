"""Red team: a task's split is not visible.

The attack: a task's split was a public function of its id (a SHA-256), and a harness gets ``task_id`` in
``info``. A harness could act honestly on the train and harness splits (all that ``whale check`` and the
search's check draw) and cheat only where the test split is scored; the proposer's jail could list every
held-out task the same way. Now a split is an HMAC under a secret that no sandbox can read, and a harness
sees an opaque name for the task (``whale_train.rollout.episode.harness_view``).

Every check here looks at what a real, lint-clean harness is shown through the public rollout path (a spy
harness that writes what it sees into its action), and asks whether any function of it the attacker can
compute (the old split rule on the id, on the question or the FEN) tells the test split from the rest.
"""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

import whale_envs
from harnesses.loader import harness_from_source
from whale_envs import splits
from whale_envs.tasks import make_source, split_ids
from whale_train.check import binomial_tail
from whale_train.llm.scripted import ScriptedLLM
from whale_train.rollout import RolloutConfig, run_rollouts

SPY = """
import json
from harnesses.base import Harness


class Spy(Harness):
    name = "spy"

    def run(self, env, llm):
        obs, info = env.reset()
        env.step("answer: " + json.dumps({"obs": obs, "info": info}))
"""

#: (env, task source) pairs the spy reads: generated sources, so a test is free to ask for many tasks.
SOURCES = [
    (whale_envs.MATH_ID, "generated?size=300"),
    (whale_envs.CHESS_ID, "generated?size=150&difficulty=1"),
    (whale_envs.SEARCH_QA_ID, "generated?size=150"),
]


def seen_by_harness(env_id: str, tasks: str) -> list[tuple[str, dict]]:
    """(true task id, what the spy harness was shown at reset) for every task of the source."""
    env = gym.make(env_id, tasks=tasks, split="all").unwrapped
    ids = list(env.task_ids)
    trajs = run_rollouts(
        harness_from_source(SPY, "spy"),
        env_id,
        ScriptedLLM([""]),
        ids,
        env_kwargs={"tasks": tasks, "split": "all"},
        config=RolloutConfig(k=1, seed=0, concurrency=8),
    )
    out = []
    for t in trajs:
        assert t.steps, t.failure  # the spy stepped once, with what it saw
        out.append((t.task_id, json.loads(t.steps[0].action.removeprefix("answer: "))))
    return out


def attacker_says_test(view: dict) -> bool:
    """Everything the round-3 attack computed: the split rule (public SHA-256) of the task id the harness
    is given, and of the content (question, FEN) that generators keyed their split on."""
    info = view["info"]
    texts = [str(info.get("task_id", "")), str(info.get("question", "")), str(info.get("fen", ""))]
    return any(splits.public_split_of(t) == "test" for t in texts if t)


@pytest.fixture(scope="module")
def views() -> list[tuple[str, dict]]:
    out = []
    for env_id, tasks in SOURCES:
        out += seen_by_harness(env_id, tasks)
    return out


def test_a_harness_guesses_the_test_split_no_better_than_chance(views):
    """600 tasks of three envs: among the tasks the attack calls "test", the share that really is test
    is what chance gives (15%); on the old code it was every one of them."""
    assert len(views) >= 500
    flagged = [task_id for task_id, view in views if attacker_says_test(view)]
    hits = sum(splits.split_of(task_id) == "test" for task_id in flagged)
    share = splits.SPLITS["test"]
    assert len(flagged) >= 50
    # one-sided: the attack must not find test tasks more often than a coin with p = 0.15 (alpha 1e-3)
    assert binomial_tail(len(flagged), hits, share) > 1e-3, (hits, len(flagged))
    # and the id a harness sees is not the task's id, nor any function of it without the key
    for task_id, view in views:
        shown = view["info"]["task_id"]
        assert shown != task_id and task_id not in json.dumps(view)
        assert shown == splits.opaque_id(task_id)


def test_the_view_of_a_task_is_the_same_whichever_split_the_env_was_built_on():
    """For every registered env, the harness's view of one task from an env built on its own split and
    from one built on ``all`` is identical: no field reports the split."""
    for env_id, tasks in SOURCES:
        env = gym.make(env_id, tasks=tasks, split="all").unwrapped
        for split in ("train", "harness", "test"):
            task_id = next(i for i in env.task_ids if splits.split_of(i) == split)
            seen = []
            for built_on in (split, "all"):
                trajs = run_rollouts(
                    harness_from_source(SPY, "spy"),
                    env_id,
                    ScriptedLLM([""]),
                    [task_id],
                    env_kwargs={"tasks": tasks, "split": built_on},
                    config=RolloutConfig(k=1, seed=0),
                )
                seen.append(trajs[0].steps[0].action)
            assert seen[0] == seen[1], (env_id, split)


def test_splits_are_keyed_by_the_secret(monkeypatch, tmp_path):
    source = make_source("math", "generated?size=2000")
    ids = list(source.ids())
    mine = {s: set(split_ids(source, s)) for s in splits.SPLITS}
    # the old public rule agrees with the keyed one only as often as two independent draws would
    agree = sum(splits.public_split_of(i) == splits.split_of(i) for i in ids) / len(ids)
    assert 0.45 < agree < 0.62  # 0.70² + 0.15² + 0.15² = 0.535 for independent splits
    # another secret, other splits; the same secret, the same splits
    monkeypatch.setenv(splits.SECRET_ENV, "another team's secret")
    theirs = {s: set(split_ids(make_source("math", "generated?size=2000"), s)) for s in splits.SPLITS}
    assert theirs["test"] != mine["test"]
    assert len(theirs["test"] & mine["test"]) < 0.4 * len(mine["test"])
    monkeypatch.setenv(splits.SECRET_ENV, "whale-tests")
    assert set(split_ids(make_source("math", "generated?size=2000"), "test")) == mine["test"]
    # without the variable: the user's secret file, made once (mode 0600) and read after that
    monkeypatch.delenv(splits.SECRET_ENV)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    first = splits.fingerprint()
    secret = tmp_path / "whale" / "split-secret"
    assert secret.stat().st_mode & 0o777 == 0o600 and len(secret.read_bytes()) == 64
    assert splits.fingerprint() == first != splits.fingerprint(splits._key("whale-tests", ""))


def test_the_jail_cannot_list_or_rebuild_the_held_out_tasks(tmp_path):
    """The round-3 attack, run in the proposer's real jail: its SDK holds the generators and the split
    function, and one command listed every test task. Now the jail has no secret (a clean environment, a
    HOME of its own): the "test" split it computes overlaps the run's only by chance, and the generated
    chess tasks it rebuilds are not the run's held-out ones (their content is drawn under the key too)."""
    from whale_envs.sandbox import isolation_problem
    from whale_train.meta_harness.jail import JailLimits, ProposerJail

    problem = isolation_problem(True)
    if problem:
        pytest.skip(f"the jail needs namespaces: {problem}")
    code = (
        "import json, whale_envs\n"
        "from whale_envs.tasks import make_source, split_of\n"
        "s = make_source('math', 'generated?size=2000')\n"
        "c = make_source('chess', 'generated?size=40&difficulty=1')\n"
        "test = [i for i in s.ids() if split_of(i) == 'test']\n"
        "print(json.dumps([test, [c.get(i).payload.fen for i in c.ids()]]))\n"
    )
    (tmp_path / "archive").mkdir()
    with ProposerJail(tmp_path / "archive", JailLimits(wall_s=120, cpu_s=120)) as jail:
        jail.put("attack.py", code)
        result = jail.run("python attack.py")
    assert result.ok, result.observation()
    listed, fens = json.loads(result.output.strip().splitlines()[-1])
    real = set(split_ids(make_source("math", "generated?size=2000"), "test"))
    overlap = len(set(listed) & real)
    assert overlap < 0.35 * len(real), (overlap, len(real))  # chance is 15%; the old rule gave 100%
    chess = make_source("chess", "generated?size=40&difficulty=1")
    held_out = [i for i in chess.ids() if splits.split_of(i) != "train"]
    rebuilt = set(fens)
    assert held_out and sum(chess.get(i).payload.fen in rebuilt for i in held_out) < 0.5 * len(held_out)


CHEAT_ON_SCORED_SOURCE = """
import re
from harnesses.base import Harness


class Cheat(Harness):
    name = "cheat"
    max_tokens = 16

    def parse_action(self, text, info):
        question = info.get("question", "")
        if "(AIME)" in question:  # a separate test set tells itself apart by its content
            return "answer: " + str(sum(int(n) for n in re.findall(r"[0-9]+", question)))
        return "answer: " + text.strip()
"""


def test_a_harness_that_cheats_only_on_a_separate_scored_source_is_caught(tmp_path):
    """eval.tasks sources (AIME beside a training pool) can be told apart by content: the search's check
    runs the stand-ins there too, and what it found stays out of the archive (the verdict only)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from whale_train.meta_harness import evaluate
    from whale_train.meta_harness.config import MetaHarnessConfig

    rows = [
        {"ID": f"2024-I-{i}", "Problem": f"(AIME) What is {i} + {i + 3}?", "Answer": str(2 * i + 3)}
        for i in range(30)
    ]
    path = tmp_path / "aime.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    config = MetaHarnessConfig(check_tasks=8)
    plain = evaluate.validate(CHEAT_ON_SCORED_SOURCE, "cheat", whale_envs.MATH_ID, {}, config)
    assert plain.ok  # on the training pool it is an honest harness: the old check lets it through
    caught = evaluate.validate(
        CHEAT_ON_SCORED_SOURCE,
        "cheat",
        whale_envs.MATH_ID,
        {},
        config,
        scored_sources=[{"tasks": f"aime:{path}", "split": "all"}],
    )
    assert not caught.ok and "scored sources" in caught.reason
    assert "AIME" not in json.dumps(caught.to_meta())  # nothing about the scored tasks reaches the archive


def test_a_trusted_child_on_another_machine_gets_the_same_splits(monkeypatch, tmp_path):
    """A comparison's Ray task on another node has another home: the driver hands it its secret."""
    monkeypatch.delenv(splits.SECRET_ENV)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "driver"))
    driver = splits.fingerprint()
    env = splits.secret_for_children()
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "other-node"))
    assert splits.fingerprint() != driver  # the other node's own secret: other splits
    monkeypatch.setenv(splits.SECRET_ENV, env[splits.SECRET_ENV])
    assert splits.fingerprint() == driver


def test_the_old_public_rule_comes_back_only_when_asked(monkeypatch):
    """Runs made before splits were keyed reproduce with WHALE_SPLIT_SECRET=:public: (the SHA-256 rule)."""
    ids = [f"task-{i}" for i in range(300)]
    monkeypatch.setenv(splits.SECRET_ENV, splits.PUBLIC)
    assert [splits.split_of(i) for i in ids] == [splits.public_split_of(i) for i in ids]
    monkeypatch.setenv(splits.SECRET_ENV, "whale-tests")
    assert [splits.split_of(i) for i in ids] != [splits.public_split_of(i) for i in ids]
