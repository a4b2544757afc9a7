"""The start of the scripts the sandbox tests run under another interpreter or user: load
``whale_envs/sandbox.py`` by path from the folder ``sys.argv[1]`` (it needs the standard library only)
as ``sb``, with ``json``, ``os`` and ``sys`` imported."""

LOAD_SANDBOX = """\
import importlib.util, json, os, sys, types
root = sys.argv[1]
spec = importlib.util.spec_from_file_location(
    "whale_envs", os.path.join(root, "whale_envs", "__init__.py"),
    submodule_search_locations=[os.path.join(root, "whale_envs")])
pkg = types.ModuleType("whale_envs"); pkg.__path__ = spec.submodule_search_locations; pkg.__spec__ = spec
sys.modules["whale_envs"] = pkg  # the sandbox module only needs the standard library
spec = importlib.util.spec_from_file_location("whale_envs.sandbox", os.path.join(root, "whale_envs", "sandbox.py"))
sb = importlib.util.module_from_spec(spec); sys.modules[spec.name] = sb; spec.loader.exec_module(sb)
"""
