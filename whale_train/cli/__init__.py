"""The ``whale`` command line: one module per command, each registered with ``@command``
(:mod:`whale_train.cli.registry`); :mod:`.common` holds what they share, :mod:`.parser` assembles them.

    whale envs [--import MODULE]    the registered environments, their task sources and domains
    whale tasks --env ID            the tasks of a source and split (ids, difficulty), for tracing results
    whale eval --env ID --harness H evaluate a harness with a model: mean@k, pass@k, traces
    whale check --env ID --harness H check_harness: does the harness work, and does it need the model?
    whale pretrain --out DIR        build the tiny CPU default model
    whale search --env ID ...       harness-only Meta-Harness search
    whale lineage ARCHIVE           the lineage report of a harness archive
    whale train CONFIG.yaml         WHALE or a baseline, with ledger, checkpoints, resume
    whale report RUN_DIR...         report.md and plots from run directories
    whale compare CONFIG.yaml       the methods x domains x seeds grid at matched budgets: table and plots
    whale traces PATH               read traces.jsonl episode by episode, filtered by task, failure, harness
    whale retriever build|serve|recall   a dense index, a retrieval server, recall@k of a retriever

Every command that takes ``--tasks`` takes the same spec string as ``gym.make(env_id, tasks=...)``:
``kind[:path][?key=value&...]`` (e.g. ``lichess``, ``lichess:puzzles.csv?min_rating=1500``, ``generated?seed=3``).

A new command is a module here with an ``@command("name", help=...)`` function that adds its arguments
and ``set_defaults(func=handler)``, imported below.
"""

# The order of the imports is the order of `whale --help`.
# isort: off
from whale_train.cli import envs, tasks, eval, check, pretrain, search, lineage  # noqa: F401
from whale_train.cli import train, report, compare, traces, retriever  # noqa: F401

# isort: on
from whale_train.cli.parser import build_parser, main

__all__ = ["build_parser", "main"]
