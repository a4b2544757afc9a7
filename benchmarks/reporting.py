"""How a benchmark of ``make bench`` reports its figures: into pytest-benchmark's ``extra_info`` (kept by
``--benchmark-json``) and as one printed line, so ratios measured side by side are read in one place."""

from __future__ import annotations


def report(benchmark, name: str, **figures) -> None:
    benchmark.extra_info.update({k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items()})
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    print(
        f"\n{name}: "
        + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items())
    )
