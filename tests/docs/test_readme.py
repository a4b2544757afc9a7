"""The README's promises that can be checked mechanically: every repository path it names exists,
every `whale ...` command it shows uses a real subcommand and real options, every `make` target and
shipped harness or config name exists."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from harnesses.loader import shipped_harnesses
from whale_train.cli import build_parser
from whale_train.trainer import shipped_configs

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
#: The README and the pages its sections moved to (the results, the contributor's page): held to the same checks.
USER_PAGES = README + "".join(
    (ROOT / p).read_text(encoding="utf-8") for p in ("docs/RESULTS.md", "CONTRIBUTING.md")
)
DOCS = {
    p: p.read_text(encoding="utf-8")
    for p in [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
}

TOP = ("whale_envs/", "whale_train/", "harnesses/", "configs/", "docs/", "benchmarks/", "tests/", "examples/")
PLACEHOLDER = re.compile(r"[<>{}*$]|\b[A-Z][A-Z_]{2,}\b|\.\.\.")


def code_spans(text: str) -> list[str]:
    fenced = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    return [line for block in fenced for line in block.splitlines()] + inline


def repo_paths(text: str) -> set[str]:
    links = re.findall(r"\]\(([^)#\s]+)\)", text)
    words = [w.strip("`'\",:;()") for span in code_spans(text) for w in span.split()]
    return {w for w in links + words if w.startswith(TOP) and not PLACEHOLDER.search(w)}


def archived_names() -> set[str]:
    """Every path inside ``benchmarks/results.tar.xz`` (the run records ``make results`` unpacks), its
    folders included, as the docs name them (``benchmarks/results/...``)."""
    import tarfile

    names: set[str] = set()
    with tarfile.open(ROOT / "benchmarks" / "results.tar.xz", "r:xz") as tar:
        for name in tar.getnames():
            parts = name.split("/")
            names.update("benchmarks/results/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1))
    return names


@pytest.mark.parametrize("doc", sorted(DOCS), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_named_in_the_docs_exists(doc):
    base = doc.parent
    missing = []
    archived = archived_names()  # a fresh clone has them only in the archive
    for path in sorted(repo_paths(DOCS[doc])):
        file, _, test = path.partition("::")  # a pytest node id: the file, and the test defined in it
        if not test and file.rstrip("/") in archived:
            continue
        found = next((f for f in (ROOT / file, base / file) if f.exists()), None)
        if found is None or (test and f"def {test.split('[')[0]}(" not in found.read_text()):
            missing.append(path)
    assert not missing, f"{doc.name} names paths that do not exist: {missing}"


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def whale_commands(text: str) -> list[list[str]]:
    commands = []
    for span in code_spans(text):
        line = span.split("#")[0].strip()
        for part in re.split(r"\s(?:&&|\|\||;)\s", line):
            part = part.strip()
            if part.startswith("whale ") or part.startswith("$(BIN)/whale "):
                try:
                    commands.append(shlex.split(part.replace("$(BIN)/", ""))[1:])
                except ValueError:
                    continue
    return commands


def test_readme_whale_commands_use_real_subcommands_and_options():
    subs = _subcommands()
    commands = whale_commands(USER_PAGES) + whale_commands((ROOT / "Makefile").read_text())
    assert len(commands) >= 10
    bad = []
    for argv in commands:
        if not argv or argv[0].startswith("-") or argv[0].isupper():
            continue
        if argv[0] not in subs:
            bad.append(" ".join(argv))
            continue
        known = {o for a in subs[argv[0]]._actions for o in a.option_strings}
        for word in argv[1:]:
            flag = word.strip("[]").split("=")[0]
            if flag.startswith("--") and flag not in known:
                bad.append(f"{' '.join(argv)}: {flag}")
    assert not bad, bad


def test_readme_make_targets_harnesses_and_configs_exist():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, flags=re.M))
    for target in re.findall(r"`make ([\w-]+)`", USER_PAGES):
        assert target in targets, target
    shipped = set(shipped_harnesses())
    for name in re.findall(r"`((?:chess_puzzles|math|search_qa)/\w+)`", USER_PAGES):
        assert name in shipped, name
    for name in re.findall(r"`whale train ([a-z][\w/-]*)`", USER_PAGES):
        assert name in shipped_configs(), name
