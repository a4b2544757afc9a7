"""The boot program: sets up a call's jail, then runs the untrusted program in it.

It runs on the host as the caller, in a fresh ``python -I -S`` started by
:func:`whale_envs.sandbox.bundle.command` with one JSON argument, the call's configuration
(:func:`whale_envs.sandbox.config.boot_config`); standard library only, and
:mod:`whale_envs._children`. Steps, in the child:

1. (``namespaces``) ``unshare`` new mount, network, PID, IPC and UTS namespaces (plus a user namespace
   when not root); build a new root on a tmpfs that holds only read-only bind mounts of the paths the
   interpreter needs, a size-capped tmpfs ``/sandbox`` as the working directory, four device nodes and
   a private ``/proc``; fork PID 1 of the new PID namespace, which ``pivot_root``s into the new root.
2. Fork the worker: resource limits (CPU, address space, file size, open files, processes, no core
   files), drop to the sandbox uid (when started as root), ``no_new_privs``, the seccomp allow-list of
   the call's profile (``cfg["seccomp"]``: ``T`` for tool code, ``W`` for the harness worker; see
   ``SYSCALLS`` in :mod:`whale_envs._children`), ``exec`` the interpreter on ``main.py``.
3. PID 1 waits for the worker and exits with its status; the kernel then kills every process left in
   the namespace (a background process cannot outlive the call).

As a fork server (``--fork-server FD ROOT``, see :func:`_serve`) the same steps run in a child of a
long-lived boot interpreter: the child receives one call's configuration and its stdout, stderr and
a report socket over the control socket ``FD``, reports its pid, runs steps 1-3 and reports the exit
status; the code still starts in a freshly ``exec``'d interpreter. A pooled call
(:mod:`whale_envs.sandbox.pool`) sends a fourth descriptor, the read end of a pipe that becomes stdin:
its ``main.py`` is :mod:`.pool_child`, which waits there for the one program it runs (built and
started before the call, nothing else differs).

Exit status 120 + a message on stderr beginning with ``SANDBOX-SETUP:`` means the jail itself could
not be built (the parent reports it; it never runs the code unjailed in ``namespaces`` mode).
"""

import ctypes
import json
import os
import resource
import signal
import stat
import sys

from whale_envs._children import install_syscall_filter, packed_syscall_filter, reap_exited

SETUP_FAILED = 120

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2

PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}

_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source, target, fstype, flags, data=None):
    enc = [None if s is None else s.encode() for s in (source, target, fstype, data)]
    _check(_libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {target}")


def _locked_flags(path):
    """Mount flags of ``path`` that a user namespace may not clear on remount (keep them)."""
    f = os.statvfs(path).f_flag
    flags = 0
    for st_flag, ms_flag in ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC)):
        if f & st_flag:
            flags |= ms_flag
    return flags


def _bind_readonly(source, root):
    target = root + source
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    _mount(source, target, None, MS_BIND | MS_REC)
    flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | _locked_flags(target)
    _mount(None, target, None, flags)


def _write(path, text):
    with open(path, "w") as fh:
        fh.write(text)


def _build_root(cfg):
    """Mount the new root (still seen from the old one) at ``cfg['root']``."""
    root = cfg["root"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    for link, target in cfg["symlinks"]:
        os.makedirs(os.path.dirname(root + link), exist_ok=True)
        os.symlink(target, root + link)
    # The working directory first, and /tmp as a view of it, *before* the read-only binds: a bind whose
    # path lies under /tmp (a checkout or a venv in the temp directory) then gets its mount point inside
    # that view instead of creating a directory /tmp that the symlink could not replace.
    work = root + "/sandbox"
    os.makedirs(work)
    uid = cfg["uid"] if cfg["uid"] is not None else 0
    opts = f"size={cfg['work_bytes']},nr_inodes=4096,mode=700,uid={uid},gid={uid}"
    _mount("tmpfs", work, "tmpfs", MS_NOSUID | MS_NODEV, opts)
    if any(p == "/tmp" or p.startswith("/tmp/") for p in cfg["ro_binds"]):
        os.makedirs(root + "/tmp")
        _mount(work, root + "/tmp", None, MS_BIND)
    else:
        os.symlink("sandbox", root + "/tmp")
    for path in cfg["ro_binds"]:
        if os.path.exists(path):
            _bind_readonly(path, root)
    for path in cfg["hide"]:
        target = root + path
        if os.path.isdir(target):
            _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "size=4k,mode=555")
    os.makedirs(root + "/dev", exist_ok=True)
    for dev in ("null", "zero", "random", "urandom"):
        open(root + "/dev/" + dev, "a").close()
        _mount("/dev/" + dev, root + "/dev/" + dev, None, MS_BIND)
    with open(work + "/main.py", "wb") as dst:
        if cfg.get("code") is not None:  # a fork-server call: the code came with the request
            dst.write(cfg["code"].encode("utf-8", errors="replace"))
        else:
            with open(cfg["code_path"], "rb") as src:
                dst.write(src.read())
    if cfg["uid"] is not None:
        os.chown(work + "/main.py", uid, uid)
    if not cfg.get("writable", True):  # a program that needs no files gets none (no notes between its parts)
        _mount(None, work, None, MS_REMOUNT | MS_NOSUID | MS_NODEV | MS_RDONLY, opts)
    os.makedirs(root + "/proc")


