"""Meta-Harness search: the archive, the gates, the acceptance rule, the offline proposer, prompt-only
mode, the archive tools and the lineage report, on scripted models (seconds, no weights)."""

from __future__ import annotations

import copy
import itertools
import json
import os
import re

import gymnasium as gym
import pytest

import whale_envs  # noqa: F401
from harnesses.loader import harness_from_source, load_harness
from harnesses.validate import validate_source
from whale_train.domains import get_domain
from whale_train.llm.scripted import ScriptedLLM
from whale_train.meta_harness import (
    Archive,
    HarnessSearch,
    MetaHarnessConfig,
    OfflineProposer,
    PairedGain,
    Proposal,
    ProposalContext,
)
from whale_train.meta_harness.archive import STAGING_DIR
from whale_train.meta_harness.library import key, libraries
from whale_train.meta_harness.lineage import lineage_report
from whale_train.meta_harness.prompt_only import prompt_only_violation
from whale_train.meta_harness.tools import ArchiveTools, ToolError
from whale_train.rollout import RolloutConfig, run_rollouts

MATH = "whale/Math-v0"
FAST = {"harness_tasks": 16, "check_tasks": 4, "concurrency": 16}


def math_answers() -> dict[str, str]:
    env = gym.make(MATH, split="harness").unwrapped
    return {env.source.get(t).payload.question: env.source.get(t).payload.answer for t in env.task_ids}


def tool_shy_math_model() -> ScriptedLLM:
    """Knows every answer, but when a prompt offers the Python tool it runs useless code until the tool
    budget is gone and the episode runs out of turns."""
    answers = math_answers()

    def reply(prompt: str) -> str:
        m = re.search(r"Problem: (.+)", prompt)
        if not m or "Python" in prompt:
            return "python: print(1)"
        return "\\boxed{" + answers.get(m.group(1).strip(), "0") + "}"

    return ScriptedLLM(reply)


class Fixed:
    """A proposer that returns the given (source, hypothesis) pairs, in turn."""

    name = "fixed"

    def __init__(self, sources: list[str]):
        self.sources = sources

    def propose(self, ctx: ProposalContext) -> list[Proposal]:
        return [
            Proposal(self.sources[s % len(self.sources)], f"fixed {s}", [ctx.incumbent]) for s in ctx.slots
        ]


# ------------------------------------------------------------------------------------ config


