"""What a new user hit on first contact, each fault pinned by a test that failed before its fix:
vector envs that cannot merge infos, a model error found only after a whole run, a report written over
a run's own, an env example that needed our source, harness and label names that change midway, Ctrl-C
noise, and listings that hid what they showed."""

from __future__ import annotations

import gymnasium as gym
import pytest

import whale_envs  # noqa: F401  (registers the envs)

# ------------------------------------------------------------------ 1. vector envs merge every info

MIXED = {
    "whale/Math-v0": ["answer: 5", "python: print(2+3)"],
    "whale/Chess-v0": ["e2e4", "not a move"],
    "whale/SearchQA-v0": ["answer: x", "search: capital"],
}


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("env_id", sorted(MIXED))
def test_make_vec_merges_the_infos_of_envs_in_different_states(env_id, mode):
    """One env answers while the other calls a tool (or errs): Gymnasium merges their infos key by key,
    which fails when a key is None in one env and a dict in the other (math's ``last_tool`` was)."""
    envs = gym.make_vec(env_id, num_envs=2, vectorization_mode=mode)
    try:
        envs.reset(seed=0)
        for _ in range(2):
            _obs, _reward, _term, _trunc, info = envs.step(MIXED[env_id])
            assert list(info["task_id"]) and len(info["turn"]) == 2
    finally:
        envs.close()  # returns: an async env left waiting on a failed step used to hang here


def test_math_last_tool_is_a_dict_in_every_step():
    env = gym.make("whale/Math-v0")
    _obs, info = env.reset(seed=0)
    assert info["last_tool"] == {}
    _obs, *_rest, info = env.step("python: print(2+3)")
    assert info["last_tool"]["stdout"] == "5\n"


# ------------------------------------------------------------------ 2. the openai backend needs a model name


