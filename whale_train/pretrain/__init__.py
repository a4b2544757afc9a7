"""``whale pretrain``: the CPU default model, trained from scratch on text generated from the three domains.

The recipe, in order (every step seeded by ``PretrainConfig.seed``):

1. **Warm-start text.** :func:`examples` draws an endless stream of prompt -> reply pairs from the task
   generators of the three domains (chess mate-in-1 puzzles, math problems, fictional-world search
   questions), each rendered in one of several *presentation formats*: the prompts the shipped
   harnesses send (built by calling their own hooks, so they match exactly), the env's raw
   observations, and other templates, orders and answer notations, with and without move lists or
   passages, as chat turns or as plain text. The model is therefore not tied to one harness's format:
   harness search has something to find and RSFT something to adapt. Math replies also teach
   expression writing (``<expr>12 + 7 - 4</expr>``, ``python: print(12 + 7 - 4)``), so a calculator
   step is a real mechanism. Only content whose *unkeyed* hash is in the train share is used
   (``whale_envs.splits.public_split_of`` on the FEN or question). A run's splits are keyed by its
   split secret, which does not exist when the model is built, so this keeps about 30% of the
   generators' content out of pretraining but cannot keep a run's test tasks out: docs/HARNESSES.md
   ("What is measured stays unseen") gives the measured overlap.
2. **Tokenizer.** A byte-level BPE (``tiny.train_tokenizer``: ~1k tokens, digits split, ChatML template)
   trained on a sample of that text.
3. **Model.** A fresh ``Qwen3ForCausalLM`` of ``size`` (``tiny`` ~0.9M parameters, ``small`` ~5M).
4. **Supervised pass.** AdamW with linear warm-up and cosine decay, length-bucketed batches of about
   ``batch_tokens`` tokens; full weight on the reply tokens, a per-domain ``prompt_loss_weights`` on the
   prompt (search passages repeat names, which teaches the model to copy them; a math question's
   random digits teach nothing).
   With ``--minutes`` the step count is fixed at the end of the warm-up from the speed measured so
   far (so the schedule is a pure function of the step count, recorded in the card: ``--steps N``
   replays it). Ctrl-C stops training and still saves what is done.
5. **Save and card.** ``save_pretrained`` (loads with ``AutoModelForCausalLM`` / ``AutoTokenizer``
   offline), ``README.md`` (the model card: config, data seed, minutes, data mix, measured
   accuracies) and ``whale_pretrain.json`` (the same, machine-readable, with the SHA-256 of the
   weight and tokenizer files).
6. **Calibration.** Optionally (``--eval-tasks N``) the saved model is evaluated exactly as
   ``whale eval`` would (mean@k ± SE on the first N tasks of each domain's default generated test
   split) under h0, or under every shipped harness (``--eval-harnesses all``); the numbers go into the
   card.
"""

from whale_train.pretrain.card import (
    EVAL_ENVS,
    EVAL_HARNESSES,
    HASHED_FILES,
    LIMITS,
    calibrate,
    harness_gaps,
    render_card,
    sha256,
    write_card,
)
from whale_train.pretrain.formats import (
    CHESS_FORMATS,
    MATH_FORMATS,
    PASSAGE_CHARS,
    PYTHON_SHARE,
    SEARCH_FORMATS,
    Example,
    TextFormats,
    _python_value,
    calculator_prompt,
    math_expression,
    vote_prompt,
)
from whale_train.pretrain.job import command_line, pretrain
from whale_train.pretrain.training import (
    DOMAINS,
    Batch,
    PretrainConfig,
    TrainRecord,
    batches,
    chat_prompt,
    example_text,
    examples,
    lr_at,
    parse_shares,
    pretrain_domains,
    tokenizer_corpus,
    train,
)

__all__ = [
    "CHESS_FORMATS",
    "DOMAINS",
    "EVAL_ENVS",
    "EVAL_HARNESSES",
    "HASHED_FILES",
    "LIMITS",
    "MATH_FORMATS",
    "PASSAGE_CHARS",
    "PYTHON_SHARE",
    "SEARCH_FORMATS",
    "Batch",
    "Example",
    "PretrainConfig",
    "TextFormats",
    "TrainRecord",
    "_python_value",
    "batches",
    "calculator_prompt",
    "calibrate",
    "chat_prompt",
    "command_line",
    "example_text",
    "examples",
    "harness_gaps",
    "lr_at",
    "math_expression",
    "parse_shares",
    "pretrain",
    "pretrain_domains",
    "render_card",
    "sha256",
    "tokenizer_corpus",
    "train",
    "vote_prompt",
    "write_card",
]
