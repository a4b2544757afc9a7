"""The harness worker: the untrusted side of an evaluation, in a process of its own.

The worker holds no env, no task, no answer and no weights: only the harness code and two proxies
that forward ``env.*`` and ``llm.*`` calls to the trusted process as JSON lines. It runs many
episodes at once, so their LLM calls can be batched on the trusted side.

Episode isolation: the worker is a *template* that never runs harness code. It imports the harness
API, compiles the harness source once and, before it relays any message, forks the *spawner*, which
``fork``s one fresh process per episode (a forked process is a copy of its parent's memory: forked from
the relay, an episode held the prompts and replies the relay had handled for the episodes before it
and beside it, which full Python reads). The child executes the harness module and runs that one
episode, talking to the template over its own pair of pipes, and is killed (with its process group)
when the episode ends. No state flows from one episode to another: not class attributes, not module
globals, not caches, not the memory of the relay. Nor can two episodes that run at
once (the samples of one task) reach each other, even with full Python: before any harness code runs,
each episode enters user, mount, network, IPC, UTS and PID namespaces of its own
(``whale_envs._children.isolate_episode``): no socket (abstract or named), shared memory, signal,
ptrace or /proc entry reaches a sibling, and the file system is read-only. Where the kernel refuses
those namespaces the episode is refused with the reason, unless the whole run is unisolated by the
user's opt-in (the sandbox tells the worker so; its probe checks the namespaces before a run starts). The template stamps every message
with the episode id of the pipe it came from, so an episode cannot act for another, and it checks
each message (size, JSON, shape) before anything reaches the trusted process.

The worker is a sandbox program like the sandbox's own (:mod:`whale_envs.sandbox.bundle`): this module
runs as ``__main__`` of a ``main.py`` that carries it and the texts of the modules it needs (the harness
API, ``whale_envs._children``, and the shipped harnesses, which a harness may build on), because the
sandbox hides this project's packages from the code it runs: the bundled data sits next to them and
holds answers. Its arguments name the shipped harness modules (the harness API finds them from the
package's files, which are not there). ``worker_program()`` returns that ``main.py``.

Protocol (one JSON object per line; worker → trusted on stdout, trusted → worker on stdin)::

    → {"op": "load", "source": ..., "filename": ..., "has_chat_template": bool}
    ← {"op": "ready"} | {"op": "load_error", "error": ...}
    → {"op": "start", "episode": id}
    ← {"op": "call", "episode": id, "method": "step", "args": {...}}
    → {"op": "reply", "episode": id, "ok": true, "value": ...} | {..., "ok": false, "error": ...}
    ← {"op": "done", "episode": id, "error": null | "traceback"}
    → {"op": "kill", "episode": id}          (the episode ran past its time: end its process)
    → {"op": "shutdown"}

Between an episode process and the template the same messages travel without the episode id.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import sys
import traceback

from whale_envs._children import fork_retrying, isolate_episode, packed_syscall_filter, reap_exited

#: The longest message an episode may send (an action, a prompt); a longer one ends the episode.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
#: The deepest nesting of JSON an episode may send.
MAX_DEPTH = 32
#: Replies an episode may leave unread before it is ended.
MAX_PENDING_BYTES = 64 * 1024 * 1024

#: The worker program: this module, run as ``__main__``.
PROGRAM = "harnesses.worker"


def worker_program() -> str:
    """The worker's ``main.py``: this module as the program, carrying the shipped harness modules and
    naming them in its arguments (see :func:`_run_program`)."""
    from harnesses.validate import shipped_modules
    from whale_envs.sandbox import bundle

    shipped = sorted(shipped_modules())
    return bundle.program(PROGRAM, *shipped, extra=shipped)


class _Channel:
    """One episode's side: JSON lines over its own pipes to the template, one call at a time."""

    def __init__(self, out, inp):
        self._out = out
        self._in = inp

    def send(self, msg: dict) -> None:
        self._out.write(json.dumps(msg, ensure_ascii=False) + "\n")
        self._out.flush()

    def call(self, method: str, args: dict):
        from harnesses.base import HarnessCallError

        self.send({"op": "call", "method": method, "args": args})
        line = self._in.readline()
        if not line:
            os._exit(0)  # the template is gone
        reply = json.loads(line)
        if not reply["ok"]:
            raise HarnessCallError(reply["error"])
        return reply["value"]


