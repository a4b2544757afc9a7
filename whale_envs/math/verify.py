"""The math verifier: is a final answer equivalent to the gold answer?

``check(answer, gold)`` returns a :class:`Verdict`. Rules, in order (the first matcher that can decide
decides; its name is ``Verdict.matcher``):

1. **Extraction.** If the answer contains ``\\boxed{...}`` (or ``\\fbox{...}``), the content of the *last*
   box is the answer: when several answers are given, the last one counts.
2. **Normalization** of both sides (:func:`normalize`): ``$...$`` / ``\\(...\\)`` delimiters, spacing
   commands (``\\!``, ``\\,``), ``\\left``/``\\right``, ``\\dfrac`` → ``\\frac``, degree signs, ``%``,
   currency signs (``$``, ``\\$``, €, £), unit words after a number (``18 dollars``, ``5\\text{ cm}``),
   thousands separators (``1,000``, ``10,\\!000``, ``10{,}000`` — only when the whole answer is one
   number, so the tuple ``(1,2)`` and the list ``1, 2`` stay lists), a leading ``x =`` when the gold
   has no ``=``, a trailing period, and all white space.
3. ``exact``: the normalized strings are equal.
4. ``numeric``: both sides are plain numbers (integers, decimals, ``a/b``, ``\\frac{a}{b}``, mixed numbers
   ``2\\frac{1}{2}``): compared *exactly* as rationals, so ``0.5 = 1/2 = \\frac{1}{2} = 0.50`` but
   ``0.33 ≠ 1/3``. This matcher decides both ways (no later matcher can turn a wrong number right).
5. ``math_verify``: Hugging Face's math-verify parses both sides (LaTeX or plain expressions) into SymPy
   and compares them symbolically (expressions, sets, intervals, tuples, matrices, equations).
6. ``sympy``: when math-verify cannot parse a side, SymPy's own parser (plain text: ``x^2+1``,
   ``sqrt(2)/2``) and ``simplify(a - b) == 0``.
7. ``none``: nothing matched (``solved=False``).

Steps 5-6 run under a timeout (``timeout_s``, default 5 s; ``timed_out=True`` and ``matcher="timeout"``
when it fires, never a hang). In the main thread the timeout is a ``SIGALRM`` timer. Signals are for the
main thread only and a thread cannot be interrupted, so a call from another thread hands steps 5-6 to
a helper process (started on first use, shared, one comparison at a time) and kills it when the time
is up. Inputs longer than ``MAX_SYMBOLIC_CHARS`` never reach the symbolic steps.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

#: Longest normalized answer handed to the symbolic matchers.
MAX_SYMBOLIC_CHARS = 400


@dataclass(frozen=True)
class Verdict:
    """The verifier's decision and how it was reached (all of it goes into the final ``info``)."""

    solved: bool
    extracted: str | None  # the answer taken from the agent's text (last box), before normalization
    normalized: str  # the normalized answer
    gold: str  # the normalized gold answer
    matcher: str  # "exact" | "numeric" | "math_verify" | "sympy" | "timeout" | "malformed" | "none"
    timed_out: bool = False

    def as_info(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------------------------ extraction

_BOX = re.compile(r"\\(?:boxed|fbox)\s*")


def boxed_contents(text: str) -> list[str]:
    """The contents of every ``\\boxed{...}`` / ``\\fbox{...}`` in ``text`` (balanced braces), in order.

    ``\\boxed 5`` (no braces) yields its single token. An unclosed ``\\boxed{`` yields nothing: it is
    not a well-formed answer.
    """
    found = []
    for m in _BOX.finditer(text):
        i = m.end()
        if i < len(text) and text[i] == "{":
            depth, j = 0, i
            while j < len(text):
                if text[j] == "{" and (j == 0 or text[j - 1] != "\\"):
                    depth += 1
                elif text[j] == "}" and text[j - 1] != "\\":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            if depth == 0:  # closed
                found.append(text[i + 1 : j])
        else:
            token = re.match(r"[^\s$]+", text[i:])
            if token:
                found.append(token.group(0))
    return found


def last_boxed(text: str) -> str | None:
    """The content of the last box in ``text``, or None when there is no box."""
    boxes = boxed_contents(text)
    return boxes[-1] if boxes else None


# ------------------------------------------------------------------------------------ normalization

_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)"
_THOUSANDS = re.compile(r"^([-+]?)(\d{1,3}(?:,\d{3})+)(\.\d+)?$")
_TEXT_CMD = re.compile(r"\\(?:text|textbf|textit|mbox|mathrm|mathbf|operatorname)\s*\{([^{}]*)\}")
_UNIT_TAIL = re.compile(
    r"^(?P<num>" + _NUMBER + r"(?:/\d+)?)\s*(?P<unit>[a-zA-Z][a-zA-Z.]*(?:\s+[a-zA-Z][a-zA-Z.]*){0,3})$"
)
_LEAD_VAR = re.compile(r"^[a-zA-Z](?:_\{?\w+\}?)?\s*=\s*(?=\S)")


