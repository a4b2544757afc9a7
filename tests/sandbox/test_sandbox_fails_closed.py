"""Red team, the OS sandbox: it works (or refuses) wherever the checkout lies, and never fails open.

Each test is one attack or one configuration an attacker could rely on; each asserts containment.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sandbox_script import LOAD_SANDBOX
from whale_envs import sandbox
from whale_envs.sandbox import IsolationUnavailable, Limits, config, policy, run_python, spawn_python

# `make test` runs the jail and sandbox-pool tests on one worker, one after another (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("sandbox")

PROJECT = Path(__file__).resolve().parents[2]
JAILED = Limits(wall_s=5, cpu_s=3, memory_mb=256, isolation="namespaces")

# Runs under the interpreter of a layout built in the temp directory: loads the sandbox module by path
# (it needs the standard library only) and reports what jailed code can and cannot do.
_LAYOUT_SCRIPT = (
    LOAD_SANDBOX
    + r"""
code = '''
import os, sys
import layout_marker
out = [layout_marker.VALUE, sys.executable]
with open("/tmp/scratch.txt", "w") as fh:
    fh.write("x")
out.append(open("/sandbox/scratch.txt").read())
out.append(os.path.exists("/etc/passwd"))
out.append(os.getuid())
try:
    open(layout_marker.__file__, "a")
    out.append("writable")
except OSError:
    out.append("read-only")
print(repr(out))
'''
r = sb.run_python(code, sb.Limits(wall_s=10, cpu_s=5, isolation="namespaces"))
print(json.dumps({"problem": sb.isolation_problem(), "isolation": r.isolation, "stdout": r.stdout,
                  "stderr": r.stderr, "error": r.error, "python": sys.executable, "site": sys.modules["whale_envs.sandbox.config"].site_dirs()}))
