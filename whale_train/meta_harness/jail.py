"""The agent proposer's workbench: shell commands in an OS jail, with a scratch folder kept for an iteration.

One :class:`ProposerJail` per iteration. Its first command starts a small server program
(:mod:`.jail_server`) inside ``whale_envs.sandbox.spawn_jailed``; every ``run(command)`` is a
``/bin/sh -c`` child of that server, so the scratch folder (the jail's private tmpfs) lives as long as
the iteration and no longer. What a command sees:

* ``/archive``: the archive folder, **read-only** (sources, scores, traces with gold answers hidden);
* ``/sdk``: a copy of the ``harnesses`` package (the harness contract) and of the ``whale_envs``
  package's Python files, without their bundled data (no stored tasks, no answers), on ``PYTHONPATH``;
  there the ``test`` (and ``all``) split cannot be listed (a procedural generator's code is visible,
  as in the public package, but no held-out task is served to the agent);
* ``/sandbox/scratch`` (the working directory and ``HOME``): writable, private to this iteration;
* the interpreter and the installed packages, read-only; nothing else of the host (no project
  checkout, no ``test``-split results, no home, no ``/etc``), and **no network**.

Every process a command starts ends with it: after the command (or its limit) the server kills its
process group, then every other process of the jail's PID namespace but the jail's init and itself,
so a ``setsid`` loop or a double-forked daemon does not outlive the command.

Limits: per command wall-clock, CPU seconds and output; per process address space; a process count
and the scratch size for the jail's whole life. A command's failure, limit or timeout is a
:class:`RunResult` (text for the agent), never an exception. The jail needs Linux namespaces: without
them :meth:`ProposerJail.run` reports a refusal (``run`` is the one tool that cannot fall back).
"""

from __future__ import annotations

import json
import secrets
import selectors
import shutil
import tempfile
import time
from dataclasses import dataclass
from importlib import util as import_util
from pathlib import Path

from whale_envs.sandbox import IsolationUnavailable, Limits, SandboxProcess, cut_middle, spawn_jailed
from whale_train.meta_harness import jail_server, jail_split

#: The server inside the jail (:mod:`.jail_server`, standard library only), as the text the jail runs.
SERVER = Path(jail_server.__file__).read_text(encoding="utf-8")

#: Appended to the jail's copy of ``whale_envs/tasks.py`` (:mod:`.jail_split`): the held-out split
#: cannot be listed there.
NO_TEST_SPLIT = "\n\n# added by the proposer's jail\n" + Path(jail_split.__file__).read_text(encoding="utf-8")


@dataclass(frozen=True)
class JailLimits:
    """Limits of the proposer's jail.

    Attributes:
        wall_s / cpu_s: per command (``cpu_s`` unset: as many CPU seconds as wall-clock ones, at least 1).
        output_chars: per command (more stops it; the agent sees the head and the tail).
        memory_mb: address space per process.
        processes: processes and threads at once, for the whole jail.
        scratch_mb: the scratch folder's size.
    """

    wall_s: float = 60.0
    cpu_s: int | None = None
    output_chars: int = 20_000
    memory_mb: int = 2048
    processes: int = 64
    scratch_mb: int = 256

    def __post_init__(self) -> None:
        if self.cpu_s is None:
            object.__setattr__(self, "cpu_s", max(1, int(self.wall_s)))


@dataclass
class RunResult:
    """One command: its exit status (None when it did not run), output, the limit that stopped it."""

    command: str
    exit_code: int | None
    output: str
    limit: str | None = None
    wall_s: float = 0.0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.limit is None and self.error is None

    def observation(self, max_chars: int = 20_000) -> str:
        if self.error:
            return f"[the command did not run: {self.error}]"
        text = cut_middle(self.output, max_chars) if self.output.strip() else "(no output)"
        if self.limit:
            text += f"\n[stopped: {self.limit} limit reached]"
        elif self.exit_code:
            text += f"\n[exit status {self.exit_code}]"
        return text


