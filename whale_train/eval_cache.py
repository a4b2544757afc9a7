"""An evaluation cache shared by runs: the same (weights, harness, tasks, sample seeds) scored once.

Every run of a compare grid starts with the same evaluation: the base model under the seed harness, on
the same test tasks with the same sample seed (the grid is paired), five methods and more per domain
and seed. Later ones repeat too (weight-only and stagewise share their first weight phase). ``whale
train --eval-cache DIR`` reads such an evaluation from ``DIR`` instead of running it again; the runs of
``whale compare`` share ``<out>/runs/.eval-cache``.

The key is the content of everything an evaluation's rollouts depend on: a digest of the model's
weights (every tensor's name, dtype, shape and bytes), the harness source and class, the env, its task
source and split, the task ids, k, the sample seeds, the rollout concurrency (batching can change
floating point), the selection score's settings, and the torch and transformers versions. Only a
backend whose weights live in this process as a torch module (the transformers backend) can be
digested; for others (vLLM, servers) :func:`weights_digest` is None and nothing is cached.

An entry is two files written atomically, ``<key>.json`` (the evaluation's result) and
``<key>.traces.jsonl``: a hit copies both into the run's ``eval/`` exactly as a computed one would be
written, and the ledger's eval event says ``cached: true``. Two runs evaluating the same key at the same
time both compute it; the second write replaces the first with the same content.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from whale_train.files import TMP_MARKER, atomic_write_json


def weights_digest(llm: Any) -> str | None:
    """sha256 of the rollout model's weights, or None when they are not a torch module here."""
    import torch

    model = getattr(llm, "model", None)
    if not isinstance(model, torch.nn.Module):
        return None
    h = hashlib.sha256()
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            h.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
            h.update(tensor.detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def evaluation_key(weights: str, harness: Any, **settings: Any) -> str:
    """The cache key of one evaluation: the weights digest, the harness (source, class, trusted or not)
    and ``settings`` (env, tasks, split, ids, k, seeds, ...; JSON-able), plus the library versions."""
    import torch
    import transformers

    parts = {
        "weights": weights,
        "harness": hashlib.sha256(harness.source.encode()).hexdigest(),
        "class": harness.class_name,
        "trusted": harness.shipped,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        **settings,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


class EvalCache:
    """The folder of cached evaluations (see the module docstring)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)

    def get(self, key: str) -> tuple[dict[str, Any], Path] | None:
        """The cached result and its traces file, or None."""
        result, traces = self.folder / f"{key}.json", self.folder / f"{key}.traces.jsonl"
        if not (result.exists() and traces.exists()):
            return None
        try:
            return json.loads(result.read_text(encoding="utf-8")), traces
        except json.JSONDecodeError:  # cannot happen with atomic writes; a hand-edited file: recompute
            return None

    def put(self, key: str, result: dict[str, Any], traces: Path) -> None:
        """Store a computed evaluation: the traces first, then the result (whose presence marks a whole
        entry)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        target = self.folder / f"{key}.traces.jsonl"
        tmp = target.with_name(f"{target.name}{TMP_MARKER}{os.getpid()}")
        shutil.copyfile(traces, tmp)
        tmp.replace(target)
        atomic_write_json(self.folder / f"{key}.json", result)
