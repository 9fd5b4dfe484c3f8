"""Benchmarks of the Python layers against gloo and against the Rust API, in one run.

    python -m ferrocoll.bench [--ranks 2,4] [--min 8] [--max 64M] [--ddp] [--rust DIR]

* ``sweep``: ``dist.all_reduce``, ``all_gather_into_tensor``, ``reduce_scatter_tensor``
  and ``all_to_all_single`` (float32) from ``--min`` to ``--max`` bytes on each
  group size, backend ferrocoll and gloo: time per call (median of timed
  batches), nccl-tests' busbw, and the ratio.
* ``latency``: per-call time of an 8-byte allreduce through the numpy API, the
  torch backend, gloo, and (with ``--rust DIR`` holding ``ferrocoll`` and
  ``examples/latency`` from ``cargo build --release``) the Rust API: the
  Python layers' overhead per call.
* ``ddp`` (``--ddp``): the step time of DDP on a model of ~25 M float32
  parameters (a stack of Linear layers), ferrocoll against gloo, next to
  what bounds it: the same step without DDP, DDP with a hook that
  communicates nothing, and DDP's bucket allreduces alone
  (``--ddp-bucket-view`` also times ``gradient_as_bucket_view=True``).

Ranks are processes started here with torchrun's variables. Prints markdown
tables; ``--json PATH`` also writes every number.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

OPS = ["all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single"]


def _parse_size(s: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper().rstrip("B")
    return int(float(s[:-1]) * mult[s[-1]]) if s and s[-1] in mult else int(s)


def _busbw_factor(op: str, n: int) -> float:
    return 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


def _timed(fn: Any, barrier: Any, min_time: float = 0.2, reps: int = 5) -> float:
    """Median over ``reps`` batches of the time per call; each batch runs
    long enough (``min_time``) to hide the clock's resolution."""
    for _ in range(3):
        fn()
    barrier()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    iters = max(1, min(20000, int(min_time / reps / one)))
    # Every rank must run the same number of calls: rank 0 decides.
    iters = barrier(iters)
    out = []
    for _ in range(reps):
        barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        out.append((time.perf_counter() - t0) / iters)
    return statistics.median(out)


DDP_WIDTH = 2048
"""Width of the DDP benchmark model's layers."""


