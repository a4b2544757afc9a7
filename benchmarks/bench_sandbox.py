"""The cost of one sandboxed Python call, old path against new, side by side in one process.

``run_python`` hands a namespaced call to the fork server (one boot interpreter started once, whose
child builds each call's jail); ``fork_server=False`` starts a fresh boot interpreter per call, as
every call did before. Both build the same jail and run the code in a freshly exec'd interpreter.
Rounds are interleaved so machine load affects both alike; the figures are medians and their ratio
(``make bench`` prints them, ``--benchmark-json`` keeps them in extra_info); no test has a time limit.

The floor: the same interpreter started bare on a file (``python -S -B -u main.py``, no jail), which
any design that keeps a fresh interpreter per call pays.
"""

from __future__ import annotations

import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from benchmarks.reporting import report
from whale_envs.sandbox import Limits, _boot_python, run_python

LIMITS = Limits(isolation="namespaces")
CALLS = {
    "trivial": "print(2**10)",
    "calculator": "print((48 / 2) * 3 + 17 - 5 % 3)",  # what math/calculator sends: print(<expression>)
}


def timed(fn, *args, **kwargs) -> tuple[float, object]:
    start = time.perf_counter()
    value = fn(*args, **kwargs)
    return time.perf_counter() - start, value


@pytest.mark.benchmark(group="sandbox")
@pytest.mark.parametrize("kind", sorted(CALLS))
def test_fork_server_vs_fresh_boot_interpreter(benchmark, kind):
    code = CALLS[kind]
    rounds = 3 if benchmark.disabled else 40  # `make test` only checks that it runs
    expected = run_python(code, LIMITS, fork_server=False)  # also starts the server's probe
    assert expected.ok
    run_python(code, LIMITS)  # the server is started once per process; not part of a call
    with tempfile.TemporaryDirectory() as tmp:
        bare_file = Path(tmp, "main.py")
        bare_file.write_text(code)
        bare = [_boot_python(), "-S", "-B", "-u", str(bare_file)]
        times: dict[str, list[float]] = {"fresh": [], "served": [], "bare": []}
        for _ in range(rounds):
            for name in times:
                if name == "bare":
                    seconds, _ = timed(subprocess.run, bare, stdout=subprocess.DEVNULL, check=True)
                else:
                    seconds, result = timed(run_python, code, LIMITS, fork_server=name == "served")
                    assert (result.stdout, result.exit_code, result.limit) == (
                        expected.stdout,
                        expected.exit_code,
                        expected.limit,
                    )
                times[name].append(seconds)
    med = {name: statistics.median(xs) * 1000 for name, xs in times.items()}
    report(
        benchmark,
        f"sandbox call ({kind}, {rounds} interleaved rounds, median ms)",
        fresh_boot_ms=med["fresh"],
        fork_server_ms=med["served"],
        bare_interpreter_ms=med["bare"],
        speedup=med["fresh"] / med["served"],
        fork_server_over_bare=med["served"] / med["bare"],
    )
    assert min(med.values()) > 0
