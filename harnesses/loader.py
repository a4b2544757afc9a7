"""Find, read and validate harness code: ``load_harness("chess_puzzles/h0")`` or ``load_harness("my.py")``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harnesses.validate import (
    HarnessValidationError,
    ValidationReport,
    load_class,
    shipped_harnesses,
    validate_source,
)

PACKAGE_DIR = Path(__file__).resolve().parent
__all__ = ["PACKAGE_DIR", "HarnessRef", "harness_from_source", "load_harness", "shipped_harnesses"]


@dataclass(frozen=True)
class HarnessRef:
    """Harness code ready to run: validated source, its class name, and whether it ships with the package.

    Only ``shipped`` harnesses may run in the trusted process (and only when asked); everything else
    runs in a sandboxed worker process.
    """

    name: str
    source: str
    filename: str
    class_name: str
    shipped: bool

    def load_trusted(self) -> type:
        if not self.shipped:
            raise HarnessValidationError(
                f"{self.filename}: trusted in-process execution is only for harnesses shipped with the package"
            )
        return load_class(self.source, self.filename, restricted=False)


def load_harness(spec: str | Path, name: str | None = None) -> HarnessRef:
    """Read and validate a harness from a file path or a shipped name (``domain/name``).

    Raises ``HarnessValidationError`` (the rule and the line) or ``FileNotFoundError``.
    """
    path = Path(spec)
    if not path.suffix:
        candidate = PACKAGE_DIR / f"{spec}.py"
        if candidate.exists():
            path = candidate
    if not path.exists():
        known = ", ".join(shipped_harnesses())
        raise FileNotFoundError(f"no harness file {str(spec)!r} (shipped harnesses: {known})")
    source = path.read_text(encoding="utf-8")
    resolved = path.resolve()
    shipped = PACKAGE_DIR in resolved.parents and resolved.parent != PACKAGE_DIR
    label = f"{resolved.parent.name}/{resolved.stem}" if shipped else str(spec)
    report: ValidationReport = validate_source(source, label)
    return HarnessRef(name or label, source, label, report.class_name, shipped)


def harness_from_source(source: str, name: str = "candidate") -> HarnessRef:
    """A harness from source text (a proposer's candidate): validated, never shipped."""
    report = validate_source(source, name)
    return HarnessRef(name, source, name, report.class_name, False)
