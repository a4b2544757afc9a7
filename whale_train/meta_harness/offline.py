"""The offline proposer: new harnesses by composing and mutating mechanisms, guided by the traces.

No LLM. For each iteration it lists the changes it could make to the incumbent (and to the next best
candidates of the frontier), scores each one, and takes the best ``M`` that are new to the archive:

* **mechanism**: swap the mechanism of one slot (e.g. ``action: generate -> choose``);
* **compose**: bring one slot's mechanism of another frontier candidate into the incumbent;
* **memory**: show solved examples harvested from the parent's own traces;
* **constant**: move one active constant to a neighbouring value (temperature, votes, passages, ...).

A change's score is how much of the parent's failures it targets (the trace statistics of its eval
under the current model version, weighted per mechanism: many parse errors favour output formats and
parsers, many illegal moves favour constrained choice, ...), plus what the archive has already shown
about the same change elsewhere (the mean paired gain of candidates that made it), a bonus for a
mechanism never tried, minus how far the parent trails the incumbent, and a seeded jitter that breaks
ties (the constants below). A pure constant change is never proposed right after another one. The result is a readable,
self-contained harness module (``library``) with the hypothesis in its docstring.

In prompt-only mode it applies the domain's prompt rewrites (``Domain.prompt_edits``) instead,
one more per candidate, to the incumbent's source.

Deterministic: the plan of an iteration depends only on the seed, the iteration and the archive as it
was before the iteration began, so a resumed iteration proposes exactly what was proposed before.
"""

from __future__ import annotations

import copy
import random
import textwrap
from dataclasses import dataclass
from typing import Any

from whale_train.domains import domain_for, get_domain
from whale_train.meta_harness.archive import Candidate, candidate_id, parse_candidate_id, sha256
from whale_train.meta_harness.library import DomainLibrary, Genome, key, library_for
from whale_train.meta_harness.proposer import Proposal, ProposalContext

#: How an option is scored: the parent's success rate relative to the incumbent's, plus FIT x the share
#: of the parent's episodes that failed in the ways the change targets, plus the archive's measured
#: effect of the same change, plus NOVELTY for a mechanism never tried, minus CONSTANT_PENALTY for a
#: pure constant change, plus COMPOSE_BONUS for a composition, plus a seeded jitter in [0, JITTER).
FIT = 0.5
NOVELTY = 0.05
CONSTANT_PENALTY = 0.03
COMPOSE_BONUS = 0.03
JITTER = 0.02


@dataclass
class _Option:
    change: str  # mechanism | compose | memory | constant | prompt
    parents: list[str]
    genome: Genome | None
    what: str  # slot or constant name, or prompt edit key
    old: Any
    new: Any
    doc: str
    targets: dict[str, float]
    score: float = 0.0
    source: str | None = None  # prompt-only: the edited source


