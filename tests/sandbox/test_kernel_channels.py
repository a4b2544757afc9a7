"""Red team: samples talk through shared kernel objects.

The namespaces of an episode (and of a tool call) separate *names*, not *inodes*: every episode and
every tool call sees the same read-only interpreter files, so any kernel facility that watches, locks
or signals on an inode is a channel between the samples of one task unless it is out of reach. A deny-list
of such calls was not enough: inotify from the math tool (a lint-clean harness reaches it through a
``python:`` action) and ``fcntl(F_NOTIFY)`` + ``F_SETSIG`` (dnotify) still got through, so the filter is
now an allow-list (``SYSCALLS`` and ``ARGUMENTS`` in ``whale_envs/_children.py``).

Each channel below runs in two samples of one task at once, from the harness process (full Python:
the lint is bypassed, as in ``tests/sandbox/test_harness_worker.py``) and from the tool sandbox (two calls at
once with the math env's limits, the jail a ``python:`` action runs in). Each payload sets ``out``:
``refused`` when the kernel object cannot be made or used, ``alone`` when it works but shows nothing of
the sibling, ``met``/``open`` when it could carry bits. Every channel must carry 0 bits.
"""

from __future__ import annotations

import platform
import threading
import uuid

import pytest

from harnesses.loader import harness_from_source
from tests.sandbox.test_harness_worker import HEADER, reported, rollouts, unlinted  # noqa: F401 - a fixture
from whale_envs.math.env import DEFAULT_TOOL_LIMITS
from whale_envs.sandbox import isolation_available, run_python

# `make test` runs the jail and sandbox-pool tests on one worker, one after another (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("sandbox")

MEET = "whale-r4-" + uuid.uuid4().hex[:8]
ARM = platform.machine() == "aarch64"
NR = {  # syscall numbers the payloads call directly (x86_64, aarch64)
    "fanotify_init": 212 if ARM else 300,
    "mq_open": 180 if ARM else 240,
    "msgget": 186 if ARM else 68,
    "userfaultfd": 282 if ARM else 323,
    "perf_event_open": 241 if ARM else 298,
    "memfd_create": 279 if ARM else 319,
}

#: Shared by every payload: libc, a quiet directory of the shared standard library, and ``refused``.
COMMON = (
    "import ctypes, os, time\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "SHARED = os.path.join(os.path.dirname(os.__file__), 'wsgiref')\n"
    "def refused():\n"
    "    return ctypes.get_errno() in (1, 38)\n"  # EPERM (a refused argument), ENOSYS (a refused call)
    "AT = 4 + os.urandom(1)[0] % 16\n"  # when this sample acts (os.urandom: forked episodes share `random`)
)

