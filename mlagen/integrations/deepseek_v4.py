"""DeepSeek-V4 attention (MLA.md section 2b) on mlagen's sparse prefill: the index lists of its
three layer types, built on the device without a host synchronisation, and the call.

A V4 layer's keys are one KV head of 512 columns (448 nope + 64 rope) that is also V, drawn from
two pools: the raw tokens (a sliding window of W = 128 up to and including the query) and, in a
CSA / HCA layer, a compressed pool (CSA: the indexer's top-k of a 4x-compressed pool; HCA: every
128x-compressed entry complete at the query's position). Each builder here returns a
:class:`Pool`: rows, and per query the row ids (int32, -1 where invalid) and how many of the first
ones count. Two ways to build them:

* from an additive attention mask, which is what transformers' ``DeepseekV4Attention`` hands its
  attention interface (the compressed entries concatenated after the window's and the indexer's
  choice folded into the mask): :func:`mask_pool`, on :func:`compact`;
* from sequence boundaries and positions, a server's view of the same layer (packed sequences,
  bottom-right aligned queries as in ``flash_attn_varlen_func``): :func:`window_pool` (the raw
  tokens), :func:`hca_pool` and :func:`csa_pool` (the compressed pool).

:func:`attend` runs the layer over its pools. Today that is one ``mla_sparse_prefill`` call over
one pool; pools given separately are concatenated first (:func:`one_pool`, the copy a server
without a two-pool kernel makes). The two-pool call (``extra_kv`` / ``extra_indices`` /
``extra_topk_length``, MLA.md section 2b) takes a second pool as it is, and :func:`attend` uses it
once ``mla_sparse_prefill`` has it.

Nothing here reads a device value on the host: the index widths come from shapes and the model's
own bounds, so a layer can be captured in a CUDA graph. Imports torch.
"""

from __future__ import annotations

import inspect
import math
from typing import NamedTuple, Optional

import torch

from ..families.mla_sparse_prefill import op as sparse_op

D_QK = 512   # one KV head: 448 nope + 64 rope, also V

__all__ = ["Pool", "attend", "compact", "csa_pool", "hca_pool", "mask_pool", "one_pool", "token_positions",
           "window_pool"]


class Pool(NamedTuple):
    """One pool of KV rows and the rows each query reads from it.

    kv: [N, 512] bf16 rows. indices: [T, k] (or batched [B, S, k]) int32 row ids, -1 where invalid.
    length: [T] (or [B, S]) int32, only the first length[t] entries of row t count, or None
    (every entry counts, -1 excepted). overflow: a bool [T] (or [B, S]) marking rows that had more
    keys than the width k could hold (only :func:`mask_pool` sets it), or None.
    """

    kv: torch.Tensor
    indices: torch.Tensor
    length: Optional[torch.Tensor] = None
    overflow: Optional[torch.Tensor] = None


def compact(valid: torch.Tensor, width: int):
    """The positions of the True entries of each row of ``valid`` [..., K], first to last, in a
    list of ``width``: returns (indices [..., width] int32 with -1 past the row's count, count
    [...] int32 clamped to ``width``, overflow [...] bool: the row had more than ``width``).
    A cumulative sum and a scatter, no sort and no host synchronisation."""
    if valid.dtype != torch.bool:
        raise TypeError(f"compact: valid: expected a bool tensor, got {valid.dtype}")
    if isinstance(width, bool) or not isinstance(width, int) or width < 0:
        raise ValueError(f"compact: width: expected an int >= 0, got {width!r}")
    k = valid.shape[-1]
    count = valid.sum(-1, dtype=torch.int32)
    slot = valid.cumsum(-1, dtype=torch.int32) - 1
    # Column j goes to slot[j] when it is valid and fits; everything else to a spare slot, dropped.
    slot = torch.where(valid & (slot < width), slot, width).long()
    cols = torch.arange(k, device=valid.device, dtype=torch.int32).expand_as(slot)
    out = torch.full((*valid.shape[:-1], width + 1), -1, dtype=torch.int32, device=valid.device)
    out.scatter_(-1, slot, cols)
    return out[..., :width], count.clamp(max=width), count > width


