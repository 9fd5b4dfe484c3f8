"""Mixture-of-experts dispatch and combine on torch tensors, differentiable.

>>> expert_in, handle = moe.dispatch(x, topk_idx, topk_weights, num_experts=8, capacity_factor=1.25)
>>> outs = torch.cat([f(rows) for f, rows in zip(my_experts, handle.split(expert_in))])
>>> y = moe.combine(outs, handle)

``dispatch`` sends every (token, choice) pair's row to the rank holding its
expert (``num_experts / size`` experts a rank, contiguous: rank ``r`` holds
``r*E/P .. (r+1)*E/P``) and returns the rows this rank's experts received,
each local expert's rows contiguous (by source rank, then token); ``combine``
returns the experts' outputs to their tokens and forms

    y_t = sum_j g_tj * Expert_{e_tj}(x_t)     over the choices j that were kept.

Both are ferrocoll calls on the process group's communicator
(:class:`ferrocoll.torch.ProcessGroupFerrocoll`): the count exchange, the
capacity decision (``ferrocoll::moe``: GShard's priority, every rank's first
choices before any second choice, then source rank, then token position), the
schedule ``auto`` picks (the cost model's, then, for short exchanges, the
winner of a race among the candidates it predicts within 2x, run on the first
calls of each exchange size; ``FERROCOLL_DEBUG=tune`` explains it) and the
rows' all-to-all-v are the Rust library's; the GIL is released while they
run.

**Where the weights are applied.** At the source, in ``combine``, after the
rows come back: the exchange carries each choice's expert output unweighted
(``MoeDispatcher.combine_pairs``) and ``combine`` forms the weighted sum in
torch (in float32 for float16 / bfloat16 rows, rounded once). Dropped choices
come back as zero rows, so they contribute nothing and their weight gets a zero
gradient; the kept weights are not renormalised (the caller's residual path
carries a dropped token, as in GShard and Switch). Applying the weights at the
source keeps the expert side weight-free and makes the routing-weight gradient
local: ``dL/dg_tj = <dL/dy_t, Expert_{e_tj}(x_t)>`` with no exchange.

**Autograd.** Three functions, each the other's adjoint:

* dispatch (``x`` -> expert rows): backward is a combine of the rows'
  gradients *without* weights: each received row's gradient returns to its
  source and sums over the token's choices;
* combine-pairs (expert rows -> one row per (token, choice)): backward is a
  dispatch of one gradient row per choice (``dispatch_pairs``), which for
  ``combine`` is the output gradient scaled by each choice's weight;
* dispatch-pairs: backward is combine-pairs.

Since each backward is itself one of these functions, double backward works.
The backward passes are collectives: every rank must run backward through
every dispatch and combine it ran forward (as every rank of DDP runs backward),
in the same order. They run on the thread that calls them (autograd's) and
take their place in the group's order of calls when issued, so DDP's
asynchronous allreduces on the same group may overlap them
(python/examples/moe_transformer.py ``--ddp``, tested).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist

import ferrocoll
from ferrocoll import _ferrocoll as _core

from .backend import ProcessGroupFerrocoll

__all__ = ["dispatch", "combine", "MoeHandle", "reference"]

#: Element types of the rows, by torch dtype.
_CODES = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
}


def _fail(msg: str) -> ferrocoll.InvalidArgument:
    return ferrocoll.InvalidArgument(f"ferrocoll.torch.moe: {msg}")


def _backend(group: Optional[Any]) -> ProcessGroupFerrocoll:
    """The ferrocoll process group under ``group`` (default: the world)."""
    if group is None:
        if not dist.is_initialized():
            raise _fail("no process group: call torch.distributed.init_process_group('ferrocoll') first")
        group = dist.group.WORLD
    if isinstance(group, ProcessGroupFerrocoll):
        return group
    pg = group._get_backend(torch.device("cpu"))
    if not isinstance(pg, ProcessGroupFerrocoll):
        raise _fail(f"the group's CPU backend is {type(pg).__name__}, not ferrocoll")
    return pg


def _dispatcher(
    pg: ProcessGroupFerrocoll,
    experts: int,
    hidden: int,
    topk: int,
    capacity_factor: Optional[float],
    policy: Optional[str],
    schedule: str,
) -> Any:
    """The group's dispatcher of this shape, made once (its state, e.g. the
    two-level sub-communicators and its buffer pool, is kept between calls)."""
    cache: Dict[Tuple[Any, ...], Any] = pg.__dict__.setdefault("_moe_dispatchers", {})
    key = (experts, hidden, topk, capacity_factor, policy, schedule)
    d = cache.get(key)
    if d is None:
        d = _core.MoeDispatcher(pg._comm, experts, hidden, topk, capacity_factor, policy, schedule)
        cache[key] = d
    return d


def _ptr(t: torch.Tensor) -> Tuple[int, int]:
    return (t.data_ptr(), t.numel())


def _tensor(rows: Any, dtype: torch.dtype) -> torch.Tensor:
    """A ``Rows`` buffer as a tensor of ``dtype``, zero-copy (the tensor keeps
    the buffer alive)."""
    t = torch.from_numpy(np.asarray(rows))
    return t.view(torch.bfloat16) if dtype == torch.bfloat16 else t


class _State:
    """What the autograd functions of one dispatch share: the dispatcher, the
    Rust handle (set by the dispatch's forward) and the rows' dtype."""

    __slots__ = ("dispatcher", "core", "counts", "dtype", "code")

    def __init__(self, dispatcher: Any, dtype: torch.dtype) -> None:
        self.dispatcher = dispatcher
        self.core: Any = None
        self.counts: List[int] = []
        self.dtype = dtype
        self.code = _CODES[dtype]


def _sum_choices(v: torch.Tensor) -> torch.Tensor:
    """``v`` (T x k x H) summed over k: by slices (4x faster on CPU than
    ``sum(1)`` for small k), in float32 for 16-bit rows beyond two terms."""
    wide = v.dtype in (torch.float16, torch.bfloat16) and v.shape[1] > 2
    out = v[:, 0].to(torch.float32 if wide else v.dtype, copy=True)
    for j in range(1, v.shape[1]):
        out += v[:, j]
    return out.to(v.dtype)


class _Dispatch(torch.autograd.Function):
    """x (T x H) -> the rows this rank's experts receive (R x H)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor, st: _State) -> torch.Tensor:
        rows, counts, core = st.dispatcher.dispatch(_ptr(x), _ptr(idx), _ptr(w), st.code)
        st.core, st.counts = core, counts
        ctx.st = st
        ctx.shape = x.shape
        return _tensor(rows, st.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        # Each received row's gradient back to its source, summed over the
        # token's choices (unweighted: dispatch copies x_t unscaled).
        st: _State = ctx.st
        tokens, hidden = ctx.shape
        pairs = _CombinePairs.apply(grad, st)
        return _sum_choices(pairs.view(tokens, st.core.topk, hidden)), None, None, None


class _CombinePairs(torch.autograd.Function):
    """Expert rows (R x H) -> one row per (token, choice) (T*k x H), zeros
    where the choice was dropped."""

    @staticmethod
    def forward(ctx: Any, outputs: torch.Tensor, st: _State) -> torch.Tensor:
        ctx.st = st
        outputs = outputs.contiguous()
        return _tensor(st.dispatcher.combine_pairs(_ptr(outputs), st.core, st.code), st.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], None]:
        return _DispatchPairs.apply(grad, ctx.st), None


class _DispatchPairs(torch.autograd.Function):
    """One row per (token, choice) (T*k x H) -> the expert rows (R x H): the
    adjoint of :class:`_CombinePairs`."""

    @staticmethod
    def forward(ctx: Any, pair_rows: torch.Tensor, st: _State) -> torch.Tensor:
        ctx.st = st
        pair_rows = pair_rows.contiguous()
        rows, _ = st.dispatcher.dispatch_pairs(_ptr(pair_rows), st.core, st.code)
        return _tensor(rows, st.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], None]:
        return _CombinePairs.apply(grad, ctx.st), None