#: channel -> payload (sets ``out``). Both samples run it at the same time.
CHANNELS = {
    "inotify": (
        "fd = libc.inotify_init1(0o4000)\n"  # IN_NONBLOCK
        "if fd < 0:\n"
        "    out = 'refused' if refused() else 'error'\n"
        "else:\n"
        "    libc.inotify_add_watch(fd, SHARED.encode(), 0x20)\n"  # IN_OPEN, of any file of the folder
        "    n = 0\n"
        "    for i in range(30):\n"
        "        if i == AT:\n"
        "            os.close(os.open(os.path.join(SHARED, 'util.py'), os.O_RDONLY))\n"
        "        time.sleep(0.05)\n"
        "        try:\n"
        "            n += len(os.read(fd, 65536)) // 32\n"  # 16 bytes + the name, 'util.py' padded to 16
        "        except BlockingIOError:\n"
        "            pass\n"
        "    out = 'met' if n > 1 else 'alone'\n"  # our own open is one event
    ),
    "dnotify": (
        "import signal\n"
        "sig = signal.SIGRTMIN + 3\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, [sig, signal.SIGIO])\n"
        "fd = os.open(SHARED, os.O_RDONLY)\n"
        "if libc.fcntl(fd, 10, ctypes.c_int(sig)) != 0:\n"  # F_SETSIG
        "    out = 'refused' if refused() else 'error'\n"
        "elif libc.fcntl(fd, 1026, ctypes.c_uint(0x80000001)) != 0:\n"  # F_NOTIFY: DN_MULTISHOT | DN_ACCESS
        "    out = 'refused' if refused() else 'error'\n"
        "else:\n"
        "    n = 0\n"
        "    for i in range(30):\n"
        "        if i == AT:\n"
        "            with open(os.path.join(SHARED, 'util.py'), 'rb') as fh:\n"
        "                fh.read(1)\n"
        "        time.sleep(0.05)\n"
        "        while signal.sigtimedwait([sig], 0) is not None:\n"
        "            n += 1\n"
        "    out = 'met' if n > 1 else 'alone'\n"
    ),
    "lease-and-owner": (
        "fd = os.open(os.__file__, os.O_RDONLY)\n"
        "res = []\n"
        "for cmd, arg in ((1024, 0), (8, os.getpid()), (15, 0)):\n"  # F_SETLEASE(F_RDLCK), F_SETOWN, F_SETOWN_EX
        "    res.append('refused' if libc.fcntl(fd, cmd, ctypes.c_long(arg)) != 0 and refused() else 'open')\n"
        "out = ' '.join(res)\n"
    ),
    "fanotify": (
        f"fd = libc.syscall({NR['fanotify_init']}, 0x200, 0)\n"  # FAN_REPORT_FID (unprivileged)
        "out = 'refused' if fd < 0 and refused() else 'open'\n"
    ),
    "locks": (
        "import fcntl, struct\n"
        "fd = os.open(os.__file__, os.O_RDONLY)\n"
        "res = []\n"
        "for cmd in (6, 37):\n"  # F_SETLK, F_OFD_SETLK: a read lock on the whole file
        "    flock = struct.pack('hhqqi4x', 0, 0, 0, 0, 0)\n"
        "    try:\n"
        "        fcntl.fcntl(fd, cmd, flock); res.append('open')\n"
        "    except PermissionError:\n"
        "        res.append('refused')\n"
        "    except OSError as exc:\n"
        "        res.append('refused' if exc.errno == 38 else type(exc).__name__)\n"
        "try:\n"
        "    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB); res.append('open')\n"
        "except OSError as exc:\n"
        "    res.append('refused' if exc.errno in (1, 38) else type(exc).__name__)\n"
        "out = ' '.join(res)\n"
    ),
    "sockets": (
        "import socket\n"
        "res = []\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"  # unix: allowed, abstract names per netns
        "try:\n"
        f"    s.bind('\\0{MEET}'); time.sleep(1.0); res.append('alone')\n"  # both bind it at once
        "except OSError:\n"
        "    res.append('met')\n"  # the name is taken: the sibling holds it
        "for family, kind, proto in ((16, 3, 0), (16, 2, 15), (17, 3, 0), (40, 1, 0)):\n"  # netlink, packet, vsock
        "    try:\n"
        "        socket.socket(family, kind, proto); res.append('open')\n"
        "    except OSError as exc:\n"
        "        res.append('refused' if exc.errno in (1, 38) else type(exc).__name__)\n"
        "out = ' '.join(res)\n"
    ),
    "ipc": (
        "seg = libc.shmget(0x5A17F, 4096, 0o1000 | 0o2000 | 0o666)\n"  # IPC_CREAT | IPC_EXCL, a fixed key
        "res = ['met' if seg < 0 and ctypes.get_errno() == 17 else 'alone' if seg >= 0 else 'refused']\n"
        f"for made in (libc.msgget(0x5A17F, 0o1000 | 0o666), libc.semget(0x5A17F, 1, 0o1000 | 0o666),\n"
        f"             libc.syscall({NR['mq_open']}, b'{MEET}', 0o100 | 2, 0o600, None)):\n"
        "    res.append('open' if made >= 0 else ('refused' if refused() else 'error'))\n"
        "time.sleep(0.5)\n"  # hold the segment while the sibling tries
        "out = ' '.join(res)\n"
    ),
    "proc": (
        "time.sleep(0.3)\n"
        "others = [p for p in os.listdir('/proc') if p.isdigit() and int(p) not in (os.getpid(), os.getppid())]\n"
        "out = 'alone' if not others else 'met ' + ' '.join(others[:3])\n"
    ),
    "fifo": (
        "res = []\n"
        "for d in ('/tmp', '/sandbox', SHARED, '/dev'):\n"
        "    try:\n"
        f"        os.mkfifo(os.path.join(d, '{MEET}')); res.append('open')\n"
        "    except OSError as exc:\n"
        "        res.append('refused')\n"
        "out = ' '.join(res)\n"
    ),
    "other-kernel-objects": (
        "res = []\n"
        f"for nr, args in (({NR['userfaultfd']}, (0,)), ({NR['perf_event_open']}, (None, 0, -1, -1, 0)),\n"
        f"                 ({NR['memfd_create']}, (b'x', 0))):\n"
        "    res.append('refused' if libc.syscall(nr, *args) < 0 and refused() else 'open')\n"
        "out = ' '.join(res)\n"
    ),
}

