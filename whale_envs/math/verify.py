"""The math verifier: is a final answer equivalent to the gold answer?

``check(answer, gold)`` returns a :class:`Verdict`. Rules, in order (the first matcher that can decide
decides; its name is ``Verdict.matcher``):

1. **Extraction.** If the answer contains ``\\boxed{...}`` (or ``\\fbox{...}``), the content of the *last*
   box is the answer: when several answers are given, the last one counts. An answer text longer than
   ``MAX_TEXT_CHARS``, or an extracted answer longer than ``MAX_ANSWER_CHARS``, is not an answer
   (matcher ``too_long``).
2. **Normalization** of both sides (:func:`normalize`): ``$...$`` / ``\\(...\\)`` delimiters, spacing
   commands (``\\!``, ``\\,``), ``\\left``/``\\right``, ``\\dfrac`` → ``\\frac``, degree signs, ``%``,
   currency signs (``$``, ``\\$``, €, £), a leading ``x =`` when the gold has no ``=``, a trailing
   period, and all white space. Numbers, on purpose more lenient than an exact string match (each rule
   has its tests in ``tests/envs/test_math_verify.py``):

   * *thousands separators* (``1,000``, ``10,\\!000``, ``10{,}000``, ``1 000 000``, LaTeX's thin-space
     grouping ``11,\\! 111,\\! 100``) make one number only when every group after the first has three
     digits and the whole answer is that number (with an optional unit): ``(1,2)``, ``1, 2`` and
     ``1 8`` stay lists, never the number their digits spell;
   * a *unit* after a number is dropped (``18 dollars``, ``5\\text{ cm}``, ``1,000 km``);
   * a *multiplier word* after a number multiplies it (``5 million`` = 5000000, ``2 dozen`` = 24,
     ``3 hundred`` = 300): it is part of the value, never a unit;
   * a number followed by an *operation or fraction word* (``5 squared``, ``3 halves``, ``2 times``,
     ``7 less``) keeps its words: that is not a plain number, and nothing below reads it as one.
3. ``exact``: the normalized strings are equal.
4. ``numeric``: both sides are plain numbers (integers, decimals, ``a/b``, ``\\frac{a}{b}``, mixed numbers
   ``2\\frac{1}{2}``): compared *exactly* as rationals, so ``0.5 = 1/2 = \\frac{1}{2} = 0.50`` but
   ``0.33 ≠ 1/3``. This matcher decides both ways (no later matcher can turn a wrong number right).

   *Unbracketed lists*: a gold that is a list of several values without brackets (``1,-2``, ``3, 5,
   7``: "separated by commas") and an answer that is one too compare as multisets (``-2, 1`` for
   ``1,-2``); all numbers here, else item by item in step 5 (mode ``multiset``). A digit-grouped gold
   is one number, never such a list. *Relations*, when the gold holds none: an answer ``a = b = c`` or
   ``a \\approx b`` scores only when every side equals the gold (the first may name it instead:
   ``x``, ``a_n``, ``f(2)``): ``19 = 18`` and ``x = 17 = 18`` do not score for 18. Numeric sides are
   decided here, others in step 5 (mode ``chain``).
5. ``math_verify``: both sides parsed into SymPy and compared symbolically by Hugging Face's
   math-verify (expressions, sets, intervals, tuples, matrices, equations). A side that is a plain
   number goes in as that number (so a digit-grouped gold ``10,080`` is the number 10080, never the set
   ``{10, 80}``). **No text is ever evaluated**: LaTeX goes through math-verify's LaTeX grammar only
   (its expression extraction is SymPy's ``parse_expr``, which is ``eval``, and is never used), and
   plain text (``2*sqrt(2)``) through a small grammar of our own that builds SymPy objects and can
   name nothing but numbers, one-letter symbols and a fixed table of functions
   (:mod:`whale_envs.math._symbolic`). Whatever parsed a side, its tree is checked against the
   plain grammar's caps (exponents, powers, factorials, digits, terms of a sum) before anything
   evaluates it: over them, matcher ``too_costly`` at once. And this step runs only **in the OS sandbox**
   (:func:`whale_envs.sandbox.spawn_python`: a helper process with no network, no project files, no
   answers, a memory limit), never in the trusted process.
6. ``none``: nothing matched (``solved=False``).

Step 5 has a CPU-time limit (``timeout_s``, default 5 s, counted by the helper on its own CPU clock,
so it fires the same on an idle and on a saturated machine; ``timed_out=True`` and
``matcher="timeout"``) and a wall-clock backstop (``WALL_BACKSTOP`` × ``timeout_s`` + ``WALL_SLACK_S``, for a helper
that stops answering: it is killed and a fresh one takes the next comparison). A comparison the
helper could not finish for another reason (out of memory) is matcher ``error``. There is a pool of
``_HelperPool.SIZE`` helpers per process, each started on first need and running one comparison at a
time, so one expensive answer holds one helper and the others go on; the caller's thread does not
matter. A helper killed for a timeout or an error is restarted by the comparison that killed it, before
it returns to the pool: the episode that asked pays for it. The verifier's CPU is not charged to an
episode's tool budget (there is no per-episode hook for it); it is bounded per answer by ``timeout_s``.
Inputs longer than ``MAX_SYMBOLIC_CHARS`` never reach a helper.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import select
import threading
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

#: Longest answer text read at all, and longest extracted answer (after the last box is taken).
MAX_TEXT_CHARS = 200_000
MAX_ANSWER_CHARS = 1_000
#: Longest normalized answer handed to the symbolic step.
MAX_SYMBOLIC_CHARS = 400
#: The symbolic step's wall-clock backstop: this many times its CPU-time limit, plus WALL_SLACK_S.
WALL_BACKSTOP = 20
WALL_SLACK_S = 30.0


@dataclass(frozen=True)
class Verdict:
    """The verifier's decision and how it was reached (all of it goes into the final ``info``)."""

    solved: bool
    extracted: str | None  # the answer taken from the agent's text (last box), before normalization
    normalized: str  # the normalized answer
    gold: str  # the normalized gold answer
    #: "exact" | "numeric" | "math_verify" | "too_costly" | "timeout" | "error" | "malformed" | "too_long"
    #: | "none"
    matcher: str
    timed_out: bool = False

    def as_info(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------------------------ extraction

_BOX = re.compile(r"\\(?:boxed|fbox)\s*")


def _closing_braces(text: str) -> dict[int, int]:
    """Index of each ``{`` → index of its matching ``}`` (escaped braces ``\\{`` ``\\}`` do not count);
    one pass over the text."""
    pairs, stack = {}, []
    for j, ch in enumerate(text):
        if ch == "{" and (j == 0 or text[j - 1] != "\\"):
            stack.append(j)
        elif ch == "}" and j > 0 and text[j - 1] != "\\" and stack:
            pairs[stack.pop()] = j
    return pairs


def boxed_contents(text: str) -> list[str]:
    """The contents of every ``\\boxed{...}`` / ``\\fbox{...}`` in ``text`` (balanced braces), in order.

    ``\\boxed 5`` (no braces) yields its single token. An unclosed ``\\boxed{`` yields nothing: it is
    not a well-formed answer. Linear in the text's length.
    """
    found = []
    pairs: dict[int, int] | None = None
    for m in _BOX.finditer(text):
        i = m.end()
        if i < len(text) and text[i] == "{":
            if pairs is None:
                pairs = _closing_braces(text)
            if i in pairs:
                found.append(text[i + 1 : pairs[i]])
        else:
            token = re.match(r"[^\s$]+", text[i : i + MAX_ANSWER_CHARS + 1])
            if token:
                found.append(token.group(0))
    return found


def last_boxed(text: str) -> str | None:
    """The content of the last box in ``text``, or None when there is no box."""
    boxes = boxed_contents(text)
    return boxes[-1] if boxes else None


# ------------------------------------------------------------------------------------ normalization

_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)"
#: A separator between thousands groups: a comma, white space, a LaTeX space, a tilde.
_SEP = r"(?:,|\s|\\[ ,;!]|~)"
#: A number written in thousands groups (``1,000``, ``1 000 000.5``) or plainly.
_GROUPED = r"[-+]?(?:\d{1,3}(?:" + _SEP + r"+\d{3})+(?:\.\d+)?|\d+(?:\.\d*)?|\.\d+)"
_WORDS = r"[a-zA-Z][a-zA-Z.]*(?:\s+[a-zA-Z][a-zA-Z.]*){0,3}"
_NUMBER_AND_WORDS = re.compile(r"^(?P<num>" + _GROUPED + r"(?:/\d+)?)\s*(?P<words>" + _WORDS + r")?$")
_TEXT_CMD = re.compile(r"\\(?:text|textbf|textit|mbox|mathrm|mathbf|operatorname)\s*\{([^{}]*)\}")
_LEAD_VAR = re.compile(r"^[a-zA-Z](?:_\{?\w+\}?)?\s*=\s*(?=\S)")

