"""torch.distributed gloo allreduce across the hosts of bench/multihost.sh.

Started by `ferrocoll run --hosts` (one process per rank); reads ferrocoll's
variables for torch's env:// rendezvous (the port next to ferrocoll's).
Prints one JSON line per size on rank 0: bytes, time_us, busbw (GB/s).

    python bench/multihost_gloo.py LO HI FACTOR
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    lo, hi, factor = (int(a) for a in sys.argv[1:4])
    host, port = os.environ["FERROCOLL_ADDR"].rsplit(":", 1)
    os.environ.update(
        RANK=os.environ["FERROCOLL_RANK"],
        WORLD_SIZE=os.environ["FERROCOLL_WORLD_SIZE"],
        MASTER_ADDR=host,
        MASTER_PORT=str(int(port) + 1),
    )
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    size = lo
    while size <= hi:
        x = torch.full((size // 4,), float(rank + 1))
        iters = 20 if size < (1 << 20) else (5 if size < (16 << 20) else 2)
        dist.all_reduce(x)
        x.fill_(float(rank + 1))
        dist.all_reduce(x)
        wrong = int((x != n * (n + 1) / 2).sum())
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        sec = t.item()
        if rank == 0:
            busbw = size / sec / 1e9 * 2 * (n - 1) / n
            print(json.dumps({"bytes": size, "time_us": sec * 1e6, "busbw": busbw, "wrong": wrong}), flush=True)
        size *= factor
    dist.destroy_process_group()
    # torch 2.15's gloo can abort at interpreter exit after heavy use.
    sys.stdout.flush()
    os._exit(0)


main()
