"""Red team, the harness worker and the protocol: every attack is contained.

Two kinds of attacker. A *legal* harness (it passes the AST lint) that tries to carry state from one
episode to the next or to flood the trusted process. And a harness that has *bypassed the lint*
(simulated: the worker is told to load it with full builtins, ``UNLINTED``), which then holds all of
Python inside the OS sandbox: it must still not forge another episode's calls, reach the template's
pipes, leave files or processes for a later episode, or crash the trusted side with bytes.
"""

from __future__ import annotations

import ast
import time
import uuid
from unittest import mock

import gymnasium as gym
import pytest

import harnesses.worker as worker
import whale_train.rollout.workers as workers
from harnesses.loader import HarnessRef, harness_from_source
from harnesses.validate import shipped_modules
from tests.procs import carrying
from whale_envs.sandbox import bundle
from whale_train.llm.scripted import ScriptedLLM
from whale_train.rollout import EpisodeLimits, RolloutConfig, run_rollouts

# `make test` runs the jail and sandbox-pool tests on one worker, one after another (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("sandbox")

MATH = "whale/Math-v0"
MATH_TASKS = {"tasks": "generated?families=arithmetic&difficulty=1", "split": "test"}
HEADER = "from harnesses.base import Harness\n"


def math_ids(n: int) -> list[str]:
    return gym.make(MATH, **MATH_TASKS).unwrapped.task_ids[:n]


def rollouts(ref: HarnessRef, *, n: int = 2, k: int = 1, llm=None, concurrency: int = 4, **limits):
    config = RolloutConfig(
        k=k, concurrency=concurrency, limits=EpisodeLimits(**{"harness_seconds": 5.0, **limits})
    )
    return run_rollouts(
        ref, MATH, llm or ScriptedLLM([""]), math_ids(n), env_kwargs=MATH_TASKS, config=config
    )


def prompted(source: str, **options) -> tuple[list, list[str]]:
    """Run the harness in ``source`` (``rollouts`` options) under a model that answers "" and keeps every
    prompt it gets: the trajectories and those prompts."""
    prompts: list[str] = []
    trajs = rollouts(
        harness_from_source(source), llm=ScriptedLLM(lambda t: prompts.append(t) or ""), **options
    )
    return trajs, prompts


def on_the_first_task(ref: HarnessRef) -> HarnessRef:
    """``ref`` with ``FIRST``, the question of the first task, defined: an attack that tests
    ``info['question'] == FIRST`` misbehaves in that episode only."""
    env = gym.make(MATH, **MATH_TASKS).unwrapped
    env.reset(options={"task_id": math_ids(1)[0]})
    return HarnessRef(ref.name, f"FIRST = {env.problem.question!r}\n" + ref.source, "attack", "H", False)


#: Where the worker module starts its program: a test's change to the worker goes just before it.
_START = 'if __name__ == "__main__":\n'

#: The lint bypass: the worker loads harness code with full builtins and no validation.
UNLINTED = (
    "import harnesses.validate\n"
    "def _unlinted(first):\n"
    "    ns = {'__name__': 'attack'}\n"
    "    exec(first['source'], ns)\n"
    "    return ns['H']\n"
    "_load = _unlinted\n"
    "harnesses.validate.prepare = lambda source, filename='': (None, None)\n"
)


def changed_worker_program(change: str) -> str:
    """The worker program (the bundler's, as the sandbox starts it) whose worker module runs ``change``,
    top-level code in its own namespace, before it starts: how a test plays an attacker who got past the
    lint, or a kernel that refuses namespaces. The worker module on the host is not touched."""
    real = bundle.module_source
    text = real(worker.PROGRAM)
    assert text.count(_START) == 1
    changed = text.replace(_START, change + _START)
    with mock.patch.object(
        bundle, "module_source", lambda name: changed if name == worker.PROGRAM else real(name)
    ):
        return worker.worker_program()


