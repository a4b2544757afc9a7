"""``whale check``: ``check_harness`` from the command line: a harness run with stand-in models (and the
real one unless ``--no-model``), with a report of what breaks."""

from __future__ import annotations

import argparse

from whale_train.cli import common
from whale_train.cli.registry import command
from whale_train.harness_for import load_harness_for


@command("check", help="check_harness: run a harness with stand-in models and report what breaks")
def arguments(p: argparse.ArgumentParser) -> None:
    from whale_train.check import CHECK_TASKS

    common.add_env_flags(p)
    common.add_harness_flag(p)
    common.add_model_flags(
        p,
        help="the model the harness will run with: the stand-ins copy it, and it answers other tasks' "
        "prompts, as in the harness search (default: the shipped tiny model)",
    )
    p.add_argument(
        "--no-model",
        action="store_true",
        help="no model: the model-free stand-ins only, each with and without a chat template",
    )
    p.add_argument(
        "--n-tasks",
        type=common.count(1),
        default=CHECK_TASKS,
        help="train-split tasks, one episode per stand-in each (the default catches a harness that "
        "solves 3x the chance level by itself; see docs/HARNESSES.md)",
    )
    common.add_episode_flags(p, 10.0, 64)
    p.set_defaults(func=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    from whale_train.check import check_harness
    from whale_train.rollout import RolloutConfig

    # a bad env or task source: a user error first
    env = common.make_env(args.env, args.tasks, "train").unwrapped
    harness = load_harness_for(args.harness, args.env, trusted=args.trusted)
    env_kwargs = {"tasks": args.tasks} if args.tasks else {}
    limits = common.episode_limits(args)
    isolation = common.isolation_of(RolloutConfig(trusted=args.trusted), env, harness)
    llm = None if args.no_model else common.load_llm(args)
    with common.errors.status(f"check_harness {harness.name}: starting") as status:
        report = check_harness(
            harness,
            args.env,
            env_kwargs=env_kwargs,
            n_tasks=args.n_tasks,
            seed=args.seed,
            llm=llm,
            trusted=args.trusted,
            harness_seconds=limits.harness_seconds,
            max_llm_calls=limits.max_llm_calls,
            max_tokens=limits.max_tokens,
            progress=lambda done, total, mode: status.update(
                f"check_harness {harness.name}: {done}/{total} episodes ({mode} stand-in)"
            ),
        )
    common.console.print(str(report), markup=False, highlight=False)
    common.console.print(f"  isolation: {isolation}", markup=False, highlight=False)
    return 0 if report.ok else 1
