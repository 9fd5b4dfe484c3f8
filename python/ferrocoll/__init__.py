"""ferrocoll for Python: collectives over numpy arrays (and anything with the
buffer protocol), in place and zero-copy.

>>> import numpy as np, ferrocoll
>>> comm = ferrocoll.init()          # under ferrocoll run, torchrun, mpirun or srun
>>> grads = np.ones(1 << 20, dtype=np.float32)
>>> comm.all_reduce(grads)           # in place: every rank now holds the sum
>>> req = comm.all_reduce(grads, op="max", async_op=True)
>>> req.wait()

Every call releases the GIL while ferrocoll works. Non-blocking calls
(``async_op=True`` or the ``i``-prefixed names) return a :class:`Request` at
once; their buffers must not be read or written until it completes (the
request keeps them alive). Errors are :class:`Error` subclasses with
ferrocoll's message (the collective, its sequence number, the rank, the peer).

``import ferrocoll.torch`` registers the ``"ferrocoll"`` backend of
``torch.distributed``.
"""

from __future__ import annotations

import atexit
from typing import Any, Optional, Sequence

import numpy as np

from . import _ferrocoll as _core
from ._ferrocoll import (
    Aborted,
    ConfigError,
    Corrupted,
    Error,
    InternalError,
    InvalidArgument,
    Mismatch,
    PeerLost,
    StartupError,
    Timeout,
    UnknownAlgorithm,
)

__all__ = [
    "Aborted",
    "Communicator",
    "ConfigError",
    "Corrupted",
    "Error",
    "InternalError",
    "InvalidArgument",
    "Mismatch",
    "PeerLost",
    "Request",
    "StartupError",
    "Timeout",
    "UnknownAlgorithm",
    "dtype_code",
    "init",
    "init_with_store",
]

__version__: str = _core.__version__

# Before the interpreter finalizes, stop ferrocoll's completer thread from
# taking the GIL (a thread that does so during finalization takes the process
# down): callbacks of calls still running at exit are dropped.
atexit.register(_core._shutdown)

#: numpy element types ferrocoll reduces, by their ferrocoll name.
_NUMPY_DTYPES = {
    np.dtype(np.float32): "f32",
    np.dtype(np.float64): "f64",
    np.dtype(np.float16): "f16",
    np.dtype(np.int8): "i8",
    np.dtype(np.uint8): "u8",
    np.dtype(np.int32): "i32",
    np.dtype(np.int64): "i64",
    np.dtype(np.uint32): "u32",
    np.dtype(np.uint64): "u64",
    np.dtype(np.bool_): "u8",
}


def dtype_code(dtype: np.dtype) -> str:
    """The ferrocoll element type of a numpy dtype (``"f32"``, ...).

    ``bfloat16`` from ml_dtypes is accepted by name. Raises
    :class:`InvalidArgument` for types ferrocoll does not reduce.
    """
    code = _NUMPY_DTYPES.get(dtype)
    if code is None:
        if dtype.name == "bfloat16":
            return "bf16"
        raise InvalidArgument(
            f"element type {dtype} is not one ferrocoll reduces; use one of "
            "float32, float64, float16, bfloat16, int8, uint8, int32, int64, uint32, uint64"
        )
    return code


def _array(x: Any, what: str, writable: bool) -> np.ndarray:
    """``x`` as a C-contiguous numpy array sharing its memory (the extension
    checks contiguity, writability and the element type)."""
    arr = x if isinstance(x, np.ndarray) else np.asarray(memoryview(x))
    if not arr.flags.c_contiguous:
        raise InvalidArgument(
            f"{what} is not contiguous; pass np.ascontiguousarray(...) (and copy results back "
            "yourself): ferrocoll reads and writes buffers in place"
        )
    if writable and not arr.flags.writeable:
        raise InvalidArgument(f"{what} is read-only but the call writes into it")
    return arr


def _nd(x: Any) -> np.ndarray:
    """``x`` as a numpy array without copying (the buffer protocol for non-arrays)."""
    return x if isinstance(x, np.ndarray) else np.asarray(memoryview(x))


def _addr(arr: np.ndarray) -> int:
    return arr.__array_interface__["data"][0]


