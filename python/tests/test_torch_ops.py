"""Every torch.distributed operation on the ferrocoll backend, against gloo's
result computed in the same job (a gloo group over the same ranks)."""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import Any, Callable, List

import pytest

import ranks

torch = pytest.importorskip("torch")

DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64"]


def _values(rank: int, shape: Any, dtype: Any, salt: int = 0) -> Any:
    import torch

    n = 1
    for s in shape if isinstance(shape, tuple) else (shape,):
        n *= s
    v = (torch.arange(n, dtype=torch.int64) * 7 + rank * 3 + salt) % 5 + 1
    return v.to(dtype).reshape(shape)


def compare_with_gloo(counts: List[int]) -> List[str]:
    """Runs each operation on ferrocoll (the default group) and on gloo."""
    import torch
    import torch.distributed as dist

    import ferrocoll.torch  # noqa: F401

    dist.init_process_group("ferrocoll")
    gloo = dist.new_group(backend="gloo")
    r, n = dist.get_rank(), dist.get_world_size()
    bad: List[str] = []
    R = dist.ReduceOp

    def same(what: str, run: Callable[[Any], Any]) -> None:
        """``run(group)`` returns tensors; ferrocoll's must equal gloo's."""
        try:
            got = run(None)
        except Exception as e:  # noqa: BLE001
            bad.append(f"rank {r}: {what}: ferrocoll raised {type(e).__name__}: {e}")
            return
        want = run(gloo)
        got = got if isinstance(got, (list, tuple)) else [got]
        want = want if isinstance(want, (list, tuple)) else [want]
        for g, w in zip(got, want):
            if g.dtype != w.dtype or g.shape != w.shape or not torch.equal(g, w):
                bad.append(
                    f"rank {r}: {what}: got {g.flatten()[:6].tolist()} want {w.flatten()[:6].tolist()}"
                )

    for name in DTYPES:
        dtype = getattr(torch, name)
        # gloo lacks some (type, op) pairs: compare only where gloo has it.
        ops = [("SUM", R.SUM), ("MAX", R.MAX), ("MIN", R.MIN), ("PRODUCT", R.PRODUCT)]
        for count in counts:
            shape = (count,)
            for opname, op in ops:
                if dtype in (torch.float16, torch.bfloat16) and op == R.PRODUCT:
                    continue  # products of 1..5 overflow low precision differently by order

                def allreduce(g: Any, op: Any = op) -> Any:
                    t = _values(r, shape, dtype)
                    dist.all_reduce(t, op=op, group=g)
                    return t

                same(f"all_reduce {opname} {name} x{count}", allreduce)

            def broadcast(g: Any) -> Any:
                t = _values(r, shape, dtype)
                dist.broadcast(t, src=count % n, group=g)
                return t

            same(f"broadcast {name} x{count}", broadcast)

            def reduce(g: Any) -> Any:
                t = _values(r, shape, dtype)
                dist.reduce(t, dst=(count + 1) % n, op=R.SUM, group=g)
                return t if r == (count + 1) % n else torch.zeros(0)

            same(f"reduce {name} x{count}", reduce)

            def all_gather(g: Any) -> Any:
                out = [torch.empty(shape, dtype=dtype) for _ in range(n)]
                dist.all_gather(out, _values(r, shape, dtype), group=g)
                return out

            same(f"all_gather list {name} x{count}", all_gather)

            def all_gather_into_tensor(g: Any) -> Any:
                out = torch.empty((n * count,), dtype=dtype)
                dist.all_gather_into_tensor(out, _values(r, shape, dtype), group=g)
                return out

            same(f"all_gather_into_tensor {name} x{count}", all_gather_into_tensor)

            def reduce_scatter_tensor(g: Any) -> Any:
                out = torch.empty(shape, dtype=dtype)
                dist.reduce_scatter_tensor(out, _values(r, (n * count,), dtype, 1), group=g)
                return out

            same(f"reduce_scatter_tensor {name} x{count}", reduce_scatter_tensor)

            def reduce_scatter(g: Any) -> Any:
                out = torch.empty(shape, dtype=dtype)
                dist.reduce_scatter(out, [_values(r, shape, dtype, p) for p in range(n)], group=g)
                return out

            same(f"reduce_scatter list {name} x{count}", reduce_scatter)

            def all_to_all_single(g: Any) -> Any:
                out = torch.empty((n * count,), dtype=dtype)
                dist.all_to_all_single(out, _values(r, (n * count,), dtype, 2), group=g)
                return out

            same(f"all_to_all_single {name} x{count}", all_to_all_single)

            def all_to_all_list(g: Any) -> Any:
                # gloo's list form needs tensors of one size.
                out = [torch.empty(shape, dtype=dtype) for p in range(n)]
                dist.all_to_all(out, [_values(r, shape, dtype, q) for q in range(n)], group=g)
                return out

            same(f"all_to_all list {name} x{count}", all_to_all_list)

            def gather(g: Any) -> Any:
                dst = count % n
                out = [torch.empty(shape, dtype=dtype) for _ in range(n)] if r == dst else None
                dist.gather(_values(r, shape, dtype), out, dst=dst, group=g)
                return out if r == dst else [torch.zeros(0)]

            same(f"gather {name} x{count}", gather)

            def scatter(g: Any) -> Any:
                src = (count + 1) % n
                out = torch.empty(shape, dtype=dtype)
                ins = [_values(r, shape, dtype, p) for p in range(n)] if r == src else None
                dist.scatter(out, ins, src=src, group=g)
                return out

            same(f"scatter {name} x{count}", scatter)

    # Uneven all_to_all_single splits, zeros included (what MoE layers call).
    for rows in [0, 3]:

        def uneven(g: Any, rows: int = rows) -> Any:
            ins = [(r + q) % 3 * rows for q in range(n)]
            outs = [(p + r) % 3 * rows for p in range(n)]
            inp = _values(r, (sum(ins), 4), torch.float32, 5)
            out = torch.empty((sum(outs), 4))
            dist.all_to_all_single(out, inp, output_split_sizes=outs, input_split_sizes=ins, group=g)
            return out

        same(f"all_to_all_single uneven rows={rows}", uneven)

    # Non-contiguous tensors are copied in and out.
    def noncontig(g: Any) -> Any:
        base = _values(r, (6, 4), torch.float32)
        t = base.t()
        dist.all_reduce(t, group=g)
        return base

    same("all_reduce non-contiguous", noncontig)

    # allreduce_coalesced and the coalesced tensor forms.
    def coalesced(g: Any) -> Any:
        ts = [_values(r, (k + 1,), torch.float32, k) for k in range(4)]
        with dist._coalescing_manager(group=g):
            for t in ts:
                dist.all_reduce(t, group=g)
        return ts

    same("coalesced all_reduce", coalesced)

    # AVG and PREMUL_SUM where gloo has no such op: against the definition.
    t = _values(r, (10,), torch.float32)
    dist.all_reduce(t, op=R.AVG)
    want = sum(_values(p, (10,), torch.float32) for p in range(n)) / n
    if not torch.allclose(t, want):
        bad.append(f"rank {r}: AVG: {t[:4].tolist()} want {want[:4].tolist()}")
    out = torch.empty(5)
    dist.reduce_scatter_tensor(out, _values(r, (5 * n,), torch.float32), op=dist._make_nccl_premul_sum(0.25))
    want = (sum(_values(p, (5 * n,), torch.float32) for p in range(n)) * 0.25)[5 * r : 5 * r + 5]
    if not torch.allclose(out, want):
        bad.append(f"rank {r}: PREMUL_SUM: {out.tolist()} want {want.tolist()}")
    b = torch.tensor([r == 0, False, True])
    dist.all_reduce(b, op=R.MAX)
    if b.tolist() != [True, False, True]:
        bad.append(f"rank {r}: bool MAX: {b.tolist()}")

    # send / recv with tags around a ring, async.
    if n > 1:
        got = torch.empty(7, dtype=torch.int64)
        s = dist.isend(torch.full((7,), r, dtype=torch.int64), (r + 1) % n, tag=4)
        q = dist.irecv(got, (r - 1) % n, tag=4)
        q.wait()
        s.wait()
        if got.tolist() != [(r - 1) % n] * 7:
            bad.append(f"rank {r}: isend/irecv: {got.tolist()}")

    # recv from any source: rank 0 takes one message from every other rank
    # and dist.recv returns who sent it.
    if n > 1:
        if r == 0:
            senders = []
            for _ in range(n - 1):
                got = torch.empty(3)
                src = dist.recv(got, tag=6)
                if got.tolist() != [float(src)] * 3:
                    bad.append(f"rank 0: recv from any source got {got.tolist()} from {src}")
                senders.append(src)
            if sorted(senders) != list(range(1, n)):
                bad.append(f"rank 0: recv from any source: senders {senders}")
        else:
            dist.send(torch.full((3,), float(r)), 0, tag=6)

    # Work objects and futures.
    w = dist.all_reduce(torch.ones(4), async_op=True)
    fut = w.get_future()
    w.wait()
    if not (w.is_completed() and w.is_success() and w.exception() is None):
        bad.append(f"rank {r}: work state after wait")
    v = fut.wait()
    if not (isinstance(v, list) and torch.equal(v[0], torch.full((4,), float(n)))):
        bad.append(f"rank {r}: future value {v}")

    # new_group subsets, including a group of one and one without rank 0.
    for members in [[0], list(range(1, n)), [p for p in range(n) if p % 2 == 0]]:
        if not members:
            continue
        g = dist.new_group(members)
        if r in members:
            t = torch.tensor([float(r)])
            dist.all_reduce(t, group=g)
            if t.item() != float(sum(members)):
                bad.append(f"rank {r}: new_group {members}: {t.item()}")
    dist.barrier()
    dist.destroy_process_group()
    return bad