def _strip_delimiters(s: str) -> str:
    s = s.strip()
    changed = True
    while changed:
        changed = False
        for lo, hi in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
            if len(s) > len(lo) + len(hi) and s.startswith(lo) and s.endswith(hi):
                s = s[len(lo) : -len(hi)].strip()
                changed = True
    return s


def latex_clean(answer: str) -> str:
    """Normalization that keeps LaTeX structure (what the symbolic matchers get)."""
    s = _strip_delimiters(answer)
    s = s.replace("\\!", "").replace("{,}", ",").replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\\(?:left|right)(?![a-zA-Z])", "", s)
    s = re.sub(r"\\(?:displaystyle|,|;|:|quad|qquad)(?![a-zA-Z])", " ", s)
    s = s.replace("~", " ")
    s = re.sub(r"\^\s*\{?\s*\\circ\s*\}?", "", s)  # degrees
    s = s.replace("\\circ", "").replace("°", "")
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace("\\$", "").replace("$", "")
    s = re.sub(r"[€£¥]", "", s)
    # A unit in \text{} after a number or expression (with an optional power: cm^2); a whole-answer
    # \text{} (a word answer, a multiple-choice letter) keeps its content.
    s = re.sub(r"(?<=[\d}\s])\s*\\(?:text|mbox|mathrm)\s*\{\s*[a-zA-Z][a-zA-Z.\s]*\}(\^\{?\d\}?)?\s*$", "", s)
    s = _TEXT_CMD.sub(lambda m: m.group(1), s)
    s = s.strip().rstrip(".").strip()
    return _digit_groups(s)


_SPACED_DIGITS = re.compile(r"\d(?:\s|\\[ ,;!]|~)+\d")
_THOUSANDS_SPACED = re.compile(r"[-+]?\d{1,3}(?:(?:\s|\\[ ,;!]|~)+\d{3})+(?:\.\d+)?")


def _digit_groups(s: str) -> str:
    """Digits split by white space are one number only as thousands groups (``1 000 000``); any other
    split (``1 8``) is a list of numbers, never the number its digits spell."""
    if not _SPACED_DIGITS.search(s):
        return s
    if _THOUSANDS_SPACED.fullmatch(s.strip()):
        return re.sub(r"(?:\s|\\[ ,;!]|~)+", "", s)
    return re.sub(r"(?<=\d)(?:\s|\\[ ,;!]|~)+(?=\d)", ", ", s)


