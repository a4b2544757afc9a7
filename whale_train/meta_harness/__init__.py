"""The harness phase of WHALE: Meta-Harness search over an on-disk archive.

    from whale_train.meta_harness import HarnessSearch, MetaHarnessConfig

    search = HarnessSearch(MetaHarnessConfig(harness_tasks=128), "runs/x/archive", llm, "whale/Math-v0")
    search.rescore()                  # score the incumbent under the model's current version
    report = search.iterate()         # propose M candidates, check, score, maybe accept one
    search.incumbent                  # the harness to use now (a HarnessRef)

Parts (each swappable): ``Archive`` (the folder), ``Proposer`` (``OfflineProposer``, ``LLMProposer``),
``AcceptanceRule`` (``PairedGain``), the mechanism library (``library``), ``evaluate`` (gates and
scoring), ``prompt_only`` (the Fast-Slow Training rule), ``lineage`` (the markdown report). See
docs/META_HARNESS.md.
"""

from whale_train.meta_harness.acceptance import AcceptanceRule, AcceptanceVerdict, PairedGain
from whale_train.meta_harness.archive import Archive, candidate_id
from whale_train.meta_harness.config import MetaHarnessConfig
from whale_train.meta_harness.offline import OfflineProposer
from whale_train.meta_harness.proposer import Proposal, ProposalContext, Proposer, ProposerError
from whale_train.meta_harness.search import CandidateResult, HarnessSearch, IterationReport, make_proposer

__all__ = [
    "AcceptanceRule",
    "AcceptanceVerdict",
    "Archive",
    "CandidateResult",
    "HarnessSearch",
    "IterationReport",
    "MetaHarnessConfig",
    "OfflineProposer",
    "PairedGain",
    "Proposal",
    "ProposalContext",
    "Proposer",
    "ProposerError",
    "candidate_id",
    "make_proposer",
]
