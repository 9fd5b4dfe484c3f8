"""The backend's work objects: :class:`FerrocollWork` (torch's ``Work`` over
ferrocoll handles, with the torch future DDP's comm hooks chain on) and the
staging of non-contiguous tensors and tensor lists."""

from __future__ import annotations

import collections
import threading
from datetime import timedelta
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

import ferrocoll


class _Staged:
    """Tensors made contiguous for a call, and the copies back once it is done."""

    __slots__ = ("back",)

    def __init__(self) -> None:
        self.back: List[Tuple[torch.Tensor, torch.Tensor]] = []

    def contiguous(self, t: torch.Tensor, written: bool) -> torch.Tensor:
        if t.is_contiguous():
            return t
        c = t.contiguous()
        if written:
            self.back.append((t, c))
        return c

    def unpack(self, flat: torch.Tensor, outputs: Sequence[torch.Tensor]) -> List[Tuple[int, int, int]]:
        """The copies ``(from, to, bytes)`` that scatter the 1-D ``flat``, the
        outputs back to back, into ``outputs`` once a call is done: ferrocoll's
        worker makes them for contiguous outputs; non-contiguous ones are
        copied back here by :meth:`finish`."""
        copies = []
        start = 0
        for o in outputs:
            if o.is_contiguous():
                nbytes = o.numel() * o.element_size()
                copies.append((flat.data_ptr() + start * flat.element_size(), o.data_ptr(), nbytes))
            else:
                self.back.append((o, flat[start : start + o.numel()].view(o.shape)))
            start += o.numel()
        return copies

    def finish(self) -> None:
        with torch.no_grad():
            for orig, copy in self.back:
                orig.copy_(copy)
        self.back = []


#: How many finished works, and how many bytes of their tensors, stay alive
#: after their calls end (see :class:`_Lifetimes`).
_RECENT_WORKS = 1024
_RECENT_BYTES = 256 << 20


class _Lifetimes:
    """Keeps each :class:`FerrocollWork` alive while its calls run, and for
    a while after they end.

    torch's C++ side can hold a work that Python has dropped: DDP's
    ``Join`` hands the forward pass's all_reduce to the reducer, which waits
    on it at the end of the backward pass, and functional collectives
    register works by tensor. A Python subclass of ``Work`` held only from
    C++ loses its Python half (pybind11 keeps the C++ object, not the Python
    one): the tensors its call writes into were freed under ferrocoll's
    worker (heap corruption in a DDP ``Join`` run), and a later ``wait()``
    from C++ finds no Python method. So every work whose calls still run
    when it is made is kept here, in the order made. The oldest go once
    their calls have ended and more than :data:`_RECENT_WORKS` works, or
    more than :data:`_RECENT_BYTES` of their tensors, are kept (a C++ holder
    waits within a training step, after far fewer works); one still running
    moves to the back instead. Checking the oldest on each new work costs
    no thread hand-off, where a completion callback per work would take the
    GIL on ferrocoll's completer thread for every call.
    """

    #: Running works moved to the back per new work, at most (a receive
    #: nobody sends to must not make each call scan them all).
    _ROTATIONS = 8

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._works: collections.deque = collections.deque()
        self._bytes = 0

    def keep(self, work: "FerrocollWork", nbytes: int) -> None:
        with self._lock:
            self._works.append((work, nbytes))
            self._bytes += nbytes
            rotations = 0
            while len(self._works) > _RECENT_WORKS or self._bytes > _RECENT_BYTES:
                oldest, b = self._works.popleft()
                if not oldest.is_completed():
                    self._works.append((oldest, b))
                    rotations += 1
                    if rotations >= self._ROTATIONS:
                        break
                    continue
                self._bytes -= b


_LIFETIMES = _Lifetimes()

#: Set on a thread while it resolves a torch future (and so runs the
#: future's callbacks, which torch runs on the resolving thread).
_resolving = threading.local()


def _tensor_bytes(items: Sequence[Any]) -> int:
    return sum(t.numel() * t.element_size() for t in items if isinstance(t, torch.Tensor))


