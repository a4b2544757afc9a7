"""Red-team tests of the Python tool: every attack is contained, reported, leaves no process behind,
and the env keeps working afterwards.

These run with ``isolation="namespaces"`` (what this project's machines and CI provide); a machine
without Linux namespaces fails ``test_namespaces_are_available_here`` with the reason instead of
silently testing less. A few limits are also tested in the ``isolation="none"`` fallback.
"""

from __future__ import annotations

import dataclasses
import os
import time
import uuid

import pytest

from harnesses.worker import _parent
from tests.procs import proc_files
from tests.sandbox_script import LOAD_SANDBOX
from whale_envs.math import MathEnv, MathProblem
from whale_envs.math.verify import _HELPER
from whale_envs.sandbox import Limits, kill_tree, run_python
from whale_envs.tasks import ListSource, Task

# `make test` runs the jail and sandbox-pool tests on one worker, one after another (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("sandbox")

LIMITS = Limits(
    wall_s=4.0, cpu_s=2, memory_mb=256, max_processes=16, output_bytes=65_536, isolation="namespaces"
)
PROJECT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _ours_or_orphaned(pid: int) -> bool:
    """A process of this test (a descendant of this process), or one nobody waits for (reparented to
    init). Sandbox interpreters of other programs on the machine (a training run using the Python tool
    while the tests run) are neither."""
    if _parent(pid) == 1:
        return True
    me = os.getpid()
    while pid > 1:
        pid = _parent(pid)
        if pid == me:
            return True
    return False


def _kept_uids() -> set[int]:
    """The jail uids of the sandboxes kept on purpose: the math verifier's helpers (they live as long as
    this process) and the fork server's warm pool (started before any call asks for them)."""
    from whale_envs.sandbox import pool_uids

    helpers = {p._uid for p in _HELPER.procs() if p is not None and p.poll() is None}
    return helpers | pool_uids()


def _uid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("Uid:"))
    except (OSError, StopIteration, ValueError):
        return None


def leftover(marker: str | None = None) -> list[int]:
    """Pids of processes that a sandboxed run of this test may have left: the sandbox interpreter's own
    command line (``python -S -B -u main.py``) or one that carries ``marker``. The verifier's helpers and the
    warm pool (the same command line, kept on purpose) are not leftovers."""
    found = []
    kept = _kept_uids()
    for pid, cmdline in proc_files("cmdline"):
        if _uid(pid) in kept:
            continue
        argv = cmdline.split(b"\0")
        if marker and marker.encode() in b" ".join(argv):
            found.append(pid)
        elif argv[1:5] == [b"-S", b"-B", b"-u", b"main.py"] and _ours_or_orphaned(pid):
            found.append(pid)
    return found


def no_leftover(marker: str | None = None) -> bool:
    for _ in range(20):  # the kernel reaps a killed namespace asynchronously; give it a moment
        if not leftover(marker):
            return True
        time.sleep(0.05)
    return False


def _env(limits: Limits) -> MathEnv:
    source = ListSource("custom", [Task("q0", MathProblem("What is 6 * 7?", "42"))])
    return MathEnv(tasks=source, max_tool_calls=3, tool_limits=limits)


@pytest.fixture(scope="module")
def env() -> MathEnv:
    return _env(LIMITS)


def attack(env: MathEnv, code: str) -> tuple[str, dict]:
    """Run ``code`` through the env's tool, check the env still works, return (observation, last_tool)."""
    env.reset()
    obs, reward, terminated, truncated, info = env.step("python: " + code)
    assert info["error"] is None and not terminated and not truncated and reward == 0.0
    after, *_ = env.step("python: print(6 * 7)")
    assert "\n42\n" in after, after  # the env (and its tool) keep working
    *_, final = env.step("answer: 42")
    assert final["solved"]
    return obs, info["last_tool"]


def test_namespaces_are_available_here():
    from whale_envs.sandbox import isolation_available

    assert isolation_available(), (
        "Linux namespaces (unshare) are refused here; the sandbox would run unisolated"
    )
    assert run_python("print(1)", LIMITS).isolation == "namespaces"


def test_infinite_loop_stops_at_the_cpu_limit():
    # A wall-clock limit far above the CPU limit: on a loaded machine a busy loop gets less than a core,
    # and with the module's 4 s it would hit the wall first (that limit has its own test below).
    obs, tool = attack(_env(dataclasses.replace(LIMITS, wall_s=60.0)), "while True: pass")
    assert tool["limit"] == "cpu" and "CPU time limit of 2 s" in obs
    assert tool["wall_s"] < 60.0 and no_leftover()


