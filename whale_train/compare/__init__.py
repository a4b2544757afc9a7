"""``whale compare CONFIG.yaml``: the methods x domains x seeds grid at matched rollout budgets.

    whale compare configs/compare/cpu.yaml --jobs 2 [--out runs/compare/cpu] [--set eval.limit=32]

A compare config names the domains (a ``whale train`` config per domain, by path, plus overrides),
the methods, the seeds, overrides for every run, and optionally a schedule ablation of ``whale``::

    name: cpu
    domains:
      math: configs/math/base.yaml              # a path (relative to the working directory or this file)
      chess: {config: configs/chess/base.yaml, set: {tasks: "generated?difficulty=1"}}
      search: {set: {env: whale/SearchQA-v0}}   # no file: the overrides are the whole config
    methods: [whale, weight-only, harness-only, stagewise, fst]
    seeds: [0, 1, 2]
    set: {budget_rollouts: 768, eval.k: 8}     # nested mappings or dotted keys
    ablation: {domain: math, points: [[0.2, 2], [0.6, 6]]}   # (E, I) of whale; seeds: the grid's
    more_seeds: [{domain: math, methods: [whale, stagewise], seeds: [5, 6]}]  # added later, to some cells

Every run of a domain has the same config but for ``method`` and ``seed`` (and, for an ablation point,
``schedule.weight_epochs`` / ``schedule.harness_iterations``), so the methods spend the same rollout
budget. Runs with identical configs are run once. The plan runs the grid seed by seed, then the seeds of
``more_seeds`` (a paired difference uses the seeds both methods ran), then the ablation. Each run is a
``whale train`` subprocess with ``OMP_NUM_THREADS=1``, ``--jobs`` of them at a time. The output folder::

    grid.yaml                  the compare config as given (and the command line's --set)
    configs/<run>.yaml         the resolved train config of every run
    runs/<run>/                the run directories (ledger, checkpoints, archive, eval, train.log)
    compare.md, compare.json   the table
    plots/                     accuracy vs rollouts per domain; the ablation's bars

Resume: a second ``whale compare`` on the same folder skips finished runs (their ledger ends with a
``stop`` event) and continues unfinished ones with ``whale train --resume``.

Placement (docs/SCALING.md): ``--gpus-per-run N`` gives every concurrent local job N GPUs of its own
(disjoint ``CUDA_VISIBLE_DEVICES``); ``--ray ADDRESS`` (or ``local``) submits each run as a Ray task
with those resources, on run directories of a shared file system; a run whose node is lost is retried
by Ray and resumes. See :mod:`whale_train.placement`.

The package, one concern a module: :mod:`.stats` (mean ± SD, t-intervals, paired differences, the Holm
correction), :mod:`.plan` (the compare config and the grid of runs), :mod:`.runner` (subprocess runs,
resume), :mod:`.record` (finished runs' small files, committed, from which a grid continues on a fresh
machine), :mod:`.table` (``compare.json`` from the ledgers), :mod:`.verdict` (the claims and their
verdicts), :mod:`.markdown` (``compare.md``), :mod:`.plots`; its command line is ``whale_train.cli.compare``.
"""

from whale_train.compare.plan import (
    REFERENCE,
    WHALE,
    CompareConfig,
    Domain,
    RunSpec,
    plan,
    resolve,
    run_state,
    unit_cost,
)
from whale_train.compare.plots import plot_ablation, plot_accuracy, step_curve
from whale_train.compare.runner import run_grid, write_table
from whale_train.compare.stats import holm, mean_sd, paired_ci, rollouts_to_reach, t_cdf, t_quantile
from whale_train.compare.table import build_table, collect, operator_gains, reproduction
from whale_train.placement import train_one

__all__ = [
    "REFERENCE",
    "WHALE",
    "CompareConfig",
    "Domain",
    "RunSpec",
    "build_table",
    "collect",
    "holm",
    "mean_sd",
    "operator_gains",
    "paired_ci",
    "plan",
    "plot_ablation",
    "plot_accuracy",
    "reproduction",
    "resolve",
    "rollouts_to_reach",
    "run_grid",
    "run_state",
    "step_curve",
    "t_cdf",
    "t_quantile",
    "train_one",
    "unit_cost",
    "write_table",
]
