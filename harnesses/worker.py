"""The harness worker: the untrusted side of an evaluation, in a process of its own.

The worker holds no env, no task, no answer and no weights: only the harness code and two proxies
that forward ``env.*`` and ``llm.*`` calls to the trusted process as JSON lines. It runs many
episodes at once, one thread each, so their LLM calls can be batched on the trusted side.

The program is self-contained (``worker_program()`` returns its source, with ``harnesses.base`` and
``harnesses.validate`` inlined as modules) because the sandbox hides this project's packages from the
code it runs: the bundled data sits next to them and holds answers.

Protocol (one JSON object per line; worker → trusted on stdout, trusted → worker on stdin)::

    → {"op": "load", "source": ..., "filename": ..., "has_chat_template": bool}
    ← {"op": "ready"} | {"op": "load_error", "error": ...}
    → {"op": "start", "episode": id}
    ← {"op": "call", "episode": id, "method": "step", "args": {...}}
    → {"op": "reply", "episode": id, "ok": true, "value": ...} | {..., "ok": false, "error": ...}
    ← {"op": "done", "episode": id, "error": null | "traceback"}
    → {"op": "shutdown"}
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import traceback
from pathlib import Path

#: Modules inlined into the worker program, in import order.
_INLINE = ("harnesses.base", "harnesses.validate")


def worker_program() -> str:
    """The worker's full source: the inlined modules (the harness API and the shipped harnesses, which
    a harness may build on), then this file, then ``main()``."""
    from harnesses.validate import shipped_modules

    here = Path(__file__).resolve().parent
    names = list(_INLINE) + sorted(shipped_modules())
    sources = {
        name: (here.parent / (name.replace(".", "/") + ".py")).read_text(encoding="utf-8") for name in names
    }
    packages = sorted({name.rsplit(".", 1)[0] for name in names})
    own = Path(__file__).read_text(encoding="utf-8")
    return (
        "import importlib.abc, importlib.util, sys\n"
        f"_SOURCES = {sources!r}\n"
        f"_PACKAGES = {packages!r}\n"
        "class _Inline(importlib.abc.MetaPathFinder, importlib.abc.Loader):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name in _SOURCES or name in _PACKAGES:\n"
        "            return importlib.util.spec_from_loader(name, self, is_package=name in _PACKAGES)\n"
        "    def exec_module(self, module):\n"
        "        src = _SOURCES.get(module.__name__, '')\n"
        "        exec(compile(src, module.__name__.replace('.', '/') + '.py', 'exec'), module.__dict__)\n"
        "sys.meta_path.insert(0, _Inline())\n"
        "import harnesses.validate\n"
        f"harnesses.validate.SHIPPED_MODULES = frozenset({sorted(shipped_modules())!r})\n"
        f"_SOURCES['harnesses.worker'] = {own!r}\n"
        "import harnesses.worker\n"
        "harnesses.worker.main()\n"
    )


class _Channel:
    """Line-delimited JSON over the worker's protocol streams; replies are routed to episode threads."""

    def __init__(self, out, inp):
        self._out = out
        self._in = inp
        self._lock = threading.Lock()
        self.replies: dict[int, queue.Queue] = {}

    def send(self, msg: dict) -> None:
        line = json.dumps(msg, ensure_ascii=False)
        with self._lock:
            self._out.write(line + "\n")
            self._out.flush()

    def call(self, episode: int, method: str, args: dict):
        from harnesses.base import HarnessCallError

        self.send({"op": "call", "episode": episode, "method": method, "args": args})
        reply = self.replies[episode].get()
        if not reply["ok"]:
            raise HarnessCallError(reply["error"])
        return reply["value"]


class _EnvProxy:
    def __init__(self, channel: _Channel, episode: int):
        self._channel, self._episode = channel, episode

    def reset(self):
        obs, info = self._channel.call(self._episode, "reset", {})
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self._channel.call(
            self._episode, "step", {"action": action}
        )
        return obs, reward, terminated, truncated, info


class _LLMProxy:
    def __init__(self, channel: _Channel, episode: int, has_chat_template: bool):
        self._channel, self._episode = channel, episode
        self.has_chat_template = has_chat_template

    def complete(self, prompt, **params):
        return self._channel.call(self._episode, "complete", {"prompt": prompt, "params": params})

    def sample(self, prompt, n, **params):
        return self._channel.call(self._episode, "sample", {"prompt": prompt, "n": n, "params": params})

    def complete_many(self, prompts, **params):
        return self._channel.call(
            self._episode, "complete_many", {"prompts": list(prompts), "params": params}
        )

    def choose(self, prompt, options):
        return self._channel.call(self._episode, "choose", {"prompt": prompt, "options": list(options)})

    def score(self, prompt, continuations):
        return self._channel.call(
            self._episode, "score", {"prompt": prompt, "continuations": list(continuations)}
        )


def _run_episode(channel: _Channel, cls: type, episode: int, has_chat_template: bool) -> None:
    error = None
    try:
        cls().run(_EnvProxy(channel, episode), _LLMProxy(channel, episode, has_chat_template))
    except BaseException:  # noqa: BLE001 - any failure of the harness is reported, never fatal
        error = "".join(traceback.format_exc(limit=8))[-4000:]
    channel.send({"op": "done", "episode": episode, "error": error})


def main() -> None:
    proto_out = open(sys.stdout.fileno(), "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stdout = sys.stderr  # the harness's print() must not corrupt the protocol
    channel = _Channel(proto_out, sys.stdin)
    first = json.loads(sys.stdin.readline() or "{}")
    if first.get("op") != "load":
        return
    try:
        from harnesses.validate import load_class

        cls = load_class(first["source"], first.get("filename", "<harness>"), restricted=True)
    except BaseException as exc:  # noqa: BLE001
        channel.send({"op": "load_error", "error": f"{type(exc).__name__}: {exc}"})
        return
    channel.send({"op": "ready"})
    chat = bool(first.get("has_chat_template"))
    for line in sys.stdin:
        msg = json.loads(line)
        op = msg.get("op")
        if op == "start":
            ep = msg["episode"]
            channel.replies[ep] = queue.Queue()
            threading.Thread(target=_run_episode, args=(channel, cls, ep, chat), daemon=True).start()
        elif op == "reply":
            channel.replies[msg["episode"]].put(msg)
        elif op == "shutdown":
            break
    proto_out.flush()
