"""The errors the ``whale`` command turns into one line and exit status 2 (no traceback).

A module of its own so that the subsystems that raise them (trainer, pretrain, report, compare) need
not import the CLI that imports them.
"""

from __future__ import annotations


class CLIError(Exception):
    """A user mistake: printed as one clear line, exit status 2."""
