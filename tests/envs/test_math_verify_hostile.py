"""Red team, the math verifier: answer text is never evaluated, symbolic
matching runs only in the OS sandbox, and the verifier's lenient rules are right.

Before these tests, ``_sympy`` handed the answer to SymPy's ``parse_expr`` (``eval`` with builtins) and
math-verify's expression extraction did the same, in the trusted process: an answer could run any
command as the user of ``whale eval``. Each test here failed on that code.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from whale_envs.math import MathEnv, MathProblem
from whale_envs.math.verify import _HELPER, check, latex_clean
from whale_envs.tasks import ListSource, Task

# `make test` runs the tests that time calls side by side on one worker, one after another
pytestmark = pytest.mark.xdist_group("timing")

ROOT = Path(__file__).resolve().parents[2]


def payloads(marker: Path) -> list[str]:
    """Answers that run code wherever they are evaluated (each makes ``marker``, a directory)."""
    p = str(marker)
    return [
        f"\\boxed{{__import__('os').mkdir('{p}')}}",
        f"__import__('os').mkdir('{p}')",
        f"(lambda: __import__('os').mkdir('{p}'))()",
        f"x + __import__('os').mkdir('{p}')",
        f"\\boxed{{Symbol('x').__class__.__mro__[-1].__subclasses__() or __import__('os').mkdir('{p}')}}",
        f"$__import__('os').mkdir('{p}')$",
        f"\\text{{__import__('os').mkdir('{p}')}}",
        f"answer = exec(\"__import__('os').mkdir('{p}')\")",
    ]


@pytest.mark.parametrize("gold", ["5", "x+1", "\\frac{\\sqrt{3}}{2}", "(1, 2)"])
def test_an_answer_that_would_run_code_scores_zero_and_runs_nothing(tmp_path, gold):
    marker = tmp_path / "pwned"
    for answer in payloads(marker):
        v = check(answer, gold)
        assert not v.solved, (answer, v)
        assert not marker.exists(), f"the answer ran: {answer}"


def test_through_the_env_a_model_completion_cannot_run_code(tmp_path):
    """What a model completion does through the shipped math/h0: its text becomes the env's action."""
    marker = tmp_path / "pwned"
    env = MathEnv(tasks=ListSource("custom", [Task("q", MathProblem("What is 2+3?", "5"))]), max_tool_calls=0)
    for answer in payloads(marker):
        env.reset()
        _, reward, _, _, info = env.step(
            f"The answer is \\boxed{{{answer}}}" if "boxed" not in answer else answer
        )
        assert reward == 0.0, (answer, info)
        assert not marker.exists(), f"the answer ran: {answer}"


def test_the_trusted_process_never_imports_a_parser_and_the_helper_is_jailed():
    """The symbolic step is done by a sandboxed helper: the trusted process never even imports SymPy's
    or math-verify's parsers, and the helper runs in namespaces as a uid of its own."""
    code = (
        "import sys\n"
        "from whale_envs.math.verify import check, _HELPER\n"
        "assert check('2*sqrt(2)', '2\\\\sqrt{2}').solved\n"
        "assert check('(x+1)^2', 'x^2+2x+1').solved\n"
        "assert not check('080,10', '10,080').solved\n"
        "print(sorted(m for m in ('sympy', 'math_verify', 'latex2sympy2_extended') if m in sys.modules))\n"
        "print(_HELPER.procs()[0].isolation)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300, check=True
    ).stdout.split("\n")
    assert out[0] == "[]", out
    assert out[1] == "namespaces", out
    check("x", "x+0")  # the helper of this process
    assert _HELPER.procs() and all(p._uid not in (None, os.getuid()) for p in _HELPER.procs())


