"""The layering the code obeys, read from the source: every import of every module (at the top and
inside functions), resolved to the project module it names.

* ``whale_envs`` imports nothing of ``harnesses`` or ``whale_train``;
* ``harnesses`` imports nothing of ``whale_train``;
* no import cycle between modules.

Nothing breaks a rule today: the two lists below are empty, and the tests assert the code matches
them exactly (a new upward import or a new cycle fails them; ``cycles`` itself is checked on a small
package that has one).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("whale_envs", "harnesses", "whale_train")
#: A package may import only the packages listed after it here (whale_envs <- harnesses <- whale_train).
MAY_NOT_IMPORT = {"whale_envs": ("harnesses", "whale_train"), "harnesses": ("whale_train",)}

#: (importer, imported) arrows that run up, and the cycles (as sorted module lists) allowed to remain.
KNOWN_VIOLATIONS: set[tuple[str, str]] = set()  # check_harness lives in whale_train/check.py, by the engine
KNOWN_CYCLES: set[tuple[str, ...]] = set()


def project_modules() -> dict[str, Path]:
    """Module name -> file, for every module of the three packages."""
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules ``name`` imports anywhere in its file (``from a import b`` names module
    ``a.b`` when there is one, else ``a``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in known:  # import a.b.c of a non-project c: the module a.b
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports(name, path, set(modules)) for name, path in modules.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_import_reader_sees_imports_at_the_top_inside_functions_and_relative_ones(tmp_path):
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from p import a\n")
    (pkg / "a.py").write_text("import os\nfrom . import b\n\ndef f():\n    from p.b import g\n")
    (pkg / "b.py").write_text("def g():\n    import p.a\n")
    known = {"p", "p.a", "p.b"}
    assert imports("p", pkg / "__init__.py", known) == {"p.a"}
    assert imports("p.a", pkg / "a.py", known) == {"p.b"}
    assert imports("p.b", pkg / "b.py", known) == {"p.a"}
    edges = {m: imports(m, pkg / (f"{m[2:]}.py" if "." in m else "__init__.py"), known) for m in known}
    assert cycles(edges) == [["p.a", "p.b"]]


def test_packages_import_only_downward():
    arrows = {
        (module, target)
        for module, targets in graph().items()
        for target in targets
        if target.split(".")[0] in MAY_NOT_IMPORT.get(module.split(".")[0], ())
    }
    assert arrows == KNOWN_VIOLATIONS


def test_no_import_cycle_between_modules():
    found = {tuple(c) for c in cycles(graph())}
    assert found == KNOWN_CYCLES, "\n".join(" <-> ".join(c) for c in sorted(found - KNOWN_CYCLES))


def test_nothing_imports_the_cli():
    """The subsystems raise ``whale_train.errors.CLIError``; only the commands (``whale_train.cli.*``)
    import them, never the other way round, and only ``python -m whale_train.cli`` imports the assembled
    command line (a command module imports its neighbours by name, never the package)."""
    edges = graph()
    outside = {m for m, targets in edges.items() if not _in_cli(m) and any(_in_cli(t) for t in targets)}
    assert outside == set()
    assert {m for m, targets in edges.items() if "whale_train.cli" in targets} == {"whale_train.cli.__main__"}


def _in_cli(module: str) -> bool:
    return module == "whale_train.cli" or module.startswith("whale_train.cli.")


def test_the_built_in_env_ids_are_written_in_one_module():
    """Every other module imports them from whale_envs (or reads the domain registry)."""
    ids = ("whale/Chess-v0", "whale/Math-v0", "whale/SearchQA-v0")
    writers = set()
    for name, path in project_modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {
            id(n.body[0].value)
            for n in ast.walk(tree)
            if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef)
            and n.body
            and isinstance(n.body[0], ast.Expr)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in ids and id(node) not in docstrings:
                writers.add(name)
    assert writers == {"whale_envs"}
