"""The start of a sandbox program (:mod:`whale_envs.sandbox.bundle` builds both forms).

A program is a module of this project run as ``__main__`` in an interpreter where the project cannot be
imported (see :mod:`whale_envs.sandbox.programs`). This module serves it and the modules it imports
from their source texts, with their packages as empty modules (a package's ``__init__`` is not run: the
package ``whale_envs`` needs installed packages that are not there). Two forms:

* on the host (the boot interpreter): ``python -I -S -c "...; import loader; loader.run_files()"``
  with this folder, the program, the modules it imports and its arguments: the texts are read from the
  files of this checkout or installation;
* in the jail (no project files there): this file's text, then one line calling :func:`run` with the
  program and the texts themselves, is the program's ``main.py``.

Standard library only; nothing here relies on ``__file__`` but :func:`run_files`.
"""

import importlib.util
import os
import runpy
import sys


class SourceFinder:
    """Imports the modules of ``sources`` (name -> text) and their packages (empty) by name: a meta path
    finder and the loader of what it finds (the protocols of ``importlib.abc.MetaPathFinder`` and
    ``InspectLoader``, written out: importing ``importlib.abc`` brings ``importlib.resources``,
    ``pathlib``, ``tempfile`` and more, about 28 ms of every program's start)."""

    def __init__(self, sources):
        self.sources = dict(sources)
        self.packages = {n.rsplit(".", i)[0] for n in self.sources for i in range(1, n.count(".") + 1)}

    def find_spec(self, name, path=None, target=None):
        if name in self.sources or name in self.packages:
            spec = importlib.util.spec_from_loader(name, self, is_package=name in self.packages)
            spec.origin = name.replace(".", "/") + ("/__init__.py" if name in self.packages else ".py")
            spec.has_location = True
            return spec
        return None

    def create_module(self, spec):
        return None  # the default module

    def exec_module(self, module):
        exec(self.get_code(module.__name__), module.__dict__)  # noqa: S102 - this project's own modules

    def is_package(self, fullname):
        return fullname in self.packages

    def get_source(self, fullname):
        return self.sources.get(fullname, "")

    def get_code(self, fullname):
        path = fullname.replace(".", "/") + ("/__init__.py" if fullname in self.packages else ".py")
        return compile(self.get_source(fullname), path, "exec", dont_inherit=True)


def run(entry, sources, args):
    """Run module ``entry`` as ``__main__`` with ``sys.argv[1:] == args``; ``sources`` holds its text and
    the texts of the project modules it imports."""
    sys.meta_path.insert(0, SourceFinder(sources))
    sys.argv[:] = [entry, *args]
    runpy.run_module(entry, run_name="__main__", alter_sys=True)


def run_files():
    """The host's form: ``sys.argv[1:]`` is this folder (put on ``sys.path`` to import this module),
    the program, the modules it imports (comma separated) and its arguments."""
    _, folder, entry, modules, *args = sys.argv
    sys.path.remove(folder)  # only this module was to be imported from there
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(folder))))
    sources = {}
    for name in [entry, *filter(None, modules.split(","))]:
        with open(os.path.join(root, *name.split(".")) + ".py", encoding="utf-8") as fh:
            sources[name] = fh.read()
    run(entry, sources, args)