def test_config_yaml_section_and_unknown_keys(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("search:\n  candidates: 2\n  harness_tasks: 32\n  prompt_only: true\n")
    config = MetaHarnessConfig.from_yaml(path)
    assert (config.candidates, config.harness_tasks, config.prompt_only) == (2, 32, True)
    with pytest.raises(ValueError, match="^candidate: unknown field; did you mean candidates"):
        MetaHarnessConfig.from_dict({"candidate": 3})
    with pytest.raises(ValueError, match="needs llm_base_url"):
        MetaHarnessConfig.from_dict({"proposer": "llm"})


# ------------------------------------------------------------------------------------ archive


def test_archive_writes_are_atomic_and_a_killed_writer_leaves_nothing_half_written(tmp_path):
    archive = Archive(tmp_path / "a")
    archive.add("i001-c0", "x = 1\n", {"parents": ["h0"]})
    assert archive.ids() == ["i001-c0"] and archive.get("i001-c0").meta["status"] == "proposed"
    with pytest.raises(FileExistsError):
        archive.add("i001-c0", "x = 2\n", {})
    # what a run killed mid-write leaves: a staging folder and a temporary file
    half = tmp_path / "a" / STAGING_DIR / "i001-c1-999"
    half.mkdir(parents=True)
    (half / "harness.py").write_text("partial")
    stray = tmp_path / "a" / "i001-c0" / "meta.json.tmp-999"
    stray.write_text("{")
    assert Archive(tmp_path / "a", readonly=True).ids() == ["i001-c0"]  # readers never see them
    archive = Archive(tmp_path / "a")  # the next writer cleans them up
    assert not (tmp_path / "a" / STAGING_DIR).exists() and not stray.exists()
    assert archive.ids() == ["i001-c0"] and archive.get("i001-c0").source == "x = 1\n"
    archive.add("i002-c0", "y", {})
    archive.add("h0", "z", {})
    assert archive.ids() == ["h0", "i001-c0", "i002-c0"]  # the seed first, then by iteration and slot
    with pytest.raises(ValueError, match="bad candidate id"):
        archive.add("../evil", "x", {})


# ------------------------------------------------------------------------------------ acceptance


def test_paired_gain_accepts_only_beyond_noise_and_reports_its_numbers():
    inc = {"per_task": {f"t{i}": float(i % 2) for i in range(100)}}
    better = {"per_task": {f"t{i}": 1.0 for i in range(100)}}
    noisy = {"per_task": {f"t{i}": float(i % 2 if i > 4 else 1) for i in range(100)}}
    rule = PairedGain(z=2.0)
    d = rule.decide(inc, better)
    assert d.accept and d.numbers["gain"] == pytest.approx(0.5) and d.numbers["tasks"] == 100
    assert "paired gain +50.0" in d.reason
    d = rule.decide(inc, noisy)  # +3 points, SE 1.7: within the noise
    assert not d.accept and d.numbers["gain"] == pytest.approx(0.03) and 1.5 < d.numbers["z"] < 2
    assert not PairedGain(z=0, min_gain=0.05).decide(inc, noisy).accept
    assert not rule.decide(inc, inc).accept


# ------------------------------------------------------------------------------------ library


@pytest.mark.parametrize("domain", ["chess", "math", "search"])
def test_every_combination_of_mechanisms_renders_valid_readable_source(domain):
    lib = libraries()[domain]
    seen = set()
    for combo in itertools.product(*[list(v) for v in lib.slots.values()]):
        genome = copy.deepcopy(lib.h0)
        genome["slots"] = dict(zip(lib.slots, combo, strict=True))
        genome["examples"] = [
            {"question": "q?", "answer": "2", "fen": "8/8/8/8/8/8/8/K6k w - - 0 1", "move": "a1a2"}
        ]
        source = lib.render(genome, "i001-c0", "A test candidate.")
        assert validate_source(source).class_name == "Candidate"
        seen.add(key(genome, lib))
    assert len(seen) == len(list(itertools.product(*lib.slots.values())))


@pytest.mark.parametrize(
    ("env_id", "harness", "slots", "reply"),
    [
        (
            "whale/Chess-v0",
            "chess_puzzles/h0",
            {},
            lambda p: "<move>" + p.split("Legal moves: ")[1].split()[len(p) % 3],
        ),
        ("whale/Chess-v0", "chess_puzzles/choose", {"action": "choose"}, lambda p: "<move>a1a2</move>"),
        (MATH, "math/h0", {}, lambda p: "python: print(2)" if len(p) % 2 else f"\\boxed{{{len(p) % 7}}}"),
        (
            MATH,
            "math/calculator",
            {"tool": "calculator"},
            lambda p: ["<expr>2+3</expr>", "<expr>1/0</expr>", "python: print(2)", "\\boxed{4}"][len(p) % 4],
        ),
        (
            "whale/SearchQA-v0",
            "search_qa/h0",
            {},
            lambda p: f"<search>{p[10:30]}</search><answer>{p[-12:]}</answer>",
        ),
        (
            "whale/SearchQA-v0",
            "search_qa/follow_up",
            {"follow_up": "model_choose"},
            lambda p: f"<search>{p[10:30]}</search><answer>{p[-12:]}</answer>",
        ),
    ],
)
def test_genomes_behave_exactly_like_the_shipped_harnesses_they_name(env_id, harness, slots, reply):
    """h0's genome is the shipped h0; the mechanisms that ship as harnesses render to the same episodes."""
    domain = {"whale/Chess-v0": "chess", MATH: "math", "whale/SearchQA-v0": "search"}[env_id]
    lib = libraries()[domain]
    genome = copy.deepcopy(lib.h0)
    genome["slots"].update(slots)
    ref = harness_from_source(lib.render(genome, "genome", "a shipped harness as a genome."), "genome")
    ids = gym.make(env_id, split="harness").unwrapped.task_ids[:6]
    config = RolloutConfig(k=2, seed=3, concurrency=12)
    a = run_rollouts(
        load_harness(harness), env_id, ScriptedLLM(reply), ids, env_kwargs={"split": "harness"}, config=config
    )
    b = run_rollouts(ref, env_id, ScriptedLLM(reply), ids, env_kwargs={"split": "harness"}, config=config)
    assert [[c.prompt_text for c in t.calls] for t in a] == [[c.prompt_text for c in t.calls] for t in b]
    assert [[s.action for s in t.steps] for t in a] == [[s.action for s in t.steps] for t in b]
    assert [t.reward for t in a] == [t.reward for t in b]
    assert sum(len(t.calls) for t in a) >= 6


# ------------------------------------------------------------------------------------ search


@pytest.fixture(scope="module")
def math_search(tmp_path_factory):
    """Two iterations of the offline search on the tool-shy model (h0 scores 0; tool: none scores 100)."""
    llm = tool_shy_math_model()
    folder = tmp_path_factory.mktemp("search") / "archive"
    lines: list[str] = []
    search = HarnessSearch(MetaHarnessConfig(**FAST), folder, llm, MATH, log=lines.append)
    reports = search.run(2)
    return search, reports, lines, llm


@pytest.mark.slow
def test_search_finds_the_mechanism_the_failures_point_to(math_search):
    search, reports, lines, _ = math_search
    rescore, first, second = reports
    assert (
        rescore.kind == "rescore" and rescore.candidates[0].id == "h0" and rescore.candidates[0].mean == 0.0
    )
    assert first.kind == "iteration" and first.iteration == 1 and len(first.candidates) == 3
    assert first.accepted and first.improved and search.incumbent_id == first.incumbent != "h0"
    winner = search.archive.get(first.incumbent)
    assert winner.meta["genome"]["slots"]["tool"] == "none" and winner.eval(0)["mean"] == 1.0
    assert "paired gain +100.0" in first.reason and "z = inf" in first.reason
    assert first.incumbent_before == "h0" and first.rule.startswith("paired gain")
    # h0's episodes all ran out of turns: the first proposal is the mechanism that targets that
    h0_stats = search.archive.get("h0").eval(0)["stats"]
    assert h0_stats["incomplete"] == 1.0 and h0_stats["solved"] == 0.0 and h0_stats["tool_helps"] == 0.0
    assert first.candidates[0].hypothesis.count("out_of_turns 100%") == 1
    assert "tool: offer -> none" in search.archive.get("i001-c0").meta["summary"]
    assert "Aimed at: tool, incomplete" in first.candidates[0].hypothesis
    assert search.incumbent.name == first.incumbent and "class Candidate" in search.incumbent.source
    assert not second.accepted and second.incumbent == first.incumbent
    assert any(line.startswith("iteration 1 (model v0): accepted") for line in lines)


def test_every_scored_rollout_is_counted_once_and_checks_are_reported_apart(math_search):
    search, reports, _, llm = math_search
    tasks = FAST["harness_tasks"]
    assert reports[0].rollouts == tasks and reports[0].check_episodes == 0
    for r in reports[1:]:
        valid = [c for c in r.candidates if c.status == "valid"]
        assert r.rollouts == tasks * len(valid) == sum(c.rollouts for c in r.candidates)
        assert r.check_episodes == sum(c.check_episodes for c in r.candidates) > 0
    evals = [c.eval(0) for c in search.archive.candidates()]
    assert sum(e["rollouts"] for e in evals if e) == sum(r.rollouts for r in reports)
    # a completed step is returned as stored, nothing re-run or re-counted
    calls = len(llm.calls)
    again = search.iterate(0, iteration=1)
    assert again.to_dict() == reports[1].to_dict() and again["rollouts"] == reports[1].rollouts
    assert search.rescore(0).rollouts == tasks and len(llm.calls) == calls
    with pytest.raises(ValueError, match="iteration 9 cannot run now"):
        search.iterate(0, iteration=9)


def test_the_archive_holds_source_meta_evals_and_traces_per_model_version(math_search):
    search, reports, _, _ = math_search
    cand = search.archive.get(reports[1].incumbent)
    meta = cand.meta
    for field in ("id", "parents", "proposer", "hypothesis", "components", "created", "status", "check"):
        assert field in meta
    assert meta["proposer"] == "offline" and meta["parents"] == ["h0"] and meta["status"] == "valid"
    assert meta["components"]["tool"] == "none" and meta["change"] == "mechanism"
    rec = cand.eval(0)
    assert set(rec["per_task"]) == set(search.task_ids) and rec["origin"] == {
        "kind": "iteration",
        "iteration": 1,
    }
    for field in ("mean", "se", "failures", "llm_calls", "prompt_tokens", "completion_tokens", "stats"):
        assert field in rec
    traces = cand.traces(0)
    assert len(traces) == FAST["harness_tasks"] and all(t.harness == cand.id for t in traces)
    assert traces[0].calls and traces[0].calls[0].prompt_ids is None  # text kept, token ids dropped
    assert traces[0].final_info["answer"] == "<hidden>"  # no gold answer for a proposer to copy
    settings = search.archive.settings()
    assert settings["task_ids"] == search.task_ids and len(search.task_ids) == FAST["harness_tasks"]
    assert search.archive.get("h0").source == load_harness("math/h0").source


def test_a_new_model_version_rescores_incumbent_and_frontier(math_search, tmp_path):
    search, reports, _, llm = math_search
    frontier = search.frontier(0)
    assert frontier[0] == search.incumbent_id and len(frontier) == 3
    llm.version = 1
    try:
        rescore = search.rescore(1)
        assert rescore.kind == "rescore" and rescore.model_version == 1
        assert [c.id for c in rescore.candidates] == [search.incumbent_id] + [
            f for f in frontier if f != frontier[0]
        ]
        assert rescore.rollouts == FAST["harness_tasks"] * len(frontier)
        assert all(search.archive.get(c).eval(1) is not None for c in frontier)
        with pytest.raises(ValueError, match="LLM is at version 1"):
            search.iterate(0)
    finally:
        llm.version = 0


def test_failed_validation_and_check_harness_are_recorded_with_their_reason(tmp_path):
    no_model = (
        "from harnesses.base import Harness\n\nclass Lazy(Harness):\n"
        "    def run(self, env, llm):\n        env.reset()\n        env.step('answer: 4')\n"
    )
    bad_import = "import os\nfrom harnesses.base import Harness\n\nclass H(Harness):\n    pass\n"
    proposer = Fixed([bad_import, no_model])
    config = MetaHarnessConfig(**{**FAST, "candidates": 2})
    search = HarnessSearch(config, tmp_path / "a", tool_shy_math_model(), MATH, proposer=proposer)
    report = search.iterate()
    first, second = report.candidates
    assert first.status == "invalid" and first.reason.startswith("validation:") and "'os'" in first.reason
    assert second.status == "invalid" and second.reason.startswith("check_harness:")
    assert "no LLM call recorded" in second.reason and second.check_episodes > 0
    assert report.rollouts == FAST["harness_tasks"]  # only the seed's scoring (this iteration re-scored it)
    assert report.rescore_rollouts == FAST["harness_tasks"] and not report.accepted
    assert search.archive.get("i001-c0").meta["reason"] == first.reason
    assert "**invalid**" in lineage_report(tmp_path / "a")


# ------------------------------------------------------------------------------------ offline proposer


def _eval_record(mean: float, tasks: int, stats: dict, se: float = 0.0, failures=None) -> dict:
    """An evaluation record of h0 (one rollout per task) with the failure statistics ``stats``."""
    return {
        "mean": mean,
        "se": se,
        "tasks": tasks,
        "rollouts": tasks,
        "per_task": {"t": 0.0},
        "failures": failures or {},
        "calls_per_episode": 1.0,
        "stats": stats,
    }


def _context(archive: Archive, iteration: int, slots: list[int], **kw) -> ProposalContext:
    return ProposalContext(
        archive,
        "math",
        MATH,
        iteration,
        slots,
        0,
        kw.get("incumbent", "h0"),
        kw.get("frontier", ["h0"]),
        0,
        "h0",
    )


def test_offline_proposer_is_deterministic_and_a_resumed_iteration_gets_the_same_plan(math_search):
    search, _, _, _ = math_search
    before = search.archive.record("iteration", 1)  # where the search stood when iteration 2 began
    where = {"incumbent": before["incumbent"], "frontier": before["frontier"]}
    a = OfflineProposer().propose(_context(search.archive, 2, [0, 1, 2], **where))
    b = OfflineProposer().propose(_context(search.archive, 2, [0, 1, 2], **where))
    assert [p.source for p in a] == [p.source for p in b] and len(a) == 3
    only_last = OfflineProposer().propose(_context(search.archive, 2, [2], **where))
    assert [p.source for p in only_last] == [a[2].source]
    stored = [search.archive.get(f"i002-c{s}").source for s in range(3)]
    assert [
        p.source for p in a
    ] == stored  # what the search proposed at iteration 2, even with i002-* on disk
    assert all(validate_source(p.source) for p in a)


def test_offline_proposer_never_makes_two_constant_changes_in_a_row(tmp_path):
    lib = libraries()["math"]
    archive = Archive(tmp_path / "a")
    archive.add(
        "h0",
        load_harness("math/h0").source,
        {"parents": [], "genome": lib.h0, "proposer": "seed"},
        status="valid",
    )
    # the last proposal was a pure constant change, and h0's traces point only at constants (truncation)
    genome = copy.deepcopy(lib.h0)
    genome["constants"]["max_tokens"] = 96
    archive.add(
        "i001-c0",
        lib.render(genome, "i001-c0", "x"),
        {"parents": ["h0"], "genome": genome, "proposer": "offline", "change": "constant"},
        status="valid",
    )
    stats = {"solved": 0.0, "parse": 0.0, "wrong": 0.0, "truncated": 1.0}
    archive.write_eval("h0", 0, _eval_record(0.0, 1, stats), None)
    plan = OfflineProposer().propose(_context(archive, 2, [0, 1, 2]))
    changes = [p.change for p in plan]
    assert changes[0] != "constant"
    assert all(not (x == y == "constant") for x, y in itertools.pairwise(changes))


@pytest.mark.parametrize(
    ("domain", "harness", "stats", "expected"),
    [
        (
            "chess",
            "chess_puzzles/h0",
            {"illegal": 0.8},
            {("action", "choose"), ("action", "generate_choose")},
        ),
        ("chess", "chess_puzzles/h0", {"parse": 0.8}, {("output", "lenient"), ("action", "choose")}),
        ("math", "math/h0", {"tool": 0.9}, {("tool", "none")}),
        ("search", "search_qa/h0", {"missed": 0.9}, {("query", "question"), ("query", "keywords")}),
        ("search", "search_qa/h0", {"partial": 0.9}, {("follow_up", "model"), ("follow_up", "model_choose")}),
    ],
)
def test_offline_proposer_picks_mechanisms_from_the_failure_statistics(
    tmp_path, domain, harness, stats, expected
):
    lib = libraries()[domain]
    archive = Archive(tmp_path / "a")
    archive.add(
        "h0",
        load_harness(harness).source,
        {"parents": [], "genome": lib.h0, "proposer": "seed"},
        status="valid",
    )
    archive.write_eval(
        "h0", 0, _eval_record(0.1, 100, {"solved": 0.1, **stats}, se=0.01, failures={"x": 90}), None
    )
    ctx = ProposalContext(archive, domain, "env", 1, [0, 1, 2], 0, "h0", ["h0"], 0, "h0")
    first = OfflineProposer().propose(ctx)[0]
    slot, change = first.summary.split(": ")
    assert (slot, change.split(" -> ")[1]) in expected, first.summary
    assert (
        first.change == "mechanism"
        and first.parents == ["h0"]
        and first.genome["slots"][slot] != lib.h0["slots"][slot]
    )


def test_search_failures_split_into_missed_partial_and_misread():
    from whale_train.meta_harness.evaluate import trace_stats
    from whale_train.rollout import Trajectory

    def traj(solved, answer_shown, gold_found):
        info = {"answer_retrieved": answer_shown, "gold_retrieved": gold_found}
        return Trajectory(
            "t", 0, 0, "h", "e", 0, solved=solved, failure="" if solved else "wrong_answer", final_info=info
        )

    trajs = [
        traj(True, True, True),  # solved: none of the three
        traj(False, False, False),  # the queries found nothing of the chain
        traj(False, False, None),  # a source without supporting passages: counted as missed
        traj(False, False, True),  # part of the chain found, not the answer: a hop short
        traj(False, True, True),  # the answer was shown, the reply was wrong
    ]
    stats = trace_stats(trajs)
    assert (stats["missed"], stats["partial"], stats["misread"], stats["wrong"]) == (0.4, 0.2, 0.2, 0.8)
    math_like = Trajectory("t", 0, 0, "h", "e", 0, failure="wrong_answer")  # no retrieval info at all
    assert trace_stats([math_like])["missed"] == trace_stats([math_like])["misread"] == 0.0


@pytest.mark.slow
def test_offline_prompt_only_changes_only_prompt_text(tmp_path):
    config = MetaHarnessConfig(**{**FAST, "prompt_only": True})
    search = HarnessSearch(config, tmp_path / "a", tool_shy_math_model(), MATH)
    report = search.iterate()
    assert len(report.candidates) == 3 and all(c.change == "prompt" for c in report.candidates)
    seed = search.archive.get("h0").source
    for c in report.candidates:
        assert c.status == "valid" and prompt_only_violation(seed, search.archive.get(c.id).source) is None
    # the edit that drops the tool offer is the one that works on this model
    assert report.accepted and search.archive.get(report.incumbent).meta["components"]["edits"] == [
        "no-tool-offer"
    ]


@pytest.mark.slow
def test_prompt_only_mode_rejects_a_candidate_whose_code_differs(tmp_path):
    seed = load_harness("math/h0").source
    text_only = seed.replace("Put the final answer", "Write the final answer")
    code_change = seed.replace('return f"answer: {boxed}" if boxed else None', 'return f"answer: {boxed}"')
    assert text_only != seed and code_change != seed
    config = MetaHarnessConfig(**{**FAST, "prompt_only": True, "candidates": 2})
    search = HarnessSearch(
        config, tmp_path / "a", tool_shy_math_model(), MATH, proposer=Fixed([text_only, code_change])
    )
    a, b = search.iterate().candidates
    assert a.status == "valid"
    assert b.status == "invalid" and b.reason.startswith("prompt-only:") and "line" in b.reason


def test_prompt_only_violation_masks_strings_and_fstring_text_only():
    seed = 'def f(x):\n    """Doc."""\n    return f"a {x} b" + "c"\n'
    assert prompt_only_violation(seed, 'def f(x):\n    """Other."""\n    return f"zz {x}" + "yy"\n') is None
    assert "line 3" in prompt_only_violation(
        seed, 'def f(x):\n    """Doc."""\n    return f"a {x + 1} b" + "c"\n'
    )
    assert prompt_only_violation(seed, 'def f(y):\n    """Doc."""\n    return f"a {y} b" + "c"\n')
    assert prompt_only_violation(seed, 'def f(x):\n    """Doc."""\n    return f"a {x} b" + "c" + x\n')
    for domain, harness in (("chess", "chess_puzzles/h0"), ("math", "math/h0"), ("search", "search_qa/h0")):
        source = load_harness(harness).source
        for edit in get_domain(domain).load_prompt_edits():
            assert edit.applies(source), (domain, edit.key)
            edited = edit.apply(source)
            assert edited != source and prompt_only_violation(source, edited) is None, (domain, edit.key)
            validate_source(edited)


# ------------------------------------------------------------------------------------ tools and report


def test_archive_tools_see_the_archive_and_nothing_else(math_search, tmp_path):
    search, _, _, _ = math_search
    root = search.archive.root
    (root.parent / "test.json").write_text('{"secret": 1}')
    os.symlink(root.parent / "test.json", root / "link.json")
    try:
        tools = ArchiveTools(root)
        listing = tools.list_files(".")
        assert "h0/" in listing and "search/" in listing and STAGING_DIR not in listing
        assert "class MathH0" in tools.read_file("h0/harness.py")
        assert tools.read_file("h0/harness.py", offset=5, length=10).startswith(
            load_harness("math/h0").source[5:15]
        )
        assert "i001-c" in tools.grep(r'"tool": "none"', ".")
        for bad in (
            "../test.json",
            "/etc/passwd",
            "link.json",
            "~/x",
            f"{STAGING_DIR}/x",
            "h0/../../test.json",
        ):
            with pytest.raises(ToolError):
                tools.read_file(bad)
        with pytest.raises(ToolError):
            tools.grep("secret", "..")
        assert "secret" not in tools.grep("secret", ".")
    finally:
        (root / "link.json").unlink()


def test_lineage_report_shows_the_tree_scores_hypotheses_and_decisions(math_search):
    search, reports, _, _ = math_search
    text = lineage_report(search.archive.root)
    winner = reports[1].incumbent
    assert text.startswith("# Harness search on whale/Math-v0")
    assert f"★ `{winner}` tool: offer -> none [offline]" in text
    assert "- `h0` seed (math/h0) — v0 0.0 ± 0.0" in text
    assert f"  - ★ `{winner}`" in text  # a child of h0 in the tree
    assert "accepted at iteration 1" in text and "| 1 | iteration 1 | v0 |" in text
    assert "Aimed at: " in text and "100.0 ± 0.0" in text
    assert json.loads((search.archive.root / "search" / "iterations" / "001.json").read_text())["accepted"]


# ------------------------------------------------------------------------------------ command line


@pytest.mark.slow
def test_whale_search_command_runs_resumes_and_scores_the_test_split_outside_the_archive(
    fresh_model_dir, tmp_path
):
    from whale_train.cli import main

    out = tmp_path / "out"
    search_qa = "whale/SearchQA-v0"  # the cheapest h0 for an untrained model: two short calls an episode
    argv = ["search", "--env", search_qa, "--model", fresh_model_dir, "--iterations", "1", "--out", str(out)]
    argv += ["--harness-tasks", "6", "--candidates", "2", "--set", "check_tasks=2", "--test-limit", "6"]
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["env"] == search_qa and results["seed"] == "h0" and results["iterations"] == 1
    assert results["search"]["seed"]["tasks"] == 6 and results["test"]["seed"]["tasks"] == 6
    for name in ("seed", "incumbent"):  # the gap: search-split minus test-split success rate
        gap = results["search"][name]["mean"] - results["test"][name]["mean"]
        assert results["gap"][name] == pytest.approx(gap, abs=1e-4)
    assert [a["id"] for a in results["accepted"]] == (
        [results["incumbent"]] if results["incumbent"] != "h0" else []
    )
    assert results["search_seconds"] > 0
    archive = Archive(out / "archive", readonly=True)
    valid = sum(archive.get(c).meta["status"] == "valid" for c in ("i001-c0", "i001-c1"))
    assert valid >= 1 and results["rollouts"] == 6 + 6 * valid
    assert sorted(p.name for p in (out / "archive").iterdir()) == ["h0", "i001-c0", "i001-c1", "search"]
    assert list((out / "test").glob("h0-v0-n6-k1.json")) and (out / "lineage.md").read_text().startswith(
        "# Harness"
    )
    mtime = (out / "archive" / "search" / "iterations" / "001.json").stat().st_mtime
    assert main(argv) == 0  # resumed: nothing re-run
    assert (out / "archive" / "search" / "iterations" / "001.json").stat().st_mtime == mtime
    assert json.loads((out / "results.json").read_text())["rollouts"] == results["rollouts"]
    assert main(["lineage", str(out / "archive"), "--out", str(tmp_path / "l.md")]) == 0
    assert "`h0` seed (search_qa/h0)" in (tmp_path / "l.md").read_text()


# ------------------------------------------------------------------------------------ the shipped model


def shipped_search(tmp_path, env_id, tasks, candidates=3):
    """One iteration of the offline search on the frozen shipped model: (h0's record, iteration report, search)."""
    from whale_train.llm import default_model, load_llm

    llm = load_llm("transformers", default_model())
    config = MetaHarnessConfig(harness_tasks=tasks, candidates=candidates, check_tasks=4, concurrency=64)
    search = HarnessSearch(config, tmp_path / "a", llm, env_id)
    _, first = search.run(1)
    return search.archive.get("h0").eval(0), first, search


@pytest.mark.effect
@pytest.mark.slow
def test_harness_search_improves_math_on_the_frozen_shipped_model(tmp_path):
    """The effect, small: one iteration on 64 search tasks beats h0 by far more than the noise."""
    h0, first, search = shipped_search(tmp_path, MATH, 64)
    assert h0["stats"]["tool_helps"] > 0.2  # what pointed the proposer at the tool mechanisms
    proposed = [search.archive.get(c.id).meta["components"] for c in first.candidates]
    assert proposed[0]["action"] == "prefer_tool" and proposed[1]["tool"] == "calculator"
    best = search.archive.get(first.incumbent)
    assert first.accepted and best.meta["components"]["tool"] == "calculator", first.reason
    assert best.eval(0)["mean"] > h0["mean"] + 0.4
    gain = next(c for c in first.candidates if c.id == first.incumbent)
    assert gain.gain > 4 * gain.gain_se


@pytest.mark.effect
@pytest.mark.slow
def test_harness_search_improves_search_qa_on_the_frozen_shipped_model(tmp_path):
    """Most of h0's misses found part of the supporting chain: follow-up searches, answer picked by likelihood.
    256 tasks: on the 128 of the keyed split the gain (+4.7 ± 3.5) was under the acceptance rule's 2 SE."""
    h0, first, search = shipped_search(tmp_path, "whale/SearchQA-v0", 256)
    assert h0["stats"]["partial"] > 2 * h0["stats"]["missed"]
    best = search.archive.get(first.incumbent)
    assert first.accepted and best.meta["components"]["follow_up"] == "model_choose", first.reason
    gain = next(c for c in first.candidates if c.id == first.incumbent)
    assert gain.gain > 0.06 and gain.gain > 2 * gain.gain_se


@pytest.mark.effect
@pytest.mark.slow
def test_harness_search_improves_chess_on_the_frozen_shipped_model(tmp_path):
    """Illegal moves dominate h0's failures: likelihood choice among the legal moves, one candidate."""
    h0, first, search = shipped_search(tmp_path, "whale/Chess-v0", 48, candidates=1)
    assert h0["stats"]["illegal"] > 0.3
    best = search.archive.get(first.incumbent)
    assert first.accepted and best.meta["components"]["action"] == "choose", first.reason
    gain = first.candidates[0]
    assert gain.gain > 0.05 and gain.gain > 2 * gain.gain_se and best.eval(0)["stats"]["illegal"] == 0
