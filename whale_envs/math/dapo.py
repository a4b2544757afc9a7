"""The strict ``\\boxed{}`` verifier of DAPO (verl's ``math_dapo`` rule), selectable with
``gym.make("whale/Math-v0", verifier="dapo")``; the paper scores math this way for RSFT, harness
search and test alike.

The rule, as DAPO runs it:

* only the **last 300 characters** of the response are read (DAPO's length cap), and of those the
  strict-box check looks at the **last 100**;
* the answer is the content of the last ``\\boxed{...}`` there (balanced braces); none -> wrong;
* it is correct when it equals the ground truth **as a string** (no normalization at all in the strict
  mode). ``minerva`` mode (``verifier="dapo_minerva"``) instead takes the last ``Answer: ...`` line and
  compares both sides after DAPO's Minerva string normalization (:func:`normalize_final_answer`).

Pure string work: nothing is evaluated, parsed as math or run. The Minerva normalization is
re-implemented from its published description (substitutions, removed unit words, ``\\text{}`` /
``\\boxed{}`` unwrapping, ``\\frac``/``\\sqrt`` shorthand, digit grouping).
"""

from __future__ import annotations

import re

from whale_envs.math.verify import Verdict

#: DAPO reads only the tail of a response.
RESPONSE_TAIL = 300
BOX_TAIL = 100

_ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")

_SUBSTITUTIONS = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
_REMOVED = (
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots",
    "sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters",
    "meals", "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}",
    "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ",
    "^{\\circ}", "\\;", ",\\!", "{,}", '"', "\\dots",
)  # fmt: skip


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` of ``text`` (balanced braces), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    for i in range(start + len("\\boxed"), len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + len("\\boxed{") : i]
    return None


def normalize_final_answer(answer: str) -> str:
    """DAPO's Minerva-style string normalization (see the module docstring)."""
    answer = answer.split("=")[-1]
    for before, after in _SUBSTITUTIONS:
        answer = answer.replace(before, after)
    for expr in _REMOVED:
        answer = answer.replace(expr, "")
    answer = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", answer)
    answer = re.sub(r"(\\text\{)(.*?)(\})", "\\2", answer)
    answer = re.sub(r"(\\textbf\{)(.*?)(\})", "\\2", answer)
    answer = re.sub(r"(\\overline\{)(.*?)(\})", "\\2", answer)
    answer = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", answer)
    answer = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", answer)
    answer = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


def check_strict_box(response: str, ground_truth: str) -> Verdict:
    """DAPO's strict rule: the last box of the last 100 of the last 300 characters == the ground truth."""
    tail = response[-RESPONSE_TAIL:][-BOX_TAIL:]
    boxed = last_boxed(tail)
    gold = str(ground_truth)
    if boxed is None:
        return Verdict(False, None, "[INVALID]", gold, "malformed")
    return Verdict(boxed == gold, boxed, boxed, gold, "dapo_strict")


def check_minerva(response: str, ground_truth: str) -> Verdict:
    """DAPO's Minerva rule: the last ``Answer:`` line, normalized, == the normalized ground truth."""
    found = _ANSWER_LINE.findall(response[-RESPONSE_TAIL:])
    extracted = found[-1] if found else None
    normalized = normalize_final_answer(extracted if extracted is not None else "[INVALID]")
    gold = normalize_final_answer(str(ground_truth))
    if extracted is None:
        return Verdict(False, None, normalized, gold, "malformed")
    return Verdict(normalized == gold, extracted, normalized, gold, "dapo_minerva")


#: ``verifier=`` names of the math env and their functions (``"whale"`` is the default verifier).
VERIFIERS = {"dapo": check_strict_box, "dapo_minerva": check_minerva}
