"""The mechanism library's core: genomes, mechanisms and constants, and the helpers that render them.

A *genome* is a plain dict that names one mechanism per slot, the values of the constants that matter
under those mechanisms, and (for the memory mechanism) the solved examples to show::

    {"domain": "chess", "slots": {"action": "choose", ...}, "constants": {"temperature": 1.0, ...},
     "examples": [...]}

``DomainLibrary.render(genome, ...)`` writes it out as a readable, self-contained harness module: only
the chosen mechanisms' code, constants as class attributes. That code is real Python, written once in
``mechanisms/`` (or in the shipped harness a mechanism comes from) and copied by ``code_of`` and
``body_of``. Each mechanism and constant says which
failure signals (``evaluate.trace_stats``) it addresses, which is how the proposer picks what to try.
Every domain's ``h0`` genome behaves like the shipped ``h0``.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from whale_train.rollout import Trajectory

Genome = dict[str, Any]


@dataclass(frozen=True)
class Choice:
    """One mechanism for a slot: what it does and the failure signals it targets (signal -> weight)."""

    doc: str
    targets: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Constant:
    """A tunable value; ``active(genome)`` says whether it matters under the genome's mechanisms."""

    values: tuple[Any, ...]
    doc: str
    targets: dict[str, float] = field(default_factory=dict)
    active: Callable[[Genome], bool] = lambda g: True


@dataclass(frozen=True)
class DomainLibrary:
    domain: str
    slots: dict[str, dict[str, Choice]]
    constants: dict[str, Constant]
    h0: Genome
    renderer: Callable[[Genome, str], str]
    harvester: Callable[[Trajectory], dict[str, str] | None]
    max_examples: int = 3

    def render(self, genome: Genome, name: str, doc: str) -> str:
        """The harness module of ``genome``: a docstring (``doc``) and one class named ``name``."""
        body = self.renderer(genome, name)
        return module(doc, body)

    def harvest(self, traj: Trajectory) -> dict[str, str] | None:
        """A solved example for the memory mechanism (None when ``traj`` is not a clean solve)."""
        return self.harvester(traj) if traj.solved else None

    def active_constants(self, genome: Genome) -> dict[str, Any]:
        return {k: v for k, v in genome["constants"].items() if self.constants[k].active(genome)}

    def components(self, genome: Genome) -> dict[str, Any]:
        """Slot -> mechanism and the active constants, for meta.json and the lineage report."""
        out: dict[str, Any] = dict(genome["slots"])
        out.update(self.active_constants(genome))
        if genome.get("examples"):
            out["examples"] = len(genome["examples"])
        return out


def format_retries(values: tuple[int, ...] = (0, 1, 2), reply: str = "reply") -> Constant:
    """The constant every library has: retries after an unparseable ``reply``, with a note on the format
    (the ``generate`` action only)."""
    return Constant(
        values,
        f"retries after an unparseable {reply}",
        {"parse": 0.4},
        lambda g: g["slots"]["action"] == "generate",
    )


#: The sampling temperatures every library tries (h0 samples at the first).
TEMPERATURES = (1.0, 0.7, 0.4, 0.0)


def temperature(
    targets: dict[str, float],
    active: Callable[[Genome], bool] = lambda g: True,
    values: tuple[float, ...] = TEMPERATURES,
) -> Constant:
    """The constant every library has: the sampling temperature, tried for the failures of ``targets``
    (where ``active``: not under a likelihood choice, which samples nothing)."""
    return Constant(values, "sampling temperature", targets, active)


def samples(
    active: Callable[[Genome], bool], values: tuple[int, ...] = (4, 8, 16), per: str = "vote"
) -> Constant:
    """The constant of every library's voting mechanisms: samples per vote (or per reply), tried for wrong
    answers, where ``active`` (a mechanism that samples several)."""
    return Constant(values, f"samples per {per}", {"wrong": 0.3}, active)


def hint_slot(**hints: Choice) -> dict[str, Choice]:
    """The hint slot every built-in domain has: no hint (h0), or one of ``hints`` (a line the render
    puts before the instruction)."""
    return {"none": Choice("no hint (h0)"), **hints}


