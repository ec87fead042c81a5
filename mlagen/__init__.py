"""mlagen: generate, tune and ship multi-head latent attention (MLA) prefill kernels.

The tensor API is :func:`mla_prefill`; the command line is ``mlagen`` (see ``mlagen --help``).
Importing mlagen needs neither torch nor a GPU; calling a kernel needs both.
"""

from __future__ import annotations

from .api import flash_mla_sparse_fwd, mla_prefill, mla_sparse_prefill

__version__ = "0.1.0"

__all__ = ["flash_mla_sparse_fwd", "mla_prefill", "mla_sparse_prefill", "__version__"]