#: What every channel must show: nothing of the sibling.
ZERO_BITS = {
    "inotify": "refused",
    "dnotify": "refused",
    "lease-and-owner": "refused refused refused",
    "fanotify": "refused",
    "locks": "refused refused refused",
    "sockets": "alone refused refused refused refused",
    "ipc": "alone refused refused refused",  # SysV segments: per IPC namespace
    "proc": "alone",
    "fifo": "refused refused refused refused",
    "other-kernel-objects": "refused refused refused",
}


@pytest.mark.parametrize("channel", sorted(CHANNELS))
def test_no_channel_between_two_samples_from_the_harness(unlinted, channel):  # noqa: F811
    """Both samples of one task at once, full Python in the episode process (the lint bypassed)."""
    body = f"env.reset()\nexec({COMMON + CHANNELS[channel]!r}, g := {{}})\nenv.step('report ' + g['out'])"
    trajs = rollouts(unlinted(body), n=1, k=2, concurrency=2)
    assert [t.error for t in trajs] == [None, None], [t.error for t in trajs]
    assert [reported(t) for t in trajs] == ["report " + ZERO_BITS[channel]] * 2


def _two_tool_calls(code: str) -> list[str]:
    """Two tool calls at once, with the math env's limits (the jail of a ``python:`` action)."""
    results: list = [None, None]

    def call(i: int) -> None:
        results[i] = run_python(code, DEFAULT_TOOL_LIMITS)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r.stdout.strip() if r.ok else f"failed: {r.limit} {r.stderr[-300:]}" for r in results]


needs_namespaces = pytest.mark.skipif(not isolation_available(), reason="no namespaces here")


@needs_namespaces
@pytest.mark.parametrize("channel", sorted(CHANNELS))
def test_no_channel_between_two_tool_calls(channel):
    assert _two_tool_calls(COMMON + CHANNELS[channel] + "print(out)\n") == [ZERO_BITS[channel]] * 2


#: A lint-clean harness: both samples watch the shared standard library through the math tool.
TOOL_INOTIFY = HEADER + (
    "class H(Harness):\n"
    "    def run(self, env, llm):\n"
    "        env.reset()\n"
    "        obs, r, te, tr, info = env.step('python: ' + CODE)\n"
    "        env.step('answer: ' + obs.splitlines()[1])\n"  # the line after 'Python output (call ...):'
    f"CODE = {COMMON + CHANNELS['inotify'] + 'print(out)' + chr(10)!r}\n"
)