def test_plain_expressions_still_match_through_the_grammar():
    for gold, answer in [
        ("2\\sqrt{2}", "2*sqrt(2)"),
        ("\\frac{\\sqrt{3}}{2}", "sqrt(3)/2"),
        ("x^2+2x+1", "(x+1)^2"),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, pi/2)"),
        ("y = 2x + 1", "y = 1 + 2x"),
        ("6", "3!"),
    ]:
        assert check(answer, gold).solved, (gold, answer)
    for gold, answer in [("2\\sqrt{2}", "3*sqrt(2)"), ("(1, 2)", "(2, 1)"), ("x^2", "x^3")]:
        assert not check(answer, gold).solved, (gold, answer)


@pytest.mark.parametrize(
    "answer",
    [
        "9^9^9^9^9",
        "10**10**10",
        "99999!",
        "(" * 300 + "1" + ")" * 300,
        "x" * 390,
    ],
)
def test_answers_built_to_exhaust_the_verifier_score_zero_within_its_limits(answer):
    v = check(answer, "7")
    assert not v.solved and v.matcher in ("none", "math_verify", "too_costly", "error"), v  # never a timeout


# ------------------------------------------------------------------------------------ item 7: the rules


@pytest.mark.parametrize(
    ("answer", "gold", "solved"),
    [
        ("5 million", "5", False),  # a multiplier word is part of the value, never a unit
        ("5 million", "5000000", True),
        ("2.5 thousand", "2500", True),
        ("2 dozen", "2", False),
        ("2 dozen eggs", "24", True),
        ("3 hundred dollars", "3", False),
        ("5 squared", "5", False),  # an operation word keeps the number from being read as 5
        ("5 squared", "25", False),  # ... and is not evaluated either
        ("3 halves", "3", False),
    ],
)
def test_number_words_after_a_number_are_read_right(answer, gold, solved):
    assert check(answer, gold).solved is solved, check(answer, gold)


@pytest.mark.parametrize(
    ("answer", "gold", "solved"),
    [
        ("080,10", "10,080", False),  # a digit-grouped gold is one number, not the set {10, 80}
        ("80, 10", "10,080", False),
        ("\\{80, 10\\}", "10,080", False),
        ("10080", "10,080", True),
        ("10,080", "10080", True),
        ("10{,}080", "10,080", True),
    ],
)
def test_a_digit_grouped_gold_is_a_number(answer, gold, solved):
    assert check(answer, gold).solved is solved, check(answer, gold)


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("1,000 dollars", "1000"),
        ("10 000 km", "10000"),
        ("10{,}000\\text{ m}", "10000"),
        ("\\$1,250.50", "1250.5"),
        ("1,000,000 people", "1000000"),
    ],
)
def test_a_grouped_number_followed_by_a_unit_is_that_number(answer, gold):
    assert check(answer, gold).solved, check(answer, gold)


def test_mixed_or_short_groups_are_never_one_number():
    assert not check("1,000 000", "1000000").solved
    assert not check("1,00,000", "100000").solved
    assert not check("1 8", "18").solved


# ------------------------------------------------------------------------------------ item 4: linear time


def _clean_seconds(text: str) -> float:
    start = time.perf_counter()
    latex_clean(text)
    return time.perf_counter() - start


def test_normalization_is_linear_in_white_space():
    """A quadratic pattern (``\\s*`` rescanned from every white-space position) took seconds on tens of
    thousands of spaces, in the trusted process, outside any time limit. Measured side by side: 8× the
    input must cost well under 64× the time (a linear pass costs about 8×)."""
    small, big = "1" + " " * 4_000 + "x", "1" + " " * 32_000 + "x"
    _clean_seconds(small)
    t_small = min(_clean_seconds(small) for _ in range(3))
    t_big = min(_clean_seconds(big) for _ in range(3))
    assert t_big < 30 * max(t_small, 1e-4), (t_small, t_big)


def test_a_huge_answer_is_refused_before_it_is_read():
    v = check("1" + " " * 500_000 + "x", "1")
    assert not v.solved and v.matcher == "too_long"
    v = check("\\boxed{" * 50_000, "1")  # unclosed boxes: one linear pass, no answer
    assert not v.solved
    v = check("\\boxed{" + "1" * 5_000 + "}", "1")
    assert not v.solved and v.matcher == "too_long"


