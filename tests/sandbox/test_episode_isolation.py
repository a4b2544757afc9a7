"""Red team: the AST lint is a first filter with an allow-list, and every
episode is alone at the OS level.

The lint routes: three ways to full Python that the old deny-list let through, each shown to give a real
escape under the old rules (the attack returned the worker's pid through ``os``):
(a) special names through ``self``-named parameters and typing internals (a module-level function whose
    parameter is named ``self`` read ``ref._evaluate`` of a ``typing.ForwardRef``, which evaluates text
    with the real builtins); (b) standard-library helpers that copy attributes by name
    (``functools.update_wrapper(..., assigned=(name,))`` into an object whose ``__setattr__`` keeps the
    value: ``len.__self__`` is the real ``builtins``); (c) class machinery that generates special
    attributes (metaclasses, ``__init_subclass__``, ``__set_name__``, ``__class_getitem__``, dataclass
    fields from ``__annotations__``, namedtuple, enum). Each is refused by the lint, and the module views
    alone (the lint skipped) refuse the names the routes need.

The isolation attacks: two episodes of one worker (the samples of one task) try to meet over an abstract
unix socket, a named socket in /tmp or /dev/shm, SysV and POSIX shared memory, a signal to the sibling's
pid and /proc; the harness has bypassed the lint (full Python inside the worker's jail, as in
``tests/sandbox/test_harness_worker.py``). Every route must fail.
"""

from __future__ import annotations

import platform
import uuid
from pathlib import Path

import pytest

import whale_train.rollout.workers as workers
from harnesses.loader import shipped_harnesses
from harnesses.validate import HarnessValidationError, ValidationReport, load_class, validate_source
from tests.sandbox.test_harness_worker import (  # noqa: F401 - unlinted: a fixture
    UNLINTED,
    changed_worker_program,
    reported,
    rollouts,
    unlinted,
)

# `make test` runs the jail and sandbox-pool tests on one worker, one after another (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("sandbox")

HEADER = "from harnesses.base import Harness\n"

# ------------------------------------------------------------------------------------ the lint routes

#: (a) special names through ``self``-named parameters and typing internals.
SELF_AND_TYPING = {
    "forward-ref-evaluate": (
        "import typing\n" + HEADER + "def private(self):\n    return self._evaluate\n"
        "class H(Harness):\n    def run(self, env, llm):\n"
        "        ref = typing.get_args(typing.List[\"__import__('os').getpid()\"])[0]\n"
        "        return private(ref)({}, {}, frozenset())\n"
    ),
    "typing-eval-type": (
        "import typing\n" + HEADER + "def private(self):\n    return self._eval_type\n"
        "class H(Harness):\n    def run(self, env, llm):\n        return private(typing)\n"
    ),
    "private-channel-of-a-handle": (
        HEADER + "def grab(self):\n    return self._call\n"
        "class H(Harness):\n    def run(self, env, llm):\n        return grab(llm)\n"
    ),
    "private-attribute-on-self": (
        HEADER
        + "class H(Harness):\n    def run(self, env, llm):\n        self = llm\n        return self._call\n"
    ),
    "get-args": HEADER + "from typing import get_args\nclass H(Harness):\n    pass\n",
    "get-type-hints": HEADER + "import typing\nclass H(Harness):\n    def run(self, env, llm):\n"
    "        return typing.get_type_hints(H)\n",
}

