"""``attn_implementation="mlagen"`` for transformers' MLA models: importing this module registers
mlagen's dense MLA prefill as an attention function (``transformers.AttentionInterface``) and its
mask function (``AttentionMaskInterface``)::

    import mlagen.integrations.transformers  # registers "mlagen"
    model = AutoModelForCausalLM.from_config(config, attn_implementation="mlagen", dtype=torch.bfloat16)

Models whose attention calls the interface with MLA's geometry use it: DeepSeek-V3 / R1 and
Kimi-K2 (``DeepseekV3ForCausalLM``: d_qk 192, d_v 128). GLM-5's dense geometry (d_v 256) and
sparse attention need kernels mlagen does not have yet; such a call raises a ValueError naming
the tensor.

What the attention function does with what the model hands over (query / key / value
[B, H, S, D] bf16, a padding mask or None):

* no padding (mask None): the [B, S, H, D] transposed views go into :func:`mlagen.mla_prefill`
  as they are (:mod:`mlagen.layouts` folds the batch without copying q, k or v); the output is
  [B, S, H, 128].
* padding (a [B, Sk] boolean mask, the same one FlashAttention 2 gets): the valid tokens are
  gathered into packed sequences (a copy, as transformers' FlashAttention path does) and the
  output scattered back, with zeros on padded query rows. Finding the valid tokens reads the mask
  on the host (a synchronisation, as FlashAttention's path has).
* packed sequences given by FlashAttention keyword arguments (``cu_seq_lens_q`` / ``_k``,
  ``max_length_q`` / ``_k``, batch 1) go in as they are.

Masks other than causal or full (sliding windows, packed-sequence position ids without
``cu_seq_lens``, custom and/or mask functions) raise a ValueError: mlagen's kernels mask
causally only. Causality is ``module.is_causal`` (or the ``is_causal`` keyword), bottom-right
aligned, so decoding with a cache is right too. Inputs must be bf16 (a float32 model raises a
TypeError naming q); dropout must be 0 (``model.eval()``).

DeepSeek-V4 (``DeepseekV4ForCausalLM``, MLA.md section 2b) uses the same name: its attention calls
the interface with q [B, H, S, 512], the one KV head [B, 1, K, 512] as both key and value (the
window's raw tokens with the compressed entries of a CSA / HCA layer appended), an additive mask
[B, 1, S, K] (the sliding window, padding, and the compressor's causality and indexer choice) and
the per-head sink ``s_aux``. For a V4 config the mask function returns that additive mask (the
eager one: V4 appends the compressor's part to it, and without it a CSA layer would see every
compressed entry), and the attention function turns it into index lists on the device
(:func:`mlagen.integrations.deepseek_v4.mask_pool`, no host synchronisation) and runs
:func:`mlagen.mla_sparse_prefill` over the model's own KV rows, one pool, with the sink. The lists
are as wide as the layer's keys can be (window, plus the indexer's top-k in a CSA layer, plus the
compressed entries in an HCA layer); a prepared mask that lets a query see more comes back as NaN
rows rather than truncated.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import (AttentionMaskInterface, bidirectional_mask_function, causal_mask_function,
                                        eager_mask, flash_attention_mask)

from ..families.mla_prefill.op import mla_prefill
from . import deepseek_v4

V4_MODEL = "deepseek_v4"   # config.model_type of transformers' DeepSeek-V4
V4_LAYER_TYPES = ("sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention")

NAME = "mlagen"

__all__ = ["NAME", "mlagen_attention_forward", "mlagen_mask", "register"]


def mlagen_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
                mask_function=causal_mask_function, attention_mask=None, **kwargs):
    """transformers' mask function for "mlagen": FlashAttention 2's (the [B, Sk] padding mask, or
    None when nothing is padded); the causal part is the kernel's ``causal`` flag. For a DeepSeek-V4
    config: the additive [B, 1, Sq, Sk] mask of eager attention (sliding window and padding)."""
    if getattr(kwargs.get("config"), "model_type", None) == V4_MODEL:
        return eager_mask(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function, attention_mask,
                          **kwargs)
    if mask_function is not causal_mask_function and mask_function is not bidirectional_mask_function:
        raise ValueError(f"attn_implementation={NAME!r}: the model asks for a mask other than causal or full "
                         f"({getattr(mask_function, '__name__', mask_function)!r}: a sliding window, packed "
                         "sequences by position ids, or a custom mask); mlagen's kernels mask causally only")
    return flash_attention_mask(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function, attention_mask,
                                **kwargs)


def _unpadded(q, k, v, mask, causal: bool, scale):
    """Attention over the valid tokens of a padded batch (q [B, Sq, H, D] views, mask [B, Sk])."""
    batch, seqlen_q = q.shape[0], q.shape[1]
    seqlen_k = k.shape[1]
    mask_k = mask.bool()
    # FlashAttention 2's rule in transformers: the queries are the last Sq positions of the mask,
    # and a single query (decoding) is always valid.
    mask_q = torch.ones(batch, 1, dtype=torch.bool, device=mask.device) if seqlen_q == 1 else mask_k[:, -seqlen_q:]
    bq, sq = mask_q.nonzero(as_tuple=True)
    bk, sk = mask_k.nonzero(as_tuple=True)
    cu_q, cu_k = (F.pad(m.sum(1, dtype=torch.int32).cumsum(0, dtype=torch.int32), (1, 0)) for m in (mask_q, mask_k))
    packed, _ = mla_prefill(q[bq, sq], k[bk, sk], v[bk, sk], cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=causal,
                            softmax_scale=scale, max_seqlen_q=seqlen_q, max_seqlen_k=seqlen_k)
    out = packed.new_zeros(batch, seqlen_q, *packed.shape[1:])
    out[bq, sq] = packed
    return out


def mlagen_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                             is_causal=None, **kwargs):
    """transformers' attention function for "mlagen": query / key / value [B, H, S, D] in, the
    output [B, S, H, d_v] and no attention weights out (see the module's docstring)."""
    if dropout:
        raise ValueError(f"attn_implementation={NAME!r}: dropout: mlagen does not do dropout (inference only); "
                         f"got {dropout!r}: call model.eval()")
    if query.shape[-1] == deepseek_v4.D_QK:
        return _v4_attention(module, query, key, value, attention_mask, scaling, **kwargs), None
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))   # [B, S, H, D] views: no copy
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None and cu_k is not None:
        if q.shape[0] != 1:
            raise ValueError(f"attn_implementation={NAME!r}: cu_seq_lens_q: packed sequences come as a batch of 1, "
                             f"got batch {q.shape[0]}")
        max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
        out, _ = mla_prefill(q[0], k[0], v[0], cu_seqlens_q=cu_q.to(torch.int32), cu_seqlens_k=cu_k.to(torch.int32),
                             causal=causal, softmax_scale=scaling, max_seqlen_q=None if max_q is None else int(max_q),
                             max_seqlen_k=None if max_k is None else int(max_k))
        return out.unsqueeze(0), None
    if attention_mask is None:
        out, _ = mla_prefill(q, k, v, causal=causal, softmax_scale=scaling)
        return out, None
    if attention_mask.dim() != 2:
        raise ValueError(f"attn_implementation={NAME!r}: attention_mask: expected the [batch, keys] padding mask "
                         f"of mlagen's mask function, got shape {tuple(attention_mask.shape)} (a prepared "
                         "4-D mask cannot be honoured)")
    return _unpadded(q, k, v, attention_mask, causal, scaling), None