def sdk_copy(dest: Path) -> Path:
    """Copy the Python files of ``harnesses`` and ``whale_envs`` (no data files: no stored tasks or
    answers; an env reading bundled data fails to load there) into ``dest`` (world-readable, for the jail's unprivileged uid)."""
    for name in ("harnesses", "whale_envs"):
        spec = import_util.find_spec(name)
        for root in (spec.submodule_search_locations or []) if spec else []:
            root = Path(root)
            for src in root.rglob("*.py"):
                rel = src.relative_to(root)
                if "__pycache__" in rel.parts:
                    continue
                target = dest / name / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, target)
                if name == "whale_envs" and rel == Path("tasks.py"):
                    with open(target, "a", encoding="utf-8") as fh:
                        fh.write(NO_TEST_SPLIT)
    for p in [dest, *dest.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dest


class ProposerJail:
    """Shell commands for the agent over a read-only archive, with a scratch folder for one iteration.

    Started on first use; :meth:`close` ends it (and its scratch). A jail that died (a command killed its
    server) is restarted by the next command, with an empty scratch, and the answer says so.
    """

    def __init__(
        self, archive_dir: str | Path, limits: JailLimits | None = None, mounts: dict[str, str] | None = None
    ):
        self.archive_dir = Path(archive_dir).resolve()
        self.limits = limits or JailLimits()
        self.mounts = dict(mounts or {})  # more read-only host folders (jail path -> host folder)
        self._proc: SandboxProcess | None = None
        self._sdk: Path | None = None
        self.runs = 0
        self.refused = 0

    def _start(self) -> None:
        if self._sdk is None:
            self._sdk = sdk_copy(Path(tempfile.mkdtemp(prefix="whale-proposer-sdk-")))
            self._sdk.chmod(0o755)
        lim = self.limits
        limits = Limits(
            wall_s=24 * 3600.0,  # the server lives for the iteration; each command has its own limits
            cpu_s=24 * 3600,
            memory_mb=lim.memory_mb,
            max_processes=lim.processes,
            output_bytes=1 << 20,
            file_mb=lim.scratch_mb,
            open_files=256,
            isolation="namespaces",
        )
        mounts = {**self.mounts, "/archive": str(self.archive_dir), "/sdk": str(self._sdk)}
        self._proc = spawn_jailed(SERVER, limits, mounts=mounts)

    def _ask(self, request: dict, wait_s: float) -> dict:
        """Send one request; the answer with its nonce (other lines are skipped), or RuntimeError."""
        restarted = False
        if self._proc is None or self._proc.poll() is not None:
            restarted = self._proc is not None
            self.close(keep_sdk=True)
            self._start()
        proc = self._proc
        assert proc is not None
        nonce = secrets.token_hex(8)
        try:
            proc.stdin.write(json.dumps({**request, "nonce": nonce}) + "\n")
            proc.stdin.flush()
        except OSError as exc:
            self.close(keep_sdk=True)
            raise RuntimeError(f"the jail is gone: {exc}") from None
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not sel.select(max(0.0, deadline - time.monotonic())):
                continue
            line = proc.stdout.readline()
            if not line:
                tail = proc.stderr_tail(300).strip()
                self.close(keep_sdk=True)
                raise RuntimeError("the jail stopped" + (f": {tail.splitlines()[-1]}" if tail else ""))
            try:
                answer = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(answer, dict) and answer.get("nonce") == nonce:
                if restarted:
                    answer["restarted"] = True
                return answer
        self.close(keep_sdk=True)
        raise RuntimeError("the jail did not answer in time (restarted; the scratch folder is lost)")

    def run(self, command: str) -> RunResult:
        """Run ``command`` with ``/bin/sh -c`` in the scratch folder."""
        lim = self.limits
        self.runs += 1
        request = {
            "op": "run",
            "command": str(command),
            "wall_s": lim.wall_s,
            "cpu_s": lim.cpu_s,
            "output_bytes": lim.output_chars * 4,
        }
        try:
            a = self._ask(request, lim.wall_s + 30.0)
        except IsolationUnavailable as exc:
            self.refused += 1
            return RunResult(command, None, "", error=str(exc))
        except RuntimeError as exc:
            return RunResult(command, None, "", error=str(exc))
        if "error" in a:
            return RunResult(command, None, "", error=a["error"])
        output = a["output"]
        if a.get("swept") == -1:  # processes outran the server's sweep: end the whole jail
            self.close(keep_sdk=True)
            output += "\n[the command left processes that would not stop: the jail was restarted]"
        if a.get("restarted"):
            output = "[the jail had stopped and was restarted: the scratch folder started empty]\n" + output
        if len(output) > lim.output_chars:
            output = cut_middle(output, lim.output_chars)
        return RunResult(command, a["exit"], output, a["limit"], a["wall_s"])

    def put(self, path: str, text: str) -> None:
        """Write ``text`` to ``path`` under the scratch folder."""
        a = self._ask({"op": "put", "path": path, "text": text}, 60.0)
        if "error" in a:
            raise RuntimeError(f"cannot write {path} in the scratch folder: {a['error']}")

    def get(self, path: str, max_chars: int = 100_000) -> str | None:
        """The text of ``path`` under the scratch folder (None if the jail never ran or it is missing)."""
        if self._proc is None or self._proc.poll() is not None:
            return None
        try:
            a = self._ask({"op": "get", "path": path, "max": max_chars}, 60.0)
        except RuntimeError:
            return None
        return a.get("text")

    def close(self, keep_sdk: bool = False) -> None:
        """End the jail: its processes and its scratch folder."""
        if self._proc is not None:
            self._proc.close()
            self._proc = None
        if not keep_sdk and self._sdk is not None:
            shutil.rmtree(self._sdk, ignore_errors=True)
            self._sdk = None

    def __enter__(self) -> ProposerJail:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