@pytest.mark.parametrize("n", [2, 3])
def test_operations_match_gloo(n: int) -> None:
    counts = [0, 1, 1000] if n == 2 else [0, 5]
    for bad in ranks.run(n, compare_with_gloo, counts, timeout=400):
        assert bad == []


def groups_and_bitwise() -> List[str]:
    """``dist.split_group``, ``dist.monitored_barrier`` and the bitwise
    all_reduce on ferrocoll, against gloo where gloo has the call."""
    import torch
    import torch.distributed as dist

    import ferrocoll.torch  # noqa: F401

    dist.init_process_group("ferrocoll")
    gloo = dist.new_group(backend="gloo")
    r, n = dist.get_rank(), dist.get_world_size()
    bad: List[str] = []
    R = dist.ReduceOp

    # Bitwise reductions, every integer type and bool, uneven and empty sizes.
    for dtype in [torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool]:
        for op in (R.BAND, R.BOR, R.BXOR):
            for count in (0, 1, 37):
                v = (torch.arange(count) * (r + 3) + r) % 11
                mine, theirs = v.to(dtype), v.to(dtype)
                dist.all_reduce(mine, op=op)
                dist.all_reduce(theirs, op=op, group=gloo)
                if not torch.equal(mine, theirs):
                    bad.append(f"rank {r}: all_reduce {op} {dtype} x{count}: {mine[:6]} want {theirs[:6]}")
    # Coalesced and asynchronous, through a future.
    a, b = torch.tensor([1, 2, 4], dtype=torch.int64) << r, torch.tensor([r + 1], dtype=torch.int64)
    dist.all_reduce_coalesced([a, b], op=R.BOR, async_op=True).wait()
    c = torch.tensor([r + 1, 3], dtype=torch.int32)
    (got,) = dist.all_reduce(c, op=R.BXOR, async_op=True).get_future().wait()
    if got.tolist() != [functools.reduce(lambda x, y: x ^ y, range(1, n + 1)), 3 if n % 2 else 0]:
        bad.append(f"rank {r}: BXOR through the future: {got.tolist()}")
    want = sum(1 << s for s in range(n))
    if a.tolist() != [want, want * 2, want * 4] or b.item() != functools.reduce(
        lambda x, y: x | y, range(1, n + 1)
    ):
        bad.append(f"rank {r}: coalesced BOR: {a.tolist()} {b.tolist()}")
    try:
        dist.all_reduce(torch.ones(2), op=R.BAND)
        bad.append(f"rank {r}: BAND of float32 did not fail")
    except RuntimeError as e:
        if "BAND needs integer or bool tensors" not in str(e):
            bad.append(f"rank {r}: BAND of float32: {e}")

    # split_group: each split in its own order (the list position is the
    # group rank), a rank in no split, and a split of a split.
    reverse = dist.split_group(split_ranks=[list(reversed(range(n)))])
    if dist.get_rank(reverse) != n - 1 - r or dist.get_process_group_ranks(reverse) != list(
        reversed(range(n))
    ):
        bad.append(f"rank {r}: reversed split: group rank {dist.get_rank(reverse)}")
    t = torch.full((3,), float(r))
    dist.broadcast(t, group=reverse, group_src=0)  # group rank 0 is world rank n - 1
    if t.tolist() != [float(n - 1)] * 3:
        bad.append(f"rank {r}: broadcast in the reversed split: {t.tolist()}")
    odd = dist.split_group(split_ranks=[[g] for g in range(1, n, 2)])
    if (odd is dist.GroupMember.NON_GROUP_MEMBER) != (r % 2 == 0):
        bad.append(f"rank {r}: split of odd ranks gave {odd}")
    halves = dist.split_group(reverse, split_ranks=[list(range(0, n, 2)), list(range(1, n, 2))])
    t = torch.ones(1) * r
    dist.all_reduce(t, group=halves)
    group_rank = n - 1 - r
    want = sum(n - 1 - g for g in range(group_rank % 2, n, 2))
    if t.item() != want:
        bad.append(f"rank {r}: all_reduce in a split of a split: {t.item()} want {want}")
    # Groups made after the splits still agree across ranks (torch names
    # them from a counter every rank must advance alike).
    after = dist.new_group(list(range(n)))
    t = torch.ones(2) * r
    dist.all_reduce(t, group=after)
    if t.tolist() != [float(sum(range(n)))] * 2:
        bad.append(f"rank {r}: new_group after the splits: {t.tolist()}")
    dist.monitored_barrier(timeout=timedelta(seconds=30))
    dist.monitored_barrier(group=halves, timeout=30.0)
    dist.barrier()
    dist.destroy_process_group()
    return bad


def test_split_group_monitored_barrier_and_bitwise_ops() -> None:
    for bad in ranks.run(3, groups_and_bitwise, timeout=300):
        assert bad == []
