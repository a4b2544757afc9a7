"""The domain registry: what the trainer, the search, the proposers and pretraining know about an env.

A ``Domain`` names an env and what WHALE needs around it: the harness to start from, the ``info``
fields a proposer is told about, and optionally an offline mechanism library and pretraining text
formats. The built-in domains register themselves at the end of their own files
(``whale_train/domains/{chess,math,search}.py``); a user's domain does the same with
``register_domain``, usually next to its ``gym.register``.

``domain_for(env_id)`` is the one lookup everything uses. It accepts any Gymnasium env id, including
the ``module:EnvId`` form (the module is imported first, as ``gym.make`` does, so a ``register_domain``
there counts). An env with no registered domain gets a generic one: its ``info`` fields are read from
one ``reset``, the first ``info`` field holding a list of strings is taken as its list of valid
actions, and the offline proposer uses the domain-agnostic mechanisms (``library/generic.py``). Its
base harness is the shipped ``generic/h0`` (the observation in, the reply out) unless the config
(``harness:``) or ``--harness`` names one.

Library and formats are named by ``"module:NAME"`` strings, resolved on first use (like a Gymnasium
entry point), so the registry imports nothing heavy and nothing that imports it back.
"""

from __future__ import annotations

import functools
import importlib
import re
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

import whale_envs  # noqa: F401  (registers the built-in envs)

#: ``info`` keys every ``TextEnv`` sets; not worth telling a proposer about one by one.
COMMON_INFO = ("task_id", "turn", "max_turns", "error", "error_kind")
#: The base harness of an env with no registered domain: it drives any text env.
GENERIC_HARNESS = "generic/h0"


@dataclass(frozen=True)
class Domain:
    """One env and what WHALE needs to train and search on it.

    Attributes:
        name: a short name (``chess``): the default ``runs/search-<name>`` folder, the archive's
            ``domain`` setting, the key of pretraining shares.
        env_id: the Gymnasium env id (``whale/Chess-v0``, or ``my_module:MyEnv-v0``).
        base_harness: the seed harness, a shipped name (``chess_puzzles/h0``) or a file path; None when a
            config must name one.
        harness_dir: the folder of its shipped harnesses under ``harnesses/`` (None for a user's env).
        harnesses: its shipped harnesses, the base first (the model card calibrates them).
        info_fields: the ``info`` fields a harness can use, as the LLM proposer is told about them.
        actions: what an action looks like, in one sentence (also told to the LLM proposer).
        options_field: an ``info`` field that lists the valid actions (the generic ``choose``
            mechanism picks among them by likelihood); None when there is none.
        library: ``"module:NAME"`` of its offline ``DomainLibrary``; None: the generic mechanisms.
        pretrain_formats: ``"module:NAME"`` of its pretraining ``TextFormats``; None: not pretrained on.
        prompt_edits: ``"module:NAME"`` of its tuple of ``PromptEdit`` (``meta_harness.prompt_only``), the
            offline proposer's prompt rewrites of the base harness in prompt-only mode; None: none.
    """

    name: str
    env_id: str
    base_harness: str | None = None
    harness_dir: str | None = None
    harnesses: tuple[str, ...] = ()
    info_fields: tuple[str, ...] = ()
    actions: str = ""
    options_field: str | None = None
    library: str | None = None
    pretrain_formats: str | None = None
    prompt_edits: str | None = None

    def describe_info(self) -> str:
        """The ``info`` fields and the actions in one line, for the LLM proposer's instructions."""
        fields = ", ".join(self.info_fields) or "(not described: read the traces)"
        return f"{fields}. Actions: {self.actions or 'see the seed harness and the traces'}"

    def load_library(self) -> Any:
        """Its ``DomainLibrary`` (None when it has none and takes the generic mechanisms)."""
        return load_ref(self.library) if self.library else None

    def load_pretrain_formats(self) -> Any:
        """Its pretraining ``TextFormats`` (None when it has none)."""
        return load_ref(self.pretrain_formats) if self.pretrain_formats else None

    def load_prompt_edits(self) -> tuple[Any, ...]:
        """Its prompt-only rewrites (``PromptEdit``), empty when it has none."""
        return tuple(load_ref(self.prompt_edits)) if self.prompt_edits else ()


