"""verifiers (the v1 API of the ``verifiers`` package) and WHALE, both ways.

* ``whale/Verifiers-v0`` (``env.py``): any installed verifiers taskset as a WHALE env; its task source
  (``source.py``), the episodes run by verifiers itself (``runner.py``) with the model's calls routed to
  the env's ``step`` (``bridge.py``).
* ``whale_verifiers`` (a top-level module, ``taskset.py`` and ``harness.py`` here): WHALE's envs as a
  verifiers taskset, for verifiers' own loader and evaluation.

Needs the ``envs`` extra: ``pip install 'whale-harness[envs]'``.
"""

from __future__ import annotations

try:
    import verifiers.v1  # noqa: F401
except ImportError as exc:  # pragma: no cover (the envs extra is installed by make test)
    raise ImportError(
        f"whale/Verifiers-v0 needs the verifiers package ({exc}); install it with: pip install 'whale-harness[envs]'"
    ) from None

from whale_envs.verifiers.env import VerifiersEnv
from whale_envs.verifiers.source import taskset_source

__all__ = ["VerifiersEnv", "taskset_source"]
