"""The weight operator itself (``RSFT``): one step samples ``batch_tasks`` tasks of the ``train`` stream
under the current harness, keeps what passes (``rsft.examples``), fine-tunes on it (``rsft.update``),
hands the new weights to the rollout backend and saves the version (``rsft.checkpoint``)."""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym

from harnesses.loader import HarnessRef
from whale_train.distributed import world
from whale_train.rollout import RolloutConfig, run_rollouts, summarize
from whale_train.rsft.checkpoint import load_checkpoint, load_state, save_checkpoint
from whale_train.rsft.config import RSFTConfig
from whale_train.rsft.examples import accept, examples_from
from whale_train.rsft.update import RSFTUpdater

log = logging.getLogger(__name__)


class TaskStream:
    """An epoch-ordered stream over task ids: each epoch is a fresh seeded shuffle. ``position`` counts
    the tasks handed out so far, so a stream can be resumed exactly (``TaskStream(ids, seed, position)``)."""

    def __init__(self, task_ids: list[str], seed: int = 0, position: int = 0):
        if not task_ids:
            raise ValueError("the task stream needs at least one task")
        self.task_ids = list(task_ids)
        self.seed = seed
        self.position = position

    def _epoch(self, epoch: int) -> list[str]:
        order = list(self.task_ids)
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def take(self, n: int) -> list[str]:
        out = []
        for _ in range(n):
            epoch, i = divmod(self.position, len(self.task_ids))
            out.append(self._epoch(epoch)[i])
            self.position += 1
        return out

    @property
    def epochs_done(self) -> float:
        return self.position / len(self.task_ids)


class ModelFailure(RuntimeError):
    """Every episode of an evaluation or an RSFT step failed in the model (not the harness): the run stops."""


def check_model(trajs: list[Any], what: str) -> None:
    """Stop when every episode's model calls failed (a broken backend); some failures (one bad request)
    only fail their episodes, which are counted as ``model_error``."""
    errors = [t.error for t in trajs if t.failure == "model_error"]
    if trajs and len(errors) == len(trajs):
        raise ModelFailure(
            f"the model failed in all {len(trajs)} episodes of {what}: {errors[0].splitlines()[0]}"
        )


