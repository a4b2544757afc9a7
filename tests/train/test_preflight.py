"""``whale train CONFIG --check`` and the same checks at the start of a run (whale_train/preflight.py):
every problem of a config in one call, one line each with its fix, exit 2, no traceback and no run
folder; a clean config exits 0 and writes nothing. Also the ``retriever=`` option of every search file
source, which the checks read."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from whale_train.preflight import preflight, retriever_urls
from whale_train.trainer import TrainConfig


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def whale_train(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``whale train ARGS`` in ``tmp_path`` with an empty Hugging Face cache and no API keys."""
    clean = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    clean.update(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf-home"), **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "whale_train.cli", "train", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=clean,
    )


def write(tmp_path: Path, name: str, data: dict) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


MATH = {
    "name": "pf-math",
    "env": "whale/Math-v0",
    "tasks": "dapo:data/math/dapo.parquet",
    "model": "SomeOrg/NotCached-2B",
    "backend": "vllm",
    "eval": {"tasks": ["aime:data/math/aime2024.parquet", "aime:data/math/aime2025.parquet?year=2025"]},
}


def errors_of(proc: subprocess.CompletedProcess) -> list[str]:
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text, text[-3000:]
    return [line for line in text.splitlines() if line.strip()]


def assert_nothing_written(tmp_path: Path, before: set[str]) -> None:
    assert {p.name for p in tmp_path.iterdir()} == before  # no run folder, no runs/, no cache


def test_check_lists_every_problem_of_a_math_config_in_one_call(tmp_path):
    config = write(tmp_path, "math.yaml", MATH)
    before = {p.name for p in tmp_path.iterdir()}
    proc = whale_train(tmp_path, str(config), "--check", "--out", "run")
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = errors_of(proc)
    assert all(line.startswith("error: ") and "; fix: " in line for line in lines), lines
    by_check = {line.split(":")[1].strip() for line in lines}
    assert by_check == {"tasks", "eval", "model", "backend"}, lines
    assert sum("aime202" in line for line in lines) == 2  # each missing test file, once
    assert any("dapo.parquet" in line and "file not found" in line for line in lines)
    assert any("NotCached-2B" in line and "Hugging Face cache" in line for line in lines)
    assert any("vLLM is not installed" in line for line in lines) or _has_vllm()
    assert_nothing_written(tmp_path, before)


def _has_vllm() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def test_a_run_that_would_fail_does_the_same_checks_first_and_leaves_no_run_folder(tmp_path):
    config = write(tmp_path, "math.yaml", MATH)
    before = {p.name for p in tmp_path.iterdir()}
    proc = whale_train(tmp_path, str(config), "--out", "run", "--no-report")
    assert proc.returncode == 2
    lines = errors_of(proc)
    assert len(lines) >= 4 and all(line.startswith("error: ") for line in lines), lines
    assert_nothing_written(tmp_path, before)


def test_check_json_is_one_object(tmp_path):
    config = write(tmp_path, "math.yaml", MATH)
    proc = whale_train(tmp_path, str(config), "--check", "--json")
    assert proc.returncode == 2
    report = json.loads(proc.stdout)
    assert report["ok"] is False
    assert {p["check"] for p in report["problems"]} >= {"tasks", "eval", "model"}
    assert all(p["what"] and p["fix"] for p in report["problems"])


def test_a_config_that_does_not_load_is_one_problem_under_check_json(tmp_path):
    config = write(tmp_path, "bad.yaml", {**MATH, "budgett_rollouts": 5})
    proc = whale_train(tmp_path, str(config), "--check", "--json")
    assert proc.returncode == 2
    report = json.loads(proc.stdout)
    assert [p["check"] for p in report["problems"]] == ["config"] and "budget" in report["problems"][0][
        "what"
    ]


def test_search_config_names_the_retriever_and_the_judge_key(tmp_path):
    url = f"http://127.0.0.1:{closed_port()}/retrieve"
    data = {
        "name": "pf-search",
        "env": "whale/SearchQA-v0",
        "tasks": f"hotpotqa?retriever={url}",
        "env_options": {
            "judge": {
                "base_url": "https://judge.example.com/v1",
                "model": "j",
                "api_key_env": "PF_JUDGE_API_KEY",
            }
        },
        "eval": {"tasks": f"searchr1:data/test.parquet?retriever={url}"},
    }
    config = write(tmp_path, "search.yaml", data)
    before = {p.name for p in tmp_path.iterdir()}
    proc = whale_train(tmp_path, str(config), "--check")
    assert proc.returncode == 2
    lines = errors_of(proc)
    assert len(lines) == 3, lines
    retriever, judge, test = (
        next(x for x in lines if x.startswith(f"error: {c}:")) for c in ("retriever", "judge", "eval")
    )
    assert url in retriever and "whale retriever serve" in retriever
    assert "$PF_JUDGE_API_KEY is not set" in judge and "export PF_JUDGE_API_KEY" in judge
    assert "data/test.parquet" in test
    assert_nothing_written(tmp_path, before)


