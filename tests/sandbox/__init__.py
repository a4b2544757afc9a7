"""Tests of isolation: the OS sandbox (whale_envs/sandbox), the harness worker and its protocol, the AST
lint in front of them, and what an untrusted harness or tool call must not reach (another episode, the
kernel's shared objects, the split of a task). Most are red-team tests: each attack must be contained."""
