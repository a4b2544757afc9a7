"""Child-process helpers of the programs this project sends as source into a fresh interpreter: the
sandbox boot (``_sandbox_boot.py``) and the harness worker (``harnesses/worker.py``): reaping exited
children, and the namespaces that put each episode of the worker alone (``isolate_episode``; the
sandbox's probe runs it too, to check that the kernel allows it).

Neither program can import this package where it runs (``python -I -S -c``; inside the sandbox the
project is hidden), so each carries this file's source with it: :func:`whale_envs.sandbox` splices it
into the boot program in place of its import line, and the worker program inlines it as a module. So it
must only use the standard library and must not rely on ``__file__``.
"""

import os
import time


def reap_exited(patience_s=0.0):
    """Collect every child that has exited, without blocking. With ``patience_s``, wait up to that long
    for the others to exit too; return at once when no child is left."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            if time.monotonic() >= deadline:
                return
            time.sleep(0.01)


# ------------------------------------------------------------------------------------ episode isolation

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_RDONLY, _MS_REC, _MS_PRIVATE = 2, 4, 8, 1, 16384, 1 << 18
#: The namespaces of one episode: its own user, mount, network, IPC, UTS and PID namespaces.
EPISODE_NAMESPACES = (
    _CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWUTS | _CLONE_NEWPID
)


#: Syscalls that reach kernel objects the namespaces above do not separate, refused with EPERM in an
#: episode: file locks on the (shared, read-only) files (``flock``; ``fcntl`` only for its lock
#: commands), inotify/fanotify watches on them (another episode's reads would be seen), and keyrings
#: (the session keyring is inherited from the worker). Numbers per architecture (``AUDIT_ARCH_*``).
_DENIED_SYSCALLS = {
    "x86_64": (0xC000003E, 72, (73, 253, 294, 300, 248, 249, 250)),  # fcntl; flock, inotify_init(1),
    "aarch64": (0xC00000B7, 25, (32, 26, 262, 217, 218, 219)),  # fanotify_init, add_key, request_key, keyctl
}
_FCNTL_LOCKS = (5, 6, 7, 36, 37, 38)  # F_GETLK, F_SETLK, F_SETLKW, F_OFD_GETLK, F_OFD_SETLK, F_OFD_SETLKW


def _deny_shared_kernel_objects(libc, check):
    """Install a seccomp filter (classic BPF) refusing :data:`_DENIED_SYSCALLS`, every syscall of
    another ABI (32-bit or x32 entry points have other numbers) and ``fcntl``'s lock commands. On an
    architecture not in the table nothing is installed (the namespaces still hold)."""
    import ctypes

    table = _DENIED_SYSCALLS.get(os.uname().machine)
    if table is None:
        return
    arch, fcntl, denied = table
    ld, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JSET|K, BPF_RET|K
    allow, deny = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    # (code, jump-if-true label, jump-if-false label, k); labels: "deny", "fcntl", or 0 (next)
    prog = [(ld, 0, 0, 4), (jeq, 0, "deny", arch), (ld, 0, 0, 0), (jset, "deny", 0, 0x40000000)]
    prog += [(jeq, "deny", 0, nr) for nr in denied]
    prog += [(jeq, "fcntl", 0, fcntl), (ret, 0, 0, allow)]
    labels = {"fcntl": len(prog)}
    prog += [(ld, 0, 0, 24)] + [(jeq, "deny", 0, cmd) for cmd in _FCNTL_LOCKS] + [(ret, 0, 0, allow)]
    labels["deny"] = len(prog)
    prog += [(ret, 0, 0, deny)]

    class Filter(ctypes.Structure):
        _fields_ = [
            ("code", ctypes.c_uint16),
            ("jt", ctypes.c_uint8),
            ("jf", ctypes.c_uint8),
            ("k", ctypes.c_uint32),
        ]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    def offset(at, label):
        return 0 if label == 0 else labels[label] - at - 1

    filters = (Filter * len(prog))(
        *[Filter(c, offset(i, t), offset(i, f), k) for i, (c, t, f, k) in enumerate(prog)]
    )
    program = Program(len(prog), filters)
    check(libc.prctl(38, 1, 0, 0, 0), "no_new_privs")  # PR_SET_NO_NEW_PRIVS (the sandbox set it already)
    check(libc.prctl(22, 2, ctypes.byref(program), 0, 0), "seccomp filter")  # PR_SET_SECCOMP, MODE_FILTER


def isolate_episode():
    """Put what runs next alone at the OS level; fork semantics: returns 0 in the isolated process and
    its pid in the caller; raises ``OSError`` (in the caller, nothing forked or the fork reaped) when
    the kernel refuses.

    The caller (a freshly forked episode process, no untrusted code run yet) enters new user, mount,
    network, IPC, UTS and PID namespaces and forks the isolated process, PID 1 of the new PID namespace,
    which mounts a /proc of that namespace, then enters a nested user and mount namespace (which locks
    every mount, so that /proc cannot be unmounted to show the old one) and drops every capability. So
    the isolated process and whatever it starts have no network but a down loopback (no abstract unix
    socket reaches a sibling), no SysV or POSIX IPC object of a sibling, no pid of a sibling to signal
    or trace (nor the template's), and a /proc showing only their own processes; a seccomp filter
    refuses what the namespaces do not separate (file locks and inotify on the shared read-only
    files, keyrings). The uid stays the same; the file system stays as it was (the sandbox makes it
    read-only)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    def check(ret, what):
        if ret != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    def map_ids(inner_uid, outer_uid, inner_gid, outer_gid):
        for name, text in (
            ("setgroups", "deny"),
            ("uid_map", f"{inner_uid} {outer_uid} 1"),
            ("gid_map", f"{inner_gid} {outer_gid} 1"),
        ):
            with open(f"/proc/self/{name}", "w") as fh:
                fh.write(text)

    uid, gid = os.getuid(), os.getgid()
    libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: /proc/self/*_map belong to us while we write them
    try:
        check(libc.unshare(EPISODE_NAMESPACES), "unshare (episode namespaces)")
        map_ids(0, uid, 0, gid)
    finally:
        libc.prctl(4, 0, 0, 0, 0)  # not dumpable again, even when refused (an unisolated run goes on)
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        try:
            libc.prctl(4, 1, 0, 0, 0)  # dumpable while it writes its own maps (not after: see below)
            check(libc.mount(None, b"/", None, ctypes.c_ulong(_MS_REC | _MS_PRIVATE), None), "mount private")
            flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
            if libc.mount(b"proc", b"/proc", b"proc", ctypes.c_ulong(flags), None) != 0:
                # no /proc to copy the options of (the jail may have none): hide whatever is there
                check(
                    libc.mount(b"none", b"/proc", b"tmpfs", ctypes.c_ulong(flags | _MS_RDONLY), b"size=4k"),
                    "mount /proc",
                )
            check(libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS), "unshare (locking user namespace)")
            map_ids(uid, 0, gid, 0)
            header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
            check(libc.capset(header, (ctypes.c_uint32 * 6)()), "capset (drop every capability)")
            libc.prctl(4, 0, 0, 0, 0)  # not dumpable again: no ptrace or /proc/<pid>/mem by anyone
            _deny_shared_kernel_objects(libc, check)
            os.write(ready_w, b"+")
        except BaseException as exc:  # noqa: BLE001 - reported to the caller, never run unisolated
            os.write(ready_w, f"-{exc}"[:500].encode("utf-8", "replace"))
            os._exit(121)
        os.close(ready_w)
        return 0
    os.close(ready_w)
    answer = b""
    while chunk := os.read(ready_r, 512):
        answer += chunk
        if answer == b"+":
            break
    os.close(ready_r)
    if answer != b"+":
        os.waitpid(pid, 0)
        raise OSError(answer[1:].decode("utf-8", "replace") or "the isolated process died while setting up")
    return pid