#: Words after a number that are part of its value.
MULTIPLIERS = {
    "dozen": 12,
    "hundred": 100,
    "thousand": 1_000,
    "million": 10**6,
    "billion": 10**9,
    "trillion": 10**12,
}
#: Words after a number that make it something else than that number (never dropped as a unit).
NOT_UNITS = frozenset(
    "squared cubed plus minus times over divided less more than and or of power powers root roots "
    "factorial percentages half halves third thirds quarter quarters fourth fourths fifth fifths sixth "
    "sixths seventh sevenths eighth eighths ninth ninths tenth tenths hundredth hundredths thousandth "
    "thousandths millionth millionths point e i x y z n k pi".split()
)


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
    """Normalization that keeps LaTeX structure (what the symbolic step gets). Every pattern here is
    linear in the answer's length (no nested or adjacent unbounded repetition over the same characters)."""
    s = _strip_delimiters(answer)
    s = re.sub(r",\s*\\!\s*", ",", s)  # 11,\! 111,\! 100: LaTeX's thin-space digit grouping, one number
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
    # \text{} (a word answer, a multiple-choice letter) keeps its content. The match starts at the
    # backslash (a look-behind, not a leading \s*, so white space is not rescanned from every position).
    s = re.sub(r"(?<=[\d}\s])\\(?:text|mbox|mathrm)\s*\{\s*[a-zA-Z][a-zA-Z.\s]*\}(\^\{?\d\}?)?\s*$", "", s)
    s = _TEXT_CMD.sub(lambda m: m.group(1), s)
    s = s.strip().rstrip(".").strip()
    return _digit_groups(s)