class OfflineProposer:
    """See the module docstring. ``seed`` offsets the jitter (the search seed is added to it)."""

    name = "offline"

    def __init__(self, seed: int = 0, max_examples: int = 3):
        self.seed = seed
        self.max_examples = max_examples

    # ------------------------------------------------------------------ entry point

    def propose(self, ctx: ProposalContext) -> list[Proposal]:
        rng = random.Random(f"offline/{self.seed}/{ctx.seed}/{ctx.iteration}")
        prior = [c for c in ctx.archive.candidates() if _iteration(c.id) < ctx.iteration]
        if ctx.prompt_only:
            options = self._prompt_options(ctx, prior, rng)
        else:
            options = self._options(ctx, prior, rng)
        options.sort(key=lambda o: -o.score)
        library = _library(ctx)
        taken = {_fingerprint(c, library) for c in prior}
        last = next(
            (c.meta.get("change") for c in reversed(prior) if c.meta.get("proposer") == self.name), None
        )
        slots = max(ctx.slots) + 1 if ctx.slots else 0
        plan: list[Proposal] = []
        for slot in range(slots):
            pick = None
            for option in options:
                fp = _option_fingerprint(option, library)
                if fp in taken or (option.change == "constant" and last == "constant"):
                    continue
                pick = option
                taken.add(fp)
                break
            if pick is None:
                break
            last = pick.change
            plan.append(self._proposal(ctx, slot, pick, library))
        return [plan[s] for s in ctx.slots if s < len(plan)]

    # ------------------------------------------------------------------ code changes

    def _options(self, ctx: ProposalContext, prior: list[Candidate], rng: random.Random) -> list[_Option]:
        library = _library(ctx)
        tried = _tried_mechanisms(prior)
        effects = _effects(prior, library)
        parents = [ctx.incumbent] + [f for f in ctx.frontier if f != ctx.incumbent][:2]
        options: list[_Option] = []
        inc_genome = self._genome(ctx, ctx.incumbent, library)
        inc_stats = _stats(ctx, ctx.incumbent)
        for rank, pid in enumerate(parents):
            genome = self._genome(ctx, pid, library)
            stats = _stats(ctx, pid)
            base = stats.get("solved", 0.0) - inc_stats.get("solved", 0.0)  # a weaker parent starts lower
            for slot, choices in library.slots.items():
                for choice, mech in choices.items():
                    if choice == genome["slots"][slot] or (slot == "memory" and choice == "examples"):
                        continue
                    child = copy.deepcopy(genome)
                    child["slots"][slot] = choice
                    opt = _Option(
                        "mechanism", [pid], child, slot, genome["slots"][slot], choice, mech.doc, mech.targets
                    )
                    opt.score = base + FIT * _fit(mech.targets, stats) + effects.get((slot, choice), 0.0)
                    opt.score += NOVELTY if (slot, choice) not in tried else 0.0
                    options.append(opt)
            for name, const in library.constants.items():
                if not const.active(genome):
                    continue
                values = list(const.values)
                current = genome["constants"][name]
                i = values.index(current) if current in values else 0
                for j in (i - 1, i + 1):
                    if 0 <= j < len(values):
                        child = copy.deepcopy(genome)
                        child["constants"][name] = values[j]
                        opt = _Option(
                            "constant", [pid], child, name, current, values[j], const.doc, const.targets
                        )
                        opt.score = (
                            base + FIT * _fit(const.targets, stats) + effects.get((name, values[j]), 0.0)
                        )
                        opt.score -= CONSTANT_PENALTY
                        options.append(opt)
            if genome["slots"].get("memory") == "none":
                examples = self._examples(ctx, pid, library, rng)
                if len(examples) >= 2:
                    child = copy.deepcopy(genome)
                    child["slots"]["memory"] = "examples"
                    child["examples"] = examples
                    mech = library.slots["memory"]["examples"]
                    opt = _Option(
                        "memory", [pid], child, "memory", "none", "examples", mech.doc, mech.targets
                    )
                    opt.score = (
                        base + FIT * _fit(mech.targets, stats) + effects.get(("memory", "examples"), 0.0)
                    )
                    opt.score += NOVELTY if ("memory", "examples") not in tried else 0.0
                    options.append(opt)
            if rank > 0:  # compose: one slot of this frontier member into the incumbent
                for slot, choice in genome["slots"].items():
                    if choice == inc_genome["slots"][slot] or slot == "memory":
                        continue
                    child = copy.deepcopy(inc_genome)
                    child["slots"][slot] = choice
                    mech = library.slots[slot][choice]
                    old = inc_genome["slots"][slot]
                    opt = _Option(
                        "compose", [ctx.incumbent, pid], child, slot, old, choice, mech.doc, mech.targets
                    )
                    opt.score = (
                        FIT * _fit(mech.targets, inc_stats) + effects.get((slot, choice), 0.0) + COMPOSE_BONUS
                    )
                    options.append(opt)
        for opt in options:
            opt.score += rng.uniform(0, JITTER)
        return options

    def _genome(self, ctx: ProposalContext, cid: str, library: DomainLibrary) -> Genome:
        """The candidate's genome; for free-form source, that of its nearest ancestor with one; else h0."""
        seen = set()
        while cid in ctx.archive and cid not in seen:
            seen.add(cid)
            meta = ctx.archive.get(cid).meta
            if meta.get("genome"):
                return copy.deepcopy(meta["genome"])
            parents = meta.get("parents") or []
            if not parents:
                break
            cid = parents[0]
        return copy.deepcopy(library.h0)

    def _examples(
        self, ctx: ProposalContext, cid: str, library: DomainLibrary, rng: random.Random
    ) -> list[dict]:
        cand = ctx.archive.get(cid)
        versions = cand.versions()
        if not versions:
            return []
        version = ctx.model_version if ctx.model_version in versions else versions[-1]
        found = [e for e in (library.harvest(t) for t in cand.traces(version)) if e]
        unique = list({tuple(sorted(e.items())): e for e in found}.values())
        return rng.sample(unique, min(self.max_examples, len(unique)))

    # ------------------------------------------------------------------ prompt-only

    def _prompt_options(
        self, ctx: ProposalContext, prior: list[Candidate], rng: random.Random
    ) -> list[_Option]:
        edits = domain_for(ctx.env_id).load_prompt_edits()
        applied_anywhere = {k for c in prior for k in c.meta.get("components", {}).get("edits", [])}
        effects = _effects(prior, None)
        parents = [ctx.incumbent] + [f for f in ctx.frontier if f != ctx.incumbent][:2]
        options = []
        inc_solved = _stats(ctx, ctx.incumbent).get("solved", 0.0)
        for pid in parents:
            cand = ctx.archive.get(pid)
            source = cand.source
            done = list(cand.meta.get("components", {}).get("edits", []))
            stats = _stats(ctx, pid)
            base = stats.get("solved", 0.0) - inc_solved
            for edit in edits:
                if edit.key in done or not edit.applies(source):
                    continue
                targets = {t: 1.0 for t in edit.targets}
                opt = _Option("prompt", [pid], None, edit.key, None, edit.new, edit.why, targets)
                opt.source = edit.apply(source)
                opt.genome = {"edits": done + [edit.key]}
                opt.score = base + FIT * _fit(targets, stats) + effects.get(("edit", edit.key), 0.0)
                opt.score += NOVELTY if edit.key not in applied_anywhere else 0.0
                opt.score += rng.uniform(0, JITTER)
                options.append(opt)
        return options

    # ------------------------------------------------------------------ the proposal

    def _proposal(
        self, ctx: ProposalContext, slot: int, opt: _Option, library: DomainLibrary | None
    ) -> Proposal:
        cid = candidate_id(ctx.iteration, slot)
        hypothesis = _hypothesis(ctx, opt)
        summary = _told(opt)[0]
        if opt.change == "prompt":
            return Proposal(
                source=opt.source or "",
                hypothesis=hypothesis,
                parents=opt.parents,
                change="prompt",
                summary=summary,
                components={"edits": opt.genome["edits"]},
                genome=None,
            )
        assert library is not None and opt.genome is not None
        doc = f"Candidate {cid} (offline proposer; parents: {', '.join(opt.parents)}).\n\n" + textwrap.fill(
            f"Hypothesis: {hypothesis}", 100
        )
        return Proposal(
            source=library.render(opt.genome, cid, doc),
            hypothesis=hypothesis,
            parents=opt.parents,
            change=opt.change,
            summary=summary,
            components=library.components(opt.genome),
            genome=opt.genome,
        )


