"""The WHALE trainer: every method end to end, ledger arithmetic, phase order, resume after SIGKILL,
config handling, and the report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.crash import crash_env
from tests.folder_archive import unpack
from tests.warm import whale_train
from whale_train.llm import SHIPPED_MODEL
from whale_train.report import write_report
from whale_train.trainer import Run, TrainConfig

MODEL = str(SHIPPED_MODEL)  # the shipped model stops where it should: short, realistic rollouts
#: A run folder that an older ``whale train`` made and a SIGKILL stopped (see the test that resumes it),
#: packed by ``tests/folder_archive.py``.
OLD_RUN = Path(__file__).resolve().parents[1] / "fixtures" / "old_run.tar.gz"

SMOKE = {
    "env": "whale/Math-v0",
    "tasks": "generated?difficulty=1&size=80",
    "budget_rollouts": 96,
    "schedule": {
        "weight_epochs": 0.2,
        "harness_iterations": 2,
        "min_weight_epochs": 0.1,
        "window": 1,
        "patience": 1,
        "min_iterations": 1,
        "iteration_patience": 1,
        "max_iterations": 2,
        "fst_weight_epochs": 0.1,
        "fst_iterations": 2,
    },
    "rsft": {"batch_tasks": 4, "samples": 2},
    "search": {"candidates": 1, "harness_tasks": 4, "frontier_size": 1, "check_tasks": 2, "concurrency": 8},
    "eval": {"k": 1, "limit": 4},
    "concurrency": 8,
}


def smoke(model_dir: str, **overrides) -> TrainConfig:
    data = json.loads(json.dumps(SMOKE))
    for key, value in overrides.items():
        if isinstance(value, dict):
            data.setdefault(key, {}).update(value)
        else:
            data[key] = value
    return TrainConfig.from_dict({"model": model_dir, **data})


def ledger(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]


#: The fields of a ledger line that a killed-and-resumed run must reproduce (times and ids may differ).
COMPARABLE = (
    "event",
    "phase",
    "rollouts",
    "rollouts_total",
    "model_version",
    "harness",
    "mean",
    "to",
    "reason",
)


def comparable(events: list[dict], skip: tuple[str, ...] = ("start",)) -> list[dict]:
    """``events`` (a ledger) reduced to :data:`COMPARABLE`, without the events named in ``skip``."""
    return [{k: e[k] for k in COMPARABLE if k in e} for e in events if e["event"] not in skip]


def train_cli(config: Path, out: Path, *, resume: bool = False, env: dict | None = None, warm: bool = True):
    """``whale train CONFIG --out OUT --no-report [--resume]`` in a subprocess, offline: forked warm
    (``tests/warm.py``: stdout and stderr together in ``stdout``) unless ``warm`` is false."""
    args = [str(config), "--out", str(out), "--no-report", *(["--resume"] if resume else [])]
    if warm:
        return whale_train(args, env)
    return subprocess.run(
        [sys.executable, "-m", "whale_train.cli", "train", *args],
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
        capture_output=True,
        text=True,
    )


def units(events):
    return [e for e in events if e["event"] == "unit"]


# Every method on every domain, from the shipped configs: tests/train/test_configs.py.


class PushedWeights:
    """A backend like vLLM: it samples with a model of its own and takes trained weights only through
    ``load_weights``, so the trainer trains a separate transformers copy and pushes after each update."""

    def __init__(self, path: str):
        from whale_train.llm.hf import TransformersLLM

        self.inner = TransformersLLM(path)
        self.name, self.tokenizer, self.version, self.pushes = path, self.inner.tokenizer, 0, 0

    def __getattr__(self, name):  # complete, score, has_chat_template, ...
        return getattr(self.inner, name)

    def load_weights(self, named_tensors) -> None:
        self.inner.model.load_state_dict({k: v.detach().clone() for k, v in named_tensors}, strict=False)
        self.version += 1
        self.pushes += 1


def test_a_backend_that_takes_pushed_weights_trains_a_copy_and_gets_its_weights(tmp_path):
    import torch

    config = smoke(MODEL, method="weight-only", budget_rollouts=16)
    llm = PushedWeights(MODEL)
    original = {k: v.clone() for k, v in llm.inner.model.state_dict().items()}
    run = Run(config, tmp_path, llm=llm, log=lambda *_: None)
    run.run()
    trained = run.rsft.trainer.model
    assert trained is not llm.inner.model and llm.pushes >= 1
    assert units(ledger(tmp_path))[-1]["model_version"] == llm.version == llm.pushes
    sampler = llm.inner.model.state_dict()
    assert all(torch.equal(p, sampler[k]) for k, p in trained.named_parameters())
    assert any(not torch.equal(p, original[k]) for k, p in trained.named_parameters())
    # resume: the engine of a new process gets the restored weights
    fresh = PushedWeights(MODEL)
    Run(config, tmp_path, llm=fresh, resume=True, log=lambda *_: None)
    assert all(torch.equal(p, fresh.inner.model.state_dict()[k]) for k, p in trained.named_parameters())
    assert fresh.version == llm.version


def _whale_80(path: Path) -> Path:
    """``path``: the config of method whale on SMOKE at a budget of 80 rollouts (8 units)."""
    path.write_text(yaml.safe_dump({"model": MODEL, "method": "whale", **SMOKE, "budget_rollouts": 80}))
    return path


@pytest.fixture(scope="module")
def straight_whale_run(tmp_path_factory) -> Path:
    """``whale train`` of :func:`_whale_80`, run straight (no kill) once: the phase-order test reads its
    ledger and the random-kill test compares its killed run with it (the root conftest puts the tests of a
    module-scoped fixture on one pytest-xdist worker). Read only."""
    tmp = tmp_path_factory.mktemp("straight-whale")
    result = train_cli(_whale_80(tmp / "smoke.yaml"), tmp / "straight")
    assert result.returncode == 0, result.stdout + result.stderr
    return tmp / "straight"


def test_whale_phase_order_and_rescore_first(straight_whale_run):
    us = units(ledger(straight_whale_run))
    order = "".join(u["phase"][0] for u in us)
    # E = 0.2 epoch of the train split (14 steps of 4 tasks) = 3 RSFT steps, then I = 2 harness iterations
    # (the re-scoring of the incoming harness counts as the first)
    assert order.startswith("wwwhhwwwhh"), order
    harness = [u for u in us if u["phase"] == "harness"]
    firsts = [
        u for i, u in enumerate(us) if u["phase"] == "harness" and (i == 0 or us[i - 1]["phase"] != "harness")
    ]
    assert all(u["signals"]["kind"] == "rescore" for u in firsts)
    assert all(u["signals"]["kind"] == "iteration" for u in harness if u not in firsts)


def test_runs_sharing_an_eval_cache_score_each_weights_and_harness_once(tmp_path):
    """``eval_cache``: a second run of the same config reads every evaluation from the cache (its eval events
    say ``cached``, its eval files hold the same numbers); each model version is its own entry; and a run
    without the cache computes the same numbers that the cache holds."""
    cache = tmp_path / "cache"
    config = smoke(
        MODEL,
        method="weight-only",
        budget_rollouts=16,
        eval={"k": 2, "limit": 4, "every": 8, "select_limit": 2, "select_k": 1},
    )
    quiet = {"log": lambda *_: None}
    Run(config, tmp_path / "a", eval_cache=cache, **quiet).run()
    Run(config, tmp_path / "b", eval_cache=cache, **quiet).run()
    Run(config, tmp_path / "c", **quiet).run()
    evals = {r: [e for e in ledger(tmp_path / r) if e["event"] == "eval"] for r in "abc"}
    assert [e["model_version"] for e in evals["a"]] == [0, 1, 2]
    assert len(list(cache.glob("*.json"))) == len(list(cache.glob("*.traces.jsonl"))) == 3
    assert not any(e.get("cached") for e in evals["a"] + evals["c"])
    assert all(e["cached"] for e in evals["b"])
    numbers = lambda events: [(e["mean"], e["se"], e["select_mean"]) for e in events]  # noqa: E731
    assert numbers(evals["a"]) == numbers(evals["b"]) == numbers(evals["c"])
    for path in sorted((tmp_path / "a" / "eval").iterdir()):
        twin = tmp_path / "b" / "eval" / path.name
        assert twin.exists(), twin
        if path.suffix == ".json":
            assert json.loads(twin.read_text()) == json.loads(path.read_text())


@pytest.mark.slow
def test_a_run_killed_at_random_points_resumes_to_the_same_ledger_and_archive(tmp_path, straight_whale_run):
    config = _whale_80(tmp_path / "smoke.yaml")

    def train(out: Path, crash: str | None = None, resume: bool = False) -> int:
        return train_cli(config, out, resume=resume, env=crash_env(crash) if crash else {}).returncode

    straight = straight_whale_run  # the same config, run without a kill (exit 0)
    # Kill points across both phases (units 0-2 weight, 3-4 harness, 5-7 weight): at a unit's start, after
    # its work but before the ledger line, and between the checkpoint and state.json (``before_state@n``
    # fires once n units are done). Each point lies after where the previous resume restarts.
    crashes = [
        "unit_start@0",
        "unit_done@1",
        "before_state@2",
        "unit_start@3",
        "unit_done@4",
        "before_state@5",
        "unit_done@6",
    ]
    out = tmp_path / "crashed"
    for i, point in enumerate(crashes):
        assert train(out, point, resume=i > 0) == -9, point
    assert train(out, resume=True) == 0

    assert comparable(ledger(out)) == comparable(ledger(straight))

    def archive(run: Path):
        return {p.parent.name: p.read_text() for p in sorted((run / "archive").glob("*/harness.py"))}

    assert archive(out) == archive(straight) and archive(out)


def test_a_run_folder_of_an_older_trainer_resumes_elsewhere_with_todays_code(tmp_path, monkeypatch):
    """``tests/fixtures/old_run.tar.gz`` packs a real run folder, made by ``whale train`` before the trainer
    became the ``whale_train.trainer`` package: method whale on the SMOKE settings (LoRA of rank 2 and no saved
    model versions, so its checkpoints are small; report_to none), under ``WHALE_SPLIT_SECRET=old-run-fixture``,
    SIGKILLed after unit 4's checkpoint and before its state.json (``tests/faults``: ``before_state@5``).
    So its ledger holds a line past state.json's ``ledger_lines`` and two resume checkpoints. One edit: the
    adapter's ``base_model_name_or_path`` (PEFT writes the model's absolute path; a resume never reads it)
    is ``whale_train/models/tiny``. Copied to another folder (a run folder is relocatable), today's code
    continues it: the kept ledger is untouched, the cut unit reruns to the same line, units and rollouts
    count on, the weights go on from the checkpoint's version, and the run stops and reports."""
    monkeypatch.setenv("WHALE_SPLIT_SECRET", "old-run-fixture")
    run_dir = unpack(OLD_RUN, tmp_path / "elsewhere")
    assert run_dir == tmp_path / "elsewhere" / "old_run"
    before = ledger(run_dir)
    state = json.loads((run_dir / "state.json").read_text())
    kept = state["ledger_lines"]
    assert (state["units"], kept, len(before)) == (4, 9, 10)  # the fixture as made

    config = TrainConfig.load(run_dir / "config.yaml")
    summary = Run(config, run_dir, resume=True, log=lambda *_: None).run()

    after = ledger(run_dir)
    assert after[:kept] == before[:kept]
    new = units(after[kept:])
    assert [u["unit"] for u in new] == list(range(4, 4 + len(new))) and len(new) >= 3
    rerun, cut = dict(new[0]), dict(before[kept])  # the unit the kill cut short, rerun from its stored report
    assert rerun.pop("seconds") >= 0 and cut.pop("seconds") >= 0 and rerun == cut
    total = state["schedule"]["rollouts"]
    for u in new:
        total += u["rollouts"]
        assert u["rollouts_total"] == total, u
    weight = [u for u in new if u["phase"] == "weight"]
    assert weight and weight[0]["model_version"] == state["model_version"] + 1  # restored, not restarted
    assert after[-1]["event"] == "stop" and summary["rollouts"] == total <= config.budget_rollouts
    evals = [(e["model_version"], e["harness"]) for e in after if e["event"] == "eval"]
    assert len(evals) == len(set(evals)) and len(evals) > 2  # nothing scored twice, new versions scored
    end = json.loads((run_dir / "state.json").read_text())
    assert end["units"] == 4 + len(new) and end["ledger_lines"] == len(after)
    assert [p.name for p in (run_dir / "checkpoints").glob("resume-*")] == [end["resume_from"]]
    assert "test_sets" in json.loads((run_dir / "splits.json").read_text())
    report = write_report([run_dir])
    assert report == run_dir / "report.md" and "| old_run | whale |" in report.read_text()