def memory_slot(item: str) -> dict[str, Choice]:
    """The memory slot every built-in domain has: no examples (h0), or solved ``item``s harvested from
    the archive's traces shown before the current one (``DomainLibrary.harvest``)."""
    return {
        "none": Choice("no examples (h0)"),
        "examples": Choice(
            f"solved {item}s from the archive's traces shown before the {item}", {"wrong": 0.3}
        ),
    }


def seed_genome(domain: str, slots: dict[str, dict[str, Choice]], constants: dict[str, Any]) -> Genome:
    """The genome of a domain's h0: the first choice of every slot (the one whose doc says "(h0)"), the
    h0 values of ``constants``, no examples."""
    first = {slot: next(iter(choices)) for slot, choices in slots.items()}
    return {"domain": domain, "slots": first, "constants": dict(constants), "examples": []}


def key(genome: Genome, library: DomainLibrary) -> str:
    """A canonical string of what the genome does (inactive constants ignored): equal keys, equal harness."""
    return json.dumps(
        {
            "slots": genome["slots"],
            "constants": library.active_constants(genome),
            "examples": genome.get("examples") or [],
        },
        sort_keys=True,
    )


# ------------------------------------------------------------------------------------- rendering


def method(code: str) -> str:
    """Indent a method's code (written flush left) into a class body."""
    return textwrap.indent(textwrap.dedent(code).strip("\n"), "    ")


def code_of(function: Callable[..., Any], **replace: str) -> str:
    """The source of a real method, flush left (for ``method``), as written: ``def`` line, docstring and
    body. The mechanisms that ship as harnesses (``harnesses/<domain>/*.py``) are written there once, run
    and tested as they are, and a candidate that uses one is rendered from that code; the others are
    written in ``library/mechanisms/``.

    ``replace`` changes whole words of the source before it is rendered (``INSTRUCTION='"Reply..."'``):
    how a mechanism written once takes a genome's text (a prompt's instruction as a literal, the ``info``
    field of the chosen notation)."""
    return _replaced(_source(function), replace)


def body_of(function: Callable[..., Any], **replace: str) -> str:
    """The body of a real function, flush left, without its ``def`` line and docstring (``replace`` as
    in ``code_of``): one piece of a method that ``define`` puts together from several.

    Such a *part* is never called: it is a function only so that its code is real code, read and linted
    like the rest. Its parameters are the names its body takes from the method it goes into (``self``,
    ``text``, ``info``...), and its docstring, which is not rendered, says where it goes. The part::

        def python_first(text):
            if text.lower().startswith("python:"):
                return text

    renders as the two lines of its body, for ``define("parse_action(self, text, info)", ...)``."""
    source = _source(function)
    node = ast.parse(source).body[0]
    assert isinstance(node, ast.FunctionDef), function
    body = node.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    assert body, f"{function.__qualname__} has no body to render"
    lines = source.splitlines(keepends=True)[body[0].lineno - 1 : body[-1].end_lineno]
    return _replaced(textwrap.dedent("".join(lines)), replace)


#: The lines of every file mechanisms are rendered from, as they were when its library was imported.
_SOURCES: dict[str, list[str]] = {}


def keep_sources(*owners: Any) -> None:
    """Read now the files of ``owners`` (modules, or classes of a module) that ``code_of``/``body_of`` render
    from, and render from these lines for the rest of the process. A library calls it when it is
    imported: ``inspect.getsource`` reads the file at every call, so a run whose package is edited or
    updated under it (a ``git pull`` during a long run) would render another function from the new file's
    lines, or fail."""
    for owner in owners:
        path = inspect.getsourcefile(owner)
        if path not in _SOURCES:
            with open(path, encoding="utf-8") as f:
                _SOURCES[path] = f.read().splitlines(keepends=True)


