"""FSDP on CPU ranks, for the ``accelerate launch`` tests only (``tests/train/test_scale_accelerate.py`` puts
this folder first on ``PYTHONPATH``, so Python imports it at start-up in every rank; nothing of it
reaches a real run).

accelerate (1.15) turns FSDP on only for accelerator devices and leaves CPU ranks plain data parallel,
although torch's ``fully_shard`` shards over a CPU (gloo) mesh. When the launcher asks for FSDP
(``ACCELERATE_USE_FSDP=true``) and there is no GPU, this makes ``AcceleratorState`` take the FSDP
path the way it does on GPUs, so two CPU ranks run the same FSDP2 code as a GPU job.
"""

from __future__ import annotations

import os


def _fsdp_on_cpu() -> None:
    import torch

    if torch.cuda.is_available():
        return
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedType

    original = AcceleratorState.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        plugin = kwargs.get("fsdp_plugin")
        if plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = plugin

    AcceleratorState.__init__ = init


if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
    _fsdp_on_cpu()
