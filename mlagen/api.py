"""The public entry points: kernels called on torch tensors.

Each operation is implemented by its family package; this module is where users find them.
Importing it imports torch (the operations are registered as torch custom ops).
"""

from __future__ import annotations

from .families.mla_prefill.entry import mla_prefill_kernel
from .families.mla_prefill.op import mla_prefill
from .families.mla_sparse_prefill.op import flash_mla_sparse_fwd, mla_sparse_prefill
from .families.mla_sparse_prefill.window import window_indices

__all__ = ["flash_mla_sparse_fwd", "mla_prefill", "mla_prefill_kernel", "mla_sparse_prefill", "window_indices"]