def _source(function: Callable[..., Any]) -> str:
    """``function``'s source, flush left, from the lines ``keep_sources`` kept (a file not kept is kept at
    its first use); a file that no longer holds the function where its code says stops with one line."""
    function = inspect.unwrap(function)
    keep_sources(function)
    lines = _SOURCES[inspect.getsourcefile(function)]
    block = inspect.getblock(lines[function.__code__.co_firstlineno - 1 :])
    head = next((line for line in block if not line.lstrip().startswith("@")), "")
    if not re.match(rf"\s*(async\s+)?def\s+{re.escape(function.__name__)}\b", head):
        raise RuntimeError(
            f"the source of {function.__qualname__} moved in {inspect.getsourcefile(function)} since it was "
            "imported: restart the process"
        )
    return textwrap.dedent("".join(block))


def _replaced(source: str, replace: dict[str, str]) -> str:
    for word, text in replace.items():
        source = re.sub(rf"\b{re.escape(word)}\b", lambda _, t=text: t, source)  # t as it is
    return source


def define(signature: str, *snippets: str, doc: str = "") -> str:
    """A method ``def signature:`` whose body is ``snippets`` in order (``body_of`` its parts); each
    snippet is written flush left (indentation inside it is kept) and may be empty."""
    out = [f"    def {signature}:"]
    if doc:
        out.append(f'        """{doc}"""')
    for snippet in snippets:
        if snippet.strip():
            out.append(textwrap.indent(textwrap.dedent(snippet).strip("\n"), " " * 8))
    return "\n".join(out)


def module(doc: str, body: str) -> str:
    """A harness module: docstring, the imports ``body`` uses, then ``body``."""
    names = [
        n for n in ("Harness", "extract_boxed", "extract_tag", "majority") if re.search(rf"\b{n}\b", body)
    ]
    imports = []
    if re.search(r"\bre\.", body):
        imports.append("import re\n\n")
    if names:
        imports.append(f"from harnesses.base import {', '.join(names)}\n")
    doc = doc.replace("\\", "\\\\").replace('"""', "'''").strip()
    return f'"""{doc}\n"""\n\n' + "".join(imports) + "\n\n" + body.rstrip() + "\n"


def py(value: Any) -> str:
    """A Python literal for ``value``, double-quoted like the rest of the code base."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, tuple):
        inner = ", ".join(py(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return "[" + ", ".join(py(v) for v in value) + "]"
    return repr(value)


def class_header(name: str, attrs: dict[str, Any], doc: str) -> str:
    lines = ["class Candidate(Harness):", f'    """{doc}"""', "", f"    name = {py(name)}"]
    lines += [f"    {k} = {py(v)}" for k, v in attrs.items()]
    return "\n".join(lines)


def candidate_header(name: str, genome: Genome, attrs: dict[str, Any]) -> str:
    """A candidate's class line, a docstring naming its mechanisms, and ``attrs`` as class attributes
    (with ``max_examples`` last when its memory mechanism shows examples)."""
    slots = genome["slots"]
    if slots.get("memory") == "examples":
        attrs = {**attrs, "max_examples": 2}
    doc = "; ".join(f"{slot}: {choice}" for slot, choice in slots.items())
    return class_header(name, attrs, f"Offline-proposer harness ({doc}).")


def join_methods(*methods: str) -> str:
    return "\n\n".join(m for m in methods if m)


def string_list(name: str, values: list[Any], comment: str) -> str:
    """A module-level constant list, one item a line."""
    if not values:
        return ""
    items = "".join(f"    {py(v)},\n" for v in values)
    return f"#: {comment}\n{name} = [\n{items}]\n\n\n"


def harvest_answered(traj: Trajectory, question: re.Pattern[str]) -> dict[str, str] | None:
    """A task whose last step answered it (``answer: ...``): the question (``question``'s first group in
    the first observation) and that answer."""
    m = question.search(traj.reset_observation)
    action = traj.steps[-1].action.strip() if traj.steps else ""
    if not m or not action.lower().startswith("answer:"):
        return None
    return {"question": m.group(1).strip(), "answer": action.split(":", 1)[1].strip()}
