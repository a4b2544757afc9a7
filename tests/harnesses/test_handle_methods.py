"""The handle methods are written once (``harnesses.base.ENV_METHODS`` / ``LLM_METHODS``): the harness
API (the Protocols), the proxies a harness gets (in the worker and in process) and the trusted side
that serves the calls (``Episode._op_*``) must all agree with that list."""

from __future__ import annotations

import inspect

import gymnasium as gym
import pytest

import whale_envs  # noqa: F401
from harnesses import worker
from harnesses.base import (
    ENV_METHODS,
    HANDLE_METHODS,
    LLM_METHODS,
    EnvHandle,
    EnvProxy,
    HarnessCallError,
    LLMHandle,
    LLMProxy,
)
from whale_train.llm.scripted import ScriptedLLM
from whale_train.rollout import Batcher, Episode, EpisodeLimits, executors

SIDES = [(EnvHandle, EnvProxy, ENV_METHODS), (LLMHandle, LLMProxy, LLM_METHODS)]


def shape(fn) -> list[tuple[str, inspect._ParameterKind]]:
    sig = fn if isinstance(fn, inspect.Signature) else inspect.signature(fn)
    return [(p.name, p.kind) for p in sig.parameters.values()]


def protocol_methods(protocol: type) -> set[str]:
    return {n for n, v in vars(protocol).items() if inspect.isfunction(v) and not n.startswith("_")}


@pytest.mark.parametrize(("protocol", "proxy", "methods"), SIDES)
def test_the_protocol_the_proxy_and_the_list_have_the_same_methods(protocol, proxy, methods):
    assert protocol_methods(protocol) == {m.name for m in methods}
    for m in methods:
        assert shape(getattr(protocol, m.name)) == shape(m.signature()), m.name
        assert shape(getattr(proxy, m.name)) == shape(m.signature()), m.name
        assert getattr(protocol, m.name).__doc__ == m.doc


def test_the_trusted_side_serves_exactly_the_listed_methods_with_their_arguments():
    served = {n.removeprefix("_op_") for n in vars(Episode) if n.startswith("_op_")}
    assert served == set(HANDLE_METHODS)
    for m in HANDLE_METHODS.values():
        names = [p.name for p in inspect.signature(getattr(Episode, f"_op_{m.name}")).parameters.values()]
        assert names == ["self", *m.args, *(["params"] if m.params else [])], m.name


def test_both_executors_hand_the_harness_the_shared_proxies():
    """No hand-written proxy is left: the worker and the in-process executor use the list's."""
    for module in (worker, executors):
        source = inspect.getsource(module)
        assert "EnvProxy(" in source and "LLMProxy(" in source, module.__name__
        own = [v for v in vars(module).values() if isinstance(v, type) and v.__module__ == module.__name__]
        assert not [(c.__name__, m) for c in own for m in HANDLE_METHODS if m in vars(c)]


def test_a_proxy_sends_what_the_trusted_side_expects():
    sent = []
    llm = LLMProxy(lambda method, args: sent.append((method, args)) or "ok", has_chat_template=True)
    assert llm.complete("p", temperature=0.0) == "ok"
    llm.sample(prompt="p", n=3)
    llm.complete_many(iter(["a", "b"]), max_tokens=4)
    llm.choose("p", ("x", "y"))
    llm.score("p", continuations=["x"])
    assert sent == [
        ("complete", {"prompt": "p", "params": {"temperature": 0.0}}),
        ("sample", {"prompt": "p", "n": 3, "params": {}}),
        ("complete_many", {"prompts": ["a", "b"], "params": {"max_tokens": 4}}),
        ("choose", {"prompt": "p", "options": ["x", "y"]}),
        ("score", {"prompt": "p", "continuations": ["x"]}),
    ]
    assert llm.has_chat_template is True
    with pytest.raises(TypeError):
        llm.choose("p")  # a wrong call fails in the harness, as a plain method call would
    with pytest.raises(TypeError):
        llm.score("p", ["x"], temperature=0.0)
    env = EnvProxy(lambda method, args: ["obs", {"k": 1}])
    assert env.reset() == ("obs", {"k": 1})  # JSON brings a tuple back as a list


def test_the_trusted_side_refuses_a_call_with_other_arguments():
    env = gym.make("whale/Math-v0", split="test")
    batcher = Batcher(ScriptedLLM(lambda prompt: "1"))
    try:
        task_id = env.unwrapped.task_ids[0]
        ep = Episode(env, "whale/Math-v0", task_id, 0, 1, batcher, "h", EpisodeLimits())
        with pytest.raises(HarnessCallError, match="unknown handle method"):
            ep.call("finish", {})
        with pytest.raises(HarnessCallError, match="takes the arguments"):
            ep.call("reset", {"seed": 3})
        with pytest.raises(HarnessCallError, match="takes the arguments"):
            ep.call("choose", {"prompt": "p"})
        obs, _ = ep.call("reset", {}).result()
        assert obs == ep.traj.reset_observation
    finally:
        batcher.close()