@pytest.fixture
def unlinted(monkeypatch):
    """The worker loads harness code with full builtins and no validation (a lint bypass)."""
    program = changed_worker_program(UNLINTED)
    assert "_unlinted" in program
    monkeypatch.setattr(workers, "worker_program", lambda: program)

    def make(body: str) -> HarnessRef:
        source = "class H:\n    def run(self, env, llm):\n" + "".join(
            f"        {line}\n" for line in body.splitlines()
        )
        return HarnessRef("attack", source, "attack", "H", False)

    return make


def reported(traj) -> str:
    """What an attacking episode reported about itself (it sends it as its last action)."""
    return traj.steps[-1].action if traj.steps else ""


# ------------------------------------------------------------------------------------ the worker program


def test_the_worker_is_a_sandbox_program_started_by_the_bundler():
    """The worker's ``main.py`` is the bundler's (one loader for every program the sandbox runs): it
    carries the worker, the harness API, the episode isolation and the shipped harnesses, nothing else
    of the project (not the bundler that built it), and names the shipped harnesses in its arguments.
    No program or loader is kept in a string literal of the worker module."""
    shipped = sorted(shipped_modules())
    program = worker.worker_program()
    assert program == bundle.program(worker.PROGRAM, *shipped, extra=shipped)
    carried = set(bundle.modules(worker.PROGRAM, shipped))
    assert carried == {
        worker.PROGRAM,
        "whale_envs._children",
        "harnesses.base",
        "harnesses.validate",
        *shipped,
    }
    assert program.endswith(f"{shipped!r})\n") and "harnesses.math.h0" in shipped
    source = bundle.module_source(worker.PROGRAM)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                code = ast.parse(node.value)
            except (SyntaxError, ValueError):  # not Python (or a lone surrogate)
                continue
            kinds = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef)
            assert not any(isinstance(n, kinds) for n in ast.walk(code)), node.value[:200]


def test_a_harness_builds_on_shipped_ones_in_the_worker():
    """Untrusted, a harness may import a shipped harness (which imports another): the worker carries
    them and is told their names, so the lint in the worker allows the import and the episode runs."""
    source = "from harnesses.math.vote import MathVote\nclass Mine(MathVote):\n    samples = 2\n"
    trajs = rollouts(harness_from_source(source), n=2, llm=ScriptedLLM(["\\boxed{3}"]))
    assert [t.error for t in trajs] == [None, None]
    assert all(t.steps and t.steps[-1].action == "answer: 3" for t in trajs), [t.steps for t in trajs]


# ------------------------------------------------------------------------------------ cross-episode state


MEMORY = (
    HEADER
    + "class H(Harness):\n"
    + "    memory = {}\n"
    + "    def run(self, env, llm):\n"
    + "        obs, info = env.reset()\n"
    + "        q = info['question']\n"
    + "        llm.complete('seen ' + ' '.join(sorted(H.memory)))\n"
    + "        guess = H.memory.get(q, '0')\n"
    + "        obs, r, te, tr, info = env.step('answer: ' + str(guess))\n"
    + "        H.memory[q] = info.get('answer') or info.get('gold') or guess\n"
    + "        GLOBAL_NOTES.append(q)\n"
    + "GLOBAL_NOTES = []\n"
)


def test_class_and_module_state_do_not_carry_the_answer_to_the_next_sample():
    """The attack of the issue: keep the answer revealed at the end of one sample and replay it in
    the next sample of the same task (one episode at a time, so a later sample follows an earlier)."""
    trajs, prompts = prompted(MEMORY, n=3, k=4, concurrency=1)
    assert len(trajs) == 12 and not any(t.error for t in trajs)
    assert not any(t.solved for t in trajs[1:] if t.final_info["answer"] != "0")
    assert all(p.endswith("seen ") for p in prompts), prompts[:3]  # every episode starts with empty memory


def test_the_answer_is_withheld_from_the_harness_at_the_end():
    probe = (
        HEADER
        + "import json\n"
        + "class H(Harness):\n"
        + "    def run(self, env, llm):\n"
        + "        env.reset()\n"
        + "        obs, r, te, tr, info = env.step('answer: 0')\n"
        + "        llm.complete(json.dumps(sorted(info)))\n"
    )
    trajs, seen = prompted(probe, n=1)
    assert "answer" in trajs[0].final_info and "gold" in trajs[0].final_info  # the record keeps it
    assert '"solved"' in seen[0] and '"answer"' not in seen[0] and '"gold"' not in seen[0]


