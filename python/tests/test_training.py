"""DDP and FSDP2 train on ferrocoll to the same parameters as on gloo.

Tolerance: the two backends sum gradients in different orders (ferrocoll's
algorithm is chosen by its cost model; gloo's is its own), so each averaged
gradient may differ in the last bit of float32 (relative 6e-8 per addition);
50 SGD steps of a small model keep that drift near 1e-6, and we allow
rtol 1e-4, atol 1e-5: orders of magnitude above rounding, orders below any
real error (a dropped or doubled gradient moves parameters by ~1e-2).
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import pytest

import ranks

torch = pytest.importorskip("torch")


def _model() -> "torch.nn.Module":
    import torch

    torch.manual_seed(1234)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 8),
    )


# Keeps each gloo rank's default process group alive until the process ends
# (hard, with os._exit: see ``ranks.run``). Torch's gloo group joins its worker
# threads in its destructor; when a future callback (PowerSGD's closures hold
# the group) drops the last reference on one of those threads, the join throws
# EDEADLK and the rank aborts ("Resource deadlock avoided", seen once in CI).
_GLOO_GROUPS_KEPT: List[Any] = []


def _destroy(backend: str) -> None:
    """``destroy_process_group``, keeping gloo's group object alive (above)."""
    import torch.distributed as dist

    if backend == "gloo":
        _GLOO_GROUPS_KEPT.append(dist.group.WORLD)
    dist.destroy_process_group()


def train_ddp(backend: str, steps: int) -> Dict[str, "torch.Tensor"]:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ferrocoll.torch  # noqa: F401

    dist.init_process_group(backend)
    r = dist.get_rank()
    # Small buckets so a step issues several allreduces that overlap backward.
    model = DDP(_model(), bucket_cap_mb=0.01)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(100 + r)
    for _ in range(steps):
        x = torch.randn(16, 32, generator=gen)
        y = torch.randn(16, 8, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    params = {k: v.detach().clone() for k, v in model.module.state_dict().items()}
    _destroy(backend)
    return params


def _on_both(n: int, fn: Any, *args: Any, **kw: Any) -> Tuple[List[Any], List[Any]]:
    """``fn(backend, *args)`` on ``n`` ranks with ferrocoll, then with gloo
    (whose ranks end hard: see ``ranks.run``); the two lists of results."""
    ours = ranks.run(n, fn, "ferrocoll", *args, **kw)
    theirs = ranks.run(n, fn, "gloo", *args, hard_exit=True, **kw)
    return ours, theirs


def _assert_close_per_rank(ours: List[Any], theirs: List[Any]) -> None:
    """Every rank's tensors on ferrocoll are close to the same rank's on gloo."""
    for rank, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert _close(a, b) == [], f"rank {rank}"


def _close(a: Dict[str, "torch.Tensor"], b: Dict[str, "torch.Tensor"]) -> List[str]:
    import torch

    return [
        f"{k}: max diff {(a[k] - b[k]).abs().max().item():.3g}"
        for k in a
        if not torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-5)
    ]


@pytest.mark.parametrize("n", [2, 3])
def test_ddp_matches_gloo(n: int) -> None:
    ours, theirs = _on_both(n, train_ddp, 50)
    untrained = {k: v for k, v in _model().state_dict().items()}
    _assert_close_per_rank(ours, theirs)
    for rank in range(n):
        # The ranks agree with each other, and training moved the parameters.
        assert _close(ours[rank], ours[0]) == []
    assert _close(ours[0], untrained) != []