class MoeHandle:
    """What :func:`dispatch` decided, and what :func:`combine` needs.

    Attributes: ``tokens`` (T), ``topk`` (k), ``hidden`` (H), ``weights`` (the
    ``topk_weights`` tensor given to dispatch, with its autograd graph),
    ``topk_idx``, ``expert_counts`` (rows each local expert received),
    ``first_expert`` (global index of this rank's first expert).
    """

    def __init__(self, st: _State, weights: torch.Tensor, topk_idx: torch.Tensor, first_expert: int) -> None:
        self._st = st
        self.weights = weights
        self.topk_idx = topk_idx
        self.first_expert = first_expert

    @property
    def tokens(self) -> int:
        """Tokens this rank dispatched."""
        return int(self._st.core.tokens)

    @property
    def topk(self) -> int:
        """Choices per token."""
        return int(self._st.core.topk)

    @property
    def hidden(self) -> int:
        """Elements per row."""
        return int(self._st.core.hidden)

    @property
    def expert_counts(self) -> List[int]:
        """Rows each of this rank's experts received, local expert order."""
        return list(self._st.counts)

    @property
    def capacity(self) -> Optional[int]:
        """Every expert's capacity in rows (``drop``); None when dropless."""
        return self._st.core.capacity

    @property
    def dropped(self) -> torch.Tensor:
        """This rank's dropped pairs: an ``n x 3`` int64 tensor of (token,
        choice, expert), by token then choice."""
        d = self._st.core.dropped
        return torch.tensor(d, dtype=torch.int64).reshape(len(d), 3)

    @property
    def kept(self) -> torch.Tensor:
        """A ``T x k`` bool tensor: whether token t's choice j was kept."""
        mask = torch.ones(self.tokens, self.topk, dtype=torch.bool)
        d = self.dropped
        if len(d):
            mask[d[:, 0], d[:, 1]] = False
        return mask

    @property
    def dropped_everywhere(self) -> int:
        """Pairs dropped on all ranks together (the same on every rank)."""
        return int(self._st.core.dropped_everywhere)

    @property
    def schedule(self) -> Tuple[str, str]:
        """The schedules of dispatch and of combine (what ``auto`` chose)."""
        return (self._st.core.dispatch_schedule, self._st.core.combine_schedule)

    def split(self, expert_inputs: torch.Tensor) -> List[torch.Tensor]:
        """``expert_inputs`` (or anything laid out as it) split into one tensor
        per local expert (views; differentiable)."""
        return list(torch.split(expert_inputs, self.expert_counts, dim=0))

    def __repr__(self) -> str:
        return f"ferrocoll.torch.moe.MoeHandle({self._st.core!r})"


