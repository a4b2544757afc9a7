"""Requests spread over several ``vllm serve`` replicas, and the weight push to all of them through
vLLM's weight-transfer routes. The servers are test doubles of vLLM 0.33's HTTP surface that enforce
its rules (the order of the weight-update calls, one rank per worker in the group, metadata lists of
one length); the NCCL broadcast itself needs GPUs and runs in benchmarks/gpu_check_multi.sh."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from tests.http_fake import send_json
from whale_train.llm.base import Request, SamplingParams
from whale_train.llm.replicas import ReplicatedLLM, SyncedReplicas, WeightSync, server_root


class FakeVLLM:
    """One ``vllm serve --weight-transfer-config '{"backend": "nccl"}'`` with ``world`` workers."""

    def __init__(self, world: int = 1):
        self.world = world
        self.calls: list[str] = []
        self.init: dict | None = None
        self.state = "serving"  # -> "updating" between start and finish
        self.version = "0"
        self.received: list[dict] = []
        self.served = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_a):
                pass

            def _reply(self, code: int, body: dict) -> None:
                send_json(self, code, body)

            def do_GET(self):
                if self.path.startswith("/get_world_size"):
                    return self._reply(200, {"world_size": fake.world})
                self._reply(404, {"detail": "Not Found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                code, out = fake.handle(self.path, body)
                self._reply(code, out)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1"

    def handle(self, path: str, body: dict) -> tuple[int, dict]:
        self.calls.append(path)
        if path == "/v1/completions":
            if self.state != "serving":
                return 503, {"error": "weights are being updated"}
            self.served += 1
            text = f"v{self.version} seed {body['seed']}"  # what a sample depends on: weights and seed
            usage = {"prompt_tokens": 3, "completion_tokens": 4}
            return 200, {"choices": [{"text": text, "finish_reason": "stop"}], "usage": usage}
        if path == "/init_weight_transfer_engine":
            info = body["init_info"]
            for key in ("master_address", "master_port", "rank_offset", "world_size"):
                if key not in info:
                    return 422, {"detail": f"missing {key}"}
            self.init = info
            return 200, {"message": "Weight transfer initialized"}
        if path == "/start_weight_update":
            if self.init is None or self.state != "serving":
                return 500, {"error": "start_weight_update before init, or twice"}
            self.state = "updating"
            return 200, {"message": "Weight update started"}
        if path == "/update_weights":
            info = body["update_info"]
            if self.state != "updating":
                return 500, {"error": "update_weights outside start/finish"}
            if not (len(info["names"]) == len(info["dtype_names"]) == len(info["shapes"])):
                return 500, {"error": "`dtype_names` should be of the same size as `names`"}
            self.received.append(info)
            return 200, {"message": "Weights updated"}
        if path == "/finish_weight_update":
            if self.state != "updating":
                return 500, {"error": "finish without start"}
            self.state = "serving"
            if body.get("weight_version") is not None:
                self.version = body["weight_version"]
            return 200, {"message": "Weight update finished"}
        return 404, {"detail": "Not Found"}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class FakeNCCLEngine:
    """What vLLM's ``NCCLTrainerWeightTransferEngine`` does over its client, minus the NCCL broadcast:
    ``trainer_init`` sends the worker init payload (workers from rank_offset 1), ``send_weights`` runs
    start / update_weights (names, dtypes, shapes) / finish."""

    def __init__(self, init: dict, client, source):
        self.client, self.source, self.rounds = client, source, 0
        client.init_weight_transfer_engine({**init, "rank_offset": 1, "packed": True})

    def send_weights(self) -> None:
        self.client.start_weight_update()
        meta = {
            "names": [n for n, _ in self.source],
            "dtype_names": [str(t.dtype).split(".")[-1] for _, t in self.source],
            "shapes": [list(t.shape) for _, t in self.source],
        }
        self.client.update_weights(meta)
        self.client.finish_weight_update()
        self.rounds += 1


@pytest.fixture
def servers():
    made = [FakeVLLM(world=2), FakeVLLM(world=4), FakeVLLM(world=1)]
    yield made
    for s in made:
        s.close()


def _requests(n: int) -> list[Request]:
    return [Request(prompt=f"q{i}", params=SamplingParams(max_tokens=8), seed=1000 + i) for i in range(n)]


def test_requests_spread_over_replicas_and_skip_a_dead_one(servers):
    llm = ReplicatedLLM([s.url for s in servers], "m", concurrency=4, retries=1, timeout=5)
    out = llm.complete(_requests(30))
    assert [c.text for c in out] == [f"v0 seed {1000 + i}" for i in range(30)]  # request order, own seeds
    assert sum(s.served for s in servers) == 30 and all(s.served >= 5 for s in servers)
    assert llm.served == [s.served for s in servers]
    assert not hasattr(llm, "load_weights")  # RSFT then pushes nothing to a backend it cannot update
    servers[1].close()  # a replica goes away: its share goes to the others
    before = [servers[0].served, servers[2].served]
    again = llm.complete(_requests(12))
    assert [c.text for c in again] == [f"v0 seed {1000 + i}" for i in range(12)]
    assert servers[0].served + servers[2].served - sum(before) == 12
    assert server_root("http://h:8000/v1/") == "http://h:8000"


def test_weight_push_reaches_every_replica_in_one_group(servers):
    roots = [server_root(s.url) for s in servers]
    sync = WeightSync(
        roots,
        master_address="10.0.0.1",
        master_port=29600,
        engine_factory=FakeNCCLEngine,
        source_factory=lambda tensors: tensors,
    )
    # rank 0 = the trainer; the replicas' 2 + 4 + 1 workers follow, each replica from its own offset
    assert sync.world_size == 8 and sync.client.offsets == [1, 3, 7]
    llm = SyncedReplicas([s.url for s in servers], "m", sync=sync, concurrency=2, timeout=5)
    model = torch.nn.Linear(3, 2)
    for step in range(2):
        llm.complete(_requests(6))
        llm.load_weights(model.named_parameters())
        assert llm.version == step + 1 and llm.last_push_seconds is not None
    for s, offset in zip(servers, [1, 3, 7], strict=True):
        assert s.init == {
            "master_address": "10.0.0.1",
            "master_port": 29600,
            "world_size": 8,
            "rank_offset": offset,
            "packed": True,
        }
        assert (
            s.received
            == [{"names": ["weight", "bias"], "dtype_names": ["float32"] * 2, "shapes": [[2, 3], [2]]}] * 2
        )
        updates = [c for c in s.calls if c != "/v1/completions"]
        assert (
            updates
            == ["/init_weight_transfer_engine"]
            + [
                "/start_weight_update",
                "/update_weights",
                "/finish_weight_update",
            ]
            * 2
        )
        assert s.version == "2" and s.state == "serving"
    assert sync.engine.rounds == 2
    # the next samples come from the new weights on every replica
    assert {c.text.split()[0] for c in llm.complete(_requests(9))} == {"v2"}


def test_the_train_config_picks_replicas_and_the_ledger_gets_the_push_time(servers, tmp_path):
    from types import SimpleNamespace

    from whale_train.llm.replicas import make_replicas
    from whale_train.rsft import StepReport
    from whale_train.trainer import Run, TrainConfig

    urls = ",".join(s.url for s in servers[:2])
    config = TrainConfig.from_dict(  # a plain server has no weight phase to run (server mode)
        {"backend": "openai", "base_url": urls, "model": "m", "method": "harness-only"}
    )
    llm = Run._load_llm(SimpleNamespace(config=config))
    assert isinstance(llm, ReplicatedLLM) and [r.base_url for r in llm.replicas] == [
        s.url for s in servers[:2]
    ]
    with pytest.raises(ValueError, match="weight_sync needs master_address and master_port"):
        make_replicas([servers[0].url], "m", weight_sync={"master_address": "127.0.0.1"})
    with pytest.raises(ValueError, match="data-parallel-size"):
        TrainConfig.from_dict({"backend": "vllm", "data_parallel_size": 2})

    class Pushed:  # a backend that took this step's weights (SyncedReplicas, vLLM) and timed it
        version, last_push_seconds = 1, 0.25

    run = Run(
        TrainConfig.from_dict({"env": "whale/Math-v0", "method": "weight-only"}),
        tmp_path / "run",
        llm=Pushed(),
    )
    report = StepReport(0, 1, 4, 8, 0.5, 1.0, 3, 3, 30, 0.7, 1.0, 2.0, 0.1, True)
    run.rsft = SimpleNamespace(step=lambda: report, harness=None)
    signals, rollouts = run._weight_unit()
    assert rollouts == 8 and signals["push_seconds"] == 0.25
    report.updated = False  # a step without an update pushed nothing
    assert "push_seconds" not in run._weight_unit()[0]
