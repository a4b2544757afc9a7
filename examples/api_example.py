"""The Python API in one script: evaluate a harness, search for a better one, train. (docs/API.md)

    python examples/api_example.py [OUT_DIR]

Runs on a CPU in a few minutes with the shipped tiny model; everything lands in OUT_DIR
(default: runs/api-example).
"""

from __future__ import annotations

import sys
from pathlib import Path

import gymnasium as gym

import whale_envs  # noqa: F401  (registers whale/Chess-v0, whale/Math-v0, whale/SearchQA-v0)
from harnesses.loader import load_harness
from whale_train.llm import load_llm
from whale_train.meta_harness import HarnessSearch, MetaHarnessConfig
from whale_train.rollout import RolloutConfig, run_rollouts, summarize, write_jsonl
from whale_train.trainer import Run, TrainConfig


def main(out: Path) -> None:
    env_id, tasks = "whale/Math-v0", "generated?difficulty=1&size=80"
    llm = load_llm("transformers")  # the shipped tiny model; load_llm("vllm", "Qwen/Qwen3.5-2B") on a GPU

    # 1. Evaluate: a harness x the first 8 test tasks x k=2 samples -> trajectories -> mean@k
    harness = load_harness("math/h0")  # or load_harness("my_harness.py")
    test_ids = gym.make(env_id, tasks=tasks, split="test").unwrapped.task_ids[:8]
    trajs = run_rollouts(
        harness,
        env_id,
        llm,
        test_ids,
        env_kwargs={"tasks": tasks, "split": "test"},
        config=RolloutConfig(k=2, seed=0, trusted=harness.shipped),
    )
    s = summarize(trajs)
    print(f"eval: {harness.name} mean@2 = {100 * s['mean']:.1f}% ± {100 * s['se']:.1f} on {s['tasks']} tasks")
    write_jsonl(trajs, out / "eval" / "traces.jsonl")  # read it with `whale traces OUT/eval`

    # 2. Search: two Meta-Harness iterations on the frozen model (resumes if OUT/search exists)
    search = HarnessSearch(
        MetaHarnessConfig.from_dict(
            {"candidates": 2, "harness_tasks": 8, "frontier_size": 1, "check_tasks": 2, "seed": 0}
        ),
        out / "search" / "archive",
        llm,
        env_id,
        {"tasks": tasks},
        seed_harness=harness,
        log=print,
    )
    search.run(2)
    print(f"search: incumbent {search.incumbent.name}")

    # 3. Train: a shipped config by name, overridden like `--set`; resume=True continues a stopped run
    config = TrainConfig.load("smoke", ["budget_rollouts=24", "report_to=none"])
    run_dir = out / "train"
    summary = Run(config, run_dir, resume=(run_dir / "state.json").exists()).run()
    print(f"train: best test mean@k {summary['best_mean']} after {summary['rollouts']} rollouts -> {run_dir}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/api-example"))