def mask_pool(kv: torch.Tensor, bias: torch.Tensor, width: int) -> Pool:
    """The pool of a batch of V4 layers from an additive mask: kv [B, K, 512] (each sequence's
    keys), bias [B, S, K] (0 where query s sees key k, -inf or the dtype's minimum where not; any
    other value counts as masked). Returns the pool over kv's B * K rows (sequence b's keys are
    rows b * K ...) with indices [B, S, width], length [B, S] and the overflow rows (more than
    ``width`` keys; the caller must not trust their result)."""
    if kv.dim() != 3 or bias.dim() != 3 or bias.shape[0] != kv.shape[0] or bias.shape[2] != kv.shape[1]:
        raise ValueError(f"mask_pool: bias: expected [B, S, K] for kv [B, K, d], got bias {tuple(bias.shape)} and "
                         f"kv {tuple(kv.shape)}")
    batch, keys = kv.shape[0], kv.shape[1]
    indices, length, overflow = compact(bias == 0, min(width, keys))
    if batch > 1:
        offset = (torch.arange(batch, device=kv.device, dtype=torch.int32) * keys).view(batch, 1, 1)
        indices = torch.where(indices >= 0, indices + offset, indices)
    return Pool(kv.reshape(batch * keys, kv.shape[-1]), indices, length, overflow)


def token_positions(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, total_q: int):
    """For packed queries (``cu_seqlens_q`` over ``total_q`` tokens, keys ``cu_seqlens_k``):
    each token's sequence and its key position, bottom-right aligned (query i of a sequence of
    Lq queries over Lk keys is at position i + Lk - Lq, so a cached prefix comes first)."""
    t = torch.arange(total_q, device=cu_seqlens_q.device, dtype=cu_seqlens_q.dtype)
    seq = torch.searchsorted(cu_seqlens_q[1:].contiguous(), t, right=True)
    lq = cu_seqlens_q[seq + 1] - cu_seqlens_q[seq]
    lk = cu_seqlens_k[seq + 1] - cu_seqlens_k[seq]
    return seq, t - cu_seqlens_q[seq] + lk - lq


def _first_rows(start: torch.Tensor, count: torch.Tensor, width: int) -> torch.Tensor:
    """[T, width] int32: start[t] + j for j < count[t], -1 after."""
    j = torch.arange(width, device=start.device, dtype=torch.int32)
    rows = start.to(torch.int32).unsqueeze(1) + j
    return torch.where(j < count.unsqueeze(1), rows, -1)


def window_pool(kv: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, total_q: int,
                window: int = 128) -> Pool:
    """The raw-token pool of a V4 layer: kv [total_k, 512] holds each sequence's keys back to back
    (``cu_seqlens_k``); query t at key position p reads the ``window`` keys up to and including
    its own (fewer near the sequence start). Indices [total_q, window], oldest first."""
    seq, pos = token_positions(cu_seqlens_q, cu_seqlens_k, total_q)
    count = torch.clamp(torch.minimum(pos + 1, torch.full_like(pos, window)), min=0)
    return Pool(kv, _first_rows(cu_seqlens_k[seq] + pos + 1 - count, count, window), count.to(torch.int32))


def hca_pool(ckv: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, cu_entries: torch.Tensor,
             total_q: int, rate: int, width: int) -> Pool:
    """The compressed pool of an HCA layer: ckv holds each sequence's compressed entries back to
    back (``cu_entries``; entry w of a sequence covers its key positions [w * rate, (w+1) * rate)).
    Query t at position p reads every complete entry, w < (p + 1) // rate, at most ``width``
    (a static bound: the longest sequence's entry count)."""
    seq, pos = token_positions(cu_seqlens_q, cu_seqlens_k, total_q)
    entries = cu_entries[seq + 1] - cu_entries[seq]
    count = torch.clamp(torch.minimum(torch.div(pos + 1, rate, rounding_mode="floor"), entries), min=0, max=width)
    return Pool(ckv, _first_rows(cu_entries[seq], count, width), count.to(torch.int32))


