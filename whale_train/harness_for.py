"""A harness named on a command line or in a config, loaded for an env: a file or a shipped name, checked
(it validates, a shipped one belongs to the env's domain, ``trusted`` only for a shipped one), every
problem one :class:`~whale_train.errors.CLIError` line. ``whale eval``, ``whale check``, ``whale search``
and the pre-flight of ``whale train`` load their harness here."""

from __future__ import annotations

import importlib

import gymnasium as gym

import whale_envs
from whale_train.errors import CLIError

#: The folder of the shipped harnesses that drive any text env (``generic/h0``).
GENERIC_HARNESSES = "generic"


def env_domain(env_id: str) -> str | None:
    """The folder of an env's shipped harnesses (``whale/Chess-v0`` -> ``chess_puzzles``); None for an env
    that ships none (``whale/ReasoningGym-v0``: only the generic ones drive it)."""
    if env_id not in whale_envs.ENVS:
        return None
    return {"chess": "chess_puzzles", "math": "math", "search": "search_qa"}.get(domain_of(env_id))


def domain_of(env_id: str) -> str:
    """The ``domain`` of a built-in env's class (``whale/Chess-v0`` -> ``chess``)."""
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
