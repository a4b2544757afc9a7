"""The programs the proposer's jail runs, as modules: the jail's server (:mod:`.jail_server`), the split
guard appended to the SDK's ``tasks.py`` (:mod:`.jail_split`) and the Claude Code launcher
(:mod:`.claude_code_launcher`), each tested outside a jail, piece by piece."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from whale_train.meta_harness import claude_code_launcher, jail_server, jail_split
from whale_train.meta_harness.claude_code import LAUNCHER
from whale_train.meta_harness.jail import NO_TEST_SPLIT, SERVER, sdk_copy


def no_sweep() -> int:  # outside a jail a sweep would signal every process of the user
    return 0


def test_the_jail_runs_the_modules_text():
    assert SERVER == Path(jail_server.__file__).read_text(encoding="utf-8")
    assert LAUNCHER == Path(claude_code_launcher.__file__).read_text(encoding="utf-8")
    assert NO_TEST_SPLIT.endswith(Path(jail_split.__file__).read_text(encoding="utf-8"))
    for text in (SERVER, LAUNCHER):
        compile(text, "main.py", "exec")


def test_the_server_imports_nothing_outside_the_standard_library():
    """The jail's interpreter starts with -S: the server and the launcher must run without site-packages."""
    for module in (jail_server, claude_code_launcher):
        code = f"import runpy; runpy.run_path({module.__file__!r}, run_name='not_main'); print('ok')"
        out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True)
        assert out.stdout.strip() == "ok", out.stderr


def test_command_env_puts_the_sdk_first_and_home_in_the_scratch():
    env = jail_server.command_env(
        {"PYTHONPATH": "/a", "PATH": "/usr/bin", "PYTHONDONTWRITEBYTECODE": "1"}, "/s"
    )
    assert env["PYTHONPATH"] == os.pathsep.join(["/sdk", "/a"]) and env["HOME"] == "/s"
    assert env["PATH"] == "/sandbox/bin:/usr/bin" and "PYTHONDONTWRITEBYTECODE" not in env
    assert jail_server.command_env({})["PYTHONPATH"] == "/sdk"


@pytest.mark.parametrize("rel", ["../x", "/etc/passwd", "a/../../x", "..", "a/../../scratch2/x"])
def test_inside_refuses_paths_out_of_the_scratch(rel):
    with pytest.raises(ValueError, match="outside the scratch folder"):
        jail_server.inside(rel, "/sandbox/scratch")


def test_inside_keeps_paths_in_the_scratch():
    assert jail_server.inside("a/./b/../c.txt", "/s") == "/s/a/c.txt"
    assert jail_server.inside(".", "/s") == "/s"


def test_put_get_and_errors_answer_with_the_nonce(tmp_path):
    scratch = str(tmp_path)

    def ask(**req):
        return jail_server.answer({**req, "nonce": "n1"}, {}, scratch, no_sweep)

    assert ask(op="put", path="d/f.txt", text="héllo") == {"ok": True, "nonce": "n1"}
    assert (tmp_path / "d" / "f.txt").read_text(encoding="utf-8") == "héllo"
    assert ask(op="get", path="d/f.txt", max=3)["text"] == "hél"
    assert ask(op="get", path="missing", max=10) == {"text": None, "nonce": "n1"}
    assert ask(op="get", path="d", max=10)["text"] is None  # a folder is not a file
    assert ask(op="put", path="../out", text="x")["error"] == "ValueError: outside the scratch folder"
    assert ask(op="nope") == {"error": "unknown op", "nonce": "n1"}
    assert ask()["error"].startswith("KeyError")
    assert not (tmp_path.parent / "out").exists()


def test_run_reports_output_exit_status_and_limits(tmp_path):
    env = jail_server.command_env(os.environ, str(tmp_path))
    base = {"op": "run", "wall_s": 20, "cpu_s": 20, "output_bytes": 10_000, "nonce": 7}

    def run(command, **req):
        return jail_server.answer({**base, "command": command, **req}, env, str(tmp_path), no_sweep)

    a = run("pwd; echo err >&2; exit 3")
    assert a["output"] == f"{tmp_path}\nerr\n" and a["exit"] == 3 and a["limit"] is None
    assert a["nonce"] == 7 and a["swept"] == 0 and a["wall_s"] >= 0
    assert run("yes x", output_bytes=1000)["limit"] == "output"
    assert run("sleep 5", wall_s=0.3)["limit"] == "wall"
    assert run("while :; do :; done", cpu_s=1, wall_s=15)["limit"] == "cpu"
    assert run("echo $HOME")["output"].strip() == str(tmp_path)


def test_serve_answers_one_line_per_request(tmp_path):
    requests = [
        {"op": "put", "path": "a", "text": "1", "nonce": 1},
        {"op": "get", "path": "a", "max": 9, "nonce": 2},
    ]
    out = io.StringIO()
    jail_server.serve([json.dumps(r) + "\n" for r in requests], out, {}, str(tmp_path), no_sweep)
    answers = [json.loads(line) for line in out.getvalue().splitlines()]
    assert answers == [{"ok": True, "nonce": 1}, {"text": "1", "nonce": 2}]


def test_split_guard_refuses_the_held_out_splits():
    assert jail_split.check_split("train") == "train"
    for split in ("test", "all"):
        with pytest.raises(ValueError, match="not available in the proposer's jail"):
            jail_split.check_split(split)
    with pytest.raises(ValueError, match="unknown split"):
        jail_split.check_split("nope")


def test_the_sdk_copy_refuses_the_held_out_splits(tmp_path):
    sdk = sdk_copy(tmp_path / "sdk")
    code = (
        "import whale_envs.tasks as t, whale_envs.text_env as e\n"
        "assert e.check_split is t.check_split and t.check_split('harness') == 'harness'\n"
        "try:\n    t.split_ids(None, 'test')\nexcept ValueError as exc:\n    print(exc)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(sdk)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.stdout.strip() == "split 'test' is not available in the proposer's jail", out.stderr


def test_session_env_points_the_cli_at_the_forwarder():
    env = claude_code_launcher.session_env({"PATH": "/bin", "ANTHROPIC_API_KEY": "real"}, 4321, "placeholder")
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:4321" and env["ANTHROPIC_API_KEY"] == "placeholder"
    assert env["PATH"] == "/bin" and env["HOME"] == claude_code_launcher.HOME
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"


def test_read_stream_counts_tools_failed_bash_calls_and_keeps_the_result():
    def tool_use(i, name):
        return {"type": "tool_use", "id": i, "name": name}

    lines = [
        "not json",
        json.dumps([1, 2]),
        json.dumps({"type": "assistant", "message": "odd"}),
        json.dumps(
            {"type": "assistant", "message": {"content": [tool_use("a", "Bash"), tool_use("b", "Read")]}}
        ),
        json.dumps({"type": "assistant", "message": {"content": [tool_use("c", "Bash")]}}),
        json.dumps(
            {
                "type": "user",
                "message": {
                    "content": [
                        {"type": "tool_result", "tool_use_id": "a", "is_error": True},
                        {"type": "tool_result", "tool_use_id": "b", "is_error": True},  # not Bash
                        {"type": "tool_result", "tool_use_id": "c"},
                    ]
                },
            }
        ),
        json.dumps({"type": "result", "num_turns": 2}),
    ]
    seen = claude_code_launcher.read_stream(lines)
    assert seen == {
        "tools": {"Bash": 2, "Read": 1},
        "bash_failed": 1,
        "result": {"type": "result", "num_turns": 2},
    }
