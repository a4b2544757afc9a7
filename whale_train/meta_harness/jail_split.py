"""Appended to the proposer jail's copy of ``whale_envs/tasks.py`` (:func:`.jail.sdk_copy`): there the
held-out split cannot be listed.

Appended as it is (a module of its own so that it is linted and tested): its ``check_split`` then
replaces the copy's own, which every user of the copy calls by that name (``split_ids`` in the module,
the envs through ``from whale_envs.tasks import check_split``). No ``from __future__`` import: the text
runs at the end of another module.
"""

from whale_envs.tasks import check_split as _check_split_outside_the_jail

#: The splits the proposer never sees (``all`` holds ``test``).
_NOT_IN_THE_JAIL = ("test", "all")


def check_split(split: str) -> str:
    if split in _NOT_IN_THE_JAIL:
        raise ValueError(f"split {split!r} is not available in the proposer's jail")
    return _check_split_outside_the_jail(split)
