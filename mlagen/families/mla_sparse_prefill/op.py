"""``mla_sparse_prefill`` as PyTorch operators (the dense family's op.py pattern), so
``torch.compile(fullgraph=True)`` traces a model that calls it without a graph break, and CUDA
graphs capture it.

* ``mlagen::mla_sparse_prefill(q, kv, indices, softmax_scale, topk_length?, attn_sink?, kernel?,
  kv_format, compute="bf16") -> (out, max_logits, lse)``: allocates its outputs;
* ``mlagen::mla_sparse_prefill_out(..., kv_format, out!, max_logits!, lse!, compute="bf16") -> ()``:
  writes preallocated outputs.

``compute`` follows, with its default, in both schemas, so calls written before it existed
(positional arguments up to ``kv_format`` / ``lse``) mean what they meant; the second pool
(``extra_kv``, ``extra_indices``, ``extra_topk_length``, ``extra_kv_format``, all optional) comes last.

Importing this module imports torch and registers the ops.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode as _current_dispatch_mode

from ... import layouts
from ...errors import ArgumentError
from .call import check_compute
from .entry import run
from .problem import D_V

Tensor = torch.Tensor


def _shapes(q, kv, indices):
    """Output shapes from the inputs' shapes alone (the fake implementations see no data)."""
    if q.dim() != 3 or indices.dim() not in (2, 3) or kv.dim() not in (2, 3, 4):
        raise ArgumentError("mla_sparse_prefill: q must be [Sq, H, d_qk], kv [N, d] / [N, 1, d] / [blocks, page, d] "
                            "(quantized: also [blocks, page, 1, row_bytes]), indices [Sq, topk] / [Sq, 1, topk]")
    return (q.shape[0], q.shape[1], D_V), (q.shape[0], q.shape[1])


@torch.library.custom_op("mlagen::mla_sparse_prefill", mutates_args=())
def _op(q: Tensor, kv: Tensor, indices: Tensor, softmax_scale: float, topk_length: Optional[Tensor],
        attn_sink: Optional[Tensor], kernel: Optional[str], kv_format: str,
        compute: str = "bf16", extra_kv: Optional[Tensor] = None, extra_indices: Optional[Tensor] = None,
        extra_topk_length: Optional[Tensor] = None,
        extra_kv_format: Optional[str] = None) -> tuple[Tensor, Tensor, Tensor]:
    return run(q, kv, indices, softmax_scale=softmax_scale, topk_length=topk_length, attn_sink=attn_sink,
               kernel=kernel, kv_format=kv_format, compute=compute, extra_kv=extra_kv, extra_indices=extra_indices,
               extra_topk_length=extra_topk_length, extra_kv_format=extra_kv_format)


@_op.register_fake
def _op_fake(q, kv, indices, softmax_scale, topk_length, attn_sink, kernel, kv_format, compute="bf16", extra_kv=None,
             extra_indices=None, extra_topk_length=None, extra_kv_format=None):
    o, s = _shapes(q, kv, indices)
    return q.new_empty(o), q.new_empty(s, dtype=torch.float32), q.new_empty(s, dtype=torch.float32)


@torch.library.custom_op("mlagen::mla_sparse_prefill_out", mutates_args=("out", "max_logits", "lse"))
def _op_out(q: Tensor, kv: Tensor, indices: Tensor, softmax_scale: float, topk_length: Optional[Tensor],
            attn_sink: Optional[Tensor], kernel: Optional[str], kv_format: str, out: Tensor, max_logits: Tensor,
            lse: Tensor, compute: str = "bf16", extra_kv: Optional[Tensor] = None,
            extra_indices: Optional[Tensor] = None, extra_topk_length: Optional[Tensor] = None,
            extra_kv_format: Optional[str] = None) -> None:
    run(q, kv, indices, softmax_scale=softmax_scale, topk_length=topk_length, attn_sink=attn_sink, out=out,
        max_logits=max_logits, lse=lse, kernel=kernel, kv_format=kv_format, compute=compute, extra_kv=extra_kv,
        extra_indices=extra_indices, extra_topk_length=extra_topk_length, extra_kv_format=extra_kv_format)


@_op_out.register_fake
def _op_out_fake(q, kv, indices, softmax_scale, topk_length, attn_sink, kernel, kv_format, out, max_logits, lse,
                 compute="bf16", extra_kv=None, extra_indices=None, extra_topk_length=None, extra_kv_format=None):
    _shapes(q, kv, indices)


