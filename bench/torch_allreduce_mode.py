"""Times a 4 MiB ``dist.all_reduce`` at five buffer offsets in one launch.

Shows the per-process mode of issue 13's closing measurement
(``bench/RESULTS.md``): launch it a few times and compare the launches.

    torchrun --nproc-per-node 2 bench/torch_allreduce_mode.py [backend]
"""

import sys
import time

import torch
import torch.distributed as dist

import ferrocoll.torch  # noqa: F401  (registers the backend)


def per_call_us(t: torch.Tensor, calls: int = 30) -> float:
    """Mean time per call of ``calls`` back-to-back all_reduces of ``t``."""
    dist.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(t)
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    """Prints, on rank 0, the best of 3 per offset (floats into a larger buffer)."""
    dist.init_process_group(sys.argv[1] if len(sys.argv) > 1 else "ferrocoll")
    for offset in [0, 16, 256, 1000, 1024]:
        base = torch.ones((1 << 20) + 4096)
        t = base[offset : offset + (1 << 20)]
        us = min(per_call_us(t) for _ in range(3))
        if dist.get_rank() == 0:
            print(f"offset {offset} floats (address % 4096 = {t.data_ptr() % 4096}): {us:.1f} us", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
