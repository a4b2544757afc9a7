"""A user's env, defined in tests/user_env/ (outside the package) with its own h0: WHALE gives it a
generic domain, and ``whale eval``, ``whale search`` (offline and LLM proposer) and ``whale train``
run on it from the command line and a config, as on a built-in env."""

from __future__ import annotations

import copy
import itertools
import json
import re
import sys
from pathlib import Path

import gymnasium as gym
import pytest

from harnesses.loader import harness_from_source, load_harness
from tests.small_train import run_train, small_train_config
from tests.train.test_meta_harness_llm import Server, tool_call
from tests.train.test_trainer import MODEL, units
from whale_train.cli import main
from whale_train.domains import Domain, domain_for, get_domain, register_domain, registry
from whale_train.llm.scripted import ScriptedLLM
from whale_train.meta_harness.archive import Archive
from whale_train.meta_harness.library import library_for
from whale_train.rollout import RolloutConfig, run_rollouts
from whale_train.trainer import TrainConfig

HERE = Path(__file__).resolve().parents[1]
ENV = "user_env:Reverse-v0"  # the module:EnvId form: WHALE imports user_env, which registers Reverse-v0
H0 = str(HERE / "user_env" / "h0.py")


@pytest.fixture(autouse=True)
def user_package(monkeypatch):
    """The user's package is importable (as it would be once installed or on PYTHONPATH)."""
    monkeypatch.syspath_prepend(str(HERE))


def test_an_env_nobody_registered_a_domain_for_gets_a_generic_one():
    domain = domain_for(ENV)
    assert (domain.name, domain.env_id, domain.base_harness, domain.harness_dir) == (
        "reverse-v0",
        ENV,
        "generic/h0",  # the shipped harness that drives any text env
        None,
    )
    assert domain.options_field == "options" and {"word", "options"} <= set(domain.info_fields)
    assert domain.load_library() is None and domain.load_pretrain_formats() is None
    with pytest.raises(ValueError, match="unknown env 'user_env:Nope-v0'"):
        domain_for("user_env:Nope-v0")
    with pytest.raises(ValueError, match="cannot import module 'no_such_module'"):
        domain_for("no_such_module:X-v0")
    assert TrainConfig.from_dict({"env": ENV}).harness_name == "generic/h0"  # until the config names its own
    assert TrainConfig.from_dict({"env": ENV, "harness": H0}).harness_name == H0


@pytest.fixture
def scratch_registry(monkeypatch):
    """Registrations made in a test are gone after it."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    domain_for.cache_clear()
    yield
    monkeypatch.undo()
    domain_for.cache_clear()


def test_a_domain_registered_for_the_bare_id_is_found_through_module_env_id(scratch_registry):
    mine = Domain(name="reverse", env_id="Reverse-v0", base_harness=H0, info_fields=("word", "options"))
    register_domain(mine)
    register_domain(mine)  # a module imported again: the same record is fine
    assert domain_for(ENV) is mine and get_domain("reverse") is mine
    assert TrainConfig.from_dict({"env": ENV}).harness_name == H0  # its base harness is the default
    with pytest.raises(ValueError, match="registered already"):
        register_domain(Domain(name="reverse2", env_id="Reverse-v0"))
    with pytest.raises(ValueError, match="name 'math' is taken"):
        register_domain(Domain(name="math", env_id="Other-v0"))
    with pytest.raises(KeyError, match="no registered domain 'nope'"):
        get_domain("nope")


def test_generic_mechanisms_extend_the_seed_and_render_valid_harnesses():
    seed = load_harness(H0)
    lib = library_for(domain_for(ENV), seed.source)
    assert set(lib.slots["action"]) == {"generate", "vote", "choose"}  # choose: info lists the options
    assert lib.h0["constants"]["max_tokens"] == 8  # read from the seed's class
    sources = set()
    for combo in itertools.product(*lib.slots.values()):
        genome = copy.deepcopy(lib.h0)
        genome["slots"] = dict(zip(lib.slots, combo, strict=True))
        genome["constants"]["temperature"] = 0.4
        source = lib.render(genome, "i001-c0", "A test candidate.")
        assert (
            source.startswith(seed.source.rstrip()) and harness_from_source(source).class_name == "Candidate"
        )
        sources.add(source)
    assert len(sources) == len(list(itertools.product(*lib.slots.values())))
    # without a list of options in info there is no choose mechanism
    assert "choose" not in library_for(Domain(name="x", env_id="x"), seed.source).slots["action"]


#: The LLM proposer's script: read the seed, then answer with a harness (it cannot import the seed,
#: which is not shipped, so it writes its own class).
CHOOSER = """from harnesses.base import Harness


class Chooser(Harness):
    def act(self, obs, info, llm):
        prompt = self.make_prompt(obs + "\\nReply with the word only.", info, llm)
        return info["options"][llm.choose(prompt, info["options"])]
