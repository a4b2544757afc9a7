"""verifiers tasksets (``whale/Verifiers-v0``): registered here because the env needs ``taskset=`` to be
built, so the generic domain (read from a reset of ``gym.make(env_id)``) cannot be made for it. Any
taskset's exchange is text, so the generic harness and mechanisms apply."""

from __future__ import annotations

from whale_envs import VERIFIERS_ID
from whale_train.domains.registry import Domain, register_domain

VERIFIERS = Domain(
    name="verifiers",
    env_id=VERIFIERS_ID,
    base_harness="generic/h0",
    info_fields=("error", "error_kind", "solved and rewards (the taskset's own, at the end)"),
    actions="one reply of the model, as the taskset's prompt asks; the taskset's environment reads it.",
)

register_domain(VERIFIERS)
