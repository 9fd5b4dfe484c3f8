"""Copied from ../shared/peers/gloo_coll.py (which stays as it is) with `reduce` added (root 0,
busbw factor 1 as nccl-tests counts it), for bench/compare_all.sh.

Peer benchmark: torch.distributed (gloo backend) collectives, one JSON line per size.

Run N copies with RANK=0..N-1 WORLD_SIZE=N MASTER_ADDR=127.0.0.1 MASTER_PORT=<free port>:
    python gloo_coll.py allreduce 8 33554432 4
Sizes count bytes as nccl-tests does (see mpi_coll.c). f32, sum.
"""
import json, sys, time
import torch, torch.distributed as dist

FACTOR = {"allreduce": lambda n: 2 * (n - 1) / n, "bcast": lambda n: 1.0, "reduce": lambda n: 1.0}

def run(coll, x, out, n):
    if coll == "allreduce": dist.all_reduce(x)
    elif coll == "allgather": dist.all_gather_into_tensor(out, x[: x.numel() // n])
    elif coll == "reducescatter": dist.reduce_scatter_tensor(out[: x.numel() // n], x)
    elif coll == "alltoall": dist.all_to_all_single(out, x)
    elif coll == "bcast": dist.broadcast(x, 0)
    elif coll == "reduce": dist.reduce(x, 0)

def main():
    coll = sys.argv[1] if len(sys.argv) > 1 else "allreduce"
    lo, hi, f = (int(a) for a in (sys.argv[2:5] + ["8", str(32 << 20), "4"][len(sys.argv[2:5]):]))
    dist.init_process_group("gloo")
    r, n = dist.get_rank(), dist.get_world_size()
    b = lo
    while b <= hi:
        cnt = max(b // 4, n) // n * n
        x = torch.full((cnt,), float(r + 1)); out = torch.empty(cnt)
        it = 1000 if b < (1 << 16) else (100 if b < (1 << 22) else 10)
        for _ in range(5): run(coll, x, out, n)
        wrong = 0
        if coll == "allreduce":
            x.fill_(float(r + 1)); run(coll, x, out, n)
            wrong = int((x != n * (n + 1) / 2).sum())
        dist.barrier(); t0 = time.perf_counter()
        for _ in range(it): run(coll, x, out, n)
        t = torch.tensor([(time.perf_counter() - t0) / it], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX); t = t.item()
        alg = b / t / 1e9
        if r == 0:
            print(json.dumps({"peer": "gloo", "coll": coll, "ranks": n, "bytes": b, "time_us": round(t * 1e6, 3),
                              "algbw": round(alg, 4), "busbw": round(alg * FACTOR.get(coll, lambda n: (n - 1) / n)(n), 4),
                              "wrong": wrong}), flush=True)
        b *= f
    dist.destroy_process_group()

main()
