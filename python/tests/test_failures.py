"""Faults end every surviving rank with a ferrocoll exception within the
deadline, through torch's Work.wait() and its futures, instead of a hang."""

from __future__ import annotations

import time
from typing import Any, Callable, Tuple

import pytest

import ranks

torch = pytest.importorskip("torch")

DEADLINE = 4.0


def _init() -> None:
    from datetime import timedelta

    import torch.distributed as dist

    import ferrocoll.torch  # noqa: F401

    dist.init_process_group("ferrocoll", timeout=timedelta(seconds=DEADLINE))


def mismatched_collectives() -> Tuple[str, str, float]:
    """Rank 0 all-reduces, the others broadcast."""
    import torch
    import torch.distributed as dist

    _init()
    t = torch.ones(256)
    start = time.monotonic()
    try:
        if dist.get_rank() == 0:
            dist.all_reduce(t)
        else:
            dist.broadcast(t, src=0)
        return ("no error", "", 0.0)
    except Exception as e:  # noqa: BLE001
        return (type(e).__name__, str(e), time.monotonic() - start)


def test_a_mismatch_ends_every_rank_with_an_error() -> None:
    import ferrocoll

    for name, msg, took in ranks.run(3, mismatched_collectives):
        assert name in ("Mismatch", "Timeout", "PeerLost"), (name, msg)
        assert issubclass(getattr(ferrocoll, name), ferrocoll.Error)
        assert took < DEADLINE + 3, took


def lost_rank() -> Tuple[str, str, float]:
    """Rank 1 dies (no goodbye) while rank 0 waits for it in an allreduce."""
    import os

    import torch
    import torch.distributed as dist

    _init()
    dist.barrier()
    if dist.get_rank() == 1:
        time.sleep(0.3)
        os._exit(17)
    start = time.monotonic()
    work = dist.all_reduce(torch.ones(1 << 20), async_op=True)
    fut = work.get_future()
    try:
        work.wait()
        return ("no error", "", 0.0)
    except Exception as e:  # noqa: BLE001
        took = time.monotonic() - start
        # The future carries the same error.
        try:
            fut.wait()
            return ("future resolved", "", took)
        except Exception as fe:  # noqa: BLE001
            assert type(fe).__name__ in (type(e).__name__, "RuntimeError"), fe
        dist.destroy_process_group()
        return (type(e).__name__, str(e), took)


def test_a_lost_rank_is_peer_lost_on_the_survivor() -> None:
    out = ranks.run(2, lost_rank, allow_failure=True)
    assert out[1] == 17
    name, msg, took = out[0]
    assert name == "PeerLost", (name, msg)
    assert "rank 1" in msg
    assert took < DEADLINE + 3, took


def _rank_1_late(call: Callable[[], Any]) -> Tuple[str, str, float]:
    """Rank 1 arrives after the deadline; rank 0 runs ``call`` and reports
    how it failed: (error class, message, seconds it took)."""
    import torch.distributed as dist

    _init()
    dist.barrier()
    if dist.get_rank() == 1:
        time.sleep(DEADLINE + 2)
        return ("slept", "", 0.0)
    start = time.monotonic()
    try:
        call()
        return ("no error", "", 0.0)
    except Exception as e:  # noqa: BLE001
        return (type(e).__name__, str(e), time.monotonic() - start)


def late_rank() -> Tuple[str, str, float]:
    """Rank 1 arrives after the deadline of an all_reduce."""
    import torch
    import torch.distributed as dist

    return _rank_1_late(lambda: dist.all_reduce(torch.ones(16)))


def test_a_late_rank_is_a_timeout_naming_it() -> None:
    out = ranks.run(2, late_rank, allow_failure=True)
    name, msg, took = out[0]
    assert name == "Timeout", (name, msg)
    assert "for rank 1" in msg, msg
    assert DEADLINE - 0.5 < took < DEADLINE + 3, took


def late_to_monitored_barrier() -> Tuple[str, str, float]:
    """Rank 1 does not reach ``dist.monitored_barrier`` in time."""
    from datetime import timedelta

    import torch.distributed as dist

    return _rank_1_late(lambda: dist.monitored_barrier(timeout=timedelta(seconds=DEADLINE / 2)))


def test_monitored_barrier_names_the_late_rank_within_its_timeout() -> None:
    out = ranks.run(2, late_to_monitored_barrier, allow_failure=True)
    name, msg, took = out[0]
    assert name == "Timeout", (name, msg)
    assert "rank 1" in msg, msg
    assert DEADLINE / 2 - 0.5 < took < DEADLINE / 2 + 3, took


def numpy_mismatch() -> Tuple[str, str]:
    """The numpy-level API: different counts on the two ranks."""
    import numpy as np

    import ferrocoll

    comm = ferrocoll.init(timeout=DEADLINE)
    try:
        comm.all_reduce(np.ones(100 + comm.rank, dtype=np.float32))
        return ("no error", "")
    except ferrocoll.Error as e:
        return (type(e).__name__, str(e))


def test_numpy_mismatch_is_an_exception() -> None:
    for name, msg in ranks.run(2, numpy_mismatch):
        assert name in ("Mismatch", "Timeout"), (name, msg)
