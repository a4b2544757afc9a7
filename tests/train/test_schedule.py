"""The schedule policies: phase order, switch reasons, budget arithmetic."""

from __future__ import annotations

import pytest

from whale_train.schedule import Adaptive, Fixed, RunState, ScheduleConfig, Stagewise, make_schedule


def simulate(schedule, state: RunState, rewards=None, improved=None, limit=200):
    """Drive a schedule like the trainer does; return the sequence of actions and the reasons of switches."""
    actions, switches = [], []
    rewards = iter(rewards or [])
    improved = iter(improved or [])
    for _ in range(limit):
        d = schedule.decide(state)
        if d.action == "stop":
            switches.append(("stop", d.reason))
            break
        if d.action != state.phase:
            switches.append((d.action, d.reason))
            state.start_phase(d.action)
        cost = state.weight_step_cost if d.action == "weight" else state.harness_iteration_cost
        state.rollouts += cost
        state.phase_units += 1
        if d.action == "weight":
            state.weight_rollouts += cost
            state.train_rewards.append(next(rewards, 0.5))
        else:
            state.harness_improved.append(next(improved, False))
        actions.append(d.action[0])
    return "".join(actions), switches


def test_whale_fixed_phases_alternate_and_respect_the_budget():
    state = RunState(budget=1000, weight_step_cost=50, harness_iteration_cost=40, steps_per_epoch=5)
    actions, switches = simulate(Fixed(0.6, 2), state)
    assert actions.startswith("wwwhhwwwhhwww")  # E=0.6 epoch of 5 steps = 3 steps; I = 2
    assert 1000 - 50 < state.rollouts <= 1000  # stopped when the next unit would overspend
    assert switches[0][1].startswith("start") and "E=0.6 epochs = 3 steps" in switches[0][1]
    assert "the first re-scores the incumbent" in switches[1][1]
    assert switches[-1][0] == "stop" and "budget" in switches[-1][1]
    # ledger arithmetic: every unit charged once
    assert state.rollouts == actions.count("w") * 50 + actions.count("h") * 40


def test_adaptive_ends_a_weight_phase_when_the_reward_plateaus():
    config = ScheduleConfig(
        min_weight_epochs=0.2, window=2, patience=2, min_iterations=2, iteration_patience=2, max_iterations=4
    )
    state = RunState(budget=10_000, weight_step_cost=10, harness_iteration_cost=10, steps_per_epoch=10)
    rewards = [0.1, 0.2, 0.3, 0.4, 0.4, 0.4, 0.4, 0.4] + [0.5] * 100
    actions, switches = simulate(
        Adaptive(config), state, rewards=rewards, improved=[True, False, False] + [False] * 50, limit=20
    )
    first_harness = actions.index("h")
    assert (
        first_harness == 7
    )  # averages 0.15 .25 .35 .4 .4 .4 .4: no improvement over the last 2 after step 7
    assert "stopped improving" in switches[1][1]
    assert actions[7:10] == "hhh"  # min 2, then new best at 1, none at 2 and 3 -> ends after 3
    assert "no new best" in switches[2][1]


def test_adaptive_harness_phase_is_capped():
    config = ScheduleConfig(
        min_weight_epochs=0.1, window=1, patience=1, min_iterations=1, iteration_patience=3, max_iterations=4
    )
    state = RunState(budget=10_000, weight_step_cost=1, harness_iteration_cost=1, steps_per_epoch=10)
    actions, switches = simulate(
        Adaptive(config), state, rewards=[0.5] * 100, improved=[True] * 100, limit=12
    )
    assert "hhhh" in actions and "hhhhh" not in actions
    assert any("maximum of 4" in reason for _, reason in switches)


def test_stagewise_spends_the_weight_share_first_then_searches():
    state = RunState(budget=1000, weight_step_cost=100, harness_iteration_cost=50, steps_per_epoch=4)
    actions, switches = simulate(Stagewise(0.5), state)
    assert actions == "wwwww" + "h" * 10
    assert [s[0] for s in switches] == ["weight", "harness", "stop"]
    assert state.weight_rollouts == 500 and state.rollouts == 1000


@pytest.mark.parametrize("method", ["weight-only", "harness-only"])
def test_single_operator_methods(method):
    state = RunState(budget=300, weight_step_cost=100, harness_iteration_cost=100)
    actions, _ = simulate(make_schedule(method, ScheduleConfig()), state)
    assert actions == ("www" if method == "weight-only" else "hhh")


def test_unknown_method_and_bad_config():
    with pytest.raises(ValueError, match="unknown method"):
        make_schedule("gradient-descent", ScheduleConfig())
    with pytest.raises(ValueError, match="stagewise_weight_share"):
        make_schedule("stagewise", ScheduleConfig(stagewise_weight_share=1.5))


@pytest.mark.parametrize("method", ["harness-only", "stagewise"])
def test_search_until_the_budget_stops_when_the_proposer_is_exhausted(method):
    """An iteration that proposes nothing costs no rollouts: without this stop the budget never ends it."""
    from whale_train.schedule import EXHAUSTED_AFTER

    schedule = make_schedule(method, ScheduleConfig())
    state = RunState(
        budget=1000, weight_step_cost=10, harness_iteration_cost=10, rollouts=900, weight_rollouts=900
    )
    state.start_phase("harness")
    state.empty_iterations = EXHAUSTED_AFTER - 1
    assert schedule.decide(state).action == "harness"
    state.empty_iterations = EXHAUSTED_AFTER
    decision = schedule.decide(state)
    assert (
        decision.action == "stop"
        and "search exhausted" in decision.reason
        and "900 of 1000" in decision.reason
    )
