"""The config of a training run (``TrainConfig``, with its ``eval:`` section ``EvalConfig``), every field
with its help, and the shipped configs a run can name instead of a path."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from whale_envs import MATH_ID
from whale_envs.tasks import check_split
from whale_train.config_io import Config, option
from whale_train.domains import domain_for
from whale_train.meta_harness.config import MetaHarnessConfig
from whale_train.rsft import RSFTConfig
from whale_train.schedule import METHODS, ScheduleConfig, make_schedule
from whale_train.tracking import parse_report_to


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
        None, "the seed harness (default: the domain's base harness; generic/h0 for an env without one)"
    )
    model: str | None = option(None, "model directory or id (default: the shipped tiny model)")
    backend: str = option("transformers", "transformers, vllm (in-process engine) or openai (servers)")
    base_url: str | None = option(None, "server URL(s) for backend openai, comma-separated")
    backend_options: dict[str, Any] = option(
        factory=dict,
        help="keyword arguments of the backend (vllm: engine arguments such as gpu_memory_utilization)",
    )
    tensor_parallel_size: int = option(1, "vllm in-process engine: GPUs per copy of the model", minimum=1)
    data_parallel_size: int = option(
        1,
        "copies of the model: vllm serve replicas (backend openai with several base_url and "
        "backend_options.weight_sync, docs/SCALING.md)",
        minimum=1,
    )
    seed: int = option(0, "seeds the task stream, the rollouts, training and (unless search.seed) the search")
    budget_rollouts: int = option(
        20_000, "the rollout budget the run spends (harness and weight phases)", minimum=1
    )
    schedule: ScheduleConfig = option(factory=ScheduleConfig, help="when to switch phases")
    rsft: RSFTConfig = option(factory=RSFTConfig, help="the weight operator")
    search: MetaHarnessConfig = option(factory=MetaHarnessConfig, help="the harness operator")
    eval: EvalConfig = option(factory=EvalConfig, help="test evaluation")
    concurrency: int = option(128, "episodes in flight", minimum=1)
    report_to: Any = option(
        "tensorboard", "experiment trackers: none, tensorboard, wandb (offline), trackio (local), or a list"
    )

    def validate(self) -> None:
        super().validate()  # the fields' minimum
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; known: {', '.join(METHODS)}")
        if self.harness is None and domain_for(self.env).base_harness is None:  # ValueError: unknown env
            raise ValueError(f"harness: {self.env} has no registered base harness; name its h0 file")
        if self.eval.every not in ("phase", "unit") and not str(self.eval.every).isdigit():
            raise ValueError("eval.every must be 'phase', 'unit' or a number of rollouts")
        # (eval's ranges here, not as its fields' minimum, so that the message names the key: eval.k)
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
        parse_report_to(self.report_to)
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
        # validates the schedule and refuses overlap on a method that does not alternate, at config load
        make_schedule(self.method, self.schedule)
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


#: The configs that ship with the package (``configs/`` of the repository, linked into the package as
#: ``whale_train/configs``): ``whale train demo`` or ``whale train math/whale`` finds them by name.
SHIPPED_CONFIGS = Path(__file__).resolve().parent.parent / "configs"


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