#: (b) attribute access through standard-library helpers that copy attributes by name.
ATTRIBUTE_COPIERS = {
    "update-wrapper-assigned": (
        "import functools\n" + HEADER + "SEEN = []\n"
        "class Grab:\n    def __setattr__(self, name, value):\n        SEEN.append(value)\n"
        "def take(obj, name):\n    SEEN.clear()\n"
        "    functools.update_wrapper(Grab(), obj, assigned=(name,), updated=())\n    return SEEN[0]\n"
        "class H(Harness):\n    def run(self, env, llm):\n"
        "        real = take(len, '__' + 'self__')\n"
        "        return take(real, '__im' + 'port__')('os').getpid()\n"
    ),
    "wraps-updated": (
        "import functools\n" + HEADER + "class H(Harness):\n    def run(self, env, llm):\n"
        "        return functools.wraps(len, assigned=(), updated=('x',))\n"
    ),
    "setattr-hook": (
        HEADER
        + "class Grab:\n    def __setattr__(self, name, value):\n        pass\nclass H(Harness):\n    pass\n"
    ),
    "getattr-hook": (
        HEADER
        + "class Grab:\n    def __getattr__(self, name):\n        return name\nclass H(Harness):\n    pass\n"
    ),
    "copy-reduce": (
        "import copy\n" + HEADER + "class R:\n    def __reduce__(self):\n        return (print, ('x',))\n"
        "class H(Harness):\n    def run(self, env, llm):\n        return copy.copy(R())\n"
    ),
    "deepcopy-hook": (
        HEADER
        + "class R:\n    def __deepcopy__(self, memo):\n        return memo\nclass H(Harness):\n    pass\n"
    ),
    "make-dataclass": (
        "import dataclasses\n" + HEADER + "class H(Harness):\n    def run(self, env, llm):\n"
        "        return dataclasses.make_dataclass('X', ['a'])\n"
    ),
    "operator-attrgetter": "import operator\n" + HEADER + "class H(Harness):\n    pass\n",
    "inspect": "import inspect\n" + HEADER + "class H(Harness):\n    pass\n",
    "cached-property": "from functools import cached_property\n" + HEADER + "class H(Harness):\n    pass\n",
}

#: (c) class machinery that generates special attributes.
CLASS_MACHINERY = {
    "metaclass": (
        HEADER + "class M(type):\n    pass\nclass X(metaclass=M):\n    pass\nclass H(Harness):\n    pass\n"
    ),
    "metaclass-of-a-base": (
        HEADER + "class X(object, metaclass=Harness):\n    pass\nclass H(Harness):\n    pass\n"
    ),
    "init-subclass-keywords": HEADER + "class H(Harness, flag=1):\n    pass\n",
    "init-subclass": (
        HEADER
        + "class B:\n    def __init_subclass__(cls, **kw):\n        pass\nclass H(Harness):\n    pass\n"
    ),
    "set-name": (
        HEADER + "class D:\n    def __set_name__(self, owner, name):\n        self.owner = owner\n"
        "class H(Harness):\n    d = D()\n"
    ),
    "class-getitem": (
        HEADER
        + "class G:\n    def __class_getitem__(cls, item):\n        return item\nclass H(Harness):\n    pass\n"
    ),
    "dataclass-fields-from-annotations": (
        "from dataclasses import dataclass\n" + HEADER + "class P:\n"
        "    __annotations__ = {\"a=__import__('os').getpid()\": int}\n"
        "class H(Harness):\n    def run(self, env, llm):\n        return dataclass(P)\n"
    ),
    "namedtuple": (
        "import collections\n" + HEADER + "class H(Harness):\n    def run(self, env, llm):\n"
        "        return collections.namedtuple('P', 'a b')\n"
    ),
    "typing-namedtuple": "from typing import NamedTuple\n" + HEADER + "class H(Harness):\n    pass\n",
    "enum": "import enum\n" + HEADER + "class H(Harness):\n    pass\n",
    "type-with-a-dict": HEADER + "X = type('X', (), {})\nclass H(Harness):\n    pass\n",
    "type-itself": HEADER + "class H(Harness):\n    def run(self, env, llm):\n        return type(self)\n",
    "class-decorator": (
        "import functools\n" + HEADER + "@functools.total_ordering\nclass P:\n    pass\n"
        "class H(Harness):\n    pass\n"
    ),
    "computed-base": HEADER + "def make():\n    return Harness\nclass H(make()):\n    pass\nHARNESS = H\n",
    "abc-meta": "from abc import ABCMeta\n" + HEADER + "class H(Harness):\n    pass\n",
    "slots": HEADER + "class H(Harness):\n    __slots__ = ('a',)\n",
    "module-getattr": HEADER + "def __getattr__(name):\n    return name\nclass H(Harness):\n    pass\n",
}

ROUTES = {
    **{f"a/{k}": v for k, v in SELF_AND_TYPING.items()},
    **{f"b/{k}": v for k, v in ATTRIBUTE_COPIERS.items()},
    **{f"c/{k}": v for k, v in CLASS_MACHINERY.items()},
}


