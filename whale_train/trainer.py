"""The WHALE trainer: alternate the weight operator (RSFT) and the harness operator (Meta-Harness
search) under a schedule policy, on one rollout ledger, with test evaluation, checkpoints and resume.

    whale train configs/math/whale.yaml [--set rsft.learning_rate=5e-5 ...] [--out runs/NAME] [--resume]

The run directory::

    config.yaml       the resolved config
    ledger.jsonl      one line per event: every unit (RSFT step / harness iteration) with the rollouts it
                      spent and its signals, every phase switch with its reason, every test evaluation
    state.json        where the run stands (written atomically after each unit): what --resume reads
    splits.json       the split key's fingerprint (whale_envs.splits; never the secret); after the run,
                      the ids of every test set
    trusted_state.log what ``--resume --trust-state`` unpickled in full (only when it was asked for)
    checkpoints/<v>/  model versions (save_pretrained + optimizer state)
    archive/          the harness archive (candidates, scores and traces per model version)
    eval/             test mean@k per (model version, harness)
    tb/               TensorBoard event files (``report_to``; wandb/ and trackio/ when those are asked for)
    report.md, plots/ written by ``whale report``
    .train.lock       held (``flock``) by the one ``whale train`` writing the directory; a second one is
                      refused, naming the first one's pid

Resume: a unit is the grain of work. A run killed at any point restarts the unit it was in, from the
last saved state (model weights, optimizer, task stream, archive, ledger length); rollouts are seeded
by unit, so the rerun is identical and nothing is counted twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from harnesses.loader import HarnessRef, load_harness
from whale_envs import MATH_ID, splits
from whale_envs.sandbox import isolation_label
from whale_envs.tasks import check_split
from whale_train import distributed
from whale_train.config_io import Config, option
from whale_train.domains import domain_for
from whale_train.evaluation import EvalResult, TaskSet, eval_seed, evaluate, select_seed, task_set
from whale_train.files import atomic_write_text, hold_folder, release_folder
from whale_train.meta_harness.config import MetaHarnessConfig
from whale_train.rsft import RSFT, RSFTConfig, check_model
from whale_train.schedule import METHODS, RunState, ScheduleConfig, ScheduleDecision, make_schedule
from whale_train.tracking import Tracker, event_metrics, parse_report_to

#: The lock file of a run directory: one ``whale train`` writes it at a time.
RUN_LOCK = ".train.lock"

# ------------------------------------------------------------------------------------------ config


@dataclass
class EvalConfig(Config):
    """Test evaluation (measured, never charged to the ledger)."""

    k: int = option(8, "samples per task (mean@k)")
    limit: int = option(200, "tasks of the split to use, per test set (0 = all)")
    tasks: str | list[str] | None = option(
        None,
        "separate test set(s) of the run's env, task source spec(s): the paper's test files (aime:aime2024.parquet "
        "or a list of specs; searchr1:test.parquet) scored at every evaluation, results per data_source; default: "
        "the run's own tasks",
    )
    split: str | None = option(
        None, "the split scored: default test of the run's tasks (held out by hash), all of eval.tasks"
    )
    every: str | int = option(
        "phase",
        "phase (after every phase and at the end), unit (after every unit: slow), or a number of rollouts N "
        "(at the start, after the unit that crosses each multiple of N, and at the end, never at a phase end: "
        "every method of a budget then gets the same evaluations, whatever its phases)",
    )
    select_limit: int = option(
        0,
        "tasks of the harness split also scored at every evaluation (0 = none), so that a rule can pick a "
        "run's model and harness without looking at the test split (whale compare's 'selected' number); "
        "recorded as select_mean / select_se of the eval event",
    )
    select_k: int = option(1, "samples per task of that harness-split score")


@dataclass
class TrainConfig(Config):
    """A training run. Every field can be set from YAML or with ``--set key=value`` (dotted for nested);
    ``whale train --fields`` lists them with their help."""

    name: str = option("run", "the run's name (the default run directory is runs/<name>)")
    method: str = option("whale", f"one of {', '.join(METHODS)}")
    env: str = option(MATH_ID, "a registered env id (module:EnvId for a user's env)")
    tasks: str | None = option(None, "the env's task source spec (default: its generator)")
    env_options: dict[str, Any] = option(
        factory=dict,
        help="keyword arguments of the env (verifier: dapo, judge_mode, retriever, format_retries, max_turns)",
    )
    harness: str | None = option(
        None, "the seed harness (default: the domain's base harness; a user's env must name its h0 file)"
    )
    model: str | None = option(None, "model directory or id (default: the shipped tiny model)")
    backend: str = option("transformers", "transformers, vllm (in-process engine) or openai (servers)")
    base_url: str | None = option(None, "server URL(s) for backend openai, comma-separated")
    backend_options: dict[str, Any] = option(
        factory=dict,
        help="keyword arguments of the backend (vllm: engine arguments such as gpu_memory_utilization)",
    )
    tensor_parallel_size: int = option(1, "vllm in-process engine: GPUs per copy of the model")
    data_parallel_size: int = option(
        1,
        "copies of the model: vllm serve replicas (backend openai with several base_url and "
        "backend_options.weight_sync, docs/SCALING.md)",
    )
    seed: int = option(0, "seeds the task stream, the rollouts, training and (unless search.seed) the search")
    budget_rollouts: int = option(20_000, "the rollout budget the run spends (harness and weight phases)")
    schedule: ScheduleConfig = option(factory=ScheduleConfig, help="when to switch phases")
    rsft: RSFTConfig = option(factory=RSFTConfig, help="the weight operator")
    search: MetaHarnessConfig = option(factory=MetaHarnessConfig, help="the harness operator")
    eval: EvalConfig = option(factory=EvalConfig, help="test evaluation")
    concurrency: int = option(128, "episodes in flight")
    report_to: Any = option(
        "tensorboard", "experiment trackers: none, tensorboard, wandb (offline), trackio (local), or a list"
    )

    def validate(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; known: {', '.join(METHODS)}")
        if self.harness is None and domain_for(self.env).base_harness is None:  # ValueError: unknown env
            raise ValueError(f"harness: {self.env} has no registered base harness; name its h0 file")
        if self.budget_rollouts < 1:
            raise ValueError("budget_rollouts must be positive")
        if self.eval.every not in ("phase", "unit") and not str(self.eval.every).isdigit():
            raise ValueError("eval.every must be 'phase', 'unit' or a number of rollouts")
        if self.eval.k < 1 or self.eval.limit < 0:
            raise ValueError("eval.k must be at least 1 and eval.limit at least 0 (0 = all)")
        if self.eval.select_k < 1 or self.eval.select_limit < 0:
            raise ValueError("eval.select_k must be at least 1 and eval.select_limit at least 0 (0 = none)")
        if self.eval.tasks is not None:
            specs = self.eval.tasks if isinstance(self.eval.tasks, list) else [self.eval.tasks]
            if not specs or not all(isinstance(s, str) and s.strip() for s in specs):
                raise ValueError(
                    "eval.tasks: a task source spec (kind:path?options) or a non-empty list of them"
                )
        if self.eval.split is not None:
            check_split(self.eval.split)  # ValueError naming the known splits
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        parse_report_to(self.report_to)
        if self.tensor_parallel_size < 1 or self.data_parallel_size < 1:
            raise ValueError("tensor_parallel_size and data_parallel_size must be >= 1")
        if self.data_parallel_size > 1:  # vLLM 0.33 refuses LLM(data_parallel_size > 1) in one process
            raise ValueError(
                "data_parallel_size > 1: run `vllm serve --data-parallel-size N` (or N servers) and the openai "
                "backend with their base_url(s), comma-separated; see docs/SCALING.md"
            )
        if (
            self.backend == "openai"
            and self.method != "harness-only"
            and "weight_sync" not in self.backend_options
        ):
            # A plain server's weights cannot be trained from here: RSFT trains a module in this process, and
            # only vllm serve replicas joined through backend_options.weight_sync take its weights back.
            raise ValueError(
                f"backend 'openai' serves a model this process cannot train, and method {self.method!r} has "
                "weight phases: use backend 'vllm' (in-process engine, trained weights pushed into it) or "
                "'transformers', method 'harness-only', or vllm serve replicas with backend_options.weight_sync "
                "(docs/TRAINING.md server mode, docs/SCALING.md)"
            )
        self.schedule.validate()
        self.rsft.validate()

    @property
    def harness_name(self) -> str:
        return self.harness or domain_for(self.env).base_harness

    @property
    def weight_step_cost(self) -> int:
        """Rollouts of one RSFT step."""
        return self.rsft.batch_tasks * self.rsft.samples

    @property
    def harness_iteration_cost(self) -> int:
        """The most rollouts one harness iteration (or re-scoring) can cost, so the budget is never
        overspent: every scored candidate, or the incumbent and the frontier, on the harness tasks (and
        the agent proposer's try_candidate rollouts)."""
        search = self.search
        tries = search.agent.try_budget if search.proposer == "agent" else 0
        return (
            search.harness_tasks * search.rollouts_per_task * max(search.candidates, 1 + search.frontier_size)
            + tries
        )

    @property
    def env_kwargs(self) -> dict[str, Any]:
        return {**self.env_options, **({"tasks": self.tasks} if self.tasks else {})}

    @property
    def eval_sets(self) -> list[dict[str, Any]]:
        """The env keyword arguments (split included) of each test set the in-run evaluations score: the
        run's own tasks (split ``test``), or each spec of ``eval.tasks`` (split ``all``), as ``eval.split``
        says otherwise."""
        e = self.eval
        specs = (e.tasks if isinstance(e.tasks, list) else [e.tasks]) if e.tasks else [self.tasks]
        split = e.split or ("all" if e.tasks else "test")
        return [{**self.env_options, **({"tasks": spec} if spec else {}), "split": split} for spec in specs]

    @classmethod
    def load(cls, path: str | Path | None = None, sets: Iterable[str] = (), **kwargs: Any) -> TrainConfig:
        """Read a YAML config (a path or a shipped config's name; ``base: other.yaml`` merges another file
        first, relative to this one), then apply ``key=value`` overrides (dotted keys for nested fields)."""
        return super().load(find_config(path) if path else None, sets, **kwargs)


#: The configs that ship with the package (``configs/`` of the repository): ``whale train demo`` or
#: ``whale train math/whale`` finds them by name.
SHIPPED_CONFIGS = Path(__file__).resolve().parent / "configs"


def shipped_configs() -> list[str]:
    return sorted(
        str(p.relative_to(SHIPPED_CONFIGS).with_suffix(""))
        for p in SHIPPED_CONFIGS.rglob("*.yaml")
        if p.parent.name not in ("compare", "accelerate")  # grids; accelerate launch configs
    )


def find_config(spec: str | Path) -> Path:
    """A config file: the path itself if it exists, else a shipped config by name (``demo``,
    ``math/whale``, ``configs/math/whale.yaml``). FileNotFoundError names the shipped ones."""
    path = Path(spec)
    if path.exists():
        return path
    name = str(spec).removeprefix("configs/").removesuffix(".yaml")
    shipped = SHIPPED_CONFIGS / f"{name}.yaml"
    if shipped.exists():
        return shipped
    raise FileNotFoundError(f"no config file {spec}; shipped configs: {', '.join(shipped_configs())}")


def eval_task_sets(config: TrainConfig) -> list[TaskSet]:
    """The test sets of ``config.eval_sets``, each env built once: the first ``eval.limit`` tasks of its
    split. A task id in two test sets is a ValueError naming both (their results would mix)."""
    seen: dict[str, int] = {}
    out = []
    for index, kwargs in enumerate(config.eval_sets):
        tasks = task_set(config.env, kwargs, config.eval.limit)
        if not tasks.ids:
            raise ValueError(
                f"eval: the test set {kwargs.get('tasks') or 'of the run'} has no tasks in split {kwargs['split']!r}"
            )
        for task_id in tasks.ids:
            other = seen.setdefault(task_id, index)
            if other != index:
                raise ValueError(
                    f"eval.tasks: task id {task_id!r} is in both {config.eval_sets[other].get('tasks')} and "
                    f"{kwargs.get('tasks')}; the test sets "
                    "must not share ids (aime: give a file without a year column ?year=2025)"
                )
        out.append(tasks)
    return out


def eval_task_ids(config: TrainConfig) -> list[list[str]]:
    """The task ids each test set of ``config.eval_sets`` contributes (:func:`eval_task_sets`)."""
    return [tasks.ids for tasks in eval_task_sets(config)]


def check_split_secret(run_dir: Path, resume: bool) -> None:
    """Record the split key's fingerprint in ``splits.json`` (never the secret), or, on ``--resume``,
    refuse in one line a run whose splits were drawn under another secret (its tasks would change split
    in the middle of the run)."""
    path = run_dir / "splits.json"
    now = splits.fingerprint()
    if resume and path.exists():
        then = json.loads(path.read_text()).get("fingerprint")
        if then != now:
            raise ValueError(
                f"{run_dir} drew its splits under split secret {then}, this process has {now}: set "
                f"{splits.SECRET_ENV} to that run's secret to resume it (docs/HARNESSES.md)"
            )
    if not path.exists():
        atomic_write_text(path, json.dumps({"fingerprint": now}, indent=1) + "\n")


def list_test_ids(run_dir: Path, config: TrainConfig, test_sets: list[TaskSet]) -> None:
    """After the run, ``splits.json`` lists the ids of every test set (``eval_task_sets``), for the user
    (nothing a harness or a proposer reads is written during the run)."""
    sets = [
        {"tasks": kwargs.get("tasks"), "split": kwargs["split"], "ids": tasks.ids}
        for kwargs, tasks in zip(config.eval_sets, test_sets, strict=True)
    ]
    record = {"fingerprint": splits.fingerprint(), "test_sets": sets}
    atomic_write_text(run_dir / "splits.json", json.dumps(record, indent=1) + "\n")


def _comparable(config: TrainConfig) -> Any:
    """What must match for a run to resume: every field, with the defaults of fields added since the run
    started and the evaluation's split as it resolves (``eval.split`` unset is ``test`` of the run's tasks)."""
    data = json.loads(json.dumps(config.to_dict()))
    data["eval"]["split"] = config.eval_sets[0]["split"]
    return data


# ------------------------------------------------------------------------------------------ harness phase


class HarnessPhase(Protocol):
    """What the trainer needs from the harness operator (``whale_train.meta_harness``)."""

    @property
    def incumbent(self) -> HarnessRef: ...

    def rescore(self, model_version: int) -> Any:
        """Score the incumbent (and frontier) under a model version (idempotent per version); a report
        with ``to_dict()`` holding ``rollouts``, ``improved``, ``summary``."""
        ...

    def iterate(self, model_version: int, iteration: int | None = None) -> Any:
        """Search iteration ``iteration`` (default: the next); idempotent once complete (a rerun returns the
        stored report); a report as for ``rescore``."""
        ...


def make_harness_phase(config: TrainConfig, run_dir: Path, llm: Any) -> HarnessPhase:
    from whale_train.meta_harness import HarnessSearch

    search_config = config.search.seeded(config.seed)
    if config.method == "fst":
        search_config = dataclasses.replace(search_config, prompt_only=True)
    return HarnessSearch(
        search_config,
        run_dir / "archive",
        llm,
        config.env,
        config.env_kwargs,
        seed_harness=load_harness(config.harness_name),
        log=lambda _line: None,  # the trainer logs a line per unit
        scored_sources=config.eval_sets if config.eval.tasks else None,
    )


# ------------------------------------------------------------------------------------------ the run


class Run:
    """One training run in a run directory (see the module docstring)."""

    def __init__(
        self,
        config: TrainConfig,
        run_dir: str | Path,
        *,
        resume: bool = False,
        llm: Any = None,
        log=print,
        progress=None,
        eval_cache: str | Path | None = None,
        trust_state: bool = False,
    ):
        from whale_train.eval_cache import EvalCache

        self.config = config
        self.trust_state = trust_state  # --trust-state: a resume may unpickle an older rsft_state.pt
        self.dir = Path(run_dir)
        # evaluations shared with other runs (whale compare's grid): see whale_train.eval_cache
        self.eval_cache = EvalCache(eval_cache) if eval_cache else None
        self.log = log
        # progress(description, total) -> a context manager yielding advance(); None: no progress shown
        self.progress = progress
        existing = (self.dir / "state.json").exists()
        if existing and not resume:
            raise FileExistsError(
                f"{self.dir} holds a run already: pass --resume to continue it, or choose another --out"
            )
        # resume without state.json (killed before the first unit finished): start over in place
        # One writer per run directory (two would interleave their units in one ledger), until run() ends.
        fresh = not self.dir.exists()
        hold_folder(self.dir, RUN_LOCK, "whale train")
        try:
            self._open(config, resume, existing, llm)
        except BaseException:
            release_folder(self.dir, RUN_LOCK)
            if fresh:  # a start that failed (the engine, the model) leaves no run folder behind
                shutil.rmtree(self.dir, ignore_errors=True)
            raise

    def _open(self, config: TrainConfig, resume: bool, existing: bool, llm: Any) -> None:
        if resume and (self.dir / "config.yaml").exists():
            saved = yaml.safe_load((self.dir / "config.yaml").read_text())
            if _comparable(TrainConfig.from_dict(saved)) != _comparable(config):
                raise ValueError(
                    f"{self.dir}/config.yaml differs from the config given: resume with the same config"
                )
        atomic_write_text(self.dir / "config.yaml", yaml.safe_dump(config.to_dict(), sort_keys=False))
        check_split_secret(self.dir, resume)
        started = time.monotonic()  # the wall time counts the engine's start-up (vLLM: a minute)
        self.llm = llm if llm is not None else self._load_llm()
        self.startup_seconds = round(time.monotonic() - started, 1)
        self.schedule = make_schedule(config.method, config.schedule)
        self.rsft: RSFT | None = None
        self.search: HarnessPhase | None = None
        self.harness = load_harness(config.harness_name)
        self.state = RunState(budget=config.budget_rollouts)
        self.units = 0
        self.ledger_lines = 0
        self.evaluated: set[str] = set()
        self.rescored: set[int] = set()  # model versions whose harness re-scoring the ledger has charged
        self.iterations = 0  # search iterations finished (a rerun unit asks for the same iteration again)
        self.started = started
        self.elapsed_before = 0.0
        self.tracker: Tracker | None = None
        if resume and existing:
            self._restore()

    # -------------------------------------------------------------- setup

    def _load_llm(self) -> Any:
        from whale_train.llm import load_llm

        kwargs = dict(self.config.backend_options)
        if self.config.backend == "openai":
            urls = [u.strip() for u in (self.config.base_url or "").split(",") if u.strip()]
            if len(urls) > 1 or "weight_sync" in kwargs:  # several vllm serve replicas
                from whale_train.llm.replicas import make_replicas

                return make_replicas(urls, self.config.model or "default", **kwargs)
            kwargs["base_url"] = self.config.base_url
        if self.config.backend == "vllm":
            kwargs.setdefault("tensor_parallel_size", self.config.tensor_parallel_size)
        return load_llm(self.config.backend, self.config.model, **kwargs)

    def _train_model(self) -> Any:
        """The module RSFT trains: the transformers backend's own model (None: trained in place), or for a
        backend that takes pushed weights (vLLM) a transformers copy on the GPU in float32 (bf16 autocast
        comes from ``rsft.bf16``; float32 master weights keep updates at lr ~1e-6 from rounding away).
        Under sharding (FSDP2 / ZeRO-3) the transformers backend also gets a separate training copy: the
        sharded module can only run a forward with every rank, and rank 0 samples alone."""
        if not hasattr(self.llm, "load_weights") and not distributed.sharded():
            return None
        import torch
        from transformers import AutoModelForCausalLM

        from whale_train.llm import default_model

        model = AutoModelForCausalLM.from_pretrained(
            self.config.model or default_model(), dtype=torch.float32
        )
        return model.to("cuda" if torch.cuda.is_available() else "cpu")

    def _rsft(self) -> RSFT:
        if self.rsft is None:
            rsft_config = dataclasses.replace(
                self.config.rsft, seed=self.config.seed, concurrency=self.config.concurrency
            )
            self.rsft = RSFT(
                rsft_config,
                self.llm,
                self.harness,
                self.config.env,
                self.config.env_kwargs,
                checkpoint_dir=self.dir / "checkpoints",
                train_model=self._train_model(),
            )
            if distributed.world()[1] > 1:  # under accelerate launch: every rank trains (distributed.py)
                self.rsft.trainer = distributed.DistributedUpdater(self.rsft.trainer)
        return self.rsft

    @property
    def harness_label(self) -> str:
        """The harness as the log shows it: the seed keeps the name it was given (``math/h0``) after the
        search copies it into its archive (as ``h0``); a candidate is its archive id."""
        if self.search is not None and self.harness.name == getattr(self.search, "seed_id", None):
            return self.config.harness_name
        return self.harness.name

    def _search(self) -> HarnessPhase:
        if self.search is None:
            self.search = make_harness_phase(self.config, self.dir, self.llm)
        return self.search

    def _costs(self) -> None:
        """Rollouts per unit, for the budget check."""
        cfg = self.config
        self.state.weight_step_cost = cfg.weight_step_cost
        self.state.harness_iteration_cost = cfg.harness_iteration_cost
        if cfg.method != "harness-only":
            self.state.steps_per_epoch = self._rsft().steps_per_epoch

    # -------------------------------------------------------------- ledger and state

    def _ledger(self, event: dict[str, Any]) -> None:
        event = {
            "event": event.pop("event"),
            "unit": self.units,
            "rollouts_total": self.state.rollouts,
            **event,
        }
        with open(self.dir / "ledger.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(event, default=str) + "\n")
        self.ledger_lines += 1
        if self.tracker is None:
            self.tracker = Tracker(
                self.config.report_to, self.dir, name=self.dir.name, config=self.config.to_dict()
            )
        self.tracker.log(event_metrics(event), event["rollouts_total"])

    def _save_state(self) -> None:
        """Save the model state of this unit under its own name, then point state.json at it (atomically),
        then drop older ones: a kill at any moment leaves a state.json whose checkpoint is complete."""
        resume_dir = None
        if self.rsft is not None and self.rsft.steps_done:
            resume_dir = f"resume-{self.units}"
            self.rsft.save(self.dir / "checkpoints" / resume_dir)
        state = {
            "units": self.units,
            "ledger_lines": self.ledger_lines,
            "schedule": self.state.to_dict(),
            "model_version": int(getattr(self.llm, "version", 0)),
            "rsft_steps": self.rsft.steps_done if self.rsft else 0,
            "harness": self.harness.name,
            "evaluated": sorted(self.evaluated),
            "rescored": sorted(self.rescored),
            "iterations": self.iterations,
            "elapsed": self.elapsed_before + time.monotonic() - self.started,
            "resume_from": resume_dir,
        }
        atomic_write_text(self.dir / "state.json", json.dumps(state, indent=1))
        for old in (self.dir / "checkpoints").glob("resume-*"):
            if old.name != resume_dir:
                shutil.rmtree(old, ignore_errors=True)

    def _restore(self) -> None:
        state = json.loads((self.dir / "state.json").read_text())
        self.units = state["units"]
        self.ledger_lines = state["ledger_lines"]
        self.evaluated = set(state["evaluated"])
        self.rescored = set(state.get("rescored", []))
        self.iterations = int(state.get("iterations", 0))
        self.elapsed_before = float(state.get("elapsed", 0.0))
        for key, value in state["schedule"].items():
            setattr(self.state, key, value)
        _truncate_lines(self.dir / "ledger.jsonl", self.ledger_lines)  # drop events of an unfinished unit
        if state.get("resume_from"):
            checkpoint = self.dir / "checkpoints" / state["resume_from"]
            if self._rsft().restore(checkpoint, trust=self.trust_state):  # recorded in the run
                note = f"{checkpoint / 'rsft_state.pt'} unpickled in full under --trust-state"
                with open(self.dir / "trusted_state.log", "a", encoding="utf-8") as fh:
                    fh.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {note}\n")
                self.log(note)
            if isinstance(self.rsft.trainer, distributed.DistributedUpdater):
                self.rsft.trainer.load(self.dir / "checkpoints" / state["resume_from"])
            if self.rsft.pushes:  # vLLM, or a rollout copy: the engine gets the restored weights
                self.rsft.push()
        self.llm.version = state["model_version"]
        if state["harness"] != self.harness.name:
            self.harness = self._search().incumbent
            if self.rsft is not None:
                self.rsft.harness = self.harness
        self.log(
            f"resumed {self.dir} at unit {self.units}: {self.state.rollouts} rollouts, model version {self.llm.version}"
        )

    # -------------------------------------------------------------- evaluation

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
        from whale_train.eval_cache import evaluation_key, weights_digest

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

    # -------------------------------------------------------------- the loop

    def run(self) -> dict[str, Any]:
        try:
            return self._run()
        finally:
            if self.tracker is not None:
                self.tracker.close()
                self.tracker = None
            release_folder(self.dir, RUN_LOCK)

    def _run(self) -> dict[str, Any]:
        self._costs()
        if self.units == 0:
            self._ledger(
                {
                    "event": "start",
                    "method": self.config.method,
                    "env": self.config.env,
                    "budget": self.config.budget_rollouts,
                    "isolation": isolation_label(),
                }
            )
            self.evaluate()
            self._save_state()
        while True:
            decision = self.schedule.decide(self.state)
            if decision.action == "stop":
                self._end_phase(decision)
                self._ledger({"event": "stop", "reason": decision.reason})
                self._save_state()
                break
            if decision.action != self.state.phase:
                self._end_phase(decision)
                self._ledger(
                    {
                        "event": "switch",
                        "from": self.state.phase or None,
                        "to": decision.action,
                        "reason": decision.reason,
                    }
                )
                self.log(f"→ {decision.action} phase: {decision.reason}")
                self.state.start_phase(decision.action)
            start = time.monotonic()
            if decision.action == "weight":
                signals, rollouts = self._weight_unit()
            else:
                signals, rollouts = self._harness_unit()
            stop_if_interrupted()  # a Ctrl-C that a worker or a __del__ swallowed: this unit is not kept
            self.state.rollouts += rollouts
            self.state.phase_units += 1
            if decision.action == "harness" and signals.get("kind") == "iteration":
                empty = not signals.get("candidates")
                self.state.empty_iterations = self.state.empty_iterations + 1 if empty else 0
            self._ledger(
                {
                    "event": "unit",
                    "phase": decision.action,
                    "phase_index": self.state.phases,
                    "rollouts": rollouts,
                    "model_version": int(getattr(self.llm, "version", 0)),
                    "harness": self.harness.name,
                    "seconds": round(time.monotonic() - start, 2),
                    "signals": signals,
                }
            )
            self.units += 1
            every = self.config.eval.every
            if every == "unit":
                self.evaluate()
            elif every != "phase" and (self.state.rollouts - rollouts) // int(
                every
            ) < self.state.rollouts // int(every):
                self.evaluate()  # this unit crossed a multiple of eval.every rollouts
            self._save_state()
        list_test_ids(self.dir, self.config, self.test_sets)
        return self.summary()

    def _end_phase(self, decision: ScheduleDecision) -> None:
        by_rollouts = self.config.eval.every not in ("phase", "unit")
        if self.state.phase and (decision.action == "stop" or not by_rollouts):
            self.evaluate()

    def _weight_unit(self) -> tuple[dict[str, Any], int]:
        rsft = self._rsft()
        rsft.harness = self.harness
        report = rsft.step()
        self.state.train_rewards.append(report.train_reward)
        self.state.weight_rollouts += report.rollouts
        self.log(
            f"  RSFT step {report.step}: train reward {report.train_reward:.3f}, accepted {report.accepted}, "
            f"loss {report.loss if report.loss is None else round(report.loss, 3)}, model v{report.model_version}"
        )
        signals = report.to_dict()
        signals.pop("failures", None)
        push = getattr(self.llm, "last_push_seconds", None)
        if report.updated and push is not None:  # weights pushed to the rollout engine(s) this step
            signals["push_seconds"] = push
            if getattr(self.llm, "last_push_check", None):  # the engine's probe log-probs vs the trainer's
                signals["push_check"] = self.llm.last_push_check
        return signals, report.rollouts

    def _harness_unit(self) -> tuple[dict[str, Any], int]:
        search = self._search()
        version = int(getattr(self.llm, "version", 0))
        if (
            self.state.phase_units == 0
        ):  # the first iteration of a harness phase re-scores the incoming harness
            result = search.rescore(version).to_dict()
            kind = "rescore"
            if version in self.rescored:  # scored and charged already (a weight phase that changed nothing)
                result["rollouts"] = 0
            self.rescored.add(version)
        else:
            result = search.iterate(version, iteration=self.iterations + 1).to_dict()
            kind = "iteration"
            self.iterations += 1
        self.state.harness_improved.append(bool(result.get("improved")))
        self.harness = search.incumbent
        self.log(f"  harness {kind}: {result.get('summary', '')}")
        signals = {
            "kind": kind,
            "improved": bool(result.get("improved")),
            "accepted": bool(result.get("accepted")),
            "incumbent": result.get("incumbent"),
            "reason": result.get("reason"),
            "candidates": [
                {k: c.get(k) for k in ("id", "status", "mean", "reason") if k in c}
                for c in result.get("candidates", [])
            ],
        }
        if result.get("proposer_rollouts"):  # the agent proposer's tries: charged, and shown apart
            signals["proposer_rollouts"] = int(result["proposer_rollouts"])
        return signals, int(result["rollouts"]) + int(result.get("proposer_rollouts") or 0)

    def summary(self) -> dict[str, Any]:
        evals = [json.loads(line) for line in open(self.dir / "ledger.jsonl") if '"event": "eval"' in line]
        best = max(evals, key=lambda e: e["mean"]) if evals else None
        return {
            "run": str(self.dir),
            "method": self.config.method,
            "env": self.config.env,
            "rollouts": self.state.rollouts,
            "budget": self.config.budget_rollouts,
            "best_mean": best["mean"] if best else None,
            "best_se": best["se"] if best else None,
            "best_at_rollouts": best["rollouts_total"] if best else None,
            "final_mean": evals[-1]["mean"] if evals else None,
            "evals": len(evals),
            "wall_seconds": round(self.elapsed_before + time.monotonic() - self.started, 1),
            "startup_seconds": self.startup_seconds,  # of this process: loading the model or starting the engine
        }


# ------------------------------------------------------------------------------------------ files


#: Set by ``whale train``'s SIGINT handler. The handler raises KeyboardInterrupt at once, but a
#: KeyboardInterrupt can land in a thread pool or a ``__del__`` and be swallowed; the trainer checks this
#: flag before it keeps a unit or an evaluation, so an interrupted unit is never recorded.
INTERRUPTED = threading.Event()


def stop_if_interrupted() -> None:
    if INTERRUPTED.is_set():
        raise KeyboardInterrupt


def _in_finalizer(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def sigint_stops_run():
    """While a run trains: Ctrl-C sets ``INTERRUPTED`` and raises KeyboardInterrupt. Not inside a
    ``__del__`` (a ``subprocess.Popen`` being collected): raised there, Python prints "Exception ignored
    in Popen.__del__" with a traceback and drops it; the signal is sent again a moment later instead."""

    def handler(_sig, frame):
        INTERRUPTED.set()
        if _in_finalizer(frame):
            threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()
            return
        raise KeyboardInterrupt

    INTERRUPTED.clear()
    try:
        previous = signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        INTERRUPTED.clear()


@contextlib.contextmanager
def _no_progress(_description: str, _total: int):
    yield lambda: None


def _truncate_lines(path: Path, n: int) -> None:
    if not path.exists():
        return
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    if len(lines) != n:
        atomic_write_text(path, "".join(lines[:n]))
