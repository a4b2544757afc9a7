"""Static validation and restricted loading of harness code.

Harness code written by a proposer is untrusted. Three layers keep it in its lane:

1. ``validate_source`` (AST): imports only from ``ALLOWED_MODULES`` (no chess, sympy, os, io, ...);
   no ``eval``/``exec``/``open``/``getattr``/``__import__`` and friends; no dunder attributes (the
   classic ``().__class__.__subclasses__()`` escapes); underscore attributes only on ``self``/``cls``;
   exactly one ``Harness`` subclass (or a module-level ``HARNESS`` naming one).
2. ``load_class`` executes the module with restricted builtins and an import hook that hands out
   *views* of the allowed modules: their public names minus any module object, so ``json.codecs`` or
   ``typing.sys`` do not lead to ``os``.
3. The engine runs untrusted harnesses in a separate worker process whose memory holds no task, no
   answer and no weights (see ``harnesses.worker``), with time and memory limits and, where the kernel
   allows it, no network and no filesystem beyond a scratch directory. This process boundary is the
   guarantee; layers 1-2 reject most mistakes early with a clear message.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import re
import string
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Standard-library modules a harness may import (and what ``harnesses.base`` exports).
ALLOWED_MODULES = frozenset(
    {
        "__future__",
        "abc",
        "bisect",
        "collections",
        "copy",
        "dataclasses",
        "difflib",
        "enum",
        "functools",
        "heapq",
        "itertools",
        "json",
        "math",
        "random",
        "re",
        "statistics",
        "string",
        "textwrap",
        "typing",
        "harnesses.base",
    }
)

FORBIDDEN_NAMES = frozenset(
    {
        "eval",
        "exec",
        "compile",
        "open",
        "__import__",
        "globals",
        "locals",
        "vars",
        "getattr",
        "setattr",
        "delattr",
        "input",
        "breakpoint",
        "memoryview",
        "help",
        "exit",
        "quit",
        "__builtins__",
        "__loader__",
        "__spec__",
        "dir",
        # Run-time resolution of string annotations evaluates text with a module's globals.
        "get_type_hints",
        "ForwardRef",
        "singledispatch",
        "singledispatchmethod",
        # Format-string field names (``"{0.attr}"``) are attribute access the AST cannot see.
        "Formatter",
    }
)

#: Attributes never allowed, on anything: computed attribute access, string-annotation evaluation,
#: and the ways from a generator, coroutine, frame or traceback to a frame's globals.
FORBIDDEN_ATTRS = FORBIDDEN_NAMES | frozenset(
    {
        "format_map",
        "vformat",
        "get_field",
        "get_value",
        "mro",
        "gi_frame",
        "gi_code",
        "gi_yieldfrom",
        "cr_frame",
        "cr_code",
        "cr_await",
        "ag_frame",
        "ag_code",
        "ag_await",
        "tb_frame",
        "tb_next",
        "f_back",
        "f_globals",
        "f_locals",
        "f_builtins",
        "f_code",
        "co_consts",
        "co_code",
    }
)

#: Dunder names a harness may use (defining them in a class, or ``super().__init__()``).
ALLOWED_DUNDERS = frozenset(
    {
        "__init__",
        "__post_init__",
        "__name__",
        "__len__",
        "__iter__",
        "__next__",
        "__repr__",
        "__str__",
        "__eq__",
        "__lt__",
        "__hash__",
        "__contains__",
        "__getitem__",
        "__annotations__",
        "__future__",
    }
)


#: Module names of the harnesses shipped with the package (``harnesses.chess_puzzles.h0``, ...): a
#: harness may build on one (``from harnesses.chess_puzzles.h0 import ChessH0``). Found from the
#: package on first use; the worker process, which cannot see the package, is told them.
SHIPPED_MODULES: frozenset[str] | None = None


def shipped_harnesses(domain: str | None = None) -> list[str]:
    """Names of the harnesses shipped with the package (``chess_puzzles/h0``, ...): the files of its
    domain folders (``harnesses.loader`` re-exports this)."""
    package = Path(__file__).resolve().parent  # here, not at import: the worker's inlined copy has no file
    names = []
    for path in sorted(package.glob("*/*.py")):
        if path.name.startswith("_") or path.parent.name.startswith("_"):
            continue
        if domain is None or path.parent.name == domain:
            names.append(f"{path.parent.name}/{path.stem}")
    return names


def shipped_modules() -> frozenset[str]:
    global SHIPPED_MODULES
    if SHIPPED_MODULES is None:
        SHIPPED_MODULES = frozenset("harnesses." + name.replace("/", ".") for name in shipped_harnesses())
    return SHIPPED_MODULES


def _allowed_module(name: str) -> bool:
    return name in ALLOWED_MODULES or name in shipped_modules()


class HarnessValidationError(ValueError):
    """The harness code breaks a rule; the message names the line and the rule."""


@dataclass(frozen=True)
class ValidationReport:
    class_name: str
    imports: tuple[str, ...]


def validate_source(source: str, filename: str = "<harness>") -> ValidationReport:
    """Check ``source`` against the rules above; return the harness class name and the imports used."""
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as exc:
        raise HarnessValidationError(f"{filename}:{exc.lineno}: syntax error: {exc.msg}") from None
    imports: list[str] = []

    def fail(node: ast.AST, why: str) -> None:
        raise HarnessValidationError(f"{filename}:{getattr(node, 'lineno', '?')}: {why}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not _allowed_module(alias.name) or alias.name.startswith("harnesses"):
                    fail(node, f"import of {alias.name!r} is not allowed (allowed: {_allowed()})")
                imports.append(alias.name)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level or not _allowed_module(module):
                fail(node, f"import from {module or '.'!r} is not allowed (allowed: {_allowed()})")
            for alias in node.names:
                if alias.name == "*":
                    fail(node, "'from ... import *' is not allowed")
                if alias.name.startswith("_") and module != "__future__":
                    fail(node, f"importing the private name {alias.name!r} is not allowed")
            imports.append(module)
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            fail(node, f"{node.id!r} is not allowed in a harness")
        elif isinstance(node, ast.Name) and node.id in ("__match_args__", "__class__", "__dict__"):
            # ``__match_args__`` makes a positional ``case C(x)`` read any attribute it names
            fail(node, f"{node.id!r} is not allowed in a harness")
        elif isinstance(node, ast.Attribute):
            _check_attr(
                node, node.attr, isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"), fail
            )
            if node.attr == "format":
                _check_format(node, fail)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and re.fullmatch(r"__\w+__", node.value)
            and node.value not in ALLOWED_DUNDERS
        ):
            fail(node, f"the string {node.value!r} names a special attribute, which is not allowed")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "type"
            and len(node.args) + len(node.keywords) > 1
        ):
            fail(node, "building a class with type(name, bases, dict) is not allowed (use a class statement)")
        elif isinstance(node, ast.MatchClass):  # ``case object(__class__=c)`` reads an attribute
            for attr in node.kwd_attrs:
                _check_attr(node, attr, False, fail)
        elif isinstance(node, ast.Global | ast.Nonlocal) and any(n in FORBIDDEN_NAMES for n in node.names):
            fail(node, "rebinding a forbidden name is not allowed")
        elif isinstance(node, ast.alias) and (node.asname or node.name) in FORBIDDEN_NAMES:
            fail(node, f"importing {node.name!r} is not allowed")
    return ValidationReport(_harness_class(tree, fail), tuple(dict.fromkeys(imports)))


def _check_attr(node: ast.AST, attr: str, on_self: bool, fail) -> None:
    if attr.startswith("__") and attr.endswith("__") and attr not in ALLOWED_DUNDERS:
        fail(node, f"the attribute {attr!r} is not allowed")
    if attr.startswith("_") and not on_self:
        fail(node, f"private attribute {attr!r} may only be used on self")
    if attr in FORBIDDEN_ATTRS:
        fail(node, f"the attribute {attr!r} is not allowed")


def _check_format(node: ast.Attribute, fail) -> None:
    """``str.format`` only on a literal whose fields read no attribute: ``"{x.attr}"`` is a getattr the
    AST cannot see, and a computed format string could spell any attribute."""
    if not (isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
        fail(node, "'.format' is only allowed on a string literal (use an f-string)")
    try:
        fields = [f for _, f, spec, _ in string.Formatter().parse(node.value.value) for f in (f, spec) if f]
    except ValueError as exc:
        fail(node, f"malformed format string: {exc}")
    for field in fields:
        if "." in field or "{" in field:
            fail(node, f"the format field {field!r} reads an attribute (use an f-string)")


def _allowed() -> str:
    return (
        ", ".join(sorted(m for m in ALLOWED_MODULES if m != "__future__"))
        + ", and the shipped harness modules"
    )


def _harness_class(tree: ast.Module, fail) -> str:
    named = [
        n.value.id
        for n in tree.body
        if isinstance(n, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "HARNESS" for t in n.targets)
        and isinstance(n.value, ast.Name)
    ]
    classes = [n.name for n in tree.body if isinstance(n, ast.ClassDef)]
    if named:
        if named[-1] not in classes:
            fail(tree, f"HARNESS names {named[-1]!r}, which is not a class defined in the file")
        return named[-1]
    subclasses = [
        n.name
        for n in tree.body
        if isinstance(n, ast.ClassDef) and any(_base_name(b) in _harness_bases(tree) for b in n.bases)
    ]
    if len(subclasses) == 1:
        return subclasses[0]
    if not subclasses:
        raise HarnessValidationError("no harness class: define one subclass of harnesses.base.Harness")
    raise HarnessValidationError(
        f"several harness classes ({', '.join(subclasses)}): set HARNESS = <the one to run>"
    )


def _base_name(node: ast.expr) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def _harness_bases(tree: ast.Module) -> set[str]:
    """``Harness``, the classes imported from shipped harnesses, and every class of the file that
    (transitively) derives from one of them."""
    bases = {"Harness"}
    for n in tree.body:
        if (
            isinstance(n, ast.ImportFrom)
            and (n.module or "").startswith("harnesses.")
            and n.module != "harnesses.base"
        ):
            bases.update(alias.asname or alias.name for alias in n.names)
    changed = True
    while changed:
        changed = False
        for n in tree.body:
            if (
                isinstance(n, ast.ClassDef)
                and n.name not in bases
                and any(_base_name(b) in bases for b in n.bases)
            ):
                bases.add(n.name)
                changed = True
    return bases


# ------------------------------------------------------------------------------ restricted exec


_SAFE_BUILTINS = {
    name: getattr(builtins, name)
    for name in dir(builtins)
    if not name.startswith("_")
    and name not in FORBIDDEN_NAMES
    and name not in ("type", "object", "classmethod")
}
_SAFE_BUILTINS.update(
    {"object": object, "classmethod": classmethod, "type": type, "__build_class__": builtins.__build_class__}
)


_VIEWS: dict[str, types.ModuleType] = {}


def _module_view(name: str) -> types.ModuleType:
    """A stand-in for an allowed module: its public names, no module objects (no path to ``os``).

    Built once per process (the worker's template builds them before it forks the episodes, each of
    which then changes only its own copy)."""
    if name not in _VIEWS:
        _VIEWS[name] = _build_view(name)
    return _VIEWS[name]


def _build_view(name: str) -> types.ModuleType:
    module = importlib.import_module(name)
    if name == "__future__":
        return module
    view = types.ModuleType(name)
    names = getattr(module, "__all__", None) or [n for n in dir(module) if not n.startswith("_")]
    for attr in names:
        value = getattr(module, attr, None)
        if attr in FORBIDDEN_NAMES:
            continue
        if value is not None and not isinstance(value, types.ModuleType):
            setattr(view, attr, value)
    return view


def _restricted_import(name: str, globals=None, locals=None, fromlist=(), level=0):
    if level or not _allowed_module(name):
        raise ImportError(f"import of {name!r} is not allowed in a harness")
    if name.startswith("harnesses") and not fromlist:
        raise ImportError(f"use 'from {name} import ...'")
    return _module_view(name)


def load_class(
    source: str, filename: str = "<harness>", *, restricted: bool = True, prepared: tuple | None = None
) -> type:
    """Validate and execute harness ``source``; return its harness class.

    ``restricted=False`` is for harnesses shipped with the package when trusted execution is asked
    for: the same validation, normal builtins. ``prepared``: ``prepare(source)`` done once already (the
    worker's template validates and compiles, each episode process only executes).
    """
    from harnesses.base import Harness

    report, code = prepared or prepare(source, filename)
    namespace: dict[str, Any] = {"__name__": "harness_module", "__file__": filename}
    if restricted:
        namespace["__builtins__"] = {**_SAFE_BUILTINS, "__import__": _restricted_import}
    exec(code, namespace)  # noqa: S102 - validated; untrusted code only runs in a sandboxed episode process
    cls = namespace.get(report.class_name)
    if not (isinstance(cls, type) and issubclass(cls, Harness)):
        raise HarnessValidationError(
            f"{filename}: {report.class_name!r} is not a subclass of harnesses.base.Harness"
        )
    return cls


def prepare(source: str, filename: str = "<harness>") -> tuple[ValidationReport, Any]:
    """Validate and compile (nothing of the harness runs): ``(report, code)`` for ``load_class``."""
    report = validate_source(source, filename)
    for name in report.imports:  # warm the module views (imports only: shipped or standard modules)
        _module_view(name)
    return report, compile(source, filename, "exec")