@pytest.mark.slow
def test_sleeping_forever_stops_at_the_wall_clock_limit(env):
    obs, tool = attack(env, "import time; time.sleep(3600)")
    assert tool["limit"] == "wall" and "wall-clock limit of 4 s" in obs and no_leftover()


def test_memory_bomb_hits_the_memory_limit(env):
    obs, tool = attack(env, "x = []\nwhile True: x.append(bytearray(10**7))")
    assert tool["limit"] == "memory" and "MemoryError" in obs and "memory limit of 256 MiB" in obs
    assert no_leftover()


@pytest.mark.slow
def test_fork_bomb_is_capped_and_cleaned_up(env):
    code = (
        "import os, time\n"
        "n = 0\n"
        "while True:\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(60); os._exit(0)\n"
        "        n += 1\n"
        "    except OSError as e:\n"
        "        print('forks:', n, e.strerror, flush=True); break\n"
        "while True: os.fork() if n < 0 else time.sleep(1)\n"
    )
    obs, tool = attack(env, code)
    assert f"forks: {LIMITS.max_processes - 1} Resource temporarily unavailable" in obs
    assert tool["limit"] == "wall" and no_leftover()
    marker = "whale-bomb-" + uuid.uuid4().hex
    code = (  # the classic shell bomb, running in the background while the program goes on
        "import subprocess, time\n"
        f"subprocess.Popen(['bash', '-c', 'b(){{ b|b& }}; b', {marker!r}])\n"
        "time.sleep(2)\n"
        "print('still responsive')\n"
    )
    obs, tool = attack(env, code)
    assert "still responsive" in obs and no_leftover(marker)


def test_writing_outside_the_working_directory_fails(env):
    target = os.path.join(PROJECT, "PWNED-" + uuid.uuid4().hex)
    for path in (target, "/usr/PWNED", "/PWNED", "/etc/PWNED"):
        obs, tool = attack(env, f"open({path!r}, 'w').write('x')")
        # (a checkout under the temp directory: its path lies in the jail's private /tmp, read-only dirs)
        refused = ("Read-only file system", "No such file", "Permission denied")
        assert tool["exit_code"] == 1 and any(r in obs for r in refused), obs
    assert not os.path.exists(target) and not os.path.exists("/usr/PWNED")
    obs, _ = attack(env, "open('ok.txt', 'w').write('fine'); print(open('/tmp/ok.txt').read())")
    assert "fine" in obs  # its own directory (also /tmp) is writable


def test_reading_the_project_or_etc_passwd_fails(env):
    for path in ("/etc/passwd", os.path.join(PROJECT, "setup.cfg"), os.path.abspath(__file__)):
        obs, tool = attack(env, f"print(open({path!r}).read())")
        assert "FileNotFoundError" in obs and tool["exit_code"] == 1, obs
    obs, _ = attack(env, "import os; print(sorted(os.listdir('/etc')), 'home' in os.listdir('/'))")
    assert "['ld.so.cache'] False" in obs  # /etc holds only the loader cache


def test_opening_a_socket_fails(env):
    obs, tool = attack(
        env,
        "import socket\n"
        "for host in ('127.0.0.1', '1.1.1.1'):\n"
        "    try:\n"
        "        socket.create_connection((host, 80), timeout=2)\n"
        "    except OSError as e:\n"
        "        print(host, e.strerror)\n",
    )
    assert obs.count("Network is unreachable") == 2 and tool["exit_code"] == 0


def test_printing_100_mb_is_cut_at_the_output_limit(env):
    obs, tool = attack(env, "import sys\nfor _ in range(100): sys.stdout.write('x' * (1 << 20))")
    assert tool["limit"] == "output" and tool["output_truncated"]
    assert "output limit of 65536 bytes" in obs and len(obs) < 10_000 and no_leftover()


def test_a_background_process_does_not_outlive_the_call(env):
    marker = "whale-bg-" + uuid.uuid4().hex
    code = (
        "import subprocess, os\n"
        f"subprocess.Popen(['sh', '-c', 'sleep 300; echo {marker}'], start_new_session=True)\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    import time; time.sleep(300)\n"
        "print('spawned')\n"
    )
    obs, tool = attack(env, code)
    assert "spawned" in obs and tool["exit_code"] == 0 and tool["limit"] is None
    assert no_leftover(marker)


def test_a_crash_is_an_observation(env):
    obs, tool = attack(env, "import os; os.abort()")
    assert tool["exit_code"] == 128 + 6 and "[exit status 134]" in obs
    obs, tool = attack(env, "def f(): f()\nf()")
    assert "RecursionError" in obs


def test_installed_packages_are_importable_read_only():
    result = run_python("import numpy, sympy; print(numpy.arange(4).sum(), sympy.factorint(360))", LIMITS)
    assert result.ok and result.stdout == "6 {2: 3, 3: 2, 5: 1}\n", result


