"""``whale traces``: the episodes of traces files as a table, filtered, or one in full."""

from __future__ import annotations

import pytest

from whale_train.cli import main
from whale_train.rollout import EnvStep, LLMCall, Trajectory, write_jsonl
from whale_train.traces import read_episodes


def _traj(task: str, sample: int, *, solved=False, failure="", error=None, harness="math/h0") -> Trajectory:
    call = LLMCall("sample", "p", "Solve 2+2.", "\\boxed{4}", None, None, "stop", 3, 2)
    step = EnvStep(
        "answer: 4", "Correct." if solved else "Your answer 4 is not correct.", float(solved), True, False
    )
    return Trajectory(
        task_id=task,
        sample=sample,
        seed=0,
        harness=harness,
        env_id="whale/Math-v0",
        model_version=0,
        reward=float(solved),
        solved=solved,
        reset_observation=f"Problem {task}: what is 2+2?",
        steps=[] if error else [step],
        calls=[call],
        error=error,
        failure=failure,
    )


@pytest.fixture(autouse=True)
def _wide_console(monkeypatch):
    """The table and the episode's rule hold the folder's path: under pytest-xdist it is longer
    (``popen-gw0/``) and a 200-column table squeezed the error column into wrapped words."""
    from rich.console import Console

    monkeypatch.setattr("whale_train.cli.traces.console", Console(soft_wrap=True, width=400))


def write(tmp_path):
    trajs = [
        _traj("gen-1", 0, solved=True),
        _traj("gen-1", 1, failure="wrong_answer"),
        _traj(
            "gen-2", 0, failure="harness_error", error="Traceback ...\nZeroDivisionError: division by zero"
        ),
        _traj("other-3", 0, failure="wrong_answer", harness="math/vote"),
    ]
    write_jsonl(trajs[:2], tmp_path / "eval" / "traces.jsonl")
    write_jsonl(trajs[2:], tmp_path / "run" / "eval" / "v0_math_h0.traces.jsonl")
    return tmp_path


def test_table_of_every_file_under_a_folder(tmp_path, capsys):
    assert main(["traces", str(write(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "4 episodes" in out and "solved: 1" in out and "wrong_answer: 2" in out
    assert "ZeroDivisionError: division by zero" in out  # the last line of the error


def test_filters_combine(tmp_path, capsys):
    root = write(tmp_path)
    assert main(["traces", str(root), "--failure", "wrong_answer", "--harness", "vote"]) == 0
    out = capsys.readouterr().out
    assert "1 episodes" in out and "other-3" in out and "gen-1" not in out
    assert main(["traces", str(root), "--task", "gen-*", "--unsolved"]) == 0
    out = capsys.readouterr().out
    assert "2 episodes" in out and "other-3" not in out
    assert main(["traces", str(root), "--task", "nothing"]) == 0
    assert "no episode matches" in capsys.readouterr().out


def test_show_prints_an_episode_in_full(tmp_path, capsys):
    assert main(["traces", str(write(tmp_path) / "eval" / "traces.jsonl"), "--unsolved", "--show", "1"]) == 0
    out = capsys.readouterr().out
    assert "Problem gen-1" in out and "\\boxed{4}" in out and "answer: 4" in out and "not correct" in out
    assert "traces.jsonl:2" in out  # where the episode is


def test_a_broken_line_is_named_by_file_and_line(tmp_path):
    path = write_jsonl([_traj("gen-1", 0), _traj("gen-1", 1)], tmp_path / "traces.jsonl")
    text = path.read_text(encoding="utf-8")
    path.write_text(text + "\n" + text.splitlines()[0][:40], encoding="utf-8")  # cut short, after a blank
    with pytest.raises(ValueError) as caught:
        list(read_episodes(path))
    assert str(caught.value) == f"{path}:4: not a JSON line; is the file cut short?"
    path.write_text(text + '{"sample": 0}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"traces.jsonl:3: not an episode record"):
        list(read_episodes(path))
