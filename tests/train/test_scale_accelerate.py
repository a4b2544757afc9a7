"""The weight phase under ``accelerate launch``: two CPU processes (DDP over gloo, or FSDP2 with the
shipped configs/accelerate/fsdp2.yaml), rank 0 driving and both training, give the same update as one
process on the same global batch, with the AdamW state carried across RSFT steps by the Trainer's own
optimizer (no pre-built one); an FSDP2 checkpoint (gathered from both ranks' shards) resumes to the same
weights; a whole ``whale train`` on two ranks gives the run of one process; when a rank dies, the
other stops at once with a clear error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.train.conftest import SMOKE_KILLED
from whale_train.distributed import per_device_batch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "accelerate_equivalence.py"


CPU_FSDP = ROOT / "tests" / "cpu_fsdp"  # its sitecustomize lets accelerate run FSDP on CPU ranks


def _env() -> dict[str, str]:
    # no GPU even where there is one: accelerate's multi-process launcher then runs DDP on CPUs (gloo),
    # or FSDP2 with tests/cpu_fsdp first on the path
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(CPU_FSDP), os.environ.get("PYTHONPATH", "")) if p),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "CUDA_VISIBLE_DEVICES": "",
        "OMP_NUM_THREADS": "1",
    }


# 7 examples in global batches of 4: two optimizer steps per RSFT step, the second one a partial batch
SHAPE = ["--examples", "7", "--batch", "4"]


def _one_process(out: Path, *extra: str, keep: int = 1) -> dict:
    cmd = [sys.executable, str(SCRIPT), str(out), "--keep-optimizer", str(keep), *SHAPE, *extra]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out / "result.pt")


FSDP2 = ROOT / "configs" / "accelerate" / "fsdp2.yaml"


def _accelerate(out: Path, processes: int, *extra: str, config: Path | None = None) -> dict:
    # `accelerate launch --cpu` starts one process whatever --num_processes says; the multi-process
    # launcher (torchrun underneath) with no visible GPU is how accelerate runs several CPU ranks
    accelerate = Path(sys.executable).parent / "accelerate"
    how = (
        ["--config_file", str(config)]
        if config
        else ["--multi_gpu", "--num_machines", "1", "--dynamo_backend", "no"]
    )
    cmd = [
        str(accelerate), "launch", *how, "--num_processes", str(processes), "--mixed_precision", "no",
        "--main_process_port", "29531", str(SCRIPT), str(out), *SHAPE, *extra,
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out / "result.pt")


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> tuple[dict, Path, dict]:
    """The one-process reference of the DDP and FSDP2 tests (a process of its own, about 7 s of CPU), run
    once: its result, the checkpoint it saved after the first call (``--save``, which changes no
    weight), and the result of the same calls with a new AdamW each step (``--fresh``, in that process)."""
    out = tmp_path_factory.mktemp("one") / "one"
    one = _one_process(out, "--save", str(out / "checkpoint"), "--fresh", str(out / "fresh"))
    return one, out / "checkpoint", torch.load(out / "fresh" / "result.pt")


def _relative(a: dict, b: dict, base: dict) -> float:
    """|a - b| / |a - base| over all weights: how far two updates of ``base`` differ, relative to the update."""
    num = sum(((a[k] - b[k]) ** 2).sum() for k in a) ** 0.5
    den = sum(((a[k] - base[k]) ** 2).sum() for k in a) ** 0.5
    return float(num / den)


@pytest.mark.slow
def test_two_processes_give_the_update_of_one(tmp_path, one_process):
    from transformers import AutoModelForCausalLM

    from whale_train.llm import default_model

    base = AutoModelForCausalLM.from_pretrained(default_model(), dtype=torch.float32).state_dict()
    one, _, fresh = one_process  # fresh: a new AdamW each step, what carrying the state avoids
    two = _accelerate(tmp_path / "two", 2)
    assert (one["world_size"], two["world_size"]) == (1, 2)
    # the Trainer's own optimizer kept its state across the two train() calls, on every rank count
    assert one["adam_steps"] and set(one["adam_steps"]) == {4} and set(two["adam_steps"]) == {4}
    update = sum(((one["weights"][k] - base[k]) ** 2).sum() for k in base) ** 0.5
    assert update > 1e-2  # the two steps moved the weights
    # the same update within float tolerance (per-rank padding changes the kernels' rounding, and AdamW
    # divides by the root of tiny second moments); a missing optimizer state is 100x further off
    assert _relative(one["weights"], two["weights"], base) < 1e-3
    assert _relative(one["weights"], fresh["weights"], base) > 0.1


@pytest.mark.slow
def test_fsdp2_on_two_ranks_gives_the_update_of_one_and_its_checkpoint_resumes(tmp_path, one_process):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from whale_train.llm import default_model

    base = AutoModelForCausalLM.from_pretrained(default_model(), dtype=torch.float32).state_dict()
    checkpoint = tmp_path / "checkpoint"
    one, one_checkpoint, _ = one_process
    two = _accelerate(tmp_path / "two", 2, "--save", str(checkpoint), config=FSDP2)
    # each rank held about half of every parameter: the model really was sharded
    assert two["world_size"] == 2 and 0.4 < two["held"] < 0.6 and one["held"] == 1.0
    assert set(two["adam_steps"]) == {4}  # the sharded AdamW state carried across the two train() calls
    assert _relative(one["weights"], two["weights"], base) < 1e-4
    # the checkpoint after the first call is what one process writes: whole tensors, whole AdamW state
    saved = load_file(str(checkpoint / "model.safetensors"))
    written = load_file(str(one_checkpoint / "model.safetensors"))  # one process's save
    assert saved.keys() == written.keys() and all(saved[k].shape == written[k].shape for k in saved)
    state = torch.load(checkpoint / "rsft_state.pt", weights_only=False)["optimizer"]["state"]
    shapes = {tuple(v.shape) for v in base.values()}
    assert len(state) > 10 and all(tuple(v["exp_avg"].shape) in shapes for v in state.values())
    assert {int(v["step"]) for v in state.values()} == {2}  # 7 examples in batches of 4: two AdamW steps
    assert not any(type(v["exp_avg"]).__name__ == "DTensor" for v in state.values())
    # two new ranks resume from it (each cuts its share out of the whole state) and end where the
    # uninterrupted run ended
    resumed = _accelerate(tmp_path / "resumed", 2, "--resume", str(checkpoint), config=FSDP2)
    assert set(resumed["adam_steps"]) == {4}
    assert _relative(two["weights"], resumed["weights"], base) < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("killed", [0, 1], ids=["rank 0 killed", "follower killed"])
def test_a_rank_stops_at_once_when_the_other_dies(tmp_path, killed):
    """`whale train` on two ranks: when one rank is killed, the other stops within seconds with a one-line
    error naming what was lost (rank 0's says how to resume), instead of waiting out the 12-hour timeout."""
    import signal
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**_env(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2"}
    rank = lambda r: {**env, "RANK": str(r), "LOCAL_RANK": str(r)}  # noqa: E731  (what torchrun sets)
    joins = "from whale_train import distributed; distributed._group(); print('ready', flush=True); input()"
    victim = subprocess.Popen(
        [sys.executable, "-c", joins],
        env=rank(killed),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    survivor = subprocess.Popen(
        [sys.executable, "-m", "whale_train.cli", "train", "smoke", "--no-report", "--out", str(tmp_path / "run")],
        env=rank(1 - killed), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert victim.stdout.readline().strip() == "ready"  # both ranks are in the process group
        time.sleep(
            1.0
        )  # the survivor waits in a collective (the follower's command loop, rank 0's first step)
        victim.send_signal(signal.SIGKILL)
        start = time.monotonic()
        out, err = survivor.communicate(timeout=120)
        assert time.monotonic() - start < 60
    finally:
        for proc in (victim, survivor):
            if proc.poll() is None:
                proc.kill()
    assert survivor.returncode == 1 and "Traceback" not in err
    if killed == 0:
        assert "rank 1: rank 0 (the driver) is gone" in err
    else:
        assert "rank 0: a training rank is gone" in out and "--resume` continues" in out


def test_per_device_batch_splits_the_global_batch():
    assert per_device_batch(16, 1) == 16 and per_device_batch(16, 4) == 4
    with pytest.raises(ValueError, match="not a multiple of the 3 training processes"):
        per_device_batch(16, 3)


@pytest.mark.slow
@pytest.mark.xdist_group("smoke-grid")  # the worker that builds `smoke_grid` (tests/train/conftest.py)
def test_whale_train_on_two_ranks_is_the_run_of_one_with_ddp_and_fsdp2(tmp_path, smoke_grid):
    import yaml
    from safetensors.torch import load_file

    from whale_train.compare import CompareConfig, plan

    spec = plan(CompareConfig.load(ROOT / "configs" / "compare" / "smoke.yaml"))[0]  # math, whale, seed 0
    # the run of one process: the smoke grid's run of this config (a straight one: not the run it kills)
    one = smoke_grid.out / "runs" / spec.config.name
    assert spec.config.name not in (SMOKE_KILLED, *smoke_grid.first["invocation"]["failed"])
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(spec.config.to_dict()))
    train = ["-m", "whale_train.cli", "train", str(config), "--no-report", "--out"]
    accelerate = Path(sys.executable).parent / "accelerate"
    launchers = {  # DDP; FSDP2 with the shipped config (rank 0 then samples from an unsharded copy)
        "ddp": ["--multi_gpu", "--num_machines", "1", "--dynamo_backend", "no"],
        "fsdp2": ["--config_file", str(FSDP2)],
    }
    for name, how in launchers.items():
        cmd = [
            str(accelerate), "launch", *how, "--num_processes", "2", "--mixed_precision", "no",
            "--main_process_port", "29533", *train, str(tmp_path / name),
        ]  # fmt: skip
        two = subprocess.run(cmd, env=_env(), capture_output=True, text=True, cwd=ROOT)
        assert two.returncode == 0, two.stderr[-3000:]

    def ledger(run: Path) -> list[dict]:
        # rank 0's loss is its own share's; wall-clock fields differ; `cached`: which run of the grid
        # scored a shared evaluation first
        def strip(x):
            if isinstance(x, dict):
                return {
                    k: strip(v)
                    for k, v in x.items()
                    if not k.endswith("seconds") and k not in ("loss", "cached")
                }
            return x

        return [strip(json.loads(line)) for line in (run / "ledger.jsonl").read_text().splitlines()]

    # rank 0 drove rollouts, evaluations and the ledger alone; the other rank only trained
    versions = [p for p in (tmp_path / "ddp" / "checkpoints").iterdir() if p.name.isdigit()]
    assert len(versions) >= 3  # the weights moved three times or more
    from whale_train.llm import default_model

    base = load_file(str(Path(default_model()) / "model.safetensors"))
    (final,) = (one / "checkpoints").glob("resume-*")  # the weights the run ended with
    a = load_file(str(final / "model.safetensors"))
    for name in launchers:
        events = ledger(tmp_path / name)
        assert events == ledger(one) and events[-1]["event"] == "stop", name
        b = load_file(str(tmp_path / name / "checkpoints" / final.name / "model.safetensors"))
        assert a.keys() == b.keys() and _relative(a, b, base) < 1e-3, name


@pytest.mark.slow
def test_a_one_group_adamw_state_of_an_older_checkpoint_carries_on():
    """Resume checkpoints written before RSFT let the Trainer build its optimizer hold the state of one
    AdamW over all parameters; the Trainer's optimizer (decay / no-decay groups) takes it over."""
    sys.path.insert(0, str(SCRIPT.parent))
    from accelerate_equivalence import examples
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from whale_train.llm import default_model
    from whale_train.rsft import RSFTConfig, RSFTUpdater

    tokenizer = AutoTokenizer.from_pretrained(default_model())
    model = AutoModelForCausalLM.from_pretrained(default_model(), dtype=torch.float32)
    params = [p for p in model.parameters() if p.requires_grad]
    old = torch.optim.AdamW(params, lr=1e-4)
    for p in params:
        p.grad = torch.full_like(p, 1e-3)
    old.step()
    old.step()  # two steps of the old optimizer
    model.zero_grad(set_to_none=True)
    trainer = RSFTUpdater(model, tokenizer, RSFTConfig(learning_rate=1e-4, train_batch_size=8, bf16=False))
    trainer.optimizer_state = old.state_dict()
    trainer.train(examples(tokenizer, 0, 8))  # one optimizer step
    steps = {int(s["step"]) for s in trainer.optimizer_state["state"].values()}
    assert steps == {3} and len(trainer.optimizer_state["param_groups"]) == 2
