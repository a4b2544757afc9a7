"""The model card of ``whale pretrain``: calibration (mean@k of the saved model under each domain's
shipped harnesses, exactly as ``whale eval`` measures it), checksums, and the card itself."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from whale_train.domains import registered
from whale_train.pretrain.training import PretrainConfig

#: The env and the shipped harnesses (base first) of each pretrained domain, for the calibration.
EVAL_ENVS = {d.name: d.env_id for d in registered() if d.pretrain_formats}
EVAL_HARNESSES = {d.name: d.harnesses for d in registered() if d.pretrain_formats}

#: The weight and tokenizer files whose SHA-256 the card records.
HASHED_FILES = ("model.safetensors", "tokenizer.json")


def calibrate(
    model_dir: str | Path,
    config: PretrainConfig,
    console=None,
    on_result: Callable[[str, dict[str, Any]], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """mean@k ± SE of the saved model under each domain's h0 (or every shipped harness), measured exactly
    as ``whale eval --model DIR --harness H --split test --limit N --k K --seed 0 --trusted`` does.

    Every domain's h0 runs first, then the other harnesses; ``on_result(name, result)`` sees each result
    as it comes. The returned dict is in ``EVAL_HARNESSES`` order."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from harnesses.loader import load_harness
    from whale_train.evaluation import evaluate, task_set
    from whale_train.llm import load_llm

    llm = load_llm("transformers", str(model_dir))
    count = max(map(len, EVAL_HARNESSES.values())) if config.eval_harnesses == "all" else 1
    plan = [
        (d, EVAL_HARNESSES[d][i])
        for i in range(count)
        for d in config.domain_list()
        if i < len(EVAL_HARNESSES[d])
    ]
    tests = {
        d: task_set(EVAL_ENVS[d], {"split": "test"}, config.eval_tasks)
        for d in dict.fromkeys(d for d, _ in plan)
    }
    results: dict[str, dict[str, Any]] = {}
    for domain, name in plan:
        env_id, tasks = EVAL_ENVS[domain], tests[domain]
        columns = (TextColumn(f"[bold]{name}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console) as bar:
            job = bar.add_task(name, total=len(tasks.ids) * config.eval_k)
            run = evaluate(  # as whale eval --seed 0 --concurrency 128 --trusted
                load_harness(name),
                env_id,
                llm,
                [tasks],
                k=config.eval_k,
                seed=0,
                concurrency=128,
                trusted=True,
                progress=lambda _t, bar=bar, job=job: bar.advance(job),
            )
        s = run.summary
        results[name] = {
            "env": env_id,
            "tasks_source": tasks.source.name,
            "tasks": s["tasks"],
            "k": s["k"],
            "mean": round(s["mean"], 4),
            "se": round(s["se"], 4),
            "pass_at_k": round(s["pass_at_k"], 4),
            "by_difficulty": {d: round(v["mean"], 4) for d, v in s["by_difficulty"].items()},
            "failures": s["failures"],
            "wall_seconds": round(run.wall_seconds, 1),
        }
        if console is not None:
            console.print(
                f"{name}: mean@{s['k']} {100 * s['mean']:.1f}% ± {100 * s['se']:.1f} ({s['tasks']} tasks)"
            )
        if on_result is not None:
            on_result(name, results[name])
    order = [n for names in EVAL_HARNESSES.values() for n in names]
    return {n: results[n] for n in order if n in results}


def sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_card(out: str | Path, info: dict[str, Any]) -> Path:
    """Write ``whale_pretrain.json`` (``info``) and ``README.md`` (the model card rendered from it)."""
    out = Path(out)
    (out / "whale_pretrain.json").write_text(json.dumps(info, indent=2) + "\n")
    path = out / "README.md"
    path.write_text(render_card(info))
    return path


LIMITS = """\
- Chess: it learns to copy a legal move from the list and the few-piece and back-rank mate-in-1 patterns
  it was trained on (generator level 1); on mates in middlegame positions (level 2) it is near the
  rate of a random legal move. It never saw mate-in-2 puzzles.
- Math: direct answers are mostly right only for single-digit problems; two-digit numbers and
  multiplication are beyond it. It writes expressions (`<expr>`, `python: print(...)`) by copying the
  numbers of the problem, so a calculator step solves what it cannot compute; fraction expressions
  print floats, which the verifier rejects unless they are exact.
- Search: it copies names from the question into a query and from a passage into an answer; reading a
  chain of passages (multi-hop) is mostly beyond it.
- It is a test fixture for the WHALE machinery on a CPU, not a useful assistant: outside the
  formats above it produces fluent-looking nonsense."""


def harness_gaps(cal: dict[str, dict[str, Any]]) -> list[str]:
    """One line per non-h0 harness: its mean@k minus its domain's h0, in points and standard errors."""
    lines = []
    for domain, names in EVAL_HARNESSES.items():
        base = cal.get(names[0])
        for name in names[1:]:
            r = cal.get(name)
            if base is None or r is None:
                continue
            gap = r["mean"] - base["mean"]
            se = math.hypot(r["se"], base["se"])
            z = f"{gap / se:+.1f} SE" if se else "no spread"
            lines.append(f"{domain}: `{name}` {100 * gap:+.1f} points vs `{names[0]}` ({z})")
    return lines


def render_card(info: dict[str, Any]) -> str:
    cfg, tr, model = info["config"], info["training"], info["model"]
    tokens = tr["tokens"] or 1
    share = ", ".join(f"{d} {100 * n / tokens:.0f}%" for d, n in tr["tokens_by_domain"].items())
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: text-generation",
        "---",
        "",
        f"# WHALE CPU default model ({cfg['size']})",
        "",
        f"A {model['parameters'] / 1e6:.2f}M-parameter `{model['architecture']}` trained from scratch by "
        f"`whale pretrain` on text generated from the three WHALE domains (chess mate-in-1 puzzles, math "
        f"problems, fictional-world search questions), in several presentation formats per domain. It loads "
        f"like any Qwen checkpoint (`AutoModelForCausalLM` / `AutoTokenizer`, offline) and answers in ChatML.",
        "",
        "## How it was made",
        "",
        "```",
        info["command"],
        "```",
        "",
        f"- Data seed {cfg['seed']}; the same seed gives the same tokenizer, the same examples and the same "
        f"batch order. Replay exactly this schedule with `--steps {tr['steps']}`.",
        f"- Training: {tr['steps']} optimizer steps"
        + (f" (interrupted; {tr['planned_steps']} planned)" if tr["interrupted"] else "")
        + f" in {tr['seconds'] / 60:.1f} minutes on {info['machine']}, {tr['tokens'] / 1e6:.1f}M tokens "
        f"({share}); final loss {tr['final_loss']}.",
        f"- Optimizer: AdamW, lr {cfg['lr']} with {cfg['warmup_steps']} warm-up steps and cosine decay to "
        f"{cfg['lr'] * cfg['min_lr_ratio']:.0e}, weight decay {cfg['weight_decay']}, ~{cfg['batch_tokens']} "
        f"tokens per step, gradient clip 1.0; prompt tokens weigh {cfg['prompt_loss_weights']} in the loss.",
        f"- Data mix (share of examples): {cfg['mix']}; chess levels {cfg['chess_levels']}; math levels "
        f"{cfg['math_levels']} (all four families); search hops {cfg['search_hops']}. Only content whose "
        "unkeyed hash (`public_split_of`) is in the train share is used.",
        f"- Model: hidden {model['hidden_size']}, {model['layers']} layers, "
        f"{model['heads']}/{model['kv_heads']} attention/KV heads, MLP {model['intermediate_size']}, tied "
        f"embeddings; tokenizer: byte-level BPE, {model['vocab_size']} tokens, digits split, ChatML.",
        "",
        "Formats (prompt -> reply), per domain:",
        "",
    ]
    for domain, formats in info["formats"].items():
        lines.append(f"- {domain}: " + ", ".join(f"`{f}` {100 * w:.0f}%" for f, w in formats.items()))
    lines += ["", "## Measured accuracy", ""]
    cal = info.get("calibration") or {}
    if cal:
        first = next(iter(cal.values()))
        lines += [
            f"mean@{first['k']} (k samples at temperature 1 per task) ± standard error over tasks, on the first "
            f"tasks of each env's default generated test split (`whale eval --split test --limit N --k "
            f"{first['k']} --seed 0 --trusted`):",
            "",
            "| env | harness | tasks | mean@k % | ± SE | pass@k % | by difficulty % |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, r in cal.items():
            diff = ", ".join(f"{d}: {100 * m:.1f}" for d, m in r["by_difficulty"].items())
            lines.append(
                f"| {r['env']} | {name} | {r['tasks']} | {100 * r['mean']:.1f} | {100 * r['se']:.1f} | "
                f"{100 * r['pass_at_k']:.1f} | {diff} |"
            )
        lines += [
            "",
            "Task sources: " + "; ".join(sorted({f"`{r['tasks_source']}`" for r in cal.values()})) + ".",
        ]
        gaps = harness_gaps(cal)
        if gaps:
            lines += [
                "",
                "Each stronger shipped harness against its domain's h0 (points and standard errors):",
                "",
            ]
            lines += [f"- {line}" for line in gaps]
    else:
        lines.append("Not measured (`--eval-tasks 0`).")
    lines += ["", "## What it can and cannot do", "", LIMITS]
    lines += ["", "## Files", "", "| file | sha256 |", "|---|---|"]
    lines += [f"| {name} | `{digest}` |" for name, digest in info["sha256"].items()]
    return "\n".join(lines) + "\n"
