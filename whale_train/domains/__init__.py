"""The domain registry (see ``registry.py``); importing this package registers the built-in domains.

from whale_train.domains import Domain, domain_for, register_domain

domain_for("whale/Math-v0").base_harness        # "math/h0"
domain_for("my_pkg.envs:Coin-v0")               # a user's env: its registered domain, or a generic one
register_domain(Domain(name="coin", env_id="Coin-v0", base_harness="path/to/h0.py", ...))
"""

from __future__ import annotations

from whale_train.domains import chess, math, search, verifiers  # noqa: F401  (each registers its domain)
from whale_train.domains.registry import (
    Domain,
    domain_for,
    get_domain,
    import_env_module,
    load_ref,
    register_domain,
    registered,
)

__all__ = [
    "Domain",
    "domain_for",
    "get_domain",
    "import_env_module",
    "load_ref",
    "register_domain",
    "registered",
]
