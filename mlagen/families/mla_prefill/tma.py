"""Launcher of the TMA (sm90) kernels of the dense MLA prefill family.

Builds the five TMA descriptors (Q, K nope, K rope, V, O) for the call's tensors, sizes the grid
for the tile scheduler, and packs the parameter struct. Descriptors depend only on pointers,
shapes, strides and the variant's boxes, so they are cached: repeated calls on the same buffers
(the serving case, and CUDA graph capture) encode nothing.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from ...runtime import device_info, encode_tensor_map_bf16
from .call import Call
from .pack import common_values, num_virtual_tiles
from .params import TMA_PARAMS
from .schedule import evaluate

_CACHE_SIZE = 512
_maps: "OrderedDict[tuple, bytes]" = OrderedDict()
_lock = threading.Lock()


def tensor_map(t, box_cols: int, box_rows: int, swizzle: int, what: str) -> bytes:
    """Descriptor of a [rows, heads, cols] bf16 view (last dim contiguous) with a
    (box_cols, 1 head, box_rows) box."""
    rows, heads, cols = t.shape
    row_stride = t.stride(0) * 2
    head_stride = t.stride(1) * 2 if heads > 1 else row_stride  # any 16-byte multiple will do for one head
    key = (t.data_ptr(), rows, heads, cols, row_stride, head_stride, box_cols, box_rows, swizzle)
    with _lock:
        hit = _maps.get(key)
        if hit is not None:
            _maps.move_to_end(key)
            return hit
    encoded = encode_tensor_map_bf16(t.data_ptr(), [cols, heads, max(rows, 1)], [head_stride, row_stride],
                                     [box_cols, 1, box_rows], swizzle, what)
    with _lock:
        _maps[key] = encoded
        if len(_maps) > _CACHE_SIZE:
            _maps.popitem(last=False)
    return encoded


def launch(selection, call: Call, env: dict, stream: int) -> None:
    import torch

    s = evaluate(selection.variant)
    bm, bn = env["block_m"], env["block_n"]
    sw_q, sw_k, sw_v = s.swizzle["q"], s.swizzle["k"], s.swizzle["v"]
    kv_rows = bn // s.cluster  # in a cluster, each CTA loads its share of every K/V tile
    maps = {
        "tma_q": tensor_map(call.q, sw_q // 2, bm, sw_q, "q"),
        "tma_k": tensor_map(call.k, sw_k // 2, kv_rows, sw_k, "k"),
        "tma_k_rope": tensor_map(call.k_rope, sw_k // 2, kv_rows, sw_k, "k_rope"),
        "tma_v": tensor_map(call.v, sw_v // 2, kv_rows, sw_v, "v"),
        "tma_o": tensor_map(call.out, sw_q // 2, 64, sw_q, "out"),
    }
    # Tiles are numbered per cluster: a cluster of C CTAs takes C * block_m query rows.
    n_virtual = num_virtual_tiles(call, bm * s.cluster)
    sm_count = device_info(call.q.device.index).sm_count if s.scheduler != "static" else 0
    grid = s.grid(n_virtual * call.heads, sm_count)
    counter = 0
    if s.scheduler == "dynamic":
        # Zeroed per launch (a memset node when captured in a graph); the kernel counts tiles in it.
        counter_t = torch.zeros(1, dtype=torch.int32, device=call.q.device)
        counter = counter_t.data_ptr()
    values = {
        **maps,
        "tile_counter": counter,
        "num_virtual_tiles": n_virtual,
        "rope_shared": int(call.k_rope.size(1) == 1),
        **common_values(call),
    }
    params = TMA_PARAMS.pack(values)
    res = selection.resources
    selection.kernel.launch((grid, 1, 1), (res.threads, 1, 1), res.smem_bytes, stream, params)
