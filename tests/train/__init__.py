"""Tests of whale_train: the LLM backends (vLLM included), rollouts, RSFT, the Meta-Harness search and
`whale check`, schedules, the trainer, compare/report/traces and the command line."""
