"""The WHALE trainer: alternate the weight operator (RSFT) and the harness operator (Meta-Harness
search) under a schedule policy, on one rollout ledger, with test evaluation, checkpoints and resume.

    whale train configs/math/whale.yaml [--set rsft.learning_rate=5e-5 ...] [--out runs/NAME] [--resume]

The run directory::

    config.yaml       the resolved config
    ledger.jsonl      one line per event: every unit (RSFT step / harness iteration) with the rollouts it
                      spent and its signals, every phase switch with its reason, every test evaluation
    state.json        where the run stands (written atomically after each unit): what --resume reads
    splits.json       the split key's fingerprint (whale_envs.splits; never the secret); after the run,
                      the ids of every test set
    trusted_state.log what ``--resume --trust-state`` unpickled in full (only when it was asked for)
    checkpoints/<v>/  model versions (save_pretrained + optimizer state)
    archive/          the harness archive (candidates, scores and traces per model version)
    eval/             test mean@k per (model version, harness)
    tb/               TensorBoard event files (``report_to``; wandb/ and trackio/ when those are asked for)
    report.md, plots/ written by ``whale report``
    .train.lock       held (``flock``) by the one ``whale train`` writing the directory; a second one is
                      refused, naming the first one's pid

Resume: a unit is the grain of work. A run killed at any point restarts the unit it was in, from the
last saved state (model weights, optimizer, task stream, archive, ledger length); rollouts are seeded
by unit, so the rerun is identical and nothing is counted twice. A run directory names no path of its
own, so it resumes wherever it is moved.

The modules, one concern each (every name is importable from here):

    config.py      TrainConfig and EvalConfig, every field with its help; the shipped configs
    run.py         Run: the loop (phase, unit, record, evaluate, save) until the schedule says stop
    units.py       the unit of each phase (an RSFT step, a harness iteration), the operators behind them
    run_eval.py    the in-run test evaluations, the selection score, the evaluation cache's key
    test_sets.py   the test sets those evaluations score; splits.json
    state.py       ledger.jsonl, state.json and config.yaml: what a run records, what --resume reads
    backend.py     the rollout backend a config names, and the module RSFT trains beside it
    interrupt.py   Ctrl-C: the flag checked before a unit or an evaluation is kept
"""

from whale_train.trainer.backend import load_backend, train_model
from whale_train.trainer.config import SHIPPED_CONFIGS, EvalConfig, TrainConfig, find_config, shipped_configs
from whale_train.trainer.interrupt import INTERRUPTED, sigint_stops_run, stop_if_interrupted
from whale_train.trainer.run import Run
from whale_train.trainer.state import RUN_LOCK, _comparable, _truncate_lines, record_config
from whale_train.trainer.test_sets import check_split_secret, eval_task_ids, eval_task_sets, list_test_ids
from whale_train.trainer.units import UNIT_KINDS, HarnessPhase, make_harness_phase, unit_of

__all__ = [
    "INTERRUPTED",
    "RUN_LOCK",
    "SHIPPED_CONFIGS",
    "UNIT_KINDS",
    "EvalConfig",
    "HarnessPhase",
    "Run",
    "TrainConfig",
    "_comparable",
    "_truncate_lines",
    "check_split_secret",
    "eval_task_ids",
    "eval_task_sets",
    "find_config",
    "list_test_ids",
    "load_backend",
    "make_harness_phase",
    "record_config",
    "shipped_configs",
    "sigint_stops_run",
    "stop_if_interrupted",
    "train_model",
    "unit_of",
]
