"""Red team: the three trusted services an untrusted party talks to.

* the Claude Code relay (``meta_harness.claude_code.ApiRelay``): only the API's own routes and methods
  go out with the key (TRACE, other methods, dot segments, escapes and query tricks are refused and
  never reach the upstream); the key is masked in whatever the upstream answers; idle connections cost
  no thread and do not slow an honest request;
* the proposer's jail (``meta_harness.jail``): nothing a command starts outlives it (a ``setsid`` loop,
  a double-fork daemon);
* ``whale train --resume``: a checkpoint's ``rsft_state.pt`` is read without unpickling code; one that
  needs more is refused in one line unless ``--trust-state``.
"""

from __future__ import annotations

import os
import socket
import statistics
import threading
import time
from contextlib import closing
from pathlib import Path

import pytest

from whale_train.meta_harness.claude_code import PLACEHOLDER_KEY, ApiRelay

# `make test` runs the tests that time calls side by side on one worker, one after another
pytestmark = pytest.mark.xdist_group("timing")

KEY = "sk-ant-real-key-0123456789abcdefghijklmnopqrstuvwxyz"


# ------------------------------------------------------------------------------------------ the relay


class Upstream:
    """A fake API on 127.0.0.1 that records every request it receives and answers each with its
    own head echoed back (as TRACE would, or an error page quoting the request), after ``delay_s``."""

    def __init__(self, delay_s: float = 0.0):
        self.delay_s = delay_s
        self.received: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            self.received.append(data)
            head = data.partition(b"\r\n\r\n")[0]
            time.sleep(self.delay_s)
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nx-echo-key: " + _header(head, b"x-api-key") + b"\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n" % len(head) + head
            )

    def close(self) -> None:
        self.sock.close()


def _header(head: bytes, name: bytes) -> bytes:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip()
    return b""


