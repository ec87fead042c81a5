"""The kernel parameter structs of sparse MLA prefill, one per launcher ("abi" in the spec) and KV
pointer type (a quantized cache is read as bytes)."""

from __future__ import annotations

import functools

from ... import abi, operands

def params_for(kv_format: str = "bf16") -> abi.ParamStruct:
    """The kernel parameter struct; only the cache pointer's type depends on the KV format (its
    strides count elements of the cache tensor: bf16 values, or bytes of a quantized cache)."""
    return _params(operands.get(kv_format).c_pointer)


@functools.lru_cache(maxsize=None)
def _params(kv_pointer: str) -> abi.ParamStruct:
    return abi.ParamStruct("Params", (
        abi.Field("q", "const bf16*"),
        abi.Field("kv", kv_pointer),
        abi.Field("indices", "const int*"),
        abi.Field("topk_length", "const int*"),
        abi.Field("attn_sink", "float*"),
        abi.Field("out", "bf16*"),
        abi.Field("max_logits", "float*"),
        abi.Field("lse", "float*"),
        abi.Field("q_row_stride", "i64"),
        abi.Field("q_head_stride", "i64"),
        abi.Field("kv_row_stride", "i64"),
        abi.Field("kv_page_stride", "i64"),
        abi.Field("idx_row_stride", "i64"),
        abi.Field("o_row_stride", "i64"),
        abi.Field("o_head_stride", "i64"),
        abi.Field("ml_row_stride", "i64"),
        abi.Field("lse_row_stride", "i64"),
        abi.Field("sq", "int"),
        abi.Field("heads", "int"),
        abi.Field("topk", "int"),
        abi.Field("num_kv", "int"),
        abi.Field("page_size", "int"),
        abi.Field("scale_log2", "float"),
        # The second pool of one softmax (MLA.md 2b; mlagen/cuda/sparse_pools.cuh): its key
        # positions follow pool 1's. Without one, extra_topk is 0 and nothing of it is read.
        abi.Field("extra_kv", kv_pointer),
        abi.Field("extra_indices", "const int*"),
        abi.Field("extra_topk_length", "const int*"),
        abi.Field("extra_idx_row_stride", "i64"),
        abi.Field("extra_row_stride", "i64"),
        abi.Field("extra_page_stride", "i64"),
        abi.Field("extra_topk", "int"),
        abi.Field("extra_num_kv", "int"),
        abi.Field("extra_page_size", "int"),
    ))


def params_tma_for(kv_format: str = "bf16") -> abi.ParamStruct:
    """The parameter struct of the ``gather_tma`` ABI: ``gather``'s plus TMA descriptors of the
    KV rows of both pools (kv_tensor_map) for kernels that gather one row per TMA box."""
    return _params_tma(operands.get(kv_format).c_pointer)


@functools.lru_cache(maxsize=None)
def _params_tma(kv_pointer: str) -> abi.ParamStruct:
    return abi.ParamStruct("Params", _params(kv_pointer).fields + (abi.Field("kv_map", "tensormap"),
                                                             abi.Field("extra_kv_map", "tensormap")))


PARAMS = params_for("bf16")
ABIS = {"gather": params_for, "gather_tma": params_tma_for}
_ABIS = {"gather": params_for, "gather_tma": params_tma_for}