class _Retriever(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        body = json.dumps({"result": [[{"document": {"id": "1", "contents": '"T"\ntext'}, "score": 1.0}]]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def retriever():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Retriever)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/retrieve"
    server.shutdown()


def test_a_search_config_with_its_services_in_place_passes(tmp_path, retriever):
    data = {
        "name": "pf-search-ok",
        "env": "whale/SearchQA-v0",
        "tasks": f"hotpotqa?retriever={retriever}",
        "env_options": {
            "judge": {
                "base_url": "https://judge.example.com/v1",
                "model": "j",
                "api_key_env": "PF_JUDGE_API_KEY",
            }
        },
    }
    config = write(tmp_path, "search.yaml", data)
    before = {p.name for p in tmp_path.iterdir()}
    proc = whale_train(tmp_path, str(config), "--check", env={"PF_JUDGE_API_KEY": "x"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = proc.stdout
    assert f"retriever: {retriever} answers" in text and "key in $PF_JUDGE_API_KEY" in text
    assert "checks passed" in text
    assert_nothing_written(tmp_path, before)


def test_chess_config_with_a_missing_puzzle_file(tmp_path):
    data = {"name": "pf-chess", "env": "whale/Chess-v0", "tasks": "lichess:data/chess/puzzles.csv.zst"}
    config = write(tmp_path, "chess.yaml", data)
    proc = whale_train(tmp_path, str(config), "--check")
    assert proc.returncode == 2
    lines = errors_of(proc)
    assert len(lines) == 1 and lines[0].startswith("error: tasks: lichess:") and "puzzles.csv.zst" in lines[0]


def test_the_smoke_config_passes_and_says_what_it_checked(tmp_path):
    before = {p.name for p in tmp_path.iterdir()}
    proc = whale_train(tmp_path, "smoke", "--check", "--out", "run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in ("env", "harness", "tasks", "eval", "model", "backend", "trackers", "run folder"):
        assert f"\n{name}: " in "\n" + proc.stdout, proc.stdout
    assert_nothing_written(tmp_path, before)


# ------------------------------------------------------------------ in process: the checks themselves


def test_an_openai_backend_without_a_tokenizer_is_refused_for_a_scoring_harness():
    from whale_train.llm import SHIPPED_MODEL

    sets = ["backend=openai", "base_url=http://127.0.0.1:9/v1", "model=served", "method=harness-only"]
    chess = ["env=whale/Chess-v0", "harness=chess_puzzles/choose", "tasks=generated?difficulty=1&size=40"]
    config = TrainConfig.load(None, [*sets, *chess])
    problems = preflight(config).problems
    assert [p.check for p in problems] == ["scoring"], problems
    assert "model error" in problems[0].what and "llm.choose" in problems[0].what
    assert "backend_options.tokenizer" in problems[0].fix
    with_tokenizer = TrainConfig.load(
        None, [*sets, *chess, f"backend_options={{tokenizer: {SHIPPED_MODEL}}}"]
    )
    assert preflight(with_tokenizer).ok
    sampling = TrainConfig.load(None, [*sets, "tasks=generated?difficulty=1&size=40"])  # math/h0 only samples
    assert preflight(sampling).ok


def test_a_run_folder_that_holds_a_run_is_a_problem_unless_resumed(tmp_path):
    (tmp_path / "state.json").write_text("{}")
    config = TrainConfig.load("smoke")
    assert [p.check for p in preflight(config, tmp_path).problems] == ["run folder"]
    assert preflight(config, tmp_path, resume=True).ok


def test_a_start_that_fails_in_the_engine_is_one_line_and_leaves_no_run_folder(tmp_path, monkeypatch, capsys):
    from whale_train.cli import main
    from whale_train.trainer import Run

    def engine_fails(self):
        raise RuntimeError("the vllm backend needs vLLM: pip install it\nmore detail")

    monkeypatch.setattr(Run, "_load_llm", engine_fails)
    out = tmp_path / "run"
    assert main(["train", "smoke", "--out", str(out), "--no-report"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == ["error: the vllm backend needs vLLM: pip install it"], err
    assert not out.exists()


def test_a_problem_in_one_check_does_not_hide_another(monkeypatch):
    from whale_train import preflight as pf

    def broken(ctx):
        raise KeyError("boom")
        yield  # pragma: no cover

    monkeypatch.setitem(pf.CHECKS, "broken", broken)
    config = TrainConfig.load(None, ["tasks=generated?difficulty=1&size=40", "model=/no/such/model"])
    checks = [p.check for p in preflight(config).problems]
    assert checks == ["model", "broken"], checks


# ------------------------------------------------------------------ retriever= on every search file source


def test_every_search_file_source_takes_retriever():
    import gymnasium as gym

    from whale_envs.data import bundled_path
    from whale_envs.tasks import TaskSourceError

    url = "http://127.0.0.1:9/retrieve"
    nq = bundled_path("nq_open", "NQ-open.dev.jsonl")
    for spec in (f"hotpotqa?retriever={url}", f"musique?retriever={url}", f"nq:{nq}?retriever={url}"):
        env = gym.make("whale/SearchQA-v0", tasks=spec, split="all").unwrapped
        task = env.source.get(env.task_ids[0])
        assert task.payload.retriever == url and env.source.name.endswith(f"retriever={url}")
        env.reset(seed=0)
        assert env.retriever.url == url  # the env searches the server, as with --env-option retriever=URL
    plain = gym.make("whale/SearchQA-v0", tasks="hotpotqa", split="all").unwrapped
    assert plain.source.get(plain.task_ids[0]).payload.retriever is None  # the cached source is untouched
    with pytest.raises(TaskSourceError, match="retriever must be a URL"):
        gym.make("whale/SearchQA-v0", tasks="hotpotqa?retriever=nope", split="all")
    config = TrainConfig.load(
        None,
        ["env=whale/SearchQA-v0", f"tasks=hotpotqa?retriever={url}", "env_options={retriever: http://h:1/r}"],
    )
    assert retriever_urls(config) == ["http://h:1/r", url]
