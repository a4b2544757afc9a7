"""The proposer contract: read the archive, write candidate harness source with a hypothesis."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from whale_train.meta_harness.archive import Archive


@dataclass
class ProposalContext:
    """What a proposer may use: the archive (read only) and where the search stands.

    Attributes:
        archive: the archive (candidates, their scores and traces per model version).
        domain: ``chess``, ``math`` or ``search``.
        env_id: the env the candidates run on.
        iteration: the iteration being proposed for.
        slots: the slots still to fill in this iteration (ids ``candidate_id(iteration, slot)``).
        model_version: the model version candidates will be scored under.
        incumbent: the current incumbent's id.
        frontier: the best candidates' ids at ``model_version``, best first.
        seed: the search seed.
        seed_id: the seed harness's id.
        prompt_only: only the seed's string constants may change.
        llm: the model candidates are scored with (the agent proposer's ``try_candidate`` rolls out
            with it; None where no rollout may be spent).
    """

    archive: Archive
    domain: str
    env_id: str
    iteration: int
    slots: list[int]
    model_version: int
    incumbent: str
    frontier: list[str]
    seed: int
    seed_id: str
    prompt_only: bool = False
    llm: Any = None

    def eval(self, cid: str) -> dict[str, Any] | None:
        """``cid``'s eval record at the current model version (None if not scored under it)."""
        return self.archive.get(cid).eval(self.model_version) if cid in self.archive else None

    def standing(self) -> str:
        """Where the search stands, for a proposer's task message: the iteration, the incumbent, the
        frontier and every candidate's status, score and parents under the current model."""
        rows = []
        for cand in self.archive.candidates():
            meta = cand.meta
            rec = cand.eval(self.model_version)
            score = f"{100 * rec['mean']:.1f}% ({rec['calls_per_episode']:.1f} calls/episode)" if rec else "-"
            rows.append(f"  {cand.id}: {meta.get('status')}, {score}, parents {meta.get('parents')}")
        return (
            f"Iteration {self.iteration}. The incumbent is {self.incumbent}; the frontier is {self.frontier}. "
            f"Scores under model v{self.model_version} on the search split:\n" + "\n".join(rows)
        )


@dataclass
class Proposal:
    """One candidate: its source and why it should do better.

    Attributes:
        source: the harness module's source.
        hypothesis: what the proposer expects and why (recorded in meta.json and the lineage).
        parents: ids of the candidates it derives from.
        change: ``mechanism``, ``compose``, ``memory``, ``constant`` (a pure constant change),
            ``prompt`` (prompt-only edit) or ``rewrite`` (free-form, e.g. from an LLM).
        summary: the change in a few words (``action: generate -> choose``), for the lineage report.
        components: mechanism per slot (and constants), for the lineage report.
        genome: the offline proposer's machine-readable recipe (None for free-form source).
        usage: the proposer's token usage and cost for this candidate.
    """

    source: str
    hypothesis: str
    parents: list[str]
    change: str = "rewrite"
    summary: str = ""
    components: dict[str, Any] = field(default_factory=dict)
    genome: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None


class Proposer(Protocol):
    """Proposes candidates for the slots of ``ctx``: at most ``len(ctx.slots)``, in slot order."""

    name: str

    def propose(self, ctx: ProposalContext) -> list[Proposal]: ...


class ProposerError(RuntimeError):
    """The proposer could not produce candidates (e.g. its server failed); the iteration goes on."""