def test_files_cannot_carry_state_between_episodes(unlinted):
    ref = unlinted(
        "env.reset()\n"
        "try:\n"
        "    open('/sandbox/note', 'w').write('42'); out = 'wrote'\n"
        "except OSError as exc:\n"
        "    out = type(exc).__name__ + str(exc.errno)\n"
        "try:\n"
        "    open('/tmp/note', 'w').write('42'); out += ' wrote-tmp'\n"
        "except OSError as exc:\n"
        "    out += ' ' + type(exc).__name__\n"
        "env.step('report ' + out)"
    )
    trajs = rollouts(ref, n=1)
    assert reported(trajs[0]) == "report OSError30 OSError", reported(trajs[0])  # EROFS: read-only


def test_a_daemon_left_behind_is_killed_when_its_episode_ends(unlinted):
    marker = "whale-daemon-" + uuid.uuid4().hex[:8]
    ref = unlinted(
        "import os\n"
        "env.reset()\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        os.execv('/usr/bin/sleep', ['sleep', '300', '{marker}'])\n"
        "    os._exit(0)\n"
        "import time; time.sleep(0.3)\n"
        "env.step('report forked')"
    )
    trajs = rollouts(ref, n=2)
    assert all(reported(t) == "report forked" for t in trajs)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and carrying(marker):
        time.sleep(0.1)
    assert not carrying(marker)


# ------------------------------------------------------------------------------------ forging


def test_an_episode_cannot_act_for_another(unlinted):
    """It writes calls naming other episode ids on its channel: they are served as its own."""
    ref = unlinted(
        "import json\n"
        "env.reset()\n"
        "ch = env._call.__self__  # the episode's channel\n"
        "for other in range(8):\n"
        "    ch.send({'op': 'call', 'episode': other, 'method': 'step', 'args': {'action': 'forged'}})\n"
        "    ch._in.readline()\n"
    )
    trajs = rollouts(ref, n=4, max_llm_calls=64)
    for t in trajs:  # each trajectory holds exactly its own calls (the env ends it after max_turns)
        assert [s.action for s in t.steps] == ["forged"] * len(t.steps) and len(t.steps) == 6, t.steps


def test_the_template_and_sibling_pipes_are_out_of_reach(unlinted):
    ref = unlinted(
        "import os\n"
        "env.reset()\n"
        "out = []\n"
        "for path in (f'/proc/{os.getppid()}/fd', f'/proc/{os.getppid()}/mem'):\n"
        "    try:\n"
        "        os.listdir(path) if path.endswith('fd') else open(path, 'rb').read(1)\n"
        "        out.append('open')\n"
        "    except OSError as exc:\n"
        "        out.append(type(exc).__name__)\n"
        "try:\n"
        '    os.write(1, b\'{"op": "done", "episode": 0, "error": null}\\n\'); out.append(\'fd1\')\n'
        "except OSError:\n"
        "    out.append('nofd1')\n"
        "env.step('report ' + ' '.join(out))"
    )
    trajs = rollouts(ref, n=2)
    for t in trajs:
        # the template is outside the episode's PID namespace (getppid() is 0: no /proc entry); fd 1 is /dev/null
        assert reported(t) == "report FileNotFoundError FileNotFoundError fd1", reported(t)
        assert t.error is None and len(t.steps) == 1  # the write to fd 1 reached nobody


