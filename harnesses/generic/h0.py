"""h0, the generic harness: for a text env that ships no harness of its own (reasoning-gym, a verifiers
environment, a user's env).

The prompt is the env's observation as it is: a WHALE env says in it what a reply should look like
(``whale/ReasoningGym-v0``: the answer inside ``<answer></answer>``). The model's reply, stripped, is
the action, and the loop goes on until the env ends the episode: a rejected reply comes back as the
env's error above the same state, and the model replies to that. An empty reply is asked for again
once. It knows nothing of any env, so the offline proposer's generic mechanisms (vote, the env's error
in the prompt, the sampling constants) are what improves it.
"""

from harnesses.base import Harness


class GenericH0(Harness):
    name = "generic/h0"
    temperature = 1.0
    max_tokens = 256
    format_retries = 1
