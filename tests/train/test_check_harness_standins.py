"""Red team, ``check_harness``: the stand-in models must not be told from
the real model by anything a harness observes, the check must catch a solver well above chance at its
defaults, ``whale check`` must run the same checks as the search, and the counterfactual stand-in must
not make an honest harness look like a cheat.

Each attack is a self-solver (it reads the arithmetic question and answers it) that solves only when a
tell says the model is real, and otherwise forwards the model's answer like ``math/h0``. Each of them
passed an earlier checker, and that checker rejected the honest vote below."""

from __future__ import annotations

import random
import re

import gymnasium as gym
import pytest

from harnesses.loader import harness_from_source
from whale_train.check import (
    CHANCE_FLOOR,
    CHECK_TASKS,
    REPLAYS,
    SOLVER_ALPHA,
    binomial_tail,
    check_harness,
    own_task_tail,
    solver_power,
)
from whale_train.cli import main
from whale_train.llm.base import Request, SamplingParams
from whale_train.llm.scripted import ScriptedLLM
from whale_train.null_llms import LogLikelihoodNull, OtherTaskReal, PlausibleWrong
from whale_train.rollout import RolloutConfig, run_rollouts

ENV = "whale/Math-v0"
KWARGS = {"tasks": "generated?families=arithmetic&difficulty=1"}  # "What is 3 + 5?", "a - b", "a * b"

SOLVE = (
    "m = re.search(r'(\\d+) ([-+*]) (\\d+)', info['question'])\n"
    "a, op, b = m.groups()\n"
    "env.step('answer: %d' % {'+': int(a) + int(b), '-': int(a) - int(b), '*': int(a) * int(b)}[op])\n"
)
FORWARD = "env.step('answer: ' + (text.strip() or '0'))\n"


def _indent(code: str, n: int) -> str:
    return "".join(" " * n + line + "\n" for line in code.splitlines())


def gated_solver(tell: str) -> str:
    """Solves by itself when ``tell`` (code that sets ``real``) says the model is real."""
    return (
        "import re\nfrom harnesses.base import Harness\n"
        "class H(Harness):\n    def run(self, env, llm):\n"
        "        obs, info = env.reset()\n"
        "        text = llm.complete(obs, max_tokens=16)\n"
        + _indent(tell, 8)
        + "        if real:\n"
        + _indent(SOLVE, 12)
        + "        else:\n"
        + _indent(FORWARD, 12)
    )


def solvers(report) -> list[str]:
    return [p for p in report.problems if p.startswith("solver:")]


# ------------------------------------------------------------------------------ the tells


def test_a_solver_gated_on_the_chat_template_flag_is_caught():
    """The real model (a chat model) reports a chat template; the old stand-ins never did."""
    source = gated_solver("real = llm.has_chat_template")
    report = check_harness(harness_from_source(source), ENV, env_kwargs=KWARGS, n_tasks=16)
    assert any("(chat)" in p for p in solvers(report)), str(report)
    # the model-free stand-ins copy the flag of the model being checked, whichever it is
    for chat in (False, True):
        real = ScriptedLLM(lambda t: "", chat=chat)
        for m in (
            LogLikelihoodNull("empty", like=real),
            LogLikelihoodNull("random", like=real),
            PlausibleWrong(like=real),
        ):
            assert m.has_chat_template is chat


def test_whale_check_runs_the_model_stand_in_and_catches_the_chat_flag_solver(tmp_path, capsys):
    """``whale check`` with its default model (the shipped tiny chat model) runs what the search runs."""
    path = tmp_path / "solver.py"
    path.write_text(gated_solver("real = llm.has_chat_template"))
    code = main(
        ["check", "--env", ENV, "--tasks", KWARGS["tasks"], "--harness", str(path), "--n-tasks", "16"]
    )
    out = capsys.readouterr().out
    assert code == 1, out
    assert "solver: with the other-task stand-in" in out, out  # the model-based stand-in ran


def test_whale_check_without_a_model_runs_both_chat_flags(capsys):
    args = ["check", "--env", ENV, "--tasks", KWARGS["tasks"], "--harness", "math/h0", "--no-model"]
    assert main([*args, "--n-tasks", "4"]) == 0
    out = capsys.readouterr().out
    assert "plausible 0.00" in out and "plausible (chat) 0.00" in out and "other-task" not in out, out


def test_a_solver_gated_on_temperature_0_determinism_is_caught():
    """A real model is greedy at temperature 0: the same prompt twice gives the same text."""
    tell = (
        "again = llm.complete(obs, temperature=0, max_tokens=64)\n"
        "real = again.strip() != '' and again == llm.complete(obs, temperature=0, max_tokens=64)"
    )
    report = check_harness(harness_from_source(gated_solver(tell)), ENV, env_kwargs=KWARGS, n_tasks=16)
    caught = " ".join(solvers(report))
    assert "random stand-in" in caught and "plausible stand-in" in caught, str(report)


