"""The numpy-level API against numpy references, on 1-4 processes."""

from __future__ import annotations

from typing import List

import numpy as np
import pytest

import ranks

DTYPES = ["float32", "float64", "float16", "int8", "uint8", "int32", "int64", "uint32", "uint64"]


def _data(rank: int, count: int, dtype: str, salt: int = 0) -> np.ndarray:
    """Small values every dtype holds exactly, different per rank."""
    return ((np.arange(count) * 7 + rank * 3 + salt) % 5 + 1).astype(dtype)


def every_collective(counts: List[int]) -> List[str]:
    """Runs every collective over every dtype and count; returns what was wrong."""
    import ferrocoll

    comm = ferrocoll.init()
    r, n = comm.rank, comm.size
    bad: List[str] = []

    def check(what: str, got: np.ndarray, want: np.ndarray) -> None:
        if got.shape != want.shape or not np.array_equal(got, want):
            bad.append(f"rank {r}: {what}: got {got[:8]} want {want[:8]}")

    for dtype in DTYPES:
        for count in counts:
            alls = [_data(p, count, dtype) for p in range(n)]
            mine = alls[r]
            for op, ref in [("sum", np.sum), ("max", np.max), ("min", np.min), ("prod", np.prod)]:
                want = ref(np.stack(alls), axis=0).astype(dtype) if count else mine.copy()
                out = np.zeros_like(mine)
                comm.all_reduce(mine, out, op=op)
                check(f"all_reduce {op} {dtype} x{count}", out, want)
                buf = mine.copy()
                comm.all_reduce(buf, op=op)
                check(f"all_reduce in place {op} {dtype} x{count}", buf, want)
            root = count % n
            buf = mine.copy()
            comm.broadcast(buf, root=root)
            check(f"broadcast {dtype} x{count}", buf, alls[root])
            out = np.zeros_like(mine)
            comm.reduce(mine, out, op="sum", root=root)
            if r == root:
                check(f"reduce {dtype} x{count}", out, np.sum(np.stack(alls), axis=0).astype(dtype))
            gathered = np.zeros(count * n, dtype=dtype)
            comm.all_gather(mine, gathered)
            check(f"all_gather {dtype} x{count}", gathered, np.concatenate(alls))
            big = [_data(p, count * n, dtype, 1) for p in range(n)]
            out = np.zeros(count, dtype=dtype)
            comm.reduce_scatter(big[r], out, op="sum")
            want = np.sum(np.stack(big), axis=0).astype(dtype)[r * count : (r + 1) * count]
            check(f"reduce_scatter {dtype} x{count}", out, want)
            out = np.zeros(count * n, dtype=dtype)
            comm.all_to_all(big[r], out)
            want = np.concatenate([big[p][r * count : (r + 1) * count] for p in range(n)])
            check(f"all_to_all {dtype} x{count}", out, want)
            g = np.zeros(count * n, dtype=dtype) if r == root else None
            comm.gather(mine, g, root=root)
            if r == root:
                check(f"gather {dtype} x{count}", g, np.concatenate(alls))
            out = np.zeros(count, dtype=dtype)
            comm.scatter(big[root] if r == root else None, out, root=root)
            check(f"scatter {dtype} x{count}", out, big[root][r * count : (r + 1) * count])
    # Uneven all-to-all-v with zeros: rank p sends (p + q) % 3 elements to q.
    send_counts = [(r + q) % 3 for q in range(n)]
    recv_counts = [(p + r) % 3 for p in range(n)]
    send = np.concatenate(
        [np.full(c, 10 * r + q, dtype=np.int32) for q, c in enumerate(send_counts)] + [np.zeros(0, np.int32)]
    )
    recv = np.zeros(sum(recv_counts), dtype=np.int32)
    comm.all_to_all_v(send, send_counts, recv, recv_counts)
    want = np.concatenate(
        [np.full(c, 10 * p + r, dtype=np.int32) for p, c in enumerate(recv_counts)] + [np.zeros(0, np.int32)]
    )
    check("all_to_all_v uneven", recv, want)
    comm.barrier()
    return bad


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_every_collective_matches_numpy(n: int) -> None:
    results = ranks.run(n, every_collective, [0, 1, 5, 1000, 70_001] if n <= 3 else [0, 3, 4099])
    for bad in results:
        assert bad == []


