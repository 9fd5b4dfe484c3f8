"""DDP communication hooks that run ferrocoll's compressed allreduce.

>>> from ferrocoll.torch import hooks
>>> model = DDP(net)                                   # process group on "ferrocoll"
>>> state, hook = hooks.int8(error_feedback=True)
>>> model.register_comm_hook(state, hook)

Each factory (:func:`fp16`, :func:`bf16`, :func:`int8`, :func:`onebit`,
:func:`topk`, :func:`randk`, :func:`powersgd`, and the uncompressed
:func:`allreduce` for comparisons) returns ``(state, hook)`` for
``DistributedDataParallel.register_comm_hook``. The hook returns a
``torch.futures.Future`` of the bucket's averaged gradients, as torch's own
hooks do.

How it works:

* The state owns a communicator of its own over the process group's ranks
  (``Communicator.subgroup`` of the group's ferrocoll communicator, made
  without communication), so its calls and the byte counter
  (:meth:`HookState.bytes_sent`) are the hook's alone, and the hook's
  several calls per bucket never interleave with other calls on the group.
  Every call is queued on that communicator's progress worker, in the order
  the buckets come (the same on every rank: DDP launches buckets in index
  order), and runs without the GIL; the plain allreduces too
  (``queued_all_reduce``), since a compressed allreduce's several calls take
  their sequence numbers when they run and a call numbered at issue time
  could fall between them on one rank and not on another.
* Per bucket (keyed by ``bucket.index()``) the state keeps a
  :class:`ferrocoll.compress.Compressor`, whose error-feedback residuals
  (the rank's own and, for the quantizers, the server side of its chunk)
  carry over from step to step. DDP rebuilds its buckets after the first
  iteration, so bucket ``i`` may then hold other parameters: the state
  remembers which parameters each bucket held and starts a fresh compressor
  (with a zero residual) when they change, rather than adding one
  parameter's residual to another's gradient.
* ``start_iter``: iterations before it run a plain (uncompressed) allreduce,
  torch PowerSGD's ``start_powerSGD_iter``; a warm-up that, for PowerSGD,
  also skips the first iteration's buckets, which DDP rebuilds.
* PowerSGD, as torch's ``powerSGD_hook``: each gradient of 2+ dimensions is
  compressed as its own ``rows x cols`` matrix (its first dimension by the
  rest) when that compresses at least ``min_compression_rate`` times;
  biases and other small tensors go together in one plain allreduce.

Every rank must create its hook states in the same order (a state's
communicator is named by its place in that order). Buckets of another type
than float32 fall back to the plain allreduce.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from ferrocoll import _ferrocoll as _core

from .specs import _REDUCIBLE

__all__ = [
    "HookState",
    "allreduce",
    "bf16",
    "fp16",
    "int8",
    "onebit",
    "powersgd",
    "randk",
    "topk",
]

Hook = Callable[["HookState", dist.GradBucket], torch.futures.Future]

#: Orders the states of this process (the same on every rank): the tag of
#: each state's communicator.
_serial = itertools.count()


def _tag(serial: int) -> int:
    digest = hashlib.blake2b(f"ferrocoll.torch.hooks/{serial}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _core_comm(group: Any) -> Any:
    """The ferrocoll communicator (extension object) under a process group."""
    pg = group if group is not None else dist.group.WORLD
    if pg is None:
        raise RuntimeError("ferrocoll.torch.hooks: call dist.init_process_group first")
    candidates = [pg]
    for getter in ("_get_backend",):
        try:
            candidates.append(getattr(pg, getter)(torch.device("cpu")))
        except Exception:  # not a wrapper, or no CPU backend
            pass
    for c in candidates:
        comm = getattr(c, "_comm", None)
        if comm is not None and hasattr(comm, "subgroup"):
            return comm
    raise RuntimeError(
        f"ferrocoll.torch.hooks: the process group {pg!r} does not run on the ferrocoll backend; "
        "use dist.init_process_group('ferrocoll') (or pass process_group=)"
    )


class _Bucket:
    """What the state keeps for one bucket index."""

    __slots__ = ("signature", "whole", "matrices", "rest", "rest_buf")

    def __init__(self, signature: Tuple[Any, ...]) -> None:
        self.signature = signature
        #: One compressor for the whole bucket (every codec but PowerSGD).
        self.whole: Optional[Any] = None
        #: PowerSGD: ``(offset, numel, compressor)`` per compressed matrix.
        self.matrices: List[Tuple[int, int, Any]] = []
        #: PowerSGD: ``(offset, numel)`` of the tensors allreduced plainly.
        self.rest: List[Tuple[int, int]] = []
        self.rest_buf: Optional[torch.Tensor] = None


class HookState:
    """The state of one compressed comm hook: its communicator, one
    compressor per bucket and the iteration count.

    ``codec`` is a codec written as ``ferrocoll bench --compress`` takes it
    (None: no compression). For Random-k the seed is offset by the bucket
    index, so buckets keep different positions; the step advances with every
    call.
    """

    def __init__(
        self,
        codec: Optional[str],
        *,
        process_group: Any = None,
        error_feedback: bool = True,
        start_iter: int = 0,
        powersgd_rank: int = 0,
        min_compression_rate: float = 2.0,
        seed: int = 0,
        hierarchical: Optional[bool] = None,
    ) -> None:
        if start_iter < 0:
            raise ValueError(f"start_iter must be >= 0, got {start_iter}")
        self.codec = codec
        self.process_group = process_group
        self.error_feedback = bool(error_feedback)
        self.start_iter = int(start_iter)
        self.powersgd_rank = int(powersgd_rank)
        self.min_compression_rate = float(min_compression_rate)
        self.seed = int(seed)
        self.hierarchical = hierarchical
        #: Iterations completed (counted at each iteration's last bucket).
        self.iter = 0
        #: Buckets that ran compressed / plain, and compressors made.
        self.compressed_calls = 0
        self.plain_calls = 0
        self.compressors_made = 0
        self._tag = _tag(next(_serial))
        self._comm: Optional[Any] = None
        self._buckets: Dict[int, _Bucket] = {}
        #: Split-communicator bytes of compressors replaced after a rebuild.
        self._retired = (0, 0)
        self._lock = threading.Lock()

    # -- what users read ------------------------------------------------------

    @property
    def comm(self) -> Any:
        """This hook's ferrocoll communicator (made at the first bucket)."""
        if self._comm is None:
            base = _core_comm(self.process_group)
            self._comm = base.subgroup(list(range(base.size)), self._tag)
        return self._comm

    def bytes_sent(self) -> int:
        """Payload bytes this rank's hook calls have handed the transport so
        far, by the transports' counters: the hook communicator's, plus, for
        compressors that run the hierarchical form (ranks on 2+ hosts, 2+ per
        host), the counters of the node and rail communicators they split off
        (which the hook communicator's does not see). 0 before the first
        bucket."""
        if self._comm is None:
            return 0
        return int(self._comm.bytes_sent) + self._split_bytes()[0]

    def local_bytes(self) -> int:
        """The part of :meth:`bytes_sent` the hierarchical compressors sent
        uncompressed within their host (0 in the flat form)."""
        return self._split_bytes()[1]

    def _split_bytes(self) -> Tuple[int, int]:
        """(all, within the host) bytes of the hierarchical compressors'
        split communicators, retired ones included."""
        total, local = self._retired
        for cs in self.compressors().values():
            for c in cs:
                t, loc = _split_of(c)
                total, local = total + t, local + loc
        return total, local

    def compressors(self) -> Dict[int, List[Any]]:
        """The compressors (:class:`ferrocoll._ferrocoll.Compressor`) of each
        bucket index now: one, or PowerSGD's one per matrix."""
        out: Dict[int, List[Any]] = {}
        for i, b in sorted(self._buckets.items()):
            out[i] = ([b.whole] if b.whole is not None else []) + [c for _, _, c in b.matrices]
        return out

    def total_stats(self) -> Dict[str, float]:
        """The compressors' wire statistics summed (see
        :meth:`ferrocoll.compress.Compressor.total_stats`); compressors
        replaced after a bucket rebuild are not counted."""
        total: Dict[str, float] = {}
        for cs in self.compressors().values():
            for c in cs:
                for k, v in c.total_stats().items():
                    total[k] = total.get(k, 0) + v
        return total

    # -- the hook ---------------------------------------------------------------

    def _spec(self, index: int) -> str:
        codec = self.codec or ""
        if codec.startswith("randk"):
            parts = codec.split(":")
            keep = parts[1] if len(parts) > 1 else "0.01"
            seed = int(parts[2]) if len(parts) > 2 else self.seed
            # EF needs the unscaled form; the rescaled one is unbiased and
            # must not have it.
            tail = ":unscaled" if self.error_feedback else ""
            return f"randk:{keep}:{seed + index}{tail}"
        return codec

    def _bucket(self, bucket: dist.GradBucket, buf: torch.Tensor) -> _Bucket:
        index = bucket.index()
        params = bucket.parameters()
        signature = (buf.numel(), tuple(p.data_ptr() for p in params))
        entry = self._buckets.get(index)
        if entry is not None and entry.signature == signature:
            return entry
        # New, or rebuilt by DDP: a fresh compressor and a zero residual.
        if entry is not None:
            for c in ([entry.whole] if entry.whole is not None else []) + [c for _, _, c in entry.matrices]:
                t, loc = _split_of(c)
                self._retired = (self._retired[0] + t, self._retired[1] + loc)
        entry = _Bucket(signature)
        comm = self.comm
        if self.powersgd_rank > 0:
            self._plan_powersgd(entry, bucket, buf, comm)
        else:
            entry.whole = _core.Compressor(
                comm, buf.numel(), self._spec(index), self.error_feedback, self.hierarchical
            )
            self.compressors_made += 1
        self._buckets[index] = entry
        return entry

    def _plan_powersgd(self, entry: _Bucket, bucket: dist.GradBucket, buf: torch.Tensor, comm: Any) -> None:
        r = self.powersgd_rank
        base = buf.data_ptr()
        size = buf.element_size()
        offset = 0
        grads = bucket.gradients()
        for k, (p, g) in enumerate(zip(bucket.parameters(), grads)):
            numel = p.numel()
            # DDP's gradients are views into the bucket; their place is where
            # they point (the parameters' order and sizes, without padding).
            at = (g.data_ptr() - base) // size if g.numel() == numel else offset
            if not 0 <= at <= buf.numel() - numel:
                at = offset
            offset = at + numel
            shape = tuple(p.shape)
            if len(shape) >= 2:
                rows = shape[0]
                cols = numel // rows
                rank = min(r, rows, cols)
                rate = (rows * cols) / ((rows + cols) * rank) if rank > 0 else 0.0
                if rate >= self.min_compression_rate:
                    seed = self.seed + 1000 * bucket.index() + k
                    spec = f"powersgd:{rank}:{rows}x{cols}:{seed}"
                    c = _core.Compressor(comm, numel, spec, self.error_feedback, False)
                    self.compressors_made += 1
                    entry.matrices.append((at, numel, c))
                    continue
            entry.rest.append((at, numel))
        total = sum(n for _, n in entry.rest)
        entry.rest_buf = torch.empty(total, dtype=buf.dtype) if total else None

    def _plain(self, buf: torch.Tensor) -> Any:
        """A plain allreduce (mean) of ``buf`` on this hook's communicator."""
        code = _REDUCIBLE.get(buf.dtype)
        if code is None or buf.dtype == torch.bool or not buf.is_contiguous():
            raise RuntimeError(f"ferrocoll.torch.hooks: cannot allreduce a bucket of {buf.dtype}")
        self.plain_calls += 1
        p = (buf.data_ptr(), buf.numel())
        # Queued without a reserved sequence number, like the compressors'
        # calls on the same communicator (see ferrocoll-py's compress.rs).
        return _core.queued_all_reduce(self.comm, code, p, "avg")

    def run(self, bucket: dist.GradBucket) -> torch.futures.Future:
        """The hook: queues the bucket's (compressed) allreduce and returns a
        future of the averaged bucket tensor."""
        buf = bucket.buffer()
        with self._lock:
            it = self.iter
            if bucket.is_last():
                self.iter += 1
            plain = self.codec is None or it < self.start_iter or buf.dtype != torch.float32
            if plain:
                handles = [self._plain(buf)]
                keep: Tuple[Any, ...] = (buf,)
            else:
                handles, keep = self._compressed(bucket, buf)
        return _future(handles, buf, keep)

    def _compressed(self, bucket: dist.GradBucket, buf: torch.Tensor) -> Tuple[List[Any], Tuple[Any, ...]]:
        entry = self._bucket(bucket, buf)
        self.compressed_calls += 1
        base, size = buf.data_ptr(), buf.element_size()
        if entry.whole is not None:
            return [entry.whole.all_reduce((base, buf.numel()), "avg")], (buf,)
        handles = []
        keep: Tuple[Any, ...] = (buf,)
        if entry.rest_buf is not None:
            rest = entry.rest_buf
            copies = []
            at = 0
            with torch.no_grad():
                for off, n in entry.rest:
                    rest[at : at + n].copy_(buf[off : off + n])
                    copies.append((rest.data_ptr() + at * size, base + off * size, n * size))
                    at += n
            p = (rest.data_ptr(), rest.numel())
            handles.append(_core.queued_all_reduce(self.comm, "f32", p, "avg", copies))
            keep += (rest,)
        for off, n, c in entry.matrices:
            handles.append(c.all_reduce((base + off * size, n), "avg"))
        return handles, keep


