"""whale/SearchQA-v0: actions, budgets, reward on every task of every source, no answer leaks, judge."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import whale_envs  # noqa: F401  (registers the envs)
from tests.env_steps import step_refused
from tests.http_fake import send_json
from whale_envs.data import bundled_path
from whale_envs.search import SearchQAEnv, normalize_answer, parse_action
from whale_envs.text_env import ActionError

NQ_QUESTIONS = bundled_path("nq_open", "NQ-open.dev.jsonl")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    """Index caches go to a temporary folder, never to the user's."""
    monkeypatch.setenv("WHALE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "whale-cache"))


@pytest.fixture(scope="module")
def nq_corpus(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("nq") / "corpus.jsonl"
    rows = [
        {
            "title": "Apollo 17",
            "text": "Apollo 17 left the Moon on 14 December 1972 UTC, the last crewed landing.",
        },
        {"title": "He Ain't Heavy", "text": "The song was written by Bobby Scott and Bob Russell."},
        {"title": "The Bastard Executioner", "text": "The Bastard Executioner ran for one season on FX."},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def sources(nq_corpus: str) -> list[str]:
    return [
        "generated?size=150",
        "generated?difficulty=3&distractors=5&corpus_size=80&size=60&seed=7",
        "hotpotqa",
        "hotpotqa?sample=dev",
        "musique",
        f"nq:{NQ_QUESTIONS}?corpus={nq_corpus}",
    ]


def answer(env: SearchQAEnv, task_id: str, text: str):
    env.reset(options={"task_id": task_id})
    return env.step(f"answer: {text}")


# ------------------------------------------------------------------------------ registration, check_env


def test_registered_and_check_env_passes_for_every_source(nq_corpus):
    assert "whale/SearchQA-v0" in whale_envs.ENVS
    for tasks in sources(nq_corpus):
        env = gym.make("whale/SearchQA-v0", tasks=tasks)
        assert isinstance(env.unwrapped, SearchQAEnv)
        check_env(env.unwrapped, skip_render_check=False)


# ------------------------------------------------------------------------------ reward


def test_gold_answer_and_every_alias_score_one_on_every_task_of_every_source(nq_corpus):
    checked = aliases = 0
    for tasks in sources(nq_corpus):
        env = SearchQAEnv(tasks)
        for task_id in env.task_ids:
            golds = env.source.get(task_id).payload.answers
            for gold in golds:
                _, reward, terminated, truncated, info = answer(env, task_id, gold)
                assert (reward, terminated, truncated) == (1.0, True, False), (tasks, task_id, gold)
                assert info["solved"] and info["em"] and info["f1"] == 1.0
                assert info["prediction"] == " ".join(gold.split())  # whitespace is collapsed
                checked += 1
            aliases += len(golds) > 1
    assert checked > 4000 and aliases > 0  # NQ-open and MuSiQue have aliases


def test_normalized_variants_of_the_gold_answer_score_one():
    env = SearchQAEnv("musique")
    task_id = "2hop__150763_14904"  # gold "G. Stanley Hall", alias "Stanley Hall"
    for variant in ("g stanley hall", "  The G. Stanley   Hall. ", "STANLEY HALL", "stanley hall!"):
        assert answer(env, task_id, variant)[1] == 1.0, variant


def test_a_wrong_entity_scores_zero_on_every_source(nq_corpus):
    for tasks in sources(nq_corpus):
        env = SearchQAEnv(tasks)
        ids = env.task_ids[:40]
        for task_id, other in zip(ids, ids[1:] + ids[:1], strict=True):
            golds = env.source.get(task_id).payload.answers
            wrong = env.source.get(other).payload.answers[0]
            if any(normalize_answer(wrong) == normalize_answer(g) for g in golds):
                continue  # the two questions happen to share their answer
            _, reward, terminated, _, info = answer(env, task_id, wrong)
            assert reward == 0.0 and terminated and not info["solved"] and not info["em"], (tasks, task_id)


def test_a_look_alike_distractor_scores_zero():
    env = SearchQAEnv("generated?difficulty=1&distractors=3&size=40")
    tried = 0
    for task_id in env.task_ids:
        qa = env.source.get(task_id).payload
        titles = {p.title for p in qa.corpus.passages}
        if qa.answers[0] not in titles:
            continue  # the answer is a value (a year, a job), not an entity
        first = qa.answers[0].split()[0]
        look_alikes = [t for t in titles if t != qa.answers[0] and t.split()[0] == first]
        for name in look_alikes:
            assert answer(env, task_id, name)[1] == 0.0
            tried += 1
    assert tried > 5


# ------------------------------------------------------------------------------ actions and budgets


def test_search_returns_top_k_passages_in_obs_and_info():
    env = SearchQAEnv("hotpotqa", top_k=5, passage_chars=80)
    obs, info = env.reset(options={"task_id": "5ae77176554299540e5a5593"})  # How to Eat (1998)
    assert info["passages"] == [] and info["query"] is None and info["searches_used"] == 0
    obs, reward, terminated, truncated, info = env.step("Search:   How to Eat   Nigella Lawson")
    assert (reward, terminated, truncated, info["error"]) == (0.0, False, False, None)
    assert info["query"] == "How to Eat Nigella Lawson" and info["searches_used"] == 1
    passages = info["passages"]
    assert len(passages) == 5 and passages[0]["title"] == "How to Eat"
    assert all(set(p) == {"id", "title", "text"} for p in passages)
    assert all(len(p["text"]) <= 80 for p in passages)
    assert passages[0]["text"].endswith("...")  # cut to the budget, marked
    for i, p in enumerate(passages, start=1):
        assert f"[{i}] {p['title']}\n{p['text']}" in obs
    # The next action's observation no longer shows these results.
    obs, *_, info = env.step("nonsense")
    assert info["passages"] == [] and "How to Eat is a 1998" not in obs


def test_search_budget_and_turn_budget():
    env = SearchQAEnv("generated?size=20", max_searches=2)
    env.reset(seed=0)
    assert env.max_turns == 4  # searches + answer + one mistake
    for _ in range(2):
        assert env.step("search: mayor")[4]["error"] is None
    obs, reward, terminated, truncated, info = env.step("search: capital")
    assert info["error_kind"] == "budget" and "no searches left" in info["error"]
    assert info["searches_used"] == 2 and not terminated and not truncated
    assert "answer: <text>" in obs and "search: <query>" not in obs
    obs, reward, terminated, truncated, info = env.step("search: river")
    assert truncated and not terminated and reward == 0.0
    assert info["solved"] is False and info["prediction"] is None and "Out of turns" in obs


def test_max_turns_option_and_zero_search_budget():
    env = SearchQAEnv("generated?size=20", max_searches=0, max_turns=1)
    env.reset(seed=1)
    _, _, terminated, truncated, info = env.step("search: anything")
    assert info["error_kind"] == "budget" and truncated and not terminated


@pytest.mark.parametrize(
    ("action", "kind", "words"),
    [
        ("", "malformed", "empty action"),
        ("   \n", "malformed", "empty action"),
        ("search:", "malformed", "empty query"),
        ("search:    ", "malformed", "empty query"),
        ("answer:", "malformed", "empty answer"),
        ("Paris", "malformed", "malformed action"),
        ("find: Paris", "malformed", "malformed action"),
        ("search Paris", "malformed", "malformed action"),
        ("search: the of and", "illegal", "no searchable words"),
        ("search: ?!", "illegal", "no searchable words"),
    ],
)
def test_bad_actions_are_clear_errors_that_change_nothing(action, kind, words):
    _, obs, info = step_refused(SearchQAEnv("hotpotqa"), action, kind, words, seed=4)
    assert obs.startswith(f"Error: {info['error']}") and "search: <query>" in obs
    assert info["searches_used"] == 0 and info["passages"] == [] and info["turn"] == 1


def test_parse_action():
    assert parse_action("ANSWER:  Paris\n France ") == ("answer", "Paris France")
    assert parse_action("  search:x y") == ("search", "x y")
    assert parse_action("answer: search: x") == ("answer", "search: x")
    with pytest.raises(ActionError):
        parse_action("I think the answer: Paris")


def test_a_query_that_matches_nothing_is_a_valid_search():
    env = SearchQAEnv("hotpotqa")
    env.reset(seed=0)
    obs, *_, info = env.step("search: zzyzxqwv")
    assert info["error"] is None and info["passages"] == [] and info["searches_used"] == 1
    assert "No passage matches" in obs


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    action=st.one_of(
        st.text(max_size=300),
        st.builds(
            lambda p, t: p + t, st.sampled_from(["search:", "answer:", "SEARCH: ", "search: a "]), st.text()
        ),
    )
)
def test_arbitrary_text_never_raises(action):
    env = _shared_env()
    obs0, _ = env.reset(seed=5)
    obs, reward, terminated, truncated, info = env.step(action)
    assert env.observation_space.contains(obs)
    assert reward in (0.0, 1.0) and isinstance(terminated, bool)
    assert info["error"] is None or info["error_kind"] in ("malformed", "illegal", "budget")
    assert len(info["passages"]) <= env.top_k
    if info["passages"]:  # only a valid search shows passages
        assert info["error"] is None and info["searches_used"] == 1 and info["query"]


_ENV: list[SearchQAEnv] = []


def _shared_env() -> SearchQAEnv:
    if not _ENV:
        _ENV.append(SearchQAEnv("hotpotqa?sample=dev"))
    return _ENV[0]


def test_same_seed_same_episode():
    a, b = SearchQAEnv("generated"), SearchQAEnv("generated")
    for env in (a, b):
        env.reset(seed=42)
    assert a.task.id == b.task.id
    assert a.step("search: city")[0] == b.step("search: city")[0]


# ------------------------------------------------------------------------------ no leaks


PUBLIC_KEYS = {
    "task_id",
    "turn",
    "max_turns",
    "error",
    "error_kind",
    "question",
    "query",
    "passages",
    "searches_used",
    "max_searches",
    "top_k",
    "passage_chars",
    "corpus_size",
}


def test_nothing_about_the_answer_before_the_end():
    env = SearchQAEnv("generated?size=60")
    for task_id in env.task_ids:
        qa = env.source.get(task_id).payload
        obs, info = env.reset(options={"task_id": task_id})
        infos = [info]
        obs_seen = [obs]
        for query in ("search: " + qa.question, "not an action"):
            obs, _, _, _, info = env.step(query)
            infos.append(info)
            obs_seen.append(obs)
        for info in infos:
            assert set(info) == PUBLIC_KEYS  # no solved / answers / supporting / gold_* keys
        gold = normalize_answer(qa.answers[0])
        assert gold not in normalize_answer(obs_seen[0])  # the question alone does not give it away
        for info in infos:
            for p in info["passages"]:
                assert set(p) == {"id", "title", "text"}  # no gold flag, no score
        # At the end the answer fields appear.
        *_, info = env.step("answer: x")
        assert info["answers"] == list(qa.answers) and info["supporting"] == list(qa.supporting)


def test_final_info_reports_f1_and_gold_retrieval():
    env = SearchQAEnv("hotpotqa", top_k=5)
    env.reset(options={"task_id": "5ae77176554299540e5a5593"})  # supporting: How to Eat, Nigella Lawson
    env.step("search: How to Eat Nigella Lawson book")
    *_, info = env.step("answer: in 1998 I think")
    assert info["solved"] is False and info["em"] is False
    assert 0.0 < info["f1"] < 1.0
    assert info["gold_retrieved"] is True and info["gold_recall"] == 1.0 and info["answer_retrieved"] is True
    assert info["retrieved"][0] == "How to Eat"

    env.reset(options={"task_id": "5ae77176554299540e5a5593"})
    *_, info = env.step("answer: 1998")
    assert info["solved"] and info["gold_retrieved"] is False and info["gold_recall"] == 0.0
    assert info["answer_retrieved"] is False and info["retrieved"] == []


def test_nq_reports_no_gold_passages_but_answer_retrieval(nq_corpus):
    env = SearchQAEnv(f"nq:{NQ_QUESTIONS}?corpus={nq_corpus}")
    assert env.task_ids[:3] == ["0", "1", "2"]  # NQ-open task ids are row indices
    env.reset(options={"task_id": "0"})  # when was the last time anyone was on the moon
    env.step("search: last time on the moon Apollo")
    *_, info = env.step("answer: December 1972")
    assert info["solved"] and info["supporting"] is None and info["gold_retrieved"] is None
    assert info["answer_retrieved"] is True


def test_env_options_are_validated():
    for bad in ({"top_k": 0}, {"passage_chars": 5}, {"max_searches": -1}, {"top_k": "3"}, {"judge": 3}):
        with pytest.raises(ValueError):
            SearchQAEnv("generated?size=5", **bad)


# ------------------------------------------------------------------------------ the LLM judge


class _JudgeServer:
    """A local OpenAI-compatible endpoint that answers every chat request with ``reply``."""

    def __init__(self, reply: str, status: int = 200):
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(
                    {"path": self.path, "body": body, "auth": self.headers.get("Authorization")}
                )
                send_json(self, status, {"choices": [{"message": {"role": "assistant", "content": reply}}]})

            def log_message(self, *args):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_judge_accepts_what_exact_match_misses():
    task_id = "5ae77176554299540e5a5593"
    with _JudgeServer("Yes.") as server:
        judge = {"base_url": server.url, "model": "judge-model", "api_key": "k"}
        env = SearchQAEnv("hotpotqa", judge=judge)
        _, reward, _, _, info = answer(env, task_id, "it came out in 1998")
        assert reward == 1.0 and info["solved"] and info["judge"] is True and info["em"] is False
        assert len(server.requests) == 1
        request = server.requests[0]
        assert request["path"] == "/v1/chat/completions" and request["auth"] == "Bearer k"
        assert request["body"]["model"] == "judge-model"
        prompt = request["body"]["messages"][0]["content"]
        assert "it came out in 1998" in prompt and "Nigella Lawson" in prompt and "1998" in prompt
        # An exact match never asks the judge.
        _, reward, _, _, info = answer(env, task_id, "1998")
        assert reward == 1.0 and info["judge"] is None and len(server.requests) == 1


def test_judge_no_and_judge_failures_fall_back_to_exact_match():
    task_id = "5ae77176554299540e5a5593"
    with _JudgeServer("<think>maybe</think> no") as server:
        env = SearchQAEnv("hotpotqa", judge={"base_url": server.url, "model": "m"})
        _, reward, _, _, info = answer(env, task_id, "1999")
        assert reward == 0.0 and info["judge"] is False and info["judge_error"] is None
    with _JudgeServer("perhaps") as server:
        env = SearchQAEnv("hotpotqa", judge={"base_url": server.url, "model": "m"})
        _, reward, _, _, info = answer(env, task_id, "1999")
        assert reward == 0.0 and info["judge"] is None and "yes/no" in info["judge_error"]
    with _JudgeServer("yes", status=500) as server:
        env = SearchQAEnv("hotpotqa", judge={"base_url": server.url, "model": "m", "timeout": 5})
        _, reward, _, _, info = answer(env, task_id, "1999")
        assert reward == 0.0 and "failed" in info["judge_error"]


def test_an_oracle_reaching_every_hop_by_search_solves_every_generated_task():
    """Searching each hop's entity by name finds its passage first, within the default budgets."""
    env = SearchQAEnv("generated?size=120&distractors=4&corpus_size=100")
    for task_id in env.task_ids:
        qa = env.source.get(task_id).payload
        env.reset(options={"task_id": task_id})
        for passage_id in qa.supporting:
            *_, info = env.step(f"search: {passage_id}")
            assert info["passages"][0]["id"] == passage_id, (task_id, passage_id)
        _, reward, terminated, _, info = env.step(f"answer: {qa.answers[0]}")
        assert reward == 1.0 and terminated and info["gold_recall"] == 1.0
