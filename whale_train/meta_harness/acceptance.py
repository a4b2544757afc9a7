"""When a candidate replaces the incumbent, and which candidates form the frontier.

Both compare eval records (``evaluate.eval_record``) taken under the same model version on the same
tasks. Swap the rule by passing another ``AcceptanceRule`` to ``HarnessSearch``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from whale_train.stats import mean_se


@dataclass
class AcceptanceVerdict:
    """What an ``AcceptanceRule`` says about a challenger: accepted or not, why, and the numbers behind it."""

    accept: bool
    reason: str
    numbers: dict[str, float] = field(default_factory=dict)


class AcceptanceRule(Protocol):
    """Decides whether ``challenger`` beats ``incumbent`` by more than noise (both eval records)."""

    def decide(self, incumbent: dict[str, Any], challenger: dict[str, Any]) -> AcceptanceVerdict: ...


@dataclass
class PairedGain:
    """Accept when the mean per-task gain over the incumbent, on the tasks both were scored on, exceeds
    ``z`` standard errors of that gain and at least ``min_gain``.

    The gain's standard error is the sample standard deviation of the per-task differences over
    sqrt(tasks): a paired test, so the tasks' difficulty cancels out.
    """

    z: float = 2.0
    min_gain: float = 0.0

    def decide(self, incumbent: dict[str, Any], challenger: dict[str, Any]) -> AcceptanceVerdict:
        a, b = incumbent["per_task"], challenger["per_task"]
        tasks = sorted(set(a) & set(b))
        n = len(tasks)
        if n == 0:
            return AcceptanceVerdict(False, "no common tasks")
        gain, se = mean_se(b[t] - a[t] for t in tasks)
        threshold = max(self.min_gain, self.z * se)
        z_obs = gain / se if se > 0 else (math.inf if gain > 0 else 0.0)
        numbers = {"gain": gain, "se": se, "z": z_obs, "threshold": threshold, "tasks": n}
        accept = gain > 0 and gain > threshold
        verdict = "beats" if accept else "does not beat"
        reason = (
            f"{verdict} the incumbent: paired gain {100 * gain:+.1f} ± {100 * se:.1f} points on {n} tasks "
            f"(z = {z_obs:.2f}; needs gain > max({100 * self.min_gain:.1f}, {self.z:g} SE) = {100 * threshold:.1f})"
        )
        return AcceptanceVerdict(accept, reason, numbers)

    def describe(self) -> str:
        return f"paired gain > max({self.min_gain:g}, {self.z:g} x its standard error) on the same tasks"


def rank_key(cid: str, record: dict[str, Any]) -> tuple[float, float, float, str]:
    """Higher success rate first; ties: fewer LLM calls, then fewer tokens per episode; then the id."""
    return (-record["mean"], record["calls_per_episode"], record["tokens_per_episode"], cid)


def frontier(records: dict[str, dict[str, Any]], size: int) -> list[str]:
    """The ``size`` best candidates of ``records`` (id -> eval record at one model version)."""
    return [cid for cid, rec in sorted(records.items(), key=lambda kv: rank_key(*kv))][:size]
