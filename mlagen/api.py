"""The public entry points: kernels called on torch tensors."""

from __future__ import annotations

import math

from .dispatch import dispatcher
from .families import mla_prefill as _family
from .variant import Variant


def mla_prefill(q, k, v, *, k_rope=None, cu_seqlens_q=None, cu_seqlens_k=None, causal=True, softmax_scale=None,
                out=None, lse=None, check_seqlens=None, kernel=None):
    """Dense MLA prefill attention (unabsorbed, "MHA mode"), as in MLA.md section 1.

    Args:
        q: [Tq, H, 192] bf16, nope (128) followed by rope (64). Strided views are fine; the last
            dimension must be contiguous.
        k: [Tk, H, 192] bf16, or [Tk, H, 128] (nope only) when ``k_rope`` is given.
        v: [Tk, H, 128] bf16.
        k_rope: optional [Tk, 1, 64] (one rope key shared by all heads: the MLA case; read once
            per key tile, never expanded) or [Tk, H, 64].
        cu_seqlens_q, cu_seqlens_k: optional int32 [B + 1] offsets of a packed (ragged) batch;
            both or neither. Sequence b has queries cu_seqlens_q[b]:cu_seqlens_q[b+1].
        causal: bottom-right aligned: query i of a sequence sees key j iff j <= i + Lk - Lq.
        softmax_scale: defaults to 1/sqrt(192).
        out: optional preallocated [Tq, H, 128] bf16 output (16-byte aligned strides).
        lse: optional preallocated [Tq, H] fp32 output (heads contiguous).
        check_seqlens: read cu_seqlens back and check they start at 0, never decrease and end
            at the packed lengths. Default: on, except while capturing a CUDA graph (reading
            them would synchronise). CPU cu_seqlens are always checked, at no cost. Unchecked
            values can give wrong results but never out-of-bounds accesses.
        kernel: optional spec name (e.g. ``"mla_prefill_sm80"``) or Variant to force a kernel;
            by default the best kernel for the device, tuned for this shape class if the tuning
            database or the shipped records know one.

    Returns:
        (out, lse): out [Tq, H, 128] bf16; lse [Tq, H] fp32, natural log. A row that sees no key
        gives out = 0 and lse = +inf.

    The launch goes on the current torch stream with no host synchronisation (after the first
    call of a shape class, which may compile), so it can be captured in a CUDA graph.
    """
    import torch

    call = _family.prepare(q, k, v, k_rope=k_rope, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                           causal=causal, softmax_scale=softmax_scale, out=out, lse=lse,
                           check_seqlens=check_seqlens)
    if call.empty:
        return call.out, call.lse
    if call.total_k == 0:  # no keys anywhere: every row sees nothing
        call.out.zero_()
        call.lse.fill_(math.inf)
        return call.out, call.lse
    device, selection = _select(call, kernel)
    with torch.cuda.device(device):
        _family.launch(selection, call, torch.cuda.current_stream(device).cuda_stream)
    return call.out, call.lse


def _select(call, kernel):
    import torch

    device = call.q.device.index if call.q.device.index is not None else torch.cuda.current_device()
    selection = dispatcher().select(
        _family.FAMILY.name, str(call.key), {"mask": call.mask}, device,
        accepts=lambda spec: _family.accepts(spec, call),
        variant=kernel if isinstance(kernel, Variant) else None,
        only=kernel if isinstance(kernel, str) else None,
    )
    return device, selection


def mla_prefill_kernel(q, k, v, *, k_rope=None, cu_seqlens_q=None, cu_seqlens_k=None, causal=True, kernel=None):
    """The kernel :func:`mla_prefill` would run for these arguments, without running it.

    Returns the dispatcher's Selection: ``.spec``, ``.variant`` (``.variant.symbol``), ``.origin``
    ("default", "user" for the tuning database, "shipped:<file>" for packaged records, or
    "explicit"), ``.binary.resources`` (registers and spills from ptxas). Builds the kernel if it
    is not built yet.
    """
    call = _family.prepare(q, k, v, k_rope=k_rope, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                           causal=causal, check_seqlens=False)
    return _select(call, kernel)[1]


