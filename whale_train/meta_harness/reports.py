"""What a harness-search step reports: one candidate's scoring (:class:`CandidateResult`), an
iteration's or rescore's report (:class:`IterationReport`, what ``whale train`` records per harness unit)
and a proposal waiting to be scored (:class:`Proposed`, the part an overlapped run carries between its
lanes). Plain records: ``whale_train.meta_harness.search`` makes them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class CandidateResult:
    """One candidate of a step: what it is, whether it passed the gates, its score and the decision."""

    id: str
    parents: list[str]
    proposer: str
    change: str
    hypothesis: str
    status: str
    reason: str | None = None
    mean: float | None = None
    se: float | None = None
    calls_per_episode: float | None = None
    tokens_per_episode: float | None = None
    rollouts: int = 0
    check_episodes: int = 0
    decision: str | None = None
    gain: float | None = None
    gain_se: float | None = None
    traces_version: int | None = None  # the model version whose traces its proposer read


@dataclass
class IterationReport(Mapping):
    """What one step did. Read it as attributes or as a read-only mapping (``report["rollouts"]``).

    Attributes:
        kind: ``iteration`` or ``rescore``.
        iteration: the iteration number (None for a rescore).
        model_version: the model version everything was scored under.
        candidates: the candidates of the step (for a rescore: the re-scored ones).
        incumbent_before / incumbent: the incumbent's id before and after the step.
        accepted: whether the incumbent changed.
        reason: the acceptance rule's verdict, with its numbers.
        rule: the acceptance rule.
        rollouts: model rollouts charged to this step (scoring and re-scoring).
        check_episodes: null-model episodes of ``check_harness`` (no model; not charged).
        frontier: the best ids under ``model_version`` after the step, best first.
        proposer_usage: the proposer's tokens and cost in this step (the agent proposer adds its turns,
            tool calls, prototype runs, tries and wall seconds).
        proposer_rollouts: model rollouts the proposer itself spent (the agent's ``try_candidate`` on
            train tasks): charged apart, not included in ``rollouts``.
        proposer_error: why the proposer gave fewer candidates than asked (None when it did not fail).
        rescore_rollouts: rollouts of the rescore this iteration ran first because the model version was
            new (included in ``rollouts``); ``triggered_by``: on a rescore, that iteration.
        wall_seconds: time spent in the call that completed the step.
        seq: the step's position among all steps of the archive.
        traces_version: on an iteration, the model version whose traces its proposer read (the scores it
            saw); ``model_version`` is the one its candidates were scored under, ``version_gap`` the
            difference (0 when proposed and scored at one version, as in strict alternation).
    """

    kind: str
    iteration: int | None
    model_version: int
    candidates: list[CandidateResult]
    incumbent_before: str
    incumbent: str
    accepted: bool
    reason: str
    rule: str
    rollouts: int
    check_episodes: int
    frontier: list[str]
    proposer_usage: dict[str, Any] = field(default_factory=dict)
    proposer_error: str | None = None
    proposer_rollouts: int = 0
    rescore_rollouts: int = 0
    triggered_by: int | None = None
    wall_seconds: float = 0.0
    created: str = ""
    seq: int = -1
    traces_version: int | None = None
    version_gap: int | None = None

    @property
    def improved(self) -> bool:
        """A new incumbent (the signal of the adaptive schedule's patience)."""
        return self.accepted

    @property
    def summary(self) -> str:
        scored = [c for c in self.candidates if c.mean is not None]
        best = max(scored, key=lambda c: c.mean) if scored else None
        head = f"iteration {self.iteration}" if self.kind == "iteration" else f"rescore v{self.model_version}"
        text = f"{head}: {len(self.candidates)} candidates, {len(scored)} scored"
        if best:
            text += f", best {best.id} {100 * best.mean:.1f}%"
        verdict = f"accepted {self.incumbent}" if self.accepted else f"kept {self.incumbent}"
        return f"{text}; {verdict}; {self.rollouts} rollouts"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["improved"] = self.improved
        d["summary"] = self.summary
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> IterationReport:
        d = {k: v for k, v in d.items() if k not in ("improved", "summary")}
        d["candidates"] = [CandidateResult(**c) for c in d["candidates"]]
        return cls(**d)

    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())


@dataclass
class Proposed:
    """What the proposer's part of an iteration left for its scoring: the candidates are in the archive.

    Attributes:
        iteration: the iteration proposed for.
        traces_version: the model version whose scores and traces the proposer read.
        usage: the proposer's tokens, cost (and the agent's tries) over the iteration's candidates.
        error: why the proposer gave fewer candidates than asked (None when it did not fail).
    """

    iteration: int
    traces_version: int
    usage: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
