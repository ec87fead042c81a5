"""Parameter values and grids of dense MLA prefill launches (both launchers share them)."""

from __future__ import annotations

import math

from .call import Call


def common_values(call: Call) -> dict:
    """The parameter fields both launchers share."""
    return {
        "out": call.out.data_ptr(),
        "lse": call.lse.data_ptr(),
        "cu_seqlens_q": call.cu_q.data_ptr() if call.cu_q is not None else 0,
        "cu_seqlens_k": call.cu_k.data_ptr() if call.cu_k is not None else 0,
        "o_row_stride": call.out.stride(0),
        "o_head_stride": call.out.stride(1),
        "lse_row_stride": call.lse.stride(0),
        "total_q": call.total_q,
        "total_k": call.total_k,
        "num_heads": call.heads,
        "batch": call.batch,
        "scale_log2": call.scale * math.log2(math.e),
    }


def _head_stride(t) -> int:
    """Stride between heads; 0 for a tensor shared by all heads ([T, 1, D])."""
    return 0 if t.size(1) == 1 else t.stride(1)


def num_virtual_tiles(call: Call, block_m: int) -> int:
    """Query tiles per head the kernel is launched over (see tile_index.cuh)."""
    if call.cu_q is None:
        return -(-call.total_q // block_m)
    return call.total_q // block_m + call.batch


def simt_values(call: Call, env: dict) -> dict:
    """The simt launcher's parameter values."""
    return {
        "q": call.q.data_ptr(), "k": call.k.data_ptr(), "k_rope": call.k_rope.data_ptr(), "v": call.v.data_ptr(),
        "q_row_stride": call.q.stride(0), "q_head_stride": call.q.stride(1),
        "k_row_stride": call.k.stride(0), "k_head_stride": call.k.stride(1),
        "kr_row_stride": call.k_rope.stride(0), "kr_head_stride": _head_stride(call.k_rope),
        "v_row_stride": call.v.stride(0), "v_head_stride": call.v.stride(1),
        **common_values(call),
    }


def simt_fp8_values(call: Call, env: dict) -> dict:
    """The simt fields over one-byte inputs, plus the descale pointers (null: 1.0) and their head
    strides (0: one factor for all heads)."""
    values = simt_values(call, env)
    for name in ("q", "k", "v"):
        t = getattr(call, f"{name}_descale")
        values[f"{name}_descale"] = 0 if t is None else t.data_ptr()
        values[f"{name[0]}d_head_stride"] = 0 if t is None or t.numel() == 1 else t.stride(0)
    return values