# --- sparse MLA prefill (MLA.md section 2) ----------------------------------------------------
# A torch.library custom op wrapping mla_sparse_prefill belongs beside the dense one once its
# registration pattern lands (hook: register `_sparse_prefill_impl` with mutated outputs).


def mla_sparse_prefill(q, kv, indices, *, softmax_scale, topk_length=None, attn_sink=None, d_v=512, out=None,
                       kernel=None):
    """Sparse MLA prefill (DeepSeek-V3.2 DSA, absorbed "MQA mode"), as in MLA.md section 2.

    Args:
        q: [Sq, H, 576] bf16 (512 latent + 64 rope) or [Sq, H, 512]; any H >= 1. Strided views
            are fine (last dimension contiguous; 16-byte aligned strides are read in place).
        kv: the latent cache, one head shared by all query heads: [N, d_qk], [N, 1, d_qk], or a
            paged pool [num_blocks, page_size, d_qk] whose row ``r`` is page ``r // page_size``,
            offset ``r % page_size`` (pages may be strided). V is the first 512 columns of a row.
        indices: [Sq, topk] or [Sq, 1, topk] int32 row ids into kv. Entries < 0 or >= N are
            invalid: they count for nothing and are never read. Duplicates count each time.
        softmax_scale: scale of q . k (natural-log units).
        topk_length: optional [Sq] int32: only the first topk_length[t] entries of row t count.
        attn_sink: optional [H] fp32 (natural-log units): adds exp(sink - max) to the softmax
            denominator only; lse and max_logits ignore it. +inf gives out 0.
        d_v: must be 512.
        out: optional preallocated [Sq, H, 512] bf16 (4-byte aligned strides).
        kernel: optional spec name or Variant to force a kernel (default: dispatch).

    Returns:
        (out, max_logits, lse): out [Sq, H, 512] bf16; max_logits and lse [Sq, H] fp32, natural
        log. A row with no valid entry gives out 0, max_logits -inf and lse +inf.

    Never synchronises the host (after the first call of a shape class, which may compile), so
    it can be captured in a CUDA graph.
    """
    import torch

    from .families import mla_sparse_prefill as sparse

    call = sparse.prepare(q, kv, indices, softmax_scale=softmax_scale, topk_length=topk_length,
                          attn_sink=attn_sink, d_v=d_v, out=out)
    if call.empty:
        if call.sq:
            sparse.fill_empty(call)
        return call.out, call.max_logits, call.lse
    device, selection = _select_sparse(call, kernel)
    with torch.cuda.device(device):
        sparse.launch(selection, call, torch.cuda.current_stream(device).cuda_stream)
    return call.out, call.max_logits, call.lse


def _select_sparse(call, kernel):
    import torch

    from .families import mla_sparse_prefill as sparse

    device = call.q.device.index if call.q.device.index is not None else torch.cuda.current_device()
    selection = dispatcher().select(
        sparse.FAMILY.name, str(call.key), sparse.specialization(call), device,
        accepts=lambda spec: sparse.accepts(spec, call),
        variant=kernel if isinstance(kernel, Variant) else None,
        only=kernel if isinstance(kernel, str) else None,
    )
    return device, selection


def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None):
    """FlashMLA's ``flash_mla_sparse_fwd`` signature and return order, so serving code can swap
    the import: returns (out, max_logits, lse). Unlike FlashMLA's SM90 kernel, any head count and
    any topk >= 1 are accepted. See :func:`mla_sparse_prefill`."""
    return mla_sparse_prefill(q, kv, indices, softmax_scale=sm_scale, topk_length=topk_length, attn_sink=attn_sink,
                              d_v=d_v)
