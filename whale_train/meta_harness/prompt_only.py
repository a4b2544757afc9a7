"""Prompt-only mode (the Fast-Slow Training baseline): a candidate may change the seed harness's string
constants (its prompt text) and nothing else.

``prompt_only_violation(seed, candidate)`` compares the two syntax trees with every string constant
masked (the literal parts of f-strings removed, their ``{...}`` fields kept) and names the first place
where the code itself differs. ``PromptEdit`` is one of the offline proposer's prompt rewrites of a
domain's ``h0`` (``Domain.prompt_edits`` names a domain's tuple of them; the built-in ones are below):
an exact replacement of text inside a string literal, with the failure signals it targets.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass


class _MaskStrings(ast.NodeTransformer):
    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        if isinstance(node.value, str):
            return ast.Constant(value="")
        return node

    def visit_JoinedStr(self, node: ast.JoinedStr) -> ast.AST:
        values = [self.visit(v) for v in node.values if not isinstance(v, ast.Constant)]
        return ast.JoinedStr(values=values)


def _masked(tree: ast.AST) -> ast.AST:
    return _MaskStrings().visit(tree)


def prompt_only_violation(seed_source: str, candidate_source: str) -> str | None:
    """None when the candidate differs from the seed only in string constants, else where it differs."""
    try:
        seed = _masked(ast.parse(seed_source))
        cand_tree = ast.parse(candidate_source)
    except SyntaxError as exc:
        return f"syntax error: {exc.msg} (line {exc.lineno})"
    lines = {id(n): getattr(n, "lineno", None) for n in ast.walk(cand_tree)}
    cand = _masked(cand_tree)
    if ast.dump(seed) == ast.dump(cand):
        return None
    # walk both trees in step and report the first node that differs (the candidate's line)
    a_nodes, b_nodes = list(ast.walk(seed)), list(ast.walk(cand))
    for a, b in zip(a_nodes, b_nodes, strict=False):
        if type(a) is not type(b) or _fields(a) != _fields(b):
            line = getattr(b, "lineno", None) or lines.get(id(b))
            where = f"line {line}" if line else "the module"
            return f"{where}: the code differs from the seed harness outside string constants ({type(b).__name__})"
    return "the code differs from the seed harness outside string constants"


def _fields(node: ast.AST) -> tuple:
    out = []
    for name, value in ast.iter_fields(node):
        if isinstance(value, list):
            out.append((name, len(value), tuple(type(v).__name__ for v in value)))
        elif isinstance(value, ast.AST):
            out.append((name, type(value).__name__))
        else:
            out.append((name, value))
    return tuple(out)


@dataclass(frozen=True)
class PromptEdit:
    """Replace ``old`` (text inside a string literal of the seed) by ``new``."""

    key: str
    old: str
    new: str
    targets: tuple[str, ...]
    why: str

    def applies(self, source: str) -> bool:
        return self.old in source

    def apply(self, source: str) -> str:
        return source.replace(self.old, self.new, 1)


#: The offline proposer's prompt rewrites of each built-in domain's ``h0`` (``Domain.prompt_edits``).
CHESS_EDITS: tuple[PromptEdit, ...] = (
    PromptEdit(
        "list-reminder",
        '"\\nAnswer with one legal move in UCI inside <move></move> tags."',
        '"\\nAnswer with one move copied from the legal moves above, in UCI, inside <move></move> tags."',
        ("illegal", "parse"),
        "name the list the move must come from, so fewer answers are illegal",
    ),
    PromptEdit(
        "format-example",
        "inside <move></move> tags.",
        "inside <move></move> tags, for example <move>e2e4</move>.",
        ("parse",),
        "show the exact answer format once, so fewer answers are unparseable",
    ),
    PromptEdit(
        "mate-hint",
        '"\\nAnswer with',
        '"\\nA mate is a check the opponent cannot escape. Answer with',
        ("wrong",),
        "say what a mate is, so the model looks at checks",
    ),
    PromptEdit(
        "moves-label",
        '"Legal moves: "',
        '"Legal moves (UCI): "',
        ("illegal", "parse"),
        "label the move list as the env does (the wording the model has seen most)",
    ),
    PromptEdit(
        "puzzle-title",
        'f"Chess puzzle. You play',
        'f"Mate puzzle. You play',
        ("wrong",),
        "call it a mate puzzle, the goal stated first",
    ),
)
MATH_EDITS: tuple[PromptEdit, ...] = (
    PromptEdit(
        "no-tool-offer",
        '"To run Python first, reply python: <code> and print the result. "',
        '""',
        ("tool", "parse", "incomplete"),
        "stop offering the Python tool, so every reply is an answer",
    ),
    PromptEdit(
        "answer-only",
        "Put the final answer in \\\\boxed{{}}.",
        "Reply with the final answer only, as \\\\boxed{{number}}.",
        ("parse", "truncated"),
        "ask for the answer alone, so it fits in the token budget and parses",
    ),
    PromptEdit(
        "problem-label",
        'f"Problem: {',
        'f"Solve this problem. Problem: {',
        ("wrong",),
        "state the task before the problem",
    ),
    PromptEdit(
        "exact",
        "Put the final answer",
        "Compute exactly. Put the final answer",
        ("wrong",),
        "ask for an exact result",
    ),
)
SEARCH_EDITS: tuple[PromptEdit, ...] = (
    PromptEdit(
        "keyword-query",
        "Write a search query inside <search></search>.",
        "Write the names and key words of the question as a search query inside <search></search>.",
        ("wrong",),
        "ask for the question's names as the query, so the right passage is found",
    ),
    PromptEdit(
        "short-answer",
        "Answer the question inside <answer></answer>.",
        "Answer with a short phrase copied from the passage, inside <answer></answer>.",
        ("wrong", "parse"),
        "ask for a short span of the passage, the form the gold answers take",
    ),
    PromptEdit(
        "context-label",
        "\\nPassage: {",
        "\\nRead this passage. Passage: {",
        ("wrong",),
        "point the model at the passage",
    ),
)