def ask(relay: ApiRelay, raw: bytes, timeout: float = 10.0) -> bytes:
    """Send ``raw`` on the relay's socket (as the jail's forwarder does); the whole answer."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(timeout)
        s.connect(str(relay.path))
        s.sendall(raw)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer


def request(method: str, target: str, body: bytes = b"{}", extra: str = "") -> bytes:
    head = (
        f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1:1234\r\nx-api-key: {PLACEHOLDER_KEY}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n{extra}\r\n"
    )
    return head.encode("latin-1") + body


@pytest.fixture
def upstream():
    with closing(Upstream()) as up:
        yield up


@pytest.fixture
def relay(upstream):
    """A relay to ``upstream`` with the real key."""
    with closing(ApiRelay(upstream.url, KEY)) as relay:
        yield relay


def test_the_relay_forwards_the_api_routes_with_the_key_and_masks_it_in_the_answer(upstream, relay):
    ok = ask(relay, request("POST", "/v1/messages?beta=true", b'{"model": "m"}'))
    counted = ask(relay, request("POST", "/v1/messages/count_tokens?beta=true"))
    models = ask(relay, request("GET", "/v1/models/claude-sonnet-4-5", b""))
    assert all(a.startswith(b"HTTP/1.1 200") for a in (ok, counted, models))
    sent = [r.partition(b"\r\n")[0] for r in upstream.received]
    assert sent == [
        b"POST /v1/messages?beta=true HTTP/1.1",
        b"POST /v1/messages/count_tokens?beta=true HTTP/1.1",
        b"GET /v1/models/claude-sonnet-4-5 HTTP/1.1",
    ]
    for raw in upstream.received:  # the real key went out, once, the placeholder did not
        assert _header(raw, b"x-api-key") == KEY.encode() and raw.count(b"x-api-key") == 1
        assert PLACEHOLDER_KEY.encode() not in raw
        assert _header(raw, b"accept-encoding") == b"identity" and _header(raw, b"connection") == b"close"
    # the upstream echoed the key in a header and in the body: masked, lengths kept
    assert KEY.encode() not in ok and b"*" * len(KEY) in ok and ok.endswith(b"*" * len(KEY))
    assert relay.requests == [
        ("POST", "/v1/messages?beta=true"),
        ("POST", "/v1/messages/count_tokens?beta=true"),
        ("GET", "/v1/models/claude-sonnet-4-5"),
    ]


REFUSED = [
    ("TRACE", "/v1/messages"),
    ("TRACK", "/v1/messages"),
    ("CONNECT", "/v1/messages"),
    ("DELETE", "/v1/messages"),
    ("PUT", "/v1/messages"),
    ("OPTIONS", "*"),
    ("GET", "/v1/messages"),
    ("POST", "/v1/models"),
    ("POST", "/v1/../../admin/keys"),
    ("GET", "/v1/../../admin/keys"),
    ("POST", "/v1/%2e%2e/%2e%2e/admin/keys"),
    ("POST", "/v1/%2E%2E%2F%2E%2E%2Fadmin%2Fkeys"),
    ("POST", "/v1/messages%2f..%2f..%2fadmin%2fkeys"),
    ("POST", "/v1/..%5c..%5cadmin%5ckeys"),
    ("POST", "/v1\\..\\..\\admin\\keys"),
    ("POST", "/v1/./messages"),
    ("POST", "/v1//messages"),
    ("POST", "/v1/messages/"),
    ("POST", "/v1/messages;/../../admin/keys"),
    ("POST", "/v1/messages?beta=true&next=/../../admin/keys"),
    ("POST", "/v1/messages?/../../admin/keys"),
    ("POST", "/v1/messages#/../../admin"),
    ("POST", "/v1/admin/keys"),
    ("GET", "/v1/organizations/api_keys"),
    ("GET", "/api/hello"),
    ("POST", "http://evil.example/v1/messages"),
    ("GET", "/v1/models/../../admin/keys"),
    ("GET", "/v1/models/%2e%2e"),
]


def test_trace_other_methods_dot_segments_escapes_and_query_tricks_are_refused_and_never_sent(
    upstream, relay
):
    answers = {(m, t): ask(relay, request(m, t)) for m, t in REFUSED}
    smuggled = {
        "two lengths": ask(relay, request("POST", "/v1/messages", extra="Content-Length: 5\r\n")),
        "length and chunks": ask(relay, request("POST", "/v1/messages", extra="Transfer-Encoding: chunked\r\n")),
        "a folded header": ask(relay, request("POST", "/v1/messages", extra=" x-api-key: more\r\n")),
        "a bare LF": ask(relay, request("POST", "/v1/messages", extra="a: b\nHost: evil\r\n")),
        "HTTP/0.9": ask(relay, b"POST /v1/messages\r\n\r\n"),
        "a space in the target": ask(relay, b"POST /v1/messages /admin HTTP/1.1\r\n\r\n"),
    }  # fmt: skip
    for what, answer in [*answers.items(), *smuggled.items()]:
        status = int(answer.split(b" ", 2)[1])
        assert 400 <= status < 500, (what, answer[:200])
        assert KEY.encode() not in answer
    assert int(answers[("TRACE", "/v1/messages")].split(b" ")[1]) == 405
    assert upstream.received == []  # not one of them went out
    assert relay.requests == [] and len(relay.refused) == len(answers) + len(smuggled)


def _honest(relay: ApiRelay) -> float:
    start = time.perf_counter()
    answer = ask(relay, request("POST", "/v1/messages?beta=true"))
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    return time.perf_counter() - start


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def test_600_idle_connections_take_no_threads_and_an_honest_request_still_goes_through(capsys):
    """Idle connections (some having sent half a head, as a slow-loris client does) against honest
    requests to an upstream that takes 50 ms: the honest latency under attack stays within 2x the idle
    one, the search process's thread count does not grow with the connections, and the relay holds at
    most ``max_pending`` of them (it closes the oldest)."""
    up = Upstream(delay_s=0.05)
    relay = ApiRelay(up.url, KEY)
    idle_conns: list[socket.socket] = []
    try:
        for _ in range(3):
            _honest(relay)  # warm
        idle = [_honest(relay) for _ in range(10)]
        threads_before = _threads()
        for i in range(600):
            s = socket.socket(socket.AF_UNIX)
            s.connect(str(relay.path))
            if i % 2:
                s.sendall(b"POST /v1/messa")
            idle_conns.append(s)
        time.sleep(0.5)
        threads_under = _threads()
        attacked = [_honest(relay) for _ in range(10)]
        held = len(relay._pending)
    finally:
        for s in idle_conns:
            s.close()
        relay.close()
        up.close()
    idle_ms, attacked_ms = 1000 * statistics.median(idle), 1000 * statistics.median(attacked)
    with capsys.disabled():
        print(
            f"\nrelay: honest request {idle_ms:.1f} ms idle, {attacked_ms:.1f} ms beside 600 idle connections "
            f"(median of 10 each); threads {threads_before} -> {threads_under}; pending held {held}"
        )
    assert threads_under <= threads_before + 2
    assert held <= relay.max_pending
    assert attacked_ms <= 2 * idle_ms


# ------------------------------------------------------------------------------------------- the jail


def _alive_with(marker: str) -> list[int]:
    """Pids (seen from this, the trusted, side) of live processes whose command line holds ``marker``."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = Path(entry.path, "cmdline").read_bytes()
            state = Path(entry.path, "stat").read_bytes().rpartition(b")")[2].split()[0]
        except (OSError, IndexError):
            continue
        if marker.encode() in cmdline and state not in (b"Z", b"X"):
            pids.append(int(entry.name))
    return pids


