"""The on-disk archive of a harness search: one folder per candidate, scores keyed by model version.

Layout (``root`` is the archive folder; nothing else is in it)::

    <candidate>/harness.py          the candidate's source
    <candidate>/meta.json           id, parents, proposer, hypothesis, components, created, status
    <candidate>/evals/<v>.json      its score under model version v: per-task rewards, mean, se, failure
                                    categories, LLM calls, tokens, trace statistics, rollouts spent
    <candidate>/traces/<v>.jsonl    one Trajectory per episode (prompts and completions as text,
                                    token ids dropped, gold answers hidden: ``HIDDEN_INFO``)
    search/settings.json            env, env kwargs, the harness-split task ids, seed, config
    search/iterations/<i>.json      one record per search iteration (candidates, decision, rollouts)
    search/rescores/v<v>.json       one record per re-scoring under a new model version

Writes are atomic: a file is written beside its target and renamed over it; a candidate folder is
assembled in ``.staging/`` and renamed into place, so it appears only complete. A traces file is
written before the eval record that commits it. Opening an archive removes what a killed run left in
``.staging/`` and any stray temporary file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harnesses.loader import HarnessRef, harness_from_source
from whale_train.files import TMP_MARKER, atomic_write_json, atomic_write_text
from whale_train.rollout import Trajectory, read_jsonl

SEARCH_DIR = "search"
STAGING_DIR = ".staging"
ITERATION_ID = re.compile(r"^i(\d{3,})-c(\d+)$")
SAFE_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")

#: ``final_info`` keys that carry the gold answer: hidden in the archive's traces, so no proposer can
#: copy answers of the search split into a harness (scores, diagnostics and the model's own output stay).
HIDDEN_INFO = ("answer", "answers", "gold", "solution", "supporting")


def public_trace(traj: Trajectory) -> dict[str, Any]:
    """A trajectory as a proposer may read it: token ids dropped, gold answers (``HIDDEN_INFO``) hidden."""
    d = traj.to_dict()
    for call in d["calls"]:
        call["prompt_ids"] = call["completion_ids"] = None
    for k in HIDDEN_INFO:
        if k in d["final_info"]:
            d["final_info"][k] = "<hidden>"
    return d


def candidate_id(iteration: int, slot: int) -> str:
    """The id of slot ``slot`` of iteration ``iteration``: the same on every run, so a re-run iteration
    finds what is already on disk."""
    return f"i{iteration:03d}-c{slot}"


def parse_candidate_id(cid: str) -> tuple[int, int] | None:
    """(iteration, slot) of an iteration candidate id; None for the seed."""
    m = ITERATION_ID.match(cid)
    return (int(m.group(1)), int(m.group(2))) if m else None


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Candidate:
    """A view of one candidate folder."""

    id: str
    path: Path

    @property
    def meta(self) -> dict[str, Any]:
        return json.loads((self.path / "meta.json").read_text(encoding="utf-8"))

    @property
    def source(self) -> str:
        return (self.path / "harness.py").read_text(encoding="utf-8")

    def ref(self) -> HarnessRef:
        """The candidate as a runnable (validated, untrusted) harness named by its id."""
        return harness_from_source(self.source, self.id)

    def eval(self, version: int) -> dict[str, Any] | None:
        path = self.path / "evals" / f"{version}.json"
        return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None

    def versions(self) -> list[int]:
        return sorted(int(p.stem) for p in (self.path / "evals").glob("*.json") if p.stem.isdigit())

    def traces(self, version: int) -> list[Trajectory]:
        path = self.path / "traces" / f"{version}.jsonl"
        return read_jsonl(path) if path.exists() else []


class Archive:
    """Read and write one archive folder (see the module docstring). One writer at a time; readers
    (``readonly=True``) may look while it works."""

    def __init__(self, root: str | Path, *, readonly: bool = False):
        self.root = Path(root)
        if readonly:
            if not self.root.is_dir():
                raise FileNotFoundError(f"no archive folder {self.root}")
            return
        self.root.mkdir(parents=True, exist_ok=True)
        self._clean()

    def _clean(self) -> None:
        shutil.rmtree(self.root / STAGING_DIR, ignore_errors=True)
        for tmp in self.root.rglob(f"*{TMP_MARKER}*"):
            if tmp.is_file():
                tmp.unlink(missing_ok=True)

    # ------------------------------------------------------------------ candidates

    def ids(self) -> list[str]:
        """Every candidate id: the seed(s) first, then by (iteration, slot)."""
        ids = [
            p.name
            for p in self.root.iterdir()
            if p.is_dir() and p.name not in (SEARCH_DIR, STAGING_DIR) and (p / "meta.json").exists()
        ]

        def order(cid: str) -> tuple[int, int, str]:
            parsed = parse_candidate_id(cid)
            return (parsed[0], parsed[1], cid) if parsed else (-1, 0, cid)

        return sorted(ids, key=order)

    def __contains__(self, cid: str) -> bool:
        return (self.root / cid / "meta.json").exists()

    def get(self, cid: str) -> Candidate:
        if cid not in self:
            raise KeyError(f"no candidate {cid!r} in {self.root}")
        return Candidate(cid, self.root / cid)

    def candidates(self) -> list[Candidate]:
        return [Candidate(cid, self.root / cid) for cid in self.ids()]

    def add(self, cid: str, source: str, meta: dict[str, Any], status: str = "proposed") -> Candidate:
        """Create candidate ``cid`` (harness.py + meta.json) atomically; it must not exist yet."""
        if not SAFE_ID.match(cid) or cid == SEARCH_DIR:
            raise ValueError(f"bad candidate id {cid!r}")
        target = self.root / cid
        if target.exists():
            raise FileExistsError(f"candidate {cid!r} exists already in {self.root}")
        staging = self.root / STAGING_DIR / f"{cid}-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        (staging / "evals").mkdir(parents=True)
        (staging / "traces").mkdir()
        (staging / "harness.py").write_text(source, encoding="utf-8")
        meta = {"id": cid, "created": now(), "status": status, "source_sha256": sha256(source), **meta}
        (staging / "meta.json").write_text(json.dumps(meta, indent=1, default=str) + "\n", encoding="utf-8")
        os.rename(staging, target)
        try:
            staging.parent.rmdir()
        except OSError:
            pass  # not empty: another candidate is being assembled
        return Candidate(cid, target)

    def update_meta(self, cid: str, **fields: Any) -> dict[str, Any]:
        meta = {**self.get(cid).meta, **fields}
        atomic_write_json(self.root / cid / "meta.json", meta)
        return meta

    def write_eval(
        self, cid: str, version: int, record: dict[str, Any], trajs: list[Trajectory] | None
    ) -> dict[str, Any]:
        """Store a score (and its traces first: the eval record is what commits them)."""
        folder = self.root / cid
        if trajs is not None:
            lines = [json.dumps(public_trace(t), ensure_ascii=False, default=str) for t in trajs]
            atomic_write_text(folder / "traces" / f"{version}.jsonl", "".join(x + "\n" for x in lines))
        atomic_write_json(folder / "evals" / f"{version}.json", record)
        return record

    def evals_at(self, version: int) -> dict[str, dict[str, Any]]:
        """The eval record of every candidate scored under ``version``, by id."""
        out = {}
        for cand in self.candidates():
            rec = cand.eval(version)
            if rec is not None:
                out[cand.id] = rec
        return out

    # ------------------------------------------------------------------ search records

    def settings(self) -> dict[str, Any] | None:
        path = self.root / SEARCH_DIR / "settings.json"
        return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None

    def write_settings(self, settings: dict[str, Any]) -> None:
        atomic_write_json(self.root / SEARCH_DIR / "settings.json", settings)

    def _record_path(self, kind: str, key: int) -> Path:
        if kind == "iteration":
            return self.root / SEARCH_DIR / "iterations" / f"{key:03d}.json"
        if kind == "rescore":
            return self.root / SEARCH_DIR / "rescores" / f"v{key}.json"
        raise ValueError(f"unknown record kind {kind!r}")

    def record(self, kind: str, key: int) -> dict[str, Any] | None:
        path = self._record_path(kind, key)
        return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None

    def write_record(self, kind: str, key: int, record: dict[str, Any]) -> dict[str, Any]:
        """Store an iteration or rescore record; ``seq`` orders all records of the archive."""
        record = {**record, "seq": len(self.records())}
        atomic_write_json(self._record_path(kind, key), record)
        return record

    def records(self) -> list[dict[str, Any]]:
        """Every iteration and rescore record, in the order they were written."""
        recs = []
        for sub in ("iterations", "rescores"):
            for path in (self.root / SEARCH_DIR / sub).glob("*.json"):
                recs.append(json.loads(path.read_text(encoding="utf-8")))
        return sorted(recs, key=lambda r: r["seq"])
