"""The RSFT effect on the shipped tiny model: held-out mean@8 before and after N RSFT steps per domain.

    python benchmarks/rsft_effect.py [--domains math chess search] [--steps 20] [--out benchmarks/results/rsft]

For each domain: evaluate h0 on the first ``--eval-limit`` tasks of the default generated test split
(mean@8), run ``--steps`` RSFT steps under h0 (B tasks × k rollouts each), evaluating every
``--eval-every`` steps, and write ``<domain>.json`` (every step's signals, every evaluation) and
``rsft_curves.png``. Deterministic for a seed.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import gymnasium as gym

from harnesses.loader import load_harness
from whale_train.domains import get_domain
from whale_train.llm import load_llm
from whale_train.rollout import RolloutConfig, run_rollouts, summarize
from whale_train.rsft import RSFT, RSFTConfig
from whale_train.stats import mean_se

#: Domain -> (env, h0), from the domain registry, in the order of the results table.
DOMAINS = {
    name: (get_domain(name).env_id, get_domain(name).base_harness) for name in ("math", "chess", "search")
}


def evaluate(llm, env_id: str, harness, limit: int, k: int, seed: int) -> dict:
    ids = gym.make(env_id, split="test").unwrapped.task_ids[:limit]
    trajs = run_rollouts(
        harness, env_id, llm, ids, config=RolloutConfig(k=k, seed=10_000 + seed, trusted=True)
    )
    s = summarize(trajs)
    per_task: dict[str, list[float]] = {}
    for t in trajs:
        per_task.setdefault(t.task_id, []).append(t.reward)
    return {
        "mean": s["mean"],
        "se": s["se"],
        "pass_at_k": s["pass_at_k"],
        "tasks": s["tasks"],
        "failures": s["failures"],
        "per_task": {task: sum(r) / len(r) for task, r in per_task.items()},
    }


def paired(first: dict, last: dict) -> tuple[float, float]:
    """Mean and standard error of the per-task differences (the same test tasks before and after)."""
    return mean_se(last["per_task"][t] - m for t, m in first["per_task"].items())


def run_domain(domain: str, args) -> dict:
    env_id, harness_name = DOMAINS[domain]
    llm = load_llm("transformers", args.model)
    harness = load_harness(harness_name)
    config = RSFTConfig(
        batch_tasks=args.batch_tasks,
        samples=args.samples,
        learning_rate=args.lr,
        seed=args.seed,
        save_checkpoints=False,
    )
    rsft = RSFT(config, llm, harness, env_id)
    evals = [{"step": 0, **evaluate(llm, env_id, harness, args.eval_limit, 8, args.seed)}]
    print(f"{domain}: step 0 mean@8 {100 * evals[0]['mean']:.1f} ± {100 * evals[0]['se']:.1f}", flush=True)
    steps = []
    start = time.monotonic()
    for i in range(1, args.steps + 1):
        report = rsft.step()
        steps.append(report.to_dict())
        print(
            f"{domain}: step {i} train reward {report.train_reward:.3f} accepted {report.accepted} "
            f"loss {report.loss} ({report.sample_seconds:.0f}+{report.train_seconds:.0f} s)",
            flush=True,
        )
        if i % args.eval_every == 0 or i == args.steps:
            evals.append({"step": i, **evaluate(llm, env_id, harness, args.eval_limit, 8, args.seed)})
            print(
                f"{domain}: step {i} mean@8 {100 * evals[-1]['mean']:.1f} ± {100 * evals[-1]['se']:.1f}",
                flush=True,
            )
    first, last = evals[0], evals[-1]
    gain, se = paired(first, last)
    return {
        "domain": domain,
        "env": env_id,
        "harness": harness_name,
        "config": config.to_dict(),
        "steps": steps,
        "evals": evals,
        "gain": gain,
        "gain_se": se,  # paired over the test tasks
        "unpaired_se": math.hypot(first["se"], last["se"]),
        "significant": gain > 2 * se,
        "rsft_seconds": round(time.monotonic() - start, 1),
    }


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    for r in results:
        a.plot(
            [s["step"] + 1 for s in r["steps"]],
            [100 * s["train_reward"] for s in r["steps"]],
            label=r["domain"],
        )
        b.errorbar(
            [e["step"] for e in r["evals"]],
            [100 * e["mean"] for e in r["evals"]],
            yerr=[100 * e["se"] for e in r["evals"]],
            marker="o",
            capsize=2,
            label=r["domain"],
        )
    a.set(xlabel="RSFT step", ylabel="train reward before the update (%)", title="Training reward")
    b.set(xlabel="RSFT step", ylabel="held-out mean@8 (%)", title="Test accuracy (h0)")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--domains", nargs="+", default=list(DOMAINS), choices=list(DOMAINS))
    p.add_argument("--model", default=None, help="default: the shipped tiny model")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch-tasks", type=int, default=32)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--eval-limit", type=int, default=200)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="benchmarks/results/rsft")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for domain in args.domains:
        result = run_domain(domain, args)
        (out / f"{domain}.json").write_text(json.dumps(result, indent=1))
        results.append(result)
    everything = [
        json.loads((out / f"{d}.json").read_text()) for d in DOMAINS if (out / f"{d}.json").exists()
    ]
    plot(everything, out / "rsft_curves.png")  # every domain measured so far, in one figure
    for r in results:
        first, last = r["evals"][0], r["evals"][-1]
        print(
            f"{r['domain']}: {100 * first['mean']:.1f} ± {100 * first['se']:.1f} -> {100 * last['mean']:.1f} ± "
            f"{100 * last['se']:.1f} (gain {100 * r['gain']:+.1f} ± {100 * r['gain_se']:.1f} paired, "
            f"{'> 2 SE' if r['significant'] else 'within 2 SE'}; RSFT {r['rsft_seconds']:.0f} s)"
        )


if __name__ == "__main__":
    main()
