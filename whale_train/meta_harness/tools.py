"""Read-only file tools over the archive folder, for the LLM proposer.

``list_files``, ``read_file`` and ``grep`` see the archive folder and nothing else: a path is resolved
(symbolic links included) and refused unless it stays inside the folder; hidden entries (the staging
area, temporary files) are invisible. The archive holds only ``harness``-split scores and traces; the
``test`` split's results are written elsewhere, so they are out of reach too.
"""

from __future__ import annotations

import re
from pathlib import Path

TEXT_SUFFIXES = (".py", ".json", ".jsonl", ".md", ".txt")


class ToolError(ValueError):
    """A refused tool call; the message goes back to the proposer."""


class ArchiveTools:
    def __init__(self, root: str | Path, max_chars: int = 20_000, max_matches: int = 100):
        self.root = Path(root).resolve()
        self.max_chars = max_chars
        self.max_matches = max_matches

    def resolve(self, path: str) -> Path:
        """``path`` (relative to the archive) as an absolute path inside it, or ``ToolError``."""
        if not isinstance(path, str) or "\x00" in path:
            raise ToolError("path must be a string")
        path = path.strip() or "."
        if path.startswith(("/", "~")):
            raise ToolError(f"{path!r}: paths are relative to the archive folder")
        target = (self.root / path).resolve()
        if target != self.root and self.root not in target.parents:
            raise ToolError(f"{path!r} is outside the archive folder")
        if any(part.startswith(".") for part in target.relative_to(self.root).parts):
            raise ToolError(f"{path!r} is not part of the archive")
        if not target.exists():
            raise ToolError(f"{path!r} does not exist")
        return target

    def _inside(self, p: Path) -> bool:
        """Whether ``p`` (a link followed to its target) is a visible part of the archive."""
        target = p.resolve()
        if target != self.root and self.root not in target.parents:
            return False
        return not any(part.startswith(".") for part in p.relative_to(self.root).parts)

    def _rel(self, p: Path) -> str:
        return str(p.relative_to(self.root)) or "."

    def list_files(self, path: str = ".") -> str:
        """The entries of a folder (folders end with /, files show their size)."""
        folder = self.resolve(path)
        if not folder.is_dir():
            raise ToolError(f"{path!r} is a file; use read_file")
        lines = []
        for p in sorted(folder.iterdir()):
            if not self._inside(p):
                continue
            lines.append(f"{self._rel(p)}/" if p.is_dir() else f"{self._rel(p)}  ({p.stat().st_size} bytes)")
        return "\n".join(lines) or "(empty)"

    def read_file(self, path: str, offset: int = 0, length: int | None = None) -> str:
        """Characters ``offset`` .. ``offset + length`` of a text file (at most ``max_chars``)."""
        file = self.resolve(path)
        if file.is_dir():
            raise ToolError(f"{path!r} is a folder; use list_files")
        text = file.read_text(encoding="utf-8", errors="replace")
        offset = max(0, int(offset or 0))
        length = min(self.max_chars, int(length or self.max_chars))
        chunk = text[offset : offset + length]
        rest = len(text) - offset - len(chunk)
        if rest > 0:
            chunk += f"\n[... {rest} more characters; continue with offset={offset + len(chunk)}]"
        return chunk

    def grep(self, pattern: str, path: str = ".") -> str:
        """Lines matching a regular expression in the text files under ``path``: ``file:line: text``."""
        try:
            regex = re.compile(str(pattern)[:500])
        except re.error as exc:
            raise ToolError(f"bad regular expression: {exc}") from None
        base = self.resolve(path)
        files = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file())
        out = []
        for file in files:
            rel = file.relative_to(self.root)
            if not self._inside(file) or file.suffix not in TEXT_SUFFIXES:
                continue
            with open(file, encoding="utf-8", errors="replace") as fh:
                for n, line in enumerate(fh, 1):
                    if regex.search(line[:5000]):
                        out.append(f"{rel}:{n}: {line.rstrip()[:300]}")
                        if len(out) >= self.max_matches:
                            return "\n".join(out) + f"\n[stopped at {self.max_matches} matches]"
        return "\n".join(out) or "(no match)"