def csa_pool(ckv: torch.Tensor, topk: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_entries: torch.Tensor) -> Pool:
    """The compressed pool of a CSA layer: the indexer's choice ``topk`` [total_q, k] (entry ids
    within the query's sequence, -1 for none, as transformers' indexer returns them) as rows of
    ckv (sequences' entries back to back, ``cu_entries``). An id outside its sequence's entries
    is invalid."""
    seq, _ = token_positions(cu_seqlens_q, cu_seqlens_q, topk.shape[0])
    start = cu_entries[seq].unsqueeze(1)
    entries = (cu_entries[seq + 1] - cu_entries[seq]).unsqueeze(1)
    ok = (topk >= 0) & (topk < entries)
    return Pool(ckv, torch.where(ok, topk + start, -1).to(torch.int32))


def _valid(pool: Pool) -> torch.Tensor:
    valid = pool.indices >= 0
    if pool.length is not None:
        width = pool.indices.shape[-1]
        valid &= torch.arange(width, device=valid.device) < pool.length.unsqueeze(-1)
    return valid


def one_pool(*pools: Pool) -> Pool:
    """The pools as one: their rows concatenated (a copy of each pool's kv), each query's valid
    entries listed first (:func:`compact`), so the one-pool call sees the union of the keys."""
    if len(pools) == 1:
        return pools[0]
    kv = torch.cat([p.kv.reshape(-1, p.kv.shape[-1]) for p in pools])
    parts, base = [], 0
    for p in pools:
        parts.append(torch.where(_valid(p), p.indices + base, -1))
        base += p.kv.reshape(-1, p.kv.shape[-1]).shape[0]
    rows = torch.cat(parts, dim=-1)
    slot, length, _ = compact(rows >= 0, rows.shape[-1])
    indices = torch.where(slot >= 0, torch.gather(rows, -1, slot.clamp(min=0).long()), -1)
    return Pool(kv, indices, length)


def _has_two_pools() -> bool:
    return "extra_kv" in inspect.signature(sparse_op.mla_sparse_prefill).parameters


def attend(q: torch.Tensor, pools, *, softmax_scale: float, attn_sink=None):
    """A V4 layer's attention: q [T, H, 512] (or batched [B, S, H, 512], with the pools' indices
    batched alike) over the union of the pools' keys, one softmax, the sink in the denominator.
    Returns out [..., H, 512] bf16 (rows a pool marks as overflowing are NaN: their keys did not
    fit the index lists)."""
    pools = list(pools)
    if not pools or len(pools) > 2:
        raise ValueError(f"attend: pools: expected one or two pools, got {len(pools)}")
    if len(pools) == 2 and q.dim() == 3 and _has_two_pools():   # the two-pool call takes packed queries
        main, extra = pools
        out, _, _ = sparse_op.mla_sparse_prefill(q, main.kv, main.indices, topk_length=main.length,
                                                 extra_kv=extra.kv, extra_indices=extra.indices,
                                                 extra_topk_length=extra.length, attn_sink=attn_sink,
                                                 softmax_scale=softmax_scale)
    else:
        pool = one_pool(*pools)
        out, _, _ = sparse_op.mla_sparse_prefill(q, pool.kv, pool.indices, topk_length=pool.length,
                                                 attn_sink=attn_sink, softmax_scale=softmax_scale)
    for p in pools:
        if p.overflow is not None:
            out = out.masked_fill(p.overflow.unsqueeze(-1).unsqueeze(-1), math.nan)
    return out
