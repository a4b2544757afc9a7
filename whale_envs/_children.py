"""Child-process helpers of the programs this project sends as source into a fresh interpreter: the
sandbox boot (``_sandbox_boot.py``) and the harness worker (``harnesses/worker.py``).

Neither program can import this package where it runs (``python -I -S -c``; inside the sandbox the
project is hidden), so each carries this file's source with it: :func:`whale_envs.sandbox` splices it
into the boot program in place of its import line, and the worker program inlines it as a module. So it
must only use the standard library and must not rely on ``__file__``.
"""

import os
import time


def reap_exited(patience_s=0.0):
    """Collect every child that has exited, without blocking. With ``patience_s``, wait up to that long
    for the others to exit too; return at once when no child is left."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            if time.monotonic() >= deadline:
                return
            time.sleep(0.01)