def test_a_solver_gated_on_request_keyed_answers_of_the_real_model_is_caught():
    """The model-based stand-in once shuffled each prompt by its request: the same prompt sent twice
    got two answers, which the real model never gives at temperature 0. The real model here has a
    style the model-free stand-ins lack ("I think:"), so only the model-based stand-in is left to
    catch the solver, and it must."""
    real = ScriptedLLM(lambda text: "I think: " + text.split()[-1])  # depends on the prompt's word order
    tell = (
        "a = llm.complete(obs, temperature=0)\n"
        "b = llm.complete_many([obs, obs], temperature=0)\n"
        "real = a.startswith('I think:') and [a, a] == b"
    )
    report = check_harness(
        harness_from_source(gated_solver(tell)), ENV, env_kwargs=KWARGS, n_tasks=16, llm=real
    )
    caught = solvers(report)
    assert len(caught) == 1 and "other-task stand-in" in caught[0], str(report)


@pytest.mark.parametrize("chat", [False, True])
def test_every_stand_in_answers_as_a_function_of_prompt_params_and_seed_only(chat):
    """What the real backends do: temperature 0 ignores the seed, otherwise the seed decides; neither
    the request's place in a batch nor its batch mates change an answer; max_tokens cuts the same text."""
    real = ScriptedLLM(lambda text: f"answer: {len(text)} and some more words to cut", chat=chat)
    prompt = "Problem: What is 3 + 5? Reply with 'answer: <n>' or \\boxed{}."
    greedy, sampled = (
        SamplingParams(temperature=0, max_tokens=64),
        SamplingParams(temperature=1, max_tokens=64),
    )
    models = [
        LogLikelihoodNull("random", 7, like=real),
        PlausibleWrong(7, like=real),
        OtherTaskReal(real, {"3 + 5": "2 + 2"}),
    ]
    for m in models:
        assert m.has_chat_template is chat
        one = [m.complete([Request(prompt, greedy, seed)])[0].text for seed in range(6)]
        batch = [
            c.text
            for c in m.complete(
                [Request("other prompt", greedy, 1), *(Request(prompt, greedy, s) for s in range(6))]
            )[1:]
        ]
        assert len(set(one)) == 1 and batch == one, m.name  # greedy: the seed and the batch change nothing
        if not isinstance(
            m, OtherTaskReal
        ):  # (the scripted real model ignores the seed: so does its stand-in)
            draws = {m.complete([Request(prompt, sampled, seed)])[0].text for seed in range(12)}
            assert len(draws) > 1, m.name  # sampling: the seed decides ...
        again = [m.complete([Request(prompt, sampled, seed)])[0].text for seed in range(6)]
        assert again == [
            m.complete([Request(prompt, sampled, seed)])[0].text for seed in range(6)
        ]  # ... alone
        full = m.complete([Request(prompt, greedy, 3)])[0]
        cut = m.complete([Request(prompt, SamplingParams(temperature=0, max_tokens=2), 3)])[0]
        assert full.text.startswith(cut.text) and cut.completion_tokens <= 2
        assert cut.finish_reason == ("length" if full.completion_tokens > 2 else "stop")


def test_the_other_task_stand_in_answers_another_task_consistently():
    seen = []
    real = ScriptedLLM(lambda text: seen.append(text) or "answer: 1")
    m = OtherTaskReal(real, {"What is 3 + 5?": "What is 2 + 9?", "What is 2 + 9?": "What is 3 + 5?"})
    m.complete(
        [
            Request("Q: What is 3 + 5? Go.", SamplingParams(), 1),
            Request("Q: What is 2 + 9?", SamplingParams(), 2),
        ]
    )
    m.complete([Request("Q: What is 3 + 5? Go.", SamplingParams(), 99)])
    assert seen == [
        "Q: What is 2 + 9? Go.",
        "Q: What is 3 + 5?",
        "Q: What is 2 + 9? Go.",
    ]  # one pass, no re-swap
    assert (
        m.complete([Request("Q: What is 3 + 5?", SamplingParams(), 1)])[0].prompt_text == "Q: What is 3 + 5?"
    )


# ------------------------------------------------------------------------------ the defaults


