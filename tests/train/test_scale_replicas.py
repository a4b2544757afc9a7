"""Requests spread over several ``vllm serve`` replicas, and the weight push to all of them through
vLLM's weight-transfer routes. The servers are test doubles of vLLM's HTTP surface that enforce the
rules the real server enforces, with its error bodies (checked against vLLM 0.32's own server by
tests/train/test_vllm_real_replicas.py: the order of the weight-update calls, the init and update fields, the
routes missing without dev mode); the NCCL broadcast itself needs GPUs and runs in
benchmarks/gpu_check_multi.sh."""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from tests.http_fake import send_json
from whale_train.llm.base import Request, SamplingParams
from whale_train.llm.replicas import ReplicatedLLM, SyncedReplicas, WeightSync, server_root

#: The fields of vLLM's ``NCCLWeightTransferInitInfo`` (required, optional) and update info.
INIT_FIELDS = ({"rank_offset", "world_size"}, {"master_address", "master_port", "nccl_unique_id_b64", "packed",
               "packed_buffer_size_bytes", "packed_num_buffers"})  # fmt: skip
UPDATE_FIELDS = {"names", "dtype_names", "shapes"}


def worker_error(message: str) -> tuple[int, dict]:
    """What vLLM's server answers when a worker raises (HTTP 500, the error on one line)."""
    text = f"Call to collective_rpc method failed: Worker failed with error '{message}', please check the stack trace above for the root cause"  # noqa: E501
    return 500, {"error": {"message": text, "type": "InternalServerError", "param": None, "code": 500}}


class FakeVLLM:
    """One ``vllm serve --weight-transfer-config '{"backend": "nccl"}'`` with ``world`` workers (without
    ``VLLM_SERVER_DEV_MODE=1`` when ``dev_mode`` is False: no weight-transfer routes). ``refuse_update``
    makes its workers fail every update; ``update_delay`` holds each update that many seconds (a worker
    waiting in the NCCL broadcast)."""

    def __init__(
        self, world: int = 1, dev_mode: bool = True, refuse_update: bool = False, update_delay: float = 0
    ):
        self.world, self.dev_mode = world, dev_mode
        self.refuse_update, self.update_delay = refuse_update, update_delay
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
                fake.calls.append(self.path)
                if self.path.startswith("/get_world_size") and fake.dev_mode:
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
            self.served += 1
            text = f"v{self.version} seed {body['seed']}"  # what a sample depends on: weights and seed
            usage = {"prompt_tokens": 3, "completion_tokens": 4}
            return 200, {"choices": [{"text": text, "finish_reason": "stop"}], "usage": usage}
        if not self.dev_mode:
            return 404, {"detail": "Not Found"}
        if path == "/init_weight_transfer_engine":
            info = body.get("init_info")
            if not isinstance(info, dict):
                return 400, {"error": {"message": "1 validation error:\n  body.init_info Field required"}}
            required, optional = INIT_FIELDS
            if required - set(info) or set(info) - required - optional:
                return worker_error(f"Invalid init_info for NCCLWeightTransferEngine: fields {sorted(info)}")
            self.init = info
            return 200, {"message": "Weight transfer initialized"}
        if path == "/start_weight_update":
            if self.state != "serving":
                return worker_error("start_weight_update called while a weight update is already active.")
            self.state = "updating"
            return 200, {"message": "Weight update started"}
        if path == "/update_weights":
            info = body.get("update_info")
            if not isinstance(info, dict):
                return 400, {"error": {"message": "1 validation error:\n  body.update_info Field required"}}
            if self.state != "updating":
                return worker_error("start_weight_update must be called before update_weights.")
            self.state = "serving"  # a failed update ends the session, a received one is loaded
            if set(info) - UPDATE_FIELDS:
                return worker_error(
                    f"Invalid update_info for NCCLWeightTransferEngine: fields {sorted(info)}"
                )
            if not (len(info["names"]) == len(info["dtype_names"]) == len(info["shapes"])):
                return worker_error("`dtype_names` should be of the same size as `names`")
            time.sleep(self.update_delay)
            if self.refuse_update:
                return worker_error(
                    "NCCL weight transfer not initialized. Call init_transfer_engine() first."
                )
            self.state = "updating"
            self.received.append(info)
            return 200, {"message": "Weights updated"}
        if path == "/finish_weight_update":
            if self.state != "updating":
                return worker_error("finish_weight_update called without a matching start_weight_update.")
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
            == ["/get_world_size", "/init_weight_transfer_engine"]
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


def test_a_replica_without_the_weight_transfer_routes_is_one_line_naming_the_flags():
    from whale_train.llm.replicas import WeightSyncError

    plain = FakeVLLM(dev_mode=False)  # `vllm serve` without VLLM_SERVER_DEV_MODE=1: the routes 404
    try:
        with pytest.raises(WeightSyncError) as err:
            WeightSync([server_root(plain.url)], master_address="127.0.0.1", master_port=29600)
        line = str(err.value)
        assert server_root(plain.url) in line and "HTTP 404: Not Found" in line and "\n" not in line
        assert "VLLM_SERVER_DEV_MODE=1" in line and "--weight-transfer-config" in line
    finally:
        plain.close()