@needs_namespaces
def test_a_lint_clean_harness_hears_no_sibling_through_the_tool():
    """The issue's route: two samples of one task, each sending a ``python:`` action that watches the
    shared files with inotify (85% of episodes heard a sibling before the allow-list)."""
    trajs = rollouts(harness_from_source(TOOL_INOTIFY), n=1, k=2, concurrency=2)
    assert [t.error for t in trajs] == [None, None], [t.error for t in trajs]
    assert [reported(t) for t in trajs] == ["answer: refused"] * 2


# ------------------------------------------------------------------------------------ the filter itself

#: Calls that must stay out of every profile but where noted: name -> (x86_64, aarch64).
FORBIDDEN = {
    "inotify_init": (253, None),
    "inotify_init1": (294, 26),
    "inotify_add_watch": (254, 27),
    "fanotify_init": (300, 262),
    "fanotify_mark": (301, 263),
    "flock": (73, 32),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "keyctl": (250, 219),
    "userfaultfd": (323, 282),
    "perf_event_open": (298, 241),
    "bpf": (321, 280),
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "mq_open": (240, 180),
    "msgget": (68, 186),
    "semget": (64, 190),
    "memfd_create": (319, 279),
    "name_to_handle_at": (303, 264),
    "open_by_handle_at": (304, 265),
    "setns": (308, 268),
    "clone3": (435, 435),
    "io_uring_setup": (425, 425),
    "mknodat": (259, 33),
    "pivot_root": (155, 41),
    "chroot": (161, 51),
    "umount2": (166, 39),
    "kcmp": (312, 272),
    "setuid": (105, 146),
    "seccomp": (317, 277),
    "pidfd_getfd": (438, 438),
    "open_tree": (428, 428),
    "fsopen": (430, 430),
    "mount": (165, 40),  # the template's (W) only
    "unshare": (272, 97),  # the template's (W) only
    "capset": (126, 91),  # the template's (W) only
}
ALLOW, ENOSYS, EPERM = 0x7FFF0000, 0x00050000 | 38, 0x00050000 | 1


