"""Tests of the harnesses package: the harness contract (validation, the worker, one bad harness never
stopping an evaluation) and the handle methods every side of it must agree on."""
