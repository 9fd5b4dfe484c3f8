"""The ``"ferrocoll"`` backend of ``torch.distributed``.

>>> import torch.distributed as dist
>>> import ferrocoll.torch            # registers the backend
>>> dist.init_process_group("ferrocoll")  # under torchrun or ferrocoll run

Importing this module registers the backend (``devices=["cpu"]``) and, under
``ferrocoll run``, sets torch's ``env://`` variables from ferrocoll's; the rest
of a training script (DDP, FSDP2, ``dist.all_reduce`` ...) is unchanged.
``dist.split_group`` and ``dist.monitored_barrier``, which torch runs only on
groups with a C++ backend, are wrapped to accept ferrocoll groups as well
(:mod:`ferrocoll.torch.groups`). See
:mod:`ferrocoll.torch.backend` for what each operation does.
"""

from __future__ import annotations

import os

from .backend import ProcessGroupFerrocoll, register
from .groups import install as _install_group_functions

__all__ = ["ProcessGroupFerrocoll", "register", "env_from_ferrocoll_run"]


def env_from_ferrocoll_run() -> bool:
    """Under ``ferrocoll run`` (``FERROCOLL_RANK`` set, torch's ``RANK`` not),
    sets torch's ``env://`` variables from ferrocoll's: ``RANK``,
    ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, and ``MASTER_ADDR`` /
    ``MASTER_PORT`` from ``FERROCOLL_ADDR`` (torch's store then listens there;
    ferrocoll's own store is not started, the backend meets through torch's).
    Returns whether it set them. Called on import."""
    env = os.environ
    if "RANK" in env or "FERROCOLL_RANK" not in env:
        return False
    env["RANK"] = env["FERROCOLL_RANK"]
    env.setdefault("WORLD_SIZE", env.get("FERROCOLL_WORLD_SIZE", "1"))
    env.setdefault("LOCAL_RANK", env.get("FERROCOLL_LOCAL_RANK", env["RANK"]))
    env.setdefault("LOCAL_WORLD_SIZE", env.get("FERROCOLL_LOCAL_WORLD_SIZE", env["WORLD_SIZE"]))
    host, _, port = env.get("FERROCOLL_ADDR", "127.0.0.1:29500").rpartition(":")
    env.setdefault("MASTER_ADDR", host.strip("[]") or "127.0.0.1")
    env.setdefault("MASTER_PORT", port or "29500")
    return True


env_from_ferrocoll_run()
register()
_install_group_functions()