def verdict(prog: list, arch: int, nr: int, *args: int) -> int:
    """Run the classic-BPF program on one call (a small interpreter of the instructions it uses)."""
    words = {0: nr, 4: arch}
    for i, arg in enumerate(args):
        words[16 + 8 * i], words[20 + 8 * i] = arg & 0xFFFFFFFF, arg >> 32
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = prog[pc]
        pc += 1
        if code == 0x20:
            acc = words.get(k, 0)
        elif code == 0x15:
            pc += jt if acc == k else jf
        elif code == 0x45:
            pc += jt if acc & k else jf
        elif code == 0x05:
            pc += k
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
@pytest.mark.parametrize("profile", ["T", "W", "E"])
def test_the_allow_list_refuses_what_is_not_listed(profile, machine):
    from whale_envs._children import _ARCHES, ARGUMENTS, CLONE_NAMESPACE_FLAGS, SYSCALLS, syscall_filter

    prog = syscall_filter(profile, machine)
    arch, col = _ARCHES[machine]
    assert all(0 <= jt < 256 and 0 <= jf < 256 for _, jt, jf, _ in prog)
    for name, numbers in FORBIDDEN.items():
        if numbers[col] is not None:
            expected = ALLOW if profile == "W" and name in ("mount", "unshare", "capset") else EPERM
            expected = ENOSYS if name == "clone3" else expected  # glibc falls back to clone
            assert verdict(prog, arch, numbers[col]) == expected, name
    for name, entry in SYSCALLS.items():
        if entry[col] is not None and name not in ARGUMENTS and name != "clone":
            assert verdict(prog, arch, entry[col]) == (ALLOW if profile in entry[2] else EPERM), name
    fcntl, ioctl, prctl, clone, socket = (
        SYSCALLS[n][col] for n in ("fcntl", "ioctl", "prctl", "clone", "socket")
    )
    for cmd in (
        1026,
        10,
        1024,
        8,
        15,
        16,
        5,
        6,
        7,
        36,
        37,
        38,
        1033,
    ):  # notify, sig, lease, owner, locks, seals
        assert verdict(prog, arch, fcntl, 3, cmd) == EPERM, cmd
        assert verdict(prog, arch, fcntl, 3, cmd | 1 << 32) == EPERM, cmd  # the kernel reads 32 bits
    assert verdict(prog, arch, fcntl, 3, 4) == verdict(prog, arch, ioctl, 1, 0x5401) == ALLOW
    for cmd in (0x5412, 0x80086601, 0x4B3A, 0x541C):  # TIOCSTI, FS_IOC_GETFLAGS, KDSETMODE, TIOCCONS
        assert verdict(prog, arch, ioctl, 0, cmd) == EPERM, hex(cmd)
    assert verdict(prog, arch, prctl, 22) == (ALLOW if profile == "W" else EPERM)  # stack a filter
    assert verdict(prog, arch, prctl, 0x59616D61) == EPERM  # PR_SET_PTRACER
    assert verdict(prog, arch, clone, 0x01200011) == ALLOW  # fork's flags (SIGCHLD, child tid)
    assert verdict(prog, arch, clone, 0x003D0F00) == ALLOW  # a thread's
    for flag in range(32):
        if 1 << flag & CLONE_NAMESPACE_FLAGS:
            assert verdict(prog, arch, clone, 0x01200011 | 1 << flag) == EPERM, flag
    assert verdict(prog, arch, socket, 1, 1) == ALLOW
    for family in (16, 17, 40, 38):  # netlink, packet, vsock, alg
        assert verdict(prog, arch, socket, family, 3) == EPERM, family
    other = next(a for m, (a, _) in _ARCHES.items() if m != machine)
    assert verdict(prog, other, SYSCALLS["read"][col]) == EPERM  # another ABI's numbers
    if machine == "x86_64":
        assert verdict(prog, arch, 0x40000000 | 0) == EPERM  # x32


@pytest.mark.parametrize("profile", ["T", "W", "E"])
def test_the_installed_bytes_are_the_checked_program(profile):
    """What ``install_syscall_filter`` hands the kernel (``packed_syscall_filter``, built once per
    process) is the program the test above checks, instruction by instruction, in the kernel's layout."""
    import struct

    from whale_envs._children import packed_syscall_filter, syscall_filter

    packed = packed_syscall_filter(profile)
    assert packed is packed_syscall_filter(profile)  # built once
    assert list(struct.iter_unpack("=HBBI", packed)) == syscall_filter(profile)


def test_only_the_template_makes_namespaces():
    from whale_envs._children import SYSCALLS

    assert {n for n, e in SYSCALLS.items() if e[2] == "W"} == {"unshare", "mount", "capset"}
    assert all(e[2] in ("TWE", "W") for e in SYSCALLS.values())


@pytest.mark.parametrize(
    ("header", "col", "alias"),
    [
        ("/usr/include/x86_64-linux-gnu/asm/unistd_64.h", 0, {}),
        ("/usr/include/asm-generic/unistd.h", 1, {"newfstatat": "fstatat"}),
    ],
)
def test_the_syscall_numbers_match_the_kernel_headers(header, col, alias):
    import re
    from pathlib import Path

    from whale_envs._children import SYSCALLS

    if not Path(header).exists():
        pytest.skip(f"no {header} here")
    text = Path(header).read_text()
    found = {m.group(1): int(m.group(2)) for m in re.finditer(r"#define __NR(?:3264)?_(\w+)\s+(\d+)", text)}
    table = {**{n: e[col] for n, e in SYSCALLS.items()}, **{n: e[col] for n, e in FORBIDDEN.items()}}
    assert {n: nr for n, nr in table.items() if found.get(alias.get(n, n)) != nr} == {}
