"""``ferrocoll.torch.moe``: dispatch / combine on 1-4 ranks against the plain
torch reference (``moe.reference``), forward and gradients in float64; a
numerical directional-derivative check of the distributed gradients (the
gradcheck idea, in lockstep on every rank); torch's gradcheck and
gradgradcheck on one rank; bfloat16 / float16 rows; the extension's
dispatcher on numpy arrays; and the example MoE transformer's first steps
against a single-process reference of the same model (its replicated
gradients averaged by one allreduce, and by DDP, whose asynchronous
allreduces then overlap MoE's backward exchanges on the same group).

Every rank builds every rank's inputs from one seed, so the reference (in the
test process) sees exactly what the ranks saw. Tokens per rank are uneven and
rank 1 has none; capacity factor 0.75 drops pairs, ``None`` is dropless.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from typing import Any, Dict, List, Optional

import pytest

import ranks

torch = pytest.importorskip("torch")

HIDDEN, TOPK = 4, 2
#: Dropless, and a capacity factor that drops under random routing.
POLICIES: List[Optional[float]] = [None, 0.75]


def _tokens(n: int) -> List[int]:
    """Uneven tokens per rank, rank 1 (when there is one) with none."""
    return [0 if (r == 1 and n > 1) else 3 + (5 * r) % 7 for r in range(n)]


def _problem(n: int, experts: int, seed: int) -> Dict[str, Any]:
    """Every rank's inputs, the experts' parameters and the loss's weights,
    float64, from ``seed``: the same on every rank and in the test."""
    g = torch.Generator().manual_seed(seed)
    total = sum(_tokens(n))
    p: Dict[str, Any] = {
        "x": torch.randn(total, HIDDEN, generator=g, dtype=torch.float64),
        "idx": torch.randint(0, experts, (total, TOPK), generator=g),
        "w": torch.rand(total, TOPK, generator=g, dtype=torch.float64),
        "W": torch.randn(experts, HIDDEN, HIDDEN, generator=g, dtype=torch.float64) / 2,
        "b": torch.randn(experts, HIDDEN, generator=g, dtype=torch.float64),
        "r": torch.randn(total, HIDDEN, generator=g, dtype=torch.float64),
    }
    # Token 0 chooses one expert twice (each pair is routed on its own).
    if total:
        p["idx"][0, 1] = p["idx"][0, 0]
    return p


def _expert(W: "torch.Tensor", b: "torch.Tensor") -> Any:
    return lambda v: torch.tanh(v @ W + b)


def _slices(n: int) -> List[slice]:
    out, at = [], 0
    for t in _tokens(n):
        out.append(slice(at, at + t))
        at += t
    return out


def _loss(x, w, Ws, bs, idx, r, first, experts, capacity):  # type: ignore[no-untyped-def]
    """This rank's part of the loss, sum(y * r), through ferrocoll."""
    from ferrocoll.torch import moe

    rows, h = moe.dispatch(x, idx, w, num_experts=experts, capacity_factor=capacity)
    assert h.first_expert == first
    outs = [_expert(W, b)(v) for W, b, v in zip(Ws, bs, h.split(rows))]
    outs_t = torch.cat(outs) if outs else rows
    y = moe.combine(outs_t, h)
    return (y * r).sum(), y, h


