"""The generic mechanisms' methods (``library/generic.py``): overrides of the seed harness's hooks, in the
subclass a candidate adds below the seed's own source; ``super()`` is the seed's class. Copied whole by
``core.code_of``.
"""

from __future__ import annotations

from harnesses.base import majority


class ActionVote:
    """action: vote."""

    def act(self, obs, info, llm):
        """Self-consistency: the most frequent parsed action among several samples."""
        prompt = self.make_prompt(self.format_observation(obs, info), info, llm)
        texts = llm.sample(prompt, self.samples, **self.params())
        best = majority([self.parse_action(t, info) or "" for t in texts])
        if best is not None:
            return best
        return texts[0] if texts else ""


class ActionChoose:
    """action: choose (offered when the domain names an ``options_field``, the class attribute the
    candidate sets)."""

    def act(self, obs, info, llm):
        """The listed option the model finds most likely (never an invalid action)."""
        options = [str(o) for o in info.get(self.options_field) or []]
        if not options:
            return super().act(obs, info, llm)
        prompt = self.make_prompt(self.format_observation(obs, info), info, llm)
        return options[llm.choose(prompt, options)]


class RetryEnvError:
    """retry: env_error (both methods)."""

    def format_observation(self, obs, info):
        """The seed's text, plus the env's error for the last action when the seed does not show it."""
        text = super().format_observation(obs, info)
        error = info.get("error")
        if error and error not in text:
            text += f"\nYour previous reply was rejected: {error}"
        return text

    def on_parse_error(self, prompt, text, info):
        """Retry with a note that the reply could not be read as an action."""
        note = "Your reply could not be read as an action. Reply exactly in the format asked."
        if isinstance(prompt, list):
            last = prompt[-1]["content"]
            if note in last:
                return prompt
            return prompt[:-1] + [{"role": prompt[-1]["role"], "content": last + "\n" + note}]
        return prompt if note in prompt else prompt + "\n" + note
