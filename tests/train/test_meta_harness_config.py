"""The proposer's settings, nested per kind (``search.llm``, ``search.agent``, ``search.claude_code``), and
the flat keys they replace (``search.llm_model``, ...): still read from files, ``--set``, the constructor
and run folders made before the change, each with a one-line notice naming the new key."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import warnings

import pytest
import yaml

from whale_train.config_io import ConfigError, RenamedKey, describe
from whale_train.meta_harness.config import (
    RENAMED,
    AgentProposerConfig,
    ClaudeCodeConfig,
    LLMProposerConfig,
    MetaHarnessConfig,
)

#: The settings both forms below write: the ``search:`` keys of their own, and the proposer's settings
#: per section.
SEARCH = {"candidates": 2, "harness_tasks": 32, "proposer": "agent"}
PROPOSER = {
    "llm": {
        "api": "anthropic",
        "base_url": "https://api.anthropic.com",
        "model": "claude-opus-4-1",
        "api_key_env": "MY_KEY",
        "max_turns": 12,
        "temperature": 0.2,
        "timeout": 60,
        "price_prompt": 15,
        "price_completion": 75,
        "max_tokens": 2048,
    },
    "agent": {"run_seconds": 30, "memory_mb": 1024, "scratch_mb": 128, "try_tasks": 4, "try_budget": 16},
    "claude_code": {"path": "/opt/cli.js", "seconds": 900, "memory_mb": 8192},
}

#: The ``search:`` section as configs were written before the proposer's settings were nested, one flat
#: key per setting (``llm_model``, ``agent_try_budget``, ...; it must go on loading), and as it is now.
OLD_FORM = yaml.safe_dump(
    {"search": {**SEARCH, **{f"{part}_{k}": v for part, keys in PROPOSER.items() for k, v in keys.items()}}}
)
NEW_FORM = yaml.safe_dump({"search": {**SEARCH, **PROPOSER}})


def notices(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, RenamedKey)]


def test_the_old_flat_form_loads_as_the_nested_one_with_a_notice_per_key(tmp_path):
    old, new = tmp_path / "old.yaml", tmp_path / "new.yaml"
    old.write_text(OLD_FORM)
    new.write_text(NEW_FORM)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        from_new = MetaHarnessConfig.from_yaml(new)
        assert not notices(record)
        from_old = MetaHarnessConfig.from_yaml(old)
    assert from_old == from_new
    assert from_new.llm == LLMProposerConfig(
        "https://api.anthropic.com", "claude-opus-4-1", "anthropic", "MY_KEY", 12, 0.2, 60.0, 15.0, 75.0, 2048
    )
    assert from_new.agent == AgentProposerConfig(30.0, 1024, 128, 4, 16)
    assert from_new.claude_code == ClaudeCodeConfig("/opt/cli.js", 900.0, 8192)
    said = notices(record)
    assert len(said) == len(RENAMED) == 18
    assert f"{old}: llm_model is now llm.model (the old key is still read)" in said
    assert f"{old}: agent_try_budget is now agent.try_budget (the old key is still read)" in said
    assert f"{old}: claude_code_path is now claude_code.path (the old key is still read)" in said


def test_the_notice_is_one_line_and_other_warnings_keep_their_format():
    # a process of its own: pytest records warnings instead of showing them
    program = (
        "import warnings\n"
        "before = warnings.formatwarning\n"
        "from whale_train.meta_harness.config import MetaHarnessConfig\n"
        "MetaHarnessConfig.from_dict({'llm_model': 'm'})\n"
        "assert warnings.formatwarning is before, 'the process-wide format was replaced'\n"
        "warnings.warn('something', UserWarning)\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == "note: llm_model is now llm.model (the old key is still read)"
    assert "UserWarning: something" in lines[1]  # other warnings keep Python's own format


def test_old_keys_in_a_train_config_and_through_set(tmp_path):
    from whale_train.trainer import TrainConfig

    path = tmp_path / "train.yaml"
    path.write_text(
        "env: whale/Math-v0\nsearch:\n  proposer: llm\n  llm_base_url: http://x/v1\n  llm_model: a\n"
    )
    with pytest.warns(RenamedKey) as record:
        config = TrainConfig.load(path, ["search.agent_try_budget=3", "search.llm.model=b"])
    assert (config.search.llm.base_url, config.search.llm.model) == ("http://x/v1", "b")  # --set wins
    assert config.search.agent.try_budget == 3
    said = notices(record)
    assert f"{path}: search.llm_model is now search.llm.model (the old key is still read)" in said
    assert "--set search.agent_try_budget is now search.agent.try_budget (the old key is still read)" in said


def test_an_old_key_and_its_new_name_in_one_mapping_must_agree():
    with pytest.warns(RenamedKey):
        same = MetaHarnessConfig.from_dict({"llm_model": "m", "llm": {"model": "m"}})
    assert same.llm.model == "m"
    with pytest.raises(
        ConfigError, match="both llm_model and its new name llm.model are given; keep llm.model"
    ):
        MetaHarnessConfig.from_dict({"llm_model": "a", "llm": {"model": "b"}})
    with pytest.raises(ConfigError, match="llm: expected a mapping"):
        MetaHarnessConfig.from_dict({"llm_model": "a", "llm": "b"})


def test_the_constructor_takes_the_old_keywords_too():
    new = MetaHarnessConfig(
        proposer="agent",
        llm=LLMProposerConfig(model="m", base_url="u", price_prompt=3.0),
        agent=AgentProposerConfig(try_budget=4),
    )
    with pytest.warns(RenamedKey) as record:
        old = MetaHarnessConfig(
            proposer="agent", llm_model="m", llm_base_url="u", llm_price_prompt=3.0, agent_try_budget=4
        )
    assert old == new
    said = "MetaHarnessConfig(llm_model=...) is now MetaHarnessConfig(llm=LLMProposerConfig(model=...))"
    assert any(m.startswith(said) for m in notices(record))
    with pytest.warns(RenamedKey):  # on top of a nested config given as well
        mixed = MetaHarnessConfig(llm=LLMProposerConfig(model="m"), llm_base_url="u", llm_price_prompt=3.0)
    assert mixed.llm == new.llm
    assert dataclasses.replace(new, seed=3).llm == new.llm
    with pytest.raises(TypeError):
        MetaHarnessConfig(llm_modle="m")


def test_errors_name_the_nested_keys():
    with pytest.raises(ConfigError, match=r"^llm: unknown llm_api 'gemini' \(llm.api\)"):
        MetaHarnessConfig.from_dict({"llm": {"api": "gemini"}})
    with pytest.raises(ConfigError, match=r"^llm.modle: unknown field; did you mean llm.model\?"):
        MetaHarnessConfig.from_dict({"llm": {"modle": "m"}})
    with pytest.raises(ConfigError, match=r"agent.run_seconds must be > 0"):
        MetaHarnessConfig.from_dict({"agent": {"run_seconds": 0}})
    with pytest.raises(ConfigError, match=r"ClaudeCodeConfig.memory_mb must be >= 1"):
        MetaHarnessConfig.from_dict({"claude_code": {"memory_mb": 0}})
    with pytest.raises(ConfigError, match=r"needs llm_model \(llm.model\)"):
        MetaHarnessConfig.from_dict({"proposer": "agent", "llm": {"api": "anthropic"}})


def test_every_nested_field_has_help():
    lines = describe(MetaHarnessConfig)
    for old, new in RENAMED.items():
        line = next(line for line in lines if line.startswith(new + " ("))
        assert line.partition("): ")[2].strip(), f"{new} ({old}) has no help"


def test_whale_search_flags_fill_the_nested_keys():
    from whale_train.cli.search import search_config

    args = argparse.Namespace(
        config=None,
        overrides=["llm_price_prompt=2"],
        harness_tasks=None,
        candidates=None,
        seed=None,
        proposer="agent",
        llm_base_url="http://x/v1",
        llm_model="m",
        llm_api=None,
        prompt_only=False,
    )
    with pytest.warns(RenamedKey, match="--set llm_price_prompt is now llm.price_prompt"):
        config = search_config(args)
    assert config.llm == LLMProposerConfig(base_url="http://x/v1", model="m", price_prompt=2.0)
    args.llm_model = args.llm_base_url = None
    args.overrides = []
    assert search_config(argparse.Namespace(**{**vars(args), "proposer": None})).llm == LLMProposerConfig()


def test_a_run_folder_written_with_the_flat_keys_resumes(tmp_path):
    """The trainer compares the saved config.yaml with the given config on --resume: a run made before the
    change (flat keys in its config.yaml) compares equal to the same config in the new form."""
    from tests.train.test_trainer import MODEL, smoke
    from whale_train.files import release_folder
    from whale_train.llm.scripted import NullLLM
    from whale_train.trainer import RUN_LOCK, Run, TrainConfig, _comparable

    config = smoke(MODEL, search={"proposer": "agent", "llm": {"model": "m", "base_url": "http://x/v1"}})
    saved = config.to_dict()
    flat = {k: v for k, v in saved["search"].items() if k not in ("llm", "agent", "claude_code")}
    for kind in ("llm", "agent", "claude_code"):
        flat |= {f"{kind}_{name}": value for name, value in saved["search"][kind].items()}
    saved["search"] = flat
    assert set(flat) >= set(RENAMED)
    with pytest.warns(RenamedKey):
        assert _comparable(TrainConfig.from_dict(saved)) == _comparable(config)

    try:
        (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
        with pytest.warns(RenamedKey):
            Run(config, tmp_path, llm=NullLLM(), resume=True, log=lambda *_: None)
        rewritten = yaml.safe_load((tmp_path / "config.yaml").read_text())
        assert rewritten["search"]["llm"]["model"] == "m" and "llm_model" not in rewritten["search"]

        other = smoke(MODEL, search={"proposer": "agent", "llm": {"model": "n", "base_url": "http://x/v1"}})
        (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
        with pytest.warns(RenamedKey), pytest.raises(ValueError, match="differs from the config given"):
            Run(other, tmp_path, llm=NullLLM(), resume=True, log=lambda *_: None)
    finally:
        release_folder(tmp_path, RUN_LOCK)
