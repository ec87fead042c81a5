"""The kernel parameter structs of dense MLA prefill, one per launcher ("abi" in the spec).

* ``simt``: pointer-and-stride parameters; cp.async loads (sm80 kernel, any NVIDIA target).
* ``simt_fp8``: the same with fp8 e4m3 inputs and descale factors (gfx9 FP8 kernels).
* ``tma``: TMA descriptors for Q, K, K-rope, V and O (sm90 warp-specialized kernel).
* ``tma_fp8``: the same over e4m3 inputs (``tma_v`` describes V as stored, or V^T for a
  ``v_transpose: prepass`` variant, see tma.py: transpose_v),
  plus the descale factors.
"""

from __future__ import annotations

from ... import abi

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
