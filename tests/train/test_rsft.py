"""RSFT mechanics: acceptance, examples on the exact sampled ids, TRL training in place, no-op steps,
the epoch-ordered task stream, the config."""

from __future__ import annotations

import logging

import pytest
import torch

from harnesses.loader import load_harness
from whale_train.llm.hf import TransformersLLM
from whale_train.rollout import EnvStep, LLMCall, Trajectory
from whale_train.rsft import RSFT, RSFTConfig, TaskStream, accept, examples_from, used_calls

MATH = {"tasks": "generated?difficulty=1"}


def rsft(model_dir, **overrides) -> RSFT:
    config = RSFTConfig(**{"batch_tasks": 2, "samples": 1, "save_checkpoints": False, **overrides})
    return RSFT(config, TransformersLLM(model_dir), load_harness("math/h0"), "whale/Math-v0", MATH)


def weights(llm) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in llm.model.parameters()])


def test_a_step_without_accepted_trajectories_is_a_logged_no_op(fresh_model_dir, tmp_path):
    r = rsft(fresh_model_dir)  # an untrained model solves nothing
    r.checkpoint_dir = tmp_path
    before = weights(r.llm)
    report = r.step()
    assert report.accepted == 0 and report.examples == 0 and not report.updated and report.loss is None
    assert r.llm.version == 0 and torch.equal(before, weights(r.llm))
    assert report.rollouts == 2 and report.train_reward == 0.0
    assert not any(tmp_path.iterdir())


def test_trained_examples_are_byte_identical_to_the_accepted_completions(fresh_model_dir, tmp_path):
    # Accept everything (threshold 0) so an untrained model has something to train on.
    r = rsft(fresh_model_dir, reward_threshold=0.0, require_stop=False, save_checkpoints=True)
    r.checkpoint_dir = tmp_path
    before = weights(r.llm)
    report = r.step()
    assert report.updated and report.examples > 0 and report.loss is not None and r.llm.version == 1
    assert not torch.equal(before, weights(r.llm))  # trained in place: the sampler has the new weights
    assert (tmp_path / "1" / "config.json").exists()
    rows = r.trainer.last_dataset
    assert len(rows) == len(r.last_examples)
    for ex, row in zip(r.last_examples, rows, strict=True):
        assert row["input_ids"] == list(ex.prompt_ids) + list(ex.completion_ids)
        trained = [i for i, label in zip(row["input_ids"], row["labels"], strict=True) if label != -100]
        assert trained == list(ex.completion_ids)  # completion-only loss on exactly the sampled ids


def test_examples_come_from_every_call_of_accepted_trajectories(fresh_model_dir):
    tok = TransformersLLM(fresh_model_dir).tokenizer
    call = LLMCall("sample", "p", "p", "4", [1, 2], [3, 4], "stop", 2, 2)
    cut = LLMCall("sample", "p", "p", "x", [1, 2], [5, 6], "length", 2, 2)
    choice = LLMCall("choice", [{"role": "user", "content": "p"}], "p", "e2e4", [1, 2], [7], "stop", 2, 1)
    score = LLMCall("score", "p", "p", "", [1, 2], None, "stop", 2, 0)
    solved = Trajectory(
        "t1", 0, 0, "h", "env", 0, reward=1.0, solved=True, calls=[call, cut, choice, score, call]
    )
    solved.steps = [EnvStep("answer: 4", "", 1.0, True, False)]
    failed = Trajectory("t2", 0, 0, "h", "env", 0, reward=0.0, calls=[call])
    config = RSFTConfig()
    kept = accept([solved, failed, solved], RSFTConfig(per_task_cap=1))
    assert kept == [solved]
    examples = examples_from(kept, config, tok)
    # a choice and a score are scoring calls: the model sampled nothing, nothing to train on
    assert [(e.prompt_ids, e.completion_ids) for e in examples] == [((1, 2), (3, 4))]
    # without dedup and the stop rule: both copies of "4"; "x" was a discarded alternative of the same prompt
    assert len(examples_from(kept, RSFTConfig(dedup=False, require_stop=False), tok)) == 2


