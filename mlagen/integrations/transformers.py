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
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import (AttentionMaskInterface, bidirectional_mask_function, causal_mask_function,
                                        flash_attention_mask)

from ..families.mla_prefill.op import mla_prefill

NAME = "mlagen"

__all__ = ["NAME", "mlagen_attention_forward", "mlagen_mask", "register"]


def mlagen_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
                mask_function=causal_mask_function, attention_mask=None, **kwargs):
    """transformers' mask function for "mlagen": FlashAttention 2's (the [B, Sk] padding mask, or
    None when nothing is padded); the causal part is the kernel's ``causal`` flag."""
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


def register(name: str = NAME) -> None:
    """Register the attention and mask functions under ``name`` (done for "mlagen" on import)."""
    AttentionInterface.register(name, mlagen_attention_forward)
    AttentionMaskInterface.register(name, mlagen_mask)


register()