class FerrocollWork(dist.Work):
    """torch's Work over one or more ferrocoll handles.

    ``wait()`` blocks without the GIL and raises ferrocoll's error;
    ``get_future()`` gives a ``torch.futures.Future`` that resolves to the
    output tensors (what DDP's comm hooks expect).
    """

    def __init__(
        self,
        handles: List[Any],
        outputs: List[torch.Tensor],
        keep: Tuple[Any, ...],
        staged: Optional[_Staged] = None,
        post: Optional[Callable[[], None]] = None,
    ) -> None:
        super().__init__()
        self._handles = handles
        self._outputs = outputs
        self._keep = keep
        self._staged = staged
        self._post = post
        self._lock = threading.Lock()
        self._finished = False
        self._error: Optional[BaseException] = None
        self._future: Optional[torch.futures.Future] = None
        self._pending = len(handles)
        # A call still running (queued, not run eagerly) is kept alive until
        # it ends and a while after (_Lifetimes); one that ran eagerly no
        # longer touches its tensors, and torch's synchronous calls wait on
        # it at once.
        for h in handles:
            if not h.is_completed():
                _LIFETIMES.keep(self, _tensor_bytes(outputs) + _tensor_bytes(keep))
                break

    # -- completion -------------------------------------------------------

    def _finish(self) -> None:
        """Runs the Python part of completion once (copies back, post)."""
        with self._lock:
            if self._finished:
                return
            self._finished = True
            try:
                if self._staged is not None:
                    self._staged.finish()
                if self._post is not None:
                    self._post()
            except BaseException as e:  # surfaced through wait() and the future
                self._error = e
            self._keep = ()

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        """Blocks until the call finished; raises its error. A non-zero
        ``timeout`` raises :class:`ferrocoll.Timeout` if it is still running then."""
        secs = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout or 0)
        for h in self._handles:
            if not h.wait(secs if secs > 0 else None):
                raise ferrocoll.Timeout(
                    f"ferrocoll backend: work not completed within {secs} s (it is still running)"
                )
        self._finish()
        if self._error is not None:
            raise self._error
        return True

    def _source_rank(self) -> int:
        """The rank a receive came from (torch asks after ``recv(src=None)``)."""
        cell = getattr(self, "_source_cell", None)
        if cell is not None:
            self.wait()
            return int(cell[0])
        return int(getattr(self, "_source", -1))

    def is_completed(self) -> bool:
        """True once every part finished (successfully or not). Never blocks."""
        return all(h.is_completed() for h in self._handles)

    def is_success(self) -> bool:
        """True once finished without error."""
        return self.is_completed() and self.exception() is None

    def exception(self) -> Optional[BaseException]:
        """The error the call failed with, else None."""
        if self._error is not None:
            return self._error
        for h in self._handles:
            e = h.exception()
            if e is not None:
                return e
        return None

    def result(self) -> List[torch.Tensor]:
        """The output tensors."""
        return self._outputs

    def get_future(self) -> torch.futures.Future:
        """A future resolved with the output tensors (or the error) when the call finishes."""
        with self._lock:
            if self._future is not None:
                return self._future
            fut: torch.futures.Future = torch.futures.Future()
            self._future = fut
        if not self._handles:
            self._deliver(None)
            return fut
        if getattr(_resolving, "active", False):
            # Asked for inside another future's callback, on the thread
            # that resolves futures in completion order (ferrocoll's
            # completer): a callback that waits for this future (torch's
            # PowerSGD hook) would block the only thread that could resolve
            # it. A thread of its own waits for this one instead; the order
            # in which callbacks issue calls stays the completion order.
            threading.Thread(target=self._wait_and_deliver, name="ferrocoll-future", daemon=True).start()
            return fut
        for h in self._handles:
            h.on_complete(self._part_done)
        return fut

    def _wait_and_deliver(self) -> None:
        error: Optional[BaseException] = None
        for h in self._handles:
            try:
                h.wait(None)
            except BaseException as e:  # noqa: BLE001 - delivered through the future
                error = error or e
        self._deliver(error or self.exception())

    def _part_done(self, exc: Optional[BaseException]) -> None:
        with self._lock:
            self._pending -= 1
            if exc is not None and self._error is None:
                self._error = exc
            last = self._pending == 0
        if last:
            self._deliver(self._error)

    def _deliver(self, exc: Optional[BaseException]) -> None:
        self._finish()
        exc = exc or self._error
        fut = self._future
        if fut is None or fut.done():
            return
        outer = getattr(_resolving, "active", False)
        _resolving.active = True
        try:
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(self._outputs)
        finally:
            _resolving.active = outer


def _combine(works: List[FerrocollWork], outputs: List[torch.Tensor]) -> FerrocollWork:
    """One work over several (the coalesced forms)."""
    handles = [h for w in works for h in w._handles]
    staged = _Staged()
    keep: Tuple[Any, ...] = ()
    for w in works:
        keep += w._keep
        if w._staged is not None:
            staged.back.extend(w._staged.back)
    return FerrocollWork(handles, outputs, keep, staged)