_SPACED_DIGITS = re.compile(r"\d(?:\s|\\[ ,;!]|~)+\d")
_THOUSANDS_SPACED = re.compile(r"[-+]?\d{1,3}(?:(?:\s|\\[ ,;!]|~)+\d{3})+(?:\.\d+)?")


def _digit_groups(s: str) -> str:
    """Digits split by white space are one number only as thousands groups (``1 000 000``, also before
    a unit: ``10 000 km``); any other split (``1 8``) is a list of numbers, never the number its digits
    spell."""
    if not _SPACED_DIGITS.search(s):
        return s
    m = _THOUSANDS_SPACED.match(s.strip())
    if m and re.fullmatch(r"(?:\s*" + _WORDS + r")?", s.strip()[m.end() :]):
        return re.sub(r"(?:\s|\\[ ,;!]|~)+", "", m.group(0)) + s.strip()[m.end() :]
    return re.sub(r"(?<=\d)(?:\s|\\[ ,;!]|~)+(?=\d)", ", ", s)


def _number_words(s: str) -> str:
    """A number with words after it (``s`` has single spaces): thousands separators removed; a unit
    dropped; a multiplier applied; operation or fraction words kept (see the module docstring)."""
    m = _NUMBER_AND_WORDS.match(s)
    if not m:
        return s
    num, words = m.group("num"), (m.group("words") or "").split()
    if "/" not in num and re.search(r"\d[, ]\d", num):
        if (
            not re.fullmatch(r"[-+]?\d{1,3}(?:[, ]\d{3})+(?:\.\d+)?", num)
            or len(set(re.findall(r"[, ]", num))) > 1
        ):
            return s  # mixed separators (1,000 000) or short groups: not one number
        num = re.sub(r"[, ]", "", num)
    elif re.search(r"[, ]", num):
        return s
    if not words:
        return num
    lowered = [w.lower().rstrip(".") for w in words]
    if lowered[0] in NOT_UNITS:
        return s
    if lowered[0] in MULTIPLIERS or lowered[0].rstrip("s") in MULTIPLIERS:
        factor = MULTIPLIERS.get(lowered[0]) or MULTIPLIERS[lowered[0].rstrip("s")]
        value = (Fraction(num.split("/")[0]) / (int(num.split("/")[1]) if "/" in num else 1)) * factor
        if len(lowered) > 1 and lowered[1] in NOT_UNITS | set(MULTIPLIERS):
            return s  # "2 thousand million", "5 hundred thousand": not read as units
        return str(value)
    if any(w in NOT_UNITS or w in MULTIPLIERS for w in lowered):
        return s
    return num


