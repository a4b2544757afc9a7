"""The ``whale`` command line as a package: every command is registered once by its module and
answers ``--help``; ``whale eval`` builds its env and checks isolation once, and ``whale train`` builds
its test sets once (the pre-flight's are the run's)."""

from __future__ import annotations

import argparse
import pkgutil

import gymnasium as gym
import pytest

import whale_train.cli as cli
from whale_train.cli import main
from whale_train.cli.registry import COMMANDS, command

#: What ``whale --help`` lists, in its order.
COMMAND_NAMES = [
    "envs",
    "tasks",
    "eval",
    "check",
    "pretrain",
    "search",
    "lineage",
    "train",
    "report",
    "compare",
    "traces",
    "retriever",
]
#: The modules of the package that are not a command.
NOT_COMMANDS = {"common", "parser", "registry", "__main__"}


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_the_registry_holds_every_command_in_the_order_of_the_help():
    assert list(COMMANDS) == COMMAND_NAMES
    assert list(subcommands(cli.build_parser())) == COMMAND_NAMES


def test_every_module_of_the_package_registers_its_command():
    """A command module that is not imported by ``whale_train/cli/__init__.py`` would register nothing."""
    modules = {m.name for m in pkgutil.iter_modules(cli.__path__)} - NOT_COMMANDS
    assert modules == {c.arguments.__module__.rsplit(".", 1)[1] for c in COMMANDS.values()}


def test_a_name_taken_twice_is_refused():
    with pytest.raises(ValueError, match="two whale commands named 'eval'"):
        command("eval", help="another eval")(lambda p: None)
    assert COMMANDS["eval"].arguments.__module__ == "whale_train.cli.eval"


@pytest.mark.parametrize(
    "argv", [[name] for name in COMMAND_NAMES] + [["retriever", a] for a in ("build", "serve", "recall")]
)
def test_every_command_answers_help(argv, capsys):
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: whale {' '.join(argv)}") and "--help" in out


def test_every_command_takes_the_isolation_opt_in():
    from whale_envs.sandbox import OPT_IN_FLAG

    for name, parser in subcommands(cli.build_parser()).items():
        assert OPT_IN_FLAG in parser._option_string_actions, name


def counting(monkeypatch, owner, name: str) -> list:
    """Replace ``owner.name`` by a wrapper that records each call (its ``args`` and ``kwargs``)."""
    calls: list = []
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        calls.append(argparse.Namespace(args=args, kwargs=kwargs))
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)
    return calls


def test_whale_eval_builds_its_env_once_and_checks_isolation_once(monkeypatch, capsys):
    import whale_train.rollout as rollout
    from whale_train.rollout import executors

    monkeypatch.setattr(executors, "_ENV_POOL", {})  # no env left by an earlier test
    makes = counting(monkeypatch, gym, "make")
    checks = counting(monkeypatch, executors, "preflight")
    monkeypatch.setattr(rollout, "preflight", executors.preflight)  # what the command calls
    argv = ["eval", "--env", "whale/Math-v0", "--harness", "math/h0", "--limit", "3", "--k", "2"]
    assert main([*argv, "--concurrency", "1", "--trusted"]) == 0
    assert [call.args[0] for call in makes] == ["whale/Math-v0"]  # the tasks, the check and every episode's
    assert len(checks) == 1
    assert "mean@2" in capsys.readouterr().out


def test_whale_train_builds_its_test_sets_once(monkeypatch, tmp_path):
    """The pre-flight builds the test sets to check them; the run uses those, and builds none."""
    from whale_train.trainer import Run, TrainConfig

    makes = counting(monkeypatch, gym, "make")
    seen = []

    def run(self):
        seen.append(self.test_sets)
        raise KeyboardInterrupt

    monkeypatch.setattr(Run, "_load_llm", lambda self: None)  # no model: the run stops at once
    monkeypatch.setattr(Run, "run", run)
    assert main(["train", "smoke", "--out", str(tmp_path / "run"), "--no-report"]) == 130
    test_envs = [call for call in makes if call.kwargs.get("split") == "test"]
    assert len(seen) == 1 and [len(tasks.ids) > 0 for tasks in seen[0]] == [True] * len(seen[0])
    assert len(test_envs) == len(seen[0]) == len(TrainConfig.load("smoke").eval_sets)