def dispatch(
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor,
    group: Optional[Any] = None,
    *,
    num_experts: int,
    capacity_factor: Optional[float] = None,
    policy: Optional[str] = None,
    schedule: str = "auto",
) -> Tuple[torch.Tensor, MoeHandle]:
    """Sends each token's row to its top-k experts; collective over ``group``.

    ``x``: ``T x H`` (float32, float64, float16 or bfloat16; T may differ
    between ranks, and may be 0); ``topk_idx``: ``T x k`` expert indices in
    ``0..num_experts``; ``topk_weights``: ``T x k`` routing weights, kept in
    the handle for :func:`combine` (which applies them and differentiates
    them). ``capacity_factor`` C bounds each expert at ceil(P*T*k/E * C)
    rows, P*T the tokens of all ranks (``policy='drop'``, the default when C
    is given; ``'dropless'`` otherwise); ``schedule`` forces how the rows
    travel (``auto``: the cost model picks). Every rank passes the same
    ``num_experts``, H, k, C, policy and schedule.

    Returns the rows this rank's ``num_experts / size`` experts received (a
    tensor of x's dtype, ``R x H``, each local expert's rows contiguous:
    ``handle.split`` cuts it) and the :class:`MoeHandle`. Differentiable in
    ``x``."""
    if x.dim() != 2:
        raise _fail(f"x must be tokens x hidden, not of shape {tuple(x.shape)}")
    if x.dtype not in _CODES:
        raise _fail(f"x is {x.dtype}; use float32, float64, float16 or bfloat16")
    for t, what in ((x, "x"), (topk_idx, "topk_idx"), (topk_weights, "topk_weights")):
        if t.device.type != "cpu":
            raise _fail(f"{what} is on {t.device}; ferrocoll works on CPU tensors")
    tokens, hidden = x.shape
    if topk_idx.dim() != 2 or topk_idx.shape[0] != tokens or topk_weights.shape != topk_idx.shape:
        raise _fail(
            f"topk_idx {tuple(topk_idx.shape)} and topk_weights {tuple(topk_weights.shape)} must both be "
            f"tokens x k with tokens = {tokens} (x's rows)"
        )
    topk = topk_idx.shape[1]
    pg = _backend(group)
    d = _dispatcher(pg, num_experts, hidden, topk, capacity_factor, policy, schedule)
    st = _State(d, x.dtype)
    idx = topk_idx.detach().to(torch.int32).contiguous()
    # The Rust handle's own weights serve MoeDispatcher.combine (numpy users);
    # the torch path applies `topk_weights` in `combine` below.
    w = topk_weights.detach().to(torch.float32).contiguous()
    rows = _Dispatch.apply(x.contiguous(), idx, w, st)
    return rows, MoeHandle(st, topk_weights, topk_idx, pg.rank() * d.local_experts)