def nonblocking_and_buffers() -> List[str]:
    """Non-blocking forms, the buffer protocol, in-place layouts, p2p."""
    import ferrocoll

    comm = ferrocoll.init()
    r, n = comm.rank, comm.size
    bad: List[str] = []
    # Many requests in flight, waited in reverse order.
    bufs = [np.full(100 + i, r + i, dtype=np.float64) for i in range(50)]
    reqs = [comm.iall_reduce(b) for b in bufs]
    for i, req in reversed(list(enumerate(reqs))):
        out = req.wait()
        want = sum(p + i for p in range(n))
        if not (out is bufs[i] and np.all(out == want)):
            bad.append(f"iall_reduce {i}: {out[:3]} want {want}")
    done = comm.ibarrier()
    done.wait()
    if not done.is_completed() or done.exception() is not None:
        bad.append("ibarrier not completed")
    # The buffer protocol: a bytearray reduced in place.
    ba = bytearray([r + 1] * 16)
    comm.all_reduce(ba, op="max")
    if list(ba) != [n] * 16:
        bad.append(f"bytearray: {list(ba)}")
    # All-gather in place: the input is this rank's block of the output.
    out = np.zeros(4 * n, dtype=np.int64)
    out[4 * r : 4 * r + 4] = r
    comm.all_gather(out[4 * r : 4 * r + 4], out)
    if not np.array_equal(out, np.repeat(np.arange(n), 4)):
        bad.append(f"in-place all_gather: {out}")
    # Point-to-point around a ring, non-blocking both ways.
    if n > 1:
        send = np.full(1009, r, dtype=np.int32)
        got = np.zeros(1009, dtype=np.int32)
        s = comm.isend(send, (r + 1) % n, tag=3)
        q = comm.irecv(got, (r - 1) % n, tag=3)
        q.wait()
        s.wait()
        if not np.all(got == (r - 1) % n):
            bad.append(f"ring p2p: {got[:3]}")
    # Sub-communicators.
    half = comm.split(r % 2, key=-r)
    assert half is not None
    v = np.array([1], dtype=np.int64)
    half.all_reduce(v)
    if v[0] != len(range(r % 2, n, 2)):
        bad.append(f"split: {v}")
    evens = [p for p in range(n) if p % 2 == 0]
    if r in evens:
        sub = comm.subgroup(evens, tag=5)
        v = np.array([r], dtype=np.int64)
        sub.all_reduce(v)
        if v[0] != sum(evens) or sub.size != len(evens):
            bad.append(f"subgroup: {v}")
    comm.barrier()
    return bad


@pytest.mark.parametrize("n", [2, 3])
def test_nonblocking_buffers_and_groups(n: int) -> None:
    for bad in ranks.run(n, nonblocking_and_buffers):
        assert bad == []


def any_source() -> List[int]:
    """Rank 0 takes one message from every other rank with ``recv_any``, in
    whatever order they come; returns the senders it saw."""
    import ferrocoll

    comm = ferrocoll.init()
    seen = []
    if comm.rank == 0:
        for _ in range(comm.size - 1):
            buf = np.zeros(5, dtype=np.float64)
            src = comm.recv_any(buf, tag=3)
            assert (buf == 10.0 * src).all(), (src, buf)
            seen.append(src)
    else:
        comm.send(np.full(5, 10.0 * comm.rank), 0, tag=3)
    comm.barrier()
    return sorted(seen)


@pytest.mark.parametrize("n", [2, 3])
def test_recv_from_any_source(n: int) -> None:
    assert ranks.run(n, any_source)[0] == list(range(1, n))


def wrong_arguments() -> List[str]:
    """User mistakes are exceptions of the right class, with ferrocoll's message."""
    import ferrocoll

    comm = ferrocoll.init()
    msgs = []
    cases = [
        lambda: comm.all_reduce(np.ones(3, np.float32), np.ones(4, np.float32)),
        lambda: comm.all_reduce(np.ones(3, np.complex64)),
        lambda: comm.all_reduce(np.ones((4, 4), np.float32)[:, 0]),
        lambda: comm.all_reduce(np.ones(3, np.float32), op="median"),
        lambda: comm.broadcast(np.ones(3, np.float32), root=7),
        lambda: comm.all_reduce(np.frombuffer(b"abcd", dtype=np.uint8)),
    ]
    for case in cases:
        try:
            case()
            msgs.append("no error")
        except ferrocoll.InvalidArgument as e:
            msgs.append(type(e).__name__ + ": " + str(e))
    comm.barrier()
    return msgs


def test_wrong_arguments_are_invalid_argument_errors() -> None:
    for msgs in ranks.run(2, wrong_arguments):
        assert len(msgs) == 6
        assert all(m.startswith("InvalidArgument") for m in msgs), msgs
        assert "must have 3" in msgs[0]
        assert "complex64" in msgs[1]
        assert "contiguous" in msgs[2]
        assert "median" in msgs[3]
        assert "root" in msgs[4]
        assert "read-only" in msgs[5]


def test_exception_classes() -> None:
    import ferrocoll

    for cls in [
        ferrocoll.Timeout,
        ferrocoll.Mismatch,
        ferrocoll.PeerLost,
        ferrocoll.Aborted,
        ferrocoll.Corrupted,
        ferrocoll.InvalidArgument,
        ferrocoll.ConfigError,
        ferrocoll.StartupError,
    ]:
        assert issubclass(cls, ferrocoll.Error)
    assert issubclass(ferrocoll.Error, RuntimeError)
    assert issubclass(ferrocoll.UnknownAlgorithm, ferrocoll.InvalidArgument)
