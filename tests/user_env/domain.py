"""The user's domain for Reverse-v0, registered on import (as a user's package would, next to its
``gym.register``): ``whale envs --import user_env.domain`` lists it."""

from pathlib import Path

from whale_train.domains import Domain, register_domain

REVERSE = register_domain(
    Domain(
        name="reverse",
        env_id="Reverse-v0",
        base_harness=str(Path(__file__).with_name("h0.py")),
        info_fields=("word", "options"),
        actions="the word reversed",
        options_field="options",
    )
)
