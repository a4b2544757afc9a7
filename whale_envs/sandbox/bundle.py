"""How the sandbox starts one of its programs (:mod:`whale_envs.sandbox.programs`) in a child
interpreter where this project cannot be imported: one way for all of them.

A program is a module with ``main()`` run as ``__main__``; it may import modules of this project that
need only the standard library (found by reading its imports: :func:`modules`). Its interpreter gets
the program and those modules' texts through :mod:`~whale_envs.sandbox.programs.loader`:

* :func:`command`: the command line of a boot interpreter on the host (``python -I -S``), which reads
  them from this installation's files;
* :func:`program`: the text of a ``main.py`` for the jail (no project files there), which carries them.
  A program that imports nothing of this project is its own text: nothing is loaded into its
  interpreter but what it imports (a pooled sandbox's code sees the interpreter of a cold start).

Both take the program's arguments (its ``sys.argv[1:]``) and ``extra``: modules it imports by a name
known only when it runs (the harness worker's shipped harnesses, which a harness may build on), carried
with the modules they import. The bundler itself is never carried: a program may hold its own start.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

#: The folder holding the package ``whale_envs`` (a checkout or the installation's site-packages).
ROOT = Path(__file__).resolve().parent.parent.parent
PROGRAMS = "whale_envs.sandbox.programs"
LOADER = f"{PROGRAMS}.loader"
#: The host's start: import the loader from the programs' folder (``sys.argv[1]``) and let it run.
_START = "import sys; sys.path.insert(0, sys.argv[1]); import loader; loader.run_files()"
_OWN = ("whale_envs", "harnesses")


def module_path(name: str) -> Path:
    return ROOT.joinpath(*name.split(".")).with_suffix(".py")


def module_source(name: str) -> str:
    """The text of the project module ``name`` (a module file, not a package)."""
    return module_path(name).read_text(encoding="utf-8")


#: (entry, extra) -> (the files read, each with its (mtime, size), and what ``modules`` found in them).
_FOUND: dict[tuple[str, tuple[str, ...]], tuple[tuple[tuple[str, int, int], ...], list[str]]] = {}


def _stamp(names: Iterable[str]) -> tuple[tuple[str, int, int], ...]:
    out = []
    for name in names:
        try:
            st = module_path(name).stat()
        except OSError:
            return ()
        out.append((name, st.st_mtime_ns, st.st_size))
    return tuple(out)


def modules(entry: str, extra: Iterable[str] = ()) -> list[str]:
    """``entry``, the modules ``extra`` and every project module they import, directly or not (``entry``
    first). A program imports them by absolute name; its packages are empty where it runs (their
    ``__init__`` is not run). Read once per process, and again when one of the files read changed (a
    sandbox's every start asks: parsing them was most of a worker's start)."""
    key = (entry, tuple(extra))
    cached = _FOUND.get(key)
    if cached is not None and cached[0] and _stamp(name for name, _, _ in cached[0]) == cached[0]:
        return list(cached[1])
    found = _imports(entry, key[1])
    _FOUND[key] = (_stamp(found), found)
    return list(found)


def _imports(entry: str, extra: tuple[str, ...]) -> list[str]:
    found = [entry, *(name for name in extra if name != entry)]
    for name in found:  # grows while it is read
        for node in ast.walk(ast.parse(module_source(name), str(module_path(name)))):
            if isinstance(node, ast.ImportFrom) and node.level:
                raise ValueError(f"{module_path(name)}: a sandbox program imports by absolute name")
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                targets = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
            else:
                continue
            for target in targets:
                if target.split(".")[0] in _OWN and module_path(target).is_file() and target not in found:
                    if target != __name__:  # this module starts the program; it does not run in it
                        found.append(target)
    return found


def command(python: str, entry: str, *args: str, extra: Iterable[str] = ()) -> list[str]:
    """Run program ``entry`` with ``args`` in a fresh ``python -I -S`` (the caller's environment,
    user site and installed packages out of it) on this host."""
    folder = str(module_path(LOADER).parent)
    return [python, "-I", "-S", "-c", _START, folder, entry, ",".join(modules(entry, extra)[1:]), *args]


def program(entry: str, *args: str, extra: Iterable[str] = ()) -> str:
    """The text of a self-contained ``main.py`` that runs program ``entry`` with ``args``."""
    names = modules(entry, extra)
    if len(names) == 1 and not args:
        return module_source(entry)
    sources = {name: module_source(name) for name in names}
    return f"{module_source(LOADER)}\n\nrun({entry!r}, {sources!r}, {list(args)!r})\n"
