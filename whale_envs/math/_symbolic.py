"""The symbolic half of the math verifier. It runs only inside the OS sandbox, never in the trusted process.

:mod:`whale_envs.math.verify` hands this file's source to :func:`whale_envs.sandbox.spawn_python` (the
sandbox hides this project's packages, so the program must be self-contained: standard library, SymPy
and math-verify only) and talks to it over pipes: one JSON object a line in, ``[decision, matcher]``
out. Each comparison runs under a CPU-time timer (``ITIMER_VIRTUAL``), so whether a hard comparison
times out does not depend on how loaded the machine is; the trusted side adds a generous wall-clock
backstop and kills the process when that runs out.

Neither parser here can execute the text it reads:

* **LaTeX** (any side with a backslash or a brace): math-verify's LaTeX extraction, a grammar
  (``latex2sympy2_extended``). Its *expression* extraction is never used: it calls SymPy's
  ``parse_expr``, which is Python's ``eval``.
* **Plain text** (``x^2+1``, ``2*sqrt(2)``, ``(3, pi/2)``, ``y = 2x``): :func:`parse_plain`, a small
  recursive-descent grammar over numbers, one-letter symbols, a fixed table of functions and
  constants, ``+ - * / ^ ** ! ( ) , =`` and implicit multiplication. It builds SymPy objects with
  SymPy's constructors; a name outside the tables is a product of one-letter symbols (``xy`` is
  ``x*y``), so no text ever names a Python object. Exponents above :data:`MAX_EXPONENT`, factorials
  above :data:`MAX_FACTORIAL` and numbers longer than :data:`MAX_DIGITS` digits are refused.

Whichever parser read a side, :func:`check_caps` checks the parsed tree against the same caps before
anything evaluates or simplifies it (math-verify's LaTeX parse builds ``9^{9^{9}}`` unevaluated; its
comparison would then compute it): over them the answer is ``[false, "too_costly"]`` at once.

Sandboxed as it is, a comparison also has the sandbox's memory limit: a MemoryError (or any other
error) is the answer ``[false, "error"]``, never a crash of the loop.
"""

from __future__ import annotations

import json
import re
import signal
import sys
from fractions import Fraction

#: Largest integer exponent / factorial argument / number of digits the plain grammar builds.
MAX_EXPONENT = 1000
MAX_FACTORIAL = 500
MAX_DIGITS = 100
MAX_DEPTH = 60


class _Timeout(BaseException):
    """Raised by the CPU timer; a BaseException so that a library's ``except Exception`` lets it pass."""


class PlainSyntaxError(ValueError):
    """The text is not in the plain grammar."""


# ------------------------------------------------------------------------------------ plain grammar

_TOKEN = re.compile(r"\s*(?:(?P<num>\d+(?:\.\d*)?|\.\d+)|(?P<name>[A-Za-z]+)|(?P<op>\*\*|[-+*/^(),=!]))")


def _tables():
    import sympy

    functions = {
        "sqrt": sympy.sqrt,
        "sin": sympy.sin,
        "cos": sympy.cos,
        "tan": sympy.tan,
        "cot": sympy.cot,
        "sec": sympy.sec,
        "csc": sympy.csc,
        "asin": sympy.asin,
        "acos": sympy.acos,
        "atan": sympy.atan,
        "arcsin": sympy.asin,
        "arccos": sympy.acos,
        "arctan": sympy.atan,
        "log": sympy.log,
        "ln": sympy.log,
        "exp": sympy.exp,
        "abs": sympy.Abs,
        "floor": sympy.floor,
        "ceil": sympy.ceiling,
        "ceiling": sympy.ceiling,
    }
    constants = {
        "pi": sympy.pi,
        "E": sympy.E,
        "oo": sympy.oo,
        "inf": sympy.oo,
        "infinity": sympy.oo,
        "I": sympy.I,
    }
    return functions, constants


