"""The DDP example runs unchanged under torchrun and under ``ferrocoll run``,
with the same losses (same data, same model, same reduction)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import List

import pytest

import ranks

pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "python", "examples", "ddp.py")


def _ferrocoll_binary() -> str:
    found = [
        os.path.join(ROOT, "target", profile, "ferrocoll")
        for profile in ("release", "debug")
        if os.path.exists(os.path.join(ROOT, "target", profile, "ferrocoll"))
    ]
    if not found:
        pytest.fail(
            "no target/*/ferrocoll: build it with `cargo build -p ferrocoll-cli` (scripts/test.sh does)"
        )
    return max(found, key=os.path.getmtime)


def _losses(text: str) -> List[str]:
    return re.findall(r"step \d+: loss [0-9.]+", text)


def test_ddp_example_under_both_launchers() -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", FERROCOLL_TIMEOUT="60")
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(var, None)
    under_run = subprocess.run(
        [_ferrocoll_binary(), "run", "-n", "2", "--", sys.executable, EXAMPLE],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert under_run.returncode == 0, under_run.stdout + under_run.stderr
    under_torchrun = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            f"--master-port={ranks.free_port()}",
            EXAMPLE,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert under_torchrun.returncode == 0, under_torchrun.stdout + under_torchrun.stderr
    a, b = _losses(under_run.stdout), _losses(under_torchrun.stdout)
    assert len(a) == 4 and a == b, (a, b)


def backend_by_name_only() -> List[str]:
    """A script that never imports ferrocoll: torch's plugin hook must have
    registered the backend by the time ``import torch`` returns."""
    import sys

    import torch
    import torch.distributed as dist

    dist.init_process_group("ferrocoll")
    t = torch.full((3,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    name = dist.get_backend()
    dist.destroy_process_group()
    return [name, str(t.tolist()), str("ferrocoll.torch" in sys.modules)]


def test_import_torch_registers_the_backend() -> None:
    got = ranks.run(2, backend_by_name_only)
    assert got == [["ferrocoll", "[3.0, 3.0, 3.0]", "True"]] * 2, got


def test_autoload_can_be_turned_off() -> None:
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    probe = (
        "import sys, torch.distributed as d; "
        "print('ferrocoll' in d.Backend.backend_list, 'ferrocoll' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["False", "False"], out.stdout + out.stderr
