"""What the ``whale`` subcommands share: the consoles, argument types, the one-line checks of an env, a
harness and a model before any work starts, the progress bar, and the summary of failed episodes.
The subcommands (``whale_train.trainer``, ``whale_train.meta_harness.cli``, ``whale_train.traces``, ...)
import these from here, never from ``whale_train.cli``, which only assembles them into one parser.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from pathlib import Path

import gymnasium as gym
from rich.console import Console
from rich.markup import escape

import whale_envs
from whale_envs.tasks import TaskSourceError
from whale_train.domains import import_env_module
from whale_train.errors import CLIError


def make_console(stderr: bool = False) -> Console:
    """A console; piped or redirected output is 200 columns wide (rich's default of 80 wrapped tables and
    split paths in logs), and soft-wrapped so long lines stay whole. ``COLUMNS`` overrides the width."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty() or os.environ.get("COLUMNS"):
        return Console(stderr=stderr, soft_wrap=stderr)
    return Console(stderr=stderr, soft_wrap=True, width=200)


console = make_console()


errors = make_console(stderr=True)  # one line per error, never wrapped


DISTRIBUTION = "whale-harness"  # the name on the package index; the import names are whale_envs, ...


class Interrupted(Exception):
    """Ctrl-C: printed as one line saying how to continue, exit status 130."""


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown (not installed)"


def count(minimum: int = 0):
    """An argparse ``type``: a whole number of at least ``minimum`` (``--k 0`` is an error, not mean@0)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    parse.__name__ = f"number >= {minimum}"
    return parse


def add_command(subparsers, name: str, help: str, description: str, example: str) -> argparse.ArgumentParser:
    """A subcommand that reads a config: its parser with the ``--set KEY=VALUE`` option (into
    ``overrides``); ``example`` is a dotted field the help shows."""
    p = subparsers.add_parser(name, help=help, description=description)
    add_set_option(p, f"override a config field (dotted for nested: {example})")
    return p


def add_set_option(p: argparse.ArgumentParser, help: str = "override a config field") -> None:
    """The one ``--set KEY=VALUE`` option (repeatable; parsed by ``config_io.parse_sets``)."""
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=help)


class DefaultsFormatter(argparse.HelpFormatter):
    """``--help`` that shows each option's default (``(default: 8)``) where it has a real one and its help
    does not already say it (None and False defaults say nothing a reader can use)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default is None
            or default is False
            or default == []
            or default == argparse.SUPPRESS
            or not action.option_strings
            or action.nargs == 0
        ):
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors that say where the help is."""

    def error(self, message: str) -> None:  # noqa: D102
        errors.print(f"{self.prog}: error: {escape(message)} (see `{self.prog} --help`)", highlight=False)
        self.exit(2)


def make_env(env_id: str, tasks: str | None, split: str = "all", **kwargs) -> gym.Env:
    """``gym.make`` with user errors (unknown env, bad task source) as one-line CLIErrors."""
    _check_env(env_id)
    try:
        options = {"tasks": tasks} if tasks else {}
        return gym.make(env_id, split=split, **options, **kwargs)
    except (TaskSourceError, ValueError) as exc:
        raise CLIError(f"--tasks {tasks or 'generated'}: {exc}") from None


_make_env = make_env


@contextlib.contextmanager
def progress_bar(description: str, total: int):
    """A progress bar on the console while a batch of episodes runs; yields ``advance()``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        job = bar.add_task(escape(description), total=total)
        yield lambda: bar.advance(job)


#: The folder of the shipped harnesses that drive any text env (``generic/h0``).
GENERIC_HARNESSES = "generic"


def env_domain(env_id: str) -> str | None:
    """The folder of an env's shipped harnesses (``whale/Chess-v0`` -> ``chess_puzzles``); None for an env
    that ships none (``whale/ReasoningGym-v0``: only the generic ones drive it)."""
    if env_id not in whale_envs.ENVS:
        return None
    return {"chess": "chess_puzzles", "math": "math", "search": "search_qa"}.get(_domain_of(env_id))


def _check_env(env_id: str) -> None:
    """A built-in env id, or a user's ``module:EnvId`` (the module is imported, as ``gym.make`` does)."""
    try:
        import_env_module(env_id)
    except ValueError as exc:
        raise CLIError(str(exc)) from None


def _domain_of(env_id: str) -> str:
    module, _, cls = whale_envs.ENVS[env_id].partition(":")
    return getattr(importlib.import_module(module), cls).domain


