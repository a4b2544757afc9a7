"""A table of user mistakes through every command: each ends with exit status 2 and one line on stderr
that names the file, row, field or option; none raises (in process, a traceback would be an exception
here), and none starts work or leaves files behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from whale_train.cli import main

HARNESS_ERROR = "class Broken(Harness):\n    def run(self, env, llm):\n        raise ValueError('boom')\n"


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    """Bad input files, written once per test; ``{stem}`` in a case's argv is the file's path."""
    (tmp_path / "bad_tasks.yaml").write_text('base: demo.yaml\ntasks: "gsm8k?bogus=1"\n')
    (tmp_path / "demo.yaml").write_text("name: demo\nbudget_rollouts: 10\n")
    (tmp_path / "unknown_key.yaml").write_text("budget_rollouts: 10\nbudgett: 3\n")
    (tmp_path / "not_yaml.yaml").write_text("env: [whale/Math-v0\n")
    (tmp_path / "binary.yaml").write_bytes(b"\xff\xfe\x00name: x\n")
    (tmp_path / "tracker.yaml").write_text("report_to: neptune\n")
    (tmp_path / "eval_k.yaml").write_text("eval: {k: 0}\n")
    (tmp_path / "latin1.csv").write_bytes("PuzzleId,FEN,Moves,Rating,Themes\nabc,é\n".encode("latin-1"))
    (tmp_path / "my_harness.py").write_text("from harnesses.base import Harness\n\n\n" + HARNESS_ERROR)
    (tmp_path / "empty_model").mkdir()
    run = tmp_path / "cut_run"
    run.mkdir()
    (run / "config.yaml").write_text("name: cut\nmethod: whale\n")
    (run / "ledger.jsonl").write_text('{"event": "start", "unit": 0, "rollouts_total": 0}\n{"event": "ev')
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "traces.jsonl").write_text('{"task_id": "a", "solved": true}\n{"task_id": ')
    return {name: str(tmp_path / name) for name in ("never", "nope", "cut_run", "traces", "empty_model")} | {
        p.stem: str(p) for p in tmp_path.iterdir() if p.is_file()
    }


M = ["--env", "whale/Math-v0"]
C = ["--env", "whale/Chess-v0"]

#: (argv with {file} placeholders, a part of the one-line message)
CASES = [
    (["train"], "needs a config"),
    (["train", "--resume", "--out", "{never}"], "no run to resume"),
    (["train", "{nope}.yaml"], "no config file"),
    (["train", "no-such-shipped-config"], "shipped configs: "),
    (["train", "{bad_tasks}", "--out", "{never}"], "'bogus'"),
    (["train", "{unknown_key}"], "budgett"),
    (["train", "{not_yaml}"], "line 2"),
    (["train", "{binary}"], "not UTF-8"),
    (["train", "{tracker}"], "neptune"),
    (["train", "{eval_k}"], "eval.k"),
    (["train", "demo", "--set", "budget_rollouts"], "key=value"),
    (["train", "demo", "--set", "rsft.learning_rate=fast"], "learning_rate"),
    (["check", *M, "--harness", "math/h0", "--tasks", "gsm8k?bogus=1"], "'bogus'"),
    (["check", *M, "--harness", "math/h0", "--n-tasks", "0"], "--n-tasks"),
    (["check", *M, "--harness", "{my_harness}", "--trusted"], "--trusted"),
    (["tasks", *C, "--tasks", "lichess?min_rating=abc"], "min_rating"),
    (["tasks", *C, "--tasks", "lichess:{latin1}"], "not UTF-8"),
    (["tasks", *C, "--tasks", "lichess:{nope}.csv"], "nope.csv"),
    (["tasks", *C, "--tasks", "gsm8k"], "unknown task source kind"),
    (["tasks", *C, "--limit", "-1"], "--limit"),
    (["eval", *M, "--harness", "{my_harness}", "--trusted"], "--trusted"),
    (["eval", *M, "--harness", "math/h0", "--k", "0"], "--k"),
    (["eval", *M, "--harness", "math/h0", "--limit", "-3"], "--limit"),
    (["eval", *M, "--harness", "math/h0", "--model", "/nonexistent"], "/nonexistent"),
    (["eval", *M, "--harness", "math/h0", "--model", "{empty_model}"], "no config.json"),
    (["eval", *M, "--harness", "chess_puzzles/h0"], "cannot drive whale/Math-v0"),
    (["eval", "--env", "whale/Nope-v0", "--harness", "math/h0"], "unknown env"),
    (["eval", *M, "--harness", "math/h9"], "math/h9"),
    (["eval", *M, "--harness", "math/h0", "--split", "validation"], "--split"),
    (["search", *M, "--iterations", "0"], "--iterations"),
    (["search", "--env", "whale/Nope-v0", "--iterations", "1"], "unknown env"),
    (["search", *M, "--iterations", "1", "--tasks", "math?levels=abc"], "levels"),
    (["lineage", "{nope}"], "not a harness archive"),
    (["report", "{nope}"], "not a run directory"),
    (["report", "{cut_run}"], "ledger.jsonl:2"),
    (["traces", "{nope}"], "no such file"),
    (["traces", "{traces}"], "traces.jsonl:2"),
    (["pretrain"], "--out"),
    (["frobnicate"], "invalid choice"),
]


def run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own errors
        return int(exc.code)


@pytest.mark.parametrize(("argv", "needle"), CASES, ids=[" ".join(a)[:60] for a, _ in CASES])
def test_bad_input_is_one_line_and_exit_2(argv, needle, files, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a default runs/NAME would land here, and be seen
    before = sorted(p.name for p in tmp_path.iterdir())
    argv = [a.format(**files) for a in argv]
    assert run(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "Traceback" not in captured.err + captured.out
    assert len(err.splitlines()) == 1, err
    assert needle in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing was created (no half run)


def test_table_is_large_enough():
    commands = {argv[0] for argv, _ in CASES}
    assert len(CASES) >= 25
    assert commands >= {
        "train",
        "check",
        "tasks",
        "eval",
        "search",
        "lineage",
        "report",
        "traces",
        "pretrain",
    }


def test_markup_in_messages_is_printed_as_text(capsys, monkeypatch):
    """Rich markup once swallowed `[gpu]` from "pip install 'whale-harness[gpu]'"."""
    from whale_train.cli import envs
    from whale_train.errors import CLIError

    def fail(args):
        raise CLIError("the vllm backend needs `pip install 'whale-harness[gpu]'`")

    monkeypatch.setattr(envs, "cmd_envs", fail)
    assert main(["envs"]) == 2
    assert "whale-harness[gpu]" in capsys.readouterr().err


def test_version(capsys):
    assert run(["--version"]) == 0
    assert capsys.readouterr().out.startswith("whale 0.")


@pytest.mark.slow
def test_harness_errors_are_in_sight(fresh_model_dir, tmp_path, capsys):
    """A harness that raises: the first message on the console and in results.json, exit 1 when every
    episode failed, and results.json names the task source."""
    harness = tmp_path / "broken.py"
    harness.write_text("from harnesses.base import Harness\n\n\n" + HARNESS_ERROR)
    out = tmp_path / "eval"
    argv = ["eval", *M, "--harness", str(harness), "--model", fresh_model_dir, "--limit", "2", "--k", "1"]
    assert main([*argv, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "harness_error in 2 of 2 episodes" in err and "boom" in err and "every episode failed" in err
    results = json.loads((out / "results.json").read_text())
    assert results["errors"]["harness_error"]["episodes"] == 2
    assert "boom" in results["errors"]["harness_error"]["first"]
    assert results["task_source"].startswith("generated") and results["tasks"] == 2


@pytest.mark.slow
def test_ctrl_c_in_train_is_one_line_saying_how_to_resume(tmp_path):
    """SIGINT to the whole process group (what Ctrl-C in a terminal does), once a unit is done."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "whale_train.cli",
        "train",
        "smoke",
        "--out",
        str(out),
        "--set",
        "budget_rollouts=400",
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # not inherited as ignored
    )
    deadline = time.monotonic() + 600
    # a unit is kept once state.json counts it (its ledger event comes first, then an evaluation, the
    # checkpoint and state.json, which is also written once before the first unit): wait for that, not for
    # the ledger event, or a loaded machine interrupts in between
    state_file = out / "state.json"
    while time.monotonic() < deadline and proc.poll() is None:
        if state_file.exists() and json.loads(state_file.read_text())["units"] >= 1:
            break  # state.json is written atomically: never read half-written
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)
    _out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--resume" in lines[0] and str(out) in lines[0], err[-2000:]
    state = json.loads((out / "state.json").read_text())
    assert state["units"] >= 1  # the finished units are kept; the interrupted one is redone on resume
    kept = (out / "ledger.jsonl").read_text().count('"event": "unit"')
    # an event past state.json's units is the interrupted unit's, dropped on resume
    assert kept >= state["units"]
