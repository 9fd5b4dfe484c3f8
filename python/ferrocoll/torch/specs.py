"""What the torch backend accepts and how it names it to ferrocoll: the element
types and operators ferrocoll reduces, the checks every tensor goes through,
and the byte view of a tensor for calls that only move bytes."""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

import ferrocoll

_RedOp = dist.ReduceOp.RedOpType

#: Element types ferrocoll reduces, by torch dtype.
_REDUCIBLE = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.bool: "u8",
}

#: Complex tensors reduce (SUM, AVG, PREMUL_SUM) as their real and imaginary parts.
_COMPLEX = {torch.complex64: "f32", torch.complex128: "f64"}

_OPS = {
    _RedOp.SUM: "sum",
    _RedOp.AVG: "avg",
    _RedOp.PRODUCT: "prod",
    _RedOp.MIN: "min",
    _RedOp.MAX: "max",
    _RedOp.PREMUL_SUM: "sum",
}


#: Bitwise reductions: ferrocoll has no kernels for them, so the backend's
#: all_reduce gathers every rank's tensor and folds them with these (n
#: times the tensor's memory; gloo offers them, NCCL does not). On bool
#: tensors BAND and BOR are ferrocoll's MIN and MAX, on every call.
_BITWISE = {
    _RedOp.BAND: torch.bitwise_and,
    _RedOp.BOR: torch.bitwise_or,
    _RedOp.BXOR: torch.bitwise_xor,
}

#: The reductions of the allreduce fast path (no scale, no type change).
_FAST_OPS = {_RedOp.SUM: "sum", _RedOp.AVG: "avg", _RedOp.MAX: "max", _RedOp.MIN: "min"}


def _fail(msg: str) -> ferrocoll.InvalidArgument:
    return ferrocoll.InvalidArgument(f"ferrocoll backend: {msg}")


def _check_cpu(t: torch.Tensor, what: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise _fail(f"{what} is a {type(t).__name__}, not a tensor")
    if t.device.type != "cpu":
        raise _fail(
            f"{what} is on {t.device}; ferrocoll is a CPU backend (use "
            "init_process_group('cpu:ferrocoll,cuda:nccl') for GPU tensors)"
        )
    if t.is_sparse:
        raise _fail(f"{what} is sparse; ferrocoll moves dense tensors only")


def _op_kind(op: Any) -> Any:
    """The ``RedOpType`` of torch's ``ReduceOp`` (or of a ``RedOpType`` itself)."""
    return op.op if hasattr(op, "op") else op


def _reduce_spec(t: torch.Tensor, op: Any) -> Tuple[str, str, Optional[float], int]:
    """``(dtype code, op name, scale, elements per tensor element)`` for a
    reduction of ``t`` with torch's ReduceOp ``op``."""
    kind = _op_kind(op)
    if t.dtype == torch.bool and kind in (_RedOp.BAND, _RedOp.BOR):
        return _REDUCIBLE[t.dtype], "min" if kind == _RedOp.BAND else "max", None, 1
    if kind not in _OPS:
        raise _fail(
            f"reduction {kind} is not supported here (SUM, AVG, PRODUCT, MIN, MAX and PREMUL_SUM are; "
            "BAND, BOR and BXOR in all_reduce, and BAND and BOR of bool tensors everywhere)"
        )
    name = _OPS[kind]
    scale = None
    if kind == _RedOp.PREMUL_SUM:
        factor = op.factor
        scale = float(factor.item() if isinstance(factor, torch.Tensor) else factor)
    if t.dtype in _REDUCIBLE:
        code = _REDUCIBLE[t.dtype]
        if t.dtype == torch.bool:
            # Logical or / and over 0 and 1, as NCCL does for bool.
            if name in ("sum", "max"):
                name = "max"
            elif name in ("prod", "min"):
                name = "min"
            else:
                raise _fail(f"{kind} of bool tensors is not defined")
        return code, name, scale, 1
    if t.dtype in _COMPLEX and name in ("sum", "avg"):
        return _COMPLEX[t.dtype], name, scale, 2
    raise _fail(
        f"cannot reduce {t.dtype} with {kind}; ferrocoll reduces float32, float64, float16, "
        "bfloat16, int8, uint8, int32, int64 (bool with MIN/MAX/SUM, complex with SUM/AVG)"
    )


def _bytes_spec(t: torch.Tensor) -> Tuple[str, int]:
    """``(dtype code, elements per tensor element)`` for a call that only
    moves ``t``: types ferrocoll knows travel as themselves (so a mismatch
    names them), any other as bytes."""
    if t.dtype in _REDUCIBLE:
        return _REDUCIBLE[t.dtype], 1
    return "u8", t.element_size()


def _adjacent(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether contiguous same-typed tensors lie back to back in memory, in order."""
    if not tensors:
        return False
    t0 = tensors[0]
    addr = t0.data_ptr()
    for t in tensors:
        if not t.is_contiguous() or t.dtype != t0.dtype or t.data_ptr() != addr:
            return False
        addr += t.numel() * t.element_size()
    return True
