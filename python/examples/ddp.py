"""DDP training on the ferrocoll backend: runs unchanged under torchrun and
``ferrocoll run``.

    torchrun --nproc-per-node 2 python/examples/ddp.py
    target/release/ferrocoll run -n 2 -- python python/examples/ddp.py
"""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import ferrocoll.torch  # noqa: F401  (registers the "ferrocoll" backend)


def main() -> None:
    dist.init_process_group("ferrocoll")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    for step in range(20):
        x = torch.randn(32, 64, generator=gen)
        y = torch.randint(0, 10, (32,), generator=gen)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and step % 5 == 4:
            print(f"step {step + 1}: loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
