"""Domain-agnostic mechanisms, for an env that has no mechanism library of its own (a user's env).

They know nothing of the task, only the harness contract, so they are written on top of the seed
harness: a candidate is the seed's own source followed by a subclass of its harness class that
overrides a hook or two (``HARNESS`` names the subclass; the overrides are written in
``mechanisms/generic.py``). The slots:

* **action**: ``generate`` (the seed's own loop), ``vote`` (self-consistency: several samples, the most
  frequent parsed action), ``choose`` (the option of the domain's ``options_field`` in ``info`` the
  model finds most likely; offered only when the domain lists its valid actions there);
* **retry**: ``seed`` (the seed's own handling) or ``env_error`` (the env's error message for a
  rejected action is shown in the next prompt, and an unparseable reply is retried with a note on the
  format).

Constants: ``temperature``, ``max_tokens``, ``format_retries`` (their seed values are read from the
seed's class, so the ``h0`` genome is the seed unchanged) and ``samples`` (votes).
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass
from typing import Any

from harnesses.base import Harness
from harnesses.validate import validate_source
from whale_train.meta_harness.library.core import (
    TEMPERATURES,
    Choice,
    Constant,
    DomainLibrary,
    Genome,
    code_of,
    format_retries,
    keep_sources,
    method,
    py,
    samples,
    temperature,
)
from whale_train.meta_harness.library.mechanisms import generic as mechanisms

keep_sources(mechanisms)  # the code candidates are rendered from, as imported

#: The class attributes a genome's constants set, with the base class's defaults.
TUNED = ("temperature", "max_tokens", "format_retries")


@dataclass(frozen=True)
class SeedLibrary(DomainLibrary):
    """A ``DomainLibrary`` whose candidates extend the seed's own source instead of replacing it."""

    seed_source: str = ""
    seed_class: str = ""
    options_field: str | None = None

    def render(self, genome: Genome, name: str, doc: str) -> str:
        return _render(self, genome, name, doc)


def seed_library(seed_source: str, domain: str, options_field: str | None = None) -> SeedLibrary:
    """The generic mechanisms on top of ``seed_source`` (a validated harness module)."""
    seed_class = validate_source(seed_source).class_name
    values = _seed_values(seed_source, seed_class)
    action = {
        "generate": Choice("the seed's own replies (h0)"),
        "vote": Choice(
            "self-consistency: several samples, the most frequent parsed action", {"wrong": 0.8, "parse": 0.3}
        ),
    }
    if options_field:
        action["choose"] = Choice(
            f"the option listed in info[{options_field!r}] the model finds most likely (never an invalid action)",
            {"illegal": 1.0, "parse": 1.0, "wrong": 0.3},
        )
    slots = {
        "action": action,
        "retry": {
            "seed": Choice("the seed's own handling of errors (h0)"),
            "env_error": Choice(
                "the env's error for a rejected action shown in the next prompt; an unparseable reply retried"
                " with a note on the format",
                {"parse": 0.6, "illegal": 0.6, "incomplete": 0.3},
            ),
        },
    }
    not_choose = lambda g: g["slots"]["action"] != "choose"  # noqa: E731
    tokens = int(values["max_tokens"])
    constants = {
        "temperature": temperature(
            {"wrong": 0.3, "parse": 0.2},
            not_choose,
            _values(TEMPERATURES, values["temperature"], reverse=True),
        ),
        "max_tokens": Constant(
            _values((max(8, tokens // 2), tokens * 2), tokens),
            "tokens per reply",
            {"truncated": 1.0},
            not_choose,
        ),
        "format_retries": format_retries(_values((0, 1, 2), values["format_retries"])),
        "samples": samples(lambda g: g["slots"]["action"] == "vote"),
    }
    h0: Genome = {
        "domain": domain,
        "slots": {"action": "generate", "retry": "seed"},
        "constants": {**{k: values[k] for k in TUNED}, "samples": 8},
        "examples": [],
    }
    return SeedLibrary(
        domain,
        slots,
        constants,
        h0,
        renderer=lambda g, name: "",  # unused: ``render`` is overridden
        harvester=lambda traj: None,  # no memory slot: nothing domain-agnostic to harvest
        seed_source=seed_source,
        seed_class=seed_class,
        options_field=options_field,
    )


def _values(base: tuple[Any, ...], seed: Any, reverse: bool = False) -> tuple[Any, ...]:
    return tuple(sorted(set(base) | {seed}, reverse=reverse))


def _seed_values(source: str, class_name: str) -> dict[str, Any]:
    """The seed class's ``TUNED`` attributes: set in the class (or a base class in the same file), else
    the ``Harness`` defaults. Only literal assignments count."""
    tree = ast.parse(source)
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    chain, name = [], class_name
    while name in classes and name not in chain:
        chain.append(name)
        bases = [b.id for b in classes[name].bases if isinstance(b, ast.Name)]
        name = bases[0] if bases else ""
    values: dict[str, Any] = {k: getattr(Harness, k) for k in TUNED}
    for cls in reversed(chain):  # the most derived class wins
        for node in classes[cls].body:
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
            ):
                if node.targets[0].id in TUNED:
                    try:
                        values[node.targets[0].id] = ast.literal_eval(node.value)
                    except ValueError:
                        pass
    return values


def _render(lib: SeedLibrary, g: Genome, name: str, doc: str) -> str:
    s, c = g["slots"], g["constants"]
    seed_values = lib.h0["constants"]
    taken = {n.name for n in ast.parse(lib.seed_source).body if isinstance(n, ast.ClassDef)}
    cls = "Candidate"
    while cls in taken:  # the seed's own class may be called Candidate
        cls += "_"
    attrs: dict[str, Any] = {}
    for k in TUNED:
        if lib.constants[k].active(g) and c[k] != seed_values[k]:
            attrs[k] = c[k]
    if s["action"] == "vote":
        attrs["samples"] = c["samples"]
    if s["action"] == "choose":
        attrs["options_field"] = lib.options_field
    doc = doc.replace("\\", "\\\\").replace('"""', "'''").strip()
    lines = [f"class {cls}({lib.seed_class}):", textwrap.indent(f'"""{doc}\n"""', "    "), ""]
    lines += [f"    name = {py(name)}"] + [f"    {k} = {py(v)}" for k, v in attrs.items()]
    methods = []
    if s["action"] == "vote":
        methods.append(mechanisms.ActionVote.act)
    elif s["action"] == "choose":
        methods.append(mechanisms.ActionChoose.act)
    if s["retry"] == "env_error":
        methods += [mechanisms.RetryEnvError.format_observation, mechanisms.RetryEnvError.on_parse_error]
    body = "\n".join(lines) + "".join("\n\n" + method(code_of(m)) for m in methods)
    imports = "from harnesses.base import majority\n\n\n" if s["action"] == "vote" else ""
    head = f"# ---- {name}: the seed above, extended by the offline proposer's generic mechanisms ----\n"
    return f"{lib.seed_source.rstrip()}\n\n\n{head}{imports}{body}\n\n\nHARNESS = {cls}\n"