def _split_of(c: Any) -> Tuple[int, int]:
    """(all, within the host) bytes a hierarchical compressor's node and rail
    communicators counted; (0, 0) for the flat form, whose bytes the hook
    communicator's own counter has."""
    if not (c.algorithm() or "").startswith("hier-"):
        return 0, 0
    st = c.total_stats()
    return int(st["measured_bytes"] + st["local_measured_bytes"]), int(st["local_measured_bytes"])


def _future(handles: List[Any], out: torch.Tensor, keep: Tuple[Any, ...]) -> torch.futures.Future:
    """A future resolved with ``out`` once every handle completed (with the
    first error, if any); ``keep`` stays referenced until then."""
    fut: torch.futures.Future = torch.futures.Future()
    if not handles:
        fut.set_result(out)
        return fut
    lock = threading.Lock()
    left = [len(handles), None, keep]

    def part_done(exc: Optional[BaseException]) -> None:
        with lock:
            left[0] -= 1
            if exc is not None and left[1] is None:
                left[1] = exc
            last = left[0] == 0
        if last:
            left[2] = ()
            if left[1] is not None:
                fut.set_exception(left[1])
            else:
                fut.set_result(out)

    for h in handles:
        h.on_complete(part_done)
    return fut


def _hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future:
    """The comm hook of every factory: ``state.run(bucket)``."""
    return state.run(bucket)


