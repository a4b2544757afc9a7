"""Static validation and restricted loading of harness code.

Harness code written by a proposer is untrusted. Three layers keep it in its lane:

1. ``validate_source`` (AST) is an **allow-list**, a first filter with a clear message:
   imports only from :data:`IMPORTS` and only the names listed there (each with the reason it is safe
   and what is left out); no attribute beginning with ``_`` on anything, ``self`` included, except
   :data:`SPECIAL_ATTRS` (``super().__init__()``); no special (dunder) names as variables, parameters or
   keywords; special methods defined only from :data:`SPECIAL_METHODS` (no ``__getattr__``,
   ``__setattr__``, ``__reduce__``, ``__init_subclass__``, ``__set_name__``, ``__class_getitem__``, ...);
   classes without keywords (no metaclass), with plain names as bases and no decorator but
   ``dataclass``; none of :data:`FORBIDDEN_NAMES` (``type``, ``getattr``, ``eval``, ``open``, ...);
   ``str.format`` only on a literal whose fields read no attribute; exactly one ``Harness`` subclass
   (or a module-level ``HARNESS`` naming one).
2. ``load_class`` executes the module with restricted builtins and an import hook that hands out
   *views* of the allowed modules holding exactly the names of :data:`IMPORTS` (no module objects, so
   ``json.codecs`` or ``typing.sys`` do not lead to ``os``): an aliased or computed use of a refused name
   finds nothing there either.
3. The engine runs untrusted harnesses in a separate worker process whose memory holds no task, no
   answer and no weights (see ``harnesses.worker``), in the OS sandbox (no network, a read-only file
   system, its own uid), and each episode in namespaces of its own (no socket, shared memory, signal or
   /proc view reaches a sibling episode). This process boundary is the guarantee; layers 1-2 reject
   most mistakes and attacks early with a clear message.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import re
import string
import types
from dataclasses import dataclass
from typing import Any

#: ``IMPORTS[module] = (names, why)``: what a harness may import and use from ``module``. ``names`` is
#: ``ALL_PUBLIC`` for modules of plain functions and constants (every public name); otherwise the
#: exact names. ``why`` says why these are safe and what is left out. The module views of layer 2
#: hold exactly these names.
ALL_PUBLIC = None
IMPORTS: dict[str, tuple[frozenset[str] | None, str]] = {
    "__future__": (frozenset({"annotations"}), "postponed annotations: strings nothing here evaluates"),
    "abc": (
        frozenset({"ABC", "abstractmethod"}),
        "abstract bases; ABCMeta (a metaclass) and register are left out",
    ),
    "bisect": (ALL_PUBLIC, "functions on sorted lists"),
    "collections": (
        frozenset({"ChainMap", "Counter", "OrderedDict", "defaultdict", "deque"}),
        "containers; namedtuple (it generates code from strings) is left out",
    ),
    "dataclasses": (
        frozenset({"asdict", "astuple", "dataclass", "field", "replace"}),
        "records whose fields are identifiers the lint checks; make_dataclass and fields (names from "
        "strings, field objects) are left out",
    ),
    "difflib": (ALL_PUBLIC, "sequence matching on text"),
    "functools": (
        frozenset({"cache", "cmp_to_key", "lru_cache", "partial", "reduce"}),
        "wraps/update_wrapper (copy attributes named by strings), singledispatch (resolves annotations), "
        "cached_property (__set_name__) and total_ordering (sets special methods) are left out",
    ),
    "heapq": (ALL_PUBLIC, "heap functions"),
    "itertools": (ALL_PUBLIC, "iterator building blocks"),
    "json": (frozenset({"JSONDecodeError", "dumps", "loads"}), "text <-> plain data"),
    "math": (ALL_PUBLIC, "numeric functions and constants"),
    "random": (
        frozenset(
            {"Random", "choice", "choices", "gauss", "randint", "random", "randrange", "sample"}
            | {"seed", "shuffle", "uniform"}
        ),
        "seeded sampling",
    ),
    "re": (
        frozenset({"compile", "escape", "findall", "finditer", "fullmatch", "match", "search", "split"})
        | frozenset({"sub", "subn", "error", "A", "ASCII", "I", "IGNORECASE", "M", "MULTILINE", "S"})
        | frozenset({"DOTALL", "X", "VERBOSE"}),
        "regular expressions",
    ),
    "statistics": (ALL_PUBLIC, "descriptive statistics"),
    "string": (
        frozenset({"ascii_letters", "ascii_lowercase", "ascii_uppercase", "capwords", "digits"})
        | frozenset({"hexdigits", "octdigits", "printable", "punctuation", "whitespace", "Template"}),
        "constants and Template; Formatter (reads attributes named in text) is left out",
    ),
    "textwrap": (ALL_PUBLIC, "text wrapping"),
    "typing": (
        frozenset({"Any", "Callable", "Dict", "Iterable", "Iterator", "List", "Mapping", "Optional"})
        | frozenset({"Sequence", "Set", "Tuple", "Union"}),
        "annotation names only; get_type_hints, get_args, ForwardRef (they evaluate or expose "
        "annotation text), NamedTuple, TypedDict, Generic and Protocol (class machinery) are left out",
    ),
    "harnesses.base": (
        frozenset({"Harness", "HarnessCallError", "extract_boxed", "extract_tag", "majority"}),
        "the harness API",
    ),
}
#: The standard-library modules a harness may import (and ``harnesses.base``).
ALLOWED_MODULES = frozenset(IMPORTS)

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
        "type",  # type(x) leads to the class machinery; type(name, bases, dict) builds a class from strings
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

#: Attributes never allowed, on anything (besides every name beginning with ``_``): computed attribute
#: access, string-annotation evaluation, and the ways from a generator, coroutine, frame or traceback
#: to a frame's globals.
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
        "evaluate",
    }
)

#: The only attributes beginning with ``_`` a harness may name: ``super().__init__()`` and
#: ``super().__post_init__()``. (The shipped and generated harnesses need no other.)
SPECIAL_ATTRS = frozenset({"__init__", "__post_init__"})

#: The special methods a harness class may define: construction, text, comparison and container
#: protocols. Not ``__getattr__``/``__setattr__`` (they receive attribute names as strings),
#: ``__reduce__``/``__getstate__``/``__deepcopy__`` (the copy protocols call what they return),
#: ``__init_subclass__``/``__set_name__``/``__class_getitem__``/``__new__`` (class machinery), ``__del__``.
SPECIAL_METHODS = frozenset(
    {
        "__init__",
        "__post_init__",
        "__repr__",
        "__str__",
        "__len__",
        "__bool__",
        "__iter__",
        "__next__",
        "__contains__",
        "__getitem__",
        "__eq__",
        "__ne__",
        "__lt__",
        "__le__",
        "__gt__",
        "__ge__",
        "__hash__",
    }
)

#: Special names a harness may read as variables: ``__name__`` (``"harness_module"``).
SPECIAL_VARIABLES = frozenset({"__name__"})

#: Decorators a class may have (``@dataclass`` and ``@dataclass(...)``, also as ``dataclasses.dataclass``).
CLASS_DECORATORS = frozenset({"dataclass"})

#: String literals that look like special names but only name allowed ones (``"__main__"``, ...).
_ALLOWED_SPECIAL_TEXT = SPECIAL_ATTRS | SPECIAL_METHODS | SPECIAL_VARIABLES | {"__main__", "__future__"}


#: Module names of the harnesses shipped with the package (``harnesses.chess_puzzles.h0``, ...): a
#: harness may build on one (``from harnesses.chess_puzzles.h0 import ChessH0``). Found from the
#: package on first use; the worker process, which cannot see the package, is told them.
SHIPPED_MODULES: frozenset[str] | None = None


def shipped_harnesses(domain: str | None = None) -> list[str]:
    """Names of the harnesses shipped with the package (``chess_puzzles/h0``, ...): the files of its
    domain folders (``harnesses.loader`` re-exports this)."""
    from pathlib import Path  # here, not at import: the harness worker starts without it (8 ms)

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


def _allowed_name(module: str, name: str) -> bool:
    """Whether ``from module import name`` (or ``module.name``) is allowed. A shipped harness module
    offers its public classes (its view checks that each was defined in a harness module)."""
    if name.startswith("_") or name in FORBIDDEN_NAMES:
        return module == "__future__" and name == "annotations"
    if module in IMPORTS:
        names = IMPORTS[module][0]
        return names is ALL_PUBLIC or name in names
    return module in shipped_modules()


def _is_special(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


class HarnessValidationError(ValueError):
    """The harness code breaks a rule; the message names the line and the rule."""


@dataclass(frozen=True)
class ValidationReport:
    class_name: str
    imports: tuple[str, ...]


def validate_source(source: str, filename: str = "<harness>") -> ValidationReport:
    """Check ``source`` against the rules above; return the harness class name and the imports used.

    Raises :class:`HarnessValidationError` with one line ``file:line: rule`` at the first rule broken;
    nothing of the source runs."""
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as exc:
        raise HarnessValidationError(f"{filename}:{exc.lineno}: syntax error: {exc.msg}") from None
    imports: list[str] = []
    modules: dict[str, str] = {}  # local name -> module, for ``import json`` / ``import json as j``

    def fail(node: ast.AST, why: str) -> None:
        raise HarnessValidationError(f"{filename}:{getattr(node, 'lineno', '?')}: {why}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not _allowed_module(alias.name) or alias.name.startswith("harnesses"):
                    fail(node, f"import of {alias.name!r} is not allowed (allowed: {_allowed()})")
                imports.append(alias.name)
                if alias.asname or "." not in alias.name:
                    modules[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level or not _allowed_module(module):
                fail(node, f"import from {module or '.'!r} is not allowed (allowed: {_allowed()})")
            for alias in node.names:
                if alias.name == "*":
                    fail(node, "'from ... import *' is not allowed")
                if alias.name.startswith("_") and module != "__future__":
                    fail(node, f"importing the private name {alias.name!r} is not allowed")
                if not _allowed_name(module, alias.name):
                    fail(node, f"{module}.{alias.name} is not allowed ({_why(module)})")
            imports.append(module)
        elif isinstance(node, ast.Name):
            if node.id in FORBIDDEN_NAMES:
                fail(node, f"{node.id!r} is not allowed in a harness")
            if _is_special(node.id) and node.id not in SPECIAL_VARIABLES:
                fail(node, f"the special name {node.id!r} is not allowed in a harness")
        elif isinstance(node, ast.Attribute):
            _check_attr(node, node.attr, fail)
            if isinstance(node.value, ast.Name) and node.value.id in modules:
                module = modules[node.value.id]
                if not _allowed_name(module, node.attr):
                    fail(node, f"{module}.{node.attr} is not allowed ({_why(module)})")
            if node.attr == "format":
                _check_format(node, fail)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and re.fullmatch(r"__\w+__", node.value)
            and node.value not in _ALLOWED_SPECIAL_TEXT
        ):
            fail(node, f"the string {node.value!r} names a special attribute, which is not allowed")
        elif isinstance(node, ast.MatchClass):  # ``case object(__class__=c)`` reads an attribute
            for attr in node.kwd_attrs:
                _check_attr(node, attr, fail)
        elif isinstance(node, ast.ClassDef):
            _check_class(node, fail)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _is_special(node.name):
            if node.name not in SPECIAL_METHODS:
                fail(
                    node,
                    f"defining {node.name!r} is not allowed (allowed: {', '.join(sorted(SPECIAL_METHODS))})",
                )
        for ident in _bound_identifiers(node):
            if ident in FORBIDDEN_NAMES or _is_special(ident):
                fail(node, f"the name {ident!r} is not allowed in a harness")
    return ValidationReport(_harness_class(tree, fail), tuple(dict.fromkeys(imports)))


def _bound_identifiers(node: ast.AST) -> list[str]:
    """Identifiers a node binds or names that are not ``ast.Name`` nodes (parameters, keywords, ...)."""
    if isinstance(node, ast.arg):
        return [node.arg]
    if isinstance(node, ast.keyword):
        return [node.arg] if node.arg else []
    if isinstance(node, ast.Global | ast.Nonlocal):
        return list(node.names)
    if isinstance(node, ast.alias):
        return [node.asname] if node.asname else []
    if isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar):
        return [node.name] if node.name else []
    if isinstance(node, ast.MatchMapping):
        return [node.rest] if node.rest else []
    if isinstance(node, ast.ClassDef):
        return [node.name]
    return []


def _check_attr(node: ast.AST, attr: str, fail) -> None:
    if _is_special(attr) and attr not in SPECIAL_ATTRS:
        fail(node, f"the attribute {attr!r} is not allowed (no special attribute but super().__init__)")
    if attr.startswith("_") and attr not in SPECIAL_ATTRS:
        fail(node, f"the private attribute {attr!r} is not allowed (not on self either)")
    if attr in FORBIDDEN_ATTRS:
        fail(node, f"the attribute {attr!r} is not allowed")


def _check_class(node: ast.ClassDef, fail) -> None:
    """No keywords (``metaclass=``, arguments to ``__init_subclass__``), bases that are plain (dotted)
    names, and no decorator but ``dataclass``."""
    if node.keywords:
        fail(node, f"class {node.name}: class keywords ({node.keywords[0].arg}=...) are not allowed")
    for base in node.bases:
        if not _dotted(base):
            fail(node, f"class {node.name}: a base must be a class name, not an expression")
    for deco in node.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        if _base_name(target) not in CLASS_DECORATORS or not _dotted(target):
            fail(deco, f"class {node.name}: the only class decorator allowed is @dataclass")


def _dotted(node: ast.expr) -> bool:
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name)


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


def _why(module: str) -> str:
    if module in IMPORTS:
        names = IMPORTS[module][0]
        listed = "every public name" if names is ALL_PUBLIC else ", ".join(sorted(names))
        return f"allowed from {module}: {listed}; {IMPORTS[module][1]}"
    return "a shipped harness module offers its public classes"


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


#: The builtins harness code runs with: the public ones minus :data:`FORBIDDEN_NAMES` (``type`` among
#: them), plus ``__build_class__`` for class statements.
_SAFE_BUILTINS = {
    name: getattr(builtins, name)
    for name in dir(builtins)
    if not name.startswith("_") and name not in FORBIDDEN_NAMES
}
_SAFE_BUILTINS["__build_class__"] = builtins.__build_class__


_VIEWS: dict[str, types.ModuleType] = {}


def _module_view(name: str) -> types.ModuleType:
    """A stand-in for an allowed module: its public names, no module objects (no path to ``os``).

    Built once per process (the worker's template builds them before it forks the episodes, each of
    which then changes only its own copy)."""
    if name not in _VIEWS:
        _VIEWS[name] = _build_view(name)
    return _VIEWS[name]


def _build_view(name: str) -> types.ModuleType:
    """The names of :data:`IMPORTS` (every public one for ``ALL_PUBLIC``); of a shipped harness module,
    its public classes and functions defined in a harness module. Never a module object."""
    module = importlib.import_module(name)
    view = types.ModuleType(name)
    if name in IMPORTS and IMPORTS[name][0] is not ALL_PUBLIC:
        names = sorted(IMPORTS[name][0])
    else:
        names = getattr(module, "__all__", None) or [n for n in dir(module) if not n.startswith("_")]
    for attr in names:
        value = getattr(module, attr, None)
        if attr in FORBIDDEN_NAMES or (attr.startswith("_") and name != "__future__"):
            continue
        if name not in IMPORTS and not str(getattr(value, "__module__", "")).startswith("harnesses."):
            continue  # a shipped harness module: only what the harness modules define
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