def test_a_refused_push_is_one_line_at_once_and_stops_weight_sync():
    from whale_train.llm.replicas import WeightSyncError

    # one replica's workers refuse the update at once, the other's wait in the broadcast (8 s here)
    made = [FakeVLLM(world=1, refuse_update=True), FakeVLLM(world=2, update_delay=8)]
    try:
        roots = [server_root(s.url) for s in made]
        sync = WeightSync(
            roots, master_address="127.0.0.1", master_port=29600, engine_factory=FakeNCCLEngine,
            source_factory=lambda tensors: tensors,
        )  # fmt: skip
        llm = SyncedReplicas([s.url for s in made], "m", sync=sync, timeout=5)
        model = torch.nn.Linear(3, 2)
        start = time.monotonic()
        with pytest.raises(WeightSyncError) as err:
            llm.load_weights(model.named_parameters())
        assert time.monotonic() - start < 4  # the refusal comes back without waiting for the other
        line = str(err.value)
        assert line.startswith("weight push 1 to 2 replica(s): ") and "\n" not in line
        assert f"{roots[0]}/update_weights: HTTP 500: " in line  # the replica and route that refused
        assert "NCCL weight transfer not initialized" in line and '{"error"' not in line  # the message
        assert "restart the replicas, then the run with --resume" in line
        assert llm.version == 0 and sync.engine is None
        calls = len(made[0].calls)
        with pytest.raises(WeightSyncError, match="weight sync stopped"):  # no second try on a broken group
            llm.load_weights(model.named_parameters())
        assert len(made[0].calls) == calls
    finally:
        for s in made:
            s.close()


def test_weight_sync_is_refused_before_the_run_when_this_process_cannot_join_the_group(servers, monkeypatch):
    from whale_train.llm.replicas import WeightSyncError, make_replicas, nccl_trainer_problem

    urls = [s.url for s in servers[:2]]
    sync = {"master_address": "127.0.0.1", "master_port": 29600}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # also on a GPU machine with the gpu extra
    problem = nccl_trainer_problem()  # no vLLM (this venv), or no CUDA device
    assert problem is not None and "weight sync needs" in problem
    with pytest.raises(WeightSyncError) as err:
        make_replicas(urls, "m", weight_sync=sync)
    assert str(err.value) == f"backend_options.weight_sync: {problem}"
    assert isinstance(err.value, ValueError)  # `whale train` reports it as one line before the run
    assert all(s.calls == [] for s in servers)  # no replica was contacted
    # a push on the default (vLLM) engine stops in the trainer too, before any replica's rendezvous
    plain = WeightSync([server_root(u) for u in urls], master_address="127.0.0.1", master_port=29600)
    with pytest.raises(WeightSyncError, match="^weight sync needs"):
        plain.push(torch.nn.Linear(3, 2).named_parameters(), 1)
    assert all(s.calls == ["/get_world_size"] for s in servers[:2]) and plain.failed is None


def test_vllm_error_bodies_become_one_line():
    from whale_train.llm.replicas import _server_message

    status, body = worker_error("Invalid update_info for NCCLWeightTransferEngine: x")
    assert _server_message(json.dumps(body)) == (
        "Call to collective_rpc method failed: Worker failed with error 'Invalid update_info for "
        "NCCLWeightTransferEngine: x' (stack trace in the server's log)"
    )
    validation = {"error": {"message": "1 validation error:\n  {'loc': 'body.update_info'}", "code": 400}}
    assert _server_message(json.dumps(validation)) == "1 validation error: {'loc': 'body.update_info'}"
    assert _server_message('{"detail": "Not Found"}') == "Not Found"
    assert _server_message("<html>\n bad gateway\n</html>") == "<html> bad gateway </html>"


def test_whale_train_with_weight_sync_this_process_cannot_do_stops_in_one_line(servers, tmp_path):
    import subprocess
    import sys

    urls = ",".join(s.url for s in servers[:2])
    cmd = [sys.executable, "-m", "whale_train.cli", "train", "configs/math/whale.yaml", "--set", "backend=openai",
           "--set", "model=m", "--set", f"base_url={urls}", "--out", str(tmp_path / "run"),
           "--set", "backend_options={weight_sync: {master_address: 127.0.0.1, master_port: 29600}}"]  # fmt: skip
    out = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""},
    )
    assert out.returncode == 2, out.stderr[-2000:]
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: backend_options.weight_sync: weight sync needs"), (
        lines
    )
    assert all(s.calls == [] for s in servers)  # stopped before any replica was contacted


def test_a_replica_in_dev_mode_without_the_transfer_config_gets_the_flags_too():
    from whale_train.llm.openai_compat import OpenAIError
    from whale_train.llm.replicas import _sync_error

    # what vLLM's worker raises at the first init when the server lacks --weight-transfer-config
    status, body = worker_error(
        "Weight transfer not configured. Please set weight_transfer_config to enable weight transfer."
    )
    exc = OpenAIError(f"http://a:8000/init_weight_transfer_engine: HTTP {status}: {body['error']['message']}")
    line = str(_sync_error(exc, "weight push 1 to 1 replica(s)"))
    assert line.endswith(
        '(start each replica with VLLM_SERVER_DEV_MODE=1 and --weight-transfer-config \'{"backend": "nccl"}\')'
    )


def test_a_push_that_fails_mid_run_ends_whale_train_with_its_one_line(tmp_path, monkeypatch, capsys):
    from whale_train import cli
    from whale_train.llm.replicas import WeightSyncError
    from whale_train.trainer import Run

    line = (
        "weight push 2 to 2 replica(s): http://a:8000/update_weights: HTTP 500: Call to collective_rpc "
        "method failed; weight sync stopped: restart the replicas, then the run with --resume"
    )

    def push_fails(self):  # what SyncedReplicas.load_weights raises out of an RSFT step
        raise WeightSyncError(line)

    monkeypatch.setattr(Run, "run", push_fails)
    rc = cli.main(["train", "configs/math/whale.yaml", "--out", str(tmp_path / "run"), "--no-report"])
    out = capsys.readouterr()
    text = " ".join((out.out + out.err).split())
    assert rc == 1 and f"error: {line}" in text and "Traceback" not in text