def exchange_rank(experts_per_rank: int, seed: int) -> Dict[str, Any]:
    """On each rank: forward, backward and a directional-derivative check for
    every policy; returns what the test compares with the reference."""
    import torch.distributed as dist

    import ferrocoll.torch  # noqa: F401

    dist.init_process_group("ferrocoll")
    n, me = dist.get_world_size(), dist.get_rank()
    experts = experts_per_rank * n
    p = _problem(n, experts, seed)
    mine = _slices(n)[me]
    local = range(me * experts_per_rank, (me + 1) * experts_per_rank)
    results: Dict[str, Any] = {}
    for capacity in POLICIES:
        x = p["x"][mine].clone().requires_grad_()
        w = p["w"][mine].clone().requires_grad_()
        Ws = [p["W"][e].clone().requires_grad_() for e in local]
        bs = [p["b"][e].clone().requires_grad_() for e in local]
        args = (p["idx"][mine], p["r"][mine], local.start, experts, capacity)
        loss, y, h = _loss(x, w, Ws, bs, *args)
        loss.backward()
        leaves = [x, w, *Ws, *bs]
        grads = [t.grad.clone() for t in leaves]

        # The numerical derivative of the global loss along a random direction
        # v (every rank its part of v), by central differences: each rank
        # evaluates the loss at the same two points, in lockstep.
        gen = torch.Generator().manual_seed(seed * 31 + me)
        v = [torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in leaves]
        eps = 1e-6
        with torch.no_grad():
            sides = []
            for sign in (1.0, -1.0):
                shifted = [t + sign * eps * d for t, d in zip(leaves, v)]
                nx, nw = shifted[0], shifted[1]
                nW = shifted[2 : 2 + len(Ws)]
                nb = shifted[2 + len(Ws) :]
                sides.append(_loss(nx, nw, nW, nb, *args)[0])
        pair = torch.stack(
            [
                (sides[0] - sides[1]) / (2 * eps),
                sum((g * d).sum() for g, d in zip(grads, v)),
            ]
        )
        dist.all_reduce(pair)
        results[str(capacity)] = {
            "y": y.detach(),
            "kept": h.kept,
            "dropped": h.dropped,
            "dropped_everywhere": h.dropped_everywhere,
            "capacity": h.capacity,
            "grads": grads,
            "numeric": pair[0].item(),
            "analytic": pair[1].item(),
        }
    dist.destroy_process_group()
    return results


def _reference(n: int, experts: int, seed: int, capacity: Optional[float]) -> Dict[str, Any]:
    from ferrocoll.torch import moe

    p = _problem(n, experts, seed)
    x = p["x"].clone().requires_grad_()
    w = p["w"].clone().requires_grad_()
    W = p["W"].clone().requires_grad_()
    b = p["b"].clone().requires_grad_()
    fns = [_expert(W[e], b[e]) for e in range(experts)]
    y, kept = moe.reference(x, p["idx"], w, fns, capacity)
    (y * p["r"]).sum().backward()
    return {"y": y.detach(), "kept": kept, "x": x.grad, "w": w.grad, "W": W.grad, "b": b.grad}


@pytest.mark.parametrize("n,per_rank", [(1, 3), (2, 2), (3, 1), (3, 2), (4, 2)])
def test_dispatch_combine_and_gradients_match_the_reference(n: int, per_rank: int) -> None:
    seed = 10 * n + per_rank
    got = ranks.run(n, exchange_rank, per_rank, seed)
    experts = n * per_rank
    close = dict(rtol=1e-10, atol=1e-12)
    dropped_somewhere = False
    for capacity in POLICIES:
        ref = _reference(n, experts, seed, capacity)
        for r, sl in enumerate(_slices(n)):
            out = got[r][str(capacity)]
            what = f"rank {r} of {n}, capacity {capacity}"
            assert torch.equal(out["kept"], ref["kept"][sl]), what
            torch.testing.assert_close(out["y"], ref["y"][sl], **close, msg=what)
            gx, gw, *gp = out["grads"]
            torch.testing.assert_close(gx, ref["x"][sl], **close, msg=what)
            torch.testing.assert_close(gw, ref["w"][sl], **close, msg=what)
            local = slice(r * per_rank, (r + 1) * per_rank)
            torch.testing.assert_close(torch.stack(gp[:per_rank]), ref["W"][local], **close, msg=what)
            torch.testing.assert_close(torch.stack(gp[per_rank:]), ref["b"][local], **close, msg=what)
            # Central differences of a smooth loss: error ~ eps^2, rounding ~ 1e-10.
            assert out["numeric"] == pytest.approx(out["analytic"], rel=1e-6, abs=1e-8), what
            assert out["dropped_everywhere"] == int((~ref["kept"]).sum()), what
            if capacity is None:
                assert out["capacity"] is None and len(out["dropped"]) == 0, what
            else:
                dropped_somewhere |= len(out["dropped"]) > 0
        # The dropped choices' weights get no gradient.
        if (~ref["kept"]).any():
            assert ref["w"][~ref["kept"]].abs().max().item() == 0.0
    assert dropped_somewhere or n == 1, "capacity 0.75 dropped nothing: the test would not see drops"