def test_losing_votes_and_discarded_samples_are_not_trained_on():
    """A vote samples one prompt 4 times and answers 7: the two samples that said 7 are trained on, the
    losing 8 and the discarded tool-less reply are not; a prompt sampled once is always used."""
    query = LLMCall("sample", "q", "q", "<search>Tosek</search>", [1], [2], "stop", 1, 1)
    votes = [
        LLMCall("sample", "p", "p", text, [1], [i], "stop", 1, 1)
        for i, text in enumerate(["\\boxed{7}", "\\boxed{8}", "the answer is 7", "no idea"], start=10)
    ]
    t = Trajectory("t", 0, 0, "h", "env", 0, reward=1.0, solved=True, calls=[query, *votes])
    t.steps = [EnvStep("search: Tosek", "", 0.0, False, False), EnvStep("answer: 7", "", 1.0, True, False)]
    used = used_calls(t)
    assert [c.completion for c in used] == ["<search>Tosek</search>", "\\boxed{7}", "the answer is 7"]
    tool = [
        LLMCall("sample", "m", "m", text, [1], [i], "stop", 1, 1)
        for i, text in enumerate(["python: print(3*4)", "12"])
    ]
    t.calls, t.steps = (
        tool,
        [
            EnvStep("python:  print(3*4)", "12", 0.0, False, False),
            EnvStep("answer: 12", "", 1.0, True, False),
        ],
    )
    assert [c.completion for c in used_calls(t)] == ["python: print(3*4)", "12"]


def test_a_rejected_action_before_a_retry_is_not_trained_on():
    first = LLMCall("sample", "board", "board", "<move>e2e5</move>", [1], [2], "stop", 1, 1)
    retry = LLMCall("sample", "board + error", "board + error", "<move>d1h5</move>", [1], [3], "stop", 1, 1)
    t = Trajectory("t", 0, 0, "h", "env", 0, reward=1.0, solved=True, calls=[first, retry])
    t.steps = [
        EnvStep("e2e5", "illegal", 0.0, False, False, error="e2e5 is not legal", error_kind="illegal_action"),
        EnvStep("d1h5", "mate", 1.0, True, False),
    ]
    assert used_calls(t) == [retry]


def test_lora_trains_adapters_only(fresh_model_dir):
    r = rsft(fresh_model_dir, reward_threshold=0.0, require_stop=False, lora=True, lora_r=4)
    base = {n: p.detach().clone() for n, p in r.trainer.model.named_parameters() if "lora_" not in n}
    lora = {n: p.detach().clone() for n, p in r.trainer.model.named_parameters() if "lora_B" in n}
    assert lora and r.step().updated
    after = dict(r.trainer.model.named_parameters())
    assert all(torch.equal(base[n], after[n]) for n in base)
    assert any(not torch.equal(lora[n], after[n]) for n in lora)


def test_a_ctrl_c_that_datasets_swallows_while_hashing_a_step_adds_no_warning(
    fresh_model_dir, monkeypatch, capfd
):
    """datasets hashes the transform each SFTTrainer maps its dataset with; a Ctrl-C landing there is
    swallowed by a bare ``except:`` (the trainer's INTERRUPTED flag stops the run), which warned that
    the transform "couldn't be hashed properly": a second line under ``whale train``'s one on Ctrl-C."""
    from datasets import fingerprint

    hit = []
    update = fingerprint.Hasher.update

    def interrupted(self, value):
        if callable(value) and not hit:
            hit.append(value)
            raise KeyboardInterrupt  # as the SIGINT handler raises it (whale_train/trainer/interrupt.py)
        return update(self, value)

    monkeypatch.setattr(fingerprint.Hasher, "update", interrupted)
    monkeypatch.setattr(fingerprint, "fingerprint_warnings", {})  # datasets warns once a process
    assert rsft(fresh_model_dir, reward_threshold=0.0, require_stop=False).step().updated
    assert hit, "datasets hashed no transform: this test no longer reaches the swallowed interrupt"
    assert "couldn't be hashed" not in capfd.readouterr().err
    assert logging.getLogger("datasets.fingerprint").level == logging.NOTSET  # only while the step maps


