"""Tests of whale_envs: the math, chess, search, reasoning-gym and verifiers envs, their task sources,
verifiers and splits, the retrieval server and its encoders, and the Gymnasium conformance of every env."""
