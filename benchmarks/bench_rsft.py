"""One RSFT step on the shipped model (math h0): how its wall time splits between sampling the
rollouts and fine-tuning on the accepted ones. The split is in the benchmark's extra_info (``make bench``
prints it; ``--benchmark-json`` keeps it)."""

from __future__ import annotations

import pytest

import whale_envs  # noqa: F401
from harnesses.loader import load_harness
from whale_train.llm import SHIPPED_MODEL
from whale_train.llm.hf import TransformersLLM
from whale_train.rsft import RSFT, RSFTConfig


@pytest.mark.benchmark(group="rsft")
def test_one_rsft_step_sampling_vs_training(benchmark):
    small = benchmark.disabled  # `make test` only checks that it runs and splits its time
    config = RSFTConfig(
        batch_tasks=8 if small else 32, samples=4 if small else 8, learning_rate=1e-4, save_checkpoints=False
    )
    rsft = RSFT(config, TransformersLLM(str(SHIPPED_MODEL)), load_harness("math/h0"), "whale/Math-v0")
    reports = []
    benchmark.pedantic(lambda: reports.append(rsft.step()), rounds=1 if small else 3, iterations=1)
    sample = sum(r.sample_seconds for r in reports) / len(reports)
    train = sum(r.train_seconds for r in reports) / len(reports)
    benchmark.extra_info.update(
        sample_seconds=round(sample, 2),
        train_seconds=round(train, 2),
        sample_share=round(sample / (sample + train), 2),
        accepted=[r.accepted for r in reports],
        train_tokens=[r.train_tokens for r in reports],
    )
    print(
        f"\nRSFT step: sampling {sample:.1f} s, training {train:.1f} s ({100 * sample / (sample + train):.0f}% sampling)"
    )
    assert all(r.accepted > 0 and r.updated for r in reports)  # the shipped model solves some of these
    assert sample > 0 and train > 0
    assert rsft.llm.version == len(reports)
