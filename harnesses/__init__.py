"""Harnesses: the code around the model that drives an env (contract, loader, seed harnesses)."""