def one_rank_gradcheck() -> List[bool]:
    """torch's gradcheck and gradgradcheck of the whole layer on one rank."""
    import torch.distributed as dist

    import ferrocoll.torch  # noqa: F401
    from ferrocoll.torch import moe

    dist.init_process_group("ferrocoll")
    p = _problem(1, 3, 7)
    idx = p["idx"]

    def layer(x, w, W, b):  # type: ignore[no-untyped-def]
        rows, h = moe.dispatch(x, idx, w, num_experts=3, capacity_factor=0.75)
        outs = [_expert(W[e], b[e])(v) for e, v in enumerate(h.split(rows))]
        return moe.combine(torch.cat(outs), h)

    leaves = [p[k].clone().requires_grad_() for k in ("x", "w", "W", "b")]
    ok = [
        torch.autograd.gradcheck(layer, leaves),
        torch.autograd.gradgradcheck(layer, leaves),
    ]
    dist.destroy_process_group()
    return ok


def test_gradcheck_on_one_rank() -> None:
    assert ranks.run(1, one_rank_gradcheck) == [[True, True]]


def half_rank(dtype_name: str) -> Dict[str, Any]:
    """bfloat16 / float16 rows through dispatch and combine, gradients too."""
    import torch.distributed as dist

    import ferrocoll.torch  # noqa: F401

    dist.init_process_group("ferrocoll")
    n, me = dist.get_world_size(), dist.get_rank()
    dtype = getattr(torch, dtype_name)
    p = _problem(n, 2 * n, 5)
    mine = _slices(n)[me]
    local = range(2 * me, 2 * me + 2)
    x = p["x"][mine].to(dtype).requires_grad_()
    w = p["w"][mine].float().requires_grad_()
    Ws = [p["W"][e].to(dtype) for e in local]
    bs = [p["b"][e].to(dtype) for e in local]
    loss, y, h = _loss(x, w, Ws, bs, p["idx"][mine], p["r"][mine].to(dtype), local.start, 2 * n, 0.75)
    loss.float().backward()
    out = {"y": y.detach().double(), "x": x.grad.double(), "w": w.grad.double(), "dtype": str(y.dtype)}
    dist.destroy_process_group()
    return out


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
def test_half_precision_rows(dtype_name: str) -> None:
    n = 3
    got = ranks.run(n, half_rank, dtype_name)
    ref = _reference(n, 2 * n, 5, 0.75)
    # bfloat16 keeps 8 bits of mantissa (float16 11): the expert's matmul and
    # tanh in that precision give errors of a few 1e-2 (1e-3) on O(1) values.
    tol = 0.1 if dtype_name == "bfloat16" else 0.02
    for r, sl in enumerate(_slices(n)):
        assert got[r]["dtype"] == f"torch.{dtype_name}"
        for k in ("y", "x", "w"):
            torch.testing.assert_close(got[r][k], ref[k][sl], rtol=tol, atol=tol, msg=f"rank {r} {k}")


def zero_tokens_everywhere_rank() -> List[int]:
    """No rank has a token: the exchange and its backward still run."""
    import torch.distributed as dist

    import ferrocoll.torch  # noqa: F401
    from ferrocoll.torch import moe

    dist.init_process_group("ferrocoll")
    n = dist.get_world_size()
    x = torch.zeros(0, 3, requires_grad=True)
    w = torch.zeros(0, 2, requires_grad=True)
    rows, h = moe.dispatch(x, torch.zeros(0, 2, dtype=torch.int64), w, num_experts=2 * n)
    y = moe.combine(rows * 2, h)
    y.sum().backward()
    out = [rows.shape[0], y.shape[0], x.grad.shape[0], w.grad.shape[0]]
    dist.destroy_process_group()
    return out


