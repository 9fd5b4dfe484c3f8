"""What ``ferrocoll.torch.moe`` costs over the Rust exchange it wraps.

    python -m torch.distributed.run --nproc-per-node 4 bench/moe_torch.py [--tokens 2048 --hidden 1024]

Per configuration, the median over ``--iters`` iterations (after 3 warm-up
ones) of the slowest rank's time, each iteration started by a barrier:

* ``rust``: the extension's ``MoeDispatcher.dispatch`` then ``combine`` (the
  weighted sum in Rust) on the tensors' memory, no autograd;
* ``torch fwd``: ``moe.dispatch`` then ``moe.combine`` (``combine_pairs`` plus
  the weighted sum in torch);
* ``torch fwd+bwd``: the same with ``x`` and the weights requiring gradients
  and a backward pass (the experts are the identity times a learned scalar,
  so that the time is the exchange's: dispatch's backward is a
  ``combine_pairs``, combine's a ``dispatch_pairs``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, List

import torch
import torch.distributed as dist

import ferrocoll.torch  # noqa: F401
from ferrocoll import _ferrocoll as core
from ferrocoll.torch import moe


def slowest(fn: Callable[[], None], iters: int) -> float:
    """Median over iterations of the slowest rank's seconds."""
    times: List[float] = []
    for i in range(iters + 3):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if i >= 3:
            times.append(t.item())
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("ferrocoll")
    me, n = dist.get_rank(), dist.get_world_size()
    pg = moe._backend(None)
    t, h, e = args.tokens, args.hidden, args.experts
    g = torch.Generator().manual_seed(me)
    if me == 0:
        print(f"ranks {n}, tokens {t} a rank, hidden {h}, top-2 of {e} experts; ms, slowest rank, median")
        print("dtype     capacity   rust     torch fwd   torch fwd+bwd")
    for dtype, code in ((torch.bfloat16, "bf16"), (torch.float32, "f32")):
        for capacity in (None, 1.25):
            x = torch.randn(t, h, generator=g).to(dtype)
            probs = torch.rand(t, e, generator=g).softmax(-1)
            w, idx = probs.topk(2, dim=-1)
            idx32 = idx.to(torch.int32).contiguous()
            w32 = w.contiguous()
            d = core.MoeDispatcher(pg._comm, e, h, 2, capacity)

            def rust() -> None:
                rows, _, handle = d.dispatch(
                    (x.data_ptr(), x.numel()), (idx32.data_ptr(), t * 2), (w32.data_ptr(), t * 2), code
                )
                out = torch.from_numpy(__import__("numpy").asarray(rows))
                d.combine((out.data_ptr(), out.numel()), handle, code)

            def fwd() -> None:
                rows, handle = moe.dispatch(x, idx, w, num_experts=e, capacity_factor=capacity)
                moe.combine(rows, handle)

            scale = torch.ones((), dtype=dtype, requires_grad=True)
            xg = x.clone().requires_grad_()
            wg = w.clone().requires_grad_()

            def fwd_bwd() -> None:
                rows, handle = moe.dispatch(xg, idx, wg, num_experts=e, capacity_factor=capacity)
                moe.combine(rows * scale, handle).float().sum().backward()

            row = [slowest(f, args.iters) * 1e3 for f in (rust, fwd, fwd_bwd)]
            if me == 0:
                cap = "dropless" if capacity is None else str(capacity)
                print(f"{code:<9} {cap:<10} {row[0]:<8.2f} {row[1]:<11.2f} {row[2]:.2f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
