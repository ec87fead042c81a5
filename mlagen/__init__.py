"""mlagen: generate, tune and ship multi-head latent attention (MLA) prefill kernels.

The tensor API is :func:`mla_prefill`; the command line is ``mlagen`` (see ``mlagen --help``).
Importing mlagen (or any of its modules below the tensor API) needs neither torch nor a GPU;
``mlagen.mla_prefill`` is loaded on first use, and calling a kernel needs both.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["mla_prefill", "__version__"]


def __getattr__(name: str):
    # Loaded on first use, so that importing a leaf module (mlagen.expr) loads neither the
    # dispatcher nor torch.
    if name == "mla_prefill":
        from .api import mla_prefill

        return mla_prefill
    raise AttributeError(f"module 'mlagen' has no attribute {name!r}")