def _enter_root(cfg):
    """In PID 1 of the new namespace: private /proc, then make the new root ``/`` and forget the old."""
    root = cfg["root"]
    try:
        _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError:
        pass  # a private /proc is a convenience, not a guarantee
    os.chdir(root)
    number = SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is not None:
        _check(_libc.syscall(number, b".", b"."), "pivot_root")
        _check(_libc.umount2(b".", MNT_DETACH), "umount old root")
    else:  # unknown syscall number: chroot (safe here because the worker has no capabilities left)
        os.chroot(".")
    os.chdir("/sandbox")
    # Make the root read-only now that every mount point exists.
    _mount(None, "/", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _limit(which, value):
    try:
        resource.setrlimit(which, (value, value))
    except (ValueError, OSError):
        soft, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY and hard < value:
            resource.setrlimit(which, (hard, hard))
        else:
            raise


def _exec_worker(cfg):
    """Become the untrusted program: limits, unprivileged uid, exec. Never returns."""
    lim = cfg["limits"]
    # Soft limit: SIGXCPU (a clean "CPU limit" report); one second later the kernel sends SIGKILL.
    resource.setrlimit(resource.RLIMIT_CPU, (lim["cpu_s"], lim["cpu_s"] + 1))
    _limit(resource.RLIMIT_AS, lim["memory_bytes"])
    _limit(resource.RLIMIT_FSIZE, lim["file_bytes"])
    _limit(resource.RLIMIT_NOFILE, lim["open_files"])
    _limit(resource.RLIMIT_CORE, 0)
    uid = cfg["uid"]
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    elif cfg.get("in_userns"):
        # Started unprivileged: we are root of our own user namespace, which owns the mounts. A nested
        # user namespace keeps the same uid but has no power over those mounts (no remounting /usr or
        # the packages read-write, no unmounting).
        inner_uid, inner_gid = os.getuid(), os.getgid()
        _check(_libc.unshare(CLONE_NEWUSER), "unshare (nested user namespace)")
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{inner_uid} {inner_uid} 1")
        _write("/proc/self/gid_map", f"{inner_gid} {inner_gid} 1")
    if os.getuid() == 0 and not cfg.get("in_userns"):
        raise OSError("refusing to run untrusted code as uid 0")
    # After the uid change: RLIMIT_NPROC counts the processes of the (fresh) sandbox uid.
    _limit(resource.RLIMIT_NPROC, lim["processes"])
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    os.chdir(cfg["workdir"])
    if cfg.get("seccomp"):
        try:
            install_syscall_filter(cfg["seccomp"], _libc)
        except OSError:
            if cfg["isolation"] == "namespaces":
                raise
            # isolation="none" (the user's opt-in) runs on a kernel that may lack seccomp: limits only
    os.execve(cfg["python"], [cfg["python"], "-S", "-B", "-u", "main.py"], cfg["env"])


def _wait_status(pid):
    """Wait for ``pid`` (reaping any other child meanwhile); return its status as an exit code."""
    while True:
        try:
            done, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 0
        if done == pid:
            if os.WIFSIGNALED(status):
                return 128 + os.WTERMSIG(status)
            return os.WEXITSTATUS(status)


def _setup_failed(exc):
    _say_setup_failed(exc)
    os._exit(SETUP_FAILED)


def _say_setup_failed(exc):
    sys.stderr.write(f"SANDBOX-SETUP: {exc}\n")
    sys.stderr.flush()


#: In a fork-server call: the socket that reports to the caller. PID 1 closes it (the code never sees it).
_REPORT_FD = None


def _run_unisolated(cfg):
    """``isolation="none"``: limits, uid and a private directory, then the code. Never returns."""
    try:
        os.makedirs(cfg["workdir"], exist_ok=True)
        os.replace(cfg["code_path"], os.path.join(cfg["workdir"], "main.py"))
        if cfg["uid"] is not None:
            for path in (cfg["workdir"], os.path.join(cfg["workdir"], "main.py")):
                os.chown(path, cfg["uid"], cfg["uid"])
            os.chmod(cfg["workdir"], stat.S_IRWXU)
        _exec_worker(cfg)
    except (OSError, ValueError) as exc:
        _setup_failed(exc)


def _run_jailed(cfg):
    """Steps 1-3 of the module docstring; returns the exit status of the code (or SETUP_FAILED)."""
    try:
        flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
        real_uid, real_gid = os.getuid(), os.getgid()
        if real_uid != 0:
            flags |= CLONE_NEWUSER
        _check(_libc.unshare(flags), "unshare")
        if real_uid != 0:
            cfg["in_userns"] = True
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"0 {real_uid} 1")
            _write("/proc/self/gid_map", f"0 {real_gid} 1")
        _build_root(cfg)
    except OSError as exc:
        _say_setup_failed(exc)
        return SETUP_FAILED
    init = os.fork()
    if init == 0:  # PID 1 of the new namespace; it never returns (nor unwinds into the caller's frames)
        try:
            if _REPORT_FD is not None:
                os.close(_REPORT_FD)
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            _enter_root(cfg)
            worker = os.fork()
            if worker == 0:
                _exec_worker(cfg)
        except BaseException as exc:  # noqa: BLE001 - in PID 1 or the worker before its exec
            _setup_failed(exc)
        os._exit(_wait_status(worker))  # leaving PID 1 kills whatever the worker left behind
    if _REPORT_FD is not None:
        _kill_if_abandoned(init)
    return _wait_status(init)


