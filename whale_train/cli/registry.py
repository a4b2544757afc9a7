"""The ``whale`` subcommands, one module of this package each, registered with ``@command``.

    @command("tasks", help="list the tasks of a source and split")
    def arguments(p: argparse.ArgumentParser) -> None:
        # a docstring here is the paragraph of `whale tasks --help`
        p.add_argument("--env", required=True)
        p.set_defaults(func=cmd_tasks)       # the handler: args -> exit status

:func:`whale_train.cli.parser.build_parser` makes one subparser per registered command, in the order
the modules were imported (the order ``whale --help`` lists them), and calls its ``arguments``.
"""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable
from dataclasses import dataclass

Arguments = Callable[[argparse.ArgumentParser], None]


@dataclass(frozen=True)
class Command:
    """One subcommand: its name, the line ``whale --help`` shows, the paragraph its own ``--help`` shows
    (None: none; by default the docstring of ``arguments``) and the function that adds its arguments and
    its handler."""

    name: str
    help: str
    description: str | None
    arguments: Arguments


COMMANDS: dict[str, Command] = {}


def command(name: str, *, help: str, description: str | None = None) -> Callable[[Arguments], Arguments]:
    """Register ``arguments(parser)`` as the subcommand ``name`` (a name taken twice is an error).
    ``description``: its ``--help`` paragraph, where it is computed; otherwise the docstring of
    ``arguments``, reflowed (None without one)."""

    def register(arguments: Arguments) -> Arguments:
        if name in COMMANDS:
            raise ValueError(
                f"two whale commands named {name!r}: {arguments.__module__} and {COMMANDS[name].arguments.__module__}"
            )
        doc = " ".join(inspect.cleandoc(arguments.__doc__).split()) if arguments.__doc__ else None
        COMMANDS[name] = Command(name, help, description if description is not None else doc, arguments)
        return arguments

    return register
