"""Red team, ``check_harness``: a model-free solver that behaves like h0 whenever it thinks it sees a
null model must still be caught. Each attack detects the stand-in by a different tell that a real
model would not show; the stand-ins must not show it."""

from __future__ import annotations

import gymnasium as gym
import pytest

from harnesses.loader import harness_from_source
from whale_train.check import SOLVER_ALPHA, binomial_tail, check_harness
from whale_train.llm.base import Request, SamplingParams
from whale_train.llm.scripted import ScriptedLLM
from whale_train.null_llms import LogLikelihoodNull, OtherTaskReal, PlausibleWrong

ENV = "whale/Math-v0"
KWARGS = {"tasks": "generated?families=arithmetic&difficulty=1"}

SOLVE = (  # the arithmetic family at difficulty 1: "What is a + b?", "a - b", "a * b"
    "        a, op, b = re.search(r'(\\d+) ([-+*]) (\\d+)', info['question']).groups()\n"
    "        value = {'+': int(a) + int(b), '-': int(a) - int(b), '*': int(a) * int(b)}[op]\n"
    "        env.step(f'answer: {value}')\n"
)
H0 = "        env.step('answer: ' + (text.strip() or '0'))\n"


def solver(tell: str) -> str:
    """A harness that solves by itself when ``tell`` says the model is real, else acts like h0."""
    return (
        "import re\nfrom harnesses.base import Harness\n"
        "class H(Harness):\n    def run(self, env, llm):\n"
        "        obs, info = env.reset()\n"
        "        text = llm.complete(obs)\n"
        f"        real = {tell}\n"
        "        if real:\n"
        + SOLVE.replace("        ", "            ")
        + "        else:\n"
        + H0.replace("        ", "            ")
    )


TELLS = {
    "scores are log-likelihoods (<= 0)": "all(s <= 0 for s in llm.score(obs, ['a', 'bb']))",
    "longer options score lower": "(lambda s: s[1] < s[0])(llm.score(obs, ['a', 'a much longer option']))",
    "scores depend on the prompt": "llm.score('p1', ['x']) != llm.score('p2', ['x'])",
    "scores are the same on a repeat": "llm.score(obs, ['x', 'y']) == llm.score(obs, ['x', 'y']) and llm.score(obs, ['x']) != llm.score('q', ['x'])",
    "the completion is a well-formed answer": "('answer' in text or 'boxed' in text)",
}


@pytest.mark.slow
@pytest.mark.parametrize("tell", list(TELLS), ids=list(TELLS))
def test_a_solver_that_hides_from_null_models_is_caught(tell):
    report = check_harness(harness_from_source(solver(TELLS[tell])), ENV, env_kwargs=KWARGS, n_tasks=8)
    assert not report.ok
    assert any(p.startswith("solver:") for p in report.problems), str(report)


@pytest.mark.slow
def test_hard_coded_answers_of_the_scored_tasks_are_caught_on_a_sample_of_those_tasks():
    """A proposer that has read traces could hard-code the scored tasks' answers; the train split alone
    would not show it."""
    env = gym.make(ENV, split="harness", **KWARGS).unwrapped
    scored = env.task_ids[:8]
    table = {}
    for tid in scored:
        env.reset(options={"task_id": tid})
        table[env.problem.question] = env.problem.answer
    source = (
        "from harnesses.base import Harness\n"
        f"TABLE = {table!r}\n"
        "class H(Harness):\n    def run(self, env, llm):\n"
        "        obs, info = env.reset()\n"
        "        text = llm.complete(obs)\n"
        "        env.step('answer: ' + TABLE.get(info['question'], text.strip() or '0'))\n"
    )
    ref = harness_from_source(source)
    # 16 tasks, half of them scored: at this family's chance level (about 0.125) 8 of 8 scored tasks solved
    # is far past the solver bound; 4 of 8 (n_tasks=8) was not, on the keyed split's draw
    assert check_harness(ref, ENV, env_kwargs=KWARGS, n_tasks=16).ok  # train tasks only: missed
    report = check_harness(ref, ENV, env_kwargs=KWARGS, n_tasks=16, score_tasks=scored)
    assert any(p.startswith("solver:") for p in report.problems), str(report)


def test_the_stand_ins_look_like_a_real_model():
    req = [Request("Problem: What is 5 + 7?\nReply with 'answer: <n>' or \\boxed{}.", SamplingParams(), 3)]
    for model in (LogLikelihoodNull("empty"), LogLikelihoodNull("random"), PlausibleWrong()):
        a = [c.logprob for c in model.score("prompt one", ["x", "a longer option"])]
        assert all(v < 0 for v in a) and a[1] < a[0]  # negative; longer options less likely
        assert a == [c.logprob for c in model.score("prompt one", ["x", "a longer option"])]  # consistent
        assert a != [
            c.logprob for c in model.score("prompt two", ["x", "a longer option"])
        ]  # prompt-dependent
    text = PlausibleWrong().complete(req)[0].text
    assert "answer:" in text or "\\boxed{" in text
    real = ScriptedLLM(lambda t: "answer: 12" if "5 + 7" in t else "answer: 3")
    assert OtherTaskReal(real, {"5 + 7": "1 + 2"}, seed=1).complete(req)[0].text == "answer: 3"
    assert OtherTaskReal(real, seed=1).complete(req)[0].prompt_text == req[0].prompt  # the record is honest


def test_the_margin_counts_tasks_not_episodes():
    """The previous check read 2 lucky tasks of 8 (2 samples each, chance 3%) as a solver; counted as
    tasks with a binomial test that is chance, while 6 of 8 is not."""
    q = 1 - (1 - 0.03) ** 2
    assert binomial_tail(8, 2, q) > SOLVER_ALPHA
    assert binomial_tail(8, 6, q) < SOLVER_ALPHA
    assert binomial_tail(8, 0, q) == pytest.approx(1.0)
