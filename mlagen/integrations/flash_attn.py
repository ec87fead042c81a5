"""FlashAttention's dense calls on mlagen's MLA prefill kernels, so that a serving stack swaps
the import (``from mlagen import flash_attn_varlen_func``) and keeps its call site.

The conventions are FlashAttention 2's (``flash_attn/flash_attn_interface.py``), with the keyword
arguments vLLM's ``vllm_flash_attn`` wrapper adds (``return_softmax_lse``, ``out``, ``fa_version``,
``scheduler_metadata``, ``num_splits``) and FlashAttention 3's descale factors:

* ``flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, ...)``:
  q [total_q, H, 192], k [total_k, H, 192], v [total_k, H, 128] (packed sequences); out
  [total_q, H, 128]; softmax_lse [H, total_q].
* ``flash_attn_func(q, k, v, ...)``: q [B, Sq, H, 192], k [B, Sk, H, 192], v [B, Sk, H, 128];
  out [B, Sq, H, 128]; softmax_lse [B, H, Sq].
* softmax_lse is float32, natural log (logsumexp of the scaled scores); a row that sees no key
  has +inf, as in FlashAttention. It is contiguous in FlashAttention's layout, which costs one
  small copy ([Sq, H] to [H, Sq] float32), made only when the lse is asked for.
* ``causal`` is bottom-right aligned (query i of a sequence sees key j iff j <= i + Lk - Lq),
  ``softmax_scale`` defaults to 1/sqrt(q.shape[-1]).
* Returns ``out``; with ``return_softmax_lse=True`` (vLLM) ``(out, softmax_lse)``; with
  ``return_attn_probs=True`` (FlashAttention 2) ``(out, softmax_lse, None)``: FlashAttention
  returns the attention probabilities only with dropout, which mlagen does not do.

``window_size`` (local attention) and ``softcap`` pass through to mlagen (MLA.md section 1b), with
FlashAttention's rules. An argument mlagen cannot honour (dropout_p > 0, alibi_slopes, a paged
``block_table``, fewer key heads than query heads) raises a ValueError naming it. Imports torch.
"""

from __future__ import annotations

import torch

from ..families.mla_prefill.op import mla_prefill

__all__ = ["flash_attn_func", "flash_attn_varlen_func"]


def _fail(fn: str, arg: str, message: str):
    raise ValueError(f"{fn}: {arg}: {message}")


def _mask(fn: str, causal, window_size, softcap, alibi_slopes, dropout_p, max_seqlen_k) -> tuple:
    """(causal, window_size, softcap) for mlagen, from FlashAttention's mask arguments, or an error
    naming the one it cannot honour. FlashAttention's rules: a window side of -1, or of at least the
    longest key sequence, is unbounded; causal is the window (-1, 0) and sets the right side to 0."""
    if not isinstance(causal, bool):
        raise TypeError(f"{fn}: causal: expected a bool, got {causal!r}")
    if dropout_p:
        _fail(fn, "dropout_p", f"mlagen does not do dropout (inference only); got {dropout_p!r}, pass 0.0")
    if alibi_slopes is not None:
        _fail(fn, "alibi_slopes", "ALiBi is not supported by mlagen's kernels")
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not softcap >= 0:
        _fail(fn, "softcap", f"expected a number >= 0 (0.0: none), got {softcap!r}")
    if window_size is None:
        window_size = (-1, -1)
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        raise TypeError(f"{fn}: window_size: expected a pair of ints (left, right), got {window_size!r}") from None
    if max_seqlen_k is not None:
        left, right = (-1 if w >= max_seqlen_k else w for w in (left, right))
    if left < -1 or right < -1:
        _fail(fn, "window_size", f"each side is >= 0, or -1 for unbounded; got {tuple(window_size)!r}")
    if causal:   # FlashAttention's causal is the window (left, 0) whatever right was given
        right = 0
    if left < 0 and right < 0:
        return False, (-1, -1), float(softcap)
    if left < 0 and right == 0:
        return True, (-1, -1), float(softcap)
    return False, (left, right), float(softcap)


def _descale(fn: str, name: str, t, heads: int):
    """FlashAttention 3's descale factors ([1], or [batch, heads_k] with one batch row) as mlagen's [1] / [H]."""
    if t is None or t.dim() == 1:
        return t
    if t.dim() == 2 and t.shape[0] == 1 and t.shape[1] in (1, heads):
        return t[0]
    _fail(fn, name, f"mlagen takes one factor per tensor or per head ([1] or [{heads}], or FlashAttention 3's "
                    f"[1, {heads}]), got shape {tuple(t.shape)}")


def _heads(fn: str, q, k, v) -> int:
    for name, t in (("k", k), ("v", v)):
        if isinstance(t, torch.Tensor) and isinstance(q, torch.Tensor) and t.dim() == q.dim() and \
                t.shape[-2] != q.shape[-2]:
            _fail(fn, name, f"has {t.shape[-2]} heads, q has {q.shape[-2]}: mlagen's dense MLA kernels need as "
                            "many key heads as query heads (no grouped-query attention)")
    return q.shape[-2] if isinstance(q, torch.Tensor) and q.dim() >= 2 else 0


