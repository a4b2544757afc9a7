"""The sandbox's fork server: what it could break if it were wrong, checked call by call.

``run_python`` hands each namespaced call to one long-lived boot interpreter (the fork server), whose
child builds the call's jail. These tests pin the per-call guarantees that a shared server could lose:
no state from one call in the next, a fresh tmpfs and PID namespace per call, nothing left running,
the same result as a fresh boot interpreter on every limit, and a server that never outlives its caller
nor serves a forked child of it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tests.procs import carrying, running, running_children
from tests.sandbox_script import LOAD_SANDBOX
from whale_envs import sandbox
from whale_envs.sandbox import Limits, forkserver, pool, run_python

# `make test` runs the jail and sandbox-pool tests on one worker, one after another (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("sandbox")

JAILED = Limits(wall_s=8, cpu_s=4, memory_mb=256, isolation="namespaces")
PROJECT = Path(__file__).resolve().parents[2]


def _server_pid() -> int:
    assert run_python("pass", JAILED).ok
    assert forkserver._SERVER is not None
    return forkserver._SERVER.proc.pid


def test_nothing_of_one_call_is_visible_to_the_next():
    first = run_python(
        "import os\n"
        "open('/sandbox/note', 'w').write('secret')\n"
        "open('/tmp/big', 'wb').write(b'x' * (8 << 20))\n"
        "os.environ['LEAK'] = '1'\n"
        "print(os.getpid(), sorted(p for p in os.listdir('/proc') if p.isdigit()))\n",
        JAILED,
    )
    assert first.ok and first.stdout == "2 ['1', '2']\n", first
    second = run_python(
        "import os\n"
        "st = os.statvfs('/sandbox')\n"
        "files = [p for p in os.listdir('/sandbox') if not os.path.isdir('/sandbox/' + p)]\n"
        "print(sorted(files), os.path.exists('/tmp/big'), os.environ.get('LEAK'),\n"
        "      st.f_bfree * st.f_bsize >= 15 << 20, os.getpid(),\n"
        "      sorted(p for p in os.listdir('/proc') if p.isdigit()), sorted(os.listdir('/proc/self/fd')))\n",
        JAILED,
    )
    # a fresh, empty 16 MiB tmpfs (its files: a checkout or venv under the temp directory also puts the
    # directories leading to its read-only mount point there, as /tmp is a view of it); a fresh PID
    # namespace (the code is pid 2 again, under its own pid 1);
    # only stdin/stdout/stderr open (the 4th is listdir's own): no socket of the server or the caller
    assert second.ok, second
    assert second.stdout == "['main.py'] False None True 2 ['1', '2'] ['0', '1', '2', '3']\n", second.stdout


def test_the_server_runs_no_code_and_survives_what_the_code_does():
    server = _server_pid()
    for code in ("import os; os.abort()", "x = bytearray(600 * 2**20)", "import os; os.kill(1, 9)"):
        run_python(code, JAILED)
    assert forkserver._SERVER.proc.pid == server and forkserver._SERVER.proc.poll() is None
    with open(f"/proc/{server}/cmdline", "rb") as fh:
        assert b"--fork-server" in fh.read()
    # after the calls only the pooled sandboxes (each waiting for its code, in every pool earlier tests
    # left) and at most the one child forked in advance are running: no supervisor lingers (those done
    # are reaped at the server's next call). Counted once the pools' refills are done (a refill of a
    # pool given up meanwhile is counted nowhere until its sandbox ends); the wait ends as soon as the
    # count holds, and is long because a loaded CI machine may take seconds to schedule an exit: a
    # supervisor that lingers for good still fails it.
    deadline = time.monotonic() + 30
    for thread in threading.enumerate():
        if thread.name == "whale-sandbox-pool":
            thread.join(max(0.0, deadline - time.monotonic()))
    while len(running_children(server)) > 1 + sandbox.pooled_now() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(running_children(server)) <= 1 + sandbox.pooled_now(), (
        running_children(server),
        sandbox.pooled_now(),
    )


def test_a_background_process_is_gone_when_the_call_returns():
    marker = f"whale-fs-{os.getpid()}-{time.monotonic_ns()}"
    result = run_python(
        "import subprocess, os\n"
        f"subprocess.Popen(['sh', '-c', 'sleep 300; echo {marker}'], start_new_session=True)\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        os.execv('/bin/sh', ['sh', '-c', 'sleep 300 # {marker}'])\n"
        "    os._exit(0)\n"
        "print('spawned')\n",
        JAILED,
    )
    assert result.ok and result.stdout == "spawned\n", result

    deadline = time.monotonic() + 2  # the kernel reaps a killed namespace asynchronously
    while carrying(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert carrying(marker) == []


@pytest.mark.parametrize(
    "code, limits",
    [
        ("print('a'); import sys; print('b', file=sys.stderr); sys.exit(3)", JAILED),
        ("def f(n):\n    return 1 / n\nf(0)", JAILED),
        ("import os; os.abort()", JAILED),
        ("x = []\nwhile True: x.append(bytearray(10**7))", JAILED),
        ("print('y' * 10**6)", JAILED),
        ("import time; time.sleep(30)", Limits(wall_s=0.5, isolation="namespaces")),
        ("open('f', 'wb').write(b'z' * (2 << 20))", Limits(file_mb=1, isolation="namespaces")),
        ("open('f', 'w').write('no')", Limits(writable_files=False, isolation="namespaces")),
        ("print(1 +", JAILED),
        ("import sys; raise ValueError('v') from KeyError('k')", JAILED),
        ("import sys; sys.exit('bye')", JAILED),
        ("import sys; print(repr(sys.stdin.read()), sys.argv, sys.path[0], __name__, __doc__)", JAILED),
        ("x: int = 1\nprint(sorted(globals()), __annotations__)", JAILED),
    ],
    ids=[
        "exit",
        "traceback",
        "abort",
        "memory",
        "output",
        "wall",
        "file",
        "read-only",
        "syntax-error",
        "chained",
        "exit-message",
        "main",
        "globals",
    ],
)
def test_the_same_result_as_a_fresh_boot_interpreter(code, limits):
    served = run_python(code, limits)
    fresh = run_python(code, limits, fork_server=False)
    fields = ("stdout", "stderr", "exit_code", "limit", "output_truncated", "isolation", "error")
    assert {f: getattr(served, f) for f in fields} == {f: getattr(fresh, f) for f in fields}


def test_concurrent_calls_each_get_their_own_output():
    before = dict(sandbox.CALLS)
    results: dict[int, list] = {}

    def work(i: int) -> None:
        results[i] = [run_python(f"print({i} * 1000 + {j})", JAILED).stdout for j in range(3)]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: [f"{i * 1000 + j}\n" for j in range(3)] for i in range(4)}
    assert sandbox.CALLS == {"served": before["served"] + 12, "fresh": before["fresh"]}  # none fell back


def test_a_dead_server_is_replaced_and_the_call_still_runs(monkeypatch):
    monkeypatch.setenv(sandbox.POOL_ENV, "0")  # a served call (the pooled ones outlive their server)
    old = _server_pid()
    os.kill(old, signal.SIGKILL)
    forkserver._SERVER.proc.wait()  # its child forked in advance still waits on the control socket
    # not noticed before the call is sent: that child takes it, finds no server and dies before the
    # code runs; the call goes to a new server
    monkeypatch.setattr(forkserver._SERVER.proc, "poll", lambda: None)
    result = run_python("print(6 * 7)", JAILED)
    assert result.ok and result.stdout == "42\n"
    assert forkserver._SERVER.proc.pid != old


def test_a_forked_child_of_the_caller_starts_its_own_server():
    parent_server = _server_pid()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            r = run_python("print(7)", JAILED)
            os.write(write, f"{r.stdout.strip()} {forkserver._SERVER.proc.pid}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as fh:
        out, child_server = fh.read().split()
    os.waitpid(pid, 0)
    assert out == "7" and int(child_server) != parent_server
    assert forkserver._SERVER.proc.pid == parent_server and run_python("print(8)", JAILED).stdout == "8\n"


_EXIT_SCRIPT = (
    LOAD_SANDBOX
    + """
