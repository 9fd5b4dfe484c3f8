"""Runs a function on N ranks, each a process of its own, as a launcher would.

``run(n, fn, *args)`` starts ``n`` interpreters with torchrun's variables set
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``),
each importing ``fn``'s module by path and calling ``fn(*args)``; it returns
the values the ranks returned, in rank order. A rank that raised or died fails
the call with its output, unless ``allow_failure`` is set (then its entry is
the exception text or the exit code). ``hard_exit`` ends each rank with
``os._exit(0)`` once its value is written, skipping interpreter shutdown: for
gloo reference runs only, because torch 2.15's gloo aborts at shutdown after
DDP ("terminate called without an active exception") in about half of the
runs, with or without ferrocoll imported (3 of 6 plain torchrun runs here).
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import tempfile
from typing import Any, Callable, Dict, List, Optional

_MAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_main.py")


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RankFailed(AssertionError):
    """A rank exited with an error."""


def run(
    n: int,
    fn: Callable[..., Any],
    *args: Any,
    timeout: float = 240,
    env: Optional[Dict[str, str]] = None,
    allow_failure: bool = False,
    hard_exit: bool = False,
) -> List[Any]:
    module_file = sys.modules[fn.__module__].__file__
    assert module_file is not None
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="ferrocoll-test-") as tmp:
        procs = []
        for rank in range(n):
            e = dict(os.environ)
            e.update(
                RANK=str(rank),
                WORLD_SIZE=str(n),
                LOCAL_RANK=str(rank),
                LOCAL_WORLD_SIZE=str(n),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                OMP_NUM_THREADS="1",
            )
            e.setdefault("FERROCOLL_TIMEOUT", "60")
            e.update(env or {})
            out = os.path.join(tmp, f"rank{rank}.pkl")
            with open(os.path.join(tmp, f"args{rank}.pkl"), "wb") as f:
                pickle.dump(args, f)
            log = open(os.path.join(tmp, f"rank{rank}.log"), "w+")
            p = subprocess.Popen(
                [
                    sys.executable,
                    _MAIN,
                    module_file,
                    fn.__name__,
                    os.path.join(tmp, f"args{rank}.pkl"),
                    out,
                    "hard" if hard_exit else "clean",
                ],
                env=e,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            procs.append((p, log, out))
        results: List[Any] = []
        failures = []
        for rank, (p, log, out) in enumerate(procs):
            try:
                code = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                for q, _, _ in procs:
                    q.kill()
                code = "hung"
            log.seek(0)
            text = log.read()
            log.close()
            if code == 0 and os.path.exists(out):
                with open(out, "rb") as f:
                    results.append(pickle.load(f))
            else:
                results.append(code)
                failures.append(f"--- rank {rank} (exit {code}):\n{text[-4000:]}")
        if failures and not allow_failure:
            raise RankFailed("\n".join(failures))
        if failures:
            # Shown by pytest when the test then fails.
            print("\n".join(failures), file=sys.stderr)
        return results
