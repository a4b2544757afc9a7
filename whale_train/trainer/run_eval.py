"""The run's test evaluations (a part of :class:`whale_train.trainer.Run`): mean@k of each (model version,
harness) pair on the test sets, once per pair, written to ``eval/`` and recorded in the ledger; the
selection score on the harness split beside it; and the key under which an evaluation cache shares them
with other runs (``whale_train.eval_cache``). Measured, never charged to the rollout budget."""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
from pathlib import Path
from typing import Any

from whale_train.eval_cache import EvalCache, evaluation_key, weights_digest
from whale_train.evaluation import EvalResult, TaskSet, eval_seed, evaluate, select_seed, task_set
from whale_train.files import atomic_write_text
from whale_train.rsft import check_model
from whale_train.trainer.interrupt import stop_if_interrupted
from whale_train.trainer.part import RunPart
from whale_train.trainer.test_sets import eval_task_sets


class RunEvaluation(RunPart):
    """The evaluations of a run. It records each in the ledger with the run's ``_ledger``."""

    progress: Any  # progress(description, total) -> a context manager yielding advance(); None: none shown
    eval_cache: EvalCache | None
    evaluated: set[str]  # the (model version, harness) keys evaluated so far

    def evaluate(self) -> dict[str, Any] | None:
        """mean@k of the current (model version, harness) on the test split, once per pair."""
        version = int(getattr(self.llm, "version", 0))
        key = f"v{version}_{self.harness.name.replace('/', '_')}"
        if key in self.evaluated:
            return None
        e = self.config.eval
        out = self.dir / "eval"
        out.mkdir(exist_ok=True)
        cache_key = self._eval_cache_key([tasks.ids for tasks in self.test_sets])
        hit = self.eval_cache.get(cache_key) if cache_key else None
        if hit is None:
            result = self._evaluate(version, out / f"{key}.traces.jsonl")
            if cache_key:
                self.eval_cache.put(cache_key, result, out / f"{key}.traces.jsonl")
        else:  # the same weights, harness, tasks and seeds, scored by another run (or an earlier session)
            result, traces = hit
            shutil.copyfile(traces, out / f"{key}.traces.jsonl")
        result.update(model_version=version, harness=self.harness.name)
        atomic_write_text(out / f"{key}.json", json.dumps(result, indent=1, default=str))
        self.evaluated.add(key)
        self._ledger(
            {
                "event": "eval",
                **{k: result[k] for k in ("model_version", "harness", "mean", "se", "k", "tasks")},
                **{k: result[k] for k in ("select_mean", "select_se") if k in result},
                **(
                    {"by_data_source": {n: d["mean"] for n, d in result["by_data_source"].items()}}
                    if result.get("by_data_source")
                    else {}
                ),
                **({"cached": True} if hit else {}),
            }
        )
        self.log(
            f"  test mean@{e.k} = {100 * result['mean']:.1f}% ± {100 * result['se']:.1f} (model v{version}, "
            f"{self.harness_label}{', cached' if hit else ''})"
        )
        if result.get("by_data_source"):
            self.log(
                "    "
                + ", ".join(f"{name} {100 * d['mean']:.1f}%" for name, d in result["by_data_source"].items())
            )
        for name, err in result["errors"].items():
            self.log(
                f"  {name} in {err['episodes']} of {result['episodes']} test episodes; first: {err['first'][:200]}"
            )
        return result

    def _eval_cache_key(self, ids: list[list[str]]) -> str | None:
        """The evaluation cache's key for the current (weights, harness) on ``ids``; None without a cache or
        when the backend's weights cannot be digested (see :mod:`whale_train.eval_cache`)."""
        if self.eval_cache is None:
            return None
        digest = weights_digest(self.llm)
        if digest is None:
            return None
        e, seed = self.config.eval, self.config.seed
        return evaluation_key(
            digest,
            self.harness,
            env=self.config.env,
            # the run's own test split keeps the key it always had; separate test sets are named whole
            **(
                {
                    "env_kwargs": self.config.env_kwargs,
                    "split": self.config.eval_sets[0]["split"],
                    "ids": ids[0],
                }
                if e.tasks is None
                else {"eval_sets": self.config.eval_sets, "ids": ids}
            ),
            k=e.k,
            seed=eval_seed(seed),
            concurrency=self.config.concurrency,
            select=[e.select_limit, e.select_k, select_seed(seed)] if e.select_limit else None,
        )

    @functools.cached_property
    def test_sets(self) -> list[TaskSet]:
        """The test sets (``eval_task_sets``), their envs built once per process."""
        return eval_task_sets(self.config)

    @functools.cached_property
    def select_set(self) -> TaskSet:
        """The first ``eval.select_limit`` tasks of the harness split: the selection score's."""
        kwargs = {"split": "harness", **self.config.env_kwargs}
        return task_set(self.config.env, kwargs, self.config.eval.select_limit)

    def _evaluate(self, version: int, traces: Path) -> dict[str, Any]:
        """Run the evaluation of the current (model, harness) on the test sets; write its traces to
        ``traces``."""
        e = self.config.eval
        show = self.progress or _no_progress
        total = sum(len(tasks.ids) for tasks in self.test_sets) * e.k
        with show(f"test mean@{e.k}: {self.harness_label}, model v{version}", total) as advance:
            run = self._scored(self.test_sets, e.k, eval_seed(self.config.seed), lambda _t: advance())
        check_model(run.trajectories, f"the evaluation of model v{version}")
        s = run.summary
        result = {
            k: s[k] for k in ("mean", "se", "pass_at_k", "tasks", "episodes", "failures", "by_difficulty")
        }
        result.update(
            k=e.k,
            split=self.config.eval_sets[0]["split"],
            by_data_source=s["by_data_source"],
            errors=run.errors,  # failures in sight: the first message of each kind
        )
        if e.select_limit:
            result.update(self._select_score(version))
        run.write_traces(traces)
        return result

    def _select_score(self, version: int) -> dict[str, Any]:
        """mean@select_k on the first ``select_limit`` tasks of the harness split (its own sample seed): what
        a selection rule may look at instead of the test split."""
        run = self._scored([self.select_set], self.config.eval.select_k, select_seed(self.config.seed))
        check_model(run.trajectories, f"the selection score of model v{version}")
        s = run.summary
        return {"select_mean": s["mean"], "select_se": s["se"], "select_tasks": s["tasks"]}

    def _scored(self, task_sets: list[TaskSet], k: int, seed: int, progress=None) -> EvalResult:
        """The current (model, harness) evaluated on ``task_sets`` at the run's concurrency (a shipped
        harness in this process); an interrupted evaluation is not kept."""
        run = evaluate(
            self.harness,
            self.config.env,
            self.llm,
            task_sets,
            k=k,
            seed=seed,
            concurrency=self.config.concurrency,
            trusted=self.harness.shipped,
            progress=progress,
        )
        stop_if_interrupted()
        return run


@contextlib.contextmanager
def _no_progress(_description: str, _total: int):
    yield lambda: None