def normalize(answer: str, *, gold_has_equals: bool = True) -> str:
    """The canonical string form of an answer (see the module docstring, step 2)."""
    s = latex_clean(answer)
    if not gold_has_equals:
        s = _LEAD_VAR.sub("", s)
    s = re.sub(r"\s+", " ", s).strip()
    s = _number_words(s)
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


def _number_text(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


# ------------------------------------------------------------------------------------ lists and relations

_OPEN, _CLOSE = "([{", ")]}"
#: Relations an answer may state its value with (``x = 18``, ``18 \\approx 18.0``); ``<``, ``\\le``,
#: ``\\in`` and the like are left to the symbolic step.
_RELATION = re.compile(r"\\(?:approx|simeq|doteq|sim)(?![a-zA-Z])|≈|(?<![<>!:\\])=(?!=)")
#: The first side of a relation that names the answer instead of stating a value: ``x``, ``a_n``,
#: ``f(2)``, ``P(A)``.
_LABEL = re.compile(r"[a-zA-Z](?:_\{?\w+\}?)?(?:\([^()]{1,20}\))?")
#: Most items in an unbracketed answer list compared as a multiset.
MAX_LIST_ITEMS = 20


def _top_level(s: str, sep: re.Pattern[str]) -> list[str]:
    """``s`` split at the matches of ``sep`` that are outside every bracket (``( [ { \\{``, closed by
    any closer, so a half-open interval ``(3,4]`` is one piece); ``[s]`` when there are none."""
    pieces, depth, start, i = [], 0, 0, 0
    while i < len(s):
        ch = s[i]
        if ch == "\\" and i + 1 < len(s) and s[i + 1] in "{}":
            depth += 1 if s[i + 1] == "{" else -1
            i += 2
            continue
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
        elif depth == 0:
            m = sep.match(s, i)
            if m and m.end() > i:
                pieces.append(s[start:i])
                start = i = m.end()
                continue
        i += 1
    pieces.append(s[start:])
    return [p.strip() for p in pieces]


def _value_text(piece: str, gold_has_equals: bool) -> str:
    """A list item or a side of a relation as the symbolic step gets it: a plain number as that number."""
    num = as_number(normalize(piece, gold_has_equals=gold_has_equals))
    return _number_text(num) if num is not None else piece


# ------------------------------------------------------------------------------------ the sandboxed helper


#: The helper's answers that decide nothing: its comparison ran out of CPU or failed. The helper is then
#: replaced (whatever state it is in) and the comparison is not remembered.
UNDECIDED = ("timeout", "error")


class _SymbolicHelper:
    """One sandboxed process that runs step 5 (:mod:`whale_envs.math._symbolic`); used by one thread at a
    time (the :class:`_HelperPool` hands it out)."""

    STARTUP_S = 120.0  # starting the jail and importing SymPy and math-verify; not counted per comparison
    RECYCLE_AFTER = 2000  # comparisons per helper (its RLIMIT_CPU covers its whole life)

    def __init__(self) -> None:
        self._proc = None
        self._owner = os.getpid()
        self._served = 0

    def _start(self):
        from whale_envs.sandbox import Limits, spawn_python

        source = (Path(__file__).with_name("_symbolic.py")).read_text(encoding="utf-8")
        limits = Limits(
            wall_s=24 * 3600,
            cpu_s=(self.RECYCLE_AFTER + 10) * 60,
            memory_mb=2048,
            max_processes=4,
            output_bytes=1 << 20,
            site_packages=True,
            writable_files=False,
        )
        proc = spawn_python(source, limits)  # raises IsolationUnavailable (with the opt-in) when it must
        if not select.select([proc.stdout], [], [], self.STARTUP_S)[0] or proc.stdout.readline() != "ready\n":
            tail = proc.stderr_tail().strip().splitlines()[-1:] or ["no output"]
            proc.close()
            raise RuntimeError(f"the verifier's sandboxed helper did not start: {tail[0][:300]}")
        self._served = 0
        return proc

    @property
    def started(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def ensure_started(self) -> None:
        if not self.started or self._served >= self.RECYCLE_AFTER:
            self.close()
            self._proc = self._start()

    def run(self, job: dict[str, Any], timeout_s: float) -> tuple[bool | None, str]:
        """(decision, matcher); matcher ``timeout`` when the CPU limit (or the wall backstop) ran out."""
        self.ensure_started()
        proc = self._proc
        proc.stdin.write(json.dumps({**job, "cpu_s": timeout_s}) + "\n")
        proc.stdin.flush()
        self._served += 1
        if select.select([proc.stdout], [], [], WALL_BACKSTOP * timeout_s + WALL_SLACK_S)[0]:
            line = proc.stdout.readline()
            if line:
                decided, matcher = json.loads(line)
                if matcher in UNDECIDED:
                    self.close()  # a fresh helper for the next comparison, whatever state this one is in
                return decided, matcher
        self.close()
        return None, "timeout"

    def close(self) -> None:
        if self._proc is not None and self._owner == os.getpid():
            self._proc.close()
        self._proc = None


class _HelperPool:
    """``SIZE`` sandboxed helpers, each running one comparison at a time: an answer that takes its whole
    CPU limit (or restarts its helper) holds one helper, and the other comparisons go on in the rest.
    A caller waits only when every helper is busy. Helpers start on first use, one at a time as needed.

    A comparison the helper decided is remembered (the last ``MEMO`` of them, keyed by its whole job and
    CPU limit): the symbolic step is a pure function of its texts, and the same answer meets the same
    gold again and again (the samples of one task, the stand-ins of ``whale check``, a task scored in
    every evaluation of a run). A timeout or an error is never remembered: it is asked again."""

    SIZE = 2
    MEMO = 20_000

    def __init__(self, size: int = SIZE) -> None:
        self._size = size
        self._reset()

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._helpers = [_SymbolicHelper() for _ in range(self._size)]
        self._idle = list(self._helpers)
        self._memo: dict[str, tuple[bool | None, str]] = {}

    def _after_fork(self) -> None:  # a forked child: the parent's helpers (and lock state) are not ours
        self._reset()

    def _acquire(self) -> _SymbolicHelper:
        with self._cond:
            while not self._idle:
                self._cond.wait()
            # a started helper first: a fresh start costs a second, a running one nothing
            helper = next((h for h in self._idle if h.started), self._idle[0])
            self._idle.remove(helper)
            return helper

    def _release(self, helper: _SymbolicHelper) -> None:
        with self._cond:
            self._idle.append(helper)
            self._cond.notify()

    def compare(self, gold: Any, pred: Any, timeout_s: float, mode: str = "one") -> tuple[bool | None, str]:
        """One comparison in a free helper (see :func:`whale_envs.math._symbolic.compare` for ``mode``),
        or its remembered decision."""
        job = {"gold": gold, "pred": pred, "mode": mode}
        key = json.dumps([job, timeout_s])
        with self._cond:
            if key in self._memo:
                return self._memo[key]
        helper = self._acquire()
        try:
            decided, matcher = helper.run(job, timeout_s)
            if matcher not in UNDECIDED:
                with self._cond:
                    if len(self._memo) >= self.MEMO:
                        self._memo.pop(next(iter(self._memo)))  # the oldest
                    self._memo[key] = (decided, matcher)
            if not helper.started:  # killed (timeout, error): its caller pays for the fresh one, not the next
                try:
                    helper.ensure_started()
                except Exception:  # noqa: BLE001 - the next comparison tries again and reports why
                    helper.close()
            return decided, matcher
        finally:
            self._release(helper)

    def procs(self) -> list:
        """The helper processes running now."""
        return [h._proc for h in self._helpers if h._proc is not None]

    def close(self) -> None:
        """Stop every helper and forget the remembered decisions (the next comparison starts afresh)."""
        for helper in self._helpers:
            helper.close()
        with self._cond:
            self._memo.clear()


_HELPER = _HelperPool()
atexit.register(_HELPER.close)
os.register_at_fork(after_in_child=_HELPER._after_fork)


# ------------------------------------------------------------------------------------ check


def check(answer: str | None, gold: str, *, timeout_s: float = 5.0) -> Verdict:
    """Decide whether ``answer`` (the agent's final answer text) matches ``gold`` (see module docstring).

    Never evaluates either text; never raises for anything in them (an answer that cannot be read is
    ``solved=False`` with the reason in ``matcher``). Raises ``IsolationUnavailable`` only when the
    symbolic step is needed and the sandbox cannot be built here without the user's opt-in.
    """
    g_norm = normalize(gold[:MAX_TEXT_CHARS])
    if answer is not None and len(answer) > MAX_TEXT_CHARS:
        return Verdict(False, None, "", g_norm, "too_long")
    extracted = None if answer is None else (last_boxed(answer) or answer).strip()
    gold_eq = "=" in gold
    if not extracted:
        return Verdict(False, extracted, "", g_norm, "none")
    if len(extracted) > MAX_ANSWER_CHARS:
        return Verdict(False, extracted[:MAX_ANSWER_CHARS], "", g_norm, "too_long")
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
    g_clean, p_clean = latex_clean(gold), latex_clean(extracted)
    if not gold_eq:
        p_clean = _LEAD_VAR.sub("", p_clean)

    # An unbracketed list answered for an unbracketed list gold ("separated by commas"): a multiset.
    g_items = _top_level(g_clean, re.compile(",")) if g_num is None else [g_clean]
    p_items = _top_level(p_clean, re.compile(","))
    if 1 < len(g_items) <= MAX_LIST_ITEMS and len(p_items) > 1 and p_num is None:
        if len(p_items) != len(g_items) or not all(p_items) or not all(g_items):
            return verdict(False, "none")
        if not gold_eq:
            p_items = [_LEAD_VAR.sub("", item) for item in p_items]
        if any(_RELATION.search(item) for item in p_items):
            return verdict(False, "none")  # a list item is a value, not a relation
        g_vals = [as_number(normalize(item)) for item in g_items]
        p_vals = [as_number(normalize(item, gold_has_equals=gold_eq)) for item in p_items]
        if None not in g_vals and None not in p_vals:
            return verdict(sorted(g_vals) == sorted(p_vals), "numeric")  # type: ignore[type-var]
        golds = [_value_text(item, True) for item in g_items]
        preds = [_value_text(item, gold_eq) for item in p_items]
        if sum(map(len, golds)) > MAX_SYMBOLIC_CHARS or sum(map(len, preds)) > MAX_SYMBOLIC_CHARS:
            return verdict(False, "none")
        decided, matcher = _HELPER.compare(golds, preds, timeout_s, mode="multiset")
        return verdict(bool(decided), matcher, timed_out=matcher == "timeout")

    # A relation for a gold that is none (x = 18, 19 = 18, 18 \approx 17): every side must be the gold
    # (the first may name it instead: x, a_n, f(2)). A false relation is not the answer.
    sides = _top_level(p_clean, _RELATION) if not _RELATION.search(g_clean) else [p_clean]
    if len(sides) > 1:
        if not all(sides):
            return verdict(False, "none")
        if _LABEL.fullmatch(sides[0]):
            sides = sides[1:]
        if g_num is not None:
            values = [as_number(normalize(side, gold_has_equals=True)) for side in sides]
            if any(v is not None and v != g_num for v in values):
                return verdict(False, "numeric")
            if None not in values:
                return verdict(True, "numeric")
        g_text = _number_text(g_num) if g_num is not None else g_clean
        preds = [_value_text(side, True) for side in sides]
        if len(g_text) > MAX_SYMBOLIC_CHARS or sum(map(len, preds)) > MAX_SYMBOLIC_CHARS:
            return verdict(False, "none")
        decided, matcher = _HELPER.compare(g_text, preds, timeout_s, mode="chain")
        return verdict(bool(decided), matcher, timed_out=matcher == "timeout")

    # A side that is a plain number goes to the symbolic step as that number, not as its digits.
    g_tex = _number_text(g_num) if g_num is not None else g_clean
    p_tex = _number_text(p_num) if p_num is not None else p_clean
    if len(g_tex) > MAX_SYMBOLIC_CHARS or len(p_tex) > MAX_SYMBOLIC_CHARS:
        return verdict(False, "none")
    decided, matcher = _HELPER.compare(g_tex, p_tex, timeout_s)
    return verdict(bool(decided), matcher, timed_out=matcher == "timeout")
