"""``whale compare``: the statistics helpers on hand-made numbers, the table from hand-made ledgers,
the grid plan, and the smoke grid end to end (matched budgets, a killed run continued, a rerun that
does no new work)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.procs import carrying, running, running_children
from tests.train.conftest import SMOKE_KILLED
from whale_train.compare import (
    CompareConfig,
    build_table,
    holm,
    mean_sd,
    operator_gains,
    paired_ci,
    plan,
    reproduction,
    rollouts_to_reach,
    run_grid,
    run_state,
    step_curve,
    t_quantile,
    unit_cost,
    write_table,
)
from whale_train.compare.plan import prune_checkpoints

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "configs" / "compare" / "smoke.yaml"
METHODS5 = ["whale", "weight-only", "harness-only", "stagewise", "fst"]


# ------------------------------------------------------------------------------------------ statistics


@pytest.mark.parametrize(
    "df, expected", [(1, 12.706205), (2, 4.302653), (4, 2.776445), (10, 2.228139), (30, 2.042272)]
)
def test_t_quantile_matches_the_tables(df, expected):
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=1e-5)
    assert t_quantile(0.025, df) == pytest.approx(-expected, abs=1e-5)


def test_paired_ci_by_hand():
    # whale - baseline by seed: 0.1, 0.2, 0.3 -> mean 0.2, sd 0.1, t(0.975, 2) = 4.302653
    ci = paired_ci([0.5, 0.6, 0.7], [0.4, 0.4, 0.4])
    half = 4.302653 * 0.1 / math.sqrt(3)
    assert ci["n"] == 3 and ci["diffs"] == pytest.approx([0.1, 0.2, 0.3])
    assert ci["mean"] == pytest.approx(0.2) and ci["sd"] == pytest.approx(0.1)
    assert (ci["lo"], ci["hi"]) == pytest.approx((0.2 - half, 0.2 + half), abs=1e-6)
    one = paired_ci([0.5], [0.25])
    assert one["mean"] == 0.25 and one["lo"] is None and one["hi"] is None
    same = paired_ci([0.3, 0.5], [0.1, 0.3])  # identical differences: a zero-width interval
    assert (same["lo"], same["hi"]) == pytest.approx((0.2, 0.2))
    with pytest.raises(ValueError):
        paired_ci([0.1, 0.2], [0.1])
    assert mean_sd([]) == (None, None) and mean_sd([2.0]) == (2.0, None)
    assert mean_sd([1.0, 3.0]) == pytest.approx((2.0, math.sqrt(2)))


def _evals(*points):
    return [{"rollouts_total": x, "mean": y, "se": 0.0} for x, y in points]


def test_rollouts_to_reach_and_step_curve():
    evals = _evals((0, 0.2), (64, 0.3), (128, 0.5), (128, 0.45), (192, 0.4))
    assert rollouts_to_reach(evals, 0.45) == 128
    assert rollouts_to_reach(evals, 0.5) == 128  # reaching means at least as high
    assert rollouts_to_reach(evals, 0.2) == 0
    assert rollouts_to_reach(evals, 0.51) is None
    curve = step_curve(evals, [0, 32, 64, 100, 128, 150, 192, 500])
    # the last evaluation at or before each point; two at 128: the later one counts
    assert curve.tolist() == pytest.approx([0.2, 0.2, 0.3, 0.3, 0.45, 0.45, 0.4, 0.4])
    late = step_curve(_evals((10, 0.5)), [0, 10])
    assert math.isnan(late[0]) and late[1] == 0.5


# ------------------------------------------------------------------------------------------ config and plan


def _write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


TINY_SET = {
    "budget_rollouts": 100,
    "rsft": {"batch_tasks": 4, "samples": 2},
    "search": {"candidates": 2, "harness_tasks": 5, "frontier_size": 1},
    "eval.k": 8,
}


def test_plan_resolves_domains_overrides_and_the_ablation(tmp_path):
    base = _write(tmp_path / "math_base.yaml", {"env": "whale/Math-v0", "rsft": {"learning_rate": 5.0e-5}})
    path = _write(
        tmp_path / "grid.yaml",
        {
            "domains": {
                "math": "math_base.yaml",  # relative to the compare config
                "chess": {"set": {"env": "whale/Chess-v0", "budget_rollouts": 40, "eval": {"limit": 5}}},
            },
            "methods": ["whale", "weight-only"],
            "seeds": [0, 1],
            "set": {**TINY_SET, "schedule": {"weight_epochs": 0.6, "harness_iterations": 6}},
            "ablation": {"domain": "math", "points": [[0.2, 2], [0.6, 6]]},
        },
    )
    cfg = CompareConfig.load(path, ["eval.limit=3"])
    assert cfg.name == "grid" and [d.name for d in cfg.domains] == ["math", "chess"]
    assert cfg.domains[0].config == base
    runs = plan(cfg)
    assert [r.id for r in runs][:4] == [
        "math-whale-s0",
        "math-weight-only-s0",
        "chess-whale-s0",
        "chess-weight-only-s0",
    ]
    by_id = {r.id: r for r in runs}
    math_run, chess_run = by_id["math-weight-only-s1"].config, by_id["chess-whale-s1"].config
    assert (math_run.method, math_run.seed, math_run.env) == ("weight-only", 1, "whale/Math-v0")
    assert math_run.rsft.learning_rate == 5e-5 and math_run.rsft.batch_tasks == 4  # base, then the grid's set
    assert math_run.eval.k == 8 and math_run.eval.limit == 3  # dotted keys and --set
    assert (chess_run.env, chess_run.budget_rollouts) == ("whale/Chess-v0", 40)  # the domain's set wins
    assert chess_run.eval.limit == 3 and chess_run.eval.k == 8  # over set, and --set over both
    # a unit costs at most max(B * k, harness tasks * rollouts per task * max(M, 1 + frontier))
    assert unit_cost(math_run) == max(4 * 2, 5 * 1 * 2) == by_id["math-whale-s0"].max_unit
    # the (0.6, 6) point is the grid's whale run; (0.2, 2) is a run of its own
    assert by_id["math-whale-E0.6-I6-s0"].config.name == "math-whale-s0"
    e02 = by_id["math-whale-E0.2-I2-s1"].config
    assert e02.name == "math-whale-E0.2-I2-s1"
    assert (e02.schedule.weight_epochs, e02.schedule.harness_iterations, e02.seed) == (0.2, 2, 1)
    assert len({r.config.name for r in runs}) == 2 * 2 * 2 + 2

    bad = _write(tmp_path / "bad.yaml", {"domains": {"math": {"set": {"env": "whale/Math-v0"}}}, "sets": {}})
    with pytest.raises(ValueError, match="unknown compare key"):
        CompareConfig.load(bad)
    missing = _write(tmp_path / "missing.yaml", {"domains": {"math": "nowhere.yaml"}})
    with pytest.raises(FileNotFoundError, match="nowhere.yaml"):
        CompareConfig.load(missing)
    mixed = _write(
        tmp_path / "mixed.yaml",
        {"domains": {"math": {"set": {"env": "whale/Math-v0"}}}, "methods": ["magic"]},
    )
    with pytest.raises(ValueError, match="unknown method"):
        CompareConfig.load(mixed)
    keep = _write(
        tmp_path / "keep.yaml",
        {"domains": {"math": {"set": {"env": "whale/Math-v0"}}}, "keep_checkpoints": "some"},
    )
    with pytest.raises(ValueError, match="keep_checkpoints: 'some'"):
        CompareConfig.load(keep)


def test_more_seeds_add_seeds_to_some_methods_of_a_domain(tmp_path):
    """``more_seeds:`` (an amendment's added seeds): runs after the grid's, before the ablation, seed-major;
    the rollout comparisons leave out a seed without weight-only's peak instead of charging it the budget."""
    from whale_train.compare.verdict import comparisons

    grid = {
        "domains": {"math": {"set": {"env": "whale/Math-v0"}}, "chess": {"set": {"env": "whale/Chess-v0"}}},
        "methods": ["whale", "weight-only", "stagewise"],
        "seeds": [0, 1],
        "set": TINY_SET,
        "ablation": {"domain": "math", "points": [[0.2, 2]]},
    }
    more = [
        {"domain": "chess", "methods": ["stagewise", "whale"], "seeds": [2, 3]},
        {"domain": "math", "methods": ["whale"], "seeds": [3]},
    ]
    cfg = CompareConfig.load(_write(tmp_path / "grid.yaml", {**grid, "more_seeds": more}))
    ids = [r.id for r in plan(cfg)]
    assert ids[12:] == [
        "chess-whale-s2",  # the config's order of methods, not the entry's
        "chess-stagewise-s2",
        "math-whale-s3",  # seed-major: every domain's seed 3 after seed 2
        "chess-whale-s3",
        "chess-stagewise-s3",
        "math-whale-E0.2-I2-s0",
        "math-whale-E0.2-I2-s1",
    ]
    assert {r.id: r.config.seed for r in plan(cfg)}["chess-stagewise-s3"] == 3
    one = cfg.only_seeds([3])
    assert [r.id for r in plan(one)] == ["math-whale-s3", "chess-whale-s3", "chess-stagewise-s3"]
    # a subset with no run of a domain (math at seed 2) or of the ablation still makes its table
    from whale_train.compare.markdown import to_markdown
    from whale_train.compare.table import build_table

    two = cfg.only_seeds([2])
    table = build_table(two, plan(two), tmp_path / "out")
    assert list(table["domains"]) == ["chess"] and "ablation" not in table
    assert "## chess" in to_markdown(table, {})
    for entry, message in [
        ({"domain": "go", "seeds": [5]}, "more_seeds\\[0\\]: domain 'go'"),
        ({"domain": "math", "methods": ["fst"], "seeds": [5]}, "method\\(s\\) \\['fst'\\]"),
        ({"domain": "math", "seeds": [1, 5]}, "seeds the grid does not have"),
        ({"domain": "math", "seed": [5]}, "a mapping with domain, methods and seeds"),
    ]:
        with pytest.raises(ValueError, match=message):
            CompareConfig.load(_write(tmp_path / "bad.yaml", {**grid, "more_seeds": [entry]}))

    # seed 2 has whale and stagewise but no weight-only run: no peak to reach, so no rollout pair
    table = _verdict_table({"weight-only": [0.1, 0.1], "stagewise": [0.0, 0.05, 0.02]}, seeds=3)
    table["domains"]["chess"]["reference_peak"] = {"0": 0.4, "1": 0.4}
    rows = {r["comparison"]: r for r in comparisons(table)}
    assert rows["whale − stagewise"]["seeds"] == ["0", "1", "2"]
    assert rows["rollouts to weight-only's peak: stagewise − whale"]["seeds"] == ["0", "1"]
    assert rows["whale − weight-only"]["seeds"] == ["0", "1"]


def test_a_finished_run_keeps_only_the_checkpoints_an_evaluation_scored(tmp_path):
    run = tmp_path / "run"
    for name in ["0", "1", "2", "3", "resume-3"]:
        (run / "checkpoints" / name).mkdir(parents=True)
    events = [{"event": "eval", "model_version": 0}, {"event": "unit"}, {"event": "eval", "model_version": 2}]
    (run / "ledger.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    assert prune_checkpoints(run) == ["1", "3"]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["0", "2", "resume-3"]
    assert CompareConfig.load(ROOT / "configs" / "compare" / "decisive.yaml").keep_checkpoints == "evaluated"


def test_the_shipped_compare_configs_resolve():
    cfg = CompareConfig.load(SMOKE)
    runs = plan(cfg)
    assert [d.name for d in cfg.domains] == ["math"] and cfg.methods == METHODS5 and cfg.seeds == [0, 1]
    assert all(r.config.rsft.learning_rate <= 2e-4 for r in runs)
    cpu = ROOT / "configs" / "compare" / "cpu.yaml"
    data = yaml.safe_load(cpu.read_text())
    assert sorted(data["domains"]) == ["chess", "math", "search"] and data["methods"] == METHODS5
    assert data["seeds"] == [0, 1, 2]
    assert [tuple(p) for p in data["ablation"]["points"]] == [(0.2, 2), (0.2, 6), (0.6, 2), (0.6, 6)]
    paths = [d if isinstance(d, str) else d.get("config") for d in data["domains"].values()]
    if all(Path(ROOT, p).exists() for p in paths if p):  # the per-domain configs are there
        old = Path.cwd()
        os.chdir(ROOT)
        try:
            runs = plan(CompareConfig.load(cpu))
        finally:
            os.chdir(old)
        assert len({r.config.name for r in runs}) == 3 * 5 * 3 + 3 * 3  # (0.6, 6) is the grid's whale
        assert all(r.config.rsft.learning_rate <= 2e-4 and r.config.eval.k == 8 for r in runs)


# ------------------------------------------------------------------------------------------ the table


def _fake_run(out: Path, spec, evals, spent: int, elapsed: float) -> None:
    """A finished run directory: config.yaml, a ledger (start, evals, units, stop), state.json."""
    run = out / "runs" / spec.config.name
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(spec.config.to_dict(), sort_keys=False))
    events = [{"event": "start", "unit": 0, "rollouts_total": 0}]
    for x, mean, *select in evals:  # (rollouts, test mean[, harness-split score])
        e = {"event": "eval", "unit": 0, "rollouts_total": x, "mean": mean, "se": 0.05}
        events.append({**e, "select_mean": select[0]} if select else e)
    events.append(
        {
            "event": "unit",
            "unit": 0,
            "phase": "weight",
            "rollouts": spent,
            "rollouts_total": spent,
            "seconds": 1,
        }
    )
    events.append({"event": "stop", "rollouts_total": spent, "reason": "budget"})
    (run / "ledger.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (run / "state.json").write_text(json.dumps({"elapsed": elapsed}))


def test_table_from_hand_made_ledgers(tmp_path):
    path = _write(
        tmp_path / "grid.yaml",
        {
            "domains": {"math": {"set": {"env": "whale/Math-v0"}}},
            "methods": ["whale", "weight-only", "harness-only"],
            "seeds": [0, 1, 2],
            "set": TINY_SET,
            "ablation": {"domain": "math", "points": [[0.2, 2]], "seeds": [0, 1]},
        },
    )
    cfg = CompareConfig.load(path)
    runs = plan(cfg)
    out = tmp_path / "out"
    curves = {
        # seed: method: (evals, spent)
        0: {"whale": [(0, 0.2), (40, 0.5), (96, 0.6)], "weight-only": [(0, 0.2), (60, 0.4), (96, 0.45)]},
        1: {"whale": [(0, 0.2), (50, 0.3), (90, 0.5)], "weight-only": [(0, 0.2), (30, 0.35), (98, 0.3)]},
        2: {"whale": [(0, 0.1), (96, 0.2)], "weight-only": [(0, 0.1), (20, 0.4)]},
    }
    harness_only = {0: [(0, 0.2), (80, 0.5)], 1: [(0, 0.2)], 2: [(0, 0.1), (50, 0.45)]}
    # the ablation's runs have harness-split scores: (rollouts, test mean, harness-split score)
    ablation = {
        0: [(0, 0.2, 0.3), (60, 0.7, 0.6), (90, 0.6, 0.5)],
        1: [(0, 0.2, 0.3), (60, 0.5, 0.4), (90, 0.4, 0.45)],
    }
    for r in runs:
        if r.point is not None:
            evals = ablation[r.seed]
        elif r.method == "harness-only":
            evals = harness_only[r.seed]
        else:
            evals = curves[r.seed][r.method]
        _fake_run(out, r, evals, spent=96 + r.seed, elapsed=60.0)
    table = build_table(cfg, runs, out)
    d = table["domains"]["math"]
    assert d["budget"] == 100 and d["max_unit_rollouts"] == 10 and d["k"] == 8
    assert d["reference_peak"] == {"0": 0.45, "1": 0.35, "2": 0.4}
    w, wo, ho = d["methods"]["whale"], d["methods"]["weight-only"], d["methods"]["harness-only"]
    assert w["best"] == [0.6, 0.5, 0.2] and w["seeds"] == [0, 1, 2]
    assert (w["best_mean"], w["best_sd"]) == pytest.approx(mean_sd([0.6, 0.5, 0.2]))
    # rollouts to reach weight-only's peak, per seed: 40, 90, not reached -> mean over the two that did
    assert w["reach"] == [40, 90, None] and (w["reached"], w["reach_of"], w["reach_mean"]) == (2, 3, 65)
    assert wo["reach"] == [96, 30, 20] and wo["reach_mean"] == pytest.approx(146 / 3)
    assert ho["reach"] == [80, None, 50]
    assert w["rollouts"] == [96, 97, 98] and w["wall_seconds"] == 180.0
    p = d["paired"]["weight-only"]
    expected = paired_ci([0.6, 0.5, 0.2], [0.45, 0.35, 0.4])
    assert p["seeds"] == [0, 1, 2] and p["mean"] == pytest.approx(expected["mean"])
    assert (p["lo"], p["hi"]) == pytest.approx((expected["lo"], expected["hi"]))
    assert p["lo"] < p["mean"] < p["hi"]
    (point,) = table["ablation"]["points"]
    assert (point["weight_epochs"], point["harness_iterations"], point["best"]) == (0.2, 2, [0.7, 0.5])
    assert point["reach"] == [60, 60] and (point["reached"], point["reach_of"]) == (2, 2)
    # three numbers per ablation run too; the selected one (never chosen by a test score) is its headline
    assert (point["final"], point["selected"], table["ablation"]["metric"]) == (
        [0.6, 0.4],
        [0.7, 0.4],
        "selected",
    )
    # a seed that is missing drops out of the pairs, and the cell says so
    (out / "runs" / "math-harness-only-s1" / "ledger.jsonl").unlink()
    table = build_table(cfg, runs, out)
    assert table["domains"]["math"]["methods"]["harness-only"]["missing_seeds"] == [1]
    assert table["domains"]["math"]["paired"]["harness-only"]["seeds"] == [0, 2]
    md = write_table(table, out).read_text()
    # best, final (here the last evaluation is each whale run's best), selected (no harness-split scores)
    assert "| whale | 43.3 ± 20.8 | 43.3 ± 20.8 | — | 3 | 65 (2/3 seeds; not reached by the others) |" in md
    assert "| whale − weight-only |" in md and "## Schedule ablation" in md
    assert "| 0.2 | 2 | 55.0 ± 21.2 | 60.0 ± 14.1 | 50.0 ± 14.1 | 2 | 0: 70.0, 1: 40.0 | 60 |" in md
    # verdicts on the numbers the runs have (best, final), none on the selected one (no harness scores)
    assert "## Verdicts" in md and "On the **best** number" in md and "On the **selected** number" not in md
    assert "| 1 | math | whale − weight-only (points) |" in md
    assert "| method | RSFT steps | test gain: RSFT only (points) |" in md
    for png in ("accuracy_math.png", "ablation.png"):
        assert (out / "plots" / png).stat().st_size > 1000


def test_holm_by_hand():
    # sorted p: 0.01 (x3 = 0.03, tested at 0.05/3: rejected), 0.03 (x2 = 0.06 > 0.05/2: fails), 0.04 (x1,
    # held to the running maximum 0.06); after the failed step the intervals stay at its level
    out = holm([0.01, 0.04, 0.03, None])
    assert [o["p_adjusted"] for o in out[:3]] == pytest.approx([0.03, 0.06, 0.06])
    assert [o["reject"] for o in out] == [True, False, False, False]
    assert [o["level"] for o in out[:3]] == pytest.approx([1 - 0.05 / 3, 1 - 0.05 / 2, 1 - 0.05 / 2])
    assert out[3] == {"p_adjusted": None, "reject": False, "level": None}


def test_three_numbers_per_run_and_the_selection_rule(tmp_path):
    path = _write(
        tmp_path / "grid.yaml",
        {"domains": {"math": {"set": {"env": "whale/Math-v0"}}}, "methods": ["whale"], "set": TINY_SET},
    )
    cfg = CompareConfig.load(path)
    (run,) = plan(cfg)
    out = tmp_path / "out"
    # test 60% at 50 rollouts is the best; the harness split prefers the last two equally: the later wins
    _fake_run(out, run, [(0, 0.2, 0.1), (50, 0.6, 0.3), (80, 0.3, 0.5), (96, 0.4, 0.5)], spent=96, elapsed=1)
    r = build_table(cfg, [run], out)["runs"]["math-whale-s0"]
    assert (r["best_mean"], r["final"], r["selected"]) == (0.6, 0.4, 0.4)
    assert (r["best_at"], r["final_at"], r["selected_at"]) == (50, 96, 96)
    cell = build_table(cfg, [run], out)["domains"]["math"]["methods"]["whale"]
    assert cell["per_seed"]["0"]["selected"] == 0.4 and cell["selected_mean"] == 0.4


def _verdict_table(diffs: dict[str, list[float]], seeds: int = 5) -> dict:
    """A compare.json with whale at 0.5 on every seed and each baseline at 0.5 - diff."""
    per = lambda values: {  # noqa: E731
        str(s): {
            "best": v,
            "final": v,
            "selected": v,
            "best_at": 100,
            "reach": 100,
            "weight_gain": 0.0,
            "harness_gain": 0.0,
            "search_gain": 0.0,
        }
        for s, v in enumerate(values)
    }
    methods = {"whale": {"per_seed": per([0.5] * seeds)}}
    for base, ds in diffs.items():
        methods[base] = {"per_seed": per([0.5 - x for x in ds])}
    return {"domains": {"chess": {"budget": 1000, "methods": methods}}}


def test_verdicts_by_hand():
    from whale_train.compare.verdict import verdict_markdown, verdicts

    table = _verdict_table(
        {
            "weight-only": [0.10, 0.11, 0.09, 0.10, 0.10],  # +10 points, SE 0.3: holds
            "harness-only": [0.01, -0.01, 0.02, -0.02, 0.0],  # around 0, small SE: not resolved, not +4.15
            "fst": [-0.06, -0.05, -0.07, -0.06, -0.06],  # whale worse: does not hold
            "stagewise": [0.10, -0.05, 0.12, 0.0, 0.08],  # SE 3.2 points > 1.5: not resolved
        }
    )
    v = verdicts(table, "selected")
    rows = {r["comparison"]: r for r in v["rows"]}
    cost = "rollouts to weight-only's peak: stagewise − whale"
    assert v["family"] == 5 and set(rows) == {
        "whale − weight-only",
        "whale − harness-only",
        "whale − fst",
        "whale − stagewise",
        cost,
    }
    assert rows[cost]["unit"] == "rollouts" and rows[cost]["verdict"] == "not resolved"  # both reach at 100
    assert rows["whale − weight-only"]["verdict"] == "holds"
    assert rows["whale − weight-only"]["mean"] == pytest.approx(0.10)
    assert rows["whale − weight-only"]["lo_holm"] > 0 and rows["whale − weight-only"]["p_holm"] < 0.05
    assert rows["whale − fst"]["verdict"] == "does not hold" and rows["whale − fst"]["hi_holm"] < 0
    ho = rows["whale − harness-only"]
    assert ho["verdict"] == "not resolved" and "contains 0" in ho["reason"] and ho["excludes_paper_effect"]
    sw = rows["whale − stagewise"]
    assert sw["verdict"] == "not resolved" and sw["reason"].startswith("SE 3.22 > 1.50")
    # its per-seed differences have an SD of 7.2 points: an SE of 1.5 needs (7.2 / 1.5)^2 -> 24 seeds
    assert sw["seeds_for_max_se"] == 24 and rows["whale − weight-only"]["seeds_for_max_se"] == 2
    table_md = "\n".join(verdict_markdown(v))
    assert "**not resolved** (an SE of 1.5 needs about 24 seeds)" in table_md
    # the corrected interval is wider than the plain 95% one
    assert rows["whale − weight-only"]["lo_holm"] < rows["whale − weight-only"]["lo"]
    # one seed: nothing to resolve
    one = verdicts(_verdict_table({"weight-only": [0.1]}, seeds=1))
    assert one["rows"][0]["verdict"] == "not resolved" and one["rows"][0]["reason"] == "1 paired seed(s)"


def _cell(seeds, best):
    mean, sd = mean_sd(best)
    return {"seeds": seeds, "best": best, "best_mean": mean, "best_sd": sd}


def test_reproduction_against_a_reference_table():
    reference = {
        "name": "cpu",
        "domains": {
            "math": {"methods": {"whale": _cell([0, 1, 2], [0.5, 0.7, 0.6]), "fst": _cell([0], [0.3])}}
        },
        "ablation": {
            "domain": "math",
            "points": [{"weight_epochs": 0.2, "harness_iterations": 2, **_cell([0], [0.4])}],
        },
    }
    table = {
        "domains": {
            "math": {"methods": {"whale": _cell([0, 1, 2], [0.6, 0.6, 0.65]), "fst": _cell([0], [0.3])}},
            "chess": {"methods": {"whale": _cell([0], [0.9])}},
        },
        "ablation": None,
    }
    rep = reproduction(table, reference)
    whale, fst = rep["cells"]
    # this mean 0.6167 lies within 0.6 ± 0.1; the same seed's runs differ by +0.1, -0.1, +0.05
    assert whale["cell"] == "math whale" and whale["within"] and whale["identical_seeds"] == 0
    assert whale["diff"] == pytest.approx(0.6167 - 0.6, abs=1e-4)
    assert whale["per_seed"] == pytest.approx({"0": 0.1, "1": -0.1, "2": 0.05})
    # one seed, no SD: only the same number is within
    assert fst["within"] and fst["identical_seeds"] == 1 and fst["reference_sd"] is None
    assert rep["missing"] == ["math ablation (E=0.2, I=2)"]  # chess is in this table only: not compared
    assert (rep["within"], rep["compared"]) == (2, 2)
    table["domains"]["math"]["methods"]["whale"] = _cell([0, 1, 2], [0.8, 0.8, 0.75])  # 0.783 > 0.6 + 0.1
    table["domains"]["math"]["methods"]["fst"] = _cell([0], [0.31])
    rep = reproduction(table, reference)
    assert [c["within"] for c in rep["cells"]] == [False, False] and rep["within"] == 0
    # a reproduction of one seed of three: held against that seed's reference (0.7), not the mean (0.6)
    table["domains"]["math"]["methods"]["whale"] = _cell([1], [0.7])
    whale = reproduction(table, reference)["cells"][0]
    assert whale["reference_seeds"] == [1] and whale["reference_mean"] == pytest.approx(0.7)
    assert whale["diff"] == pytest.approx(0.0) and whale["within"] and whale["identical_seeds"] == 1
    table["domains"]["math"]["methods"]["whale"] = _cell([1], [0.55])  # within 0.6 ± 0.1, not 0.7 ± 0.1
    assert not reproduction(table, reference)["cells"][0]["within"]


def test_operator_gains_credit_each_interval_to_the_operators_that_ran_in_it():
    def iteration(accepted, statuses, means, incumbent="h0"):
        candidates = [
            {"id": f"c{i}", "status": st, "mean": m}
            for i, (st, m) in enumerate(zip(statuses, means, strict=True))
        ]
        return {"kind": "iteration", "accepted": accepted, "incumbent": incumbent, "candidates": candidates}

    def rescore(mean, incumbent="h0"):
        return {
            "kind": "rescore",
            "accepted": False,
            "incumbent": incumbent,
            "candidates": [{"id": incumbent, "mean": mean}],
        }

    units = [
        {"unit": 0, "phase": "weight"},
        {"unit": 1, "phase": "weight"},
        {"unit": 2, "phase": "harness", "signals": rescore(0.3)},
        {"unit": 3, "phase": "harness", "signals": iteration(False, ["invalid", "valid"], [None, 0.25])},
        {"unit": 4, "phase": "harness", "signals": iteration(True, ["valid", "valid"], [0.1, 0.5], "c1")},
        {"unit": 5, "phase": "weight"},
        {"unit": 6, "phase": "harness", "signals": rescore(0.55, "c1")},
        {"unit": 7, "phase": "harness", "signals": iteration(False, ["valid", "valid"], [0.6, 0.2], "c1")},
    ]
    # (unit, mean): evaluated before units 0, 1, 2, 5 and after the last; the last interval runs units 5-7
    evals = [(0, 0.2), (1, 0.3), (2, 0.25), (5, 0.6), (8, 0.55)]
    gains = operator_gains({"units": units, "evals": [{"unit": u, "mean": m} for u, m in evals]})
    assert gains["weight_gain"] == pytest.approx(0.1 - 0.05)
    assert gains["harness_gain"] == pytest.approx(0.35)
    assert gains["both_gain"] == pytest.approx(-0.05)
    assert gains["weight_gain"] + gains["harness_gain"] + gains["both_gain"] == pytest.approx(0.55 - 0.2)
    # the search's own measure: 0.3 -> 0.5 in the first phase (the better unaccepted 0.6 counts for nothing)
    assert gains["search_gain"] == pytest.approx(0.2)
    assert (gains["weight_steps"], gains["harness_iterations"], gains["candidates"]) == (3, 3, 6)
    assert (gains["invalid"], gains["accepted"]) == (1, 1)
    assert operator_gains({"units": units[:2], "evals": []})["search_gain"] is None


def test_run_grid_trains_only_unfinished_runs_and_refuses_a_stale_folder(tmp_path):
    path = _write(
        tmp_path / "grid.yaml",
        {
            "domains": {"math": {"set": {"env": "whale/Math-v0"}}},
            "methods": ["whale", "weight-only"],
            "set": TINY_SET,
        },
    )
    cfg = CompareConfig.load(path)
    runs = {r.id: r for r in plan(cfg)}
    out = tmp_path / "out"
    _fake_run(out, runs["math-whale-s0"], [(0, 0.3), (96, 0.4)], spent=96, elapsed=5.0)
    # a run killed midway, whose config.yaml was written before a TrainConfig field existed
    partial = out / "runs" / "math-weight-only-s0"
    partial.mkdir(parents=True)
    saved = runs["math-weight-only-s0"].config.to_dict()
    saved.pop("base_url")
    (partial / "config.yaml").write_text(yaml.safe_dump(saved))
    (partial / "ledger.jsonl").write_text(json.dumps({"event": "start", "rollouts_total": 0}) + "\n")
    assert run_state(partial, runs["math-weight-only-s0"].config) == "partial"
    calls = []

    def train(config_path: Path, run_dir: Path) -> int:  # stands in for whale train --resume
        calls.append(run_dir.name)
        # the run's config.yaml now reads as the trainer writes it, so its --resume accepts the run
        assert (run_dir / "config.yaml").read_text() == config_path.read_text()
        for name in ("config.yaml", "ledger.jsonl"):
            (run_dir / name).unlink()
        run_dir.rmdir()
        _fake_run(out, runs[run_dir.name], [(0, 0.3), (90, 0.35)], spent=90, elapsed=7.0)
        return 0

    table = run_grid(cfg, out, log=lambda _line: None, train=train)
    assert calls == ["math-weight-only-s0"] and table["invocation"]["skipped"] == ["math-whale-s0"]
    assert all(r["finished"] for r in table["runs"].values())
    assert table["domains"]["math"]["paired"]["weight-only"]["diffs"] == pytest.approx([0.05])
    assert run_grid(cfg, out, log=lambda _line: None, train=train)["invocation"]["ran"] == []
    assert calls == ["math-weight-only-s0"]
    # another budget: the run folders hold runs of another config
    other = CompareConfig.load(path, ["budget_rollouts=50"])
    with pytest.raises(ValueError, match="another config"):
        run_grid(other, out, log=lambda _line: None, train=train)


def test_dry_run_lists_each_state_and_the_finished_runs_numbers(tmp_path, capsys):
    from whale_train.cli import main

    path = _write(
        tmp_path / "grid.yaml",
        {
            "domains": {"math": {"set": {"env": "whale/Math-v0"}}},
            "methods": ["whale", "weight-only", "harness-only"],
            "set": TINY_SET,
        },
    )
    runs = {r.id: r for r in plan(CompareConfig.load(path))}
    out = tmp_path / "out"
    _fake_run(
        out, runs["math-whale-s0"], [(0, 0.3, 0.2), (48, 0.45, 0.5), (96, 0.4, 0.35)], spent=96, elapsed=5.0
    )
    partial = out / "runs" / "math-weight-only-s0"
    partial.mkdir(parents=True)
    (partial / "config.yaml").write_text(yaml.safe_dump(runs["math-weight-only-s0"].config.to_dict()))
    (partial / "ledger.jsonl").write_text(json.dumps({"event": "start", "rollouts_total": 0}) + "\n")
    assert main(["compare", str(path), "--out", str(out), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("math-whale-s0: done (budget ")
    assert lines[0].endswith(": test mean@k best 45.0%, final 40.0%, selected 45.0%")
    assert lines[1].startswith("math-weight-only-s0: partial (") and "mean@k" not in lines[1]
    assert lines[2].startswith("math-harness-only-s0: new (")
    assert lines[-1] == "1 of 3 runs finished"
    assert not (out / "compare.md").exists() and not (out / "grid.yaml").exists()  # it wrote nothing


def test_dry_run_lists_only_the_named_domains(tmp_path, capsys):
    from whale_train.cli import main

    path = _write(
        tmp_path / "grid.yaml",
        {
            "domains": {
                "math": {"set": {"env": "whale/Math-v0"}},
                "chess": {"set": {"env": "whale/Chess-v0"}},
            },
            "methods": ["whale", "weight-only"],
            "set": TINY_SET,
        },
    )
    out = tmp_path / "out"
    assert main(["compare", str(path), "--out", str(out), "--domains", "chess", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines[:-1]] == ["chess-whale-s0", "chess-weight-only-s0"]
    assert lines[-1] == "0 of 2 runs finished"


def test_run_grid_runs_only_the_named_domains(tmp_path):
    path = _write(
        tmp_path / "grid.yaml",
        {
            "domains": {
                "math": {"set": {"env": "whale/Math-v0"}},
                "search": {"set": {"env": "whale/SearchQA-v0"}},
            },
            "methods": ["whale"],
            "set": TINY_SET,
        },
    )
    cfg = CompareConfig.load(path)
    runs = {r.id: r for r in plan(cfg)}
    out, calls = tmp_path / "out", []

    def train(config_path: Path, run_dir: Path) -> int:
        calls.append(run_dir.name)
        _fake_run(out, runs[run_dir.name], [(0, 0.3), (96, 0.4)], spent=96, elapsed=1.0)
        return 0

    table = run_grid(cfg, out, log=lambda _line: None, train=train, domains=["search"])
    assert calls == ["search-whale-s0"] and table["finished_runs"] == 1
    assert not table["runs"]["math-whale-s0"]["finished"]
    run_grid(cfg, out, log=lambda _line: None, train=train)
    assert calls == ["search-whale-s0", "math-whale-s0"]


def test_a_grid_continues_from_its_record_alone_on_a_fresh_machine(tmp_path, capsys):
    """``record:``: a finished run's small files are copied there (not its checkpoints or traces); with
    ``--out`` gone (a new machine), the recorded run is finished, skipped and in the table, the dry run says
    where it was read from, and ``--resume`` accepts the grid."""
    from whale_train.cli import main

    record = tmp_path / "record"
    path = _write(
        tmp_path / "grid.yaml",
        {
            "domains": {"math": {"set": {"env": "whale/Math-v0"}}},
            "methods": ["whale", "weight-only"],
            "set": TINY_SET,
            "record": str(record),
        },
    )
    cfg = CompareConfig.load(path)
    assert cfg.record == record
    runs = {r.id: r for r in plan(cfg)}
    out, calls = tmp_path / "out", []
    _fake_run(out, runs["math-whale-s0"], [(0, 0.3), (96, 0.4)], spent=96, elapsed=5.0)
    (out / "runs" / "math-whale-s0" / "eval").mkdir()
    (out / "runs" / "math-whale-s0" / "eval" / "v0_math_h0.json").write_text("{}")
    (out / "runs" / "math-whale-s0" / "eval" / "v0_math_h0.traces.jsonl").write_text("{}\n")
    (out / "runs" / "math-whale-s0" / "checkpoints" / "3").mkdir(parents=True)

    def train(config_path: Path, run_dir: Path) -> int:
        calls.append(run_dir.name)
        if run_dir.exists():  # a run started in the first session, continued
            shutil.rmtree(run_dir)
        _fake_run(out, runs[run_dir.name], [(0, 0.3), (90, 0.35)], spent=90, elapsed=7.0)
        return 0

    # the first session: the run finished before the record existed is recorded; the other is postponed
    first = run_grid(cfg, out, log=lambda _line: None, train=train, hours=1e-9)
    assert calls == [] and first["invocation"]["postponed"] == ["math-weight-only-s0"]
    assert first["invocation"]["ran"] == []  # a postponed run was not run
    assert (
        "(this invocation ran nothing: --hours reached; 1 left for a later --resume)"
        in (out / "compare.md").read_text()
    )
    kept = record / "math-whale-s0"
    assert sorted(p.relative_to(kept).as_posix() for p in kept.rglob("*") if p.is_file()) == [
        "config.yaml",
        "eval/v0_math_h0.json",
        "ledger.jsonl",
        "state.json",
    ]
    partial = out / "runs" / "math-weight-only-s0"
    partial.mkdir(parents=True)
    (partial / "config.yaml").write_text(yaml.safe_dump(runs["math-weight-only-s0"].config.to_dict()))
    run_grid(cfg, out, log=lambda _line: None, train=train)
    assert calls == ["math-weight-only-s0"] and (record / "math-weight-only-s0" / "ledger.jsonl").exists()
    # a fresh machine: no --out, only the committed record
    shutil.rmtree(out)
    assert main(["compare", str(path), "--out", str(out), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("math-whale-s0: done (record) (") and "best 40.0%" in lines[0]
    assert lines[-1] == "2 of 2 runs finished"
    table = run_grid(cfg, out, log=lambda _line: None, train=train)
    assert calls == ["math-weight-only-s0"] and table["invocation"]["ran"] == []
    assert table["finished_runs"] == 2
    assert table["domains"]["math"]["paired"]["weight-only"]["diffs"] == pytest.approx([0.05])
    shutil.rmtree(out)
    assert main(["compare", str(path), "--out", str(out), "--resume", "--hours", "1e-9"]) == 0
    assert (out / "compare.json").exists()
    # --hours 0 starts nothing: only the table, here of the recorded runs
    (out / "compare.json").unlink()
    assert main(["compare", str(path), "--out", str(out), "--hours", "0"]) == 0
    assert json.loads((out / "compare.json").read_text())["finished_runs"] == 2 and calls == [
        "math-weight-only-s0"
    ]
    assert main(["compare", str(path), "--out", str(out), "--hours", "-1"]) == 2
    assert "--hours must be 0 or more" in capsys.readouterr().err
    # a reproduction: one seed from nothing, the record neither read nor written
    repro = tmp_path / "repro"
    assert main(["compare", str(path), "--out", str(repro), "--seeds", "0", "--no-record", "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "0 of 2 runs finished"
    assert main(["compare", str(path), "--out", str(out), "--seeds", "3"]) == 2
    assert "--seeds 3: seed(s) [3] not in the config (seeds: [0])" in capsys.readouterr().err
    # another grid given the same record (runs of the same names): refused, the record untouched
    kept = (record / "math-whale-s0" / "ledger.jsonl").read_bytes()
    other = CompareConfig.load(path, ["budget_rollouts=50"])
    with pytest.raises(ValueError, match="a record belongs to one grid"):
        run_grid(other, tmp_path / "other", log=lambda _line: None, train=train)
    assert (record / "math-whale-s0" / "ledger.jsonl").read_bytes() == kept


# ------------------------------------------------------------------------------------------ the smoke grid


def _ledgers(out: Path) -> dict[str, bytes]:
    return {p.parent.name: p.read_bytes() for p in sorted((out / "runs").glob("*/ledger.jsonl"))}


@pytest.mark.slow
@pytest.mark.xdist_group("smoke-grid")  # the worker that builds `smoke_grid` (tests/train/conftest.py)
def test_smoke_grid_matched_budgets_resume_and_no_new_work(tmp_path, smoke_grid):
    # the grid run once with one run SIGKILLed in the middle of its third unit, then `whale compare` again
    out, killed, first = smoke_grid.out, SMOKE_KILLED, smoke_grid.first
    assert first["invocation"]["failed"] == [killed]
    assert smoke_grid.killed_state == "partial"
    assert not first["runs"][killed]["finished"]
    compare = smoke_grid.compare

    second = smoke_grid.second
    assert second.returncode == 0, second.stdout + second.stderr
    assert "0 to start" in second.stdout and "1 to continue" in second.stdout
    table = smoke_grid.table
    assert table["invocation"]["ran"] == [killed] and not table["invocation"]["failed"]
    events = [json.loads(line) for line in (out / "runs" / killed / "ledger.jsonl").read_text().splitlines()]
    units = [e for e in events if e["event"] == "unit"]
    assert sum(e["event"] == "start" for e in events) == 1 and events[-1]["event"] == "stop"
    assert sum(u["rollouts"] for u in units) == units[-1]["rollouts_total"]
    assert [u["unit"] for u in units] == list(range(len(units)))  # the killed unit ran once

    # the table: one domain, the five methods, two seeds each, paired differences, the ablation
    d = table["domains"]["math"]
    assert list(d["methods"]) == METHODS5 and d["k"] == 2
    for method, cell in d["methods"].items():
        assert cell["seeds"] == [0, 1] and len(cell["best"]) == 2 and cell["best_sd"] is not None, method
        assert all(0 <= b <= 1 for b in cell["best"])
    assert sorted(d["paired"]) == sorted(m for m in METHODS5 if m != "whale")
    for p in d["paired"].values():
        assert p["n"] == 2 and p["lo"] <= p["mean"] <= p["hi"]
    assert [(p["weight_epochs"], p["harness_iterations"]) for p in table["ablation"]["points"]] == [
        (0.2, 2),
        (0.1, 2),
    ]
    # matched budgets: every run spent the budget to within one unit
    budget, unit = d["budget"], d["max_unit_rollouts"]
    assert unit == max(4 * 2, 4 * 1 * max(1, 1 + 1))
    for run_id, r in table["runs"].items():
        assert r["finished"], run_id
        assert budget - unit < r["rollouts"] <= budget, (run_id, r["rollouts"])
    md = (out / "compare.md").read_text()
    for method in METHODS5:
        assert f"| {method} | " in md
    assert "| whale − fst |" in md and "rollouts to reach weight-only's peak" in md
    for png in ("accuracy_math.png", "ablation.png"):
        assert (out / "plots" / png).stat().st_size > 1000

    # a third invocation does no new work; given the second's table as --reference, it reproduces every
    # cell exactly (one invocation asserts both: each was a whale compare process of its own)
    before = _ledgers(out)
    reference = tmp_path / "reference.json"
    reference.write_text((out / "compare.json").read_text())
    same = compare("--reference", str(reference))
    assert same.returncode == 0, same.stdout + same.stderr
    assert "11 finished, 0 to continue, 0 to start" in same.stdout
    assert json.loads((out / "compare.json").read_text())["invocation"]["ran"] == []
    assert _ledgers(out) == before and len(before) == 11
    # --reference: the same grid against its own table reproduces every cell exactly; against a table
    # whose whale cell is moved past its error bar, it says which cell and exits 2
    assert "reproduction: 7 of 7 cells within the reference's error bars" in same.stdout
    rep = json.loads((out / "compare.json").read_text())["reproduction"]
    assert all(c["diff"] == 0 and c["identical_seeds"] == len(c["per_seed"]) for c in rep["cells"])
    assert "## Reproduction: against the reference table `smoke`" in (out / "compare.md").read_text()
    moved = json.loads(reference.read_text())
    cell = moved["domains"]["math"]["methods"]["whale"]
    cell["best_mean"] += (cell["best_sd"] or 0) + 0.01
    reference.write_text(json.dumps(moved))
    differs = compare("--reference", str(reference))
    assert differs.returncode == 2, differs.stdout + differs.stderr
    assert "6 of 7 cells" in differs.stdout and "outside: math whale " in differs.stdout
    bad = compare("--reference", str(tmp_path / "nothing.json"))
    assert bad.returncode != 0 and "--reference" in bad.stderr


# ------------------------------------------------------------------------------------------ the decisive grid

DECISIVE = ROOT / "configs" / "compare" / "decisive.yaml"


def test_the_decisive_grid_implements_its_design():
    """docs/COMPARE.md's fixed design, checked on the config: >= 5 seeds, mean@8 on >= 300 test tasks with
    the same evaluations for every method, a selection score on the harness split, >= 4 whale cycles of the
    paper's (E, I) = (0.6, 6) within the budget."""
    import gymnasium as gym

    old = Path.cwd()
    os.chdir(ROOT)
    try:
        cfg = CompareConfig.load(DECISIVE)
        runs = plan(cfg)
    finally:
        os.chdir(old)
    assert len(cfg.seeds) >= 5 and cfg.methods == METHODS5
    assert {d.name for d in cfg.domains} == {"math", "chess", "search"}
    added = sum(len(m["methods"]) * len(m["seeds"]) for m in cfg.more_seeds)
    assert len({r.config.name for r in runs}) == 3 * 5 * 5 + 3 * 5 + added
    # the amendments' added seeds: at most 25 seeds a cell, and whale has every seed another method of its
    # domain got (its differences pair by seed)
    assert all(max(m["seeds"]) <= 24 for m in cfg.more_seeds)
    for domain in {m["domain"] for m in cfg.more_seeds}:
        got = [(set(m["methods"]), set(m["seeds"])) for m in cfg.more_seeds if m["domain"] == domain]
        whale = set().union(*(seeds for methods, seeds in got if "whale" in methods))
        assert set().union(*(seeds for _, seeds in got)) <= whale
    # one seed of the grid (the reproduction reruns search's): every cell, the ablation's included, the same configs
    one = {r.config.name: r.config for r in plan(cfg.only_seeds([0]))}
    assert len(one) == 3 * 5 + 3 and all(c.seed == 0 for c in one.values())
    assert all(one[r.config.name] == r.config for r in runs if r.seed == 0)
    for domain in ("math", "search"):  # chess positions take long to generate: its sizes are in the doc
        spec = next(r for r in runs if r.domain == domain and r.method == "whale" and r.point is None)
        c = spec.config
        assert (c.eval.k, c.eval.limit, c.eval.split, str(c.eval.every)) == (8, 300, "test", "3000")
        assert c.eval.select_limit >= 100
        assert (c.schedule.weight_epochs, c.schedule.harness_iterations) == (0.6, 6)
        splits = {
            s: len(gym.make(c.env, tasks=c.tasks, split=s).unwrapped.task_ids) for s in ("train", "test")
        }
        assert splits["test"] >= 300
        steps = max(1, round(0.6 * splits["train"] / c.rsft.batch_tasks))
        cycle = steps * c.weight_step_cost + 6 * c.harness_iteration_cost
        assert c.budget_rollouts >= 4 * cycle, (domain, steps, cycle)
        # paired: every method of the domain evaluates the same tasks with the same sample seed
        same = {
            json.dumps({**r.config.eval.__dict__, "tasks": r.config.tasks, "seed": r.config.seed})
            for r in runs
            if r.domain == domain and r.seed == 0
        }
        assert len(same) == 1


@pytest.mark.slow
def test_a_killed_decisive_grid_resumes_without_redoing_finished_runs(tmp_path):
    """The decisive grid's shape (its task sources, five methods, the rollout-cadence evaluations and the
    harness-split selection score) at tiny budgets, one seed, and math and search QA only (chess runs cost
    the most; the design test checks the full plan): the `whale compare` process is SIGKILLed once a run
    has finished; `--resume` in a new process skips the finished runs (their ledgers unchanged), finishes
    the rest, and the table carries three numbers per run and the verdict section."""
    import signal
    import time

    data = yaml.safe_load(DECISIVE.read_text())
    data["seeds"] = [0]
    data.pop("ablation")
    data.pop("more_seeds", None)  # the amendment's added seeds: more of the same runs
    data["record"] = str(tmp_path / "record")  # never the decisive grid's own record (runs of the same names)
    del data["domains"]["chess"]
    for d in data["domains"].values():
        d["config"] = str(ROOT / d["config"])
        d["set"]["tasks"] = (
            d["set"]["tasks"].replace("size=2400", "size=120").replace("difficulty=CHESS", "difficulty=1")
        )
    data["set"] = {
        "budget_rollouts": 24,
        "schedule": {
            "weight_epochs": 0.1,
            "harness_iterations": 2,
            "fst_weight_epochs": 0.1,
            "fst_iterations": 2,
        },
        "rsft": {"batch_tasks": 4, "samples": 2, "learning_rate": 1.0e-4},
        "search": {
            "proposer": "offline",
            "candidates": 1,
            "harness_tasks": 4,
            "frontier_size": 1,
            "check_tasks": 2,
        },
        "eval": {"k": 1, "limit": 3, "split": "test", "every": 8, "select_limit": 2, "select_k": 1},
        "concurrency": 8,
    }
    grid = _write(tmp_path / "decisive-smoke.yaml", data)
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "WHALE_WARM_START"} | {"HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "whale_train.cli", "compare", str(grid), "--out", str(out), "--jobs", "2"]
    resumed = subprocess.run([*cmd, "--resume"], env=env, capture_output=True, text=True, cwd=ROOT)
    assert resumed.returncode == 2 and "holds no grid" in resumed.stderr  # nothing to resume yet
    first = subprocess.Popen(
        cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.monotonic() + 600

    def in_flight() -> list[int]:  # the zygote of the warm starts (the default) and the runs forked from it
        zygotes = [p for p in running_children(first.pid) if p in carrying("whale_train.warm_start")]
        return [*zygotes, *(run for z in zygotes for run in running_children(z))]

    while not (_finished(out) and len(runs := in_flight()) > 1):
        assert first.poll() is None and time.monotonic() < deadline, "the grid ended or took 10 minutes"
        time.sleep(0.2)
    os.kill(first.pid, signal.SIGKILL)  # only `whale compare`: its runs must not go on writing their folders
    first.wait()
    while (left := [pid for pid in runs if running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"whale train runs outlived the killed grid: {left}"
    finished = _finished(out)
    before = {name: (out / "runs" / name / "ledger.jsonl").read_bytes() for name in finished}
    assert 1 <= len(finished) < 10 and (out / ".compare.lock").exists()  # the dead grid's lock is left behind
    second = subprocess.run([*cmd, "--resume"], env=env, capture_output=True, text=True, cwd=ROOT)
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"10 runs: {len(finished)} finished" in second.stdout
    table = json.loads((out / "compare.json").read_text())
    assert sorted(table["invocation"]["skipped"]) == sorted(finished)
    assert not set(table["invocation"]["ran"]) & set(finished)
    assert {n: (out / "runs" / n / "ledger.jsonl").read_bytes() for n in finished} == before
    assert table["finished_runs"] == 10 and all(r["finished"] for r in table["runs"].values())
    recorded = sorted(p.parent.name for p in (tmp_path / "record").glob("*/ledger.jsonl"))
    assert recorded == sorted(
        table["runs"]
    )  # the finished ones recorded at the start, the rest as they ended
    assert all((tmp_path / "record" / n / "ledger.jsonl").read_bytes() == b for n, b in before.items())
    for run_id, r in table["runs"].items():
        assert None not in (r["best_mean"], r["final"], r["selected"]), run_id
        assert r["final"] <= r["best_mean"] and r["selected"] <= r["best_mean"]
        assert all("select_mean" in e for e in r["evals"]), run_id
    rows = table["verdicts"]["selected"]["rows"]
    assert {r["domain"] for r in rows} == {"math", "search"}
    assert {r["claim"] for r in rows} == {1, 2, 3, 4} and all(r["verdict"] == "not resolved" for r in rows)
    assert "## Verdicts" in (out / "compare.md").read_text()


def _finished(out: Path) -> list[str]:
    names = []
    for p in (out / "runs").glob("*/ledger.jsonl") if (out / "runs").exists() else []:
        lines = p.read_text().splitlines()
        if lines and json.loads(lines[-1]).get("event") == "stop" and (p.parent / "state.json").exists():
            names.append(p.parent.name)
    return sorted(names)