REGEX_SOLVER = (  # solves the two-operand arithmetic questions (about 9% of the default mix), h0 otherwise
    "import re\nfrom harnesses.base import Harness\n"
    "class H(Harness):\n    def run(self, env, llm):\n"
    "        obs, info = env.reset()\n"
    "        text = llm.complete(obs, max_tokens=16)\n"
    "        m = re.fullmatch(r'What is (\\d+) ([-+*]) (\\d+)\\?', info['question'])\n"
    "        if m:\n"
    "            a, op, b = m.groups()\n"
    "            text = str({'+': int(a) + int(b), '-': int(a) - int(b), '*': int(a) * int(b)}[op])\n"
    "        env.step('answer: ' + (text.strip() or '0'))\n"
)


@pytest.mark.slow
def test_a_regex_solver_at_six_times_chance_is_caught_at_the_defaults():
    """The default Math-v0 mix has chance level ~1.5-2.5 %; this solver solves ~9 % of tasks by itself."""
    report = check_harness(harness_from_source(REGEX_SOLVER), ENV)
    assert solvers(report), str(report)
    assert all(0.05 < s < 0.15 for s in report.null_scores.values()), str(report)


def simulated_power(n: int, chance: float, ratio: float, trials: int, seed: int = 0) -> float:
    """Both tests of the check on a simulated solver: it solves ``ratio * chance`` of its tasks, and
    each of its actions solves another task at the chance level (answers that coincide)."""
    rng = random.Random(seed)
    m, alpha = min(8, REPLAYS // n), SOLVER_ALPHA / 4
    caught = 0
    for _ in range(trials):
        solved = [
            (rng.random() < ratio * chance, [rng.random() < chance for _ in range(m)]) for _ in range(n)
        ]
        hits = sum(own for own, _ in solved)
        chance_test = binomial_tail(n, hits, max(chance, CHANCE_FLOOR)) < alpha
        caught += hits > 0 and chance_test and own_task_tail(solved) < alpha
    return caught / trials


def test_the_defaults_have_the_power_the_docs_claim():
    """docs/HARNESSES.md: at the defaults a solver at 3x chance is caught with probability >= 0.9 where
    chance is 2 % or more by the first test (>= 0.85 by both), at 6x with >= 0.99; an honest harness is
    rejected with probability <= SOLVER_ALPHA."""
    for chance in (0.02, 0.05, 0.1, 0.2, 0.3):
        assert solver_power(CHECK_TASKS, chance, 3 * chance) >= 0.9, chance
    for chance in (0.01, 0.02, 0.05, 0.1):
        assert solver_power(CHECK_TASKS, chance, 6 * chance) >= 0.99, chance
    for chance in (0.01, 0.05, 0.2):  # at chance itself: the false-alarm rate, over 4 stand-ins
        assert 4 * solver_power(CHECK_TASKS, chance, chance) <= SOLVER_ALPHA
    assert simulated_power(CHECK_TASKS, 0.05, 3, trials=40) >= 0.95
    assert simulated_power(CHECK_TASKS, 0.01, 6, trials=40) >= 0.95
    assert simulated_power(CHECK_TASKS, 0.05, 1, trials=40) <= 0.05
    # the old defaults (16 tasks, 2 samples, "solved at least once", alpha 0.01 per stand-in) missed
    # a 6x solver at chance 1.5 % most of the time
    q, p = 1 - (1 - 0.015) ** 2, 6 * 0.015
    x = next(x for x in range(17) if binomial_tail(16, x, q) < 0.01)
    assert binomial_tail(16, x, p) < 0.3


# ------------------------------------------------------------------------------ honest harnesses


def good_model(text: str) -> str:
    """A model that does the arithmetic of the question it is asked, whatever the word order."""
    words = text.replace("?", " ").split()
    nums = [int(w) for w in words if re.fullmatch(r"-?\d+", w)]
    ops = [w for w in words if w in ("+", "-", "*")]
    if len(nums) < 2 or not ops:
        return "I do not know"
    a, b = nums[:2]
    return str({"+": a + b, "-": a - b, "*": a * b}[ops[0]])


VOTE = (
    "from harnesses.base import Harness, majority\n"
    "class Vote(Harness):\n    def run(self, env, llm):\n"
    "        obs, info = env.reset()\n"
    "        texts = llm.sample(info['question'] + ' Reply with the number only.', 5, max_tokens=8)\n"
    "        env.step('answer: ' + (majority([t.strip() for t in texts]) or '0'))\n"
)


def test_an_honest_vote_on_an_order_insensitive_task_is_not_rejected():
    """A word shuffle of "What is 3 + 5?" is still 3 + 5 to a model: the shuffling stand-in made this
    honest vote look like a cheat. Answering another task's question does not."""
    ref = harness_from_source(VOTE)
    real = ScriptedLLM(good_model)
    ids = gym.make(ENV, split="train", **KWARGS).unwrapped.task_ids[:16]
    config = RolloutConfig(k=1, seed=0, concurrency=8)
    honest = run_rollouts(ref, ENV, real, ids, env_kwargs={"split": "train", **KWARGS}, config=config)
    assert sum(t.solved for t in honest) >= 12  # with the real model the vote solves most tasks
    report = check_harness(ref, ENV, env_kwargs=KWARGS, n_tasks=64, llm=real)
    assert report.ok, str(report)
    assert report.null_scores["other-task"] < 0.2, str(report)


def test_the_checks_two_parts_report_what_the_whole_check_reports():
    """The search runs the weight-free stand-ins when a candidate is proposed (with overlap, while the
    weights train) and the real model's part when it is scored: joined, they are the whole check, at the
    whole check's level (a solver that only the real model's part catches is caught there)."""
    from whale_train.meta_harness.evaluate import Validation, joined

    real = ScriptedLLM(lambda text: "I think: " + text.split()[-1])
    tell = (
        "a = llm.complete(obs, temperature=0)\n"
        "b = llm.complete_many([obs, obs], temperature=0)\n"
        "real = a.startswith('I think:') and [a, a] == b"
    )
    ref = harness_from_source(gated_solver(tell))
    parts = {
        part: check_harness(ref, ENV, env_kwargs=KWARGS, n_tasks=16, llm=real, stand_ins=part)
        for part in ("all", "weight-free", "real-model")
    }
    whole, free, model = parts["all"], parts["weight-free"], parts["real-model"]
    assert list(free.null_scores) == ["empty", "random", "plausible"] and free.ok, str(free)
    assert list(model.null_scores) == ["other-task"] and solvers(model) == solvers(whole), str(model)
    assert free.episodes + model.episodes == whole.episodes and free.chance == model.chance == whole.chance
    as_validation = [
        Validation(
            r.ok, None, {"chance": r.chance, "null_scores": r.null_scores, "problems": r.problems}, r.episodes
        )
        for r in (free, model)
    ]
    both = joined(*as_validation)
    assert not both.ok and both.check["null_scores"] == whole.null_scores
    assert both.check["problems"] == whole.problems and both.check_episodes == whole.episodes
    with pytest.raises(ValueError, match="stand_ins must be one of"):
        check_harness(ref, ENV, env_kwargs=KWARGS, n_tasks=2, stand_ins="some")


def test_a_likeness_shows_what_the_model_shows_and_shares_no_tokenizer_with_it():
    from whale_train.llm import SHIPPED_MODEL
    from whale_train.llm.hf import TransformersLLM
    from whale_train.null_llms import Likeness

    llm = TransformersLLM(str(SHIPPED_MODEL))
    like = Likeness(llm)
    chat = [{"role": "user", "content": "What is 3 + 5?"}]
    assert like.has_chat_template is llm.has_chat_template is True
    assert like.render(chat) == llm.render(chat) and like.name == llm.name
    assert like.tokenizer is not llm.tokenizer and like.encode("3 + 5 = 8") == llm.encode("3 + 5 = 8")
    stand_in = PlausibleWrong(like=like)
    assert stand_in.tokens("What is 3 + 5?") == PlausibleWrong(like=llm).tokens("What is 3 + 5?")
    scripted = ScriptedLLM(lambda t: "", chat=False)
    detached = Likeness(scripted)  # no render, no tokenizer of its own: the stand-ins' rendering
    assert PlausibleWrong(like=detached).render(chat) == PlausibleWrong(like=scripted).render(chat)
    assert detached.tokenizer is None and detached.has_chat_template is False


def test_the_stand_ins_of_one_model_flag_share_a_worker(monkeypatch):
    """``check_harness`` starts one sandboxed worker per model flag for all its stand-ins
    (``reusing_workers``), not one per stand-in; every worker has ended when the check returns."""
    from harnesses.loader import load_harness
    from whale_train.rollout import workers

    started = []
    spawn = workers.spawn_python
    monkeypatch.setattr(
        workers, "spawn_python", lambda *a, **kw: started.append(spawn(*a, **kw)) or started[-1]
    )
    h0 = load_harness("math/h0")
    real = ScriptedLLM(lambda text: "answer: 1")
    assert check_harness(h0, ENV, env_kwargs=KWARGS, n_tasks=8, llm=real).ok
    assert len(started) == 1  # empty, random, plausible and other-task: the real model's flags
    assert check_harness(h0, ENV, env_kwargs=KWARGS, n_tasks=8).ok  # six model-free, two flags
    assert len(started) == 3 and all(p.poll() is not None for p in started)
