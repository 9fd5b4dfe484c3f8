"""Compressed allreduce over numpy arrays: :class:`Compressor`, one buffer's
codec and error-feedback state on a :class:`ferrocoll.Communicator`.

>>> import numpy as np, ferrocoll
>>> from ferrocoll.compress import Compressor
>>> comm = ferrocoll.init()
>>> grad = np.ones(1 << 20, dtype=np.float32)
>>> c = Compressor(comm, grad.size, "int8:128")   # one per buffer, kept across steps
>>> c.all_reduce(grad)                             # in place: the (approximate) mean
>>> c.last_stats()["measured_bytes"]               # what the transport moved

Codecs are written as ``ferrocoll bench allreduce --compress`` takes them:
``fp16``, ``bf16``, ``int8[:BLOCK]``, ``onebit[:BLOCK]``, ``topk:K``,
``randk:K[:SEED[:unscaled]]``, ``powersgd[:RANK[:ROWSxCOLS[:SEED]]]`` (``K`` a
fraction such as ``0.01`` or ``1%``, or a count). Calls run on the
communicator's progress worker, in issue order with its other non-blocking
calls, without the GIL. The torch DDP comm hooks over this are in
:mod:`ferrocoll.torch.hooks`.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

from . import Communicator, InvalidArgument, Request
from . import _ferrocoll as _core

__all__ = ["Compressor"]


class Compressor:
    """The compressed allreduce of one float32 buffer of ``length`` elements.

    Every rank makes one with the same length, codec and options and calls it
    in the same order. ``error_feedback``: None for the codec's default (on;
    off for the rescaled, unbiased Random-k), False to send each call's
    compressed buffer alone. ``hierarchical``: None where the topology allows
    it (ranks on 2+ hosts, 2+ per host), False for the flat form.
    """

    __slots__ = ("_c",)

    def __init__(
        self,
        comm: Communicator,
        length: int,
        codec: str,
        error_feedback: Optional[bool] = None,
        hierarchical: Optional[bool] = None,
    ) -> None:
        self._c = _core.Compressor(comm._comm, int(length), codec, error_feedback, hierarchical)

    @property
    def length(self) -> int:
        """Elements of the buffer."""
        return int(self._c.len)

    @property
    def codec(self) -> str:
        """The codec as given."""
        return str(self._c.codec)

    def all_reduce(self, buf: np.ndarray, op: str = "avg", *, async_op: bool = False) -> Any:
        """The compressed allreduce of ``buf`` (C-contiguous float32) in place:
        every rank gets the same approximation of the mean (``op="avg"``) or
        sum (``"sum"``) of the ranks' buffers plus their residuals. With
        ``async_op`` returns a :class:`ferrocoll.Request` (``buf`` must not be
        touched until it completes)."""
        arr = _float32_buffer(buf)
        handle = self._c.all_reduce((arr.__array_interface__["data"][0], arr.size), op)
        req = Request(handle, (arr,), arr)
        if async_op:
            return req
        req.wait()
        return None

    def submit(
        self, address: int, length: int, op: str = "avg", copies: Sequence[Tuple[int, int, int]] = ()
    ) -> Any:
        """Queues the call on a buffer given by address (for callers such as the
        torch hooks that hold the memory themselves) and returns the raw
        handle (``wait()``, ``is_completed()``, ``on_complete(fn)``)."""
        return self._c.all_reduce((int(address), int(length)), op, list(copies) or None)

    def last_stats(self) -> Dict[str, float]:
        """The last call's wire statistics: ``sent_bytes`` (by the algorithm's
        formula), ``measured_bytes`` (the transport's counter during the call),
        ``input_bytes``, ``exchanges``, ``codec_time`` and ``comm_time`` (s)."""
        return dict(self._c.last_stats())

    def total_stats(self) -> Dict[str, float]:
        """:meth:`last_stats` summed over every call, with ``calls``."""
        return dict(self._c.total_stats())

    def residual(self) -> Optional[np.ndarray]:
        """This rank's residual over :meth:`residual_range` (None without
        error feedback or before the first call)."""
        r = self._c.residual()
        return None if r is None else np.asarray(r, dtype=np.float32)

    def residual_range(self) -> Optional[Tuple[int, int]]:
        """The ``(start, end)`` the residual covers (all of the buffer in the flat form)."""
        return self._c.residual_range()

    def server_residual(self) -> Optional[np.ndarray]:
        """The two-phase quantizers' server-side residual of this rank's chunk."""
        r = self._c.server_residual()
        return None if r is None else np.asarray(r, dtype=np.float32)

    def chunk(self, rank: int) -> Optional[Tuple[int, int]]:
        """The ``(start, end)`` of the buffer rank ``rank`` reduces."""
        return self._c.chunk(int(rank))

    def algorithm(self) -> Optional[str]:
        """``two-phase``, ``allgather``, ``allreduce-values``, ``powersgd``
        or a ``hier-`` form; None before the first call."""
        return self._c.algorithm()

    def name(self) -> Optional[str]:
        """The codec with its parameters resolved; None before the first call."""
        return self._c.name()

    def error_feedback(self) -> Optional[bool]:
        """Whether residuals are kept; None before the first call."""
        return self._c.error_feedback()

    def reset(self) -> None:
        """Forgets residuals, the step and PowerSGD's warm start (every rank together)."""
        self._c.reset()


def _float32_buffer(buf: Any) -> np.ndarray:
    arr = buf if isinstance(buf, np.ndarray) else np.asarray(memoryview(buf))
    if arr.dtype != np.float32:
        raise InvalidArgument(f"compressed all_reduce takes float32 buffers, got {arr.dtype}")
    if not arr.flags.c_contiguous or not arr.flags.writeable:
        raise InvalidArgument(
            "compressed all_reduce needs a C-contiguous, writable buffer (it works in place)"
        )
    return arr