# DDP checks the hook's annotations against the real types; with postponed
# evaluation (``from __future__ import annotations``) they would be strings.
_hook.__annotations__ = {
    "state": HookState,
    "bucket": dist.GradBucket,
    "return": torch.futures.Future[torch.Tensor],
}


def _factory(codec: Optional[str], **kw: Any) -> Tuple[HookState, Hook]:
    return HookState(codec, **kw), _hook


def allreduce(*, process_group: Any = None) -> Tuple[HookState, Hook]:
    """The uncompressed mean on the hook's own communicator: DDP's default
    allreduce, for comparisons (its bytes counted by
    :meth:`HookState.bytes_sent` like the compressed hooks')."""
    return _factory(None, process_group=process_group)


def fp16(
    *, error_feedback: bool = True, start_iter: int = 0, process_group: Any = None
) -> Tuple[HookState, Hook]:
    """Half-precision on the wire (2x), summed in float32. With
    ``error_feedback=False`` the arithmetic is torch's ``fp16_compress_hook``'s
    but for the sum in float32 and one more rounding of the reduced chunk."""
    return _factory("fp16", error_feedback=error_feedback, start_iter=start_iter, process_group=process_group)


def bf16(
    *, error_feedback: bool = True, start_iter: int = 0, process_group: Any = None
) -> Tuple[HookState, Hook]:
    """bfloat16 on the wire (2x), summed in float32 (torch's ``bf16_compress_hook``)."""
    return _factory("bf16", error_feedback=error_feedback, start_iter=start_iter, process_group=process_group)