# ---------------------------------------------------------------------------------------- helpers


def _library(ctx: ProposalContext) -> DomainLibrary:
    """The domain's mechanism library (the generic one is written on top of the search's seed)."""
    try:
        domain = get_domain(ctx.domain)
    except KeyError:  # a user's env without a registered domain
        domain = domain_for(ctx.env_id)
    if domain.library:
        return domain.load_library()
    return library_for(domain, ctx.archive.get(ctx.seed_id).source)


def _iteration(cid: str) -> int:
    parsed = parse_candidate_id(cid)
    return parsed[0] if parsed else -1


def _fit(targets: dict[str, float], stats: dict[str, float]) -> float:
    return sum(w * stats.get(signal, 0.0) for signal, w in targets.items())


def _stats(ctx: ProposalContext, cid: str) -> dict[str, float]:
    """The trace statistics of ``cid`` under the current model version (else its latest)."""
    cand = ctx.archive.get(cid)
    record = cand.eval(ctx.model_version)
    if record is None and cand.versions():
        record = cand.eval(cand.versions()[-1])
    return (record or {}).get("stats", {})


def _tried_mechanisms(prior: list[Candidate]) -> set[tuple[str, Any]]:
    tried = set()
    for c in prior:
        genome = c.meta.get("genome")
        if genome:
            tried.update(genome["slots"].items())
    return tried