@pytest.mark.parametrize("concurrency", [1, 4], ids=["one after another", "side by side"])
def test_an_episodes_memory_holds_nothing_of_another_episodes_replies(unlinted, concurrency):
    """An episode is a copy of the process it was forked from. Forked from the template, which relays
    every episode's prompts and replies, it held them (live buffers, freed memory): full Python read the
    replies of the episodes before it and beside it out of its own memory. Forked from the spawner,
    which relays nothing, an episode finds only its own reply in all of its writable memory."""
    import hashlib

    def model(prompt: str) -> str:  # long replies: freed, they stay in memory (short ones are reused)
        return "MARK-" + hashlib.sha256(prompt.encode()).hexdigest()[:8] + " lorem ipsum" * 400

    ref = unlinted(
        "import ctypes, re\n"
        "obs, info = env.reset()\n"
        "mine = llm.complete(obs, max_tokens=8).split()[0].encode()\n"
        "found = set()\n"
        "for line in open('/proc/self/maps'):\n"
        "    span, perms = line.split()[:2]\n"
        "    lo, hi = (int(x, 16) for x in span.split('-'))\n"
        "    if perms.startswith('rw') and hi - lo < 1 << 28:\n"
        "        found.update(re.findall(rb'MARK-[0-9a-f]{8}', ctypes.string_at(lo, hi - lo)))\n"
        "others = sorted(m.decode() for m in found - {mine})\n"
        "env.step('report ' + str(mine in found) + ' ' + ' '.join(others[:3]))"
    )
    trajs = rollouts(ref, n=8, llm=ScriptedLLM(model), concurrency=concurrency)
    assert [reported(t) for t in trajs] == ["report True "] * 8, [reported(t) for t in trajs]


# ------------------------------------------------------------------------------------ protocol abuse


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        ("b'[]\\n'", "not an object"),
        ("b'\\xff\\xfe garbage\\n'", "not UTF-8"),
        ("b'[' * 100000 + b'\\n'", "not JSON"),
        ("b'{\"op\": \"call\", \"a\": ' + b'[' * 50 + b']' * 50 + b'}\\n'", "deeper than"),
        ("b'x' * (5 * 1024 * 1024)", "longer than"),
        ('b\'{"op": "explode"}\\n\'', "unknown op"),
    ],
)
def test_malformed_bytes_from_an_episode_end_only_that_episode(unlinted, payload, why):
    ref = unlinted(
        "import os\n"
        "obs, info = env.reset()\n"
        "if info['question'] == FIRST:\n"
        f"    os.write(env._call.__self__._out.fileno(), {payload})\n"
        "    import time; time.sleep(30)\n"
        "env.step('answer: 0')"
    )
    ref = on_the_first_task(ref)
    start = time.monotonic()
    trajs = rollouts(ref, n=3)
    assert time.monotonic() - start < 20
    bad, *good = trajs
    assert bad.failure == "harness_error" and "protocol" in bad.error and why in bad.error, bad.error
    assert all(t.error is None and t.steps[-1].terminated for t in good)


@pytest.mark.parametrize(
    "lines",
    [
        [b"[]"],
        [b'{"op": "call", "episode": [1], "method": "step", "args": {}}', b"[]"],
        [b'{"op": "done", "episode": {"a": 1}}', b"\xff\xfe"],
        [b"[" * 100000],
        [b'{"op": "ready"}', b"y" * (5 * 1024 * 1024)],
        [b'{"op": "ready"}', b'{"op": "call", "episode": 0, "method": 7, "args": []}', b"not json"],
    ],
)
def test_the_trusted_side_takes_any_bytes_from_the_worker(monkeypatch, lines):
    """The worker itself (not only an episode) sends garbage: the evaluation ends its episodes with
    the reason and returns; nothing raises in the trusted process."""
    program = f"import os, sys, time\nfor line in {lines!r}:\n    os.write(1, line + b'\\n')\ntime.sleep(5)\n"
    monkeypatch.setattr(workers, "worker_program", lambda: program)
    trajs = rollouts(harness_from_source(HEADER + "class H(Harness): pass\n"), n=2)
    assert len(trajs) == 2
    assert all(t.failure == "harness_error" for t in trajs), [t.error for t in trajs]


# ------------------------------------------------------------------------------------ resource exhaustion


def test_steps_after_the_end_are_refused_and_not_recorded():
    flood = (
        HEADER
        + "class H(Harness):\n"
        + "    def run(self, env, llm):\n"
        + "        env.reset()\n"
        + "        env.step('answer: 0')\n"
        + "        refused = 0\n"
        + "        for _ in range(40):\n"
        + "            try:\n"
        + "                env.step('x' * 60000)\n"
        + "            except Exception:\n"
        + "                refused += 1\n"
        + "        llm.complete(str(refused))\n"
    )
    trajs, seen = prompted(flood, n=1)
    assert len(trajs[0].steps) == 1 and seen == ["40"]