class Request:
    """A non-blocking call in progress.

    It holds the call's buffers until the call is done; :meth:`wait` raises
    the call's error, if any.
    """

    __slots__ = ("_handle", "_keep", "_result")

    def __init__(self, handle: Any, keep: tuple, result: Any = None) -> None:
        self._handle = handle
        self._keep = keep
        self._result = result

    def wait(self, timeout: Optional[float] = None) -> Any:
        """Blocks until the call finishes (without the GIL) and returns its
        output array (None for calls without one). With ``timeout`` seconds,
        raises :class:`Timeout` if it is still running then (the call goes on)."""
        if not self._handle.wait(timeout):
            raise Timeout(f"the call did not finish within {timeout} s (it is still running)")
        self._keep = ()
        return self._result

    def is_completed(self) -> bool:
        """True once the call finished, successfully or not. Never blocks."""
        return bool(self._handle.is_completed())

    test = is_completed

    def exception(self) -> Optional[BaseException]:
        """The call's error once it failed, else None."""
        return self._handle.exception()


class Communicator:
    """A group of ranks that call collectives together (see :func:`init`).

    Buffers are numpy arrays or any object with the buffer protocol,
    C-contiguous, of one of ferrocoll's element types; results are written in
    place. Calls whose ``recv`` is omitted work in place on ``send``.
    """

    __slots__ = ("_comm",)

    def __init__(self, comm: Any) -> None:
        self._comm = comm

    @property
    def rank(self) -> int:
        """This rank, in ``0..size``."""
        return self._comm.rank

    @property
    def size(self) -> int:
        """Number of ranks."""
        return self._comm.size

    @property
    def transport(self) -> str:
        """``thread``, ``shm``, ``tcp`` or ``shm+tcp``."""
        return self._comm.transport

    @property
    def bytes_sent(self) -> int:
        """Payload bytes this rank has handed its transport for other ranks on
        this communicator since it was made (its calls only; a subgroup counts
        its own)."""
        return self._comm.bytes_sent

    def __repr__(self) -> str:
        return f"ferrocoll.Communicator(rank={self.rank}, size={self.size}, transport={self.transport!r})"

    # ---- groups ---------------------------------------------------------

    def split(self, color: Optional[int], key: int = 0) -> Optional["Communicator"]:
        """MPI_Comm_split: ranks passing the same ``color`` form a new
        communicator ordered by ``key`` then rank; ``color=None`` gets None.
        Every rank must call it."""
        c = self._comm.split(color, key)
        return None if c is None else Communicator(c)

    def subgroup(self, ranks: Sequence[int], tag: int = 0) -> "Communicator":
        """A communicator over ``ranks`` made by its members alone (no
        communication; MPI_Comm_create_group). Every member passes the same
        list and tag."""
        return Communicator(self._comm.subgroup(list(ranks), tag))

    def abort(self) -> None:
        """Ends every call in progress with :class:`Aborted`, here and on the peers."""
        self._comm.abort()

    def choose(self, collective: str, nbytes: int) -> tuple:
        """``(algorithm, reason)``: what ``auto`` picks for ``collective`` at ``nbytes``."""
        return self._comm.choose(collective, nbytes)

    # ---- the call ---------------------------------------------------------

    def _submit(self, kind: str, keep: tuple, result: Any, async_op: bool, **kw: Any) -> Any:
        handle = self._comm.submit(kind, async_op=async_op, **kw)
        if async_op:
            return Request(handle, keep, result)
        return None

    # ---- collectives --------------------------------------------------------

    def all_reduce(self, send: Any, recv: Any = None, op: str = "sum", *, async_op: bool = False) -> Any:
        """Every rank gets ``op`` over every rank's ``send`` in ``recv``
        (in place on ``send`` when ``recv`` is omitted). ``op``: sum, prod,
        min, max, avg."""
        s = _nd(send)
        r = s if recv is None else _nd(recv)
        h = self._comm.call("all_reduce", s, r, op, 0, async_op)
        return Request(h, (s, r), r) if async_op else None

    def broadcast(self, buf: Any, root: int = 0, *, async_op: bool = False) -> Any:
        """Every rank's ``buf`` becomes the root's ``buf``."""
        b = _nd(buf)
        h = self._comm.call("broadcast", b, None, "sum", root, async_op)
        return Request(h, (b,), b) if async_op else None

    def reduce(
        self, send: Any, recv: Any = None, op: str = "sum", root: int = 0, *, async_op: bool = False
    ) -> Any:
        """The root gets ``op`` over every rank's ``send`` in ``recv`` (in
        place on ``send`` when omitted; other ranks' ``recv`` is not used)."""
        s = _nd(send)
        r = s if recv is None else _nd(recv)
        h = self._comm.call("reduce", s, r, op, root, async_op)
        return Request(h, (s, r), r) if async_op else None

    def all_gather(self, send: Any, recv: Any, *, async_op: bool = False) -> Any:
        """``recv`` (``size`` times ``send``) gets every rank's ``send`` in rank order."""
        s, r = _nd(send), _nd(recv)
        h = self._comm.call("all_gather", s, r, "sum", 0, async_op)
        return Request(h, (s, r), r) if async_op else None

    def reduce_scatter(self, send: Any, recv: Any, op: str = "sum", *, async_op: bool = False) -> Any:
        """Rank r's ``recv`` gets ``op`` over block r of every rank's ``send``
        (``send`` holds ``size`` blocks of ``recv``'s length)."""
        s, r = _nd(send), _nd(recv)
        h = self._comm.call("reduce_scatter", s, r, op, 0, async_op)
        return Request(h, (s, r), r) if async_op else None

    def all_to_all(self, send: Any, recv: Any, *, async_op: bool = False) -> Any:
        """Block p of ``send`` goes to rank p; block p of ``recv`` comes from rank p."""
        s, r = _nd(send), _nd(recv)
        h = self._comm.call("all_to_all", s, r, "sum", 0, async_op)
        return Request(h, (s, r), r) if async_op else None

    def all_to_all_v(
        self,
        send: Any,
        send_counts: Sequence[int],
        recv: Any,
        recv_counts: Sequence[int],
        *,
        async_op: bool = False,
    ) -> Any:
        """All-to-all with per-peer counts (elements), packed in rank order;
        rank p's ``send_counts[r]`` must equal rank r's ``recv_counts[p]``."""
        s = _array(send, "send", False)
        r = _array(recv, "recv", True)
        return self._submit(
            "all_to_all_v",
            (s, r),
            r,
            async_op,
            dtype=dtype_code(s.dtype),
            send=(_addr(s), s.size),
            recv=(_addr(r), r.size),
            send_counts=[int(c) for c in send_counts],
            recv_counts=[int(c) for c in recv_counts],
        )

    def gather(self, send: Any, recv: Any = None, root: int = 0, *, async_op: bool = False) -> Any:
        """The root's ``recv`` (``size`` times ``send``) gets every rank's ``send``."""
        s = _nd(send)
        if recv is None:
            if self.rank == root:
                raise InvalidArgument("gather: the root needs a recv buffer")
            r = np.empty(0, dtype=s.dtype)
        else:
            r = _nd(recv)
        h = self._comm.call("gather", s, r, "sum", root, async_op)
        return Request(h, (s, r), r) if async_op else None

    def scatter(self, send: Any, recv: Any, root: int = 0, *, async_op: bool = False) -> Any:
        """Rank r's ``recv`` gets block r of the root's ``send`` (``send`` is
        ignored elsewhere and may be None)."""
        r = _nd(recv)
        s = _nd(send) if send is not None else np.empty(0, dtype=r.dtype)
        h = self._comm.call("scatter", s, r, "sum", root, async_op)
        return Request(h, (s, r), r) if async_op else None

    def barrier(self, *, async_op: bool = False) -> Any:
        """Returns once every rank has called it."""
        return self._submit("barrier", (), None, async_op)

    def send(self, buf: Any, peer: int, tag: int = 0, *, async_op: bool = False) -> Any:
        """Sends ``buf`` to ``peer``; returns once the receiver took it."""
        b = _array(buf, "buf", False)
        return self._submit(
            "send",
            (b,),
            None,
            async_op,
            dtype=dtype_code(b.dtype),
            send=(_addr(b), b.size),
            peer=peer,
            tag=tag,
        )

    def recv(self, buf: Any, peer: int, tag: int = 0, *, async_op: bool = False) -> Any:
        """Receives exactly ``buf``'s length from ``peer`` with ``tag``."""
        b = _array(buf, "buf", True)
        return self._submit(
            "recv",
            (b,),
            b,
            async_op,
            dtype=dtype_code(b.dtype),
            recv=(_addr(b), b.size),
            peer=peer,
            tag=tag,
        )

    def recv_any(self, buf: Any, tag: int = 0) -> int:
        """Receives exactly ``buf``'s length with ``tag`` from whichever rank
        sends first and returns that rank (MPI's ``MPI_ANY_SOURCE``)."""
        b = _array(buf, "buf", True)
        cell = np.full(1, -1, dtype=np.int64)
        self._submit(
            "recv_any",
            (b, cell),
            b,
            False,
            dtype=dtype_code(b.dtype),
            recv=(_addr(b), b.size),
            send=(_addr(cell), 1),
            tag=tag,
        )
        return int(cell[0])

    # ---- the non-blocking names of the Rust API ------------------------------

    def iall_reduce(self, send: Any, recv: Any = None, op: str = "sum") -> Request:
        """Non-blocking :meth:`all_reduce`."""
        return self.all_reduce(send, recv, op, async_op=True)

    def ibroadcast(self, buf: Any, root: int = 0) -> Request:
        """Non-blocking :meth:`broadcast`."""
        return self.broadcast(buf, root, async_op=True)

    def ireduce(self, send: Any, recv: Any = None, op: str = "sum", root: int = 0) -> Request:
        """Non-blocking :meth:`reduce`."""
        return self.reduce(send, recv, op, root, async_op=True)

    def iall_gather(self, send: Any, recv: Any) -> Request:
        """Non-blocking :meth:`all_gather`."""
        return self.all_gather(send, recv, async_op=True)

    def ireduce_scatter(self, send: Any, recv: Any, op: str = "sum") -> Request:
        """Non-blocking :meth:`reduce_scatter`."""
        return self.reduce_scatter(send, recv, op, async_op=True)

    def iall_to_all(self, send: Any, recv: Any) -> Request:
        """Non-blocking :meth:`all_to_all`."""
        return self.all_to_all(send, recv, async_op=True)

    def iall_to_all_v(
        self, send: Any, send_counts: Sequence[int], recv: Any, recv_counts: Sequence[int]
    ) -> Request:
        """Non-blocking :meth:`all_to_all_v`."""
        return self.all_to_all_v(send, send_counts, recv, recv_counts, async_op=True)

    def igather(self, send: Any, recv: Any = None, root: int = 0) -> Request:
        """Non-blocking :meth:`gather`."""
        return self.gather(send, recv, root, async_op=True)

    def iscatter(self, send: Any, recv: Any, root: int = 0) -> Request:
        """Non-blocking :meth:`scatter`."""
        return self.scatter(send, recv, root, async_op=True)

    def ibarrier(self) -> Request:
        """Non-blocking :meth:`barrier`."""
        return self.barrier(async_op=True)

    def isend(self, buf: Any, peer: int, tag: int = 0) -> Request:
        """Non-blocking :meth:`send`."""
        return self.send(buf, peer, tag, async_op=True)

    def irecv(self, buf: Any, peer: int, tag: int = 0) -> Request:
        """Non-blocking :meth:`recv`."""
        return self.recv(buf, peer, tag, async_op=True)


def init(timeout: Optional[float] = None) -> Communicator:
    """The world communicator, from the launcher's environment (``ferrocoll
    run``, torchrun, Open MPI's mpirun, Slurm's srun, PMI), as Rust's
    ``ferrocoll::init()``. ``timeout`` (seconds) overrides ``FERROCOLL_TIMEOUT``."""
    return Communicator(_core.init(timeout))


def init_with_store(
    store: Any,
    rank: int,
    size: int,
    route_to: Optional[str] = None,
    timeout: Optional[float] = None,
    transport: Optional[str] = None,
) -> Communicator:
    """The world communicator over a key-value store every rank reaches (a
    ``torch.distributed.Store``, or any object with ``set``, ``get``, ``add``
    and ``wait``). ``route_to`` (``host:port``) picks the network interface
    for TCP; ``transport``: ``auto``, ``shm`` or ``tcp``."""
    return Communicator(_core.init_with_store(store, rank, size, route_to, timeout, transport))