# ------------------------------------------------------------------------------------ issue 48: cost of an answer

#: LaTeX answers whose evaluation has no end in sight: towers, huge exponents, factorials, long numbers.
#: Before issue 48 the LaTeX path had no caps: each burnt the whole CPU limit and a helper restart.
HOSTILE = [
    "\\boxed{9^{9^{9}}}",
    "\\boxed{10^{10^{10}}}",
    "\\boxed{2^{2^{2^{2^{2}}}}}",
    "\\boxed{(10^{9})!}",
    "\\boxed{\\frac{8^{8^{8}}}{3}}",
    "\\boxed{x^{10^{12}} + 1}",
    "\\boxed{\\prod_{i=1}^{10^{9}} i}",
    "\\boxed{\\binom{10^{12}}{10^{11}}}",
    "\\boxed{" + "9" * 150 + "^{2}}",
]


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _honest(k: int):
    """An honest answer that needs the symbolic step (a fresh text each time: no parser cache helps)."""
    v = check(f"\\sin^2(x) + \\cos^2(x) + {k}", str(k + 1))
    assert v.solved and v.matcher == "math_verify", v
    return v


def _warm_both_helpers() -> None:
    """Two comparisons at once, twice: with a pool, both helpers are started before anything is timed."""
    import threading

    for k in (3, 5):
        threads = [threading.Thread(target=_honest, args=(k + j * 100,)) for j in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


@pytest.mark.parametrize("answer", HOSTILE)
def test_a_latex_answer_over_the_caps_is_refused_before_it_is_evaluated(answer):
    v = check(answer, "7")
    assert not v.solved and v.matcher == "too_costly" and not v.timed_out, v


def test_six_hostile_answers_cost_about_what_six_honest_ones_cost():
    """Six episodes answering with a tower took 53-75 s (six CPU limits, six helper restarts) where six
    honest answers take a fraction of a second. Measured side by side, not in absolute time."""
    _warm_both_helpers()
    honest = _seconds(lambda: [_honest(k) for k in range(11, 17)])
    hostile = _seconds(lambda: [check(f"\\boxed{{{k}^{{{k}^{{{k}}}}}}}", "7") for k in range(11, 17)])
    assert hostile < 5 * honest + 0.5, (hostile, honest)


def test_an_answer_that_uses_its_whole_cpu_limit_does_not_stall_other_verifications():
    """While one comparison burns its CPU limit (a legal but expensive answer), an honest verification
    is not stalled behind it: it runs in another helper, not behind one lock. Measured side by side,
    round after round (an idle sample, then one while the expensive comparison runs). A stall waits out
    the 0.5 s limit and a helper restart, 14x or more an idle verification's ~35 ms; the bound is 4x,
    since on CI's two shared cores the burning helper takes a core the honest one would otherwise get
    (2.1x once under a full suite)."""
    import statistics
    import threading

    _warm_both_helpers()
    expensive = ("\\boxed{(x+1)^{1000} - (x+2)^{999}}", "(x+3)^{1000}")
    go, in_flight, done, stop = (threading.Event() for _ in range(4))
    matchers = []

    def burn():
        while go.wait() and not stop.is_set():
            go.clear()
            in_flight.set()
            matchers.append(check(*expensive, timeout_s=0.5).matcher)
            done.set()

    worker = threading.Thread(target=burn, daemon=True)
    worker.start()
    idle, loaded = [], []
    try:
        for k in range(20, 27):
            idle.append(_seconds(lambda k=k: _honest(k)))
            in_flight.clear()
            done.clear()
            go.set()
            in_flight.wait()
            time.sleep(0.05)  # the expensive comparison is in its helper now
            loaded.append(_seconds(lambda k=k: _honest(k + 100)))
            assert done.wait(timeout=120)
    finally:
        stop.set()
        go.set()
        worker.join(timeout=120)
    assert set(matchers) == {"timeout"}, matchers  # each did burn its whole CPU limit
    assert statistics.median(loaded) <= 4 * statistics.median(idle), (idle, loaded)
