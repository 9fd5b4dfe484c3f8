"""A mixture-of-experts transformer layer trained with expert parallelism on
the ferrocoll backend: a character-level language model of the text of
``../shared/seeds/`` (the 10% at the end of the text held out).

    torchrun --nproc-per-node 4 python/examples/moe_transformer.py --steps 300
    python python/examples/moe_transformer.py --reference --steps 300   # one process

The model: token and position embeddings, one pre-norm transformer block
(causal self-attention, then an MoE feed-forward: a linear router, softmax,
top-2 with the two weights renormalised to sum to 1, a capacity factor, and
experts that are small two-layer MLPs), a final norm and the output layer; the
loss is cross-entropy plus Switch's load-balancing term.

Parallelism: E experts, E/P on each of the P ranks (expert parallelism: the
MoE layer's tokens travel to their experts by ``ferrocoll.torch.moe.dispatch``
and back by ``combine``); every other parameter is replicated and its
gradients are averaged over the ranks by one allreduce of all of them per step
(data parallelism, DDP's arithmetic without DDP's bucketing; ``--ddp`` uses torch's
DistributedDataParallel for them instead, its allreduces overlapping the backward exchanges). Each rank
computes the loss of its own batch; every rank backpropagates ``loss / P``, so
that an expert's gradient (which the backward exchange brings from every rank's
tokens) and the averaged replicated gradients are both the gradient of the mean
loss over all ranks' batches.

``--reference`` runs the same model in one process: the same initialisation,
all E experts, every rank's batch of each step (in rank order) and the plain
torch exchange ``ferrocoll.torch.moe.reference`` (the same capacity and drop
priority): the parallel run matches it step for step up to float rounding
(python/tests/test_moe_torch.py checks it).
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import time
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

#: The seeds' directory: ``FERROCOLL_SEEDS``, else ``../shared/seeds`` next to the repository.
SEEDS = os.environ.get(
    "FERROCOLL_SEEDS",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared", "seeds"),
)


@dataclass(frozen=True)
class Config:
    """The model, the data and the training run."""

    ranks: int = 4
    dim: int = 64
    heads: int = 4
    seq: int = 64
    batch: int = 8  # sequences per rank per step
    experts: int = 8
    ffn: int = 128
    topk: int = 2
    capacity_factor: Optional[float] = 1.25
    aux: float = 0.01  # weight of the load-balancing loss
    optimizer: str = "adam"
    lr: float = 3e-3
    seed: int = 0
    seeds_dir: str = SEEDS

    @staticmethod
    def tiny() -> "Config":
        """A model small enough for a test: a few steps in seconds on 2 cores;
        plain SGD with momentum (Adam's first steps divide by the gradients'
        own magnitude, which magnifies rounding in entries that are ~0)."""
        return Config(
            dim=16, heads=2, seq=16, batch=2, experts=8, ffn=32, capacity_factor=1.0, optimizer="sgd", lr=0.1
        )


def load_text(seeds_dir: str) -> str:
    """The seeds' text: every file, in name order, a file's ``.clean.txt`` copy
    in place of its raw one where both exist."""
    files = sorted(glob.glob(os.path.join(seeds_dir, "*.txt")))
    cleaned = {f[: -len(".clean.txt")] for f in files if f.endswith(".clean.txt")}
    keep = [f for f in files if f.endswith(".clean.txt") or f[: -len(".txt")] not in cleaned]
    if not keep:
        raise FileNotFoundError(f"no .txt files in {seeds_dir}")
    parts = []
    for f in keep:
        with open(f, encoding="utf-8") as fh:
            parts.append(fh.read())
    return "\n".join(parts)


class Data:
    """Character ids of the text, 90% for training and the last 10% held out."""

    def __init__(self, cfg: Config) -> None:
        text = load_text(cfg.seeds_dir)
        self.vocab = sorted(set(text))
        index = {c: i for i, c in enumerate(self.vocab)}
        ids = torch.tensor([index[c] for c in text], dtype=torch.int64)
        cut = int(len(ids) * 0.9)
        self.train, self.val = ids[:cut], ids[cut:]
        self.cfg = cfg

    def batch(self, step: int, rank: Optional[int]) -> Tuple[torch.Tensor, torch.Tensor]:
        """Step ``step``'s windows of rank ``rank`` (``None``: every rank's, in
        rank order, as the reference takes them): inputs and next characters."""
        cfg = self.cfg
        g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        starts = torch.randint(0, len(self.train) - cfg.seq - 1, (cfg.ranks * cfg.batch,), generator=g)
        if rank is not None:
            starts = starts[rank * cfg.batch : (rank + 1) * cfg.batch]
        x = torch.stack([self.train[s : s + cfg.seq] for s in starts.tolist()])
        y = torch.stack([self.train[s + 1 : s + cfg.seq + 1] for s in starts.tolist()])
        return x, y

    def val_batches(self, rank: Optional[int], windows: int = 64) -> Tuple[torch.Tensor, torch.Tensor]:
        """Fixed held-out windows, split over the ranks as training batches are."""
        cfg = self.cfg
        step = max(1, (len(self.val) - cfg.seq - 1) // windows)
        starts = list(range(0, step * windows, step))
        if rank is not None:
            per = windows // cfg.ranks
            starts = starts[rank * per : (rank + 1) * per]
        x = torch.stack([self.val[s : s + cfg.seq] for s in starts])
        y = torch.stack([self.val[s + 1 : s + cfg.seq + 1] for s in starts])
        return x, y


class Expert(nn.Module):
    """A small MLP: dim -> ffn -> dim."""

    def __init__(self, dim: int, ffn: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, ffn)
        self.down = nn.Linear(ffn, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class MoeTransformer(nn.Module):
    """The language model; ``local`` names the experts this process holds
    (all of them in the reference)."""

    def __init__(self, cfg: Config, vocab: int, local: range) -> None:
        super().__init__()
        torch.manual_seed(cfg.seed)
        self.cfg = cfg
        self.tok = nn.Embedding(vocab, cfg.dim)
        self.pos = nn.Embedding(cfg.seq, cfg.dim)
        self.ln1 = nn.LayerNorm(cfg.dim)
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.proj = nn.Linear(cfg.dim, cfg.dim)
        self.ln2 = nn.LayerNorm(cfg.dim)
        self.router = nn.Linear(cfg.dim, cfg.experts, bias=False)
        # Every expert is made (the same random draws on every rank), then
        # the ones held elsewhere are dropped.
        every = [Expert(cfg.dim, cfg.ffn) for _ in range(cfg.experts)]
        self.experts = nn.ModuleDict({f"e{e}": every[e] for e in local})
        self.ln_f = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, vocab)
        self.dropped = 0

    def expert_parameters(self) -> List[nn.Parameter]:
        return list(self.experts.parameters())

    def shared_parameters(self) -> List[nn.Parameter]:
        ours = {id(p) for p in self.expert_parameters()}
        return [p for p in self.parameters() if id(p) not in ours]

    def attention(self, h: torch.Tensor) -> torch.Tensor:
        b, s, d = h.shape
        q, k, v = self.qkv(h).view(b, s, 3, self.cfg.heads, d // self.cfg.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(b, s, d))

    def moe(self, h: torch.Tensor, distributed: bool, chunks: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """The MoE feed-forward of ``h`` (batch x seq x dim) and the
        load-balancing loss, averaged over ``chunks`` equal slices of the batch
        (the ranks' batches, for the reference)."""
        from ferrocoll.torch import moe

        cfg = self.cfg
        flat = h.reshape(-1, cfg.dim)
        probs = F.softmax(self.router(flat), dim=-1)
        w, idx = probs.topk(cfg.topk, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        if distributed:
            rows, handle = moe.dispatch(
                flat, idx, w, num_experts=cfg.experts, capacity_factor=cfg.capacity_factor
            )
            parts = handle.split(rows)
            outs = [self.experts[f"e{handle.first_expert + i}"](p) for i, p in enumerate(parts)]
            y = moe.combine(torch.cat(outs), handle)
            self.dropped += handle.dropped_everywhere
        else:
            fns = [self.experts[f"e{e}"] for e in range(cfg.experts)]
            y, kept = moe.reference(flat, idx, w, fns, cfg.capacity_factor)
            self.dropped += int((~kept).sum())
        # Switch's load-balancing loss: E * sum_e (share of first choices to e)
        # * (mean router probability of e), per rank's batch.
        aux = []
        for p, i in zip(probs.chunk(chunks), idx.chunk(chunks)):
            share = F.one_hot(i[:, 0], cfg.experts).float().mean(0)
            aux.append(cfg.experts * (share * p.mean(0)).sum())
        return y.view_as(h), torch.stack(aux).mean()

    def forward(
        self, x: torch.Tensor, y: torch.Tensor, distributed: bool, chunks: int = 1
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """(loss with the balancing term, cross-entropy alone)."""
        pos = torch.arange(x.shape[1])
        h = self.tok(x) + self.pos(pos)
        h = h + self.attention(self.ln1(h))
        m, aux = self.moe(self.ln2(h), distributed, chunks)
        h = h + m
        logits = self.head(self.ln_f(h))
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        return ce + self.cfg.aux * aux, ce


def _optimizer(cfg: Config, params: List[nn.Parameter]) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=0.9)
    return torch.optim.Adam(params, lr=cfg.lr)


def _average_shared_gradients(model: MoeTransformer) -> None:
    """Sums the replicated parameters' gradients over the ranks in one
    allreduce (the ranks already backpropagated loss / P, so the sum is the
    average)."""
    shared = model.shared_parameters()
    flat = torch.cat([p.grad.reshape(-1) for p in shared])
    dist.all_reduce(flat)
    at = 0
    for p in shared:
        n = p.numel()
        p.grad.copy_(flat[at : at + n].view_as(p.grad))
        at += n


def train(
    cfg: Config,
    steps: int,
    distributed: bool,
    log_every: int = 0,
    eval_every: int = 0,
    ddp: bool = False,
) -> Dict[str, Any]:
    """Trains for ``steps`` steps, as one rank of ``cfg.ranks`` (``distributed``,
    under a launcher) or as the single-process reference. With ``ddp`` the
    replicated parameters' gradients are averaged by torch's
    DistributedDataParallel (its bucketed allreduces overlap the backward pass,
    MoE's backward exchanges included) instead of one allreduce after it.
    Returns the loss of every step (the mean over all ranks' batches), the
    parameters this process holds, the pairs dropped in all, the held-out
    losses and the time taken."""
    own_group = False
    if distributed:
        import ferrocoll.torch  # noqa: F401  (registers the "ferrocoll" backend)

        if not dist.is_initialized():
            dist.init_process_group("ferrocoll")
            own_group = True
        if dist.get_world_size() != cfg.ranks:
            cfg = replace(cfg, ranks=dist.get_world_size())
        rank = dist.get_rank()
        per = cfg.experts // cfg.ranks
        local = range(rank * per, (rank + 1) * per)
    else:
        rank, local = 0, range(cfg.experts)
    data = Data(cfg)
    model = MoeTransformer(cfg, len(data.vocab), local)
    opt = _optimizer(cfg, list(model.parameters()))
    forward: Any = model
    if distributed and ddp:
        from torch.nn.parallel import DistributedDataParallel as DDP

        # The experts are this rank's own: DDP must not average them.
        experts = [f"experts.{name}" for name, _ in model.experts.named_parameters()]
        DDP._set_params_and_buffers_to_ignore_for_model(model, experts)
        forward = DDP(model, bucket_cap_mb=0.25)
    losses: List[float] = []
    val: List[Tuple[int, float]] = []
    start = time.perf_counter()
    for step in range(steps):
        x, y = data.batch(step, rank if distributed else None)
        loss, ce = forward(x, y, distributed, chunks=1 if distributed else cfg.ranks)
        opt.zero_grad()
        if distributed:
            if ddp:
                # DDP averages the replicated gradients; an expert's gradient
                # is the sum of every rank's d loss_r: averaged here.
                loss.backward()
                for p in model.expert_parameters():
                    if p.grad is not None:
                        p.grad /= cfg.ranks
            else:
                (loss / cfg.ranks).backward()
                _average_shared_gradients(model)
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            losses.append(mean.item() / cfg.ranks)
        else:
            loss.backward()
            losses.append(loss.item())
        opt.step()
        if eval_every and (step + 1) % eval_every == 0:
            val.append((step + 1, evaluate(model, data, distributed, rank)))
        if log_every and rank == 0 and (step + 1) % log_every == 0:
            last = f", held-out {val[-1][1]:.4f}" if val and val[-1][0] == step + 1 else ""
            print(
                f"step {step + 1}: loss {losses[-1]:.4f}{last} ({time.perf_counter() - start:.1f} s)",
                flush=True,
            )
    elapsed = time.perf_counter() - start
    out = {
        "losses": losses,
        "params": {k: v.detach().clone() for k, v in model.named_parameters()},
        "dropped": model.dropped,
        "val": val,
        "seconds": elapsed,
        "vocab": len(data.vocab),
    }
    if own_group:
        dist.destroy_process_group()
    return out


def evaluate(model: MoeTransformer, data: Data, distributed: bool, rank: int) -> float:
    """Mean cross-entropy on the held-out windows (every rank its share)."""
    x, y = data.val_batches(rank if distributed else None)
    with torch.no_grad():
        _, ce = model(x, y, distributed, chunks=1 if distributed else model.cfg.ranks)
        if distributed:
            ce = ce.clone()
            dist.all_reduce(ce)
            return ce.item() / model.cfg.ranks
        return ce.item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument(
        "--reference", action="store_true", help="one process, every expert and every rank's batch"
    )
    ap.add_argument("--ranks", type=int, default=4, help="ranks the reference stands for")
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--capacity-factor", type=float, default=1.25)
    ap.add_argument("--ddp", action="store_true", help="average the replicated gradients with torch's DDP")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = Config(ranks=args.ranks, capacity_factor=args.capacity_factor)
    out = train(cfg, args.steps, not args.reference, args.log_every, args.eval_every, args.ddp)
    first = sum(out["losses"][:10]) / min(10, len(out["losses"]))
    last = sum(out["losses"][-10:]) / min(10, len(out["losses"]))
    if args.reference or int(os.environ.get("RANK", "0")) == 0:
        held = ", ".join(f"{s}: {v:.4f}" for s, v in out["val"])
        print(
            f"summary: {args.steps} steps, vocab {out['vocab']}, loss mean of first 10 steps {first:.4f}, "
            f"of last 10 {last:.4f} (uniform guess: ln {out['vocab']} = {math.log(out['vocab']):.4f}); "
            f"held-out by step {{{held}}}; pairs dropped {out['dropped']}; {out['seconds']:.1f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
