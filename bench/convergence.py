"""Convergence of DDP training under ferrocoll's compressed comm hooks (issue 17 item 6).

One rank of a DDP job (start it with a launcher; bench/convergence.sh does):

    ferrocoll run -n 4 -- python bench/convergence.py --task digits
    ferrocoll run -n 4 -- python bench/convergence.py --task lm

Every configuration (uncompressed, then each hook of ferrocoll.torch.hooks
with and without error feedback) trains the same model from the same seed on
the same data order, one after the other in one process group:

* ``digits``: an MLP on scikit-learn's digits (8x8 images, 10 classes; the
  data ship inside scikit-learn, nothing is downloaded; **needs
  scikit-learn**), 80/20 train/test split, each rank a quarter of the
  training set; test accuracy after ``--epochs`` epochs.
* ``lm``: a small character-level transformer LM on the text of
  ``--seeds`` (default ../shared/seeds, the readable ``*.clean.txt`` copy
  instead of its raw twin), the last 10% held out; validation loss (nats per
  character) after ``--steps`` steps.

Reported per configuration (rank 0, a markdown table and ``--json`` lines):
bytes this rank sent per step by the transports' own counters
(``HookState.bytes_sent``: the hook communicator's, plus those of the node
and rail communicators of the hierarchical form on 2+ hosts; over every step,
PowerSGD's uncompressed warm-up steps included), the part of them the
hierarchical form sent uncompressed within the host ("within host",
``HookState.local_bytes``; "-" for the plain allreduce, whose split by link is
not counted), the ratio of the uncompressed configuration's bytes to these, the final metric,
and the mean wall time of a training step (forward, backward with the hook's
communication, optimizer).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys
import time
from collections import Counter
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import ferrocoll.torch  # noqa: F401  (registers the backend)
from ferrocoll.torch import hooks

#: (label, factory, kwargs); each runs with error feedback on and off.
CODECS: List[Tuple[str, str, Dict[str, Any]]] = [
    ("fp16", "fp16", {}),
    ("bf16", "bf16", {}),
    ("int8", "int8", {}),
    ("onebit", "onebit", {}),
    ("topk 1%", "topk", {"fraction": 0.01}),
    ("randk 1%", "randk", {"fraction": 0.01}),
    ("powersgd r=4", "powersgd", {"rank": 4, "start_iter": 2}),
]


def configs(only: Optional[List[str]]) -> List[Tuple[str, Optional[bool], Callable[[], Any]]]:
    """(label, error feedback, factory) of every configuration, uncompressed first."""
    out: List[Tuple[str, Optional[bool], Callable[[], Any]]] = [("none", None, hooks.allreduce)]
    for label, name, kw in CODECS:
        if only and name not in only:
            continue
        for ef in (True, False):
            out.append(
                (label, ef, lambda name=name, kw=kw, ef=ef: getattr(hooks, name)(error_feedback=ef, **kw))
            )
    return out


# ---- digits -------------------------------------------------------------------


def digits_data(rank: int, world: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError:
        sys.exit("bench/convergence.py --task digits needs scikit-learn (pip install scikit-learn)")
    x, y = load_digits(return_X_y=True)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    xtr = torch.tensor(xtr / 16.0, dtype=torch.float32)
    xte = torch.tensor(xte / 16.0, dtype=torch.float32)
    ytr, yte = torch.tensor(ytr), torch.tensor(yte)
    return xtr[rank::world], ytr[rank::world], xte, yte


def digits_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def run_digits(args: argparse.Namespace, factory: Callable[[], Any], rank: int, world: int) -> Dict[str, Any]:
    xtr, ytr, xte, yte = digits_data(rank, world)
    model = DDP(digits_model())
    state, hook = factory()
    model.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    gen = torch.Generator().manual_seed(1)
    steps, busy = 0, 0.0
    # Every rank the same number of steps (its shard's size differs by one at most).
    per_epoch = len(xtr) // args.batch
    for _ in range(args.epochs):
        order = torch.randperm(len(xtr), generator=gen)
        for b in range(per_epoch):
            idx = order[b * args.batch : (b + 1) * args.batch]
            t = time.perf_counter()
            loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            busy += time.perf_counter() - t
            steps += 1
    with torch.no_grad():
        acc = (model.module(xte).argmax(1) == yte).float().mean().item()
    return {"metric": 100.0 * acc, "steps": steps, "step_time": busy / steps, "state": state}


# ---- character-level LM ------------------------------------------------------


def lm_text(seeds: str) -> str:
    files = sorted(glob.glob(os.path.join(seeds, "*.txt")))
    clean = {f.replace(".clean.txt", ".txt") for f in files if f.endswith(".clean.txt")}
    files = [f for f in files if f not in clean]
    if not files:
        sys.exit(f"bench/convergence.py --task lm: no *.txt under {seeds}")
    return "\n".join(open(f, encoding="utf-8", errors="replace").read() for f in files)


class CharLM(nn.Module):
    """A small causal transformer over characters (pre-norm, learned positions)."""

    def __init__(self, vocab: int, ctx: int, dim: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(ctx, dim))
        layer = nn.TransformerEncoderLayer(
            dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True
        )
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(ctx), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        h = self.tok(x) + self.pos[:t]
        h = self.body(h, mask=self.mask[:t, :t], is_causal=True)
        return self.head(self.norm(h))


def run_lm(args: argparse.Namespace, factory: Callable[[], Any], rank: int, world: int) -> Dict[str, Any]:
    text = lm_text(args.seeds)
    # The most frequent characters, the rest one "unknown" symbol.
    common = [c for c, _ in Counter(text).most_common(args.vocab - 1)]
    index = {c: i + 1 for i, c in enumerate(common)}
    data = torch.tensor([index.get(c, 0) for c in text], dtype=torch.long)
    cut = int(0.9 * len(data))
    train, val = data[:cut], data[cut:]
    ctx = args.ctx
    torch.manual_seed(0)
    model = DDP(CharLM(args.vocab, ctx, args.dim, args.layers, args.heads))
    state, hook = factory()
    model.register_comm_hook(state, hook)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr_lm, weight_decay=0.0)
    gen = torch.Generator().manual_seed(1000 + rank)
    busy = 0.0
    for _ in range(args.steps):
        starts = torch.randint(0, len(train) - ctx - 1, (args.batch_lm,), generator=gen)
        x = torch.stack([train[s : s + ctx] for s in starts])
        y = torch.stack([train[s + 1 : s + ctx + 1] for s in starts])
        t = time.perf_counter()
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        busy += time.perf_counter() - t
    # The same validation windows on every rank: evenly spaced over the held-out 10%.
    n = min(args.val_windows, (len(val) - 1) // ctx)
    with torch.no_grad():
        xs = torch.stack([val[i * ctx : (i + 1) * ctx] for i in range(n)])
        ys = torch.stack([val[i * ctx + 1 : (i + 1) * ctx + 1] for i in range(n)])
        vloss = F.cross_entropy(model.module(xs).reshape(-1, args.vocab), ys.reshape(-1)).item()
    return {"metric": vloss, "steps": args.steps, "step_time": busy / args.steps, "state": state}


# ---- driver ------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description="DDP convergence under ferrocoll's comm hooks (issue 17)")
    p.add_argument("--task", choices=["digits", "lm"], required=True)
    p.add_argument("--only", nargs="*", help="hook names to run (default: all), besides the uncompressed one")
    p.add_argument("--json", help="append one JSON line per configuration here (rank 0)")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch", type=int, default=32, help="digits: batch per rank")
    p.add_argument("--lr", type=float, default=0.2, help="digits: SGD learning rate")
    p.add_argument(
        "--momentum",
        type=float,
        default=0.0,
        help="digits: SGD momentum (0: plain SGD, the setting of the EF analyses)",
    )
    p.add_argument("--seeds", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "seeds"))
    p.add_argument("--steps", type=int, default=400, help="lm: training steps")
    p.add_argument("--batch-lm", type=int, default=8, help="lm: sequences per rank and step")
    p.add_argument("--ctx", type=int, default=64)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=512, help="lm: most frequent characters kept (+1 unknown)")
    p.add_argument("--lr-lm", type=float, default=3e-3, help="lm: AdamW learning rate")
    p.add_argument("--val-windows", type=int, default=64)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("ferrocoll", timeout=timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    run = run_digits if args.task == "digits" else run_lm
    metric = "test accuracy (%)" if args.task == "digits" else "val loss (nats/char)"
    rows: List[Dict[str, Any]] = []
    base_bytes = None
    base_metric = None
    if rank == 0:
        transport = dist.group.WORLD._comm.transport  # type: ignore[union-attr]
        print(f"# {args.task}: {world} ranks, transport {transport}, {vars(args)}", flush=True)
        print(
            f"| hook | EF | bytes/step (rank 0) | within host | ratio | {metric} | vs none | step time (ms) |"
        )
        print("|---|---|---|---|---|---|---|---|", flush=True)
    # A short unreported run first, so that the first configuration's step
    # time does not carry the start-up (allocations, page faults, threads).
    warm = argparse.Namespace(**{**vars(args), "epochs": 1, "steps": 5})
    run(warm, hooks.allreduce, rank, world)
    for label, ef, factory in configs(args.only):
        dist.barrier()
        res = run(args, factory, rank, world)
        state = res.pop("state")
        per_step = state.bytes_sent() / res["steps"]
        if base_bytes is None:
            base_bytes, base_metric = per_step, res["metric"]
        ratio = base_bytes / per_step if per_step else math.inf
        delta = res["metric"] - base_metric
        if args.task == "lm":
            delta = 100.0 * delta / base_metric  # percent of the uncompressed loss
        row = {
            "task": args.task,
            "hook": label,
            "error_feedback": ef,
            "bytes_per_step": per_step,
            "local_bytes_per_step": state.local_bytes() / res["steps"],
            "ratio": ratio,
            "metric": res["metric"],
            "delta": delta,
            "step_time_ms": 1e3 * res["step_time"],
            "steps": res["steps"],
            "world": world,
        }
        rows.append(row)
        if rank == 0:
            ef_s = "-" if ef is None else ("on" if ef else "off")
            unit = "pt" if args.task == "digits" else "%"
            digits = 2 if args.task == "digits" else 4
            # The hierarchical form's uncompressed bytes within the host; the
            # plain allreduce's split by link is not counted ("-").
            local = f"{row['local_bytes_per_step']:,.0f}" if label != "none" else "-"
            print(
                f"| {label} | {ef_s} | {per_step:,.0f} | {local} | {ratio:.1f}x | {res['metric']:.{digits}f} "
                f"| {delta:+.2f} {unit} | {row['step_time_ms']:.1f} |",
                flush=True,
            )
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(row) + "\n")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