def train_fsdp2(backend: str, steps: int) -> Dict[str, "torch.Tensor"]:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    import ferrocoll.torch  # noqa: F401

    dist.init_process_group(backend)
    r = dist.get_rank()
    model = _model()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(200 + r)
    for _ in range(steps):
        x = torch.randn(16, 32, generator=gen)
        y = torch.randn(16, 8, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    # Gather the full parameters (a collective) to compare.
    full = {k: v.full_tensor().detach().clone() for k, v in model.state_dict().items()}
    _destroy(backend)
    return full


def test_fsdp2_matches_gloo() -> None:
    ours, theirs = _on_both(2, train_fsdp2, 20)
    _assert_close_per_rank(ours, theirs)


def train_patterns(backend: str) -> Dict[str, "torch.Tensor"]:
    """What other trainers do: DDP with the fp16 compression comm hook,
    find_unused_parameters and no_sync; HSDP (FSDP2 over a 2 x (n/2) device
    mesh, whose groups come from new_group)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ferrocoll.torch  # noqa: F401

    dist.init_process_group(backend)
    r, n = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(300 + r)
    ddp = DDP(_model(), find_unused_parameters=True)
    ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step in range(6):
        x, y = torch.randn(8, 32, generator=gen), torch.randn(8, 8, generator=gen)
        if step % 3 == 0:
            with ddp.no_sync():
                torch.nn.functional.mse_loss(ddp(x), y).backward()
            continue
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        opt.zero_grad()
    out = {f"ddp.{k}": v.detach().clone() for k, v in ddp.module.state_dict().items()}
    mesh = init_device_mesh("cpu", (2, n // 2), mesh_dim_names=("replicate", "shard"))
    model = _model()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(4):
        x, y = torch.randn(8, 32, generator=gen), torch.randn(8, 8, generator=gen)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    out.update({f"hsdp.{k}": v.full_tensor().detach().clone() for k, v in model.state_dict().items()})
    _destroy(backend)
    return out


def test_comm_hooks_unused_parameters_and_hsdp_match_gloo() -> None:
    ours, theirs = _on_both(4, train_patterns, timeout=400)
    _assert_close_per_rank(ours, theirs)


def train_join_and_torch_hooks(backend: str) -> Dict[str, "torch.Tensor"]:
    """DDP under ``Join`` with uneven inputs (the reducer holds the forward
    pass's all_reduce from C++ and waits on it at the end of the backward
    pass), then torch's PowerSGD hook (its future callbacks issue an
    all_reduce and wait for its future inside the callback, on the thread
    that resolved the first)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ferrocoll.torch  # noqa: F401

    dist.init_process_group(backend)
    r = dist.get_rank()
    gen = torch.Generator().manual_seed(300 + r)
    out: Dict[str, "torch.Tensor"] = {}
    joined = DDP(_model(), bucket_cap_mb=0.01)
    opt = torch.optim.SGD(joined.parameters(), lr=0.05)
    with Join([joined]):
        for _ in range(4 + 2 * r):
            x, y = torch.randn(16, 32, generator=gen), torch.randn(16, 8, generator=gen)
            opt.zero_grad()
            torch.nn.functional.mse_loss(joined(x), y).backward()
            opt.step()
    out.update({f"join.{k}": v.detach().clone() for k, v in joined.module.state_dict().items()})
    # One bucket: with several, PowerSGD's callbacks issue their nested
    # all_reduces from several threads in an order that differs by rank
    # (gloo then hangs; ferrocoll ends every rank with a Mismatch).
    hooked = DDP(_model())
    state = powerSGD_hook.PowerSGDState(
        process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2
    )
    hooked.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    opt = torch.optim.SGD(hooked.parameters(), lr=0.05)
    for _ in range(5):
        x, y = torch.randn(16, 32, generator=gen), torch.randn(16, 8, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(hooked(x), y).backward()
        opt.step()
    out.update({f"powersgd.{k}": v.detach().clone() for k, v in hooked.module.state_dict().items()})
    _destroy(backend)
    return out


def test_join_with_uneven_inputs_and_torch_powersgd_match_gloo() -> None:
    ours, theirs = _on_both(3, train_join_and_torch_hooks, timeout=300)
    for a, b in zip(ours, theirs):
        assert _close(a, b) == []


def sparse_training(backend: str) -> Dict[str, "torch.Tensor"]:
    """DDP over a model with ``nn.Embedding(sparse=True)`` (its gradient is a
    sparse COO tensor, which DDP allreduces on its own), then direct sparse
    all_reduce calls: hybrid (sparse and dense dimensions), a rank with no
    entries, and a second (default) stream of dense calls around them."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ferrocoll.torch  # noqa: F401

    dist.init_process_group(backend)
    r, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(7)

    class Bag(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(50, 8, sparse=True)
            self.head = torch.nn.Linear(8, 1)

        def forward(self, ids: "torch.Tensor") -> "torch.Tensor":
            return self.head(self.emb(ids).mean(1))

    model = DDP(Bag())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(400 + r)
    for _ in range(8):
        ids = torch.randint(0, 50, (6, 4), generator=gen)
        opt.zero_grad()
        model(ids).pow(2).mean().backward()
        opt.step()
    out = {f"ddp.{k}": v.detach().clone() for k, v in model.module.state_dict().items()}
    # Rank r holds entries at rows 0..r-1 (rank 0 none), each a 2x3 dense block.
    rows = torch.arange(r, dtype=torch.int64).reshape(1, r)
    t = torch.sparse_coo_tensor(rows, torch.full((r, 2, 3), float(r + 1)), (n, 2, 3))
    before = torch.ones(5)
    dist.all_reduce(before)
    dist.all_reduce(t)
    after = torch.ones(5) * r
    work = dist.all_reduce(after, async_op=True)
    work.wait()
    out["hybrid"] = t.to_dense()
    out["dense_around"] = torch.cat([before, after])
    _destroy(backend)
    return out


def test_sparse_gradients_train_like_gloo() -> None:
    """The parameters within the module's tolerance (the dense head's
    gradient is summed in another order than gloo's); the direct calls,
    whose values are small integers, exactly."""
    import torch

    ours, theirs = _on_both(3, sparse_training)
    _assert_close_per_rank(ours, theirs)
    for rank in range(3):
        for k in ("hybrid", "dense_around"):
            assert torch.equal(ours[rank][k], theirs[rank][k]), f"rank {rank}: {k}"
    torch.manual_seed(7)
    untrained = torch.nn.Embedding(50, 8, sparse=True).weight.detach()
    assert not torch.allclose(ours[0]["ddp.emb.weight"], untrained), "training moved no embedding row"
    # Row 0 is held by ranks 1 and 2 (2 + 3), row 1 by rank 2 only.
    assert ours[0]["hybrid"][0].eq(5.0).all() and ours[0]["hybrid"][1].eq(3.0).all()
    assert ours[0]["hybrid"][2].eq(0.0).all()


def sparse_mismatch(backend: str) -> str:
    import torch
    import torch.distributed as dist

    import ferrocoll
    import ferrocoll.torch  # noqa: F401

    dist.init_process_group(backend)
    r = dist.get_rank()
    shape = (4, 2) if r == 0 else (4, 3)
    t = torch.sparse_coo_tensor(torch.zeros(1, 1, dtype=torch.int64), torch.ones(1, shape[1]), shape)
    try:
        dist.all_reduce(t)
    except ferrocoll.Error as e:
        return f"{type(e).__name__}: {e}"
    finally:
        dist.destroy_process_group()
    return "no error"


def test_sparse_allreduce_of_different_shapes_is_an_error() -> None:
    got = ranks.run(2, sparse_mismatch, "ferrocoll")
    for text in got:
        assert text.startswith("Mismatch: ") and "sparse allreduce" in text, text


def compiled_training(backend: str) -> Dict[str, "torch.Tensor"]:
    """``torch.compile`` over a DDP model (Dynamo traces DDP's pre-forward,
    which calls the group's broadcast) and over a function with a functional
    all_reduce; the ``aot_eager`` backend needs no C compiler."""
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fc
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ferrocoll.torch  # noqa: F401

    dist.init_process_group(backend)
    r = dist.get_rank()
    model = DDP(_model())
    step = torch.compile(model, backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(500 + r)
    for _ in range(4):
        x, y = torch.randn(16, 32, generator=gen), torch.randn(16, 8, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(step(x), y).backward()
        opt.step()
    out = {k: v.detach().clone() for k, v in model.module.state_dict().items()}

    @torch.compile(backend="aot_eager")
    def doubled_sum(t: "torch.Tensor") -> "torch.Tensor":
        return fc.all_reduce(t * 2, "sum", dist.group.WORLD) + 1

    out["functional"] = doubled_sum(torch.full((4,), float(r + 1)))
    _destroy(backend)
    return out


def test_torch_compile_of_ddp_and_functional_collectives_matches_gloo() -> None:
    ours, theirs = _on_both(2, compiled_training, timeout=400)
    _assert_close_per_rank(ours, theirs)
    for rank in range(2):
        assert ours[rank]["functional"].tolist() == [7.0] * 4