r = sb.run_python("print(1)", sb.Limits(isolation="namespaces"))
print(r.stdout.strip(), fs._SERVER.proc.pid, sb.CALLS["fresh"], flush=True)
os._exit(0)  # no clean-up: the server must notice on its own
"""
)


def test_the_server_exits_with_its_caller():
    done = subprocess.run(
        [sys.executable, "-I", "-c", _EXIT_SCRIPT, str(PROJECT)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    out, server, fresh = done.stdout.split()
    assert out == "1" and fresh == "0"  # the probe and the call both went through the server
    deadline = time.monotonic() + 5
    while running(int(server)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(int(server))


_BUSY_SCRIPT = (
    LOAD_SANDBOX
    + """
code = "import time\\nend = time.process_time() + 0.3\\nwhile time.process_time() < end: pass\\nprint('done')"
rs = [sb.run_python(code, sb.Limits(isolation="namespaces")) for _ in range(3)]
print(all(r.stdout == "done\\n" for r in rs), sb.CALLS == {"served": 4, "fresh": 0})
"""
)


def test_the_cpu_time_of_served_calls_is_counted_in_the_callers():
    """``time -v`` of a run (docs/COMPARE.md's cost) must include its sandboxes' CPU time: the server
    reaps its children and is waited for at exit."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, "-I", "-c", _BUSY_SCRIPT, str(PROJECT)], capture_output=True, text=True, timeout=60
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert done.returncode == 0 and done.stdout.split() == ["True", "True"], done.stderr
    assert (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime) >= 0.9


_ABANDON_SCRIPT = (
    LOAD_SANDBOX
    + """
import threading, time
marker = sys.argv[2]
code = f"import os\\nos.execv('/bin/sh', ['sh', '-c', 'sleep 300; : {marker}'])"
threading.Thread(target=sb.run_python, args=(code, sb.Limits(wall_s=120, isolation="namespaces")), daemon=True).start()
time.sleep(2)
print(sb.CALLS["served"], flush=True)
os._exit(0)  # the caller dies in the middle of the call
"""
)


def test_a_call_whose_caller_dies_is_killed():
    """Its supervisor sees the report socket close and kills the call's PID 1 (a fresh boot
    interpreter would let the code run on until its own end)."""
    marker = f"whale-abandoned-{os.getpid()}-{time.monotonic_ns()}"
    done = subprocess.run(
        [sys.executable, "-I", "-c", _ABANDON_SCRIPT, str(PROJECT), marker],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.split() == ["2"], done.stderr  # the probe and the call

    deadline = time.monotonic() + 5
    while carrying(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert carrying(marker) == []


def test_a_served_call_writes_nothing_on_the_host(monkeypatch):
    """The code travels with the request and the jail's root is mounted on the server's directory: no
    temporary folder or code file per call (they cost a few ms on a journaled disk)."""
    _server_pid()

    def no_temp_dirs(*args, **kwargs):
        raise AssertionError("a served call made a temporary folder")

    monkeypatch.setattr(tempfile, "mkdtemp", no_temp_dirs)
    before = dict(sandbox.CALLS)
    result = run_python("print('\\u00e9', open(__file__).read().count('print'))", JAILED)
    assert result.ok and result.stdout == "\u00e9 2\n", result  # its own file, as written
    assert sandbox.CALLS["served"] == before["served"] + 1


def test_long_code_takes_the_old_path_and_runs_the_same():
    code = "x = 1\n" * 4000 + "print(x + len(open(__file__).read()))"  # over _SERVED_CODE_MAX characters
    assert len(code) > forkserver.SERVED_CODE_MAX
    before = dict(sandbox.CALLS)
    result = run_python(code, JAILED)
    assert result.ok and result.stdout == f"{1 + len(code)}\n", result
    assert sandbox.CALLS == {"served": before["served"], "fresh": before["fresh"] + 1}


# ------------------------------------------------------------------------------------ the warm pool
#
# A pooled sandbox is a served call started before any call asks for it: its jail built, its interpreter
# started (and the preloaded modules imported) by the same steps, it waits for its code on stdin. A
# call takes the oldest, sends it the code, and the pool sends the server a new one.


def _warm(limits: Limits = JAILED) -> pool._Pool:
    sandbox.warm_pool(limits)
    assert sandbox.pool_ready(limits, timeout=30) == sandbox.pool_size()
    return pool._POOLS[(limits, "namespaces")]


def _timed(code: str, limits: Limits) -> float:
    start = time.perf_counter()
    result = run_python(code, limits)
    assert result.ok, result
    return time.perf_counter() - start


def test_a_call_to_a_warm_pool_never_waits_for_start_up(monkeypatch):
    """Side by side, interleaved: a call whose pooled sandbox is ready against a cold start (the pool
    off: the fork server's child builds the jail and starts the interpreter after the call came)."""
    warm, cold = [], []
    for i in range(6):
        monkeypatch.delenv(sandbox.POOL_ENV, raising=False)
        _warm()
        before = dict(sandbox.POOL_CALLS)
        pair = []
        for pooled in (True, False) if i % 2 else (False, True):
            if pooled:
                monkeypatch.delenv(sandbox.POOL_ENV, raising=False)
                pair.append((warm, _timed("print(1)", JAILED)))
            else:
                monkeypatch.setenv(sandbox.POOL_ENV, "0")
                pair.append((cold, _timed("print(1)", JAILED)))
        for times, seconds in pair:
            times.append(seconds)
        # the pooled call found its sandbox ready: it sent its code and waited for nothing else
        assert sandbox.POOL_CALLS["taken"] == before["taken"] + 1
        assert sandbox.POOL_CALLS["ready"] == before["ready"] + 1
    ratio = sorted(warm)[3] / sorted(cold)[3]
    print(f"warm pool / cold start, per call: {ratio:.2f} ({warm} / {cold})")
    assert ratio < 1.0


def test_a_pooled_sandbox_runs_one_program_and_ends():
    pool = _warm()
    first = pool.calls[0]
    supervisor = first.supervisor(10)
    assert supervisor and running(supervisor)
    result = run_python("import os, sys\nprint(os.read(0, 100), sys.stdin.read() == '')", JAILED)
    assert result.ok and result.stdout == "b'' True\n", result  # its stdin is /dev/null: no second program
    assert first not in pool.calls and first.code_w == -1  # its stdin closed: the code was all it got
    deadline = time.monotonic() + 5
    while running(supervisor) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(supervisor)  # single-use: with its program done, its supervisor is gone


def test_the_pool_refills_in_the_background():
    pool = _warm()
    taken = list(pool.calls)  # kept alive: an id() of a freed object can come back for a new one
    for i in range(2 * sandbox.pool_size()):
        assert run_python(f"print({i})", JAILED).stdout == f"{i}\n"
        # refilled when the call is done, by a thread of its own (not while the code runs)
        assert sandbox.pool_ready(JAILED, timeout=30) == sandbox.pool_size() == len(pool.calls)
    assert not any(c is t for c in pool.calls for t in taken)  # every one was used once and replaced
    assert sandbox.pool_ready(JAILED, timeout=30) == sandbox.pool_size()


def test_a_crashed_pooled_sandbox_is_replaced():
    pool = _warm()
    crashed = pool.calls[0]
    supervisor = crashed.supervisor(10)
    os.killpg(supervisor, signal.SIGKILL)  # its supervisor and (by PDEATHSIG) its jail
    deadline = time.monotonic() + 5
    while running(supervisor) and time.monotonic() < deadline:
        time.sleep(0.02)
    before = dict(sandbox.POOL_CALLS)
    assert run_python("print(6 * 7)", JAILED).stdout == "42\n"  # the call takes the next one
    assert sandbox.POOL_CALLS["lost"] == before["lost"] + 1
    assert sandbox.POOL_CALLS["taken"] == before["taken"] + 1
    assert sandbox.pool_ready(JAILED, timeout=30) == sandbox.pool_size()
    assert crashed not in pool.calls and len(pool.calls) == sandbox.pool_size()


_VIEW = """\
import os, resource, sys
names = ("CPU", "AS", "FSIZE", "NOFILE", "NPROC", "CORE")
print(sorted(os.environ.items()), os.getcwd(), sorted(os.listdir('.')), sorted(os.listdir('/proc/self/fd')))
print(os.getpid(), os.getuid() == os.geteuid(), [resource.getrlimit(getattr(resource, 'RLIMIT_' + n)) for n in names])
print(open('/proc/self/status').read().split('Seccomp:')[1].split()[0], open('/proc/self/cmdline', 'rb').read())
print(sorted(m for m in sys.modules if m in ('sympy', 'numpy', 'whale_envs')), sys.flags.no_site, sys.flags.isolated)
"""


def test_a_pooled_sandbox_is_the_same_jail_as_a_cold_one():
    """What the code sees of its process: environment, files, descriptors, limits, seccomp, command
    line: as a fresh boot interpreter's call. A pooled sandbox learnt nothing of its call before it
    came (it was started from the limits alone) and holds nothing of another."""
    _warm()
    before = sandbox.POOL_CALLS["taken"]
    pooled = run_python(_VIEW, JAILED)
    fresh = run_python(_VIEW, JAILED, fork_server=False)
    assert sandbox.POOL_CALLS["taken"] == before + 1
    assert pooled.ok and fresh.ok, (pooled, fresh)
    assert pooled.stdout == fresh.stdout


def test_the_pool_can_be_turned_off(monkeypatch):
    monkeypatch.setenv(sandbox.POOL_ENV, "0")
    before = dict(sandbox.POOL_CALLS)
    assert run_python("print(3)", Limits(wall_s=7, isolation="namespaces")).stdout == "3\n"
    assert sandbox.POOL_CALLS == before
    monkeypatch.setenv(sandbox.POOL_ENV, "many")
    with pytest.raises(ValueError, match=sandbox.POOL_ENV):
        sandbox.pool_size()


def test_with_a_dead_server_pooled_calls_still_run():
    """Pooled sandboxes started before the server died still serve their calls; those sent to the dead
    server never start (lost), and the calls after them go to a new server."""
    _warm()
    old = forkserver._SERVER.proc.pid
    os.kill(old, signal.SIGKILL)
    forkserver._SERVER.proc.wait()
    for i in range(2 * sandbox.pool_size() + 2):
        assert run_python(f"print({i})", JAILED).stdout == f"{i}\n"
    assert forkserver._SERVER.proc.pid != old


# ------------------------------------------------------------------------------------ the programs


def test_every_program_is_a_module_started_the_one_way(tmp_path):
    """The programs run in a child interpreter are modules (imported here like any); ``bundle`` starts
    each where nothing of the project is importable: from its files on the host, or as one ``main.py``
    carrying the modules it imports (a program that imports none is its own text)."""
    from whale_envs.sandbox import bundle
    from whale_envs.sandbox.programs import boot, episode_probe, pool_child, probe

    assert callable(boot.main) and callable(pool_child.main) and callable(episode_probe.episodes)
    assert bundle.modules(episode_probe.__name__) == [
        episode_probe.__name__,
        "whale_envs._children",
        probe.__name__,
    ]
    assert bundle.program(pool_child.__name__) == Path(pool_child.__file__).read_text(encoding="utf-8")
    bare = [sys.executable, "-I", "-S"]  # neither the project nor the installed packages
    main = tmp_path / "main.py"
    main.write_text(bundle.program(episode_probe.__name__), encoding="utf-8")
    jail_form = subprocess.run([*bare, str(main)], capture_output=True, text=True, timeout=30, cwd=tmp_path)
    host_form = subprocess.run(
        bundle.command(sys.executable, probe.__name__), capture_output=True, text=True, timeout=30
    )
    view = f"ok {os.getuid()} {int(os.path.exists('/etc/passwd'))}"
    assert jail_form.stdout.startswith(view + " episodes"), jail_form.stderr
    assert host_form.stdout == view, host_form.stderr


def test_the_bundler_reads_a_programs_modules_once_and_again_when_one_changes(tmp_path, monkeypatch):
    """Every sandbox start asks which modules a program carries (parsing them was most of a worker's
    start): they are read once per process, and again when a file read has changed."""
    import os

    from whale_envs.sandbox import bundle

    pkg = tmp_path / "whale_envs"
    pkg.mkdir()
    (pkg / "a.py").write_text("import whale_envs.b\n")
    (pkg / "b.py").write_text("X = 1\n")
    (pkg / "c.py").write_text("Y = 2\n")
    monkeypatch.setattr(bundle, "ROOT", tmp_path)
    monkeypatch.setattr(bundle, "_FOUND", {})
    parsed = []
    real_parse = bundle.ast.parse
    monkeypatch.setattr(bundle.ast, "parse", lambda *a, **k: parsed.append(a[1]) or real_parse(*a, **k))
    assert bundle.modules("whale_envs.a") == ["whale_envs.a", "whale_envs.b"]
    assert bundle.modules("whale_envs.a") == ["whale_envs.a", "whale_envs.b"] and len(parsed) == 2
    (pkg / "a.py").write_text("import whale_envs.b\nimport whale_envs.c\n")
    os.utime(pkg / "a.py", ns=(1, 1))  # a changed stamp even on a coarse clock
    assert bundle.modules("whale_envs.a") == ["whale_envs.a", "whale_envs.b", "whale_envs.c"]