def normalize(answer: str, *, gold_has_equals: bool = True) -> str:
    """The canonical string form of an answer (see the module docstring, step 2)."""
    s = latex_clean(answer)
    if not gold_has_equals:
        s = _LEAD_VAR.sub("", s)
    s = re.sub(r"\s+", " ", s).strip()
    m = _UNIT_TAIL.match(s)
    if m and m.group("unit").lower() not in ("e", "i", "x", "y", "z", "n", "k", "pi"):
        s = m.group("num")
    m = _THOUSANDS.match(s.replace(" ", ""))
    if m:
        s = m.group(1) + m.group(2).replace(",", "") + (m.group(3) or "")
    return s.replace(" ", "")


_FRAC = re.compile(r"^([-+]?)(\d*)\\frac\{?(\d+)\}?\{?(\d+)\}?$")
_SLASH = re.compile(r"^([-+]?)(?:(\d+)\s)?(\d+)/(\d+)$")


def as_number(s: str) -> Fraction | None:
    """``s`` (already normalized) as an exact rational, if it is a plain number; else None."""
    if re.fullmatch(_NUMBER, s):
        try:
            return Fraction(s)
        except (ValueError, ZeroDivisionError):
            return None
    m = _FRAC.match(s)
    if not m:
        m = _SLASH.match(s)
    if m:
        sign, whole, num, den = m.groups()
        if int(den) == 0:
            return None
        value = Fraction(int(whole or 0)) + Fraction(int(num), int(den))
        return -value if sign == "-" else value
    return None


# ------------------------------------------------------------------------------------ timeout


class _Timeout(BaseException):
    """Raised by the alarm; a BaseException so that math-verify's ``except Exception`` lets it pass."""


def _can_time_out() -> bool:
    return threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")


@contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Raise :class:`_Timeout` in the block after ``seconds`` (main thread only; else no timer)."""
    if not _can_time_out() or seconds <= 0:
        yield
        return

    def fire(signum, frame):
        raise _Timeout()

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# ------------------------------------------------------------------------------------ symbolic


def _math_verify_parse(text: str) -> list:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    return parse(
        "\\boxed{" + text + "}",
        extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()],
        parsing_timeout=None,  # our own alarm covers the call (theirs would cancel ours)
    )


def _math_verify(gold: str, pred: str) -> bool | None:
    """True/False when math-verify parsed both sides into SymPy objects; None when it could not."""
    import math_verify.grader
    import math_verify.parser
    from sympy import Basic, MatrixBase

    # We pass no timeout to math-verify (our alarm covers it); silence its one-time warning about that.
    math_verify.parser.TIMEOUT_WARNING_SHOWN = True
    math_verify.grader.TIMEOUT_WARNING_SHOWN = True
    g, p = _math_verify_parse(gold), _math_verify_parse(pred)
    if not any(isinstance(x, (Basic, MatrixBase)) for x in g) or not any(
        isinstance(x, (Basic, MatrixBase)) for x in p
    ):
        return None
    return bool(math_verify.verify(g, p, timeout_seconds=None))


def _sympy(gold: str, pred: str) -> bool | None:
    """Plain-text SymPy comparison; None when either side does not parse."""
    import sympy
    from sympy.parsing.sympy_parser import (
        convert_xor,
        implicit_multiplication_application,
        parse_expr,
        standard_transformations,
    )

    transformations = (*standard_transformations, implicit_multiplication_application, convert_xor)

    def parse(s: str):
        s = s.replace("\\cdot", "*").replace("\\times", "*").replace("{", "(").replace("}", ")")
        s = s.replace("\\sqrt", "sqrt").replace("\\pi", "pi").replace("\\", "")
        try:
            return parse_expr(s, transformations=transformations, evaluate=True)
        except Exception:
            return None

    a, b = parse(gold), parse(pred)
    if a is None or b is None:
        return None
    try:
        return bool(sympy.simplify(a - b) == 0)
    except Exception:
        return None


def _symbolic(g_tex: str, p_tex: str, g_norm: str, p_norm: str) -> tuple[bool | None, str]:
    """Steps 5-6: (decision, matcher), or (None, "none") when neither matcher could parse both sides."""
    decided = _math_verify(g_tex, p_tex)
    if decided is not None:
        return decided, "math_verify"
    decided = _sympy(g_norm, p_norm)
    if decided is not None:
        return decided, "sympy"
    return None, "none"


class _SymbolicWorker:
    """A helper process running :func:`_symbolic` for callers outside the main thread (killable)."""

    STARTUP_S = 120.0  # importing SymPy and math-verify; not counted against a comparison's timeout

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None

    def _start(self) -> subprocess.Popen:
        root = str(Path(__file__).resolve().parents[2])
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
        }
        proc = subprocess.Popen(
            [sys.executable, "-c", "from whale_envs.math.verify import _serve; _serve()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            text=True,
        )
        assert proc.stdout is not None
        if not select.select([proc.stdout], [], [], self.STARTUP_S)[0] or proc.stdout.readline() != "ready\n":
            proc.kill()
            proc.wait()
            raise RuntimeError("the verifier's helper process did not start")
        return proc

    def compare(self, args: list[str], timeout_s: float) -> tuple[bool | None, str] | None:
        """(decision, matcher), or None when ``timeout_s`` ran out (the helper is then killed)."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._proc = self._start()
            proc = self._proc
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(json.dumps(args) + "\n")
            proc.stdin.flush()
            if select.select([proc.stdout], [], [], timeout_s)[0]:
                line = proc.stdout.readline()
                if line:
                    decided, matcher = json.loads(line)
                    return decided, matcher
            self.close()
            return None

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None


