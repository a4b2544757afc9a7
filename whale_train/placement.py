"""Where the runs of ``whale compare`` execute: local GPUs split between concurrent jobs, or a Ray cluster.

Local (``--gpus-per-run N``): the devices (``--devices 0,1,...``, else the parent's
``CUDA_VISIBLE_DEVICES``, else every GPU torch sees) are a pool; each job leases ``N`` of them for as
long as its ``whale train`` runs and gets them as its ``CUDA_VISIBLE_DEVICES``, so no two concurrent
jobs share a GPU. With fewer free devices than a job needs, the job waits for one to finish.

Ray (``--ray ADDRESS`` or ``--ray local``): every run is a Ray task asking for ``num_gpus`` /
``num_cpus``; Ray picks the node and sets its ``CUDA_VISIBLE_DEVICES``. The task runs the same
``whale train --resume`` subprocess as a local job, on run directories that every node sees (a shared
file system), so the results land where a local grid puts them. A task whose worker or node dies is
retried by Ray (``max_retries``) on a live node, and ``--resume`` continues the run from its last
finished unit; the child ``whale train`` dies with its worker (``PR_SET_PDEATHSIG``), so a retried run
never has two writers. Every attempt appends a line to ``RUN/placement.jsonl`` (host, pid, devices).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from whale_train import warm_start


def visible_devices(devices: str | None = None) -> list[str]:
    """The GPUs jobs may use: ``devices`` ("0,1,2"), else ``CUDA_VISIBLE_DEVICES``, else torch's count."""
    if devices is None:
        devices = os.environ.get("CUDA_VISIBLE_DEVICES")
    if devices is not None:
        return [d.strip() for d in devices.split(",") if d.strip()]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except ImportError:  # pragma: no cover - torch is a dependency
        return []


class DevicePool:
    """Disjoint leases of ``per_run`` devices each, out of ``devices``."""

    def __init__(self, devices: list[str], per_run: int):
        if per_run < 1:
            raise ValueError("--gpus-per-run must be >= 1")
        if len(set(devices)) != len(devices):
            raise ValueError(f"--devices lists a device twice: {','.join(devices)}")
        if per_run > len(devices):
            have = ",".join(devices) or "none"
            raise ValueError(f"--gpus-per-run {per_run} needs more GPUs than are visible ({have})")
        self.per_run = per_run
        self.free = list(devices)
        self.slots = len(devices) // per_run  # jobs that can run at once
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def lease(self) -> Iterator[list[str]]:
        with self._cond:
            while len(self.free) < self.per_run:
                self._cond.wait()
            taken, self.free = self.free[: self.per_run], self.free[self.per_run :]
        try:
            yield taken
        finally:
            with self._cond:
                self.free.extend(taken)
                self._cond.notify_all()


