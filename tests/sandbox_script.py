"""The start of the scripts the sandbox tests run under another interpreter or user: load the package
``whale_envs/sandbox/`` by path from the folder ``sys.argv[1]`` (it needs the standard library only)
as ``sb`` (``whale_envs`` itself stays an empty package: its ``__init__`` needs installed packages),
with ``json``, ``os`` and ``sys`` imported, and its fork server's module as ``fs``."""

LOAD_SANDBOX = """\
import importlib, json, os, sys, types
root = sys.argv[1]
pkg = types.ModuleType("whale_envs"); pkg.__path__ = [os.path.join(root, "whale_envs")]
sys.modules["whale_envs"] = pkg  # the sandbox package only needs the standard library
sb = importlib.import_module("whale_envs.sandbox")
fs = importlib.import_module("whale_envs.sandbox.forkserver")
"""
