"""Tables filled by decorators: a module keeps a table (name -> function or class) and a decorator that
files each entry under its name where the entry is defined, e.g. ``preflight.check``, ``lanes.clock``,
``schedule.policy``. (``whale_train.cli.registry``'s ``command`` also refuses a name taken twice and
keeps the help text beside it.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def registrar(table: dict[str, T]) -> Callable[..., Callable[[T], T]]:
    """The decorator of ``table``: ``@register("a", "b")`` files what it decorates under ``a`` and ``b``
    (usually one name) and returns it unchanged; a name registered again is replaced."""

    def names(*keys: str) -> Callable[[T], T]:
        def register(entry: T) -> T:
            for key in keys:
                table[key] = entry
            return entry

        return register

    return names