def test_openai_backend_without_model_is_one_line_before_any_work(tmp_path, capsys):
    from whale_train.cli import main

    out = tmp_path / "eval"
    argv = ["eval", "--env", "whale/Math-v0", "--harness", "math/h0", "--backend", "openai"]
    code = main([*argv, "--base-url", "http://127.0.0.1:9/v1", "--limit", "2", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "needs --model" in err and not out.exists()


def test_train_with_openai_backend_and_no_model_stops_before_the_run_dir(tmp_path, capsys):
    from whale_train.cli import main

    out = tmp_path / "run"
    sets = [
        "--set",
        "backend=openai",
        "--set",
        "base_url=http://127.0.0.1:9/v1",
        "--set",
        "method=harness-only",
    ]
    assert main(["train", "smoke", "--out", str(out), *sets]) == 2
    err = capsys.readouterr().err.strip()
    assert "needs model" in err and len(err.splitlines()) == 1 and not out.exists()


def test_the_summary_of_failed_episodes_shows_the_line_that_says_what_failed():
    from types import SimpleNamespace

    from whale_train.evaluation import error_headline, first_errors

    model = "model_error: OpenAIError: the server says 404: model 'default' does not exist\n(then harness_error: x)"
    harness = 'harness_error: Traceback (most recent call last):\n  File "h.py", line 3, in act\n    f()\nKeyError: 5'
    trajs = [SimpleNamespace(error=model, failure="model_error", task_id="t1")]
    assert first_errors(trajs)["model_error"]["first"].endswith("model 'default' does not exist")
    assert error_headline(harness) == "harness_error: KeyError: 5"
    assert error_headline("timeout: 30 s\nmore") == "timeout: 30 s"


# ------------------------------------------------------------------ 3. a report of several runs is its own


def test_report_of_several_runs_leaves_each_runs_own_report_alone(tmp_path, capsys):
    from tests.train.test_report import make_run
    from whale_train.cli import main

    a, b = make_run(tmp_path, "a", 4), make_run(tmp_path, "b", 4)
    assert main(["report", str(a)]) == 0  # one run: its own report.md
    own = (a / "report.md").read_text()
    assert main(["report", str(a), str(b)]) == 0
    assert (a / "report.md").read_text() == own
    both = (tmp_path / "report-a-b" / "report.md").read_text()
    assert "| a |" in both and "| b |" in both
    assert "report-a-b" in capsys.readouterr().out


# ------------------------------------------------------------------ 4. a user's env needs nothing of our source


def test_the_task_registry_is_exported_for_a_users_env():
    from whale_envs import register_generator, register_source
    from whale_envs.tasks import register_generator as from_tasks

    assert register_generator is from_tasks and callable(register_source)


def test_whale_envs_import_lists_the_users_env_its_source_and_its_generic_domain(monkeypatch, capsys):
    from pathlib import Path

    from whale_train.cli import main

    monkeypatch.syspath_prepend(str(Path(__file__).parents[1]))
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["envs", "--import", "user_env"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "user_env:Reverse-v0" in line and "generated" in line)
    assert "random 4-letter words" in row
    assert any("(generic)" in line and "user_env:Reverse-v0" in line for line in out.splitlines())


# ------------------------------------------------------------------ 7. listings say what they show


def test_whale_envs_shows_split_columns_only_with_sizes(monkeypatch, capsys):
    from whale_train.cli import main

    monkeypatch.setenv("COLUMNS", "200")
    assert main(["envs"]) == 0
    out = capsys.readouterr().out
    assert "harness" not in out.split("Registered domains")[0].split("\n", 3)[2]  # the header row
    assert "split sizes: --sizes" in out


def test_whale_tasks_says_how_many_it_shows_of_how_many_and_shows_the_task(monkeypatch, capsys):
    from whale_train.cli import main

    monkeypatch.setenv("COLUMNS", "200")
    assert main(["tasks", "--env", "whale/Math-v0", "--limit", "3"]) == 0
    out = capsys.readouterr().out
    assert "the first 3 shown (--limit 0: all)" in out and "by difficulty (of the 3 shown)" in out
    assert out.count("Problem:") == 3  # the task text, not only its id


def test_whale_eval_help_shows_the_defaults(capsys):
    from whale_train.cli import main

    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for default in ("(default: 8)", "(default: 128)", "(default: test)", "(default: transformers)"):
        assert default in text, default


def test_whale_lineage_renders_in_the_terminal_and_writes_markdown_with_out(tmp_path, capsys):
    from tests.train.test_meta_harness import FAST, MATH, tool_shy_math_model
    from whale_train.cli import main
    from whale_train.meta_harness import HarnessSearch, MetaHarnessConfig

    search = HarnessSearch(MetaHarnessConfig(**FAST), tmp_path / "a", tool_shy_math_model(), MATH)
    search.iterate()
    capsys.readouterr()
    assert main(["lineage", str(tmp_path / "a")]) == 0
    shown = capsys.readouterr().out
    assert "Aimed at" in shown and "Harness search on whale/Math-v0" in shown
    for raw in ("<br>", "**", "|---|", "# Harness"):
        assert raw not in shown, raw
    assert main(["lineage", str(tmp_path / "a"), "--out", str(tmp_path / "l.md")]) == 0
    assert "<br>_" in (tmp_path / "l.md").read_text()  # the file keeps its markdown


# ------------------------------------------------------------------ 6. Ctrl-C: one line, and what was kept


def test_ctrl_c_inside_a_finalizer_prints_no_traceback_and_still_stops_the_run(capfd):
    """A Ctrl-C that arrives while a ``Popen`` (here: any object) is being collected used to raise in its
    ``__del__``: Python printed "Exception ignored in ... __del__" and a traceback, and dropped it."""
    import signal
    import time

    from whale_train.trainer import INTERRUPTED, sigint_stops_run

    class Finalized:
        def __del__(self):
            signal.raise_signal(signal.SIGINT)  # the handler runs here, inside __del__
            sum(range(1000))

    with pytest.raises(KeyboardInterrupt):
        with sigint_stops_run():
            obj = Finalized()
            del obj
            assert INTERRUPTED.is_set()
            time.sleep(5)  # the signal comes again, outside the finalizer, and stops the run
    assert "Exception ignored" not in capfd.readouterr().err


def test_the_interrupted_line_says_what_was_kept_from_the_saved_state(tmp_path):
    import json

    from whale_train.cli.train import stopped_message

    state = {"units": 3, "schedule": {"rollouts": 768}, "rsft_steps": 3, "model_version": 3}
    (tmp_path / "state.json").write_text(json.dumps(state))
    line = stopped_message(tmp_path)
    assert "kept what was saved: 3 units, 768 rollouts, 3 RSFT steps (model v3)" in line
    assert "Unit 3 was in progress and is not kept" in line and f"--out {tmp_path} --resume" in line
    assert "\n" not in line


# ------------------------------------------------------------------ 5. a harness keeps its name


def test_a_users_seed_harness_keeps_its_file_name_in_the_archive(tmp_path):
    from pathlib import Path

    from tests.train.test_meta_harness import FAST, MATH, tool_shy_math_model
    from whale_train.meta_harness import HarnessSearch, MetaHarnessConfig

    seed = tmp_path / "my_h0.py"
    seed.write_text((Path(__file__).parents[2] / "harnesses" / "math" / "h0.py").read_text())
    search = HarnessSearch(MetaHarnessConfig(**FAST), tmp_path / "a", tool_shy_math_model(), MATH)
    assert search.seed_id == "h0"
    from harnesses.loader import load_harness

    other = HarnessSearch(
        MetaHarnessConfig(**FAST),
        tmp_path / "b",
        tool_shy_math_model(),
        MATH,
        seed_harness=load_harness(str(seed)),
    )
    assert other.seed_id == "my_h0"  # was "seed", shown as `seed (seed)`


@pytest.mark.slow
def test_evaluation_labels_name_the_seed_the_same_before_and_after_a_harness_phase(tmp_path):
    from whale_train.trainer import Run, TrainConfig

    lines: list[str] = []
    Run(TrainConfig.load("smoke"), tmp_path / "run", log=lines.append).run()
    evals = [line for line in lines if "test mean@" in line]
    assert any("harness" in line for line in lines if line.startswith("→")), lines  # a harness phase ran
    assert len(evals) >= 2 and all("math/h0" in line for line in evals), evals
