"""MoE dispatch/combine the way DeepSpeed-MoE runs them on CPU: torch gloo.

The baseline of `ferrocoll bench moe` (bench/moe.sh runs both): the same
workload (T tokens a rank of H elements, top-k of E experts drawn from a
uniform or Zipf distribution, weights the softmax of random logits) through
torch.distributed's gloo backend, with the packing and unpacking in torch:

* dispatch: the count exchange (all_to_all_single of each rank's per-expert
  counts), the rows packed by expert with index ops (a stable argsort of
  the chosen experts, then index_select), all_to_all_single with split
  sizes, and the arrivals regrouped by local expert (another index_select);
* combine: the experts' outputs (the identity here, as in `ferrocoll bench
  moe`) regrouped back, all_to_all_single back, multiplied by their weights
  and summed into their tokens (index_add_; y_t = sum_j g_tj out_tj), in the
  row type as DeepSpeed does (twice as fast in torch on CPU as in f32;
  --f32-combine accumulates in f32 and rounds once, as ferrocoll does).

A capacity factor C keeps, per rank and expert, the first ceil(T*k/E * C)
pairs in GShard's priority (first choices before second, then position):
DeepSpeed's per-rank capacity (ferrocoll's is global, the same bound times
P). Times are the slowest rank's mean over the timed layers, as ferrocoll
reports them; a barrier precedes each timed phase.

Started by `ferrocoll run` (one process per rank); reads ferrocoll's
variables for torch's env:// rendezvous (the port next to ferrocoll's). Set
GLOO_SOCKET_IFNAME (lo on one host, eth0 in the namespace cluster). Prints
one JSON line per (tokens, skew) on rank 0.

    python bench/moe_gloo.py --tokens 4096 --hidden 2048 --topk 2 --experts 16 \\
        --skew uniform,zipf:1.2 [--capacity 1.25] [--iters 10] [--check]
"""

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def probabilities(skew: str, experts: int) -> torch.Tensor:
    """The router's distribution over the experts: uniform or zipf:S."""
    if skew == "uniform":
        w = torch.ones(experts, dtype=torch.float64)
    elif skew.startswith("zipf:"):
        s = float(skew.split(":", 1)[1])
        w = torch.arange(1, experts + 1, dtype=torch.float64) ** -s
    else:
        raise SystemExit(f"unknown skew {skew!r}; use uniform or zipf:S")
    return w / w.sum()


def route(tokens: int, topk: int, experts: int, skew: str, seed: int, rank: int):
    """k distinct experts per token drawn from the skew (Gumbel top-k), and
    the softmax of k random logits as weights, largest first."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + rank)
    logp = probabilities(skew, experts).log()
    gumbel = -torch.log(-torch.log(torch.rand(tokens, experts, generator=g, dtype=torch.float64)))
    idx = torch.topk(logp + gumbel, topk, dim=1).indices
    logits = torch.sort(4 * torch.rand(tokens, topk, generator=g) - 2, dim=1, descending=True).values
    return idx, torch.softmax(logits, dim=1)


def keep_mask(idx: torch.Tensor, experts: int, capacity: float | None) -> torch.Tensor:
    """Which (token, choice) pairs this rank keeps under a per-rank capacity."""
    tokens, topk = idx.shape
    if capacity is None:
        return torch.ones(tokens * topk, dtype=torch.bool)
    cap = math.ceil(tokens * topk / experts * capacity)
    # Priority: choice j of every token before choice j + 1, then position.
    by_priority = idx.t().reshape(-1)
    onehot = torch.nn.functional.one_hot(by_priority, experts)
    position = (onehot.cumsum(0) * onehot).sum(1) - 1
    kept = (position < cap).view(topk, tokens).t().reshape(-1)
    return kept


class Layer:
    """One rank's dispatch and combine for one routing."""

    def __init__(
        self, idx: torch.Tensor, w: torch.Tensor, experts: int, capacity: float | None, f32_combine: bool
    ) -> None:
        self.n, self.rank = dist.get_world_size(), dist.get_rank()
        self.f32_combine = f32_combine
        self.experts, self.local = experts, experts // self.n
        self.tokens, self.topk = idx.shape
        flat = idx.reshape(-1)
        kept = keep_mask(idx, experts, capacity)
        pairs = torch.nonzero(kept).squeeze(1)
        self.dropped = int(flat.numel() - pairs.numel())
        self.weights = w.reshape(-1)
        # The kept pairs sorted by expert (stable: by token within one).
        order = torch.argsort(flat[pairs], stable=True)
        self.pairs = pairs[order]
        self.token_of = torch.div(self.pairs, self.topk, rounding_mode="floor")
        self.expert_counts = torch.bincount(flat[self.pairs], minlength=experts)

    def dispatch(self, x: torch.Tensor) -> torch.Tensor:
        n, local = self.n, self.local
        # The count exchange: every rank learns how many rows of each of
        # its local experts each source sends.
        recv_counts = torch.empty_like(self.expert_counts)
        dist.all_to_all_single(recv_counts, self.expert_counts)
        self.recv_counts = recv_counts.view(n, local)
        send_split = self.expert_counts.view(n, local).sum(1).tolist()
        recv_split = self.recv_counts.sum(1).tolist()
        send = x.index_select(0, self.token_of)
        recv = x.new_empty((sum(recv_split), x.shape[1]))
        dist.all_to_all_single(recv, send, recv_split, send_split)
        self.splits = (send_split, recv_split)
        # Arrivals are by source, then expert: regroup by expert, then source.
        src_of = torch.repeat_interleave(torch.arange(n * local), self.recv_counts.reshape(-1))
        expert_of = src_of % local
        self.to_experts = torch.argsort(expert_of, stable=True)
        return recv.index_select(0, self.to_experts)

    def combine(self, out: torch.Tensor) -> torch.Tensor:
        send_split, recv_split = self.splits
        back = torch.empty_like(out)
        back.index_copy_(0, self.to_experts, out)
        returned = out.new_empty((sum(send_split), out.shape[1]))
        dist.all_to_all_single(returned, back, send_split, recv_split)
        # Each row times its weight, summed into its token: in the row type
        # (as DeepSpeed combines, and faster in torch on CPU), or with
        # --f32-combine in f32 and rounded once (as ferrocoll accumulates).
        acc = torch.float32 if self.f32_combine else out.dtype
        g = self.weights.index_select(0, self.pairs).unsqueeze(1).to(acc)
        scaled = returned.to(acc) * g
        y = torch.zeros((self.tokens, out.shape[1]), dtype=acc)
        y.index_add_(0, self.token_of, scaled)
        return y.to(out.dtype)


