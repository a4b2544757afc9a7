"""docs/API.md's runnable example runs and leaves what it says: traces, a search archive, a run."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "api_example.py"


@pytest.mark.slow
def test_api_example_runs(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("api_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(tmp_path)
    out = capsys.readouterr().out
    assert "eval: math/h0 mean@2" in out and "search: incumbent" in out and "train: best test mean@k" in out
    assert (tmp_path / "eval" / "traces.jsonl").exists()
    assert list((tmp_path / "search" / "archive").glob("*/meta.json"))
    assert (tmp_path / "train" / "state.json").exists()