def _load(first: dict) -> type:
    from harnesses.validate import load_class

    filename = first.get("filename", "<harness>")
    cls = load_class(first["source"], filename, restricted=True, prepared=first.get("prepared"))
    examples = first.get("examples") or ()
    cls.examples = tuple(examples)  # the documented cross-episode memory (train split only)
    return cls


#: Set by the sandbox in the worker's environment: ``"none"`` when the run is unisolated by the user's
#: opt-in (episodes then run without namespaces where the kernel refuses them).
ISOLATION_ENV = "WHALE_SANDBOX_ISOLATION"


def _isolate_or_not() -> int:
    """``isolate_episode()``: 0 in the isolated process, its pid in the caller. When the kernel refuses:
    ``OSError`` (the reason), or -1 (run here, unisolated) when the run is unisolated by opt-in."""
    try:
        return isolate_episode()
    except OSError as exc:
        if os.environ.get(ISOLATION_ENV, "namespaces") != "none":
            raise OSError(f"an episode cannot run alone: the kernel refused its namespaces: {exc}") from None
        return -1


def _episode(first: dict, rfd: int, wfd: int, pid_w: int) -> None:
    """In the forked child: isolate, load the harness, run one episode, report, exit. Never returns.

    Tells the template on ``pid_w`` which process runs the episode (``pid N``: the isolated process,
    and this one exits) or why it cannot run (``refused ...``)."""
    code = 0
    try:
        os.setpgid(0, 0)
        _prctl_no_dump()
        memory = first.get("episode_memory_bytes")
        if memory:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        try:
            isolated = _isolate_or_not()
        except OSError as exc:
            os.write(pid_w, f"refused {exc}"[:2000].encode("utf-8", "replace"))
            os._exit(0)
        if isolated > 0:  # the isolated process runs the episode; this one is done
            os.write(pid_w, b"pid %d" % isolated)
            os._exit(0)
        if isolated < 0:
            os.write(pid_w, b"pid %d" % os.getpid())
        os.close(pid_w)
        channel = _Channel(os.fdopen(wfd, "w", encoding="utf-8"), os.fdopen(rfd, "r", encoding="utf-8"))
        error = None
        try:
            from harnesses.base import EnvProxy, LLMProxy

            cls = _load(first)
            cls().run(EnvProxy(channel.call), LLMProxy(channel.call, bool(first.get("has_chat_template"))))
        except BaseException:  # noqa: BLE001 - any failure of the harness is reported, never fatal
            error = "".join(traceback.format_exc(limit=8))[-4000:]
        channel.send({"op": "done", "error": error})
    except BaseException:  # noqa: BLE001
        code = 1
    os._exit(code)