def test_zero_tokens_everywhere() -> None:
    assert ranks.run(2, zero_tokens_everywhere_rank) == [[0, 0, 0, 0]] * 2


def bad_arguments_rank() -> List[str]:
    """Errors that say what to fix (every rank passes the same bad call, so
    none waits for the others)."""
    import torch.distributed as dist

    import ferrocoll
    import ferrocoll.torch  # noqa: F401
    from ferrocoll.torch import moe

    dist.init_process_group("ferrocoll")
    n = dist.get_world_size()
    x = torch.zeros(4, 3)
    msgs = []
    for call in (
        lambda: moe.dispatch(x, torch.zeros(4, 2, dtype=torch.int64), torch.zeros(4, 2), num_experts=n + 1),
        lambda: moe.dispatch(x, torch.full((4, 2), 9 * n), torch.zeros(4, 2), num_experts=n),
        lambda: moe.dispatch(x, torch.zeros(4, 1, dtype=torch.int64), torch.zeros(4, 2), num_experts=n),
        lambda: moe.dispatch(x.int(), torch.zeros(4, 1, dtype=torch.int64), torch.zeros(4, 1), num_experts=n),
    ):
        try:
            call()
            msgs.append("no error")
        except ferrocoll.InvalidArgument as e:
            msgs.append(str(e))
    dist.destroy_process_group()
    return msgs


def test_bad_arguments_say_what_to_fix() -> None:
    for msgs in ranks.run(2, bad_arguments_rank):
        assert "cannot be split evenly over 2 ranks" in msgs[0]
        assert "is not an expert" in msgs[1]
        assert "must both be tokens x k" in msgs[2]
        assert "use float32, float64, float16 or bfloat16" in msgs[3]


# -- the example MoE transformer -----------------------------------------------

_EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "moe_transformer.py")