def _tokens(text: str) -> list[tuple[str, str]]:
    out, i = [], 0
    text = text.rstrip()
    while i < len(text):
        m = _TOKEN.match(text, i)
        if not m or m.end() == i:
            raise PlainSyntaxError(f"unexpected character {text[i]!r}")
        kind = m.lastgroup
        out.append((kind, m.group(kind)))
        i = m.end()
    return out


class _Parser:
    def __init__(self, text: str):
        import sympy

        self.sympy = sympy
        self.functions, self.constants = _tables()
        self.toks = _tokens(text)
        self.i = 0
        self.depth = 0

    # helpers
    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, op: str | None = None) -> tuple[str, str]:
        tok = self.peek()
        if tok is None or (op is not None and tok != ("op", op)):
            raise PlainSyntaxError(f"expected {op or 'more'}")
        self.i += 1
        return tok

    def at(self, *ops: str) -> bool:
        tok = self.peek()
        return tok is not None and tok[0] == "op" and tok[1] in ops

    def deeper(self):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise PlainSyntaxError("nested too deeply")

    # grammar
    def parse(self):
        value = self.sequence()
        if self.peek() is not None:
            raise PlainSyntaxError(f"unexpected {self.peek()[1]!r}")
        return value

    def sequence(self):
        """relation (',' relation)*: a tuple when there is a comma."""
        items = [self.relation()]
        while self.at(","):
            self.take(",")
            items.append(self.relation())
        return items[0] if len(items) == 1 else self.sympy.Tuple(*items)

    def relation(self):
        left = self.expr()
        if self.at("="):
            self.take("=")
            return self.sympy.Eq(left, self.expr(), evaluate=False)
        return left

    def expr(self):
        value = self.term()
        while self.at("+", "-"):
            op = self.take()[1]
            right = self.term()
            value = value + right if op == "+" else value - right
        return value

    def _starts_factor(self) -> bool:
        tok = self.peek()
        return tok is not None and (tok[0] in ("num", "name") or tok == ("op", "("))

    def term(self):
        value = self.unary()
        while True:
            if self.at("*", "/"):
                op = self.take()[1]
                right = self.unary()
                value = value * right if op == "*" else value / right
            elif self._starts_factor():  # implicit multiplication: 2x, 2(x+1), (a)(b)
                value = value * self.power()
            else:
                return value

    def unary(self):
        if self.at("-", "+"):
            op = self.take()[1]
            self.deeper()
            value = self.unary()
            self.depth -= 1
            return -value if op == "-" else value
        return self.power()

    def power(self):
        base = self.postfix()
        if self.at("^", "**"):
            self.take()
            self.deeper()
            exponent = self.unary()  # right-associative: 2^3^2 = 2^(3^2)
            self.depth -= 1
            if exponent.is_Number and abs(exponent) > MAX_EXPONENT:
                raise PlainSyntaxError("exponent too large")
            if base.is_Number and exponent.is_Number and abs(base) > 10**MAX_DIGITS:
                raise PlainSyntaxError("base too large")
            return self.sympy.Pow(base, exponent)
        return base

    def postfix(self):
        value = self.atom()
        while self.at("!"):
            self.take("!")
            if value.is_Number and (not value.is_Integer or value > MAX_FACTORIAL):
                raise PlainSyntaxError("factorial argument too large")
            value = self.sympy.factorial(value)
        return value

    def atom(self):
        sympy = self.sympy
        kind, text = self.take()
        if kind == "num":
            if len(text.replace(".", "")) > MAX_DIGITS:
                raise PlainSyntaxError("number too long")
            f = Fraction(text)
            return sympy.Rational(f.numerator, f.denominator)
        if kind == "name":
            if text in self.functions and self.at("("):
                self.take("(")
                self.deeper()
                arg = self.sequence()
                self.depth -= 1
                self.take(")")
                return self.functions[text](*(arg if isinstance(arg, sympy.Tuple) else (arg,)))
            if text in self.constants:
                return self.constants[text]
            if text in self.functions:
                raise PlainSyntaxError(f"{text} needs parentheses")
            value = sympy.Integer(1)
            for letter in text:
                value = value * sympy.Symbol(letter)
            return value
        if text == "(":
            self.deeper()
            value = self.sequence()
            self.depth -= 1
            self.take(")")
            return value
        raise PlainSyntaxError(f"unexpected {text!r}")