def load_harness_for(spec: str, env_id: str, *, trusted: bool = False):
    """Load and validate a harness for ``env_id``; a user error (bad file, another domain's shipped
    harness, ``--trusted`` on a file that does not ship with the package) is a CLIError."""
    from harnesses.loader import load_harness
    from harnesses.validate import HarnessValidationError

    try:
        harness = load_harness(spec)
    except FileNotFoundError as exc:
        raise CLIError(f"--harness {spec}: {exc}") from None
    except (HarnessValidationError, SyntaxError, UnicodeDecodeError) as exc:
        raise CLIError(f"harness {spec!r} fails validation: {exc}") from None
    if harness.shipped and env_id in gym.registry:
        domain, want = harness.name.split("/")[0], env_domain(env_id)
        if domain not in (want, GENERIC_HARNESSES):
            fits = [*(_shipped(want) if want else []), *_shipped(GENERIC_HARNESSES)]
            raise CLIError(
                f"--harness {spec} is a {domain} harness and cannot drive {env_id}; use one of: {', '.join(fits)}"
            )
    if trusted and not harness.shipped:
        raise CLIError(
            f"--trusted runs only harnesses shipped with the package in this process, and {spec} is not one: "
            "drop --trusted (it then runs in the sandboxed worker)"
        )
    return harness


def _shipped(domain: str) -> list[str]:
    from harnesses.loader import shipped_harnesses

    return shipped_harnesses(domain)


def check_model(model: str | None, backend: str = "transformers", flag: str = "--model") -> None:
    """A ``--model`` that names a path must be a model directory (an id like ``org/name`` goes to the hub);
    the openai backend needs the name the server serves (there is no default to fall back on)."""
    if backend == "openai":
        if not model:
            raise CLIError(
                f"backend openai needs {flag}: the name the server serves (`vllm serve NAME` serves NAME; "
                "GET <base-url>/models lists them)"
            )
        return
    if model is None:
        return
    path = Path(model).expanduser()
    if path.exists():
        if path.is_dir() and not (path / "config.json").exists():
            raise CLIError(f"cannot load model {model}: {path} is not a model directory (no config.json)")
        return
    if model.startswith(("/", ".", "~")) or model.count("/") > 1:
        raise CLIError(
            f"cannot load model {model}: no such directory; pass a model directory or a hub id like Qwen/Qwen3-0.6B"
        )


def _load_llm(args: argparse.Namespace):
    from whale_train.config_io import parse_sets
    from whale_train.llm import ModelNotFound, load_llm

    check_model(args.model, args.backend)
    kwargs = {"base_url": args.base_url} if args.backend == "openai" else {}
    try:
        kwargs.update(parse_sets(getattr(args, "backend_options", None) or [], "--backend-option"))
        return load_llm(args.backend, args.model, **kwargs)
    except (ModelNotFound, ValueError, RuntimeError, OSError, TypeError) as exc:
        raise CLIError(str(exc).splitlines()[0] if str(exc) else repr(exc)) from None


def first_errors(trajs) -> dict[str, dict]:
    """Episodes that ended in an error (the harness raised, a model call failed, a timeout), by failure
    category: how many, and the first message with its task, so a failure is never only in the traces."""
    out: dict[str, dict] = {}
    for t in trajs:
        if not t.error:
            continue
        entry = out.setdefault(t.failure or "error", {"episodes": 0, "first": error_headline(t.error)})
        entry["episodes"] += 1
        entry.setdefault("task_id", t.task_id)
    return out


def error_headline(error: str) -> str:
    """The line of an episode's error that says what went wrong: a traceback's exception (the lines after
    its last frame), else the first line (a model error is ``model_error: ...`` first, then what
    the harness did after it)."""
    lines = [line for line in error.strip("\n").rstrip().splitlines() if line.strip()]
    if not lines:
        return ""
    frames = [i for i, line in enumerate(lines) if line.startswith("  File ")]
    if frames and ("Traceback (most recent call last)" in lines[0] or frames[0] == 0):
        after = lines[frames[-1] + 1 :]
        start = next((i for i, line in enumerate(after) if not line[:1].isspace()), None)
        if start is not None:
            prefix = lines[0].split("Traceback")[0] if frames[0] > 0 else ""
            return prefix + " ".join(line.strip() for line in after[start:])
    return lines[0]


def print_errors(found: dict[str, dict], episodes: int) -> None:
    for name, e in found.items():
        errors.print(
            f"[yellow]{name}[/yellow] in {e['episodes']} of {episodes} episodes; first (task {escape(str(e['task_id']))}): "
            f"{escape(e['first'][:300])}",
            highlight=False,
        )