def ddp_model() -> Any:
    """The DDP benchmark's model: 6 x (Linear(2048, 2048), ReLU), 25.2 M float32
    parameters, seeded so every rank starts alike (``bench/ddp_timeline.py``
    times the same model)."""
    import torch

    torch.manual_seed(0)
    layers: List[Any] = []
    for _ in range(6):
        layers += [torch.nn.Linear(DDP_WIDTH, DDP_WIDTH), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


def _worker(mode: str, backend: str, sizes: List[int], out_path: str) -> None:
    """One rank: runs ``mode`` and, on rank 0, writes the numbers to ``out_path``."""
    import torch
    import torch.distributed as dist

    import ferrocoll.torch  # noqa: F401

    dist.init_process_group(backend)
    r, n = dist.get_rank(), dist.get_world_size()

    def barrier(value: Optional[int] = None) -> int:
        t = torch.tensor([value or 0], dtype=torch.int64)
        dist.broadcast(t, src=0)
        return int(t.item())

    results: Dict[str, Any] = {}
    if mode == "sweep":
        for op in OPS:
            for nbytes in sizes:
                count = max(1, nbytes // 4)
                count -= count % n if count >= n else 0
                count = max(count, n) if op != "all_reduce" else count
                x = torch.ones(count)
                if op == "all_reduce":
                    fn = lambda: dist.all_reduce(x)  # noqa: E731
                elif op == "all_gather_into_tensor":
                    out = torch.empty(count * n)
                    part = torch.ones(count)
                    fn = lambda: dist.all_gather_into_tensor(out, part)  # noqa: E731
                elif op == "reduce_scatter_tensor":
                    out = torch.empty(count // n)
                    fn = lambda: dist.reduce_scatter_tensor(out, x)  # noqa: E731
                else:
                    out = torch.empty(count)
                    fn = lambda: dist.all_to_all_single(out, x)  # noqa: E731
                t = _timed(fn, barrier)
                size = count * n * 4 if op == "all_gather_into_tensor" else count * 4
                results[f"{op}/{size}"] = t
    elif mode == "latency":
        t = torch.ones(2)
        results["torch"] = _per_call(lambda: dist.all_reduce(t), barrier)
        if backend == "ferrocoll":
            import numpy as np

            import ferrocoll

            comm = ferrocoll.init_with_store(dist.distributed_c10d._get_default_store(), r, n)
            a = np.ones(2, dtype=np.float32)
            results["numpy"] = _per_call(lambda: comm.all_reduce(a), barrier)
    elif mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        batch = sizes[0] if sizes else 8
        # DDP(gradient_as_bucket_view=True): gradients live in the buckets,
        # which saves DDP's two copies per step (a user's choice, not the
        # backend's; both backends are timed alike).
        bucket_view = len(sizes) > 1 and bool(sizes[1])
        x = torch.randn(batch, DDP_WIDTH)

        def time_steps(model: Any) -> float:
            opt = torch.optim.SGD(model.parameters(), lr=1e-4)

            def step() -> None:
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()

            for _ in range(3):
                step()
            times = []
            for _ in range(20):
                barrier()
                t0 = time.perf_counter()
                step()
                times.append(time.perf_counter() - t0)
            return statistics.median(times)

        # The same step without DDP: the compute floor no backend can beat.
        results["compute"] = time_steps(ddp_model())

        # DDP whose comm hook returns at once (no communication): DDP's own
        # floor (bucket copies, hooks) with any backend.
        # (Unannotated: DDP checks a hook's annotations against its own types.)
        bucket_bytes: Dict[int, int] = {}

        def no_comm(state, bucket):  # type: ignore[no-untyped-def]
            # The buckets DDP communicates, by index (the last step's layout).
            bucket_bytes[bucket.index()] = bucket.buffer().numel() * 4
            fut: Any = torch.futures.Future()
            fut.set_result(bucket.buffer())
            return fut

        quiet = DDP(ddp_model(), gradient_as_bucket_view=bucket_view)
        quiet.register_comm_hook(None, no_comm)
        results["ddp_no_comm"] = time_steps(quiet)
        model = DDP(ddp_model(), gradient_as_bucket_view=bucket_view)
        results["params"] = sum(p.numel() for p in model.parameters())
        results["step"] = time_steps(model)
        results["batch"] = batch
        results["bucket_view"] = bucket_view

        # The same buckets' allreduces alone, issued asynchronously in DDP's
        # order and waited for together, with nothing computing: the CPU time
        # the communication itself takes on these cores.
        buffers = [torch.ones(bucket_bytes[i] // 4) for i in sorted(bucket_bytes)]

        def comm_only() -> None:
            works = [dist.all_reduce(b, async_op=True) for b in buffers]
            for w in works:
                w.wait()

        results["buckets"] = [bucket_bytes[i] for i in sorted(bucket_bytes)]
        results["comm_only"] = _timed(comm_only, barrier, min_time=0.1, reps=9)
    if r == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


def _per_call(fn: Any, barrier: Any, calls: int = 20000) -> float:
    """Median per-call time of ``calls`` calls, each timed alone."""
    for _ in range(500):
        fn()
    times = [0.0] * calls
    barrier()
    for i in range(calls):
        t0 = time.perf_counter()
        fn()
        times[i] = time.perf_counter() - t0
    return statistics.median(times)


def _launch(n: int, mode: str, backend: str, sizes: List[int]) -> Dict[str, Any]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="ferrocoll-bench-") as tmp:
        out = os.path.join(tmp, "out.json")
        procs = []
        for rank in range(n):
            env = dict(
                os.environ,
                RANK=str(rank),
                WORLD_SIZE=str(n),
                LOCAL_RANK=str(rank),
                LOCAL_WORLD_SIZE=str(n),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                OMP_NUM_THREADS="1",
            )
            cmd = [
                sys.executable,
                "-m",
                "ferrocoll.bench",
                "--worker",
                mode,
                "--backend",
                backend,
                "--sizes",
                ",".join(map(str, sizes)),
                "--out",
                out,
            ]
            procs.append(subprocess.Popen(cmd, env=env))
        codes = [p.wait() for p in procs]
        if any(codes):
            raise SystemExit(f"{mode}/{backend} on {n} ranks failed: exit codes {codes}")
        with open(out) as f:
            return json.load(f)


def _ddp_report(everything: Dict[str, Any], n: int, batch: int, view: int, repeat: int) -> None:
    """Times one DDP configuration on both backends and prints the comparison.

    The backends take turns ``repeat`` times and each keeps its fastest run
    (by step time), so a machine whose speed drifts reaches both alike.
    """
    runs: Dict[str, List[Dict[str, Any]]] = {"ferrocoll": [], "gloo": []}
    for _ in range(repeat):
        for backend in runs:
            runs[backend].append(_launch(n, "ddp", backend, [batch, view]))
    d_f = min(runs["ferrocoll"], key=lambda d: d["step"])
    d_g = min(runs["gloo"], key=lambda d: d["step"])
    everything[f"ddp/{batch}/{'view' if view else 'copy'}"] = runs
    kind = "gradient_as_bucket_view=True" if view else "DDP's defaults"
    print(
        f"\n## DDP step, {d_f['params'] / 1e6:.1f} M float32 parameters (6 Linear 2048x2048), "
        f"batch {batch}, 2 processes, {kind}\n"
    )
    step_f, step_g = d_f["step"], d_g["step"]
    floor = d_f["ddp_no_comm"]
    # With every core computing, a copy-based transport's communication
    # cannot hide (its bytes are moved by those cores): the step is at least
    # DDP's floor plus the communication's own time.
    bound = floor + d_f["comm_only"]
    mib = ", ".join(f"{b / (1 << 20):.1f}" for b in d_f["buckets"])
    print("| | ferrocoll | gloo |")
    print("|---|---:|---:|")
    print(f"| step (ms) | {step_f * 1e3:.1f} | {step_g * 1e3:.1f} |")
    print(f"| compute only, no DDP (ms) | {d_f['compute'] * 1e3:.1f} | {d_g['compute'] * 1e3:.1f} |")
    print(f"| DDP, hook communicating nothing (ms) | {floor * 1e3:.1f} | {d_g['ddp_no_comm'] * 1e3:.1f} |")
    print(
        f"| the buckets' allreduces alone (ms) | {d_f['comm_only'] * 1e3:.1f} | "
        f"{d_g['comm_only'] * 1e3:.1f} |"
    )
    steps = lambda b: ", ".join(f"{d['step'] * 1e3:.1f}" for d in runs[b])  # noqa: E731
    print(f"\nstep times of the {repeat} runs (ms): ferrocoll {steps('ferrocoll')}; gloo {steps('gloo')}")
    print(
        f"buckets (MiB): {mib}; ferrocoll / gloo step time {step_f / step_g:.2f}x; DDP's "
        f"floor alone {floor / step_g:.2f}x gloo; floor + ferrocoll's allreduces alone "
        f"{bound * 1e3:.1f} ms = {bound / step_g:.2f}x gloo (the best a backend whose bytes "
        f"are moved by the computing cores reaches)"
    )


def _rust_latency(rust: str, n: int) -> Optional[float]:
    """Median per-call time of the Rust API (examples/latency), seconds."""
    exe, example = os.path.join(rust, "ferrocoll"), os.path.join(rust, "examples", "latency")
    if not (os.path.exists(exe) and os.path.exists(example)):
        return None
    out = subprocess.run([exe, "run", "-n", str(n), example, "50000", "2"], capture_output=True, text=True)
    for line in out.stdout.splitlines():
        if line.startswith("[0]"):
            # "... p50 0.150 us ..." : take the number after p50.
            words = line.replace("=", " ").split()
            if "p50" in words:
                return float(words[words.index("p50") + 1]) * 1e-6
    return None


def _fmt_t(t: float) -> str:
    return f"{t * 1e6:.1f}" if t < 1e-3 else f"{t * 1e6:.0f}"


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m ferrocoll.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--ranks", default="2,4", help="group sizes, comma-separated (2,4)")
    p.add_argument("--min", default="8", help="smallest message (8)")
    p.add_argument("--max", default="64M", help="largest message (64M)")
    p.add_argument("--ddp", action="store_true", help="also time a DDP step (~25 M parameters)")
    p.add_argument("--only", help="run only these parts: sweep,latency,ddp (comma-separated)")
    p.add_argument("--ddp-batch", default="8", help="DDP step batch sizes, comma-separated (8)")
    p.add_argument(
        "--ddp-bucket-view",
        action="store_true",
        help="also time DDP(gradient_as_bucket_view=True), for both backends",
    )
    p.add_argument("--ddp-repeat", type=int, default=2, help="DDP runs per backend, taking turns (2)")
    p.add_argument("--rust", help="directory with ferrocoll and examples/latency (target/release)")
    p.add_argument("--json", help="write every number here")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--backend", help=argparse.SUPPRESS)
    p.add_argument("--sizes", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        _worker(a.worker, a.backend, [int(s) for s in a.sizes.split(",") if s], a.out)
        return
    lo, hi = _parse_size(a.min), _parse_size(a.max)
    only = set(a.only.split(",")) if a.only else {"sweep", "latency", "ddp"}
    if a.only and "ddp" in only:
        a.ddp = True
    sizes = []
    s = lo
    while s <= hi:
        sizes.append(s)
        # x8 up to 256 KiB, then 1, 4, 16, 64 MiB.
        s *= 8 if s < (256 << 10) else 4
    everything: Dict[str, Any] = {"sizes": sizes}
    print(f"# python -m ferrocoll.bench {' '.join(argv or sys.argv[1:])}")
    print(
        f"# {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}, {os.cpu_count()} cores, "
        f"load {open('/proc/loadavg').read().split()[0]}"
    )
    for n in [int(x) for x in a.ranks.split(",")]:
        if "sweep" not in only:
            ours = {}
        else:
            ours = _launch(n, "sweep", "ferrocoll", sizes)
        theirs = _launch(n, "sweep", "gloo", sizes) if ours else {}
        everything[f"sweep/{n}"] = {"ferrocoll": ours, "gloo": theirs}
        if ours:
            print(f"\n## {n} processes, float32, time per call (us) and busbw (GB/s)\n")
            print("| op | bytes | ferrocoll us | gloo us | ferrocoll busbw | gloo busbw | ratio |")
            print("|---|---:|---:|---:|---:|---:|---:|")
        for key, t in ours.items():
            op, size = key.split("/")
            g = theirs[key]
            f = _busbw_factor(op, n) * int(size)
            print(
                f"| {op} | {size} | {_fmt_t(t)} | {_fmt_t(g)} | {f / t / 1e9:.3f} | "
                f"{f / g / 1e9:.3f} | {g / t:.2f}x |"
            )
        if "latency" not in only:
            lat_f = None
        else:
            lat_f = _launch(n, "latency", "ferrocoll", [])
        if lat_f is not None:
            lat_g = _launch(n, "latency", "gloo", [])
            rust = _rust_latency(a.rust, n) if a.rust else None
            everything[f"latency/{n}"] = {"ferrocoll": lat_f, "gloo": lat_g, "rust": rust}
            print(f"\n## {n} processes, 8-byte allreduce, median per call (us)\n")
            print("| Rust API | numpy API | torch backend ferrocoll | torch gloo | gloo / ferrocoll |")
            print("|---:|---:|---:|---:|---:|")
            rs = f"{rust * 1e6:.2f}" if rust is not None else "-"
            print(
                f"| {rs} | {lat_f['numpy'] * 1e6:.2f} | {lat_f['torch'] * 1e6:.2f} | "
                f"{lat_g['torch'] * 1e6:.1f} | "
                f"{lat_g['torch'] / lat_f['torch']:.1f}x |"
            )
            if rust is not None:
                print(
                    f"\noverhead over the Rust API: numpy {(lat_f['numpy'] - rust) * 1e6:.2f} us, "
                    f"torch backend {(lat_f['torch'] - rust) * 1e6:.2f} us per call"
                )
        if a.ddp and n == 2:
            views = [0, 1] if a.ddp_bucket_view else [0]
            for batch in [int(b) for b in a.ddp_batch.split(",")]:
                for view in views:
                    _ddp_report(everything, n, batch, view, a.ddp_repeat)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(everything, f, indent=1)


if __name__ == "__main__":
    main()