def int8(
    block: int = 128, *, error_feedback: bool = True, start_iter: int = 0, process_group: Any = None
) -> Tuple[HookState, Hook]:
    """Block-wise int8 with one f32 scale per ``block`` elements (3.88x at 128)."""
    return _factory(
        f"int8:{block}", error_feedback=error_feedback, start_iter=start_iter, process_group=process_group
    )


def onebit(
    block: int = 128, *, error_feedback: bool = True, start_iter: int = 0, process_group: Any = None
) -> Tuple[HookState, Hook]:
    """Signs with one scale per ``block`` elements (1-bit SGD; 25.6x at 128)."""
    return _factory(
        f"onebit:{block}", error_feedback=error_feedback, start_iter=start_iter, process_group=process_group
    )


def topk(
    fraction: float = 0.01, *, error_feedback: bool = True, start_iter: int = 0, process_group: Any = None
) -> Tuple[HookState, Hook]:
    """The ``fraction`` of largest-magnitude elements of each bucket (values and
    16-bit block indices), allgathered and summed."""
    return _factory(
        f"topk:{fraction!r}",
        error_feedback=error_feedback,
        start_iter=start_iter,
        process_group=process_group,
    )


def randk(
    fraction: float = 0.01,
    *,
    seed: int = 0,
    error_feedback: bool = True,
    start_iter: int = 0,
    process_group: Any = None,
) -> Tuple[HookState, Hook]:
    """``fraction`` of each bucket at positions drawn from a seed the ranks
    share (new positions every step). ``error_feedback=True`` sends the values
    unscaled and keeps the rest as residual; ``False`` sends them scaled by
    ``1/fraction``, the unbiased form (which must not have error feedback)."""
    return _factory(
        f"randk:{fraction!r}:{seed}",
        error_feedback=error_feedback,
        start_iter=start_iter,
        process_group=process_group,
        seed=seed,
    )


def powersgd(
    rank: int = 1,
    *,
    error_feedback: bool = True,
    start_iter: int = 2,
    min_compression_rate: float = 2.0,
    seed: int = 0,
    process_group: Any = None,
) -> Tuple[HookState, Hook]:
    """PowerSGD (torch's ``powerSGD_hook``): each gradient matrix approximated
    at rank ``rank`` by one power iteration, warm-started from the last step;
    ``start_iter`` iterations of plain allreduce first (torch requires more
    than 1 with error feedback: DDP rebuilds its buckets after the first)."""
    if rank < 1:
        raise ValueError(f"powersgd: rank must be >= 1, got {rank}")
    return _factory(
        "powersgd",
        error_feedback=error_feedback,
        start_iter=start_iter,
        powersgd_rank=rank,
        min_compression_rate=min_compression_rate,
        seed=seed,
        process_group=process_group,
    )
