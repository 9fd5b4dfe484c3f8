"""``dist.split_group`` and ``dist.monitored_barrier`` for ferrocoll groups.

torch runs both only on groups with a C++ backend registered per device:
``split_group`` asks the parent's C++ backend to split itself
(``supports_splitting``), and ``monitored_barrier`` refuses a group whose
``_device_types`` lacks the CPU. A Python process group, as
:class:`~ferrocoll.torch.backend.ProcessGroupFerrocoll` is, has none, and
registering one would also attach torch's flight recorder, which needs a C++
backend to name the group. So :func:`install` (run on import) wraps the two
functions: a ferrocoll group takes the path below, every other group torch's
own, unchanged.

* ``split_group``: the split this rank belongs to becomes a group of its own
  through ``new_group`` with local synchronisation (only that split's
  members take part) and the split's rank order (its position in the list is
  the group rank, as ``split_group`` promises). The communicator is
  ferrocoll's ``subgroup`` of the world's: no message is exchanged.
* ``monitored_barrier``: the group's own method, gloo's protocol (every
  rank reports to rank 0, which waits for each within the timeout and then
  releases them) on ferrocoll's sends and receives, with gloo's wording:
  rank 0's error names the rank that did not arrive.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable, List, Optional

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from .backend import ProcessGroupFerrocoll

__all__ = ["split_group", "monitored_barrier", "install"]

#: torch's own functions, called for groups of other backends.
_torch_split_group: Callable[..., Any] = c10d.split_group
_torch_monitored_barrier: Callable[..., Any] = c10d.monitored_barrier


def _ferrocoll_group(group: Any) -> Optional[ProcessGroupFerrocoll]:
    """``group`` (``None``: the default group, if there is one) when it is a
    ferrocoll group, else ``None``."""
    if group is None or group is dist.GroupMember.WORLD:
        if not dist.is_initialized():
            return None
        group = c10d._get_default_group()
    return group if isinstance(group, ProcessGroupFerrocoll) else None


def _check_splits(split_ranks: Optional[List[List[int]]], parent_size: int) -> List[List[int]]:
    """The checks torch's ``split_group`` makes, with its messages."""
    if split_ranks is None or len(split_ranks) == 0:
        raise ValueError("split_ranks cannot be None or empty")
    seen: set = set()
    for split in split_ranks:
        if len(split) == 0:
            raise ValueError("the split group cannot be empty")
        if len(split) > parent_size:
            raise ValueError(
                "the split group's size should be less or equal to the world_size set by init_process_group"
            )
        if len(split) != len(set(split)):
            raise ValueError("the split group cannot have duplicate ranks")
        for r in split:
            if not 0 <= r < parent_size:
                raise ValueError(
                    f"rank {r} of split {split} is not a rank of the parent group (size {parent_size})"
                )
            if r in seen:
                raise ValueError(f"rank {r} is in more than one split of {split_ranks}")
            seen.add(r)
    return split_ranks


def split_group(
    parent_pg: Any = None,
    split_ranks: Optional[List[List[int]]] = None,
    timeout: Optional[timedelta] = None,
    pg_options: Any = None,
    group_desc: Optional[str] = None,
    backend: Any = None,
) -> Any:
    """``torch.distributed.split_group`` that also splits ferrocoll groups.

    ``split_ranks`` are ranks of ``parent_pg`` (default: the world); every
    member of the parent calls this with the same lists, and gets the group
    of the split that holds it (``GroupMember.NON_GROUP_MEMBER`` when none
    does). Groups of other backends go to torch's ``split_group``.
    """
    parent = _ferrocoll_group(parent_pg)
    if parent is None:
        return _torch_split_group(
            parent_pg=parent_pg,
            split_ranks=split_ranks,
            timeout=timeout,
            pg_options=pg_options,
            group_desc=group_desc,
            backend=backend,
        )
    if backend is not None and str(backend).lower() not in ("ferrocoll", "cpu:ferrocoll"):
        raise ValueError(
            f"the parent group runs ferrocoll; split_group cannot give its splits backend {backend!r}"
        )
    splits = _check_splits(split_ranks, parent.size())
    members = dist.get_process_group_ranks(parent)
    me = parent.rank()
    mine = next((s for s in splits if me in s), None)
    if mine is None:
        # torch names groups from a counter that every caller must advance
        # alike (the members' new_group below advances it once): torch's
        # own split_group counts its non-members too.
        c10d._process_group_name(splits[0], use_hashed_name=True)
        return dist.GroupMember.NON_GROUP_MEMBER
    return c10d._new_group_with_tag(
        [members[r] for r in mine],
        timeout=timeout,
        backend="ferrocoll",
        use_local_synchronization=True,
        group_desc=group_desc or "split_group",
        sort_ranks=False,
    )


def monitored_barrier(
    group: Any = dist.GroupMember.WORLD,
    timeout: Optional[Any] = None,
    wait_all_ranks: bool = False,
) -> None:
    """``torch.distributed.monitored_barrier`` that also runs on ferrocoll
    groups: a barrier that fails within ``timeout`` (a ``timedelta`` or
    seconds; default: the group's), on rank 0 with ferrocoll's ``Timeout``
    naming the rank that did not arrive, on the others with an error saying
    rank 0 failed (:meth:`ProcessGroupFerrocoll.monitored_barrier`)."""
    pg = _ferrocoll_group(group)
    if pg is None:
        return _torch_monitored_barrier(group, timeout, wait_all_ranks)
    if isinstance(timeout, (int, float)):
        timeout = timedelta(seconds=timeout)
    return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)


def install() -> None:
    """Puts the two wrappers where ``dist.split_group`` and
    ``dist.monitored_barrier`` are looked up (idempotent)."""
    for module in (dist, c10d):
        module.split_group = split_group  # type: ignore[attr-defined]
        module.monitored_barrier = monitored_barrier  # type: ignore[attr-defined]
