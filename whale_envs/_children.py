"""Child-process helpers of the programs this project runs in a child interpreter: the sandbox's
programs (:mod:`whale_envs.sandbox.programs`: the boot program, the probe) and the harness worker
(``harnesses/worker.py``): reaping exited children, the syscall allow-list, and the namespaces that
put each episode of the worker alone (``isolate_episode``; the sandbox's probe runs it too, to check
that the kernel allows it).

None of those programs can import this package where it runs (``python -I -S``; inside the sandbox
the project is hidden), so each carries this module with it: :mod:`whale_envs.sandbox.bundle` serves it
to the sandbox's programs by name, and the worker program inlines it as a module. So it must only use
the standard library and must not rely on ``__file__``.
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


# ------------------------------------------------------------------------------------ the syscall allow-list

#: Who may make a syscall, by profile letter. ``T``: a tool call (``run_python``: model-written code, and
#: whatever it starts). ``W``: the harness worker's template (trusted: it never runs harness code, but it
#: builds each episode's namespaces). ``E``: an episode (harness code; its filter is stacked on the
#: template's, so it gets at most what both allow).
#:
#: Everything not listed fails with EPERM (Python raises ``PermissionError``), but for the calls of
#: :data:`FALLBACKS` (ENOSYS: their callers then use a listed call); a listed call with a refused
#: argument fails with EPERM too. Nothing is killed, so Python fails cleanly. Out, among
#: others: inotify, fanotify, ``flock`` and every lock, lease, notify, signal or owner command of
#: ``fcntl`` (watching or locking the shared read-only files is how samples met), keyrings, every
#: socket family but unix and inet (netlink, packet, ...), SysV messages and semaphores, POSIX message queues,
#: ``mknod`` (fifos), ``memfd``, ``userfaultfd``, ``perf_event_open``, ``bpf``, ``ptrace``,
#: ``process_vm_*``, handles (``name_to_handle_at``), ``mount`` and ``unshare`` (the template's only),
#: ``setns``, ``io_uring``.
#:
#: The table, a call a line: its name, its x86_64 number, its aarch64 number (``-`` where the call does
#: not exist there), who may make it and why. Read into :data:`SYSCALLS` below.
_SYSCALL_TABLE = """
# name             x86_64 aarch64  who  why
# reading and writing open files (the most frequent calls first: the filter is a linear scan)
newfstatat            262      79  TWE  stat of a path (imports stat every candidate file)
read                    0      63  TWE  read an open file or pipe
lseek                   8      62  TWE  seek (imports, buffered files)
openat                257      56  TWE  open (the file system is the jail's; read-only but /sandbox)
close                   3      57  TWE  close
ioctl                  16      29  TWE  only the commands of ARGUMENTS (isatty, FIONREAD, close-on-exec)
fstat                   5      80  TWE  stat of an open file
write                   1      64  TWE  write an open file or pipe (stdout, the template's pipes)
mmap                    9     222  TWE  memory; shared libraries
brk                    12     214  TWE  memory
getdents64            217      61  TWE  list a folder (imports)
rt_sigaction           13     134  TWE  signal handlers (Python installs its own)
mprotect               10     226  TWE  memory protection (loading libraries, thread stacks)
munmap                 11     215  TWE  memory
mremap                 25     216  TWE  memory (realloc of large blocks)
madvise                28     233  TWE  memory hints (malloc, numpy)
fcntl                  72      25  TWE  only the commands of ARGUMENTS (flags and descriptor duplication)
readv                  19      65  TWE  vector read
writev                 20      66  TWE  vector write
pread64                17      67  TWE  positioned read (the dynamic loader, zipimport)
pwrite64               18      68  TWE  positioned write
preadv                295      69  TWE  positioned vector read
pwritev               296      70  TWE  positioned vector write
preadv2               327     286  TWE  positioned vector read
pwritev2              328     287  TWE  positioned vector write
dup                    32      23  TWE  duplicate a descriptor
dup2                   33       -  TWE  duplicate a descriptor (subprocess, the template's pipes)
dup3                  292      24  TWE  duplicate a descriptor
close_range           436     436  TWE  close many descriptors (subprocess)
fsync                  74      82  TWE  flush a file
fdatasync              75      83  TWE  flush a file
ftruncate              77      46  TWE  truncate an open file
truncate               76      45  TWE  truncate a file
sendfile               40      71  TWE  copy between descriptors (shutil.copyfile)
copy_file_range       326     285  TWE  copy between descriptors (shutil)
statfs                137      43  TWE  file system statistics (os.statvfs, shutil.disk_usage)
fstatfs               138      44  TWE  file system statistics
# paths (in the jail: read-only views and the call's own tmpfs)
open                    2       -  TWE  open
stat                    4       -  TWE  stat of a path
lstat                   6       -  TWE  stat of a link
statx                 332     291  TWE  stat of a path (newer glibc)
access                 21       -  TWE  access check
faccessat             269      48  TWE  access check
faccessat2            439     439  TWE  access check (newer glibc)
readlink               89       -  TWE  read a link (sys.executable, realpath)
readlinkat            267      78  TWE  read a link
getcwd                 79      17  TWE  working directory
chdir                  80      49  TWE  working directory
fchdir                 81      50  TWE  working directory
mkdir                  83       -  TWE  make a folder (tempfile)
mkdirat               258      34  TWE  make a folder
rmdir                  84       -  TWE  remove a folder
unlink                 87       -  TWE  remove a file
unlinkat              263      35  TWE  remove a file
rename                 82       -  TWE  rename
renameat              264      38  TWE  rename
renameat2             316     276  TWE  rename
link                   86       -  TWE  hard link (in the call's own tmpfs: no link across a mount)
linkat                265      37  TWE  hard link
symlink                88       -  TWE  symbolic link
symlinkat             266      36  TWE  symbolic link
chmod                  90       -  TWE  file mode
fchmod                 91      52  TWE  file mode
fchmodat              268      53  TWE  file mode
utimensat             280      88  TWE  file times (shutil.copy2)
umask                  95     166  TWE  file creation mask
# memory policy
msync                  26     227  TWE  flush a mapping
mbind                 237     235  TWE  memory policy of the process's own pages (the BLAS of numpy)
# processes and threads (the PID namespace bounds whom a signal or a wait can reach)
clone                  56     220  TWE  threads and fork; flags checked: no CLONE_NEW* (no namespaces)
fork                   57       -  TWE  fork
vfork                  58       -  TWE  subprocess (posix_spawn)
execve                 59     221  TWE  run a program (the interpreter itself); it keeps this filter
exit                   60      93  TWE  end a thread
exit_group            231      94  TWE  end the process
wait4                  61     260  TWE  wait for a child
waitid                247      95  TWE  wait for a child
set_tid_address       218      96  TWE  thread start-up (glibc)
set_robust_list       273      99  TWE  thread start-up (glibc)
rseq                  334     293  TWE  restartable sequences (glibc registers each thread)
futex                 202      98  TWE  locks between the threads of one process (private futexes)
arch_prctl            158       -  TWE  thread-local storage (x86_64)
prctl                 157     167  TWE  only the options of ARGUMENTS
getpid                 39     172  TWE  own ids
getppid               110     173  TWE  own ids
gettid                186     178  TWE  own ids
getuid                102     174  TWE  own ids
geteuid               107     175  TWE  own ids
getgid                104     176  TWE  own ids
getegid               108     177  TWE  own ids
getgroups             115     158  TWE  own ids
getresuid             118     148  TWE  own ids
getresgid             120     150  TWE  own ids
getpgrp               111       -  TWE  own process group
getpgid               121     155  TWE  process group
getsid                124     156  TWE  session
setsid                112     157  TWE  new session (subprocess start_new_session)
setpgid               109     154  TWE  new process group (each episode leads one)
kill                   62     129  TWE  signal a process of the own PID namespace (the template ends episodes)
tgkill                234     131  TWE  signal a thread of the own process
tkill                 200     130  TWE  signal a thread
rt_sigprocmask         14     135  TWE  signal mask
rt_sigreturn           15     139  TWE  return from a signal handler
rt_sigsuspend         130     133  TWE  wait for a signal
rt_sigtimedwait       128     137  TWE  wait for a signal (signal.sigtimedwait)
sigaltstack           131     132  TWE  signal stack (faulthandler)
pause                  34       -  TWE  wait for a signal
restart_syscall       219     128  TWE  the kernel restarts an interrupted sleep
sched_getaffinity     204     123  TWE  usable CPUs (os.cpu_count, numpy)
sched_yield            24     124  TWE  yield the CPU (spin locks of the BLAS)
getrlimit              97     163  TWE  resource limits
setrlimit             160     164  TWE  resource limits (only lower or within the hard limit)
prlimit64             302     261  TWE  resource limits (the template sets each episode's memory)
getrusage              98     165  TWE  own CPU time (resource, time.process_time)
times                 100     153  TWE  own CPU time
sysinfo                99     179  TWE  memory size (glibc, numpy)
uname                  63     160  TWE  platform (the UTS namespace is the jail's own)
# time
clock_gettime         228     113  TWE  clocks (when the vDSO does not answer)
clock_getres          229     114  TWE  clock resolution
clock_nanosleep       230     115  TWE  time.sleep
nanosleep              35     101  TWE  sleep
gettimeofday           96     169  TWE  clock
time                  201       -  TWE  clock
getitimer              36     102  TWE  interval timers of the own process (signal.setitimer)
setitimer              38     103  TWE  interval timers of the own process
alarm                  37       -  TWE  signal.alarm
getrandom             318     278  TWE  random numbers (os.urandom, hash seeds)
# waiting on descriptors; nameless pipes and socket pairs (nothing another process can open)
poll                    7       -  TWE  wait on descriptors (subprocess, the template's pipes)
ppoll                 271      73  TWE  wait on descriptors
select                 23       -  TWE  wait on descriptors
pselect6              270      72  TWE  wait on descriptors
epoll_create          213       -  TWE  selectors
epoll_create1         291      20  TWE  selectors
epoll_ctl             233      21  TWE  selectors
epoll_wait            232       -  TWE  selectors
epoll_pwait           281      22  TWE  selectors
pipe                   22       -  TWE  a nameless pipe
pipe2                 293      59  TWE  a nameless pipe
eventfd2              290      19  TWE  a nameless counter (asyncio, some thread pools)
socketpair             53     199  TWE  a nameless pair of sockets (asyncio)
socket                 41     198  TWE  unix and inet only (ARGUMENTS): no netlink, packet, vsock, ...
bind                   49     200  TWE  a unix name: abstract ones are per network namespace (the jail's own)
listen                 50     201  TWE  on a unix socket
accept                 43     202  TWE  on a unix socket
accept4               288     242  TWE  on a unix socket
connect                42     203  TWE  to a name of the own network namespace or writable folder
sendto                 44     206  TWE  on a socket pair
recvfrom               45     207  TWE  on a socket pair
sendmsg                46     211  TWE  on a socket pair
recvmsg                47     212  TWE  on a socket pair
shutdown               48     210  TWE  on a socket pair
getsockopt             55     209  TWE  on a socket pair
setsockopt             54     208  TWE  on a socket pair
getsockname            51     204  TWE  on a socket pair
getpeername            52     205  TWE  on a socket pair
# SysV shared memory: its keys live in the IPC namespace, the episode's or the call's own (the round-3
# tests create segments and find no sibling's); messages, semaphores and POSIX queues stay out
shmget                 29     194  TWE  a segment of the own IPC namespace
shmat                  30     196  TWE  attach an own segment
shmdt                  67     197  TWE  detach
shmctl                 31     195  TWE  remove an own segment
# the template alone: each episode's namespaces (isolate_episode), made before its filter is stacked
unshare               272      97  W    an episode's namespaces
mount                 165      40  W    an episode's private /proc
capset                126      91  W    an episode drops every capability
"""

#: Syscalls allowed with some values of one argument only, a value a line: the call, the index of the
#: argument, the value, who may pass it and what it is. Every other value fails with EPERM. Read into
#: :data:`ARGUMENTS` below.
_ARGUMENT_TABLE = """
# call index  value   who  what
fcntl      1  0       TWE  F_DUPFD
fcntl      1  1       TWE  F_GETFD
fcntl      1  2       TWE  F_SETFD (close-on-exec)
fcntl      1  3       TWE  F_GETFL
fcntl      1  4       TWE  F_SETFL (non-blocking; O_ASYNC signals nobody without F_SETOWN)
fcntl      1  1030    TWE  F_DUPFD_CLOEXEC
fcntl      1  1032    TWE  F_GETPIPE_SZ
ioctl      1  0x5401  TWE  TCGETS (isatty: every open() asks)
ioctl      1  0x5413  TWE  TIOCGWINSZ (terminal size; never a terminal here)
ioctl      1  0x541B  TWE  FIONREAD (bytes waiting on a pipe)
ioctl      1  0x5421  TWE  FIONBIO (non-blocking)
ioctl      1  0x5450  TWE  FIONCLEX
ioctl      1  0x5451  TWE  FIOCLEX
socket     0  1       TWE  AF_UNIX: abstract names are per network namespace, paths per writable folder
socket     0  2       TWE  AF_INET: an empty network namespace (code that tries the network fails cleanly)
socket     0  10      TWE  AF_INET6: the same
prctl      0  1       W    PR_SET_PDEATHSIG
prctl      0  3       TWE  PR_GET_DUMPABLE
prctl      0  4       W    PR_SET_DUMPABLE (an episode is not dumpable)
prctl      0  15      TWE  PR_SET_NAME (a thread's name)
prctl      0  16      TWE  PR_GET_NAME
prctl      0  22      W    PR_SET_SECCOMP (an episode's own filter, stacked)
prctl      0  36      W    PR_SET_CHILD_SUBREAPER (orphans come to the template)
prctl      0  38      W    PR_SET_NO_NEW_PRIVS
prctl      0  39      TWE  PR_GET_NO_NEW_PRIVS
"""


def _rows(table, columns):
    """The rows of a text table: each line that is neither blank nor a ``#`` comment, split on white space
    into ``columns`` fields (the last field is the rest of the line)."""
    lines = (line.strip() for line in table.splitlines())
    return [line.split(None, columns - 1) for line in lines if line and not line.startswith("#")]


#: name -> (x86_64 number, aarch64 number or None where the call does not exist there, profiles, why), in
#: the table's order.
SYSCALLS = {
    name: (int(x86_64), None if aarch64 == "-" else int(aarch64), profiles, why)
    for name, x86_64, aarch64, profiles, why in _rows(_SYSCALL_TABLE, 5)
}


def _arguments(table):
    """name -> (argument index, {value: (profiles, what)}) of the rows of ``table``."""
    calls = {}
    for call, index, value, profiles, what in _rows(table, 5):
        calls.setdefault(call, (int(index), {}))[1][int(value, 0)] = (profiles, what)
    return calls


#: name -> (argument index, {value: (profiles, what)}).
ARGUMENTS = _arguments(_ARGUMENT_TABLE)

#: Calls refused with ENOSYS rather than EPERM, because their callers then fall back to a listed call:
#: name -> (x86_64, aarch64, why).
FALLBACKS = {
    "clone3": (435, 435, "glibc (threads, posix_spawn) falls back to clone, whose flags the filter reads"),
}

#: ``clone`` with any of these flags (new namespaces: cgroup, mount, UTS, IPC, user, PID, network, time)
#: fails with EPERM; ``clone3`` (flags out of reach of the filter) is not listed: glibc falls back to
#: ``clone``.
CLONE_NAMESPACE_FLAGS = 0x02000000 | 0x00020000 | 0x04000000 | 0x08000000 | 0x10000000
CLONE_NAMESPACE_FLAGS |= 0x20000000 | 0x40000000 | 0x00000080

#: machine -> AUDIT_ARCH_* of its native calls (and the column of SYSCALLS).
_ARCHES = {"x86_64": (0xC000003E, 0), "aarch64": (0xC00000B7, 1)}


def syscall_filter(profile, machine=None):
    """The classic-BPF program (a list of ``(code, jt, jf, k)``) of ``profile`` ("T", "W" or "E") for
    ``machine`` (this one by default); None on an architecture without a column in :data:`SYSCALLS`."""
    machine = machine or os.uname().machine
    if machine not in _ARCHES:
        return None
    arch, column = _ARCHES[machine]
    ld, jeq, jset, ja, ret = 0x20, 0x15, 0x45, 0x05, 0x06  # BPF_LD|W|ABS, JMP|JEQ|K, JMP|JSET|K, JA, RET|K
    allow, enosys, eperm = 0x7FFF0000, 0x00050000 | 38, 0x00050000 | 1  # RET_ALLOW, RET_ERRNO | errno
    numbers = {name: entry[column] for name, entry in SYSCALLS.items() if entry[column] is not None}
    plain = [numbers[n] for n, e in SYSCALLS.items() if profile in e[2] and n in numbers]
    plain = [nr for nr in plain if nr not in {numbers[n] for n in (*ARGUMENTS, "clone")}]
    # seccomp_data: nr at 0, arch at 4, args[i] at 16 + 8 * i (the low 32 bits: a little-endian machine)
    prog = [(ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, eperm), (ld, 0, 0, 0), (jset, 0, 1, 0x40000000)]
    prog.append((ret, 0, 0, eperm))  # the x32 ABI: other numbers
    for start in range(0, len(plain), 200):  # a jump reaches 255 instructions at most: groups of 200
        group = plain[start : start + 200]
        prog += [(jeq, len(group) - i, 0, nr) for i, nr in enumerate(group)]
        prog += [(ja, 0, 0, 1), (ret, 0, 0, allow)]
    checked = [(n, *ARGUMENTS[n]) for n in ARGUMENTS if profile in SYSCALLS[n][2]]
    blocks = []
    for _, index, values in checked:
        ok = [v for v, (profiles, _) in values.items() if profile in profiles]
        blocks.append([(ld, 0, 0, 16 + 8 * index)] + [(jeq, len(ok) - i, 0, v) for i, v in enumerate(ok)])
        blocks[-1] += [(ret, 0, 0, eperm), (ret, 0, 0, allow)]
    clone = [(ld, 0, 0, 16), (jset, 0, 1, CLONE_NAMESPACE_FLAGS), (ret, 0, 0, eperm), (ret, 0, 0, allow)]
    targets = [numbers[name] for name, _, _ in checked] + [numbers["clone"]]
    blocks.append(clone)
    # the fallbacks; the dispatch to each block (past the other dispatches and EPERM), EPERM, the blocks
    fallbacks = [e[column] for e in FALLBACKS.values() if e[column] is not None]
    prog += [(jeq, len(fallbacks) - i, 0, nr) for i, nr in enumerate(fallbacks)]  # to the ENOSYS return
    prog += [(ja, 0, 0, 1), (ret, 0, 0, enosys)]
    for i, nr in enumerate(targets):
        prog.append((jeq, len(targets) - i + sum(len(b) for b in blocks[:i]), 0, nr))
    prog.append((ret, 0, 0, eperm))
    for block in blocks:
        prog += block
    return prog


def packed_syscall_filter(profile):
    """The program of :func:`syscall_filter` for this machine as the kernel reads it (``struct
    sock_filter``: u16 code, u8 jt, u8 jf, u32 k, native byte order), or None; built once per process.
    The worker's template calls it before it forks its episodes, so an episode only copies the bytes:
    building the program as ctypes objects in each freshly forked episode took about 5 ms of CPU
    (most of an episode's isolation) against 0.1 ms."""
    if profile not in _PACKED:
        import struct

        prog = syscall_filter(profile)
        _PACKED[profile] = None if prog is None else b"".join(struct.pack("=HBBI", *ins) for ins in prog)
    return _PACKED[profile]


_PACKED = {}


def install_syscall_filter(profile, libc=None):
    """Install the allow-list of ``profile`` on this thread's process (its children and any program it
    ``exec``s inherit it; filters stack, so a later one can only take more away). Needs
    ``no_new_privs`` (set here). Raises ``OSError`` when the kernel refuses; nothing is installed on an
    architecture without a column in :data:`SYSCALLS` (the namespaces still hold)."""
    import ctypes

    packed = packed_syscall_filter(profile)
    if packed is None:
        return
    libc = libc or ctypes.CDLL(None, use_errno=True)

    class Program(ctypes.Structure):  # struct sock_fprog
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    instructions = ctypes.create_string_buffer(packed, len(packed))
    program = Program(len(packed) // 8, ctypes.addressof(instructions))
    for what, ret in (
        ("no_new_privs", libc.prctl(38, 1, 0, 0, 0)),  # PR_SET_NO_NEW_PRIVS (the sandbox set it already)
        ("seccomp filter", libc.prctl(22, 2, ctypes.byref(program), 0, 0)),  # PR_SET_SECCOMP, MODE_FILTER
    ):
        if ret != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")


def fork_retrying():
    """``os.fork()``, tried again after 0.05, 0.1, 0.2, 0.4 and 0.8 s while the process limit refuses it
    (EAGAIN: the sandbox's process limit, met while other episodes end); ``BlockingIOError`` if it
    still does."""
    for delay in (0.05, 0.1, 0.2, 0.4, 0.8):
        try:
            return os.fork()
        except BlockingIOError:
            time.sleep(delay)
    return os.fork()


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
    or trace (nor the template's), and a /proc showing only their own processes; the episode's syscall
    allow-list (:data:`SYSCALLS`, profile ``E``, stacked on the template's) keeps out what the
    namespaces do not separate (watches, locks, leases and notifications on the shared read-only
    files, keyrings, ...). The uid stays the same; the file system stays as it was (the sandbox makes it
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
    try:
        pid = fork_retrying()
    except BlockingIOError:
        os.close(ready_r)
        os.close(ready_w)
        raise
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
            install_syscall_filter("E", libc)
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