def builtin_domain(
    name: str,
    env_id: str,
    harness_dir: str,
    harnesses: tuple[str, ...],
    info_fields: tuple[str, ...],
    actions: str,
    options_field: str | None = None,
) -> Domain:
    """A domain shipped with WHALE, its parts where the built-in ones keep them: ``harnesses`` in
    ``harnesses/<harness_dir>/`` (the first is the base), the mechanism library
    ``meta_harness/library/<name>.py:LIBRARY``, the formats ``pretrain/formats.py:<NAME>``, the prompt
    edits ``meta_harness/prompt_only.py:<NAME>_EDITS``; the env's error fields end ``info_fields``."""
    shipped = tuple(f"{harness_dir}/{h}" for h in harnesses)
    return Domain(
        name=name,
        env_id=env_id,
        base_harness=shipped[0],
        harness_dir=harness_dir,
        harnesses=shipped,
        info_fields=(*info_fields, *COMMON_INFO[3:]),
        actions=actions,
        options_field=options_field,
        library=f"whale_train.meta_harness.library.{name}:LIBRARY",
        pretrain_formats=f"whale_train.pretrain.formats:{name.upper()}",
        prompt_edits=f"whale_train.meta_harness.prompt_only:{name.upper()}_EDITS",
    )


_REGISTRY: dict[str, Domain] = {}


def register_domain(domain: Domain, *, replace: bool = False) -> Domain:
    """Add ``domain`` to the registry (keyed by its env id). Registering the same record twice is a no-op
    (a module imported again); a different record for a registered env id needs ``replace=True``."""
    old = _REGISTRY.get(domain.env_id)
    if old is not None and old != domain and not replace:
        raise ValueError(f"a domain for {domain.env_id!r} is registered already ({old.name!r})")
    taken = next((d for d in _REGISTRY.values() if d.name == domain.name and d.env_id != domain.env_id), None)
    if taken is not None:
        raise ValueError(f"domain name {domain.name!r} is taken by {taken.env_id!r}")
    _REGISTRY[domain.env_id] = domain
    domain_for.cache_clear()
    return domain


def registered() -> list[Domain]:
    """The registered domains, in registration order (the built-in ones first)."""
    return list(_REGISTRY.values())


def get_domain(name: str) -> Domain:
    """A registered domain by its name (``math``) or env id."""
    for d in _REGISTRY.values():
        if name in (d.name, d.env_id):
            return d
    raise KeyError(
        f"no registered domain {name!r}; registered: {', '.join(d.name for d in _REGISTRY.values())}"
    )


@functools.cache
def domain_for(env_id: str) -> Domain:
    """The domain of ``env_id``: its registered one, else a generic one for any registered Gymnasium env.

    Raises ``ValueError`` (one line, naming the env id) when the id names no env.
    """
    if env_id in _REGISTRY:
        return _REGISTRY[env_id]
    bare = import_env_module(env_id)
    if bare in _REGISTRY:
        return _REGISTRY[bare]
    return _generic(env_id)


def import_env_module(env_id: str) -> str:
    """Import the ``module`` of a ``module:EnvId`` id (as ``gym.make`` does) and check that the env is
    registered with Gymnasium; return the bare ``EnvId``."""
    module, sep, bare = env_id.partition(":")
    if not sep:
        module, bare = "", env_id
    if module:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ValueError(f"env {env_id!r}: cannot import module {module!r} ({exc})") from None
    if bare not in gym.registry:
        known = ", ".join(d.env_id for d in _REGISTRY.values())
        raise ValueError(
            f"unknown env {env_id!r}: not a registered Gymnasium env (built in: {known}; "
            "a user's env is named module:EnvId)"
        )
    return bare


def _generic(env_id: str) -> Domain:
    """A domain for an env nobody registered one for: ``info`` fields read from one reset."""
    env = gym.make(env_id).unwrapped
    try:
        _, info = env.reset(seed=0)
    finally:
        env.close()
    fields = [k for k in info if k not in COMMON_INFO]
    options = next(
        (
            k
            for k in fields
            if isinstance(info[k], list | tuple) and info[k] and all(isinstance(o, str) for o in info[k])
        ),
        None,
    )
    name = (
        re.sub(r"[^a-z0-9]+", "-", env_id.rpartition(":")[2].rpartition("/")[2].lower()).strip("-") or "env"
    )
    return Domain(
        name=name,
        env_id=env_id,
        base_harness=GENERIC_HARNESS,
        info_fields=(*fields, *COMMON_INFO[3:]),
        options_field=options,
    )


def load_ref(ref: str) -> Any:
    """The object a ``"module:NAME"`` string names."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)