def _want_lse(fn: str, return_softmax_lse: bool, return_attn_probs: bool) -> bool:
    if return_softmax_lse and return_attn_probs:
        _fail(fn, "return_attn_probs", "give return_softmax_lse (vLLM's: returns (out, lse)) or return_attn_probs "
                                       "(FlashAttention's: returns (out, lse, None)), not both")
    return bool(return_softmax_lse or return_attn_probs)


def _returns(out, lse, return_softmax_lse: bool, return_attn_probs: bool):
    if return_softmax_lse:
        return out, lse
    if return_attn_probs:
        return out, lse, None
    return out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, *,
                           return_softmax_lse=False, out=None, seqused_k=None, q_descale=None, k_descale=None,
                           v_descale=None, fa_version=None, scheduler_metadata=None, num_splits=0):
    """FlashAttention's ``flash_attn_varlen_func`` (packed sequences) on mlagen's dense MLA kernels.

    Args:
        q: [total_q, H, 192] bf16 (or fp8 e4m3 with descales), nope (128) then rope (64).
        k: [total_k, H, 192]; v: [total_k, H, 128]. Strided views are read in place (last
            dimension contiguous).
        cu_seqlens_q, cu_seqlens_k: int32 [B + 1] offsets of the sequences.
        max_seqlen_q, max_seqlen_k: host ints bounding the longest sequence.
        dropout_p: must be 0.0. softmax_scale: default 1/sqrt(q.shape[-1]).
        causal: bottom-right aligned. window_size: (left, right) local attention, -1 unbounded;
            a side at or beyond max_seqlen_k counts as unbounded, as in FlashAttention.
        softcap: c > 0 caps the scores (c * tanh(s / c)); 0.0 none. alibi_slopes, block_table,
            seqused_k: must be None.
        deterministic: accepted; the forward pass is deterministic anyway.
        return_attn_probs: FlashAttention's: return (out, softmax_lse, None).
        return_softmax_lse: vLLM's: return (out, softmax_lse).
        out: optional preallocated [total_q, H, 128] bf16 output (vLLM's).
        q_descale, k_descale, v_descale: fp8 inputs: float32 [1], [H] or FlashAttention 3's [1, H].
        fa_version, scheduler_metadata, num_splits: vLLM's tuning hints for FlashAttention's own
            kernels; accepted and ignored (mlagen picks its kernel by its tuning records).

    Returns:
        out [total_q, H, 128] bf16, with softmax_lse [H, total_q] float32 (natural log) as asked.
    """
    fn = "flash_attn_varlen_func"
    causal, window, softcap = _mask(fn, causal, window_size, softcap, alibi_slopes, dropout_p, max_seqlen_k)
    for name, value in (("block_table", block_table), ("seqused_k", seqused_k)):
        if value is not None:
            _fail(fn, name, "paged or partly used key caches are not supported by the dense kernels; pass None")
    want_lse = _want_lse(fn, return_softmax_lse, return_attn_probs)
    heads = _heads(fn, q, k, v)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    o, lse = mla_prefill(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, causal=causal,
                         softmax_scale=scale, out=out, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                         window_size=window, softcap=softcap,
                         q_descale=_descale(fn, "q_descale", q_descale, heads),
                         k_descale=_descale(fn, "k_descale", k_descale, heads),
                         v_descale=_descale(fn, "v_descale", v_descale, heads))
    return _returns(o, lse.t().contiguous() if want_lse else None, return_softmax_lse, return_attn_probs)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False, *, return_softmax_lse=False,
                    q_descale=None, k_descale=None, v_descale=None):
    """FlashAttention's ``flash_attn_func`` (a batch of equal-length sequences) on mlagen's kernels.

    q [B, Sq, H, 192], k [B, Sk, H, 192], v [B, Sk, H, 128], with any batch, sequence and head
    strides (the last dimension contiguous): contiguous tensors and the transposed views of
    [B, H, S, D] tensors go in without a copy (:mod:`mlagen.layouts`). The other arguments are
    :func:`flash_attn_varlen_func`'s (a window side at or beyond Sk counts as unbounded).

    Returns:
        out [B, Sq, H, 128] bf16 (a view whose strides follow the inputs' fold), with
        softmax_lse [B, H, Sq] float32 (natural log, contiguous) as asked.
    """
    fn = "flash_attn_func"
    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        _fail(fn, "q", f"expected a [batch, seqlen, heads, 192] tensor, got "
                       f"{tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__}")
    max_seqlen_k = k.shape[1] if isinstance(k, torch.Tensor) and k.dim() == 4 else None
    causal, window, softcap = _mask(fn, causal, window_size, softcap, alibi_slopes, dropout_p, max_seqlen_k)
    want_lse = _want_lse(fn, return_softmax_lse, return_attn_probs)
    heads = _heads(fn, q, k, v)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    o, lse = mla_prefill(q, k, v, causal=causal, softmax_scale=scale, window_size=window, softcap=softcap,
                         q_descale=_descale(fn, "q_descale", q_descale, heads),
                         k_descale=_descale(fn, "k_descale", k_descale, heads),
                         v_descale=_descale(fn, "v_descale", v_descale, heads))
    return _returns(o, lse.permute(0, 2, 1).contiguous() if want_lse else None, return_softmax_lse,
                    return_attn_probs)
