"""``whale envs``: the registered environments, their task sources (and split sizes with ``--sizes``) and
the registered domains; ``--import MODULE`` lists a user's env and domain too."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence

import gymnasium as gym
from rich.table import Table

import whale_envs
from whale_envs.tasks import SPLITS, source_kinds, split_ids
from whale_train.cli.common import console, make_env
from whale_train.cli.registry import command
from whale_train.errors import CLIError
from whale_train.harness_for import domain_of


@command("envs", help="list the registered environments and their task sources")
def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes", action="store_true", help="also load each bundled source and count its splits")
    p.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import a module first (one that registers a user's env and domain), to list its domain too",
    )
    p.set_defaults(func=cmd_envs)


def cmd_envs(args: argparse.Namespace) -> int:
    before = set(gym.registry)
    _import_modules(args.imports)
    user = {  # what the --import modules registered, named as the commands take them: module:EnvId
        f"{_module_of(env_id, args.imports)}:{env_id}": env_id
        for env_id in sorted(gym.registry)
        if env_id not in whale_envs.ENVS
        and (env_id not in before or _entry_module(env_id).startswith(tuple(args.imports)))
    }
    table = Table(title="WHALE environments" + ("" if args.sizes else " (split sizes: --sizes)"))
    table.add_column("env id", no_wrap=True)  # ids are never cut
    table.add_column("task source kind", no_wrap=True)
    table.add_column("what")
    for col in SPLITS if args.sizes else ():
        table.add_column(col)
    shown = set()
    for env_id in [*sorted(whale_envs.ENVS), *user]:
        domain = domain_of(env_id) if env_id in whale_envs.ENVS else _env_class_domain(user[env_id])
        shown.add(domain)
        for kind in source_kinds(domain):
            sizes = []
            if args.sizes:
                sizes = ["" for _ in SPLITS]
                if not kind.path_required:
                    env = make_env(env_id, kind.kind).unwrapped
                    sizes = [str(len(split_ids(env.source, s))) for s in SPLITS]
            table.add_row(env_id, kind.usage, kind.doc, *sizes)
    for kind in source_kinds():  # a module may register sources for a domain without an env here
        if kind.domain not in shown:
            table.add_row(
                f"(domain {kind.domain})", kind.usage, kind.doc, *(["" for _ in SPLITS] if args.sizes else [])
            )
    console.print(table)
    console.print(domains_table(list(user)))
    return 0


def _entry_module(env_id: str) -> str:
    entry = gym.spec(env_id).entry_point
    return entry.split(":")[0] if isinstance(entry, str) else getattr(entry, "__module__", "")


def _module_of(env_id: str, modules: Sequence[str]) -> str:
    """The --import module that registered ``env_id`` (the entry point's module when it is one of them)."""
    name = _entry_module(env_id)
    return next(
        (m for m in modules if name == m or name.startswith(m + ".")), modules[-1] if modules else name
    )


def _env_class_domain(env_id: str) -> str | None:
    """The ``domain`` of a registered env's class (a TextEnv's task-source domain), None if it has none."""
    entry = gym.spec(env_id).entry_point
    cls = gym.envs.registration.load_env_creator(entry) if isinstance(entry, str) else entry
    return getattr(cls, "domain", None)


def domains_table(user_envs: Sequence[str] = ()) -> Table:
    """The registered domains (the built-in ones, then any a user's module registered): what trains and
    searches on each; a user's env without a registered domain gets a row for the generic one."""
    from whale_train.domains import registered

    table = Table(title="Registered domains (whale train / whale search; a user's env: module:EnvId)")
    for col in ("domain", "env id", "base harness", "offline mechanisms", "prompt edits", "pretraining"):
        table.add_column(col, no_wrap=col in ("domain", "env id"))
    for d in registered():
        table.add_row(
            d.name,
            d.env_id,
            d.base_harness or "(config names its h0)",
            "own library" if d.library else "generic",
            str(len(d.load_prompt_edits())),
            "yes" if d.pretrain_formats else "no",
        )
    known = {d.env_id for d in registered()}
    for env_id in user_envs:
        if env_id not in known and env_id.partition(":")[2] not in known:
            table.add_row("(generic)", env_id, "(config names its h0)", "generic", "0", "no")
    return table


def _import_modules(modules: Sequence[str]) -> None:
    """``--import``: a user's modules (their ``gym.register`` and ``register_domain`` calls run)."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise CLIError(f"--import {module}: cannot import it ({exc})") from None
