"""torch's plugin hook: ``import torch`` registers the ``"ferrocoll"`` backend.

The package declares this module's :func:`register` under the entry-point group
``torch.backends``, which torch (2.5 and later) loads at the end of ``import
torch`` (`RFC pytorch#122468`). So a training script that takes its backend
name as a setting (``dist.init_process_group(args.backend)``) runs on
ferrocoll unchanged, without ``import ferrocoll.torch``; importing it
explicitly still works and is what older torch versions need.

``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` (torch's switch for every such plugin)
turns it off. A failure here never breaks ``import torch``: it becomes a
warning, and ``import ferrocoll.torch`` raises the full error.
"""

from __future__ import annotations

import warnings


def register() -> None:
    """Imports :mod:`ferrocoll.torch` (which registers the backend); warns
    instead of raising if that fails."""
    try:
        import ferrocoll.torch  # noqa: F401
    except Exception as e:  # noqa: BLE001 - import torch must not fail because of us
        warnings.warn(
            f"ferrocoll: the torch.distributed backend 'ferrocoll' was not registered on "
            f"`import torch` ({type(e).__name__}: {e}); `import ferrocoll.torch` shows the full error",
            RuntimeWarning,
            stacklevel=2,
        )
