"""``HarnessSearch``: the harness phase of WHALE (Meta-Harness search over an on-disk archive).

One **iteration**: the proposer writes M candidates -> each is validated (AST rules, the prompt-only
rule when asked, ``check_harness``: its weight-free stand-ins when proposed, the real model's part when
scored) -> each valid one is scored on the search's
``harness``-split tasks under the current model version -> the frontier is updated -> a candidate
replaces the incumbent only if the acceptance rule says it beats it on the same tasks by more than
noise. A **rescore** scores the incumbent (and the frontier) under a new model version; it may also
hand the incumbent's place to a frontier member that now beats it.

An iteration has two parts that can run apart (``whale train`` with ``schedule.overlap``): ``propose``
(the proposer's work: it reads the archive and the traces of one model version and writes candidates; no
model rollouts of its own but the agent's tries; the weight-free part of each candidate's check) and ``score`` (the rollouts: the candidates, and the
incumbent re-scored when the model version is new, all under one pinned version on the same tasks, then
the acceptance rule). ``iterate`` is the one followed by the other at one version. Each candidate records
the version its proposer's traces came from (``traces_version``) and each iteration the version it was
scored under and the gap between the two.

Every step is idempotent and resumable: candidate ids depend only on (iteration, slot); a candidate,
its validation and each of its scores are written atomically; an iteration or rescore is complete once
its record is written. Calling ``iterate``/``rescore`` again for a completed step returns its stored
report. Rollouts are charged to the step that asked for them (``origin`` in each eval record), so a
killed and resumed step reports the same count as an uninterrupted one.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym

from harnesses.loader import HarnessRef, load_harness
from whale_envs.sandbox import IsolationUnavailable
from whale_train.domains import domain_for
from whale_train.meta_harness import evaluate
from whale_train.meta_harness.acceptance import AcceptanceRule, PairedGain, frontier, rank_key
from whale_train.meta_harness.archive import (
    SAFE_ID,
    SEARCH_DIR,
    Archive,
    candidate_id,
    now,
    parse_candidate_id,
)
from whale_train.meta_harness.config import MetaHarnessConfig
from whale_train.meta_harness.library import SeedLibrary, library_for
from whale_train.meta_harness.proposer import Proposal, ProposalContext, Proposer, ProposerError
from whale_train.meta_harness.reports import CandidateResult, IterationReport, Proposed
from whale_train.null_llms import Likeness

logger = logging.getLogger("whale.meta_harness")


class HarnessSearch:
    """The harness search over one archive folder.

    Args:
        config: the search settings (``MetaHarnessConfig``).
        archive_dir: the archive folder (created, or resumed when it holds a search already).
        llm: the model candidates are scored with (``llm.version`` is its model version).
        env_id: any env with a domain (``whale_train.domains.domain_for``): a built-in one, or a
            user's ``module:EnvId``.
        env_kwargs: extra ``gym.make`` options (e.g. ``{"tasks": "lichess"}``); the split is set here.
        seed_harness: the first incumbent (default: the domain's base harness).
        proposer: a ``Proposer`` (default: from ``config.proposer``).
        rule: an ``AcceptanceRule`` (default: ``PairedGain(config.accept_z, config.accept_min_gain)``).
        log: called with one line per event (default: the ``whale.meta_harness`` logger).
        scored_sources: env options of test sets that are separate sources (``eval.tasks``): each
            candidate's null-model check runs there too, and only its verdict reaches the archive.
    """

    def __init__(
        self,
        config: MetaHarnessConfig,
        archive_dir: str | Path,
        llm: Any,
        env_id: str,
        env_kwargs: dict[str, Any] | None = None,
        *,
        seed_harness: HarnessRef | None = None,
        proposer: Proposer | None = None,
        rule: AcceptanceRule | None = None,
        log: Callable[[str], None] | None = None,
        scored_sources: list[dict[str, Any]] | None = None,
    ):
        spec = domain_for(env_id)  # ValueError for an unknown env
        config = config.seeded(0)  # an unset seed is 0 (whale train sets the run's)
        config.validate()
        self.config = config
        self.llm = llm
        # what the weight-free part of a candidate's check copies of the model, taken here (the trainer's
        # thread) since it runs on the proposer's lane while the model trains
        self.likeness = Likeness(llm) if llm is not None else None
        self.env_id = env_id
        self.env_kwargs = {k: v for k, v in (env_kwargs or {}).items() if k != "split"}
        self.scored_sources = list(scored_sources or [])
        self.domain = spec.name
        self.archive = Archive(archive_dir)
        self.rule = rule or PairedGain(config.accept_z, config.accept_min_gain)
        self.proposer = proposer or make_proposer(config, self.env_kwargs)
        self.log = log or logger.info
        settings = self.archive.settings()
        if settings is None:
            if seed_harness is None and spec.base_harness is None:
                raise ValueError(f"{env_id} has no base harness in its domain: give the seed harness")
            seed_harness = seed_harness or load_harness(spec.base_harness)
            settings = self._start(seed_harness, spec.base_harness)
        elif settings["env_id"] != env_id or settings["env_kwargs"] != self.env_kwargs:
            raise ValueError(
                f"{self.archive.root} holds a search on {settings['env_id']} {settings['env_kwargs']}, "
                f"not {env_id} {self.env_kwargs}"
            )
        elif settings["seed"] != config.seed or settings["harness_tasks"] != config.harness_tasks:
            raise ValueError(
                f"{self.archive.root} was started with another seed or harness_tasks: resume with the same"
            )
        self.task_ids: list[str] = settings["task_ids"]
        self.seed_id: str = settings["seed_id"]

    def _start(self, seed: HarnessRef, base_harness: str | None) -> dict[str, Any]:
        env = gym.make(self.env_id, split="harness", **self.env_kwargs).unwrapped
        ids = list(env.task_ids)
        rng = random.Random(f"tasks/{self.config.seed}")
        task_ids = sorted(rng.sample(ids, min(self.config.harness_tasks, len(ids))))
        seed_id = Path(seed.name).stem  # math/h0 -> h0, a user's file my_env/h0.py -> h0
        if not SAFE_ID.match(seed_id) or parse_candidate_id(seed_id) or seed_id == SEARCH_DIR:
            seed_id = "seed"
        library = library_for(domain_for(self.env_id), seed.source)
        # a domain library's h0 genome is its shipped base harness; the generic library's is the seed itself
        is_base = isinstance(library, SeedLibrary) or (seed.shipped and seed.name == base_harness)
        genome = library.h0 if is_base else None
        if seed_id not in self.archive:
            self.archive.add(
                seed_id,
                seed.source,
                {
                    "parents": [],
                    "proposer": "seed",
                    "change": "seed",
                    "summary": f"seed ({seed.name})",
                    "hypothesis": f"the seed harness {seed.name}",
                    "components": library.components(genome) if genome else {},
                    "genome": genome,
                    "seed_of": seed.name,
                    "iteration": None,
                    "slot": None,
                },
                status="valid",
            )
        settings = {
            "env_id": self.env_id,
            "env_kwargs": self.env_kwargs,
            "domain": self.domain,
            "seed": self.config.seed,
            "harness_tasks": self.config.harness_tasks,
            "task_ids": task_ids,
            "seed_id": seed_id,
            "seed_harness": seed.name,
            "config": self.config.to_dict(),
            "created": now(),
        }
        self.archive.write_settings(settings)
        return settings

    # ------------------------------------------------------------------ where the search stands

    def _last(self) -> dict[str, Any] | None:
        records = self.archive.records()
        return records[-1] if records else None

    @property
    def incumbent_id(self) -> str:
        last = self._last()
        return last["incumbent"] if last else self.seed_id

    @property
    def incumbent(self) -> HarnessRef:
        """The current incumbent, runnable (untrusted) and named by its archive id."""
        return self.archive.get(self.incumbent_id).ref()

    @property
    def next_iteration(self) -> int:
        done = [r["iteration"] for r in self.archive.records() if r["kind"] == "iteration"]
        return max(done) + 1 if done else 1

    def frontier(self, model_version: int | None = None) -> list[str]:
        """The best candidates scored under ``model_version`` (default: the model's), best first."""
        version = self._version(model_version)
        return frontier(self.archive.evals_at(version), self.config.frontier_size)

    def _version(self, model_version: int | None) -> int:
        have = int(getattr(self.llm, "version", 0))
        if model_version is not None and int(model_version) != have:
            raise ValueError(f"model_version {model_version} given, but the LLM is at version {have}")
        return have

    # ------------------------------------------------------------------ rescore

    def rescore(
        self, model_version: int | None = None, *, _by_iteration: int | None = None
    ) -> IterationReport:
        """Score the incumbent (and, with ``rescore_frontier``, the last frontier) under this model version.

        Idempotent: a version already re-scored returns its stored report.
        """
        version = self._version(model_version)
        stored = self.archive.record("rescore", version)
        if stored:
            return IterationReport.from_dict(stored)
        start = time.monotonic()
        last = self._last()
        incumbent = self.incumbent_id
        members = [incumbent]
        if self.config.rescore_frontier and last:
            members += [c for c in last["frontier"] if c != incumbent]
        origin = {"kind": "rescore", "model_version": version}
        results = []
        for cid in members:
            results.append(self._scored_result(cid, version, origin))
        challengers = [r for r in results if r.id != incumbent]
        return self._finish(
            origin, version, incumbent, results, challengers, start, triggered_by=_by_iteration
        )

    # ------------------------------------------------------------------ iterate

    def iterate(self, model_version: int | None = None, iteration: int | None = None) -> IterationReport:
        """One search iteration (the next one by default): ``propose`` then ``score`` under one model
        version. Idempotent for a completed iteration."""
        version = self._version(model_version)
        iteration = self.next_iteration if iteration is None else iteration
        stored = self.archive.record("iteration", iteration)
        if stored:
            return IterationReport.from_dict(stored)
        if iteration != self.next_iteration:
            raise ValueError(f"iteration {iteration} cannot run now: the next one is {self.next_iteration}")
        start = time.monotonic()
        if self.archive.record("rescore", version) is None:  # a new model version: re-score first
            self.rescore(version, _by_iteration=iteration)
        proposed = self.propose(version, iteration)
        return self._score(proposed, version, start)

    def propose(self, traces_version: int, iteration: int | None = None, *, llm: Any = None) -> Proposed:
        """The proposer's part of iteration ``iteration`` (default: the next): it reads the archive, with
        the scores and traces of model version ``traces_version``, and writes the candidates of the slots
        the archive does not hold yet. No scoring: this is what a proposer lane runs while the model trains
        (``traces_version`` is then not checked against the model's version, which may move on). ``llm`` is
        the model the agent proposer's tries roll out with (default: the search's)."""
        iteration = self.next_iteration if iteration is None else iteration
        stored = self.archive.record("iteration", iteration)
        if stored:  # scored already (a resumed run asks again): what its proposer did then
            return Proposed(
                iteration,
                int(stored.get("traces_version", traces_version)),
                stored.get("proposer_usage") or {},
                stored.get("proposer_error"),
            )
        if iteration != self.next_iteration:
            raise ValueError(
                f"iteration {iteration} cannot be proposed now: the next one is {self.next_iteration}"
            )
        usage, error = self._propose(iteration, int(traces_version), self.incumbent_id, llm)
        return Proposed(iteration, int(traces_version), usage, error)

    def score(self, proposed: Proposed, model_version: int | None = None) -> IterationReport:
        """The rollouts of a proposed iteration, pinned to ``model_version`` (the model's version now; the
        caller pushes no weights until it returns): the incumbent is re-scored first when this version
        is new (charged to the iteration), then each candidate is validated and scored on the same tasks
        with the same sample seeds, and the acceptance rule compares them. Idempotent once complete."""
        version = self._version(model_version)
        stored = self.archive.record("iteration", proposed.iteration)
        if stored:
            return IterationReport.from_dict(stored)
        if proposed.iteration != self.next_iteration:
            raise ValueError(
                f"iteration {proposed.iteration} cannot be scored now: the next one is {self.next_iteration}"
            )
        start = time.monotonic()
        if self.archive.record("rescore", version) is None:  # weights moved on while it was proposed
            self.rescore(version, _by_iteration=proposed.iteration)
        return self._score(proposed, version, start)

    def _score(self, proposed: Proposed, version: int, start: float) -> IterationReport:
        iteration = proposed.iteration
        rescore = self.archive.record("rescore", version)
        rescore_rollouts = rescore["rollouts"] if rescore.get("triggered_by") == iteration else 0
        incumbent = self.incumbent_id
        origin = {"kind": "iteration", "iteration": iteration}
        results = []
        for slot in range(self.config.candidates):
            cid = candidate_id(iteration, slot)
            if cid not in self.archive:
                continue
            results.append(self._validated_scored(cid, version, origin))
        challengers = [r for r in results if r.status == "valid"]
        return self._finish(
            origin,
            version,
            incumbent,
            results,
            challengers,
            start,
            extra_rollouts=rescore_rollouts,
            check_episodes=sum(r.check_episodes for r in results),
            proposer_usage=proposed.usage,
            proposer_error=proposed.error,
            proposer_rollouts=int(proposed.usage.get("try_rollouts", 0)),
            rescore_rollouts=rescore_rollouts,
            traces_version=proposed.traces_version,
            version_gap=version - proposed.traces_version,
        )

    def _finish(
        self,
        origin: dict[str, Any],
        version: int,
        incumbent: str,
        results: list[CandidateResult],
        challengers: list[CandidateResult],
        start: float,
        extra_rollouts: int = 0,
        **fields: Any,
    ) -> IterationReport:
        """Decide, record the step (which completes it) and log the verdict. ``origin`` (the step's
        kind and iteration) is also what its rollouts were charged under."""
        kind, iteration = origin["kind"], origin.get("iteration")
        accepted, reason, winner = self._decide(incumbent, challengers, version)
        report = IterationReport(
            kind=kind,
            iteration=iteration,
            model_version=version,
            candidates=results,
            incumbent_before=incumbent,
            incumbent=winner,
            accepted=accepted,
            reason=reason,
            rule=self._rule_text(),
            rollouts=self._charged(origin) + extra_rollouts,
            check_episodes=fields.pop("check_episodes", 0),
            frontier=self.frontier(version),
            wall_seconds=round(time.monotonic() - start, 2),
            created=now(),
            **fields,
        )
        record = self.archive.write_record(
            kind, iteration if kind == "iteration" else version, report.to_dict()
        )
        report.seq = record["seq"]
        head = f"iteration {iteration} (model v{version})" if kind == "iteration" else f"rescore v{version}"
        self.log(f"{head}: {report.reason} ({report.rollouts} rollouts)")
        return report

    def run(self, iterations: int, model_version: int | None = None) -> list[IterationReport]:
        """Rescore under the model's version if needed, then iterate until ``iterations`` are done."""
        reports = [self.rescore(model_version)]
        while self.next_iteration <= iterations:
            reports.append(self.iterate(model_version))
        return reports

    # ------------------------------------------------------------------ the parts of a step

    def _propose(
        self, iteration: int, version: int, incumbent: str, llm: Any = None
    ) -> tuple[dict[str, Any], str | None]:
        missing = [s for s in range(self.config.candidates) if candidate_id(iteration, s) not in self.archive]
        if not missing:
            return self._usage_of(iteration), None
        last = self._last()
        ctx = ProposalContext(
            archive=self.archive,
            domain=self.domain,
            env_id=self.env_id,
            iteration=iteration,
            slots=missing,
            model_version=version,
            incumbent=incumbent,
            frontier=list(last["frontier"]) if last else [incumbent],
            seed=self.config.seed,
            seed_id=self.seed_id,
            prompt_only=self.config.prompt_only,
            llm=self.llm if llm is None else llm,
        )
        error = None
        try:
            proposals = self.proposer.propose(ctx)
        except ProposerError as exc:
            proposals, error = [], str(exc)
            self.log(f"iteration {iteration}: the proposer failed: {exc}")
        for slot, proposal in zip(missing, proposals, strict=False):
            self._add(iteration, slot, proposal, version)
        for slot in range(self.config.candidates):
            if candidate_id(iteration, slot) in self.archive:
                self._prechecked(candidate_id(iteration, slot))
        return self._usage_of(iteration), error

    def _add(self, iteration: int, slot: int, p: Proposal, traces_version: int) -> None:
        cid = candidate_id(iteration, slot)
        self.archive.add(
            cid,
            p.source,
            {
                "parents": p.parents,
                "proposer": self.proposer.name,
                "change": p.change,
                "summary": p.summary,
                "hypothesis": p.hypothesis,
                "components": p.components,
                "genome": p.genome,
                "proposer_usage": p.usage,
                "iteration": iteration,
                "slot": slot,
                "traces_version": traces_version,
            },
        )
        self.log(f"  proposed {cid} ({p.summary or p.change}; parents {', '.join(p.parents)})")

    def _usage_of(self, iteration: int) -> dict[str, Any]:
        total: dict[str, Any] = {}
        for slot in range(self.config.candidates):
            cid = candidate_id(iteration, slot)
            if cid in self.archive:
                for k, v in (self.archive.get(cid).meta.get("proposer_usage") or {}).items():
                    if isinstance(v, int | float):
                        total[k] = total.get(k, 0) + v
        return total

    def _prechecked(self, cid: str) -> dict[str, Any]:
        """The weight-free part of a proposed candidate's check (AST rules, prompt-only rule, the
        stand-ins that copy only what the model shows of itself), run once, by the proposer: it needs no
        weights, so with overlap it runs on the proposer's lane while the model trains. A failure makes
        the candidate invalid now; a pass is kept in its meta (``precheck``) for the real model's part,
        run when it is scored. Returns the candidate's meta."""
        meta = self.archive.get(cid).meta
        if meta["status"] != "proposed" or "precheck" in meta:
            return meta
        v = self._validation(cid, self.likeness, "weight-free")
        if not v.ok:
            self.log(f"  {cid}: {v.reason}")
            return self.archive.update_meta(cid, **v.to_meta())
        return self.archive.update_meta(cid, precheck={"check": v.check, "check_episodes": v.check_episodes})

    def _validation(self, cid: str, llm: Any, stand_ins: str) -> evaluate.Validation:
        seed_source = self.archive.get(self.seed_id).source if self.config.prompt_only else None
        return evaluate.validate(
            self.archive.get(cid).source,
            cid,
            self.env_id,
            self.env_kwargs,
            self.config,
            seed_source,
            llm=llm,
            score_tasks=self.task_ids,
            scored_sources=self.scored_sources,
            stand_ins=stand_ins,
        )

    def _validated_scored(self, cid: str, version: int, origin: dict[str, Any]) -> CandidateResult:
        meta = self._prechecked(cid)  # run here if the proposer's part did not (a run resumed in between)
        if meta["status"] == "proposed":  # the real model's part, under the weights it is scored with
            pre = meta["precheck"]
            first = evaluate.Validation(True, None, pre["check"], pre["check_episodes"])
            v = evaluate.joined(first, self._validation(cid, self.llm, "real-model"))
            meta = self.archive.update_meta(cid, **v.to_meta())
            self.log(f"  {cid}: {'valid' if v.ok else v.reason}")
        if meta["status"] != "valid":
            return self.result(cid, version)
        return self._scored_result(cid, version, origin)

    def _scored_result(self, cid: str, version: int, origin: dict[str, Any]) -> CandidateResult:
        cand = self.archive.get(cid)
        if cand.eval(version) is None:
            try:
                record, trajs = evaluate.score(
                    cand.ref(), self.env_id, self.llm, self.task_ids, self.env_kwargs, self.config, origin
                )
            except IsolationUnavailable:
                raise  # not the candidate's fault: the search stops with the cause and the opt-in
            except Exception as exc:  # noqa: BLE001 - one candidate never ends the search
                reason = f"scoring failed: {type(exc).__name__}: {exc}"[:2000]
                self.archive.update_meta(cid, status="invalid", reason=reason)
                self.log(f"  {cid}: {reason}")
                return self.result(cid, version)
            record["model_version"] = version
            self.archive.write_eval(cid, version, record, trajs)
            self.log(
                f"  {cid} under model v{version}: {100 * record['mean']:.1f}% ± {100 * record['se']:.1f} "
                f"({record['rollouts']} rollouts, {record['wall_seconds']:.0f} s)"
            )
        return self.result(cid, version)

    def result(self, cid: str, version: int) -> CandidateResult:
        """Candidate ``cid`` as the archive holds it, with its score under ``version`` if it has one (no
        rollouts: what the trainer's lanes record of a pairing already scored)."""
        meta = self.archive.get(cid).meta
        rec = self.archive.get(cid).eval(version)
        return CandidateResult(
            id=cid,
            parents=meta.get("parents") or [],
            proposer=meta.get("proposer", ""),
            change=meta.get("change", ""),
            hypothesis=meta.get("hypothesis", ""),
            status=meta.get("status", ""),
            reason=meta.get("reason"),
            mean=rec["mean"] if rec else None,
            se=rec["se"] if rec else None,
            calls_per_episode=rec["calls_per_episode"] if rec else None,
            tokens_per_episode=rec["tokens_per_episode"] if rec else None,
            rollouts=rec["rollouts"] if rec else 0,
            check_episodes=int(meta.get("check_episodes") or 0),
            traces_version=meta.get("traces_version"),
        )

    def _decide(
        self, incumbent: str, challengers: list[CandidateResult], version: int
    ) -> tuple[bool, str, str]:
        """Test every scored challenger against the incumbent; the best-ranked one that passes wins."""
        inc = self.archive.get(incumbent).eval(version)
        if inc is None or not challengers:
            return False, "no scored challenger", incumbent
        passing = []
        for r in challengers:
            rec = self.archive.get(r.id).eval(version)
            if rec is None:
                continue
            d = self.rule.decide(inc, rec)
            r.decision = d.reason
            r.gain, r.gain_se = d.numbers.get("gain"), d.numbers.get("se")
            if d.accept:
                passing.append((rank_key(r.id, rec), r, d))
        if not passing:
            best = max((r for r in challengers if r.gain is not None), key=lambda r: r.gain, default=None)
            why = f"{best.id} {best.decision}" if best else "no scored challenger"
            return False, f"kept {incumbent}: {why}", incumbent
        _, r, d = min(passing, key=lambda x: x[0])
        return True, f"accepted {r.id}: {d.reason}", r.id

    def _charged(self, origin: dict[str, Any]) -> int:
        total = 0
        for cand in self.archive.candidates():
            for v in cand.versions():
                rec = cand.eval(v)
                if rec and rec.get("origin") == origin:
                    total += int(rec["rollouts"])
        return total

    def _rule_text(self) -> str:
        describe = getattr(self.rule, "describe", None)
        return describe() if describe else type(self.rule).__name__


def make_proposer(config: MetaHarnessConfig, env_kwargs: dict[str, Any] | None = None) -> Proposer:
    """The proposer ``config.proposer`` names."""
    if config.proposer == "llm":
        from whale_train.meta_harness.llm_proposer import LLMProposer

        return LLMProposer.from_config(config, env_kwargs)
    if config.proposer == "agent":
        from whale_train.meta_harness.agent_proposer import AgentProposer

        return AgentProposer.from_config(config, env_kwargs)
    if config.proposer == "claude-code":
        from whale_train.meta_harness.claude_code import ClaudeCodeProposer

        return ClaudeCodeProposer.from_config(config, env_kwargs)
    from whale_train.meta_harness.offline import OfflineProposer

    return OfflineProposer()
