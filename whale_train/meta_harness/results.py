"""What a finished harness search reports (``whale search``'s ``results.json``): the seed and the
incumbent on the search split, what the search cost, the accepted steps, and, when asked, both harnesses
scored on the held-out ``test`` split (stored outside the archive, so no proposer ever reads them)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from whale_envs.sandbox import isolation_label
from whale_train.meta_harness.archive import Archive, atomic_write_json


def search_results(
    search: Any, iterations: int, seconds: float, out: Path, test_limit: int = 0, test_k: int = 1
) -> dict[str, Any]:
    """The results of ``search`` (a ``HarnessSearch`` that ran ``iterations`` in total, ``seconds`` of
    them in this process); with ``test_limit``, the seed and the incumbent scored on the first
    ``test_limit`` test tasks, ``test_k`` samples each (kept in ``out/test``, reused when stored)."""
    from whale_train.evaluation import task_set

    version = int(getattr(search.llm, "version", 0))
    archive = search.archive
    seed_rec = archive.get(search.seed_id).eval(version)
    inc_rec = archive.get(search.incumbent_id).eval(version)
    results: dict[str, Any] = {
        "env": search.env_id,
        "model_version": version,
        "seed": search.seed_id,
        "incumbent": search.incumbent_id,
        "iterations": iterations,
        "rollouts": sum(r.rollouts for r in archive_reports(archive)),
        "check_episodes": sum(r.get("check_episodes", 0) for r in archive.records()),
        "search_seconds_this_run": round(seconds, 1),
        "search_seconds": round(sum(r.get("wall_seconds", 0.0) for r in archive.records()), 1),
        "accepted": [accepted(r) for r in archive.records() if r["accepted"]],
        "search": {"seed": brief(seed_rec), "incumbent": brief(inc_rec)},
        "isolation": isolation_label(),
    }
    if test_limit:
        tests = functools.cache(  # the test split's env built once, and only when a score is not stored
            lambda: task_set(search.env_id, {**search.env_kwargs, "split": "test"}, test_limit)
        )
        results["test"] = {
            name: test_score(search, cid, out / "test", test_limit, test_k, tests)
            for name, cid in (("seed", search.seed_id), ("incumbent", search.incumbent_id))
        }
        # search-split minus test-split success rate: how much of the search score is fitted to the
        # search tasks (the incumbent was picked on them; the seed was not)
        results["gap"] = {
            name: round(results["search"][name]["mean"] - results["test"][name]["mean"], 4)
            for name in ("seed", "incumbent")
            if results["search"][name]
        }
    return results


def archive_reports(archive: Archive) -> list[Any]:
    from whale_train.meta_harness.search import IterationReport

    return [IterationReport.from_dict(r) for r in archive.records()]


def accepted(record: dict[str, Any]) -> dict[str, Any]:
    """A step that changed the incumbent: the winner, the step, and its paired gain over the one it replaced."""
    won = next((c for c in record["candidates"] if c["id"] == record["incumbent"]), {})
    step = f"iteration {record['iteration']}" if record["kind"] == "iteration" else "rescore"
    return {
        "id": record["incumbent"],
        "step": step,
        "replaced": record["incumbent_before"],
        "gain": won.get("gain"),
        "gain_se": won.get("gain_se"),
    }


def brief(rec: dict[str, Any] | None) -> dict[str, Any] | None:
    if rec is None:
        return None
    return {k: rec[k] for k in ("mean", "se", "tasks", "rollouts", "calls_per_episode", "tokens_per_episode")}


def test_score(search: Any, cid: str, folder: Path, limit: int, k: int, tests: Any) -> dict[str, Any]:
    """mean@k of candidate ``cid`` on the first ``limit`` tasks of the ``test`` split (measured, not
    charged); ``tests()`` returns them (a ``whale_train.evaluation.TaskSet``), called only when needed.

    Stored in ``folder`` (outside the archive) and reused when the same candidate and model version
    were scored before.
    """
    from whale_train.evaluation import eval_seed, evaluate

    version = int(getattr(search.llm, "version", 0))
    path = folder / f"{cid}-v{version}-n{limit}-k{k}.json"
    if path.exists():
        return json.loads(path.read_text())
    run = evaluate(
        search.archive.get(cid).ref(),
        search.env_id,
        search.llm,
        [tests()],
        k=k,
        seed=eval_seed(search.config.seed),
        concurrency=search.config.concurrency,
    )
    s = run.summary
    result = {
        "candidate": cid,
        "model_version": version,
        "k": k,
        "tasks": s["tasks"],
        "mean": s["mean"],
        "se": s["se"],
        "failures": s["failures"],
        "wall_seconds": round(run.wall_seconds, 1),
    }
    run.write_traces(path.with_suffix(".traces.jsonl"))
    atomic_write_json(path, result)
    return result
