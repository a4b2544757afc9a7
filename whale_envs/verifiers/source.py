"""A verifiers taskset as a WHALE task source (the ``taskset`` kind of the ``verifiers`` domain).

Each verifiers task becomes one WHALE task: its id is the task's own (``TaskData.id``, else its
``name``), else a hash of its content, so WHALE's keyed split puts it in the same split whatever the
taskset's order, and one content never lands in two splits. The payload is the verifiers task itself
(only the env reads it). An infinite taskset (textarena's games) is cut to its first ``size`` tasks.

    gym.make("whale/Verifiers-v0", taskset="my_taskset", taskset_args={"num_tasks": 20})
    gym.make("whale/Verifiers-v0", taskset="my_taskset", tasks="taskset?split=test")  # spec options are
                                                                                       # taskset args too
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from whale_envs.tasks import ListSource, Task, TaskSourceError, register_source
from whale_envs.verifiers.runner import VerifiersError, runner_for

DOMAIN = "verifiers"
#: How many tasks of an infinite taskset a source holds unless ``size`` says otherwise.
INFINITE_SIZE = 256


def task_id(data: Any) -> str:
    """A verifiers task's WHALE id: its own id or name, else a hash of its content (position left out)."""
    own = data.id or data.name
    if own:
        return str(own)
    content = data.model_dump(mode="json", exclude_none=True, exclude={"idx"})
    return "vf-" + hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]


def unfit_reason(taskset: Any) -> str | None:
    """Why the exchange of this taskset's tasks is not text between a model and the taskset (it needs a
    container, a tool server or an LLM judge's API), or None."""
    config = taskset.config
    task_cls = type(taskset).task_type()
    if task_cls.NEEDS_CONTAINER:
        return "its tasks need a container runtime (Docker, Prime, ...)"
    if taskset.toolsets(config) or task_cls.toolsets(config.task):
        return "it serves tools to the model over MCP (a tool server per rollout)"
    if config.task.judges:
        return "it scores with an LLM judge, which needs a model API of its own"
    return None


def taskset_source(
    path: str | None,
    *,
    taskset: str | None = None,
    taskset_args: Mapping[str, Any] | None = None,
    size: int | None = None,
    **more_args: Any,
) -> ListSource:
    """The source of ``taskset`` (an installed verifiers taskset id) built with ``taskset_args`` and any
    further spec options (``taskset?split=test``) as its config."""
    if not taskset:
        raise TaskSourceError(
            "whale/Verifiers-v0 needs taskset=ID (an installed verifiers taskset, e.g. textarena)"
        )
    if size is not None and (not isinstance(size, int) or size < 1):
        raise TaskSourceError(f"taskset {taskset!r}: size must be a positive integer, got {size!r}")
    args = {**dict(taskset_args or {}), **more_args}
    try:
        runner = runner_for(taskset, args)
    except VerifiersError as exc:
        raise TaskSourceError(str(exc)) from None
    reason = unfit_reason(runner.taskset)
    if reason:
        raise TaskSourceError(f"taskset {taskset!r} cannot run here: {reason}")
    view = runner.taskset
    if size is not None:
        view = view.take(size)
    elif not view.bounded:
        view = view.take(INFINITE_SIZE)
    tasks: dict[str, Task] = {}
    try:
        for vf_task in view:
            tid = task_id(vf_task.data)
            tasks.setdefault(tid, Task(id=tid, payload=vf_task, meta={"taskset": taskset}))
    except Exception as exc:  # noqa: BLE001 (the taskset's own code: its failure in one line)
        first = next((line.strip() for line in str(exc).splitlines() if line.strip().strip("*")), "")
        raise TaskSourceError(
            f"taskset {taskset!r}: loading its tasks failed: {type(exc).__name__}: {first}"
        ) from None
    name = f"verifiers:{taskset}" + (f"?{json.dumps(args, sort_keys=True)}" if args else "")
    return ListSource(name, list(tasks.values()))


register_source(
    DOMAIN,
    "taskset",
    taskset_source,
    takes_path=False,
    doc="an installed verifiers taskset (taskset=ID, taskset_args={...}; further options are taskset args)",
)