def record_placement(run_dir: Path, **extra: Any) -> None:
    """Append where this attempt of a run executes to ``RUN/placement.jsonl``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    line = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "time": round(time.time(), 3),
        **extra,
    }
    with open(run_dir / "placement.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")


def _train_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


#: The zygote of :mod:`whale_train.warm_start` that :func:`train_one` hands its runs to, while
#: :func:`warm_starts` holds one.
_WARM: list[warm_start.WarmStarter] = []


@contextlib.contextmanager
def warm_starts() -> Iterator[None]:
    """Within this, :func:`train_one` forks its runs from one zygote that has already imported the heavy
    libraries (:mod:`whale_train.warm_start`; started by the first run it can take, ended here). Nothing
    changes where warm starts are off."""
    starter = warm_start.starter(_train_env())
    if starter is not None:
        _WARM.append(starter)
    try:
        yield
    finally:
        if starter is not None:
            _WARM.remove(starter)
            starter.close()


def train_one(
    config_path: Path,
    run_dir: Path,
    extra_env: dict[str, str] | None = None,
) -> int:
    """``whale train CONFIG --out RUN --resume --no-report`` in a subprocess (forked from the zygote
    within :func:`warm_starts`, where it can take the run); its output goes to ``RUN/train.log``.
    ``--resume`` starts a new run as well and continues an unfinished one. The runs of a grid share one
    evaluation cache beside them (``--eval-cache RUN/../.eval-cache``). The subprocess is killed when the
    thread that started it (or the zygote) dies (a killed ``whale compare``, a lost Ray worker): a run left
    running would go on writing the folder that the next ``--resume`` continues."""
    run_dir.mkdir(parents=True, exist_ok=True)
    cache = run_dir.parent / ".eval-cache"
    args = ["--out", str(run_dir), "--resume", "--no-report", "--eval-cache", str(cache)]
    env = {**_train_env(), **(extra_env or {})}
    with open(run_dir / "train.log", "a", encoding="utf-8") as log:
        log.write(f"\n$ whale train {config_path} {' '.join(args)}\n")
        log.flush()
        code = _WARM[-1].run(["train", str(config_path), *args], env, log.fileno()) if _WARM else None
        if code is not None:
            return code
        proc = subprocess.run(
            [sys.executable, "-m", "whale_train.cli", "train", str(config_path), *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=warm_start.parent_death_signal(),
        )
    return proc.returncode


# ------------------------------------------------------------------------------------------ Ray


def _ray_task(config_path: str, run_dir: str, split_env: dict[str, str] | None = None) -> int:
    """The body of a run's Ray task (on whichever node Ray chose). ``split_env``: the driver's split
    secret, so a run on another node draws the same splits as the rest of the grid."""
    record_placement(Path(run_dir), via="ray")
    return train_one(Path(config_path), Path(run_dir), split_env)


class RayPlacement:
    """Submits runs as Ray tasks. ``address``: ``local`` starts a Ray instance in this process with
    ``num_cpus`` / ``num_gpus``; anything else (``auto``, ``ray://host:10001``, ``host:6379``) joins that
    cluster."""

    def __init__(
        self,
        address: str,
        *,
        cpus_per_run: float = 1.0,
        gpus_per_run: float = 0.0,
        max_retries: int = 3,
        local_cpus: int | None = None,
        local_gpus: int | None = None,
    ):
        try:
            import ray
        except ImportError:
            raise RuntimeError("--ray needs Ray: pip install 'whale[scale]'") from None
        self.ray = ray
        self._started = False
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
            if address == "local":
                kwargs.update(num_cpus=local_cpus, num_gpus=local_gpus)
            else:
                kwargs["address"] = address
            try:
                ray.init(**kwargs)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise RuntimeError(f"--ray {address}: cannot connect: {exc}") from None
            self._started = True
        gpus = ray.cluster_resources().get("GPU", 0)
        if gpus_per_run > gpus:  # the tasks would wait for ever
            self.close()
            raise RuntimeError(
                f"--gpus-per-run {gpus_per_run:g}: the Ray cluster at {address} has {gpus:g} GPU(s) in all"
            )
        self._task = ray.remote(  # a failing run (exit code != 0) is reported, not retried
            num_cpus=cpus_per_run, num_gpus=gpus_per_run, max_retries=max_retries, retry_exceptions=False
        )(_ray_task)

    def run(self, config_path: Path, run_dir: Path) -> int:
        """Run one ``whale train`` as a Ray task and wait for it; its exit code, or -1 when Ray gave up
        on it (every retry lost its worker or node)."""
        from whale_envs.splits import secret_for_children

        ref = self._task.remote(
            str(Path(config_path).resolve()), str(Path(run_dir).resolve()), secret_for_children()
        )
        try:
            return int(self.ray.get(ref))
        except self.ray.exceptions.RayError as exc:
            with open(Path(run_dir) / "train.log", "a", encoding="utf-8") as log:
                log.write(f"\nRay gave up on this run: {type(exc).__name__}: {exc}\n")
            return -1

    def close(self) -> None:
        if self._started:
            self.ray.shutdown()
            self._started = False
