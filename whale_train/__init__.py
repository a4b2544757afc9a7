"""WHALE trainer: LLM backends, rollouts, RSFT, Meta-Harness search, schedules and the CLI."""
