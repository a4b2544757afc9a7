"""``python -m whale_train.cli ...``: the ``whale`` command (``accelerate launch -m whale_train.cli`` runs it so)."""

import sys

from whale_train.cli import main

sys.exit(main())