@pytest.mark.parametrize("name", sorted(ROUTES))
def test_the_lint_refuses_every_route(name):
    source = ROUTES[name]
    compile(source, "h.py", "exec")  # valid Python: the lint is what refuses it
    with pytest.raises(HarnessValidationError) as err:
        validate_source(source, "h.py")
    assert str(err.value).startswith("h.py:") and "\n" not in str(err.value)  # one line naming the place


@pytest.mark.parametrize("name", ["a/forward-ref-evaluate", "b/update-wrapper-assigned"])
def test_the_module_views_alone_refuse_what_the_escapes_need(name):
    """Layer 2 without layer 1: the source is executed with restricted builtins but not linted. Under
    the old rules both returned the worker's pid (full Python); now the views lack the names."""
    source = ROUTES[name]
    imports = ("typing",) if name.startswith("a/") else ("functools",)
    prepared = (ValidationReport("H", imports + ("harnesses.base",)), compile(source, "h.py", "exec"))
    cls = load_class(source, "h.py", restricted=True, prepared=prepared)
    with pytest.raises(AttributeError):
        cls().run(None, None)


ORDINARY = (
    "from __future__ import annotations\n"
    "import collections, functools, json, math, random, re, statistics, string, textwrap, typing\n"
    "from dataclasses import asdict, dataclass, field\n"
    "from typing import Any, Optional\n"
    "from abc import ABC, abstractmethod\n"
    "from harnesses.base import Harness, HarnessCallError, extract_boxed, extract_tag, majority\n"
    "@dataclass(frozen=True)\nclass Note:\n    text: str\n    score: float = 0.0\n"
    "    tags: list = field(default_factory=list)\n"
    "class Base(ABC):\n    @abstractmethod\n    def pick(self, xs: list[str]) -> Optional[str]: ...\n"
    "class H(Harness, Base):\n    name = 'ordinary'\n"
    "    def __init__(self):\n        super().__init__()\n        self.seen: dict[str, Any] = {}\n"
    "    def __repr__(self):\n        return 'H()'\n"
    "    @functools.lru_cache(maxsize=8)\n    def pick(self, xs):\n        return majority(list(xs))\n"
    "    def run(self, env, llm):\n        obs, info = env.reset()\n"
    "        counts = collections.Counter(re.findall(r'\\d+', obs))\n"
    "        note = Note(text=json.dumps(sorted(counts)), score=math.sqrt(2))\n"
    "        random.Random(0).shuffle(note.tags)\n"
    "        text = textwrap.shorten(string.capwords(obs), 40) + str(statistics.mean([1, 2]))\n"
    "        return asdict(note), text, extract_tag(text, 'a'), extract_boxed(text), typing.cast\n"
)


def test_ordinary_code_and_every_shipped_harness_still_pass():
    validate_source(ORDINARY.replace(", typing.cast", ""), "ordinary.py")
    for name in shipped_harnesses():
        source = Path("harnesses", name + ".py").read_text()
        validate_source(source, name)
        load_class(source, name, restricted=True)


# ------------------------------------------------------------------------------------ episodes alone

MEET = "whale-meet-" + uuid.uuid4().hex[:8]
ADD_KEY, REQUEST_KEY = {"aarch64": (217, 218)}.get(platform.machine(), (248, 249))  # else x86_64

