"""The shipped train configs: every file under configs/ loads and validates, every (domain, method) pair
has one, the methods of a domain differ only in what makes them that method, and every method runs end
to end on every domain (at smoke size, on the shipped model) with a ledger that adds up."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest

from tests.train.test_trainer import MODEL, SMOKE, ledger, units
from whale_train.domains import get_domain, registered
from whale_train.schedule import METHODS
from whale_train.trainer import Run, TrainConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

#: The task source of the smoke runs: small train/harness/test splits (chess 56 / 6 / 18 tasks, math
#: 57 / 15 / 8, search 57 / 12 / 11).
SMOKE_TASKS = "generated?difficulty=1&size=80"
#: configs/<domain>/ for every built-in domain (one shipping its harnesses; at collection, an adapter such as
#: whale/Verifiers-v0 ships none and no configs) -> its env and the smoke tasks.
DOMAINS = {d.name: (d.env_id, SMOKE_TASKS) for d in registered() if d.harness_dir}
GPU = {
    "math_whale": (get_domain("math").env_id, "Qwen/Qwen3.5-2B"),
    "search_whale": (get_domain("search").env_id, "Qwen/Qwen3.5-2B"),
    "chess_whale": (get_domain("chess").env_id, "Qwen/Qwen3.5-4B"),
}


def train_configs() -> list[Path]:
    """Every train config (configs/compare/ holds `whale compare` grids, tested with the compare command;
    configs/accelerate/ holds `accelerate launch` configs, tested in test_scale_accelerate.py; configs/paper/
    point at the paper's data files by path, tested over small files in test_paper_configs.py)."""
    return sorted(
        p
        for p in CONFIGS.rglob("*.yaml")
        if not {"compare", "accelerate", "paper"} & set(p.relative_to(CONFIGS).parts)
    )


@pytest.mark.parametrize("path", train_configs(), ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_config_loads_validates_and_fits_its_splits(path):
    config = TrainConfig.load(path)  # validates
    search = config.search  # the search options too (a MetaHarnessConfig, validated with the config)
    if config.model is None:  # the shipped tiny model: a higher rate collapses it
        assert config.rsft.learning_rate <= 2e-4
    sizes = {
        split: len(gym.make(config.env, split=split, **config.env_kwargs).unwrapped.task_ids)
        for split in ("train", "harness", "test")
    }
    assert sizes["harness"] >= search.harness_tasks, sizes
    assert sizes["test"] >= config.eval.limit, sizes
    assert sizes["train"] >= config.rsft.batch_tasks, sizes


def test_every_domain_and_method_has_a_config_differing_only_in_the_method():
    for domain, (env, _) in DOMAINS.items():
        base = TrainConfig.load(CONFIGS / domain / "base.yaml").to_dict()
        for method in METHODS:
            config = TrainConfig.load(CONFIGS / domain / f"{method}.yaml")
            assert (config.env, config.method, config.name) == (env, method, f"{domain}-{method}")
            # same budget, operators, evaluation and schedule thresholds as every other method
            # (whale's (E, I) in whale.yaml restate those of base.yaml)
            assert {**config.to_dict(), "name": "run", "method": "whale"} == base, (domain, method)
    folders = {**{d: (*METHODS, "base") for d in DOMAINS}, "gpu": (*GPU, "base")}
    for folder, names in folders.items():
        assert {p.stem for p in (CONFIGS / folder).glob("*.yaml")} == set(names), folder


def test_gpu_configs_use_vllm_bf16_and_the_papers_settings():
    for name, (env, model) in GPU.items():
        config = TrainConfig.load(CONFIGS / "gpu" / f"{name}.yaml")
        assert (config.env, config.model, config.backend, config.method) == (env, model, "vllm", "whale")
        assert config.rsft.bf16 is True and config.rsft.gradient_checkpointing
        assert config.rsft.learning_rate <= 1e-6
        assert (config.rsft.batch_tasks, config.search.harness_tasks, config.search.candidates) == (
            256,
            256,
            3,
        )
        assert config.eval.k == 8


#: Half the budget of SMOKE: still both phases for every method but the single-phase ones (6 units).
BUDGET = 48


def smoke_overrides(domain: str) -> list[str]:
    """The SMOKE settings of tests/train/test_trainer.py as ``--set`` overrides, with the domain's small tasks."""
    data = {k: v for k, v in SMOKE.items() if k != "env"}
    data.update(tasks=DOMAINS[domain][1], budget_rollouts=BUDGET)
    flat: list[str] = []
    for key, value in data.items():
        items = value.items() if isinstance(value, dict) else [(None, value)]
        for sub, v in items:
            flat.append(f"{key}.{sub}={json.dumps(v)}" if sub else f"{key}={json.dumps(v)}")
    return [*flat, f"model={MODEL}"]


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("domain", sorted(DOMAINS))
def test_every_method_runs_on_every_domain_and_the_ledger_adds_up(domain, method, tmp_path, monkeypatch):
    from whale_train.rsft.operator import RSFT

    config = TrainConfig.load(CONFIGS / domain / f"{method}.yaml", smoke_overrides(domain))
    assert (config.env, config.tasks, config.budget_rollouts) == (*DOMAINS[domain], BUDGET)
    written = []  # the checkpoints written (the model versions' and the resume ones)
    save = RSFT.save
    monkeypatch.setattr(RSFT, "save", lambda self, path: written.append(path.name) or save(self, path))
    summary = Run(config, tmp_path, log=lambda *_: None).run()
    events = ledger(tmp_path)
    us = units(events)
    saves = [name for name in written if name.startswith("resume-")]
    # one per weight unit: after a harness unit and at the end the state holds the same RSFT state
    assert len(saves) == len(set(saves)) == sum(u["phase"] == "weight" for u in us), (saves, us)
    end = json.loads((tmp_path / "state.json").read_text())
    assert end["resume_from"] == (saves[-1] if saves else None)
    assert us and events[0]["event"] == "start" and events[-1]["event"] == "stop"
    assert sum(u["rollouts"] for u in us) == us[-1]["rollouts_total"] == summary["rollouts"]
    assert summary["rollouts"] <= config.budget_rollouts and "budget" in events[-1]["reason"]
    expected = {"weight-only": {"weight"}, "harness-only": {"harness"}}.get(method, {"weight", "harness"})
    assert {u["phase"] for u in us} == expected
    evals = [e for e in events if e["event"] == "eval"]
    assert evals and all("rollouts_total" in e for e in evals) and summary["evals"] == len(evals)
    assert all(s["reason"] for s in events if s["event"] == "switch")