"""
)


def test_isolation_works_with_the_interpreter_and_packages_under_the_temp_directory(tmp_path):
    """The layout of a clone under the temp directory: the interpreter and the installed packages both
    lie under /tmp. Bind-mounting them used to create the jail's /tmp before its symlink, so the
    sandbox could not be built there and everything ran unisolated."""
    base = Path(sys._base_executable if hasattr(sys, "_base_executable") else sys.executable).resolve()
    bindir = tmp_path / "python" / "bin"
    bindir.mkdir(parents=True)
    shutil.copy2(base, bindir / base.name)  # the binary itself under the temp dir (stdlib via its prefix)
    venv = tmp_path / "venv"
    subprocess.run([str(bindir / base.name), "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "layout_marker.py").write_text("VALUE = 'from the temp-dir site-packages'\n")
    done = subprocess.run(
        [str(python), "-I", "-c", _LAYOUT_SCRIPT, str(PROJECT)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert str(tmp_path) in report["python"] and any(str(tmp_path) in s for s in report["site"])
    assert report["problem"] is None, report
    assert report["isolation"] == "namespaces", report
    values = eval(report["stdout"])  # noqa: S307 - our own repr() of a list of plain values
    assert values[0] == "from the temp-dir site-packages"
    assert values[2] == "x"  # /tmp is the private working directory
    assert values[3] is False  # no host /etc
    assert values[4] != 0 or os.geteuid() != 0  # never uid 0 on the host
    assert values[5] == "read-only"


def test_isolation_problem_names_the_cause_and_the_answer_is_per_configuration():
    assert sandbox.isolation_problem(True) is None and sandbox.isolation_problem(False) is None
    assert sandbox.isolation_available()
    assert sandbox.isolation_label() == "namespaces"
    key = next(iter(policy._PROBES))
    assert len(key) == 4  # interpreter, packages or not, the package dirs, the uid


@pytest.fixture
def broken_namespaces(monkeypatch):
    """A machine where the jail cannot be built (the probe's real answer replaced by a failure)."""
    monkeypatch.setattr(
        policy, "isolation_problem", lambda site_packages=True: "unshare: Operation not permitted"
    )
    monkeypatch.delenv(sandbox.OPT_IN_ENV, raising=False)


def test_without_isolation_model_code_refuses_to_run_and_names_the_opt_in(broken_namespaces, tmp_path):
    marker = tmp_path / "ran"
    result = run_python(f"open({str(marker)!r}, 'w').write('x')", Limits(wall_s=5))
    assert result.limit == "setup" and not marker.exists()
    assert "unshare: Operation not permitted" in result.error
    assert sandbox.OPT_IN_FLAG in result.error and sandbox.OPT_IN_ENV in result.error
    with pytest.raises(IsolationUnavailable, match="WHALE_ALLOW_UNISOLATED"):
        spawn_python("print(1)", Limits(wall_s=5))
    with pytest.raises(IsolationUnavailable, match="--allow-unisolated"):
        sandbox.require_isolation("the harness")
    assert sandbox.isolation_label() == "unavailable"


def test_explicit_isolation_none_needs_the_opt_in_too(monkeypatch, tmp_path):
    monkeypatch.delenv(sandbox.OPT_IN_ENV, raising=False)
    marker = tmp_path / "ran"
    result = run_python(f"open({str(marker)!r}, 'w')", Limits(wall_s=5, isolation="none"))
    assert result.limit == "setup" and not marker.exists() and sandbox.OPT_IN_ENV in result.error


def test_under_the_opt_in_it_runs_labelled_and_never_as_root(broken_namespaces, monkeypatch):
    monkeypatch.setenv(sandbox.OPT_IN_ENV, "1")
    assert sandbox.require_isolation() == sandbox.UNISOLATED_LABEL
    assert sandbox.isolation_label() == sandbox.UNISOLATED_LABEL
    result = run_python("import os; print(os.getuid())", Limits(wall_s=5))
    if result.limit == "setup":  # the interpreter lies where an unprivileged uid cannot read it
        assert "never runs as uid 0" in result.error
    else:
        assert result.isolation == "none" and result.stdout.strip() != "0" or os.geteuid() != 0


def test_fallback_refuses_root_when_the_interpreter_is_unreadable(broken_namespaces, monkeypatch):
    monkeypatch.setenv(sandbox.OPT_IN_ENV, "1")
    monkeypatch.setattr(config, "_world_readable", lambda path: False)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    result = run_python("print('ran')", Limits(wall_s=5))
    assert result.limit == "setup" and "never runs as uid 0" in result.error and "ran" not in result.stdout


def test_tool_code_cannot_import_the_project_or_read_its_answers():
    code = (
        "import sys, os\n"
        "hits = []\n"
        "for name in ('whale_envs', 'whale_train', 'harnesses'):\n"
        "    try:\n"
        "        __import__(name); hits.append(name)\n"
        "    except ImportError:\n"
        "        pass\n"
        f"hits.append(os.path.exists({str(PROJECT / 'whale_envs' / 'math' / 'verify.py')!r}))\n"
        f"hits.append(os.path.exists({str(PROJECT / 'whale_envs' / 'data')!r}))\n"
        "print(hits)\n"
    )
    result = run_python(code, Limits(wall_s=10, cpu_s=5, isolation="namespaces"))
    assert result.isolation == "namespaces"
    assert result.stdout.strip() == "[False, False]", result.stdout + result.stderr


def test_whale_eval_refuses_with_one_line_and_labels_a_run_under_the_opt_in(
    broken_namespaces, tmp_path, capsys
):
    from whale_train.cli import main

    argv = ["eval", "--env", "whale/Math-v0", "--harness", "math/h0", "--limit", "1", "--k", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert (
        len(err.splitlines()) == 1 and "--allow-unisolated" in err and "unshare" in err and "math/h0" in err
    )
    assert main([*argv, "--trusted", "--out", str(tmp_path), "--allow-unisolated"]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["isolation"] == sandbox.UNISOLATED_LABEL
    sandbox.allow_unisolated(False)  # the flag set it for this process; a later command without it refuses
    assert main(["check", "--env", "whale/Chess-v0", "--harness", "chess_puzzles/h0", "--n-tasks", "1"]) == 2