def parse_plain(text: str):
    """``text`` in the plain grammar as a SymPy object; raises :class:`PlainSyntaxError` otherwise."""
    return _Parser(text).parse()


# ------------------------------------------------------------------------------------ comparison


def _latex(text: str):
    """math-verify's LaTeX parse of ``text`` (a SymPy object), or None."""
    from math_verify import LatexExtractionConfig, parse
    from sympy import Basic, MatrixBase

    found = parse("\\boxed{" + text + "}", extraction_config=[LatexExtractionConfig()], parsing_timeout=None)
    return next((x for x in found if isinstance(x, (Basic, MatrixBase))), None)


def to_sympy(text: str):
    """One side as a SymPy object, or None: LaTeX when it has a backslash or a brace, else the plain
    grammar (LaTeX when that fails: ``[1, 2)`` is an interval)."""
    if "\\" not in text and "{" not in text:
        try:
            return parse_plain(text)
        except (PlainSyntaxError, ZeroDivisionError, ValueError, TypeError):
            pass
    return _latex(text)


class TooCostly(ValueError):
    """A parsed expression over the caps (its evaluation could take any amount of time)."""


#: Functions whose numeric argument is capped like a factorial's.
_FACTORIAL_LIKE = ("factorial", "factorial2", "subfactorial", "gamma", "RisingFactorial", "FallingFactorial")


def _magnitude(expr) -> float | None:
    """``|expr|`` as a float (``inf`` when it overflows), for a numeric expression whose parts are
    already within the caps (so evaluating it is cheap); None when it has no numeric value."""
    try:
        value = complex(expr.evalf(15))
    except (TypeError, ValueError, ArithmeticError, AttributeError):
        return None
    return abs(value)


def check_caps(obj) -> None:
    """Raise :class:`TooCostly` when ``obj`` (a parsed answer: SymPy expression, set, relation, matrix,
    tuple) holds an exponent above :data:`MAX_EXPONENT` in size, a power of a number above
    ``10**MAX_DIGITS``, a factorial of more than :data:`MAX_FACTORIAL`, a number of more than
    :data:`MAX_DIGITS` digits, or a sum / product over more than :data:`MAX_EXPONENT` terms: the plain
    grammar's caps, for the LaTeX parse too, checked on the unevaluated tree before anything evaluates
    it. The nodes are checked leaves first, so a node's parts are bounded when it is measured."""
    import sympy
    from sympy import MatrixBase

    order, stack = [], [obj]
    while stack:
        node = stack.pop()
        order.append(node)
        if len(order) > 20_000:
            raise TooCostly("expression too large")
        if isinstance(node, MatrixBase):
            stack.extend(node)
        elif isinstance(node, sympy.Basic):
            stack.extend(node.args)
        elif isinstance(node, (tuple, list)):
            stack.extend(node)
    limit = 10**MAX_DIGITS
    for node in reversed(order):  # each node after all of its parts
        if not isinstance(node, sympy.Basic):
            continue
        if node.is_Pow:
            base, exponent = node.args
            if exponent.is_number:
                size = _magnitude(exponent)
                if size is not None and size > MAX_EXPONENT:
                    raise TooCostly("exponent too large")
                if base.is_number:
                    big = _magnitude(base)
                    if big is not None and big > limit:
                        raise TooCostly("base too large")
        elif type(node).__name__ in _FACTORIAL_LIKE or isinstance(node, sympy.binomial):
            for arg in node.args:
                if arg.is_number:
                    size = _magnitude(arg)
                    if size is not None and size > (
                        limit if isinstance(node, sympy.binomial) else MAX_FACTORIAL
                    ):
                        raise TooCostly("factorial argument too large")
            if isinstance(node, sympy.binomial) and all(a.is_number for a in node.args):
                n, k = (_magnitude(a) or 0.0 for a in node.args)
                if min(k, abs(n - k)) > MAX_FACTORIAL:
                    raise TooCostly("binomial too large")
        elif isinstance(node, (sympy.Sum, sympy.Product)):
            for limits in node.limits:
                if len(limits) == 3 and limits[1].is_number and limits[2].is_number:
                    span = _magnitude(limits[2] - limits[1])
                    if span is None or span > MAX_EXPONENT:
                        raise TooCostly("too many terms")