def _v4_width(module, sq: int, keys: int, window) -> int:
    """How many keys a query of a V4 layer can see at most: the window, plus the indexer's top-k
    (CSA) or the compressed entries (HCA, at most K - Sq of them); all K if the module does not
    say which layer it is."""
    layer = getattr(module, "layer_type", None)
    if window is None or layer not in V4_LAYER_TYPES:
        return keys
    extra = 0
    if layer == "compressed_sparse_attention":
        topk = getattr(getattr(getattr(module, "compressor", None), "indexer", None), "index_topk", None)
        extra = keys if topk is None else int(topk)
    elif layer == "heavily_compressed_attention":
        extra = keys - sq
    return min(keys, int(window) + extra)


def _v4_attention(module, query, key, value, attention_mask, scaling, s_aux=None, sliding_window=None, **kwargs):
    """DeepSeek-V4's call (the module's docstring): out [B, S, H, 512] bf16."""
    fail = f"attn_implementation={NAME!r} (DeepSeek-V4 attention, d 512)"
    if query.dtype != torch.bfloat16 or key.dtype != torch.bfloat16:
        raise TypeError(f"{fail}: query: expected bf16 query and key, got {query.dtype} and {key.dtype}: load the "
                        "model with dtype=torch.bfloat16")
    if key.dim() != 4 or key.shape[1] != 1 or key.shape[-1] != query.shape[-1]:
        raise ValueError(f"{fail}: key: expected one KV head [B, 1, K, {query.shape[-1]}], got {tuple(key.shape)}")
    if value is not key:
        raise ValueError(f"{fail}: value: must be the key tensor itself (V4's one KV head is both K and V)")
    batch, _, sq, _ = query.shape
    keys = key.shape[2]
    if attention_mask is None or attention_mask.dim() != 4 or attention_mask.dtype == torch.bool:
        got = "None" if attention_mask is None else f"{attention_mask.dtype} {tuple(attention_mask.shape)}"
        raise ValueError(f"{fail}: attention_mask: expected the additive [B, 1, {sq}, {keys}] mask the model builds "
                         f"with mlagen's mask function, got {got}")
    if tuple(attention_mask.shape) != (batch, 1, sq, keys):
        raise ValueError(f"{fail}: attention_mask: expected shape {(batch, 1, sq, keys)}, got "
                         f"{tuple(attention_mask.shape)}")
    sink = None if s_aux is None else s_aux.detach().to(torch.float32)
    width = _v4_width(module, sq, keys, sliding_window if sliding_window is not None
                      else getattr(module, "sliding_window", None))
    pool = deepseek_v4.mask_pool(key[:, 0], attention_mask[:, 0], width)
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    return deepseek_v4.attend(query.transpose(1, 2), [pool], softmax_scale=scale, attn_sink=sink)


def register(name: str = NAME) -> None:
    """Register the attention and mask functions under ``name`` (done for "mlagen" on import)."""
    AttentionInterface.register(name, mlagen_attention_forward)
    AttentionMaskInterface.register(name, mlagen_mask)


register()
