"""``ProcessGroupFerrocoll``: torch.distributed's process-group interface over a
ferrocoll communicator.

Design:

* Every operation is one ferrocoll call (the Python layer adds no algorithm):
  the cost model, ``FERROCOLL_DEBUG``, deadlines and mismatch errors reach
  torch users unchanged.
* Contiguous CPU tensors are read and written in place (zero-copy). A
  non-contiguous tensor is copied into a contiguous one and the result copied
  back when the work completes. List forms (``allgather`` into a list,
  ``reduce_scatter`` from a list, ``alltoall``) run on one staging tensor,
  unless the list's tensors already lie back to back in memory; the copies out
  of it are made by ferrocoll's worker, without the GIL.
* Calls are asynchronous: each returns a :class:`FerrocollWork` at once and
  runs in issue order on the communicator's progress worker, so DDP's backward
  overlaps with communication. ``Work.wait()`` releases the GIL; torch futures
  (``get_future()``, which DDP's comm hooks chain on) are completed by
  ferrocoll's completer thread, the only thread that takes the GIL for them.
* Groups: the default group is built over the store torch hands the backend
  (no port of ferrocoll's own). ``new_group`` / ``split_group`` members build
  their group from the world communicator without any communication
  (``Communicator.subgroup``), since torch never calls the backend on
  non-members.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from datetime import timedelta
from typing import Any, List, Optional, Tuple

import torch
import torch.distributed as dist

import ferrocoll
from ferrocoll import _ferrocoll as _core

from .specs import (
    _BITWISE,
    _FAST_OPS,
    _REDUCIBLE,
    _adjacent,
    _bytes_spec,
    _check_cpu,
    _fail,
    _op_kind,
    _RedOp,
    _reduce_spec,
)
from .work import FerrocollWork, _combine, _Staged

__all__ = ["ProcessGroupFerrocoll", "FerrocollWork", "register"]


#: The tag of ``monitored_barrier``'s messages (torch users' tags are small).
_MONITORED_BARRIER_TAG = 0xFFFF_FF00


def _bitwise(tensors: List[torch.Tensor], op: Any) -> bool:
    """Whether an all_reduce with ``op`` takes the gather-and-fold path
    (BAND, BOR, BXOR; bool BAND and BOR are MIN and MAX instead)."""
    kind = _op_kind(op)
    if kind not in _BITWISE:
        return False
    return not (kind in (_RedOp.BAND, _RedOp.BOR) and all(t.dtype == torch.bool for t in tensors))


def _tag_of(name: str) -> int:
    """A 64-bit tag from a group name, equal on every rank (Python's hash is not)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


class ProcessGroupFerrocoll(dist.ProcessGroup):
    """A torch process group whose collectives are ferrocoll calls."""

    def __init__(self, comm: Any, rank: int, size: int) -> None:
        super().__init__(rank, size)
        self._comm = comm
        self._timeout: Optional[float] = None
        self._group_name = ""
        self._group_desc = ""

    # -- identity -----------------------------------------------------------

    def getBackendName(self) -> str:
        return "ferrocoll"

    # A group returned by a backend creator has no C++ backend registered on
    # it, so its name lives here (torch's flight recorder keys entries on it).
    def getGroupName(self) -> str:
        return self._group_name

    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupDesc(self) -> str:
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    def _get_backend(self, device: Any) -> "ProcessGroupFerrocoll":
        # FSDP2 and the coalescing manager ask the group for its backend
        # object; this group is its own backend.
        return self

    supports_coalescing = False
    supports_splitting = False

    def supports_tensor_alloc(self, device: Any) -> bool:
        """ferrocoll reads ordinary memory in place: no special allocation."""
        return False

    def __repr__(self) -> str:
        transport = self._comm.transport
        return f"ProcessGroupFerrocoll(rank={self.rank()}, size={self.size()}, transport={transport!r})"

    @property
    def communicator(self) -> ferrocoll.Communicator:
        """The ferrocoll communicator under this group."""
        return ferrocoll.Communicator(self._comm)

    def set_timeout(self, timeout: timedelta) -> None:
        """Deadline of each wait of later calls."""
        self._timeout = timeout.total_seconds()

    def abort(self) -> None:
        """Ends every call in progress, here and on the peers."""
        self._comm.abort()

    def shutdown(self) -> None:
        """Nothing to release beyond what garbage collection does."""

    # -- the call -------------------------------------------------------------

    def _submit(self, opts: Any, kind: str, **kw: Any) -> Any:
        """Starts one ferrocoll call. A synchronous torch call (``opts.asyncOp``
        false: ``dist.all_reduce(t)`` waits at once) runs eagerly on this
        thread, which saves the two hand-offs to and from the worker; an
        asynchronous one (DDP's buckets, ``async_op=True``) is queued."""
        if self._timeout is not None:
            kw.setdefault("timeout", self._timeout)
        eager = opts is not None and not getattr(opts, "asyncOp", True)
        return self._comm.submit(kind, async_op=True, eager=eager, **kw)

    @staticmethod
    def _ptr(t: torch.Tensor, units: int) -> Tuple[int, int]:
        return (t.data_ptr(), t.numel() * units)

    # -- allreduce --------------------------------------------------------

    def allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> FerrocollWork:
        opts = opts if opts is not None else dist.AllreduceOptions()
        if len(tensors) == 1:
            # The common case (DDP's buckets, dist.all_reduce) without the
            # general path's checks: one contiguous dense CPU tensor of a
            # type ferrocoll reduces, summed or averaged.
            t = tensors[0]
            code = _REDUCIBLE.get(t.dtype)
            op = _FAST_OPS.get(opts.reduceOp.op)
            if (
                code is not None
                and op is not None
                and t.is_cpu
                and t.layout == torch.strided
                and t.is_contiguous()
                and t.dtype != torch.bool
            ):
                p = (t.data_ptr(), t.numel())
                eager = not opts.asyncOp
                if self._timeout is None:
                    h = self._comm.submit("all_reduce", code, p, p, op, async_op=True, eager=eager)
                else:
                    h = self._comm.submit(
                        "all_reduce", code, p, p, op, async_op=True, eager=eager, timeout=self._timeout
                    )
                return FerrocollWork([h], tensors, (t,))
        if any(isinstance(t, torch.Tensor) and t.is_sparse for t in tensors):
            return self._sparse_allreduce(tensors, opts)
        if len(tensors) != 1:
            return self.allreduce_coalesced(tensors, opts)
        if _bitwise(tensors, opts.reduceOp):
            return self._bitwise_allreduce(tensors, opts)
        t = tensors[0]
        _check_cpu(t, "allreduce tensor")
        code, op, scale, units = _reduce_spec(t, opts.reduceOp)
        staged = _Staged()
        c = staged.contiguous(t, True)
        h = self._submit(
            opts,
            "all_reduce",
            dtype=code,
            send=self._ptr(c, units),
            recv=self._ptr(c, units),
            op=op,
            scale=scale,
        )
        return FerrocollWork([h], tensors, (c,), staged)

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any = None) -> FerrocollWork:
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        if not tensors:
            return FerrocollWork([], [], ())
        for i, t in enumerate(tensors):
            _check_cpu(t, f"allreduce_coalesced tensor {i}")
            if t.dtype != tensors[0].dtype:
                raise _fail("allreduce_coalesced needs tensors of one dtype")
        if _bitwise(tensors, opts.reduceOp):
            return self._bitwise_allreduce(tensors, opts)
        code, op, scale, units = _reduce_spec(tensors[0], opts.reduceOp)
        if _adjacent(tensors):
            total = sum(t.numel() for t in tensors) * units
            h = self._submit(
                opts,
                "all_reduce",
                dtype=code,
                send=(tensors[0].data_ptr(), total),
                recv=(tensors[0].data_ptr(), total),
                op=op,
                scale=scale,
            )
            return FerrocollWork([h], tensors, tuple(tensors))
        flat = torch.cat([t.reshape(-1) for t in tensors])
        staged = _Staged()
        copies = staged.unpack(flat, tensors)
        h = self._submit(
            opts,
            "all_reduce",
            dtype=code,
            send=self._ptr(flat, units),
            recv=self._ptr(flat, units),
            op=op,
            scale=scale,
            copies=copies,
        )
        return FerrocollWork([h], tensors, (flat,) + tuple(tensors), staged)

    def _bitwise_allreduce(self, tensors: List[torch.Tensor], opts: Any) -> FerrocollWork:
        """BAND, BOR or BXOR of integer (or bool BXOR) tensors: an all_gather
        of each, folded with torch's bitwise operator when it completes."""
        kind = _op_kind(opts.reduceOp)
        fold = _BITWISE[kind]
        n = self.size()
        handles, keep, parts = [], [], []
        for i, t in enumerate(tensors):
            _check_cpu(t, f"allreduce tensor {i}")
            if t.is_floating_point() or t.is_complex():
                raise _fail(f"{kind.name} needs integer or bool tensors, got {t.dtype}")
            if t.numel() == 0:
                continue
            src = t.contiguous()
            gathered = torch.empty(n * src.numel(), dtype=t.dtype)
            handles.append(self._gather_raw(opts, src, gathered))
            keep += [src, gathered]
            parts.append((t, gathered))

        def post() -> None:
            for t, gathered in parts:
                rows = gathered.view(n, -1)
                acc = rows[0].clone()
                for row in rows[1:]:
                    fold(acc, row, out=acc)
                t.copy_(acc.view(t.shape))

        return FerrocollWork(handles, list(tensors), tuple(keep), None, post)

    def _sparse_allreduce(self, tensors: List[torch.Tensor], opts: Any) -> FerrocollWork:
        """SUM of sparse COO tensors (DDP's gradients of ``nn.Embedding(sparse=True)``),
        as gloo does it: every rank's coalesced indices and values are
        gathered, summed in rank order and coalesced; the result replaces
        each input (``copy_``) and is the work's output.

        The gathers are padded to the largest ``nnz`` (one all_gather of the
        counts first), so the call waits for them here: it runs after every
        call issued before it, and the work it returns is complete."""
        kind = _op_kind(opts.reduceOp)
        if kind != _RedOp.SUM:
            raise _fail(f"allreduce of sparse tensors supports SUM only (as gloo), got {kind.name}")
        for i, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or t.layout != torch.sparse_coo:
                raise _fail(f"allreduce tensor {i}: sparse allreduce takes sparse COO CPU tensors only")
            if t.shape != tensors[0].shape or t.dtype != tensors[0].dtype:
                raise _fail("allreduce of several sparse tensors needs one shape and dtype")
        local = tensors[0]
        for t in tensors[1:]:
            local = local + t
        local = local.coalesce()
        n = self.size()
        sparse_dim, dense_shape = local.sparse_dim(), tuple(local.shape[local.sparse_dim() :])
        nnz = local._nnz()
        # What every rank must agree on, and its nnz: a mismatch is an error, not a wrong sum.
        meta = torch.tensor([nnz, sparse_dim, local.dim(), *local.shape], dtype=torch.int64)
        metas = torch.empty(n * meta.numel(), dtype=torch.int64)
        self._wait_all([self._gather_raw(opts, meta, metas)])
        metas = metas.view(n, -1)
        for peer in range(n):
            if not torch.equal(metas[peer, 1:], meta[1:]):
                raise ferrocoll.Mismatch(
                    f"ferrocoll backend: sparse allreduce: rank {self.rank()} has shape "
                    f"{list(local.shape)} with {sparse_dim} sparse dimensions, rank {peer} "
                    f"{metas[peer, 3:].tolist()} with {int(metas[peer, 1])}"
                )
        counts = metas[:, 0].tolist()
        width = max(counts)
        indices = torch.zeros(sparse_dim, width, dtype=torch.int64)
        indices[:, :nnz] = local._indices()
        values = torch.zeros((width,) + dense_shape, dtype=local.dtype)
        values[:nnz] = local._values()
        all_indices = torch.empty((n,) + tuple(indices.shape), dtype=torch.int64)
        all_values = torch.empty((n,) + tuple(values.shape), dtype=local.dtype)
        self._wait_all(
            [self._gather_raw(opts, indices, all_indices), self._gather_raw(opts, values, all_values)]
        )
        total = None
        for peer in range(n):
            c = counts[peer]
            part = torch.sparse_coo_tensor(
                all_indices[peer, :, :c],
                all_values[peer, :c],
                local.shape,
                dtype=local.dtype,
                # A peer's indices out of range must be an error, not a wild write.
                check_invariants=True,
            )
            total = part if total is None else total + part
        assert total is not None
        total = total.coalesce()
        for t in tensors:
            t.copy_(total)
        return FerrocollWork([], list(tensors), ())

    def _gather_raw(self, opts: Any, src: torch.Tensor, dst: torch.Tensor) -> Any:
        """all_gather of the contiguous ``src`` into ``dst`` (``size`` times
        its elements), queued behind earlier calls."""
        code, units = _bytes_spec(src)
        return self._submit(
            opts, "all_gather", dtype=code, send=self._ptr(src, units), recv=self._ptr(dst, units)
        )

    @staticmethod
    def _wait_all(handles: List[Any]) -> None:
        for h in handles:
            h.wait(None)

    # -- broadcast / reduce -------------------------------------------------

    def broadcast(self, tensors: List[torch.Tensor], opts: Any = None) -> FerrocollWork:
        opts = opts if opts is not None else dist.BroadcastOptions()
        handles = []
        staged = _Staged()
        keep = []
        for i, t in enumerate(tensors):
            _check_cpu(t, f"broadcast tensor {i}")
            code, units = _bytes_spec(t)
            c = staged.contiguous(t, True)
            keep.append(c)
            handles.append(
                self._submit(opts, "broadcast", dtype=code, recv=self._ptr(c, units), root=opts.rootRank)
            )
        return FerrocollWork(handles, tensors, tuple(keep), staged)

    def reduce(self, tensors: List[torch.Tensor], opts: Any = None) -> FerrocollWork:
        opts = opts if opts is not None else dist.ReduceOptions()
        if len(tensors) != 1:
            raise _fail("reduce takes exactly one tensor")
        t = tensors[0]
        _check_cpu(t, "reduce tensor")
        code, op, scale, units = _reduce_spec(t, opts.reduceOp)
        staged = _Staged()
        c = staged.contiguous(t, True)
        root = opts.rootRank
        recv = self._ptr(c, units) if self.rank() == root else (c.data_ptr(), 0)
        h = self._submit(
            opts,
            "reduce",
            dtype=code,
            send=self._ptr(c, units),
            recv=recv,
            op=op,
            root=root,
            scale=scale,
        )
        return FerrocollWork([h], tensors, (c,), staged)

    # -- allgather ----------------------------------------------------------

    def _gather_into(
        self, kind: str, outputs: List[torch.Tensor], inp: torch.Tensor, root: int = 0, opts: Any = None
    ) -> FerrocollWork:
        """allgather / gather of ``inp`` into a list of ``size`` tensors."""
        _check_cpu(inp, f"{kind} input")
        code, units = _bytes_spec(inp)
        staged = _Staged()
        src = staged.contiguous(inp, False)
        receives = kind == "all_gather" or self.rank() == root
        if receives and len(outputs) != self.size():
            raise _fail(f"{kind} needs {self.size()} output tensors, got {len(outputs)}")
        for i, o in enumerate(outputs if receives else []):
            _check_cpu(o, f"{kind} output {i}")
            if o.numel() != inp.numel() or o.dtype != inp.dtype:
                raise _fail(
                    f"{kind} output {i} has {o.numel()} elements of {o.dtype}, but the input has "
                    f"{inp.numel()} of {inp.dtype}"
                )
        if not receives:
            h = self._submit(opts, kind, dtype=code, send=self._ptr(src, units), recv=(0, 0), root=root)
            return FerrocollWork([h], outputs, (src,), staged)
        if _adjacent(outputs):
            total = inp.numel() * units * self.size()
            h = self._submit(
                opts,
                kind,
                dtype=code,
                send=self._ptr(src, units),
                recv=(outputs[0].data_ptr(), total),
                root=root,
            )
            return FerrocollWork([h], outputs, (src,) + tuple(outputs), staged)
        flat = torch.empty(inp.numel() * self.size(), dtype=inp.dtype)
        copies = staged.unpack(flat, outputs)
        h = self._submit(
            opts,
            kind,
            dtype=code,
            send=self._ptr(src, units),
            recv=self._ptr(flat, units),
            root=root,
            copies=copies,
        )
        return FerrocollWork([h], outputs, (src, flat) + tuple(outputs), staged)

    def allgather(
        self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor], opts: Any = None
    ) -> FerrocollWork:
        if len(input_tensors) != 1 or len(output_tensors) != 1:
            raise _fail("allgather takes one input tensor and one list of outputs")
        work = self._gather_into("all_gather", output_tensors[0], input_tensors[0], 0, opts)
        work._outputs = output_tensors  # type: ignore[assignment]
        return work

    def allgather_coalesced(
        self, output_lists: List[List[torch.Tensor]], input_list: List[torch.Tensor], opts: Any = None
    ) -> FerrocollWork:
        # torch's layout: output_lists[r][i] receives rank r's input i, so the
        # outputs of input i are column i.
        n = self.size()
        if len(output_lists) != n or any(len(o) != len(input_list) for o in output_lists):
            raise _fail(
                f"allgather_coalesced needs {n} output lists of {len(input_list)} tensors "
                "(output_lists[rank][i] receives that rank's input i)"
            )
        works = [
            self._gather_into("all_gather", [output_lists[r][i] for r in range(n)], t, 0, opts)
            for i, t in enumerate(input_list)
        ]
        return _combine(works, [t for o in output_lists for t in o])

    def all_gather_single(self, output: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> FerrocollWork:
        _check_cpu(output, "all_gather output")
        _check_cpu(inp, "all_gather input")
        if output.numel() != inp.numel() * self.size() or output.dtype != inp.dtype:
            raise _fail(
                f"all_gather_into_tensor: the output has {output.numel()} elements of "
                f"{output.dtype} but must have {self.size()} x {inp.numel()} of {inp.dtype}"
            )
        code, units = _bytes_spec(inp)
        staged = _Staged()
        src = staged.contiguous(inp, False)
        dst = staged.contiguous(output, True)
        h = self._submit(
            opts, "all_gather", dtype=code, send=self._ptr(src, units), recv=self._ptr(dst, units)
        )
        return FerrocollWork([h], [output], (src, dst), staged)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(
        self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None
    ) -> FerrocollWork:
        return _combine([self.all_gather_single(o, i) for o, i in zip(outputs, inputs)], outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    # -- reduce_scatter -------------------------------------------------------

    def reduce_scatter_single(
        self, output: torch.Tensor, inp: torch.Tensor, opts: Any = None
    ) -> FerrocollWork:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        _check_cpu(output, "reduce_scatter output")
        _check_cpu(inp, "reduce_scatter input")
        if inp.numel() != output.numel() * self.size() or output.dtype != inp.dtype:
            raise _fail(
                f"reduce_scatter_tensor: the input has {inp.numel()} elements of {inp.dtype} but "
                f"must have {self.size()} x {output.numel()} of {output.dtype}"
            )
        code, op, scale, units = _reduce_spec(inp, opts.reduceOp)
        staged = _Staged()
        src = staged.contiguous(inp, False)
        dst = staged.contiguous(output, True)
        h = self._submit(
            opts,
            "reduce_scatter",
            dtype=code,
            send=self._ptr(src, units),
            recv=self._ptr(dst, units),
            op=op,
            scale=scale,
        )
        return FerrocollWork([h], [output], (src, dst), staged)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter(
        self, output_tensors: List[torch.Tensor], input_lists: List[List[torch.Tensor]], opts: Any = None
    ) -> FerrocollWork:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        if len(output_tensors) != 1 or len(input_lists) != 1:
            raise _fail("reduce_scatter takes one output tensor and one list of inputs")
        out, inputs = output_tensors[0], input_lists[0]
        if len(inputs) != self.size():
            raise _fail(f"reduce_scatter needs {self.size()} input tensors, got {len(inputs)}")
        for i, t in enumerate(inputs):
            _check_cpu(t, f"reduce_scatter input {i}")
            if t.numel() != out.numel() or t.dtype != out.dtype:
                raise _fail(
                    f"reduce_scatter input {i} has {t.numel()} elements of {t.dtype}, the output "
                    f"{out.numel()} of {out.dtype}"
                )
        if _adjacent(inputs):
            # Back to back already: one view over all of them, no copy.
            flat = torch.as_strided(inputs[0], (out.numel() * self.size(),), (1,))
        else:
            flat = torch.cat([t.reshape(-1) for t in inputs])
        work = self.reduce_scatter_single(out, flat, opts)
        work._keep = work._keep + (flat,) + tuple(inputs)
        work._outputs = output_tensors
        return work

    def reduce_scatter_single_coalesced(
        self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None
    ) -> FerrocollWork:
        return _combine([self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)], outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # -- all-to-all -----------------------------------------------------------

    def all_to_all_single(
        self,
        output: torch.Tensor,
        inp: torch.Tensor,
        output_split_sizes: Optional[List[int]],
        input_split_sizes: Optional[List[int]],
        opts: Any = None,
    ) -> FerrocollWork:
        _check_cpu(output, "all_to_all output")
        _check_cpu(inp, "all_to_all input")
        if output.dtype != inp.dtype:
            raise _fail(f"all_to_all: the input is {inp.dtype} but the output {output.dtype}")
        n = self.size()
        code, units = _bytes_spec(inp)
        staged = _Staged()
        src = staged.contiguous(inp, False)
        dst = staged.contiguous(output, True)

        def counts(t: torch.Tensor, splits: Optional[List[int]], what: str) -> List[int]:
            row = (t.numel() // t.shape[0]) if t.dim() > 0 and t.shape[0] > 0 else 1
            if not splits:
                if t.dim() == 0 or t.shape[0] % n != 0:
                    raise _fail(
                        f"all_to_all: the {what}'s first dimension ({t.shape[0] if t.dim() else 0}) "
                        f"does not split evenly over {n} ranks; pass {what}_split_sizes"
                    )
                return [t.numel() // n * units] * n
            if len(splits) != n:
                raise _fail(f"all_to_all: {what}_split_sizes has {len(splits)} entries for {n} ranks")
            if sum(splits) != (t.shape[0] if t.dim() else 0):
                raise _fail(
                    f"all_to_all: {what}_split_sizes sum to {sum(splits)} but the {what} has "
                    f"{t.shape[0] if t.dim() else 0} rows"
                )
            return [int(s) * row * units for s in splits]

        send_counts = counts(src, input_split_sizes, "input")
        recv_counts = counts(dst, output_split_sizes, "output")
        even = not input_split_sizes and not output_split_sizes
        if even:
            h = self._submit(
                opts, "all_to_all", dtype=code, send=self._ptr(src, units), recv=self._ptr(dst, units)
            )
        else:
            h = self._submit(
                opts,
                "all_to_all_v",
                dtype=code,
                send=self._ptr(src, units),
                recv=self._ptr(dst, units),
                send_counts=send_counts,
                recv_counts=recv_counts,
            )
        return FerrocollWork([h], [output], (src, dst), staged)

    alltoall_base = all_to_all_single

    def alltoall(
        self, output_tensors: List[torch.Tensor], input_tensors: List[torch.Tensor], opts: Any = None
    ) -> FerrocollWork:
        n = self.size()
        if len(output_tensors) != n or len(input_tensors) != n:
            raise _fail(f"alltoall needs {n} input and {n} output tensors")
        dtype = input_tensors[0].dtype
        for i, t in enumerate(list(input_tensors) + list(output_tensors)):
            _check_cpu(t, f"alltoall tensor {i}")
            if t.dtype != dtype:
                raise _fail("alltoall needs tensors of one dtype")
        code, units = _bytes_spec(input_tensors[0])
        send = torch.cat([t.reshape(-1) for t in input_tensors]) if n else torch.empty(0, dtype=dtype)
        recv = torch.empty(sum(t.numel() for t in output_tensors), dtype=dtype)
        staged = _Staged()
        copies = staged.unpack(recv, output_tensors)
        h = self._submit(
            opts,
            "all_to_all_v",
            dtype=code,
            send=self._ptr(send, units),
            recv=self._ptr(recv, units),
            send_counts=[t.numel() * units for t in input_tensors],
            recv_counts=[t.numel() * units for t in output_tensors],
            copies=copies,
        )
        return FerrocollWork([h], output_tensors, (send, recv) + tuple(output_tensors), staged)

    # -- gather / scatter -----------------------------------------------------

    def gather(
        self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor], opts: Any = None
    ) -> FerrocollWork:
        opts = opts if opts is not None else dist.GatherOptions()
        if len(input_tensors) != 1:
            raise _fail("gather takes one input tensor")
        outs = output_tensors[0] if output_tensors else []
        work = self._gather_into("gather", outs, input_tensors[0], opts.rootRank, opts)
        work._outputs = output_tensors  # type: ignore[assignment]
        return work

    def gather_single(self, output: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> FerrocollWork:
        opts = opts if opts is not None else dist.GatherOptions()
        root = opts.rootRank
        if self.rank() == root:
            outs = list(output.reshape(-1).chunk(self.size())) if output.numel() else []
            if output.numel() != inp.numel() * self.size():
                raise _fail(
                    f"gather_into_tensor: the output has {output.numel()} elements but must have "
                    f"{self.size()} x {inp.numel()}"
                )
            if inp.numel() == 0:
                outs = [output.reshape(-1)[:0]] * self.size()
        else:
            outs = []
        work = self._gather_into("gather", outs, inp, root, opts)
        work._outputs = [output]
        return work

    gather_into_tensor = gather_single

    def scatter(
        self, output_tensors: List[torch.Tensor], input_tensors: List[List[torch.Tensor]], opts: Any = None
    ) -> FerrocollWork:
        opts = opts if opts is not None else dist.ScatterOptions()
        if len(output_tensors) != 1:
            raise _fail("scatter takes one output tensor")
        out = output_tensors[0]
        _check_cpu(out, "scatter output")
        code, units = _bytes_spec(out)
        root = opts.rootRank
        staged = _Staged()
        dst = staged.contiguous(out, True)
        keep: Tuple[Any, ...] = (dst,)
        send = (0, 0)
        if self.rank() == root:
            inputs = input_tensors[0] if input_tensors else []
            if len(inputs) != self.size():
                raise _fail(f"scatter needs {self.size()} input tensors on the root, got {len(inputs)}")
            for i, t in enumerate(inputs):
                _check_cpu(t, f"scatter input {i}")
                if t.numel() != out.numel() or t.dtype != out.dtype:
                    raise _fail(
                        f"scatter input {i} has {t.numel()} elements of {t.dtype}, the output "
                        f"{out.numel()} of {out.dtype}"
                    )
            flat = torch.cat([t.reshape(-1) for t in inputs])
            keep += (flat,)
            send = self._ptr(flat, units)
        h = self._submit(opts, "scatter", dtype=code, send=send, recv=self._ptr(dst, units), root=root)
        return FerrocollWork([h], output_tensors, keep, staged)

    # -- barrier and point-to-point -------------------------------------------

    def barrier(self, opts: Any = None) -> FerrocollWork:
        return FerrocollWork([self._submit(opts, "barrier")], [], ())

    def monitored_barrier(self, timeout: Optional[timedelta] = None, wait_all_ranks: bool = False) -> None:
        """gloo's monitored barrier: every rank reports to group rank 0,
        which waits for each in turn within ``timeout`` (from its start; with
        ``wait_all_ranks``, the whole timeout for each) and then releases
        them. Rank 0's error names the rank that did not report ("Rank 1
        failed to pass monitoredBarrier in 2000 ms", or all of them with
        ``wait_all_ranks``); the others' error says that rank 0 failed. The
        errors are ferrocoll's (``Timeout``, ``PeerLost``), with gloo's words
        first. ``dist.monitored_barrier`` reaches this method through
        :mod:`ferrocoll.torch.groups`."""
        secs = timeout.total_seconds() if timeout is not None else self._timeout
        ms = f"{secs * 1000:.0f} ms" if secs is not None else "the default timeout"
        token = torch.zeros(1, dtype=torch.uint8)
        me, n = self.rank(), self.size()

        def p2p(kind: str, peer: int, left: Optional[float]) -> None:
            buf = (token.data_ptr(), 1)
            args = {"send": buf} if kind == "send" else {"recv": buf}
            kw = {} if left is None else {"timeout": max(left, 1e-3)}
            self._comm.submit(
                kind, "u8", peer=peer, tag=_MONITORED_BARRIER_TAG, async_op=True, eager=True, **kw, **args
            ).wait()

        if me != 0:
            try:
                p2p("send", 0, secs)
                p2p("recv", 0, secs)
            except ferrocoll.Error as e:
                raise type(e)(
                    f"Rank {me} successfully reached monitoredBarrier, but received errors while waiting "
                    f"for send/recv from rank 0. Please check rank 0 logs for faulty rank. ({e})"
                ) from e
            return
        start = time.monotonic()
        failed: List[Tuple[int, BaseException]] = []
        for peer in range(1, n):
            left = None if secs is None else (secs if wait_all_ranks else secs - (time.monotonic() - start))
            if left is not None and left <= 0:
                raise ferrocoll.Timeout(
                    f"[Rank 0]: Rank 0 timed out in monitoredBarrier after {ms}; ranks 1 to {peer - 1} "
                    f"reported, rank {peer} and those after it were not waited for"
                )
            try:
                p2p("recv", peer, left)
            except ferrocoll.Error as e:
                if not wait_all_ranks:
                    raise type(e)(
                        f"[Rank 0]: Rank {peer} failed to pass monitoredBarrier in {ms} ({e})"
                    ) from e
                failed.append((peer, e))
        if failed:
            names = ", ".join(str(p) for p, _ in failed)
            raise type(failed[0][1])(
                f"[Rank 0]: Ranks {names} failed to pass monitoredBarrier in {ms} ({failed[0][1]})"
            )
        for peer in range(1, n):
            p2p("send", peer, secs)

    def send(self, tensors: List[torch.Tensor], dst: int, tag: int) -> FerrocollWork:
        handles, keep = [], []
        for i, t in enumerate(tensors):
            _check_cpu(t, f"send tensor {i}")
            code, units = _bytes_spec(t)
            c = t.contiguous()
            keep.append(c)
            handles.append(
                self._submit(None, "send", dtype=code, send=self._ptr(c, units), peer=dst, tag=tag)
            )
        return FerrocollWork(handles, tensors, tuple(keep))

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int) -> FerrocollWork:
        handles, keep = [], []
        staged = _Staged()
        for i, t in enumerate(tensors):
            _check_cpu(t, f"recv tensor {i}")
            code, units = _bytes_spec(t)
            c = staged.contiguous(t, True)
            keep.append(c)
            handles.append(
                self._submit(None, "recv", dtype=code, recv=self._ptr(c, units), peer=src, tag=tag)
            )
        work = FerrocollWork(handles, tensors, tuple(keep), staged)
        work._source = src  # type: ignore[attr-defined]
        return work

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int) -> FerrocollWork:
        """``dist.recv(t, src=None)``: the message of whichever rank sends
        first under ``tag``; the work's ``_source_rank()`` names it."""
        if len(tensors) != 1:
            raise _fail(f"recv from any source takes one tensor, got {len(tensors)}")
        t = tensors[0]
        _check_cpu(t, "recv tensor")
        code, units = _bytes_spec(t)
        staged = _Staged()
        c = staged.contiguous(t, True)
        # The extension writes the sender's rank here when the call is done.
        cell = torch.full((1,), -1, dtype=torch.int64)
        handle = self._submit(
            None, "recv_any", dtype=code, recv=self._ptr(c, units), send=(cell.data_ptr(), 1), tag=tag
        )
        work = FerrocollWork([handle], tensors, (c, cell), staged)
        work._source_cell = cell  # type: ignore[attr-defined]
        return work


#: The methods torch calls on a process group to communicate (and the few
#: others that reach ferrocoll), which :func:`_run_eagerly_under_compile` marks.
_COMMUNICATING_METHODS = (
    "allreduce",
    "allreduce_coalesced",
    "broadcast",
    "reduce",
    "allgather",
    "allgather_coalesced",
    "all_gather_single",
    "_allgather_base",
    "all_gather_single_coalesced",
    "allgather_into_tensor_coalesced",
    "reduce_scatter_single",
    "_reduce_scatter_base",
    "reduce_scatter",
    "reduce_scatter_single_coalesced",
    "reduce_scatter_tensor_coalesced",
    "all_to_all_single",
    "alltoall_base",
    "alltoall",
    "gather",
    "gather_single",
    "gather_into_tensor",
    "scatter",
    "barrier",
    "monitored_barrier",
    "send",
    "recv",
    "recv_anysource",
    "abort",
    "set_timeout",
)


def _run_eagerly_under_compile(cls: type) -> None:
    """Marks ``cls``'s communicating methods with ``torch.compiler.disable``.

    ``torch.compile`` treats a ``ProcessGroup`` as an opaque object whose
    registered members it may touch. A C++ backend's methods are opaque to
    it; this class's are Python, so Dynamo inlines them and fails on the
    first attribute it does not know (``_submit``: a compiled DDP model's
    pre-forward broadcast ended in ``UnsafeScriptObjectError`` where gloo
    ran). Disabled, each call is a graph break that runs eagerly, as a C++
    backend's does (about 0.4 us more per call, measured on a 2-rank
    8-byte ``all_reduce``)."""
    for name in _COMMUNICATING_METHODS:
        setattr(cls, name, torch.compiler.disable(getattr(cls, name)))


_run_eagerly_under_compile(ProcessGroupFerrocoll)


# ---- creation ---------------------------------------------------------------

_world_lock = threading.Lock()
#: The communicator of the default group, from which other groups are made.
_world: Optional[Tuple[Any, int]] = None


def _route_hint(store: Any) -> Optional[str]:
    """``host:port`` of the TCPStore under ``store`` (or MASTER_ADDR/PORT):
    TCP listens on the interface that reaches it."""
    s = store
    for _ in range(8):
        host = getattr(s, "host", None)
        port = getattr(s, "port", None)
        if host and port:
            return f"{host}:{port}"
        s = getattr(s, "underlying_store", None)
        if s is None:
            break
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if addr:
        return f"{addr}:{port or 29500}"
    return None


def _create(opts: Any, backend_options: Any = None) -> ProcessGroupFerrocoll:
    """torch's creator (extended API): builds the group's communicator."""
    global _world
    rank, size = opts.group_rank, opts.group_size
    timeout = opts.timeout.total_seconds() if opts.timeout is not None else None
    global_ranks = list(opts.global_ranks_in_group or [])
    with _world_lock:
        default_group = not dist.is_initialized()
        world = _world
        if not default_group and world is not None and global_ranks:
            comm, world_size = world
            if max(global_ranks) < world_size:
                sub = comm.subgroup(global_ranks, _tag_of(str(opts.group_id)))
                pg = ProcessGroupFerrocoll(sub, rank, size)
                # The group's own deadline (new_group(timeout=...)) for every
                # call on it; the world's applies otherwise.
                if timeout:
                    pg._timeout = timeout
                return pg
        # Leave thread placement to torch: pinning the process to one core
        # (ferrocoll's default when ranks fit one per core) would put torch's
        # compute threads, autograd's and ferrocoll's progress worker on that
        # one core. FERROCOLL_BIND set by the user still wins.
        os.environ.setdefault("FERROCOLL_BIND", "none")
        comm = _core.init_with_store(opts.store, rank, size, _route_hint(opts.store), timeout)
        if default_group:
            _world = (comm, size)
    return ProcessGroupFerrocoll(comm, rank, size)


def register() -> None:
    """Registers the ``"ferrocoll"`` backend with torch.distributed (done on import)."""
    if "ferrocoll" in dist.Backend.backend_list:
        return
    dist.Backend.register_backend("ferrocoll", _create, extended_api=True, devices=["cpu"])