def test_config_overrides_and_errors(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("method: adaptive\nrsft:\n  batch_tasks: 8\n")
    config = TrainConfig.load(path, ["rsft.learning_rate=5e-5", "schedule.window=4", "seed=3"])
    assert (
        config.method,
        config.rsft.batch_tasks,
        config.rsft.learning_rate,
        config.schedule.window,
        config.seed,
    ) == (
        "adaptive",
        8,
        5e-5,
        4,
        3,
    )
    with pytest.raises(ValueError, match="^--set lr: unknown field; known: "):
        TrainConfig.load(None, ["lr=3"])
    with pytest.raises(ValueError, match=r"^--set rsft\.lr: unknown field; did you mean rsft\.lora\?$"):
        TrainConfig.load(None, ["rsft.lr=3"])
    with pytest.raises(ValueError, match="unknown method"):
        TrainConfig.load(None, ["method=magic"])
    path.write_text("search:\n  candidate: 2\n")  # the search section is a MetaHarnessConfig
    with pytest.raises(
        ValueError, match=rf"^{path}: search\.candidate: unknown field; did you mean search\.candidates\?$"
    ):
        TrainConfig.load(path)
    assert TrainConfig.load(None, ["search.candidates=2"]).search.candidates == 2


def test_an_existing_run_needs_resume_and_the_same_config(tmp_path):
    Run(smoke(MODEL, method="weight-only", budget_rollouts=8), tmp_path, log=lambda *_: None).run()
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["budget_rollouts"] == 8
    with pytest.raises(FileExistsError, match="--resume"):
        Run(smoke(MODEL, method="weight-only", budget_rollouts=8), tmp_path)
    with pytest.raises(ValueError, match="differs"):
        Run(smoke(MODEL, method="weight-only", budget_rollouts=16), tmp_path, resume=True)


def test_a_second_writer_of_a_run_directory_is_refused_in_one_line(tmp_path):
    """Two `whale train` on one folder would interleave their units in one ledger (a killed grid whose
    runs went on, a resume started twice): the second is refused, naming the first one's pid; the lock
    goes with its holder, so a killed run leaves nothing stale."""
    out = tmp_path / "run"
    config = tmp_path / "smoke.yaml"
    config.write_text(
        yaml.safe_dump({"model": MODEL, "method": "weight-only", **SMOKE, "budget_rollouts": 8})
    )
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from whale_train.files import hold_folder; hold_folder({str(out)!r}, "
            "'.train.lock', 'whale train'); print('held', flush=True); input()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        second = train_cli(config, out, warm=False)
        assert second.returncode == 2, second.stderr
        assert f"another whale train (pid {holder.pid}) is writing to {out}" in second.stderr
        assert len(second.stderr.strip().splitlines()) == 1 and "Traceback" not in second.stderr
        assert not (out / "ledger.jsonl").exists()
    finally:
        holder.kill()
        holder.wait()
    again = train_cli(config, out)  # its holder is gone
    assert again.returncode == 0, again.stdout
    assert units(ledger(out))


def test_report_writes_markdown_and_plots(tmp_path):
    for method in ("whale", "weight-only"):
        Run(smoke(MODEL, method=method, budget_rollouts=40), tmp_path / method, log=lambda *_: None).run()
    path = write_report([tmp_path / "whale", tmp_path / "weight-only"], tmp_path / "report")
    text = path.read_text()
    assert "| whale | whale |" in text and "| weight-only | weight-only |" in text
    for png in ("accuracy_vs_rollouts.png", "phase_timeline.png", "lineage_whale.png"):
        assert (tmp_path / "report" / "plots" / png).stat().st_size > 1000


def test_harness_only_stops_when_its_proposer_has_nothing_left(tmp_path):
    """A prompt-only proposer runs out of edits; its empty iterations cost no rollouts, so without the
    "search exhausted" stop a harness-only run would never spend its budget (it looped in the grid)."""
    cfg = smoke(MODEL, method="harness-only", budget_rollouts=100000, search={"prompt_only": True})
    Run(cfg, tmp_path, log=lambda *_: None).run()
    events = ledger(tmp_path)
    stop = [e for e in events if e["event"] == "stop"]
    assert len(stop) == 1 and "search exhausted" in stop[0]["reason"], stop
    empty = [
        u for u in units(events) if u["signals"].get("kind") == "iteration" and not u["signals"]["candidates"]
    ]
    assert len(empty) == 3 and all(u["rollouts"] == 0 for u in empty)
    assert sum(u["rollouts"] for u in units(events)) < 100000