def _kill_if_abandoned(init):
    """Fork server: wait until PID 1 exits or the caller closes the report socket (it died, or gave
    up on the call); in the second case kill PID 1, which ends every process of the call."""
    import select

    try:
        pidfd = os.pidfd_open(init)
    except (AttributeError, OSError):  # a kernel before 5.3: the caller's kill still applies
        return
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    poller.register(_REPORT_FD, select.POLLIN)  # the caller never writes: readable = closed
    try:
        if all(fd != pidfd for fd, _ in poller.poll()):
            os.kill(init, signal.SIGKILL)
    finally:
        os.close(pidfd)


# ------------------------------------------------------------------------------------ fork server


def _serve(control_fd, root):
    """The fork server: keep one child forked in advance; it takes the next request and runs it.

    The server itself never reads a request (its memory holds no call's configuration) and never runs
    the code: each request is received by a fresh child, which tells the server that it took one (the
    server then forks the next) and becomes that call's supervisor (:func:`_serve_one`). The server
    exits when a child finds the control socket closed (the caller is gone) or dies before taking one.
    It reaps its children itself (not with SIGCHLD ignored) so that their CPU time is counted in its
    own, and so in the caller's (``time -v``, ``RUSAGE_CHILDREN``).
    """
    import socket

    control = socket.socket(fileno=control_fd)
    for profile in ("T", "W"):  # the calls' allow-lists, built once (each forked child only copies one)
        packed_syscall_filter(profile)
    while True:
        taken_r, taken_w = os.pipe()
        child = os.fork()
        if child == 0:  # never returns into this loop, whatever goes wrong
            try:
                os.close(taken_r)
                _serve_one(socket, control, taken_w)
            finally:
                os._exit(SETUP_FAILED)
        os.close(taken_w)
        taken = os.read(taken_r, 1)
        os.close(taken_r)
        reap_exited()  # the supervisors that have exited (each lives until its caller is done)
        if taken != b"+":  # the caller is gone: its supervisors end with their reports; wait a little
            reap_exited(patience_s=3.0)
            try:
                os.rmdir(root)  # the calls' mount point (still busy if a call is left: then it stays)
            except OSError:
                pass
            os._exit(0)


def _serve_one(socket, control, taken_w):
    """One call: receive (configuration; stdout, stderr, report socket), run it jailed, report.

    Reports ``pid <n>`` at once and ``exit <status>`` at the end on the report socket, then waits
    until the caller closes it: until then this pid cannot be reused, so the caller may kill the
    process group (this process and everything of the call that did not leave it) by that pid.
    """
    global _REPORT_FD
    try:
        msg, fds, _, _ = socket.recv_fds(control, 1 << 20, 4)
    except OSError:
        os._exit(0)
    if not msg or len(fds) not in (3, 4):
        os._exit(0)  # the caller closed the server (or sent nonsense): the server stops too
    os.write(taken_w, b"+")
    os.close(taken_w)
    control.close()
    out_fd, err_fd, report_fd, *code_fd = fds
    os.set_inheritable(report_fd, False)
    if code_fd:  # a pooled call (sandbox.pool): its program reads the code from stdin when it comes
        os.dup2(code_fd[0], 0)
        os.close(code_fd[0])
    _REPORT_FD = report_fd
    report = socket.socket(fileno=report_fd)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    os.close(out_fd)
    os.close(err_fd)
    os.setsid()
    report.sendall(b"pid %d" % os.getpid())
    try:
        cfg = json.loads(msg)
        os.chdir(os.path.dirname(cfg["root"]))
        status = _run_jailed(cfg)
    except Exception as exc:  # noqa: BLE001 - reported like any failed set-up, never lost
        _say_setup_failed(exc)
        status = SETUP_FAILED
    report.sendall(b"exit %d" % status)  # before stdout/stderr close: the caller sees it by their EOF
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    try:
        report.recv(1)  # until the caller is done with this pid
    except OSError:
        pass
    os._exit(0)


def main(argv):
    """``--fork-server FD ROOT``, or one call's configuration (JSON). Never returns."""
    if argv[0] == "--fork-server":
        _serve(int(argv[1]), argv[2])
    cfg = json.loads(argv[0])
    if cfg["isolation"] != "namespaces":
        _run_unisolated(cfg)
    os._exit(_run_jailed(cfg))


if __name__ == "__main__":
    main(sys.argv[1:])
