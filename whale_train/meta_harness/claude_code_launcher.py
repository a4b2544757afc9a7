"""The Claude Code proposer's launcher: the program :mod:`.claude_code` runs in the jail for a session.

Standard library only (nothing of the project is importable in the jail): :mod:`.claude_code` writes
this file's text into the jail's scratch folder and runs it with ``python -I``, its one argument a JSON
object ``{"argv": the CLI's command line, "key": the placeholder API key}``. Importing it runs nothing;
the pieces are functions so that tests can call them outside a jail.

What it does: enters a user and network namespace of its own whose only interface is its loopback,
brings it up, listens on one loopback port and forwards each connection there to the relay's Unix
socket (:data:`RELAY`); runs the CLI against that port; reads the CLI's ``stream-json`` output, and
prints one JSON summary line: ``exit``, ``tools`` (calls by tool name), ``bash_failed``, ``result``
(the CLI's result message) and ``stderr`` (its tail). When the namespace cannot be made it prints
``{"launcher_error": ...}`` and exits 3.
"""

import ctypes
import fcntl
import json
import os
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterable, Mapping
from typing import Any

#: The relay's Unix socket, the one file of a read-only folder bound into the jail.
RELAY = "/whale-relay/api.sock"
#: The CLI's ``HOME`` (its settings and caches), private to the session.
HOME = "/sandbox/home"

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
SIOCSIFFLAGS = 0x8914
IFF_UP, IFF_LOOPBACK, IFF_RUNNING = 0x1, 0x8, 0x40


def own_network() -> str | None:
    """Enter a user and network namespace of this process's own, with the loopback up; None, or why
    it could not."""
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        return "unshare: " + os.strerror(ctypes.get_errno())
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open("/proc/self/" + name, "w") as fh:
            fh.write(text)
    with socket.socket() as s:
        flags = struct.pack("16sH14s", b"lo", IFF_UP | IFF_LOOPBACK | IFF_RUNNING, b"")
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, flags)
    return None


def pipe(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until either ends; then shut both down."""
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def forward(listener: socket.socket, relay: str = RELAY) -> None:
    """Forever: each connection accepted on ``listener``, piped both ways to the Unix socket ``relay``
    (a connection the relay refuses is closed)."""
    while True:
        client, _ = listener.accept()
        up = socket.socket(socket.AF_UNIX)
        try:
            up.connect(relay)
        except OSError:
            client.close()
            up.close()
            continue
        threading.Thread(target=pipe, args=(client, up), daemon=True).start()
        threading.Thread(target=pipe, args=(up, client), daemon=True).start()


def session_env(environ: Mapping[str, str], port: int, key: str, home: str = HOME) -> dict[str, str]:
    """The CLI's environment: the API at the forwarder's port with the placeholder ``key``, no
    auto-update, telemetry, error reports or other traffic."""
    return dict(
        environ,
        HOME=home,
        SHELL="/bin/bash",
        TMPDIR="/sandbox",
        IS_SANDBOX="1",
        ANTHROPIC_BASE_URL=f"http://127.0.0.1:{port}",
        ANTHROPIC_API_KEY=key,
        DISABLE_AUTOUPDATER="1",
        DISABLE_TELEMETRY="1",
        DISABLE_ERROR_REPORTING="1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
    )


def read_stream(lines: Iterable[str]) -> dict[str, Any]:
    """What the CLI's ``stream-json`` lines tell: ``tools`` (calls by name), ``bash_failed`` (Bash
    results marked as errors) and ``result`` (the last result message, or None). Lines that are not
    JSON objects are skipped."""
    tools: dict[str, int] = {}
    names: dict[Any, Any] = {}
    failed, result = 0, None
    for line in lines:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if not isinstance(msg, dict):
            continue
        message = msg.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        if msg.get("type") == "assistant" and isinstance(content, list):
            for b in content:
                if isinstance(b, dict) and b.get("type") == "tool_use":
                    tools[b.get("name")] = tools.get(b.get("name"), 0) + 1
                    names[b.get("id")] = b.get("name")
        elif msg.get("type") == "user" and isinstance(content, list):
            for b in content:
                if isinstance(b, dict) and b.get("type") == "tool_result" and b.get("is_error"):
                    failed += names.get(b.get("tool_use_id")) == "Bash"
        elif msg.get("type") == "result":
            result = msg
    return {"tools": tools, "bash_failed": failed, "result": result}


def main(argv: list[str]) -> int:
    """In the jail: the network, the forwarder, the CLI; prints the summary line."""
    cfg = json.loads(argv[0])
    why = own_network()
    if why is not None:
        print(json.dumps({"launcher_error": why}))
        return 3
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    threading.Thread(target=forward, args=(listener,), daemon=True).start()
    os.makedirs(HOME, exist_ok=True)
    env = session_env(os.environ, listener.getsockname()[1], cfg["key"])
    proc = subprocess.Popen(
        cfg["argv"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
    )
    errors: list[str] = []
    threading.Thread(target=lambda: errors.append(proc.stderr.read()), daemon=True).start()
    seen = read_stream(proc.stdout)
    status = proc.wait()
    print(json.dumps({"exit": status, **seen, "stderr": "".join(errors)[-2000:]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