def slowest_mean(times: list[float]) -> float:
    t = torch.tensor([sum(times) / len(times)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--tokens", default="4096", help="tokens per rank (comma-separated: a sweep)")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--topk", type=int, default=2)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--capacity", default="dropless", help="capacity factor C, or dropless")
    p.add_argument("--skew", default="uniform", help="uniform or zipf:S (comma-separated: a sweep)")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--check", action="store_true", help="count output elements off x * sum(w)")
    p.add_argument("--f32-combine", action="store_true", help="accumulate combine in f32 (slower in torch)")
    a = p.parse_args()

    host, port = os.environ["FERROCOLL_ADDR"].rsplit(":", 1)
    os.environ.update(
        RANK=os.environ["FERROCOLL_RANK"],
        WORLD_SIZE=os.environ["FERROCOLL_WORLD_SIZE"],
        MASTER_ADDR=host,
        MASTER_PORT=str(int(port) + 1),
    )
    # The ranks of a host share its cores, as ferrocoll's ranks do.
    local_ranks = int(os.environ.get("FERROCOLL_LOCAL_WORLD_SIZE", "1"))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_ranks))
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    capacity = None if a.capacity == "dropless" else float(a.capacity)
    dtype = DTYPES[a.dtype]
    for tokens in (int(t) for t in a.tokens.split(",")):
        for skew in a.skew.split(","):
            idx, w = route(tokens, a.topk, a.experts, skew, a.seed, rank)
            x = (torch.arange(tokens * a.hidden, dtype=torch.float32).view(tokens, a.hidden) % 17 - 8).to(
                dtype
            )
            layer = Layer(idx, w, a.experts, capacity, a.f32_combine)
            for _ in range(a.warmup):
                layer.combine(layer.dispatch(x))
            td, tc = [], []
            for _ in range(a.iters):
                dist.barrier()
                t0 = time.perf_counter()
                inputs = layer.dispatch(x)
                td.append(time.perf_counter() - t0)
                dist.barrier()
                t0 = time.perf_counter()
                y = layer.combine(inputs)
                tc.append(time.perf_counter() - t0)
            wrong = None
            if a.check:
                want = (x.float() * w.sum(1, keepdim=True)).to(dtype)
                if capacity is not None:
                    kept = keep_mask(idx, a.experts, capacity).view(tokens, a.topk)
                    want = (x.float() * (w * kept).sum(1, keepdim=True)).to(dtype)
                bad = torch.tensor(
                    [int((y.float() - want.float()).abs().gt(1e-2 * want.float().abs() + 1e-3).sum())]
                )
                dist.all_reduce(bad)
                wrong = int(bad.item())
            received = torch.tensor([float(inputs.shape[0])], dtype=torch.float64)
            dist.all_reduce(received)
            dropped = torch.tensor([layer.dropped])
            dist.all_reduce(dropped)
            d, c = slowest_mean(td), slowest_mean(tc)
            logical = received.item() / n * a.hidden * x.element_size()
            if rank == 0:
                line = {
                    "bench": "moe-gloo",
                    "ranks": n,
                    "tokens": tokens,
                    "hidden": a.hidden,
                    "dtype": a.dtype,
                    "topk": a.topk,
                    "experts": a.experts,
                    "capacity": capacity,
                    "skew": skew,
                    "dispatch_us": d * 1e6,
                    "combine_us": c * 1e6,
                    "logical_bytes": logical,
                    "logical_GBps": 2 * logical / (d + c) / 1e9,
                    "dropped": int(dropped.item()),
                    "wrong": wrong,
                }
                print(json.dumps(line), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    # torch 2.15's gloo can abort at interpreter exit after heavy use.
    sys.stdout.flush()
    os._exit(0)


main()