#: Each body runs in both samples of one task at once (full Python: the lint is bypassed) and reports
#: what it found; "met" in any report means the two samples reached each other.
SIBLING_ROUTES = {
    "abstract-unix-socket": (
        "import socket\n"
        "env.reset()\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "try:\n"
        f"    s.bind('\\0{MEET}'); s.listen(1); s.settimeout(2.5)\n"
        "    try:\n"
        "        s.accept(); out = 'met'\n"
        "    except OSError:\n"
        "        out = 'alone'\n"
        "except OSError:\n"  # the name is taken: the sibling holds it
        "    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        f"    c.connect('\\0{MEET}'); out = 'met'\n"
        "env.step('report ' + out)"
    ),
    "named-socket": (
        "import socket\n"
        "env.reset()\n"
        "out = []\n"
        "for d in ('/tmp', '/dev/shm', '/sandbox', '/'):\n"
        "    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "    try:\n"
        f"        s.bind(d + '/{MEET}'); out.append('bound')\n"
        "    except OSError as exc:\n"
        "        out.append(type(exc).__name__)\n"
        "env.step('report ' + ' '.join(out))"
    ),
    "sysv-shm": (
        "import ctypes, time\n"
        "env.reset()\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "time.sleep(0.2)\n"
        "ids = [libc.shmget(0x5A17E + i, 4096, 0o1000 | 0o2000 | 0o666) for i in range(2)]\n"  # CREAT|EXCL
        "errs = [ctypes.get_errno()]\n"
        "out = 'met' if -1 in ids and errs[0] == 17 else ('alone' if -1 not in ids else 'error')\n"  # EEXIST
        "sem = libc.semget(0x5A17E, 1, 0o1000 | 0o2000 | 0o666)\n"
        "out += ' met' if sem == -1 and ctypes.get_errno() == 17 else ' alone'\n"
        "env.step('report ' + out)"
    ),
    "posix-shm": (
        "import os\n"
        "env.reset()\n"
        "out = []\n"
        "for d in ('/dev/shm', '/dev/mqueue', '/run/shm'):\n"
        "    try:\n"
        f"        os.close(os.open(d + '/{MEET}', os.O_CREAT | os.O_EXCL | os.O_RDWR)); out.append('made')\n"
        "    except FileExistsError:\n"
        "        out.append('met')\n"
        "    except OSError as exc:\n"
        "        out.append(type(exc).__name__)\n"
        "env.step('report ' + ' '.join(out))"
    ),
    "signal-a-sibling": (
        "import os, time\n"
        "env.reset()\n"
        "time.sleep(0.3)\n"
        "found = []\n"
        "for pid in range(1, 1 << 15):\n"  # every pid this process may signal, but itself
        "    if pid == os.getpid():\n"
        "        continue\n"
        "    try:\n"
        "        os.kill(pid, 0); found.append(pid)\n"
        "    except OSError:\n"
        "        pass\n"
        "env.step('report signalable ' + str(found[:5]))"
    ),
    "proc-of-a-sibling": (
        "import os, time\n"
        "env.reset()\n"
        "time.sleep(0.3)\n"
        "others = [p for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()]\n"
        "env.step('report processes ' + str(others[:5]))"
    ),
    "file-lock": (
        "import fcntl, os, time\n"
        "env.reset()\n"
        "out = []\n"
        "for lock in (lambda fd: fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB) or fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB),\n"
        "             lambda fd: fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)):\n"
        "    fd = os.open(os.__file__, os.O_RDONLY)\n"  # a file both can read: the shared standard library
        "    try:\n"
        "        lock(fd); out.append('locked'); time.sleep(1.0)\n"
        "    except BlockingIOError:\n"
        "        out.append('met')\n"
        "    except PermissionError:\n"
        "        out.append('refused')\n"
        "    except OSError as exc:\n"
        "        out.append(type(exc).__name__)\n"
        "env.step('report ' + ' '.join(out))"
    ),
    "inotify": (
        "import ctypes, os, time\n"
        "env.reset()\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "fd = libc.inotify_init1(0o4000)\n"  # IN_NONBLOCK
        "if fd < 0:\n"
        "    out = 'refused' if ctypes.get_errno() == 1 else 'error'\n"
        "else:\n"
        "    libc.inotify_add_watch(fd, os.__file__.encode(), 0x20)\n"  # IN_OPEN
        "    time.sleep(0.5)\n"
        "    os.close(os.open(os.__file__, os.O_RDONLY))\n"
        "    time.sleep(0.8)\n"
        "    try:\n"
        "        n = len(os.read(fd, 4096)) // 16\n"  # events without a name: 16 bytes each
        "    except BlockingIOError:\n"
        "        n = 0\n"
        "    out = 'met' if n > 1 else 'alone'\n"
        "env.step('report ' + out)"
    ),
    "session-keyring": (
        "import ctypes\n"
        "env.reset()\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"name = b'{MEET}'\n"
        f"found = libc.syscall({REQUEST_KEY}, b'user', name, None, -3)\n"  # request_key(type, name, info, @s)
        "if found >= 0:\n"
        "    out = 'met'\n"
        "elif ctypes.get_errno() == 1:\n"
        "    out = 'refused'\n"
        "else:\n"
        f"    made = libc.syscall({ADD_KEY}, b'user', name, b'x', 1, -3)\n"  # add_key(..., @s)
        "    out = 'alone' if made >= 0 else 'refused' if ctypes.get_errno() == 1 else 'error'\n"
        "import time; time.sleep(0.5)\n"
        "env.step('report ' + out)"
    ),
}