def combine(expert_outputs: torch.Tensor, handle: MoeHandle) -> torch.Tensor:
    """Returns the experts' outputs to their tokens: ``T x H``, row t the sum
    over token t's kept choices j of ``topk_weights[t, j]`` times its expert's
    output (zeros for a token whose every choice was dropped). Collective.

    ``expert_outputs``: one row per row :func:`dispatch` delivered, in the
    same layout (``R x H``, x's dtype). Differentiable in ``expert_outputs``
    and in the handle's ``topk_weights``."""
    st = handle._st
    if expert_outputs.dtype != st.dtype:
        raise _fail(f"expert_outputs is {expert_outputs.dtype}, but dispatch moved {st.dtype}")
    tokens, k, hidden = handle.tokens, handle.topk, handle.hidden
    pairs = _CombinePairs.apply(expert_outputs, st).view(tokens, k, hidden)
    acc = torch.float32 if st.dtype in (torch.float16, torch.bfloat16) else st.dtype
    # y_t = w_t (1 x k) @ pairs_t (k x H): one batched matmul, 4x faster on CPU
    # than a product and a sum over k; its autograd gives the weights'
    # gradient dy_t . pairs_tj and the pairs' w_tj * dy_t.
    w = handle.weights.to(acc).unsqueeze(1)
    return torch.bmm(w, pairs.to(acc)).squeeze(1).to(st.dtype)


def reference(
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor,
    experts: Sequence[Callable[[torch.Tensor], torch.Tensor]],
    capacity_factor: Optional[float] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The MoE layer's exchange in one process, in plain (differentiable)
    torch: for every rank's tokens concatenated in rank order (``x``: ``N x
    H``, N the tokens of all ranks), ``y_t = sum_j kept_tj * g_tj *
    experts[e_tj](x_t)``, with the same capacity ceil(N*k/E * C) and the same
    priority as :func:`dispatch` (by choice index, then position in ``x``,
    which is source rank, then token). Returns ``(y, kept)``; for tests and
    single-process reference models."""
    n, k = topk_idx.shape
    e_all = len(experts)
    kept = torch.ones(n, k, dtype=torch.bool)
    if capacity_factor is not None:
        capacity = math.ceil(n * k * capacity_factor / e_all)
        # Pairs in priority order: every first choice, then every second ...
        order = topk_idx.t().reshape(-1)
        onehot = torch.nn.functional.one_hot(order.long(), e_all)
        rank_in_expert = (onehot.cumsum(0) * onehot).sum(1)  # 1-based
        kept = (rank_in_expert <= capacity).reshape(k, n).t()
    y = torch.zeros_like(x)
    for e, f in enumerate(experts):
        sel = (topk_idx == e) & kept
        tok, choice = sel.nonzero(as_tuple=True)
        # Called even on no rows, as a rank's expert is: its parameters then
        # get a zero gradient (not None), as they do under dispatch.
        out = f(x[tok])
        y = y.index_add(0, tok, out * topk_weights[tok, choice].unsqueeze(-1).to(out.dtype))
    return y, kept