def _tracing(q) -> bool:
    if torch.compiler.is_compiling():
        return True
    return type(q) is not torch.Tensor or _current_dispatch_mode() is not None


def mla_sparse_prefill(q, kv, indices, *, softmax_scale, topk_length=None, attn_sink=None, d_v=D_V, out=None,
                       max_logits=None, lse=None, kernel=None, kv_format="bf16", compute="bf16", extra_kv=None,
                       extra_indices=None, extra_topk_length=None, extra_kv_format=None):
    """Sparse MLA prefill (DeepSeek-V3.2 DSA, absorbed "MQA mode"), as in MLA.md section 2.

    Args:
        q: [Sq, H, 576] bf16 (512 latent + 64 rope) or [Sq, H, 512]; any H >= 1. Strided views
            are fine (last dimension contiguous; 16-byte aligned strides are read in place).
        kv: the latent cache, one head shared by all query heads: [N, d_qk], [N, 1, d_qk], or a
            paged pool [num_blocks, page_size, d_qk] whose row ``r`` is page ``r // page_size``,
            offset ``r % page_size`` (pages may be strided). V is the first 512 columns of a row.
            With a quantized ``kv_format``: uint8 [num_blocks, page_size, row_bytes] or
            [num_blocks, page_size, 1, row_bytes] (FlashMLA's decode cache; also [N, row_bytes]),
            row_bytes 656 for ``fp8_v32``.
        indices: [Sq, topk] or [Sq, 1, topk] int32 row ids into kv; any topk >= 0. Entries < 0 or
            >= N are invalid: they count for nothing and are never read. Duplicates count each time.
        softmax_scale: scale of q . k (natural-log units).
        topk_length: optional [Sq] int32: only the first topk_length[t] entries of row t count.
        attn_sink: optional [H] fp32 (natural-log units): adds exp(sink - max) to the softmax
            denominator only; lse and max_logits ignore it. +inf gives out 0.
        d_v: must be 512.
        out: optional preallocated [Sq, H, 512] bf16 (4-byte aligned strides).
        max_logits, lse: optional preallocated [Sq, H] fp32 outputs.
        kernel: optional spec name or Variant to force a kernel (default: dispatch).
        kv_format: how kv rows are stored (``mlagen.operands``): ``"bf16"`` (default), or
            ``"fp8_v32"`` (DeepSeek-V3.2: 512 e4m3 values, 4 fp32 scales one per 128 values,
            64 bf16 rope values; 656 bytes), ``"fp8_b64"`` / ``"fp8_b32"`` (a scale per 64 / 32
            values), ``"fp8_b0"`` (no scales): these need d_qk 576; ``"fp8_v4"`` (DeepSeek-V4,
            FlashMLA's MODEL1: 448 e4m3 + 64 bf16 values a token, UE8M0 scales after each page's
            rows; d_qk 512; kv uint8 [num_blocks, page_bytes] or [num_blocks, page_size, 1, 584]).
            A quantized cache may also be typed float8_e4m3fn (FlashMLA's quantize_k_cache does):
            its bytes are read the same. sm_90a only.
        compute: ``"bf16"``, the only mode (kept so calls that name it still work): an FP8 cache
            is read as bf16 (dequantized in the kernel, or staged first). ``"fp8"`` (FP8 tensor
            cores) was removed on 2026-12-01 and raises ValueError naming compute.
        extra_kv, extra_indices, extra_topk_length: an optional second pool (MLA.md section 2b,
            DeepSeek-V4: the sliding window's raw rows in one pool, the compressed entries in the
            other), in one softmax with the first: token t's keys are its valid entries of
            ``indices`` (rows of kv) followed by its valid entries of ``extra_indices`` ([Sq,
            topk2] or [Sq, 1, topk2] int32 rows of extra_kv, any topk2 >= 0; extra_topk_length
            [Sq] as topk_length). Layouts as kv's (flat or paged, its own strides and page size).
            lse, max_logits and the sink are over the union: the result is the one-pool call on
            the two pools concatenated. No copy of either pool is made for a bf16 pool.
        extra_kv_format: extra_kv's format (default: kv_format's). FP8 pools of a two-pool call
            are dequantized into bf16 workspaces first (as a one-pool call's default path does);
            a workspace over MLAGEN_STAGING_MB raises ValueError naming the pool.

    Returns:
        (out, max_logits, lse): out [Sq, H, 512] bf16; max_logits and lse [Sq, H] fp32, natural
        log. A row with no valid entry gives out 0, max_logits -inf and lse +inf.

    Never synchronises the host (after the first call of a shape class, which may compile), so
    it can be captured in a CUDA graph. Traced (torch.compile, FakeTensors, make_fx), the call is
    the ``mlagen::mla_sparse_prefill`` / ``mlagen::mla_sparse_prefill_out`` operator, so
    ``torch.compile(fullgraph=True)`` has no graph break; eager calls run the same implementation
    without the dispatcher, and so does a Variant ``kernel`` (a tuning aid).
    Batched queries q [B, S, H, d_qk] (indices [B, S, topk], topk_length [B, S]) over one pool give
    out [B, S, H, 512], max_logits and lse [B, S, H], without a copy: :mod:`mlagen.layouts`.
    """
    extra = dict(extra_kv=extra_kv, extra_indices=extra_indices, extra_topk_length=extra_topk_length,
                 extra_kv_format=extra_kv_format)
    two = any(v is not None for v in extra.values())
    if two and isinstance(q, torch.Tensor) and q.dim() == 4:
        raise ArgumentError("mla_sparse_prefill: extra_kv: a two-pool call takes q as [Sq, H, d_qk] (flatten the "
                            "batch into Sq)")
    if isinstance(q, torch.Tensor) and q.dim() == 4:   # issue 38 hook: batched queries, mlagen/layouts.py
        return layouts.sparse_batched(mla_sparse_prefill, q, kv, indices, topk_length=topk_length, out=out,
                                      max_logits=max_logits, lse=lse, softmax_scale=softmax_scale,
                                      attn_sink=attn_sink, d_v=d_v, kernel=kernel, kv_format=kv_format,
                                      compute=compute)
    if kernel is not None and not isinstance(kernel, str) or not _tracing(q):
        return run(q, kv, indices, softmax_scale=softmax_scale, topk_length=topk_length, attn_sink=attn_sink, d_v=d_v,
                   out=out, max_logits=max_logits, lse=lse, kernel=kernel, kv_format=kv_format, compute=compute,
                   **extra)
    if d_v != D_V:
        raise ArgumentError(f"mla_sparse_prefill: d_v: must be {D_V}, got {d_v!r}")
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
        raise TypeError(f"mla_sparse_prefill: softmax_scale: expected a float, got {softmax_scale!r}")
    if not isinstance(kv_format, str):
        raise TypeError(f"mla_sparse_prefill: kv_format: expected a string, got {kv_format!r}")
    check_compute(compute)   # at trace time, with the eager call's messages
    args = (q, kv, indices, float(softmax_scale), topk_length, attn_sink, kernel, kv_format)
    extra_args = (extra_kv, extra_indices, extra_topk_length, extra_kv_format) if two else ()
    if out is None and max_logits is None and lse is None:
        return torch.ops.mlagen.mla_sparse_prefill(*args, compute, *extra_args)
    o, s = _shapes(q, kv, indices)
    out = q.new_empty(o) if out is None else out
    max_logits = q.new_empty(s, dtype=torch.float32) if max_logits is None else max_logits
    lse = q.new_empty(s, dtype=torch.float32) if lse is None else lse
    torch.ops.mlagen.mla_sparse_prefill_out(*args, out, max_logits, lse, compute, *extra_args)
    return out, max_logits, lse


def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None, extra_kv=None,
                         extra_indices=None, extra_topk_length=None):
    """FlashMLA's ``flash_mla_sparse_fwd`` signature and return order, so serving code can swap
    the import: returns (out, max_logits, lse). Unlike FlashMLA's SM90 kernel, any head count and
    any topk are accepted, and a second pool (``extra_kv`` [N2, 1, d_qk], ``extra_indices``
    [Sq, 1, topk2], ``extra_topk_length``: FlashMLA's decode naming) joins the same softmax. See
    :func:`mla_sparse_prefill`."""
    return mla_sparse_prefill(q, kv, indices, softmax_scale=sm_scale, topk_length=topk_length, attn_sink=attn_sink,
                              d_v=d_v, extra_kv=extra_kv, extra_indices=extra_indices,
                              extra_topk_length=extra_topk_length)
