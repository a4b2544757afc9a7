"""The probe of a sandbox configuration: :func:`whale_envs.sandbox.policy.isolation_problem` runs it
in the jail, as a call runs its code, and reads the one line it writes:
``ok <uid> <1 if the host's /etc/passwd is visible, else 0>``. The harness worker's configuration runs
:mod:`.episode_probe` instead, which adds whether its episodes can run alone.

Standard library only: the probe of the tool's configuration is as small as a call's code.
"""

import os
import sys


def main() -> None:
    sys.stdout.write(f"ok {os.getuid()} {int(os.path.exists('/etc/passwd'))}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