"""
SCRIPT = [
    {"tool_calls": [tool_call(1, "read_file", path="h0/harness.py")]},
    {
        "content": f"Hypothesis: choosing among the listed options never wastes a turn.\n```python\n{CHOOSER}```\n"
    },
]


@pytest.mark.slow
def test_whale_eval_search_and_train_run_on_a_user_env(tmp_path):
    model = ["--model", MODEL]
    # eval: the user's h0 (an untrusted file: it runs in the sandboxed worker)
    assert (
        main(
            ["eval", "--env", ENV, "--harness", H0, "--limit", "4", "--k", "1", "--out", str(tmp_path / "e")]
        )
        == 0
    )
    traces = [json.loads(line) for line in (tmp_path / "e" / "traces.jsonl").read_text().splitlines()]
    assert len(traces) == 4 and all(t["env_id"] == ENV and t["calls"] for t in traces)

    # search, offline proposer: the generic mechanisms; likelihood choice among info["options"] wins
    search = ["search", "--env", ENV, "--harness", H0, "--iterations", "1", "--harness-tasks", "16", *model]
    assert main([*search, "--set", "check_tasks=4", "--test-limit", "0", "--out", str(tmp_path / "s")]) == 0
    results = json.loads((tmp_path / "s" / "results.json").read_text())
    archive = Archive(tmp_path / "s" / "archive")
    winner = archive.get(results["incumbent"])
    assert winner.meta["summary"] == "action: generate -> choose" and winner.source.startswith(
        load_harness(H0).source.rstrip()
    )
    assert results["search"]["incumbent"]["mean"] >= results["search"]["seed"]["mean"] + 0.25

    # search, LLM proposer: its instructions are built from the (generic) domain
    server = Server(SCRIPT)
    try:
        llm = ["--proposer", "llm", "--llm-base-url", server.url, "--llm-model", "scripted"]
        out = [
            "--set",
            "candidates=1",
            "--set",
            "check_tasks=4",
            "--test-limit",
            "0",
            "--out",
            str(tmp_path / "l"),
        ]
        assert main([*search, *llm, *out]) == 0
    finally:
        server.close()
    system = server.requests[0]["messages"][0]["content"]
    assert ENV in system and "word, options, error, error_kind" in system and "harnesses.None" not in system
    assert "class ReverseH0" in server.requests[1]["messages"][-1]["content"]  # what read_file returned
    chooser = Archive(tmp_path / "l" / "archive").get("i001-c0")
    assert chooser.source == CHOOSER and chooser.meta["status"] == "valid" and chooser.eval(0)["mean"] > 0.25

    # train: a config naming the user's env and h0, both operators on one ledger
    events = run_train(tmp_path, small_train_config("reverse", ENV, harness=H0, model=MODEL))
    us = units(events)
    assert {u["phase"] for u in us} == {"weight", "harness"}
    assert sum(u["rollouts"] for u in us) == us[-1]["rollouts_total"] <= 40
    assert [e for e in events if e["event"] == "eval"] and (tmp_path / "t" / "report.md").exists()


@pytest.mark.slow
def test_vote_and_env_error_do_what_they_say_in_the_sandboxed_worker():
    """A scripted model (a test double for the model only; the env, the worker and the handles are
    real): vote takes the majority of 8 samples where the first is wrong; env_error retries an empty
    reply with a note on the format."""
    seed = load_harness(H0)
    lib = library_for(domain_for(ENV), seed.source)
    ids = gym.make(ENV, split="harness").unwrapped.task_ids[:2]
    config = RolloutConfig(k=1, seed=0, concurrency=1)

    def run(slots, script):
        genome = copy.deepcopy(lib.h0)
        genome["slots"].update(slots)
        ref = harness_from_source(lib.render(genome, "c", "A test candidate."), "c")
        return run_rollouts(
            ref, ENV, ScriptedLLM(script), ids, env_kwargs={"split": "harness"}, config=config
        )

    def reverse(prompt):
        return re.search(r"Which word is (\w+) spelled", prompt).group(1)[::-1]

    calls = itertools.count()
    wrong_first = lambda p: ["zzzz", reverse(p), reverse(p), ""][next(calls) % 4]  # noqa: E731
    voted = run({"action": "vote"}, wrong_first)
    assert [t.reward for t in voted] == [1.0, 1.0] and all(len(t.calls) == 8 for t in voted)

    calls = itertools.count()
    empty_first = lambda p: ["", reverse(p)][next(calls) % 2]  # noqa: E731
    retried = run({"retry": "env_error"}, empty_first)
    assert [t.reward for t in retried] == [1.0, 1.0]
    assert all("could not be read as an action" in t.calls[1].prompt_text for t in retried)


def test_whale_envs_lists_the_domains_a_users_module_registers(scratch_registry, monkeypatch, capsys):
    monkeypatch.delitem(sys.modules, "user_env.domain", raising=False)  # its import registers it again
    assert main(["envs", "--import", "user_env.domain"]) == 0
    out = capsys.readouterr().out
    assert "Registered domains" in out and "reverse" in out and "Reverse-v0" in out
    assert {"chess", "math", "search"} <= {d.name for d in registry.registered()}
    assert main(["envs", "--import", "no_such_user_module"]) == 2
    assert "--import no_such_user_module: cannot import it" in capsys.readouterr().err
