"""Batched [B, S, H, D] inputs for the packed [T, H, D] kernels, without copying them.

The kernels read q, k, k_rope and v as 3-D strided views (a token stride, a head stride, the
last dimension contiguous) and a ragged batch through cu_seqlens. A batch of B sequences of
equal length goes in as one of these views, chosen in this order:

* ``"tokens"``: every tensor's batch stride is S times its token stride (a contiguous
  [B, S, H, D] tensor, FlashAttention's ``flash_attn_func`` layout): the batch folds into the
  tokens, [B*S, H, D], with cu_seqlens 0, S, 2S, ... made once per (B, S, Sk, device). This is
  exactly the packed call.
* ``"heads"``: every tensor's batch stride is H times its head stride (the transposed view of a
  contiguous [B, H, S, D] tensor, what transformers' attention functions receive): the batch
  folds into the heads, [S, B*H, D]. Every (sequence, head) pair is an independent problem of
  the same lengths, so this is the same attention. A k_rope shared by the heads ([B, Sk, 1, 64])
  has no such view and rules this fold out.
* ``"batch"``: otherwise, one call per sequence on its [S, H, D] views (still no copy).

Outputs are allocated so that the chosen view holds: ``out`` is [B, S, H, d_v] and ``lse``
[B, S, H] (the packed [T, ...] layouts with T split into B, S), either contiguous (tokens, batch)
or views of [B, H, S, d_v] / [S, B, H] memory (heads). Imports torch.
"""

from __future__ import annotations

import torch

from .errors import ArgumentError

FOLDS = ("tokens", "heads", "batch")

# (B, S, Sk, device) -> (cu_seqlens_q, cu_seqlens_k): made once, so that a call allocates nothing.
_cu_cache: dict = {}


def _mergeable(t, outer: int, inner: int) -> bool:
    """Whether dims ``outer`` and ``inner`` of t merge into one strided dim (view, no copy)."""
    return t.size(outer) <= 1 or t.size(inner) <= 1 or t.stride(outer) == t.size(inner) * t.stride(inner)


def _tokens_fold(tensors) -> bool:
    return all(_mergeable(t, 0, 1) for t in tensors if t is not None)


def allowed_folds(tensors) -> tuple[str, ...]:
    """The folds of :data:`FOLDS` that every [B, S, H, ...] tensor (None skipped) allows; "batch"
    always. The heads fold needs every tensor to have q's head count: a shared k_rope
    [B, Sk, 1, 64] would fold to B heads, not B*H."""
    tensors = [t for t in tensors if t is not None]
    heads = tensors[0].size(2)
    ok = {"tokens": _tokens_fold(tensors),
          "heads": all(t.dim() >= 3 and t.size(2) == heads and _mergeable(t, 0, 2) for t in tensors),
          "batch": True}
    return tuple(f for f in FOLDS if ok[f])


def choose_fold(tensors) -> str:
    """The first fold the tensors allow (:func:`allowed_folds`)."""
    return allowed_folds(tensors)[0]


def fold_tokens(t):
    """[B, S, ...] -> [B*S, ...] (a view)."""
    return t.view(t.size(0) * t.size(1), *t.shape[2:])


def fold_heads(t):
    """[B, S, H, ...] -> [S, B*H, ...] (a view)."""
    return t.transpose(0, 1).view(t.size(1), t.size(0) * t.size(2), *t.shape[3:])


def batch_cu_seqlens(batch: int, seqlen_q: int, seqlen_k: int, device, tracing: bool):
    """int32 cu_seqlens of ``batch`` sequences of seqlen_q queries and seqlen_k keys on ``device``.

    Eager calls share one pair per (batch, lengths, device). Traced calls (torch.compile) and calls
    made while capturing a CUDA graph make their own: a captured arange writes its values only at
    replay, so it must not be cached for eager use."""
    key = (batch, seqlen_q, seqlen_k, str(device))
    hit = None if tracing else _cu_cache.get(key)
    if hit is not None:
        return hit
    pair = tuple(torch.arange(0, (batch + 1) * n, n, dtype=torch.int32, device=device) if n else
                 torch.zeros(batch + 1, dtype=torch.int32, device=device) for n in (seqlen_q, seqlen_k))
    capturing = not tracing and torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing()
    if not tracing and not capturing:
        _cu_cache[key] = pair
    return pair


def _fail(fn: str, arg: str, message: str):
    raise ArgumentError(f"{fn}: {arg}: {message}")