# ------------------------------------------------------------------------------------ fallback


FALLBACK = Limits(wall_s=3.0, cpu_s=1, memory_mb=256, output_bytes=10_000, isolation="none")


@pytest.mark.slow
def test_fallback_still_enforces_time_memory_output_and_kills_the_group(monkeypatch):
    from whale_envs import sandbox
    from whale_envs.sandbox import config

    monkeypatch.setenv(sandbox.OPT_IN_ENV, "1")  # the fallback runs only under the explicit opt-in
    problem = config.root_problem("none")
    if problem:  # as root with an interpreter an unprivileged uid cannot read: refused, never run as root
        result = run_python("print('ran')", FALLBACK)
        assert result.limit == "setup" and "never runs as uid 0" in result.error and not result.stdout
        return
    assert run_python("while True: pass", FALLBACK).limit == "cpu"
    assert run_python("import time; time.sleep(60)", FALLBACK).limit == "wall"
    assert run_python("x = bytearray(600 * 2**20)", FALLBACK).limit == "memory"
    assert run_python("print('y' * 10**6)", FALLBACK).limit == "output"
    marker = "whale-fb-" + uuid.uuid4().hex
    result = run_python(
        f"import subprocess; subprocess.Popen(['sh', '-c', 'sleep 300; echo {marker}'])", FALLBACK
    )
    assert result.isolation == "none" and result.ok and no_leftover(marker)


def test_kill_tree_ignores_processes_that_are_gone():
    kill_tree(2**22 + 12345)  # no such group: no exception
    with pytest.raises(ValueError, match="wall_s"):
        run_python("print(1)", Limits(wall_s=-1))


# ------------------------------------------------------------------------------------ unprivileged

_UNPRIVILEGED_SCRIPT = (
    LOAD_SANDBOX
    + """\
L = sb.Limits(wall_s=4, cpu_s=2, memory_mb=256, max_processes=8, isolation="namespaces")
codes = {
    "passwd": "open('/etc/passwd')",
    "remount": "import ctypes; l = ctypes.CDLL(None, use_errno=True); print(l.mount(None, b'/usr', None, 4128, None))",
    "socket": "import socket; socket.create_connection(('127.0.0.1', 80), timeout=1)",
    "fork": "import os, time\\nn = 0\\nwhile True:\\n    try:\\n        if os.fork() == 0: time.sleep(30); os._exit(0)\\n"
            "        n += 1\\n    except OSError: print('forks', n); break",
}
out = {name: (lambda r: [r.isolation, r.exit_code, r.stdout + r.stderr])(sb.run_python(c, L)) for name, c in codes.items()}
print(json.dumps({"uid": os.getuid(), "calls": sb.CALLS, **out}))
"""
)


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.access("/usr/bin/python3", os.X_OK),
    reason="needs root (to switch to an unprivileged user) and a system Python that user can run",
)
def test_the_unprivileged_path_user_namespace_is_isolated_too():
    """Run the sandbox as an ordinary user (uid 65534), where it must build a user namespace itself."""
    import json
    import shutil
    import subprocess
    import tempfile

    # The sandbox package needs only the standard library: a copy that user can read (the checkout may
    # lie in a directory only its owner can enter, as one made by mktemp; so do pytest's tmp_path dirs).
    root = tempfile.mkdtemp(prefix="whale-unpriv-")
    os.chmod(root, 0o755)
    os.mkdir(os.path.join(root, "whale_envs"), 0o755)
    open(os.path.join(root, "whale_envs", "__init__.py"), "w").close()
    shutil.copy(os.path.join(PROJECT, "whale_envs", "_children.py"), os.path.join(root, "whale_envs"))
    shutil.copytree(
        os.path.join(PROJECT, "whale_envs", "sandbox"),
        os.path.join(root, "whale_envs", "sandbox"),
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            os.chmod(os.path.join(folder, name), 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644)
    done = subprocess.run(
        ["/usr/bin/python3", "-I", "-c", _UNPRIVILEGED_SCRIPT, root],
        user=65534,
        group=65534,
        extra_groups=[],
        capture_output=True,
        text=True,
        cwd="/",
        timeout=120,
    )
    shutil.rmtree(root, ignore_errors=True)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["uid"] == 65534
    assert report.pop("calls") == {
        "served": 5,
        "fresh": 0,
    }  # the probe and 4 calls, all through the fork server
    assert all(v[0] == "namespaces" for k, v in report.items() if k != "uid"), report
    assert "FileNotFoundError" in report["passwd"][2]
    assert report["remount"][2].strip() == "-1"  # cannot make /usr writable again
    assert "Network is unreachable" in report["socket"][2]
    assert report["fork"][2].strip() == "forks 7"