def _serve() -> None:
    """The helper process's loop: one JSON list of four strings in, one ``[decision, matcher]`` out."""
    _symbolic("1", "1", "1", "1")  # import everything before saying ready
    print("ready", flush=True)
    for line in sys.stdin:
        print(json.dumps(_symbolic(*json.loads(line))), flush=True)


_WORKER = _SymbolicWorker()
atexit.register(_WORKER.close)


# ------------------------------------------------------------------------------------ check


def check(answer: str | None, gold: str, *, timeout_s: float = 5.0) -> Verdict:
    """Decide whether ``answer`` (the agent's final answer text) matches ``gold`` (see module docstring)."""
    extracted = None if answer is None else (last_boxed(answer) or answer).strip()
    gold_eq = "=" in gold
    g_norm = normalize(gold)
    if not extracted:
        return Verdict(False, extracted, "", g_norm, "none")
    if _BOX.search(extracted):  # a box left unclosed (or one inside the answer): not a well-formed answer
        return Verdict(False, extracted, "", g_norm, "malformed")
    p_norm = normalize(extracted, gold_has_equals=gold_eq)

    def verdict(solved: bool, matcher: str, timed_out: bool = False) -> Verdict:
        return Verdict(bool(solved), extracted, p_norm, g_norm, matcher, timed_out)

    if p_norm == g_norm:
        return verdict(True, "exact")
    g_num, p_num = as_number(g_norm), as_number(p_norm)
    if g_num is not None and p_num is not None:
        return verdict(g_num == p_num, "numeric")
    g_tex = latex_clean(gold)
    p_tex = latex_clean(extracted)
    if not gold_eq:
        p_tex = _LEAD_VAR.sub("", p_tex)
    if len(g_tex) > MAX_SYMBOLIC_CHARS or len(p_tex) > MAX_SYMBOLIC_CHARS:
        return verdict(False, "none")
    args = [g_tex, p_tex, g_norm, p_norm]
    if _can_time_out():
        try:
            with _deadline(timeout_s):
                decided, matcher = _symbolic(*args)
        except _Timeout:
            return verdict(False, "timeout", timed_out=True)
    else:
        outcome = _WORKER.compare(args, timeout_s)
        if outcome is None:
            return verdict(False, "timeout", timed_out=True)
        decided, matcher = outcome
    return verdict(bool(decided), matcher)
