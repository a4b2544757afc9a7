"""Red team, round 3 (issue 40, item 3): the AST lint is a first filter with an allow-list, and every
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
``tests/test_redteam_worker.py``). Every route must fail.
"""

from __future__ import annotations

import pytest

from harnesses.loader import shipped_harnesses
from harnesses.validate import HarnessValidationError, ValidationReport, load_class, validate_source

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
        source = __import__("pathlib").Path("harnesses", name + ".py").read_text()
        validate_source(source, name)
        load_class(source, name, restricted=True)
