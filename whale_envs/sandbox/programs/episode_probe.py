"""The probe of the harness worker's configuration: :mod:`.probe`'s line, then `` episodes-alone``
when an episode's namespaces (:func:`whale_envs._children.isolate_episode`) can be made and the
isolated process is PID 1 of its own namespace, sees no other process and no network, else
`` episodes: <why not>``.
"""

import os
import sys

from whale_envs._children import isolate_episode
from whale_envs.sandbox.programs import probe


def episodes() -> str:
    """``episodes-alone``, or ``episodes: <why not>``."""
    try:
        pid = isolate_episode()
    except OSError as exc:
        return "episodes: " + str(exc)[:300]
    if pid == 0:  # the isolated process
        alone = [p for p in os.listdir("/proc") if p.isdigit()] == ["1"] and os.getpid() == 1
        with open("/proc/net/dev") as fh:  # its network namespace's links (if_nameindex needs netlink)
            links = [line.split(":")[0].strip() for line in fh.readlines()[2:]]
        os._exit(0 if alone and links == ["lo"] else 3)
    _, status = os.waitpid(pid, 0)
    return "episodes-alone" if status == 0 else "episodes: the isolated process was not alone"


def main() -> None:
    probe.main()  # flushed: before the fork
    sys.stdout.write(" " + episodes())


if __name__ == "__main__":
    main()