def _check_batched(fn: str, named: dict, batch: int, dims: dict) -> None:
    for name, t in named.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn}: {name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != dims[name]:
            _fail(fn, name, f"q is batched [B, S, H, D], so {name} must have {dims[name]} dimensions, "
                            f"got shape {tuple(t.shape)}")
        if t.size(0) != batch:
            _fail(fn, name, f"has batch {t.size(0)}, q has {batch}")


def dense_batched(call, tracing: bool, q, k, v, *, k_rope=None, cu_seqlens_q=None, cu_seqlens_k=None, out=None,
                  lse=None, fold=None, **rest):
    """``call`` (mlagen's packed ``mla_prefill``) on batched inputs: q [B, S, H, 192], k
    [B, Sk, H, 192 or 128], v [B, Sk, H, 128], k_rope [B, Sk, 1 or H, 64]; returns out
    [B, S, H, 128] and lse [B, S, H]. ``fold`` forces one of :data:`FOLDS` (tests, benchmarks);
    a fold the strides do not allow (:func:`allowed_folds`) raises ValueError."""
    fn = "mla_prefill"
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if cu is not None:
            _fail(fn, name, "batched [B, S, H, D] inputs are sequences of equal length and take no cu_seqlens; "
                            "pass packed [T, H, D] inputs for a ragged batch")
    batch, seqlen, heads = q.shape[0], q.shape[1], q.shape[2]
    _check_batched(fn, {"k": k, "v": v, "k_rope": k_rope, "out": out, "lse": lse}, batch,
                   {"k": 4, "v": 4, "k_rope": 4, "out": 4, "lse": 3})
    seqlen_k = k.shape[1]
    d_v = v.shape[3]
    inputs = (q, k, v, k_rope)
    allowed = allowed_folds(inputs + (out, lse))
    if fold is None:
        fold = allowed[0]
    elif fold not in FOLDS:
        _fail(fn, "fold", f"must be one of {', '.join(FOLDS)}, got {fold!r}")
    elif fold not in allowed:
        _fail(fn, "fold", f"{fold!r} does not fit these tensors' strides (they allow {', '.join(allowed)})")
    if batch == 1 or seqlen == 0 or seqlen_k == 0:
        fold = "batch"   # no batch to fold, or nothing for the fold's arithmetic to divide
    device = q.device
    if tracing and out is None and lse is None:
        # Traced (torch.compile): the functional op allocates, and the result is viewed back, so the
        # graph holds no mutation of a view (the eager path below writes into views it allocated).
        return _traced(call, fold, batch, seqlen, seqlen_k, device, q, k, v, k_rope, rest)
    if fold == "heads":
        if out is None:
            out = torch.empty((batch, heads, seqlen, d_v), dtype=torch.bfloat16, device=device).transpose(1, 2)
        if lse is None:
            lse = torch.empty((seqlen, batch, heads), dtype=torch.float32, device=device).transpose(0, 1)
        call(*(fold_heads(t) for t in (q, k, v)), k_rope=None if k_rope is None else fold_heads(k_rope),
             out=fold_heads(out), lse=fold_heads(lse), **rest)
        return out, lse
    if out is None:
        out = torch.empty((batch, seqlen, heads, d_v), dtype=torch.bfloat16, device=device)
    if lse is None:
        lse = torch.empty((batch, seqlen, heads), dtype=torch.float32, device=device)
    if fold == "tokens":
        cu_q, cu_k = batch_cu_seqlens(batch, seqlen, seqlen_k, device, tracing)
        call(*(fold_tokens(t) for t in (q, k, v)), k_rope=None if k_rope is None else fold_tokens(k_rope),
             cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, out=fold_tokens(out), lse=fold_tokens(lse), **rest)
        return out, lse
    for b in range(batch):
        call(q[b], k[b], v[b], k_rope=None if k_rope is None else k_rope[b], out=out[b], lse=lse[b], **rest)
    return out, lse


def _traced(call, fold, batch, seqlen, seqlen_k, device, q, k, v, k_rope, rest):
    if fold == "heads":
        out, lse = call(*(fold_heads(t) for t in (q, k, v)), k_rope=None if k_rope is None else fold_heads(k_rope),
                        **rest)   # [S, B*H, d_v], [S, B*H]
        return (out.view(seqlen, batch, -1, out.shape[-1]).transpose(0, 1),
                lse.view(seqlen, batch, -1).transpose(0, 1))
    if fold == "tokens":
        cu_q, cu_k = batch_cu_seqlens(batch, seqlen, seqlen_k, device, True)
        out, lse = call(*(fold_tokens(t) for t in (q, k, v)), k_rope=None if k_rope is None else fold_tokens(k_rope),
                        cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **rest)
        return out.view(batch, seqlen, *out.shape[1:]), lse.view(batch, seqlen, -1)
    parts = [call(q[b], k[b], v[b], k_rope=None if k_rope is None else k_rope[b], **rest) for b in range(batch)]
    return torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])


def sparse_batched(call, q, kv, indices, *, topk_length=None, out=None, max_logits=None, lse=None, **rest):
    """``call`` (mlagen's ``mla_sparse_prefill``) on batched queries: q [B, S, H, d_qk] over one
    shared pool ``kv`` (indices are rows of the pool, so every sequence's queries are independent),
    indices [B, S, topk] (or FlashMLA's [B, S, 1, topk]), topk_length [B, S]; returns out
    [B, S, H, 512], max_logits and lse [B, S, H]. Folds into the tokens when the strides allow,
    else one call per sequence; no copy either way."""
    fn = "mla_sparse_prefill"
    batch, seqlen, heads = q.shape[0], q.shape[1], q.shape[2]
    if not isinstance(indices, torch.Tensor):
        raise TypeError(f"{fn}: indices: expected a torch.Tensor, got {type(indices).__name__}")
    dims = {"indices": 4 if indices.dim() == 4 else 3, "topk_length": 2, "out": 4, "max_logits": 3, "lse": 3}
    named = {"indices": indices, "topk_length": topk_length, "out": out, "max_logits": max_logits, "lse": lse}
    _check_batched(fn, named, batch, dims)
    d_v = rest.get("d_v", 512)
    device = q.device
    if out is None:
        out = torch.empty((batch, seqlen, heads, d_v), dtype=torch.bfloat16, device=device)
    if max_logits is None:
        max_logits = torch.empty((batch, seqlen, heads), dtype=torch.float32, device=device)
    if lse is None:
        lse = torch.empty((batch, seqlen, heads), dtype=torch.float32, device=device)
    if _tokens_fold((q, indices, topk_length, out, max_logits, lse)):
        fold = fold_tokens
        call(fold(q), kv, fold(indices), topk_length=None if topk_length is None else fold(topk_length),
             out=fold(out), max_logits=fold(max_logits), lse=fold(lse), **rest)
        return out, max_logits, lse
    for b in range(batch):
        call(q[b], kv, indices[b], topk_length=None if topk_length is None else topk_length[b], out=out[b],
             max_logits=max_logits[b], lse=lse[b], **rest)
    return out, max_logits, lse