def test_an_oversized_action_is_refused():
    big = (
        HEADER
        + "class H(Harness):\n    def run(self, env, llm):\n        env.reset()\n        env.step('x' * 10**6)\n"
    )
    trajs = rollouts(harness_from_source(big), n=1)
    assert not trajs[0].steps and "over this run's limit" in trajs[0].error


def test_score_and_choose_are_capped_and_truncated():
    calls = (
        HEADER
        + "class H(Harness):\n"
        + "    def run(self, env, llm):\n"
        + "        env.reset()\n"
        + "        out = []\n"
        + "        for opts in ([str(i) for i in range(20000)], ['y' * 70000]):\n"
        + "            try:\n"
        + "                llm.choose('p', opts); out.append('served')\n"
        + "            except Exception as exc:\n"
        + "                out.append('refused')\n"
        + "        llm.score('q' * 500000, ['a', 'b'])\n"
        + "        env.step('answer: ' + ' '.join(out))\n"
    )
    lengths: list[int] = []
    llm = ScriptedLLM([""], scorer=lambda text, c: lengths.append(len(text)) or -1.0)
    trajs = rollouts(harness_from_source(calls), n=1, llm=llm)
    assert trajs[0].steps[0].action == "answer: refused refused"
    assert lengths and max(lengths) <= EpisodeLimits().max_prompt_chars  # the long prompt kept its end


LOOPS = (
    HEADER
    + "class H(Harness):\n    def run(self, env, llm):\n        env.reset()\n        while True:\n            pass\n"
)


@pytest.mark.slow
def test_a_batch_of_looping_episodes_costs_one_timeout():
    start = time.monotonic()
    trajs = rollouts(harness_from_source(LOOPS), n=6, concurrency=6, harness_seconds=2.0)
    wall = time.monotonic() - start
    assert {t.failure for t in trajs} == {"timeout"}
    # one 2 s timeout for all six (it used to be six in a row: 12 s): the episodes overlapped, so the batch
    # took a fraction of their summed times (a load on the machine stretches both alike)
    each = [t.wall_seconds for t in trajs]
    print(f"batch {wall:.2f} s, episodes {sum(each):.2f} s in all, each {min(each):.2f}-{max(each):.2f} s")
    assert min(each) >= 2.0 and wall < 0.5 * sum(each), (wall, each)


def test_one_episode_hogging_memory_leaves_the_others_running():
    hog = (
        HEADER
        + "class H(Harness):\n"
        + "    def run(self, env, llm):\n"
        + "        obs, info = env.reset()\n"
        + "        if info['question'] == FIRST:\n"
        + "            x = bytearray(10 * 1024 ** 3)\n"
        + "        env.step('answer: 0')\n"
    )
    env = gym.make(MATH, **MATH_TASKS).unwrapped
    env.reset(options={"task_id": math_ids(1)[0]})
    ref = harness_from_source(f"FIRST = {env.problem.question!r}\n" + hog)
    bad, *good = rollouts(ref, n=3)
    assert bad.failure == "harness_error" and "MemoryError" in bad.error
    assert all(t.error is None and t.steps for t in good)


def test_an_episode_that_stops_reading_its_replies_stalls_nobody(unlinted):
    """It asks for a large completion and never reads the reply: the template must not block on it."""
    ref = unlinted(
        "import time\n"
        "obs, info = env.reset()\n"
        "if info['question'] == FIRST:\n"
        "    env._call.__self__.send({'op': 'call', 'method': 'complete', 'args': {'prompt': 'x', 'params': {}}})\n"
        "    time.sleep(60)\n"
        "env.step('answer: ' + llm.complete('y')[:5])"
    )
    ref = on_the_first_task(ref)
    start = time.monotonic()
    bad, *good = rollouts(ref, n=3, llm=ScriptedLLM(lambda t: "7" * 300_000), harness_seconds=3.0)
    assert time.monotonic() - start < 30
    assert bad.failure in ("timeout", "harness_error") and bad.error
    assert all(t.error is None and t.steps for t in good), [(t.error, t.failure) for t in good]
