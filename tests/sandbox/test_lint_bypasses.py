"""Red team, the AST rules: a lint in front of the OS sandbox. The bypass classes found (format-string
field names, run-time resolution of string annotations, ``match`` class patterns) and their
neighbours (computed ``getattr``, ``vars``/``dir``, frames through generators, coroutines and
tracebacks, ``type(name, bases, dict)``, ``__match_args__``) are rejected in every spelling and every
place a generator of variants puts them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harnesses.validate import HarnessValidationError, load_class, validate_source

TARGETS = [
    "__globals__",
    "__import__",
    "__subclasses__",
    "__builtins__",
    "__code__",
    "__closure__",
    "__class__",
]
FRAMES = [
    "gi_frame",
    "cr_frame",
    "ag_frame",
    "tb_frame",
    "f_back",
    "f_globals",
    "f_locals",
    "f_builtins",
    "tb_next",
]
RECEIVERS = ["self.run", "llm", "env", "(lambda: 0)", "Harness", "json.loads", "str", "H"]


def _payloads(attr: str, recv: str, n: int) -> list[str]:
    """Expressions (or statements) that read ``attr`` of ``recv`` without writing ``recv.attr``."""
    dotted = f"0.{attr}"
    return [
        f"{recv}.{attr}",
        f"'{{{dotted}}}'.format({recv})",
        f"'{{x.{attr}}}'.format(x={recv})",
        f"'{{0[a].{attr}}}'.format({{'a': {recv}}})",
        f"'{{0:{{1.{attr}}}}}'.format(1, {recv})",
        f"('{{' + '0.' + {attr!r} + '}}').format({recv})",
        f"fmt{n} = '{{{dotted}}}'\nfmt{n}.format({recv})",
        f"str.format('{{{dotted}}}', {recv})",
        f"string.Formatter().get_field({dotted!r}, [{recv}], {{}})",
        "'{0}'.format_map({})",
        f"getattr({recv}, {attr!r})",
        f"vars({recv})",
        f"dir({recv})",
        f"typing.get_type_hints(f{n})",
        f"functools.singledispatch(f{n})",
        f"type('C{n}', (), {{}})",
        f"{{{attr!r}: 1}}",
    ]


def _match_payloads(attr: str, recv: str, n: int) -> list[str]:
    return [
        f"match {recv}:\n    case object({attr}=g{n}):\n        pass",
        f"class M{n}:\n    __match_args__ = ({attr!r},)",
        f"class M{n}:\n    __match_args__ = ('a',)",
    ]


def _frame_payloads(attr: str, n: int) -> list[str]:
    return [
        f"(x for x in ()).{attr}",
        f"g{n} = (x for x in ())\ng{n}.gi_frame.{attr}",
        f"try:\n    1 / 0\nexcept Exception as e{n}:\n    e{n}.{attr}",
        f"async def co{n}():\n    pass\nco{n}().{attr}",
    ]


# Where a generated payload is placed: a method body, module level, a nested function, a lambda's
# default, a class body, a decorator's argument, a comprehension.
def _place(payload: str, where: str, n: int) -> str:
    head = (
        "import json, string, typing, functools\n"
        "from harnesses.base import Harness\n"
        f"def f{n}(x: 'int') -> 'int':\n    return x\n"
    )

    def indent(text: str, pad: str) -> str:
        return "\n".join(pad + line for line in text.splitlines())

    one_line = "\n" not in payload and not payload.startswith(("match", "class", "try", "async"))
    if where == "method":
        return head + "class H(Harness):\n    def run(self, env, llm):\n" + indent(payload, "        ") + "\n"
    if where == "module":
        return head + payload + "\nclass H(Harness):\n    pass\n"
    if where == "nested":
        return (
            head
            + "class H(Harness):\n    def run(self, env, llm):\n        def inner():\n"
            + indent(payload, "            ")
            + "\n"
        )
    if where == "lambda" and one_line:
        return head + f"k{n} = lambda v=({payload}): v\nclass H(Harness):\n    pass\n"
    if where == "comprehension" and one_line:
        return head + f"k{n} = [({payload}) for _ in range(1)]\nclass H(Harness):\n    pass\n"
    if where == "decorator" and one_line:
        return (
            head
            + f"def deco(v):\n    return lambda fn: fn\n@deco({payload})\ndef g():\n    pass\nclass H(Harness):\n    pass\n"
        )
    return head + "class H(Harness):\n" + indent(payload, "    ") + "\n"  # class body


PLACES = ["method", "module", "nested", "lambda", "comprehension", "decorator", "class"]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    attr=st.sampled_from(TARGETS),
    recv=st.sampled_from(RECEIVERS),
    kind=st.integers(0, 16),
    where=st.sampled_from(PLACES),
    n=st.integers(0, 9),
)
def test_attribute_access_in_any_spelling_is_rejected(attr, recv, kind, where, n):
    source = _place(_payloads(attr, recv, n)[kind], where, n)
    compile(source, "h.py", "exec")  # the variant is valid Python: the lint is what rejects it
    with pytest.raises(HarnessValidationError):
        validate_source(source, "h.py")


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    attr=st.sampled_from(TARGETS + FRAMES),
    recv=st.sampled_from(RECEIVERS),
    kind=st.integers(0, 2),
    where=st.sampled_from(["method", "module", "nested", "class"]),
    n=st.integers(0, 9),
)
def test_match_patterns_are_rejected(attr, recv, kind, where, n):
    source = _place(_match_payloads(attr, recv, n)[kind], where, n)
    compile(source, "h.py", "exec")
    with pytest.raises(HarnessValidationError):
        validate_source(source, "h.py")


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    attr=st.sampled_from(FRAMES),
    kind=st.integers(0, 3),
    where=st.sampled_from(["method", "module", "nested"]),
    n=st.integers(0, 9),
)
def test_frames_through_generators_coroutines_and_tracebacks_are_rejected(attr, kind, where, n):
    source = _place(_frame_payloads(attr, n)[kind], where, n)
    compile(source, "h.py", "exec")
    with pytest.raises(HarnessValidationError):
        validate_source(source, "h.py")


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    recv=st.sampled_from(["'text'", "json.dumps([1])", "str(3)"]),
    where=st.sampled_from(PLACES),
    n=st.integers(0, 9),
    form=st.sampled_from(
        ["{r}.strip()", 'f"{{{r}}}"', "'{{}} and {{0}}'.format({r})", "'{{x!r:>8}}'.format(x={r})"]
    ),
)
def test_the_same_places_accept_ordinary_code(recv, where, n, form):
    """The control: the generator's places and the ordinary spellings validate (the test is not vacuous)."""
    source = _place(form.format(r=recv), where, n)
    validate_source(source, "h.py")


def test_module_views_hand_out_no_formatter_and_no_annotation_resolver():
    source = (
        "import string, typing, functools\nfrom harnesses.base import Harness\n"
        "class H(Harness):\n    def run(self, env, llm):\n"
        "        return [hasattr(string, n) for n in ('Formatter', 'Template')] + "
        "[hasattr(typing, 'get_type_hints'), hasattr(functools, 'singledispatch')]\n"
    )
    cls = load_class(source, restricted=True)
    assert cls().run(None, None) == [False, True, False, False]