_LONG_NUMBER = re.compile(r"\d{" + str(MAX_DIGITS + 1) + "}")


def _parse(text: str):
    """One side, parsed and within the caps (else :class:`TooCostly`); None when it does not parse. A
    number written with more than :data:`MAX_DIGITS` digits is refused in the text (a number that the
    plain grammar computes, ``2^1000``, is not: its exponent and base are what the caps bound)."""
    if _LONG_NUMBER.search(text):
        raise TooCostly("number too long")
    value = to_sympy(text)
    if value is not None:
        check_caps(value)
    return value


def _same(g, p) -> bool:
    import math_verify

    return bool(math_verify.verify([g], [p], timeout_seconds=None))


def compare(gold, pred, mode: str = "one") -> list:
    """``[decision, matcher]``: ``[true|false, "math_verify"]`` when the sides parse, else ``[null, "none"]``;
    ``[false, "too_costly"]`` when a side is over the caps (:func:`check_caps`).

    ``mode``: ``"one"`` (one gold, one answer); ``"multiset"`` (lists of golds and answers, equal as
    multisets: each answer matches a gold of its own); ``"chain"`` (one gold, the sides of the answer's
    relation ``a = b = c``, its label ``x =`` or ``f(2) =`` already taken off: every side must equal the gold).
    """
    try:
        if mode == "multiset":
            golds, preds = [_parse(t) for t in gold], [_parse(t) for t in pred]
            if any(v is None for v in golds + preds):
                return [None, "none"]
            if len(golds) != len(preds):
                return [False, "math_verify"]
            unused = list(range(len(preds)))
            for g in golds:
                hit = next((j for j in unused if _same(g, preds[j])), None)
                if hit is None:
                    return [False, "math_verify"]
                unused.remove(hit)
            return [True, "math_verify"]
        if mode == "chain":
            g, sides = _parse(gold), [_parse(t) for t in pred]
            if g is None or any(v is None for v in sides):
                return [None, "none"]
            return [all(_same(g, side) for side in sides), "math_verify"]
        g, p = _parse(gold), _parse(pred)
    except TooCostly:
        return [False, "too_costly"]
    if g is None or p is None:
        return [None, "none"]
    return [_same(g, p), "math_verify"]


def _fire(signum, frame):
    raise _Timeout()


def serve() -> None:
    """The sandboxed loop: ``{"gold", "pred", "mode", "cpu_s"}`` a line in, ``[decision, matcher]`` a line
    out (see :func:`compare`)."""
    import math_verify.grader
    import math_verify.parser

    # Our CPU timer covers each call; silence math-verify's one-time warning about passing no timeout.
    math_verify.parser.TIMEOUT_WARNING_SHOWN = True
    math_verify.grader.TIMEOUT_WARNING_SHOWN = True
    signal.signal(signal.SIGVTALRM, _fire)
    compare("x+1", "1+x")  # import and warm everything before saying ready
    print("ready", flush=True)
    for line in sys.stdin:
        try:
            job = json.loads(line)
            signal.setitimer(signal.ITIMER_VIRTUAL, float(job["cpu_s"]))
            try:
                out = compare(job["gold"], job["pred"], str(job.get("mode", "one")))
            finally:
                signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        except _Timeout:
            out = [False, "timeout"]
        except BaseException:  # noqa: BLE001 - a MemoryError or a library bug is an answer, not a crash
            out = [False, "error"]
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    serve()
