"""The kernel parameter structs of dense MLA prefill, one per launcher ("abi" in the spec), and
the values a :class:`~.call.Call` gives their fields (both launchers share the common ones).

* ``simt``: pointer-and-stride parameters; cp.async loads (sm80 kernel, any NVIDIA target).
* ``simt_fp8``: the same with fp8 e4m3 inputs and descale factors (gfx9 FP8 kernels).
* ``tma``: TMA descriptors for Q, K, K-rope, V and O (sm90 warp-specialized kernel).
* ``tma_fp8``: the same over e4m3 inputs (``tma_v`` describes V as stored, or V^T for a
  ``v_transpose: prepass`` variant, see tma.py: transpose_v),
  plus the descale factors.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ... import abi

if TYPE_CHECKING:
    from .call import Call

_COMMON_FIELDS = (
    abi.Field("out", "bf16*"),
    abi.Field("lse", "float*"),
    abi.Field("cu_seqlens_q", "const int*"),
    abi.Field("cu_seqlens_k", "const int*"),
    abi.Field("o_row_stride", "i64"),
    abi.Field("o_head_stride", "i64"),
    abi.Field("lse_row_stride", "i64"),
    abi.Field("total_q", "int"),
    abi.Field("total_k", "int"),
    abi.Field("num_heads", "int"),
    abi.Field("batch", "int"),
    abi.Field("scale_log2", "float"),
)

SIMT_PARAMS = abi.ParamStruct("Params", (
    abi.Field("q", "const bf16*"),
    abi.Field("k", "const bf16*"),
    abi.Field("k_rope", "const bf16*"),
    abi.Field("v", "const bf16*"),
    abi.Field("q_row_stride", "i64"),
    abi.Field("q_head_stride", "i64"),
    abi.Field("k_row_stride", "i64"),
    abi.Field("k_head_stride", "i64"),
    abi.Field("kr_row_stride", "i64"),
    abi.Field("kr_head_stride", "i64"),
    abi.Field("v_row_stride", "i64"),
    abi.Field("v_head_stride", "i64"),
) + _COMMON_FIELDS)

TMA_PARAMS = abi.ParamStruct("Params", (
    abi.Field("tma_q", "tensormap"),
    abi.Field("tma_k", "tensormap"),
    abi.Field("tma_k_rope", "tensormap"),
    abi.Field("tma_v", "tensormap"),
    abi.Field("tma_o", "tensormap"),
    abi.Field("tile_counter", "int*"),
    abi.Field("num_virtual_tiles", "int"),
    abi.Field("head_group", "int"),
    abi.Field("lpt_order", "int"),
    abi.Field("rope_shared", "int"),
) + _COMMON_FIELDS + (
    # The mask's and the score traits' launch values (MLA.md section 1b; mask.cuh): a window's sides
    # (-1 unbounded), a chunk's size, softcap's scale / c, the per-head sinks (null without).
    abi.Field("mask_left", "int"),
    abi.Field("mask_right", "int"),
    abi.Field("mask_chunk", "int"),
    abi.Field("softcap_scale", "float"),
    abi.Field("attn_sink", "float*"),
))

_DESCALE_FIELDS = (
    abi.Field("q_descale", "float*"),
    abi.Field("k_descale", "float*"),
    abi.Field("v_descale", "float*"),
    abi.Field("qd_head_stride", "int"),
    abi.Field("kd_head_stride", "int"),
    abi.Field("vd_head_stride", "int"),
)

# ``simt_fp8``: the simt fields with one-byte (fp8 e4m3) inputs, and the descale factors (fp32
# pointers, null for 1.0; head stride 0 for one factor per tensor, 1 for one per head).
SIMT_FP8_PARAMS = abi.ParamStruct("Params", tuple(
    abi.Field(f.name, "const u8*") if f.kind == "const bf16*" else f for f in SIMT_PARAMS.fields) + _DESCALE_FIELDS)

# ``tma_fp8``: the tma fields (descriptors of one-byte tensors; tma_v over V^T) and the descale
# factors as in simt_fp8.
TMA_FP8_PARAMS = abi.ParamStruct("Params", TMA_PARAMS.fields + _DESCALE_FIELDS)

# The FP8 kernel's V^T pre-pass (a second entry point of its module, ``<symbol>_vt``;
# templates/include/mlagen/sm90/transpose_v.cuh): V [total_k, H, d_v] bytes in, V^T
# [H, d_v, width] out.
VT_PARAMS = abi.ParamStruct("VtParams", (
    abi.Field("v", "const u8*"),
    abi.Field("vt", "u8*"),
    abi.Field("cu_seqlens_k", "const int*"),
    abi.Field("v_row_stride", "i64"),
    abi.Field("v_head_stride", "i64"),
    abi.Field("total_k", "int"),
    abi.Field("batch", "int"),
    abi.Field("width", "int"),
))

ABIS = {"simt": SIMT_PARAMS, "simt_fp8": SIMT_FP8_PARAMS, "tma": TMA_PARAMS, "tma_fp8": TMA_FP8_PARAMS}
FP8_ABIS = ("simt_fp8", "tma_fp8")
TMA_ABIS = ("tma", "tma_fp8")


# --- parameter values --------------------------------------------------------------------------

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


def descale_values(call: Call) -> dict:
    """The descale pointers (null: 1.0) and their head strides (0: one factor for all heads) of
    the fp8 launchers."""
    values = {}
    for name in ("q", "k", "v"):
        t = getattr(call.args, f"{name}_descale")
        values[f"{name}_descale"] = 0 if t is None else t.data_ptr()
        values[f"{name[0]}d_head_stride"] = 0 if t is None or t.numel() == 1 else t.stride(0)
    return values


def simt_fp8_values(call: Call, env: dict) -> dict:
    """The simt fields over one-byte inputs, plus the descale factors."""
    return {**simt_values(call, env), **descale_values(call)}
