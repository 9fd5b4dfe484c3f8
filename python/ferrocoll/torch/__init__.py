"""The ``"ferrocoll"`` backend of ``torch.distributed``.

>>> import torch.distributed as dist
>>> import ferrocoll.torch            # registers the backend
>>> dist.init_process_group("ferrocoll")  # under torchrun or ferrocoll run

Importing this module registers the backend (``devices=["cpu"]``); the rest
of a training script (DDP, FSDP2, ``dist.all_reduce`` ...) is unchanged. See
:mod:`ferrocoll.torch.backend` for what each operation does.
"""

from __future__ import annotations

from .backend import ProcessGroupFerrocoll, register

__all__ = ["ProcessGroupFerrocoll", "register"]

register()