DAEMON = """
import os, sys, time
if os.fork():
    sys.exit(0)
os.setsid()
if os.fork():
    sys.exit(0)
os.closerange(0, 3)
while True:
    time.sleep(0.1)
"""


@pytest.fixture
def jail(tmp_path):
    from whale_envs.sandbox import isolation_problem
    from whale_train.meta_harness.jail import JailLimits, ProposerJail

    problem = isolation_problem(True)
    if problem:
        pytest.skip(f"the jail needs namespaces: {problem}")
    (tmp_path / "archive").mkdir()
    j = ProposerJail(tmp_path / "archive", JailLimits(wall_s=20, cpu_s=20))
    yield j
    j.close()


def test_nothing_a_command_starts_outlives_it(jail):
    tag = f"whale-redteam-{os.getpid()}"
    jail.put("daemon.py", DAEMON)
    loop = f"setsid sh -c 'while :; do sleep 0.1; done' {tag}-loop >/dev/null 2>&1 </dev/null &"
    burner = (
        f"setsid sh -c 'while :; do sh -c \"while :; do :; done\" {tag}-burn & sleep 0.2; done' {tag}-burners"
    )
    command = f"{loop} {burner} >/dev/null 2>&1 </dev/null & python daemon.py {tag}-daemon; sleep 0.5"
    command += f"; grep -l {tag} /proc/[0-9]*/cmdline 2>/dev/null | wc -l"
    result = jail.run(command)
    assert result.ok, result.observation()
    assert int(result.output.split()[-1]) >= 4  # they were running inside while the command ran
    assert _alive_with(tag) == []  # and none is left once it returned
    time.sleep(1.0)
    assert _alive_with(tag) == []  # nor comes back (no burner is started again)
    # the jail itself goes on, and a command sees nothing of the previous one
    listing = "import os; me = {os.getpid(), os.getppid()}; print(*[p for p in os.listdir('/proc') if p.isdigit() and int(p) not in me])"  # fmt: skip
    again = jail.run(f'python -c "{listing}"')
    left = again.output.split()  # the jail's init and its server (and this command's shell), nothing else
    assert again.ok and "1" in left and len(left) <= 2, again.output


def test_a_detached_process_ends_with_a_command_that_hits_its_wall_limit(tmp_path):
    from whale_envs.sandbox import isolation_problem
    from whale_train.meta_harness.jail import JailLimits, ProposerJail

    if isolation_problem(True):
        pytest.skip("the jail needs namespaces")
    tag = f"whale-redteam-wall-{os.getpid()}"
    (tmp_path / "archive").mkdir()
    with ProposerJail(tmp_path / "archive", JailLimits(wall_s=1.5, cpu_s=20)) as jail:
        jail.put("daemon.py", DAEMON)
        result = jail.run(f"python daemon.py {tag}; setsid sh -c 'sleep 100' {tag} & sleep 100")
        assert result.limit == "wall"
        assert _alive_with(tag) == []