def _changes(child: Genome, parent: Genome) -> list[tuple[str, Any]]:
    diff = [(s, v) for s, v in child["slots"].items() if parent["slots"].get(s) != v]
    diff += [(k, v) for k, v in child["constants"].items() if parent["constants"].get(k) != v]
    return diff


def _effects(prior: list[Candidate], library: DomainLibrary | None) -> dict[tuple[str, Any], float]:
    """Mean paired gain over the parent, under the same model version, of every single change the
    archive has tried (slot or constant -> value; prompt edits as ("edit", key))."""
    by_id = {c.id: c for c in prior}
    gains: dict[tuple[str, Any], list[float]] = {}
    for c in prior:
        meta = c.meta
        parents = meta.get("parents") or []
        if not parents or parents[0] not in by_id or meta.get("status") != "valid":
            continue
        parent = by_id[parents[0]]
        if meta.get("genome") and parent.meta.get("genome"):
            changes = _changes(meta["genome"], parent.meta["genome"])
        elif "edits" in meta.get("components", {}):
            before = set(parent.meta.get("components", {}).get("edits", []))
            changes = [("edit", k) for k in meta["components"]["edits"] if k not in before]
        else:
            continue
        if len(changes) != 1:
            continue
        for version in c.versions():
            a, b = parent.eval(version), c.eval(version)
            if a and b:
                common = set(a["per_task"]) & set(b["per_task"])
                if common:
                    gain = sum(b["per_task"][t] - a["per_task"][t] for t in common) / len(common)
                    gains.setdefault(changes[0], []).append(gain)
    return {k: sum(v) / len(v) for k, v in gains.items()}


def _fingerprint(cand: Candidate, library: DomainLibrary | None) -> str:
    genome = cand.meta.get("genome")
    if genome and library is not None:
        return "genome:" + key(genome, library)
    return "source:" + cand.meta.get("source_sha256", "")


def _option_fingerprint(opt: _Option, library: DomainLibrary | None) -> str:
    if opt.change == "prompt":
        return "source:" + sha256(opt.source or "")
    assert opt.genome is not None and library is not None
    return "genome:" + key(opt.genome, library)


def _hypothesis(ctx: ProposalContext, opt: _Option) -> str:
    parent = opt.parents[0]
    cand = ctx.archive.get(parent)
    record = cand.eval(ctx.model_version)
    if record:
        top = sorted(record["failures"].items(), key=lambda kv: -kv[1])[:3]
        n = max(1, record["rollouts"])
        failures = ", ".join(f"{k} {100 * v / n:.0f}%" for k, v in top) or "none"
        seen = (
            f"{parent} solves {100 * record['mean']:.1f}% ± {100 * record['se']:.1f} of {record['tasks']} harness "
            f"tasks under model v{ctx.model_version} (failures: {failures}; {record['calls_per_episode']:.1f} LLM "
            f"calls per episode)."
        )
    else:
        seen = f"{parent} has no score under model v{ctx.model_version} yet."
    aims = ", ".join(k for k, _ in sorted(opt.targets.items(), key=lambda kv: -kv[1])) or "the success rate"
    return f"{seen} {_told(opt)[1]} Aimed at: {aims}; expected to raise the success rate."


# How a change is told: (the archive's one-line summary, the hypothesis's sentence), filled from the option.
_TOLD = {
    "prompt": ("prompt edit: {what}", "Prompt edit '{what}': {doc}."),
    "constant": ("{what}: {old} -> {new}", "Constant {what}: {old} -> {new} ({doc})."),
    "memory": (
        "memory: {examples} solved examples",
        "Memory: show up to {examples} examples the model solved under {parent}.",
    ),
    "compose": ("{what}: {old} -> {new}", "Compose: {what} = {new} from {donor} ({doc}) into the incumbent."),
    "mechanism": ("{what}: {old} -> {new}", "Mechanism {what}: {old} -> {new} ({doc})."),
}


def _told(opt: _Option) -> tuple[str, str]:
    fields = {
        "what": opt.what,
        "old": opt.old,
        "new": opt.new,
        "doc": opt.doc,
        "parent": opt.parents[0],
        "donor": opt.parents[1] if len(opt.parents) > 1 else None,
        "examples": len(opt.genome["examples"]) if opt.change == "memory" else None,
    }
    return tuple(text.format(**fields) for text in _TOLD[opt.change])
