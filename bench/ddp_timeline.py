"""Where a DDP step's time goes: a timeline of one step per rank.

Run it under torchrun (or ``ferrocoll run``), once per backend::

    python -m torch.distributed.run --nproc-per-node 2 bench/ddp_timeline.py --backend ferrocoll
    python -m torch.distributed.run --nproc-per-node 2 bench/ddp_timeline.py --backend gloo

The model is ``python -m ferrocoll.bench --ddp``'s (6 Linear 2048x2048, 25.2 M float32
parameters). Every rank prints its median step (by step time) as a timeline, in ms from the
step's start: when the forward and the backward passes ended, and for every bucket DDP
communicated when its allreduce was issued and when it completed. Beside it, the same step
without DDP (compute only) and DDP with a hook that communicates nothing, timed in the same
process, so the line ``backward stretched by`` says how much longer the backward pass ran
while the buckets' allreduces shared the cores with it, and ``exposed`` how long the step
waited for communication after its backward pass ended.

The buckets go through a comm hook that does what DDP's default hook does (divide by the
world size, allreduce asynchronously) and records the times; both backends run the same hook.
``OMP_NUM_THREADS`` is 1 unless set, as in ``ferrocoll.bench``.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any, Callable, Dict, List, Tuple

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from ferrocoll.bench import DDP_WIDTH, ddp_model  # noqa: E402


class Timeline:
    """The step being timed: its start and its buckets so far."""

    def __init__(self) -> None:
        self.t0 = 0.0
        # Per bucket: issued, completed (None until then), bytes (seconds from t0).
        self.buckets: List[List[Any]] = []

    def now(self) -> float:
        return time.perf_counter() - self.t0


def timed_hook(line: Timeline, world: int) -> Callable[[Any, Any], Any]:
    """DDP's default allreduce hook, recording when each bucket was issued and done."""

    # Unannotated: DDP checks a hook's annotations against its own types.
    def hook(state, bucket):  # type: ignore[no-untyped-def]
        buf = bucket.buffer()
        rec: List[Any] = [line.now(), None, buf.numel() * buf.element_size()]
        line.buckets.append(rec)
        buf.div_(world)
        fut = dist.all_reduce(buf, async_op=True).get_future()

        def done(f: Any) -> Any:
            rec[1] = line.now()
            return f.value()[0]

        return fut.then(done)

    return hook


# Untimed steps before the timed ones (buffers, DDP's bucket rebuild, caches).
WARMUP_STEPS = 3


def run_steps(
    model: torch.nn.Module, x: torch.Tensor, steps: int, line: Timeline
) -> List[Tuple[float, float, float, List[List[Any]]]]:
    """Times ``steps`` training steps after ``WARMUP_STEPS`` warm-up ones; one row per step."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    rows = []
    for i in range(steps + WARMUP_STEPS):
        dist.barrier()
        line.buckets = []
        line.t0 = time.perf_counter()
        opt.zero_grad()
        y = model(x).sum()
        forward = line.now()
        y.backward()
        backward = line.now()
        opt.step()
        if i >= WARMUP_STEPS:
            rows.append((forward, backward, line.now(), [list(b) for b in line.buckets]))
    return rows


def thread_cpu() -> Dict[str, float]:
    """CPU seconds (user + system) each thread of this process has used, summed by thread name."""
    tick = os.sysconf("SC_CLK_TCK")
    used: Dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # the thread ended
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        used[name] = used.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return used


def median_row(
    rows: List[Tuple[float, float, float, List[List[Any]]]],
) -> Tuple[float, float, float, List[List[Any]]]:
    """The step of median step time."""
    return sorted(rows, key=lambda r: r[2])[len(rows) // 2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="ferrocoll", help="ferrocoll or gloo (ferrocoll)")
    p.add_argument("--batch", type=int, default=1, help="batch size (1)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per way (20)")
    p.add_argument("--bucket-view", action="store_true", help="DDP(gradient_as_bucket_view=True)")
    a = p.parse_args()
    if a.backend == "ferrocoll":
        import ferrocoll.torch  # noqa: F401  (registers the backend)
    dist.init_process_group(a.backend)
    r, n = dist.get_rank(), dist.get_world_size()
    x = torch.randn(a.batch, DDP_WIDTH)
    line = Timeline()

    compute = median_row(run_steps(ddp_model(), x, a.steps, line))

    def nothing(state, bucket):  # type: ignore[no-untyped-def]
        fut: Any = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    quiet = DDP(ddp_model(), gradient_as_bucket_view=a.bucket_view)
    quiet.register_comm_hook(None, nothing)
    floor = median_row(run_steps(quiet, x, a.steps, line))

    model = DDP(ddp_model(), gradient_as_bucket_view=a.bucket_view)
    model.register_comm_hook(None, timed_hook(line, n))
    cpu_before = thread_cpu()
    rows = run_steps(model, x, a.steps, line)
    cpu_after = thread_cpu()
    steps_run = a.steps + WARMUP_STEPS
    fwd, bwd, step, buckets = median_row(rows)

    ms = 1e3
    out: List[str] = []
    out.append(
        f"[{r}] {a.backend}, batch {a.batch}, bucket view {a.bucket_view}: median step {step * ms:.1f} ms "
        f"(compute only {compute[2] * ms:.1f}, DDP communicating nothing {floor[2] * ms:.1f})"
    )
    out.append(
        f"[{r}]   forward done {fwd * ms:.1f}, backward done {bwd * ms:.1f} "
        f"(compute only: {compute[0] * ms:.1f}, {compute[1] * ms:.1f}; communicating nothing: "
        f"{floor[0] * ms:.1f}, {floor[1] * ms:.1f})"
    )
    last_done = 0.0
    for issued, done, nbytes in buckets:
        d = f"{done * ms:7.1f}" if done is not None else "   none"
        took = (done - issued) * ms if done is not None else float("nan")
        last_done = max(last_done, done or 0.0)
        out.append(
            f"[{r}]   bucket {nbytes / 2**20:5.1f} MiB issued {issued * ms:7.1f} done {d} ({took:6.1f} ms)"
        )
    first = min((b[0] for b in buckets), default=bwd)
    stretched = (bwd - fwd) - (floor[1] - floor[0])
    out.append(
        f"[{r}]   communication from {first * ms:.1f} to {last_done * ms:.1f} ms; backward stretched by "
        f"{stretched * ms:.1f} ms against DDP communicating nothing; exposed after the backward "
        f"{max(0.0, last_done - bwd) * ms:.1f} ms"
    )
    per_thread = sorted(((cpu_after[k] - cpu_before.get(k, 0.0)) / steps_run, k) for k in cpu_after)
    out.append(
        f"[{r}]   CPU per step by thread (ms): "
        + ", ".join(f"{k} {v * ms:.1f}" for v, k in reversed(per_thread) if v > 0)
    )
    times = sorted(row[2] for row in rows)
    q1, q3 = times[len(times) // 4], times[(3 * len(times)) // 4]
    out.append(f"[{r}]   step time quartiles (ms): {q1 * ms:.1f}-{q3 * ms:.1f}")
    print("\n".join(out), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