@dataclass
class StepReport:
    """What one RSFT step did (the signals the trainer logs)."""

    step: int
    model_version: int
    tasks: int
    rollouts: int
    train_reward: float
    pass_at_k: float
    accepted: int
    examples: int
    train_tokens: int
    loss: float | None
    sample_seconds: float
    train_seconds: float
    epochs_done: float
    updated: bool
    failures: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class RSFT:
    """The weight operator: ``step()`` runs one RSFT step, ``phase(n_steps)`` several.

    Args:
        llm: the rollout backend. A ``TransformersLLM`` is trained in place; any backend with a
            ``load_weights(named_tensors)`` method (vLLM) gets the weights of ``train_model`` after each step.
        harness: the current harness (``HarnessRef``); the trainer swaps it between phases.
        env_id, env_kwargs: the env and its task source; the stream runs over the ``train`` split.
        checkpoint_dir: where model versions are saved (``<dir>/<version>/``), if ``save_checkpoints``.
        train_model: the module to train when it is not ``llm.model`` (vLLM; or a transformers backend
            under sharding, whose rollout model must not be the sharded one: it gets the gathered
            weights after each step).
    """

    def __init__(
        self,
        config: RSFTConfig,
        llm: Any,
        harness: HarnessRef,
        env_id: str,
        env_kwargs: dict[str, Any] | None = None,
        *,
        checkpoint_dir: str | Path | None = None,
        train_model: Any | None = None,
        stream_position: int = 0,
    ):
        config.validate()
        self.config = config
        self.llm = llm
        self.harness = harness
        self.env_id = env_id
        self.env_kwargs = {k: v for k, v in (env_kwargs or {}).items() if k != "split"}
        env = gym.make(env_id, split="train", **self.env_kwargs).unwrapped
        self.stream = TaskStream(env.task_ids, seed=config.seed, position=stream_position)
        model = train_model if train_model is not None else llm.model
        self.tokenizer = getattr(llm, "tokenizer", None)
        self.trainer = RSFTUpdater(model, self.tokenizer, config)
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self.steps_done = 0
        # the rollout backend holds its own weights, which get the trained ones after each step
        self.pushes = hasattr(llm, "load_weights") or train_model is not None

    @property
    def steps_per_epoch(self) -> float:
        return len(self.stream.task_ids) / self.config.batch_tasks

    def steps_for(self, epochs: float) -> int:
        """Steps in ``epochs`` (a fraction of an epoch of the ``train`` split), at least one."""
        return max(1, round(epochs * self.steps_per_epoch))

    def step(self) -> StepReport:
        cfg = self.config
        tasks = self.stream.take(cfg.batch_tasks)
        start = time.monotonic()
        rollout = RolloutConfig(
            k=cfg.samples,
            seed=cfg.seed * 100_003 + self.steps_done,
            concurrency=cfg.concurrency,
            trusted=self.harness.shipped,
        )
        trajs = run_rollouts(
            self.harness,
            self.env_id,
            self.llm,
            tasks,
            env_kwargs={"split": "train", **self.env_kwargs},
            config=rollout,
        )
        sample_seconds = time.monotonic() - start
        check_model(trajs, f"RSFT step {self.steps_done}")
        summary = summarize(trajs)
        accepted = accept(trajs, cfg)
        examples = examples_from(accepted, cfg, self.tokenizer)
        self.last_examples = examples
        loss, tokens, train_seconds = None, 0, 0.0
        if examples:
            start = time.monotonic()
            loss, tokens = self.trainer.train(examples)
            self._publish()
            train_seconds = time.monotonic() - start
        else:
            log.info("RSFT step %d: no accepted trajectory, no update", self.steps_done)
        report = StepReport(
            step=self.steps_done,
            model_version=int(getattr(self.llm, "version", 0)),
            tasks=len(tasks),
            rollouts=len(trajs),
            train_reward=summary["mean"],
            pass_at_k=summary["pass_at_k"],
            accepted=len(accepted),
            examples=len(examples),
            train_tokens=tokens,
            loss=loss,
            sample_seconds=round(sample_seconds, 3),
            train_seconds=round(train_seconds, 3),
            epochs_done=round(self.stream.epochs_done, 4),
            updated=bool(examples),
            failures=summary["failures"],
        )
        self.steps_done += 1
        return report

    def _publish(self) -> None:
        """Hand the new weights to the rollout backend and save the version."""
        if self.pushes:
            self.push()
        else:  # transformers: the same module was trained in place
            self.llm.version = int(getattr(self.llm, "version", 0)) + 1
        if self.config.save_checkpoints and self.checkpoint_dir is not None:
            self.save(self.checkpoint_dir / str(self.llm.version))

    def push(self) -> None:
        """Push the trained weights into a backend that takes them (vLLM): detached, LoRA merged into
        the base weights under the base names (``llm.weights.trained_weights``); under sharding the
        full parameters are gathered from every rank for it. A transformers backend beside a separate
        training model (under sharding) gets them copied into its own model."""
        from whale_train.llm.weights import trained_weights

        with self.trainer.gathered():
            weights = trained_weights(self.trainer.model)
            if hasattr(self.llm, "load_weights"):
                self.llm.load_weights(weights)
                if hasattr(self.llm, "verify_push") and world()[1] == 1:  # the engine computes with them
                    self.llm.verify_push(self.trainer.model)  # (PushCheckError stops the run in one line)
            else:
                import torch

                own = dict(self.llm.model.named_parameters())
                with torch.no_grad():
                    for name, tensor in weights:
                        own[name].copy_(tensor.to(own[name].device, own[name].dtype))
                self.llm.version = int(getattr(self.llm, "version", 0)) + 1

    def save(self, path: Path) -> Path:
        """``save_pretrained`` the current weights (with LoRA: the adapter, in PEFT's format), plus the
        optimizer state and the stream position, so a run can resume from here exactly
        (``save_checkpoint``)."""
        return save_checkpoint(
            self.trainer, path, {"steps_done": self.steps_done, "stream": self.stream.position}
        )

    def restore(self, path: Path, trust: bool = False) -> bool:
        """Load the weights, optimizer state and stream position saved by ``save``, in place (the rollout
        backend and the optimizer keep their parameter objects). The state file is read as
        :func:`load_state` reads it (``trust``: ``--trust-state``); True when it was unpickled in full."""
        load_checkpoint(self.trainer.model, Path(path))
        extra, unpickled = load_state(path, trust)
        self.trainer.optimizer_state = extra["optimizer"]  # loaded by the optimizer of the next step
        self.steps_done = int(extra["steps_done"])
        self.stream.position = int(extra["stream"])
        return unpickled

    def phase(self, steps: int, on_step=None) -> list[StepReport]:
        reports = []
        for _ in range(steps):
            report = self.step()
            reports.append(report)
            if on_step is not None:
                on_step(report)
        return reports
