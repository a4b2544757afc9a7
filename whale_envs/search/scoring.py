"""Answer scoring for search QA: SQuAD-style normalization, exact match and token F1.

``normalize_answer`` follows the SQuAD v1.1 evaluation script (lowercase, drop punctuation, drop the
articles *a*, *an*, *the*, collapse whitespace), with two widenings so that typography never decides a
score: every Unicode punctuation character counts as punctuation (curly quotes, dashes), and the text
is NFKC-normalized first (full-width letters, ligatures). ``f1_score`` is the SQuAD token F1 with the
HotpotQA rule that a yes/no answer only matches itself.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Iterable

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ASCII_PUNCT = frozenset(string.punctuation)
_SPECIAL = ("yes", "no", "noanswer")


def _is_punct(ch: str) -> bool:
    return ch in _ASCII_PUNCT or unicodedata.category(ch).startswith("P")


def normalize_answer(text: str) -> str:
    """``"The  Eiffel-Tower!"`` -> ``"eiffeltower"``; see the module docstring for the rules."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = "".join(ch for ch in text if not _is_punct(ch))
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _same(prediction: str, gold: str) -> bool:
    ref = normalize_answer(gold)
    if ref:
        return normalize_answer(prediction) == ref
    # A gold alias that normalizes to nothing ("A+", "---" in NQ-open) would match every empty-ish
    # prediction ("the", "?"): compare it case-insensitively, whitespace collapsed, instead.
    return " ".join(prediction.lower().split()) == " ".join(gold.lower().split())


def exact_match(prediction: str, answers: Iterable[str]) -> bool:
    """True when the normalized prediction equals the normalized form of any gold alias."""
    return any(_same(prediction, gold) for gold in answers)


def _f1(prediction: str, gold: str) -> float:
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    if not ref:
        return float(_same(prediction, gold))
    if (pred in _SPECIAL or ref in _SPECIAL) and pred != ref:
        return 0.0
    pred_tokens, ref_tokens = pred.split(), ref.split()
    common = Counter(pred_tokens) & Counter(ref_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, answers: Iterable[str]) -> float:
    """The best token F1 of the prediction against any gold alias (0.0 when there is none)."""
    return max((_f1(prediction, gold) for gold in answers), default=0.0)


def contains_answer(text: str, answers: Iterable[str]) -> bool:
    """Whether ``text`` contains any gold alias as a whole-token span, after normalization.

    Used to report ``answer_retrieved`` (a retrieved passage mentions the answer) for sources that
    name no supporting passages, such as NQ-open with a user corpus.
    """
    hay = f" {normalize_answer(text)} "
    for gold in answers:
        needle = normalize_answer(gold)
        if needle and f" {needle} " in hay:
            return True
    return False