def test_the_trainers_garbage_collection_walks_only_what_the_step_made(fresh_model_dir, monkeypatch):
    """The HF Trainer's full gc.collect() at each train() (accelerate's free_memory) runs with everything
    older frozen (its cost was the process's size: 2x the wall time of a CPU run); unfrozen afterwards,
    and a heap someone else froze (vLLM does) is left as it was."""
    import gc
    import sys

    from whale_train.rsft.update import step_garbage_only

    seen = []  # (caller's file, objects frozen) at each gc.collect()
    collect = gc.collect

    def recorded(*args):
        seen.append((sys._getframe(1).f_code.co_filename, gc.get_freeze_count()))
        return collect(*args)

    monkeypatch.setattr(gc, "collect", recorded)
    r = rsft(fresh_model_dir, reward_threshold=0.0, require_stop=False)
    assert gc.get_freeze_count() == 0
    assert r.step().updated, "the step trained nothing"
    trainers = [n for where, n in seen if where.endswith("accelerate/utils/memory.py")]
    assert trainers and all(n > 0 for n in trainers), seen  # the step's collection walked young objects only
    assert gc.get_freeze_count() == 0  # unfrozen: older garbage is collected as before
    seen.clear()  # without a carried AdamW state the earlier step's is garbage: the collection stays whole
    assert (
        rsft(fresh_model_dir, reward_threshold=0.0, require_stop=False, keep_optimizer=False).step().updated
    )
    trainers = [n for where, n in seen if where.endswith("accelerate/utils/memory.py")]
    assert trainers and all(n == 0 for n in trainers), seen
    gc.freeze()
    try:
        before = gc.get_freeze_count()  # (frozen objects freed meanwhile leave it, so it may only fall)
        with step_garbage_only():
            assert 0 < gc.get_freeze_count() <= before
        assert 0 < gc.get_freeze_count() <= before  # another's freeze is not undone
    finally:
        gc.unfreeze()
    # a freeze made for the process's life (a warm run's zygote) is left alone without counting it
    import whale_train.rsft.update as update

    monkeypatch.setattr(update, "_FROZEN_FOR_GOOD", True)
    for name in ("get_freeze_count", "freeze", "unfreeze"):
        monkeypatch.setattr(gc, name, lambda name=name: pytest.fail(f"gc.{name}() in a warm run's step"))
    with step_garbage_only():
        pass


def test_task_stream_is_epoch_ordered_and_resumable():
    stream = TaskStream([f"t{i}" for i in range(10)], seed=3)
    first = stream.take(10)
    assert sorted(first) == [f"t{i}" for i in range(10)] and stream.epochs_done == 1.0
    second = stream.take(4)
    assert second != first[:4] and len(set(second)) == 4  # a fresh shuffle per epoch
    resumed = TaskStream([f"t{i}" for i in range(10)], seed=3, position=12)
    assert resumed.take(2) == second[2:]


def test_config_from_yaml_and_errors(tmp_path):
    path = tmp_path / "rsft.yaml"
    path.write_text("batch_tasks: 32\nlearning_rate: 5.0e-5\nlora: true\n")
    config = RSFTConfig.from_yaml(path)
    assert (config.batch_tasks, config.learning_rate, config.lora) == (32, 5e-5, True)
    assert RSFTConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="^batch: unknown field; did you mean batch_tasks"):
        RSFTConfig.from_dict({"batch": 3})
    with pytest.raises(ValueError, match="learning_rate"):
        RSFTConfig.from_dict({"learning_rate": 2.0})


def test_phase_length_in_epochs(fresh_model_dir):
    r = rsft(fresh_model_dir, batch_tasks=64)
    n_train = len(r.stream.task_ids)
    assert r.steps_for(1.0) == round(n_train / 64)
    assert r.steps_for(0.0001) == 1


# ------------------------------------------------------------------------------------ the effect, small


@pytest.mark.effect
@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_six_rsft_steps_raise_held_out_math_accuracy_of_the_shipped_model(seed):
    """A smaller version of the README's 20-step effect (benchmarks/rsft_effect.py: 26.8 -> 53.8% on math):
    6 steps of 16 tasks x 8 samples at lr 1e-4. Measured gains on 64 test tasks x 4 samples: +12.1, +9.4
    and +17.2 points for seeds 0, 1, 2 (SE of one measurement ~4 points); the test asks for +5."""
    import gymnasium as gym

    from whale_train.llm import SHIPPED_MODEL
    from whale_train.rollout import RolloutConfig, run_rollouts, summarize

    llm = TransformersLLM(str(SHIPPED_MODEL))
    h0 = load_harness("math/h0")
    ids = gym.make("whale/Math-v0", split="test").unwrapped.task_ids[:64]

    def mean() -> float:
        config = RolloutConfig(k=4, seed=seed, trusted=True)
        return summarize(run_rollouts(h0, "whale/Math-v0", llm, ids, config=config))["mean"]

    before = mean()
    config = RSFTConfig(batch_tasks=16, samples=8, learning_rate=1e-4, seed=seed, save_checkpoints=False)
    r = RSFT(config, llm, h0, "whale/Math-v0")
    reports = [r.step() for _ in range(6)]
    after = mean()
    assert all(rep.updated for rep in reports) and llm.version == 6
    assert after - before > 0.05, (before, after)