# ------------------------------------------------------------------------------------------ --resume


class Payload:
    """Unpickled, it writes ``marker``: what a hostile run folder's state file would run."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


def test_the_state_file_round_trips_optimizer_and_rng_states_without_unpickling_code(tmp_path):
    import torch

    from whale_train.rsft import load_state

    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    state = {
        "optimizer": opt.state_dict(),
        "steps_done": 3,
        "stream": 12,
        "rng": {"torch": torch.get_rng_state(), "python": list(range(5))},
    }
    torch.save(state, tmp_path / "rsft_state.pt")
    loaded, unpickled = load_state(tmp_path)
    assert not unpickled
    assert loaded["steps_done"] == 3 and loaded["stream"] == 12
    assert torch.equal(loaded["rng"]["torch"], state["rng"]["torch"])
    assert loaded["optimizer"]["param_groups"] == state["optimizer"]["param_groups"]
    for k, v in state["optimizer"]["state"].items():
        assert all(torch.equal(loaded["optimizer"]["state"][k][n], t) for n, t in v.items())
    fresh = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fresh.load_state_dict(loaded["optimizer"])  # the optimizer takes it back


def test_a_state_file_that_runs_code_is_refused_unless_trusted(tmp_path):
    import torch

    from whale_train.rsft import UntrustedState, load_state

    marker = tmp_path / "marker"
    torch.save(
        {"optimizer": None, "steps_done": 1, "stream": 4, "x": Payload(marker)}, tmp_path / "rsft_state.pt"
    )
    with pytest.raises(UntrustedState) as refused:
        load_state(tmp_path)
    line = str(refused.value)
    assert "\n" not in line and str(tmp_path / "rsft_state.pt") in line and "--trust-state" in line
    assert not marker.exists()


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished weight-only run of the shipped model (its checkpoints hold rsft_state.pt)."""
    from tests.train.test_trainer import MODEL, smoke
    from whale_train.trainer import Run

    out = tmp_path_factory.mktemp("run") / "run"
    Run(smoke(MODEL, method="weight-only", budget_rollouts=16), out, log=lambda *_: None).run()
    return out


def _resume(out: Path, *flags: str):
    """``whale train --out OUT --resume --no-report FLAGS`` from the run's parent folder (forked warm:
    tests/warm.py); its output, stdout and stderr together, in ``stdout``."""
    from tests.warm import whale_train

    return whale_train(["--out", str(out), "--resume", "--no-report", *flags], cwd=str(out.parent))


def _state_file(out: Path) -> Path:
    import json

    return out / "checkpoints" / json.loads((out / "state.json").read_text())["resume_from"] / "rsft_state.pt"


def test_whale_train_resume_refuses_a_pickle_payload_in_one_line_and_never_runs_it(finished_run, tmp_path):
    import shutil

    import torch

    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    assert _resume(out).returncode == 0  # the state file the run wrote itself loads as it is
    marker = tmp_path / "marker"
    state = _state_file(out)
    extra = torch.load(state, weights_only=True)
    torch.save({**extra, "note": Payload(marker)}, state)
    done = _resume(out)
    assert done.returncode != 0
    errors = [line for line in done.stdout.splitlines() if "--trust-state" in line]
    assert len(errors) == 1 and str(state) in errors[0].replace("\n", ""), done.stdout
    assert "Traceback" not in done.stdout
    assert not marker.exists()
    assert not (out / "trusted_state.log").exists()


def test_with_trust_state_an_older_state_file_still_loads_and_the_run_records_it(finished_run, tmp_path):
    import argparse
    import shutil

    import torch

    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    state = _state_file(out)
    extra = torch.load(state, weights_only=True)
    torch.save({**extra, "args": argparse.Namespace(note="an older format")}, state)  # harmless, not plain
    assert "--trust-state" in _resume(out).stdout
    done = _resume(out, "--trust-state")
    assert done.returncode == 0, done.stdout[-2000:]
    record = (out / "trusted_state.log").read_text()
    assert str(state) in record and "--trust-state" in record