ALONE = {
    "abstract-unix-socket": "report alone",
    "named-socket": "report OSError FileNotFoundError OSError OSError",  # read-only, absent, read-only, read-only
    "sysv-shm": "report alone alone",
    "posix-shm": "report FileNotFoundError FileNotFoundError FileNotFoundError",
    "signal-a-sibling": "report signalable []",
    "proc-of-a-sibling": "report processes []",
    "file-lock": "report refused refused",
    "inotify": "report refused",
    "session-keyring": "report refused",
}


@pytest.mark.parametrize("route", sorted(SIBLING_ROUTES))
def test_two_samples_of_one_task_cannot_reach_each_other(unlinted, route):  # noqa: F811
    """Two samples of one task run at once in one worker (k=2, both in flight) and try to meet."""
    trajs = rollouts(unlinted(SIBLING_ROUTES[route]), n=1, k=2, concurrency=2)
    reports = [reported(t) for t in trajs]
    assert [t.error for t in trajs] == [None, None], [t.error for t in trajs]
    assert reports == [ALONE[route]] * 2, reports


def test_an_episode_is_refused_where_its_namespaces_cannot_be_made(unlinted, monkeypatch):  # noqa: F811
    """Fail closed: when the kernel refuses an episode's namespaces, the episode does not run (its
    error says why), unless the run is unisolated by the user's opt-in (the sandbox then tells the
    worker ``WHALE_SANDBOX_ISOLATION=none``). The load check is left isolated: episodes are refused."""

    def refusing(opt_in: str) -> str:  # the lint-bypassing program of ``unlinted``, the kernel refusing
        return changed_worker_program(
            UNLINTED + "_real = isolate_episode\n"
            "def _refuse():\n"
            "    if sys._getframe(2).f_code.co_name != '_episode':\n"
            "        return _real()\n"
            "    raise OSError(1, 'unshare: Operation not permitted')\n"
            f"isolate_episode = _refuse\n{opt_in}"
        )

    ref = unlinted("env.reset()\nenv.step('report ran')")
    monkeypatch.setattr(workers, "worker_program", lambda: refusing(""))
    trajs = rollouts(ref, n=2)
    assert all(not t.steps for t in trajs), [reported(t) for t in trajs]
    assert all("cannot run alone" in t.error and "Operation not permitted" in t.error for t in trajs)
    monkeypatch.setattr(
        workers, "worker_program", lambda: refusing("os.environ['WHALE_SANDBOX_ISOLATION'] = 'none'\n")
    )
    assert [reported(t) for t in rollouts(ref, n=2)] == ["report ran"] * 2


def test_many_episodes_in_flight_fit_the_process_cap(unlinted):  # noqa: F811
    """Each episode is one process once set up (the forked child that made its namespaces is collected
    at once), so ``concurrency`` episodes in flight fit the worker's cap of ``concurrency + 32``."""
    ref = unlinted("import time\nenv.reset()\ntime.sleep(2)\nenv.step('report done')")
    trajs = rollouts(ref, n=48, concurrency=48)
    assert [(t.error, reported(t)) for t in trajs] == [(None, "report done")] * 48


def test_the_probe_checks_that_episodes_can_run_alone(monkeypatch):
    """The sandbox's probe of the worker's configuration runs the episode namespaces for real; where
    the kernel refuses them the worker is unavailable with the reason (and so refused before a run,
    like a sandbox without namespaces, unless the user opts in); tool code does not need them."""
    from whale_envs.sandbox import bundle, policy

    assert policy._probe(False) == (None, True)
    # the probe as it runs where the kernel refuses an episode's namespaces
    refused = (
        "def isolate_episode():\n"
        "    raise OSError(1, 'unshare (episode namespaces): Operation not permitted')\n"
    )
    real = bundle.module_source
    monkeypatch.setattr(
        bundle, "module_source", lambda name: refused if name == "whale_envs._children" else real(name)
    )
    problem, lasting = policy._probe(False)
    assert lasting and "episodes cannot run alone" in problem and "Operation not permitted" in problem
    assert policy._probe(True) == (None, True)