#: The text the example trains on where the seeds are missing.
_STAND_IN_TEXT = (
    "In data parallel training every process holds a full copy of the model and computes "
    "gradients on its own shard of the batch; an all-reduce then averages the gradients so "
    "that every copy takes the same step. A mixture of experts layer instead routes each "
    "token to a few experts, which live on different processes, so the tokens travel in an "
    "all-to-all exchange, are processed by their experts, and travel back to be combined. "
)


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("moe_transformer", _EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # A dataclass looks its module up by name.
    sys.modules["moe_transformer"] = module
    spec.loader.exec_module(module)
    return module


def example_rank(steps: int) -> Dict[str, Any]:
    """Both variants in one set of processes (starting 4 interpreters that
    import torch is most of this test's time)."""
    import torch.distributed as dist

    import ferrocoll.torch  # noqa: F401

    ex = _example()
    dist.init_process_group("ferrocoll")
    out = {
        variant: ex.train(ex.Config.tiny(), steps=steps, distributed=True, ddp=variant == "ddp")
        for variant in ("allreduce", "ddp")
    }
    dist.destroy_process_group()
    return out


def test_example_first_steps_match_a_single_process_reference(tmp_path: Any) -> None:
    """The shared gradients averaged by one allreduce after backward, and by
    DDP (whose asynchronous allreduces overlap MoE's backward exchanges)."""
    ex = _example()
    seeds, env = ex.SEEDS, {}
    if not os.path.isdir(seeds):
        # A checkout without ../shared (CI's may have none): any real text
        # shows whether the parallel run matches the reference, so a fixed
        # passage stands in for the seeds (not a file of the repository,
        # whose edits would change whether 4 steps lower the loss).
        (tmp_path / "text.txt").write_text(_STAND_IN_TEXT * 40)
        seeds, env = str(tmp_path), {"FERROCOLL_SEEDS": str(tmp_path)}
    cfg = dataclasses.replace(ex.Config.tiny(), seeds_dir=seeds)
    steps = 4
    runs = ranks.run(cfg.ranks, example_rank, steps, env=env)
    ref = ex.train(cfg, steps=steps, distributed=False)
    for variant in ("allreduce", "ddp"):
        got = [runs[r][variant] for r in range(cfg.ranks)]
        for r in range(cfg.ranks):
            what = f"{variant}, rank {r}"
            assert got[r]["losses"] == pytest.approx(ref["losses"], rel=1e-5), what
            for name, value in got[r]["params"].items():
                torch.testing.assert_close(
                    value, ref["params"][name], rtol=1e-4, atol=1e-6, msg=f"{what} {name}"
                )
        # The experts of every rank together are the reference's experts.
        held = set().union(*(got[r]["params"].keys() for r in range(cfg.ranks)))
        assert held == set(ref["params"].keys()), variant
    # Training moved the parameters and the reference model drops pairs at its
    # capacity factor (so the comparison covers the drop path).
    assert ref["losses"][-1] < ref["losses"][0]
    assert ref["dropped"] > 0


# -- the extension's dispatcher on numpy arrays ----------------------------------


def numpy_rank() -> Dict[str, Any]:
    """``_ferrocoll.MoeDispatcher`` without torch: numpy buffers in, ``Rows``
    read in place, the weighted ``combine`` (weights applied in Rust) against
    ``combine_pairs`` weighted here, and bfloat16 rows moved as int16 bits."""
    import numpy as np

    import ferrocoll
    from ferrocoll import _ferrocoll as core

    comm = ferrocoll.init()
    n, me = comm.size, comm.rank
    p = _problem(n, 2 * n, 3)
    mine = _slices(n)[me]
    x = p["x"][mine].float().numpy().copy()
    idx = p["idx"][mine].numpy().astype(np.uint32)
    w = p["w"][mine].float().numpy().copy()
    d = core.MoeDispatcher(comm._comm, 2 * n, HIDDEN, TOPK, capacity_factor=0.75)

    def ptr(a: "np.ndarray") -> Any:
        return (a.ctypes.data, a.size)

    rows, counts, handle = d.dispatch(ptr(x), ptr(idx), ptr(w), "f32")
    got = np.asarray(rows)
    out = (got * 2.0 + 1.0).astype(np.float32)
    y = np.asarray(d.combine(ptr(out), handle, "f32"))
    pairs = np.asarray(d.combine_pairs(ptr(out), handle, "f32")).reshape(-1, TOPK, HIDDEN)
    # bfloat16 bits of x (float32 rounded to nearest even, top 16 bits).
    bits = x.view(np.uint32)
    x16 = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    rows16, _, _ = d.dispatch(ptr(x16), ptr(idx), ptr(w), "bf16")
    got16 = np.asarray(rows16)
    back = (got16.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return {
        "shape": got.shape,
        "counts": counts,
        "dtypes": (rows.dtype, rows16.dtype, str(got16.dtype)),
        "bf16_error": float(np.abs(back - got).max()) if got.size else 0.0,
        "y_vs_pairs": float(np.abs(y - (pairs * w[:, :, None]).sum(1)).max()) if y.size else 0.0,
        "y": y,
        "dropped": handle.dropped,
    }


def test_numpy_dispatcher() -> None:
    from ferrocoll.torch import moe

    n = 3
    got = ranks.run(n, numpy_rank)
    p = _problem(n, 2 * n, 3)
    fns = [lambda v: v * 2.0 + 1.0] * (2 * n)
    y_ref, kept = moe.reference(p["x"].float(), p["idx"], p["w"].float(), fns, 0.75)
    for r, sl in enumerate(_slices(n)):
        out = got[r]
        assert out["dtypes"] == ("f32", "bf16", "int16")
        assert out["shape"] == (sum(out["counts"]), HIDDEN)
        assert out["y_vs_pairs"] < 1e-6
        # |x| < 5 and bfloat16 keeps 8 significant bits: error < 5 * 2^-8.
        assert out["bf16_error"] < 5 * 2**-8
        torch.testing.assert_close(torch.from_numpy(out["y"]), y_ref[sl], rtol=1e-5, atol=1e-6)
        assert [(t, j) for t, j, _ in out["dropped"]] == [tuple(v) for v in (~kept[sl]).nonzero().tolist()]
