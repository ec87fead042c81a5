"""mlagen: generate, tune and ship multi-head latent attention (MLA) prefill kernels.

The tensor API is :func:`mla_prefill` (dense) and :func:`mla_sparse_prefill` /
:func:`flash_mla_sparse_fwd` (sparse, DeepSeek-V3.2 DSA); the command line is ``mlagen`` (see ``mlagen --help``).
Importing mlagen (or any of its modules below the tensor API) needs neither torch nor a GPU;
``mlagen.mla_prefill`` is loaded on first use, and calling a kernel needs both.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["flash_mla_sparse_fwd", "mla_prefill", "mla_sparse_prefill", "__version__"]


def __getattr__(name: str):
    # Loaded on first use, so that importing a leaf module (mlagen.expr) loads neither the
    # dispatcher nor torch.
    if name in ("mla_prefill", "mla_sparse_prefill", "flash_mla_sparse_fwd"):
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'mlagen' has no attribute {name!r}")