def _prctl_no_dump() -> None:
    """Siblings (same uid) may not ptrace this process or read its memory through /proc."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass


def _depth(value, limit: int) -> bool:
    stack = [(value, 0)]
    while stack:
        v, d = stack.pop()
        if d > limit:
            return False
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)
    return True


def parse_message(line: bytes) -> tuple[dict | None, str | None]:
    """A message from an episode, or (None, why it is refused): not UTF-8, not JSON, too deep, not an
    object with a string ``op``. Used by the template and again by the trusted side. A lone surrogate
    escape (``"\\ud800"``: valid JSON, but no UTF-8 writer can encode the text it decodes to) is replaced
    by U+FFFD, so whatever an episode sends can be recorded and written."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"the message is not UTF-8 ({exc.reason} at byte {exc.start})"
    try:
        msg = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return None, f"the message is not JSON ({type(exc).__name__})"
    if not isinstance(msg, dict) or not isinstance(msg.get("op"), str):
        return None, f"the message is not an object with an 'op' (got {type(msg).__name__})"
    if not _depth(msg, MAX_DEPTH):
        return None, f"the message nests deeper than {MAX_DEPTH} levels"
    if _SURROGATE_ESCAPE.search(text):  # the decoded text holds surrogates only where escapes were
        msg = _without_lone_surrogates(msg)
    return msg, None


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _without_lone_surrogates(value):
    """``value`` (decoded JSON, depth already checked) with U+FFFD for every lone surrogate."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_without_lone_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {_without_lone_surrogates(k): _without_lone_surrogates(v) for k, v in value.items()}
    return value


class _Child:
    def __init__(self, pid: int, pgid: int, rfd: int, wfd: int):
        self.pid, self.rfd, self.wfd = pid, rfd, wfd
        self.pgid = pgid  # the process group of the episode (the forked child's pid)
        self.buf = bytearray()  # what came from the episode, not yet a whole line
        self.out = bytearray()  # replies its pipe has not taken yet


class _Template:
    """The worker's main loop: forks episode processes and relays their messages, checked."""

    def __init__(self, first: dict, out_fd: int):
        self.first = first
        self.out_fd = out_fd
        self.children: dict[int, _Child] = {}  # episode id -> its process
        self.by_fd: dict[int, int] = {}  # read fd -> episode id
        self.spawner: _Spawner | None = None  # set before the first message is relayed (main)

    def emit(self, msg: dict) -> None:
        data = (json.dumps(msg, ensure_ascii=True) + "\n").encode()
        view = memoryview(data)
        while view:
            n = os.write(self.out_fd, view)
            view = view[n:]

    def start(self, episode: int) -> None:
        """Start an episode: its process is forked by the spawner (never by this relay: see
        :class:`_Spawner`), given the child's ends of its two pipes and of the pipe it reports on."""
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        pid_r, pid_w = os.pipe()
        try:
            pid = self.spawner.spawn([to_child_r, from_child_w, pid_w])
        finally:
            for fd in (to_child_r, from_child_w, pid_w):
                os.close(fd)
        answer = _read_all(pid_r).decode("utf-8", "replace") if pid else ""  # until its set-up is over
        os.close(pid_r)
        os.set_blocking(to_child_w, False)  # a reply never blocks the template for long (to_child)
        self.children[episode] = _Child(pid or 0, pid or 0, from_child_r, to_child_w)
        self.by_fd[from_child_r] = episode
        if pid and answer.startswith("pid ") and answer[4:].isdigit():
            self.children[episode].pid = int(answer[4:])
        else:
            why = answer.removeprefix("refused ") if pid else "the episode could not be forked"
            self.end(episode, why or "the episode process died while starting")

    def end(self, episode: int, error: str | None = None, report: bool = True) -> None:
        child = self.children.pop(episode, None)
        if child is None:
            return
        self.by_fd.pop(child.rfd, None)
        for sig_target in (-child.pgid, child.pid) if child.pgid else ():
            try:
                os.kill(sig_target, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for fd in (child.rfd, child.wfd):
            try:
                os.close(fd)
            except OSError:
                pass
        self.reap()
        if report:
            self.emit({"op": "done", "episode": episode, "error": error})

    def reap(self) -> None:
        """Collect exited processes; kill orphans (a daemon an episode left behind) that came to us."""
        live = {c.pid for c in self.children.values()} | ({self.spawner.pid} if self.spawner else set())
        reap_exited()
        try:
            for entry in os.listdir("/proc"):
                if entry.isdigit() and int(entry) not in live and int(entry) not in (1, os.getpid()):
                    if _parent(int(entry)) == os.getpid():
                        os.kill(int(entry), signal.SIGKILL)
        except OSError:
            pass

    def from_child(self, episode: int) -> None:
        child = self.children[episode]
        try:
            chunk = os.read(child.rfd, 1 << 20)
        except OSError:
            chunk = b""
        if not chunk:
            self.end(episode, "the episode process exited without finishing (killed by a limit?)")
            return
        child.buf += chunk
        while episode in self.children:
            nl = child.buf.find(b"\n")
            if nl < 0:
                if len(child.buf) > MAX_MESSAGE_BYTES:
                    self.end(episode, f"protocol: a message longer than {MAX_MESSAGE_BYTES} bytes")
                return
            line, child.buf = bytes(child.buf[:nl]), child.buf[nl + 1 :]
            if len(line) > MAX_MESSAGE_BYTES:
                self.end(episode, f"protocol: a message longer than {MAX_MESSAGE_BYTES} bytes")
                return
            msg, why = parse_message(line)
            if msg is None or msg["op"] not in ("call", "done"):
                self.end(episode, f"protocol: {why or 'unknown op ' + repr(msg['op'])[:40]}")
                return
            if msg["op"] == "done":
                error = msg.get("error")
                self.end(episode, error if isinstance(error, str) or error is None else str(error)[:4000])
                return
            self.emit(
                {"op": "call", "episode": episode, "method": msg.get("method"), "args": msg.get("args")}
            )

    def to_child(self, msg: dict) -> None:
        """Queue a reply for an episode; written as its pipe takes it, so a stalled episode stalls nobody."""
        episode = msg.get("episode")
        child = self.children.get(episode)  # type: ignore[arg-type]
        if child is None:
            return
        reply = {k: v for k, v in msg.items() if k in ("ok", "value", "error")}
        child.out += (json.dumps(reply, ensure_ascii=False) + "\n").encode()
        if len(child.out) > MAX_PENDING_BYTES:
            self.end(episode, "protocol: the episode stopped reading its replies")  # type: ignore[arg-type]
            return
        self.flush(episode)  # type: ignore[arg-type]

    def flush(self, episode: int) -> None:
        child = self.children.get(episode)
        try:
            while child is not None and child.out:
                n = os.write(child.wfd, child.out)
                del child.out[:n]
        except BlockingIOError:
            pass  # the rest goes when the pipe has room (POLLOUT in loop)
        except OSError:
            child.out.clear()  # the episode is gone; its end is reported from its read side

    def loop(self, in_fd: int) -> None:
        buf = bytearray()
        poller = select.poll()
        poller.register(in_fd, select.POLLIN)
        watched = {in_fd}
        while True:
            for fd in watched - {in_fd} - set(self.by_fd):  # episodes that ended
                poller.unregister(fd)
                watched.discard(fd)
            for fd in set(self.by_fd) - watched:  # episodes that started
                poller.register(fd, select.POLLIN)
                watched.add(fd)
            writers = {c.wfd: ep for ep, c in self.children.items() if c.out}
            for wfd in writers:
                poller.register(wfd, select.POLLOUT)
            events = poller.poll()
            for wfd in writers:
                poller.unregister(wfd)
            for fd, _ in events:
                if fd in writers:
                    self.flush(writers[fd])
                    continue
                if fd == in_fd:
                    chunk = os.read(in_fd, 1 << 20)
                    if not chunk:
                        return
                    buf += chunk
                    while (nl := buf.find(b"\n")) >= 0:
                        line, buf = bytes(buf[:nl]), buf[nl + 1 :]
                        msg = json.loads(line)
                        op = msg.get("op")
                        if op == "start":
                            self.start(msg["episode"])
                        elif op == "reply":
                            self.to_child(msg)
                        elif op == "kill":
                            self.end(msg["episode"], "killed", report=False)
                        elif op == "shutdown":
                            return
                elif fd in self.by_fd:
                    self.from_child(self.by_fd[fd])


class _Spawner:
    """The process every episode is forked from, itself forked from the template before the template
    relays its first message. An episode is a copy of the process it is forked from, its memory
    included: forked from the relay, it held what the relay had read and written for the episodes
    before it and beside it (their prompts and replies, in live buffers and in freed memory), which
    full Python reads. The spawner reads nothing but requests of three file descriptors (an
    episode's ends of its pipes) and answers with the pid it forked; it never relays a message. It
    collects its exited children at once (SIGCHLD), and exits when the template closes the socket.
    Orphans (an episode's isolated process, once the forked one exits) go to the template, the
    subreaper, as before."""

    def __init__(self, first: dict, close: tuple[int, ...]):
        import socket

        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            mine.close()
            null = os.open(os.devnull, os.O_RDWR)
            for fd in close:  # not the template's channels to the trusted process
                os.dup2(null, fd)
            os.close(null)
            code = 0
            try:
                self._serve(theirs, first)
            except BaseException:  # noqa: BLE001 - the template sees the socket close
                code = 1
            os._exit(code)
        theirs.close()
        self.pid, self.sock = pid, mine

    @staticmethod
    def _serve(sock, first: dict) -> None:
        import socket

        signal.signal(signal.SIGCHLD, lambda *_: reap_exited())
        while True:
            try:
                _, fds, _, _ = socket.recv_fds(sock, 1, 3)
            except OSError:
                return
            if len(fds) != 3:
                return  # the template is gone (or sent nothing an episode needs)
            try:
                pid = fork_retrying()
            except BlockingIOError:
                pid = -1  # the template reports the episode as not forked
            if pid == 0:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                sock.close()
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):  # stderr is a shared log: an episode must not leave notes there
                    os.dup2(null, fd)
                _episode(first, *fds)
            for fd in fds:
                os.close(fd)
            sock.send(str(pid).encode())

    def spawn(self, fds: list[int]) -> int:
        """Fork an episode with ``fds`` (read end of its replies, write end of its messages, its report
        pipe); its pid, or 0 when it could not be forked (the process limit, the spawner gone)."""
        import socket

        try:
            socket.send_fds(self.sock, [b"e"], fds)
            answer = self.sock.recv(32)
        except OSError:
            return 0
        return int(answer) if answer.isdigit() and int(answer) > 0 else 0

    def close(self) -> None:
        self.sock.close()


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return int(fh.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _read_all(fd: int) -> bytes:
    out = bytearray()
    while chunk := os.read(fd, 4096):
        out += chunk
    return bytes(out)


def _read_line(fd: int) -> bytes:
    """The first line on ``fd``, read byte-wise so nothing after it is buffered away."""
    out = bytearray()
    while not out.endswith(b"\n"):
        ch = os.read(fd, 1)
        if not ch:
            break
        out += ch
    return bytes(out)


def main() -> None:
    out_fd = os.dup(sys.stdout.fileno())
    os.dup2(2, 1)  # print() of any code here goes to stderr, never into the protocol
    sys.stdout = sys.stderr
    first = json.loads(_read_line(0) or b"{}")
    if first.get("op") != "load":
        return
    _prctl_no_dump()  # episodes (same uid) may not reach the template's pipes through /proc
    try:  # parse, validate and compile once here (no harness code runs); each episode only executes
        from harnesses.validate import prepare

        first["prepared"] = prepare(first["source"], first.get("filename", "<harness>"))
        import harnesses.base  # noqa: F401  (imported once, before the forks)

        packed_syscall_filter("E")  # the episodes' allow-list, built once, before the forks
    except BaseException as exc:  # noqa: BLE001
        os.write(
            out_fd,
            (
                json.dumps({"op": "load_error", "error": f"{type(exc).__name__}: {exc}"[:4000]}) + "\n"
            ).encode(),
        )
        return
    template = _Template(first, out_fd)
    # Check that the harness loads, in a throwaway process (harness code never runs in the template).
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(err_r)
        os.close(out_fd)
        try:  # alone like an episode: nothing it starts outlives it or meets a later episode
            isolated = _isolate_or_not()
            if isolated > 0:
                _, status = os.waitpid(isolated, 0)
                os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 3)
            _load(first)
            os._exit(0)
        except BaseException as exc:  # noqa: BLE001
            os.write(err_w, f"{type(exc).__name__}: {exc}"[:4000].encode("utf-8", "replace"))
            os._exit(3)
    os.close(err_w)
    with os.fdopen(err_r, "rb") as fh:
        load_error = fh.read().decode("utf-8", "replace")
    _, status = os.waitpid(pid, 0)
    if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
        template.emit({"op": "load_error", "error": load_error or f"loading failed (wait status {status})"})
        return
    try:
        import ctypes

        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans come to the template
    except (OSError, AttributeError):
        pass
    template.spawner = _Spawner(first, (0, out_fd))  # before the first message is relayed
    template.emit({"op": "ready"})
    template.loop(0)
    for episode in list(template.children):
        template.end(episode, report=False)
    template.spawner.close()


def _run_program(shipped: list[str]) -> None:
    """The program of :func:`worker_program`: the harness API is told the shipped harness modules it
    carries (``shipped``, its arguments), then :func:`main`."""
    import harnesses.validate

    harnesses.validate.SHIPPED_MODULES = frozenset(shipped)
    main()


if __name__ == "__main__":
    _run_program(sys.argv[1:])
