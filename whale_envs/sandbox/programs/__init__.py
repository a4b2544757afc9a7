"""The programs the sandbox runs in a child interpreter, each a module of its own with a ``main()``.

* :mod:`.boot`: the boot program (on the host, as the caller): builds a call's jail and starts the code
  in it; also the fork server that does so for every call.
* :mod:`.probe`: the probe of a configuration (in the jail): did the code run jailed;
  :mod:`.episode_probe`, the harness worker's: and can each of its episodes run alone.
* :mod:`.pool_child`: a pooled sandbox's program (in the jail): waits for its code, then runs it.

They run where this package cannot be imported (``python -I -S`` on the host, the jail where the
project is hidden), so they use the standard library and import only modules of this project that do
too (:mod:`whale_envs._children`). :mod:`whale_envs.sandbox.bundle` starts each one, always the same way
(:mod:`.loader`): the tests import them like any module.
"""
