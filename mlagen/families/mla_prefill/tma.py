"""Launcher of the TMA (sm90) kernels of the dense MLA prefill family.

Builds the five TMA descriptors (Q, K nope, K rope, V, O) for the call's tensors, sizes the grid
for the tile scheduler, and packs the parameter struct. Descriptors depend only on pointers,
shapes, strides and the variant's boxes, so they are cached: repeated calls on the same buffers
(the serving case, and CUDA graph capture) encode nothing.

FP8 (``tma_fp8``): the e4m3 wgmma reads both operands K-major, so P V needs V^T (keys
contiguous). With ``v_transpose: kernel`` the kernel makes it itself from V tiles it loads as
stored (V is mapped like K). With ``v_transpose: prepass`` a pre-pass kernel of the same module
(``<symbol>_vt``, transpose_v.cuh) writes it on the launch stream just before the kernel (no host
synchronisation, so graphs capture both):
[heads, d_v, vt_width] bytes, each sequence's keys starting at column round_up(k_start, 16) +
16 * b, and inside every 16 keys the column order PERM16 that makes the kernel's S registers,
converted to e4m3, the A fragment of P V (mla_prefill.cuh: pack_p). Columns that hold no key of
their sequence repeat one of its keys (finite; the kernel's P is 0 there). ``transpose_v`` below
is the same layout in torch: the reference the tests hold the pre-pass to.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ... import knobs
from ...abi import ParamStruct
from ...runtime import device_alloc, device_info, encode_tensor_map, memset_d32_async
from .call import Call
from .params import ABIS, VT_PARAMS, common_values, descale_values, num_virtual_tiles
from .schedule import Schedule, evaluate

# Position p of a 16-key group of V^T holds key PERM16[p]: thread t of a quad holds S columns
# 2t, 2t+1, 8+2t, 9+2t of each 16 (the wgmma accumulator layout) and the k32 e4m3 A fragment wants
# positions 4t .. 4t+3 from it.
PERM16 = tuple(8 * ((p % 4) // 2) + 2 * (p // 4) + p % 2 for p in range(16))

_CACHE_SIZE = 512
_maps: dict[tuple, bytes] = {}  # oldest first; read without the lock (dict reads are atomic)
_lock = threading.Lock()


def tensor_map(t, box_cols: int, box_rows: int, swizzle: int, what: str) -> bytes:
    """Descriptor of a [rows, heads, cols] bf16 or one-byte (fp8) view (last dim contiguous) with
    a (box_cols, 1 head, box_rows) box."""
    return map_at(map_key(t, box_cols, box_rows, swizzle), what)


def map_key(t, box_cols: int, box_rows: int, swizzle: int) -> tuple:
    """What a descriptor of ``t`` encodes: its address first, then what its shape, strides and the
    box decide (a launch plan keeps that tail and puts each call's address in front)."""
    rows, heads, cols = t.shape
    elem = t.element_size()
    strides = t.stride()
    row_stride = strides[0] * elem
    head_stride = strides[1] * elem if heads > 1 else row_stride  # any 16-byte multiple will do for one head
    return (t.data_ptr(), elem, rows, heads, cols, row_stride, head_stride, box_cols, box_rows, swizzle)


def map_at(key: tuple, what: str) -> bytes:
    """The descriptor of a ``map_key``, encoded on first use and cached."""
    hit = _maps.get(key)
    if hit is not None:
        return hit
    address, elem, rows, heads, cols, row_stride, head_stride, box_cols, box_rows, swizzle = key
    encoded = encode_tensor_map(address, [cols, heads, max(rows, 1)], [head_stride, row_stride],
                                [box_cols, 1, box_rows], swizzle, what, elem)
    with _lock:
        if len(_maps) >= _CACHE_SIZE:
            del _maps[next(iter(_maps))]
        _maps[key] = encoded
    return encoded


# The dynamic scheduler's tile counters: a ring of zeroed int32 per (device, stream, thread). Each
# launch takes the next one, so a launch needs no memset of its own (a driver call and a stream
# operation per call, before this ring: docs/notes.md, "Sixteenth session"); when the ring wraps,
# one cuMemsetD32Async on the stream zeroes all of it, ordered after every launch that used it
# (launches on one stream run in order, and one thread queues its ring's launches one after the
# other) and before any launch of the new lap. Per thread, because in a ring shared by two threads
# on one stream a slot handed out before the wrap could be launched after its memset (found in
# review; the per-launch memset before the ring had the same window, wider). The counters come from
# the driver, not torch's allocator, so no memory pool holds them (a torch.compile CUDA-graph tree
# refuses live allocations in its pool it did not make). A graph being captured gets a counter of
# its own from the graph's pool instead (a memset node), so a replay on another stream never shares
# one with eager launches.
RING = 4096


class _CounterRing:
    def __init__(self, stream: int):
        self.base = device_alloc(4 * RING)
        memset_d32_async(self.base, 0, RING, stream)
        self.next = 0
        self.lock = threading.Lock()

    def take(self, stream: int) -> int:
        with self.lock:
            i = self.next
            if i == RING:   # a new lap: zero the ring behind every launch of the last one
                memset_d32_async(self.base, 0, RING, stream)
                i = 0
            self.next = i + 1
        return self.base + 4 * i


_counters: dict[tuple[int, int, int], _CounterRing] = {}


def tile_counter(device, stream: int) -> int:
    """Address of a zeroed int32 the next kernel on ``stream`` may count tiles in."""
    import torch

    if torch.cuda.is_current_stream_capturing():
        return torch.zeros(1, dtype=torch.int32, device=device).data_ptr()
    key = (device.index, stream, threading.get_ident())
    ring = _counters.get(key)
    if ring is None:
        with _lock:
            ring = _counters.get(key) or _counters.setdefault(key, _CounterRing(stream))
    return ring.take(stream)

def vt_width(total_k: int, batch: int) -> int:
    """Columns of V^T: every sequence starts on a 16-column boundary (at most 16 more per sequence)."""
    return -(-total_k // 16) * 16 + 16 * batch


def vt_sources(cu_k, total_k: int, batch: int, device):
    """The key (row of V) that each column of V^T holds, as a long tensor of vt_width columns.
    Offsets are clamped like the kernel's load_seq, so unchecked cu_seqlens stay in bounds."""
    import torch

    width = vt_width(total_k, batch)
    x = torch.arange(width, device=device)
    if cu_k is None:
        k_start = torch.zeros(1, dtype=torch.long, device=device)
        length = torch.full((1,), total_k, dtype=torch.long, device=device)
    else:
        cu = cu_k.to(torch.long)
        k_start = cu[:-1].clamp(0, total_k)
        length = torch.minimum(torch.maximum(cu[1:], k_start), torch.full_like(k_start, total_k)) - k_start
    vt_start = (k_start + 15) // 16 * 16 + 16 * torch.arange(k_start.numel(), device=device)
    b = (torch.searchsorted(vt_start, x, right=True) - 1).clamp(0, k_start.numel() - 1)
    rel = x - vt_start[b]
    perm = torch.tensor(PERM16, dtype=torch.long, device=device)
    key = rel // 16 * 16 + perm[rel % 16]
    valid = (rel >= 0) & (key < length[b])
    return torch.where(valid, k_start[b] + key, k_start[b].clamp(max=max(total_k - 1, 0)))


def transpose_v(v, cu_k, total_k: int, batch: int):
    """V^T of one-byte V [total_k, H, d_v] for the FP8 kernel: uint8 [H, d_v, vt_width(...)], in
    torch (the layout the pre-pass kernel writes; tests compare the two)."""
    import torch

    heads, dv = v.shape[1], v.shape[2]
    if total_k == 0:
        return torch.zeros(heads, dv, vt_width(0, batch), dtype=torch.uint8, device=v.device)
    src = vt_sources(cu_k, total_k, batch, v.device)
    return v.view(torch.uint8).index_select(0, src).permute(1, 2, 0).contiguous()


VT_COLUMNS, VT_THREADS = 128, 256  # transpose_v.cuh: kVtColumns, kVtThreads


def vt_shape(call: Call) -> tuple[int, int, int]:
    """[heads, d_v, width] of the pre-pass's V^T."""
    return call.v.shape[1], call.v.shape[2], vt_width(call.total_k, call.batch)


def vt_grid(call: Call) -> tuple[int, int, int]:
    heads, _, width = vt_shape(call)
    return heads, min(-(-width // VT_COLUMNS), 65535), 1


def vt_values(call: Call, vt_address: int) -> dict:
    """The pre-pass's parameter values."""
    return {
        "v": call.v.data_ptr(), "vt": vt_address,
        "cu_seqlens_k": call.cu_k.data_ptr() if call.cu_k is not None else 0,
        "v_row_stride": call.v.stride(0), "v_head_stride": call.v.stride(1),
        "total_k": call.total_k, "batch": call.batch, "width": vt_shape(call)[2],
    }


def launch_transpose_v(selection, call: Call, stream: int):
    """V^T by the module's pre-pass kernel on ``stream``; returns the new uint8 tensor. It is
    allocated on the caller's current torch stream; when ``stream`` is another one, the caching
    allocator is told the tensor is used there too."""
    import torch

    vt = torch.empty(vt_shape(call), dtype=torch.uint8, device=call.v.device)
    if call.total_k == 0:
        return vt.zero_()
    kernel = selection.kernel.entry(f"{selection.variant.symbol}_vt")
    kernel.launch(vt_grid(call), (VT_THREADS, 1, 1), 0, stream, VT_PARAMS.pack(vt_values(call, vt.data_ptr())))
    if torch.cuda.current_stream(call.v.device).cuda_stream != stream:
        vt.record_stream(torch.cuda.ExternalStream(stream, device=call.v.device))
    return vt


# Heads per group of the tile order on causal problems (measured on the H100, docs/notes.md,
# "Seventh session": 8 against 1, 2, 4, 16, 64 on D1, D2, D4, D6 and 1 x 8192 H64).
CAUSAL_HEAD_GROUP = 8


def head_group(call: Call, scheduler: str) -> int:
    """Heads per group of the kernel's tile order (mla_prefill.cuh: query_tile). Grouping pays
    where tiles differ in work and the queue hands them out one by one: causal problems whose
    keys are mostly the queries' own (the diagonal sets the work; a long cached prefix makes the
    tiles alike), on the dynamic or static scheduler (the persistent one deals tiles round-robin,
    where a grouped order lost up to 45%). ``MLAGEN_HEAD_GROUP`` overrides it."""
    forced = knobs.head_group()
    if forced is not None:
        return min(forced, call.heads)
    if not call.causal or scheduler == "persistent" or call.total_k >= 2 * call.total_q:
        return 1
    return min(CAUSAL_HEAD_GROUP, call.heads)


# Sequences per launch that the kernel can hand out longest-first (tile_index.cuh:
# find_sequence_lpt, one sequence per lane of a warp).
LPT_MAX_BATCH = 32
# The order costs a 32-lane search per tile (two shuffles a sequence): on short sequences, whose
# tiles visit a few key blocks, that search is on the critical path (D6, 32 x 512: 0.90x of the
# batch order on the H200, 2026-12-02), and their tiles are too alike for the order to matter. So
# only batches with at least this many keys per sequence on average take it (D10's 10k: 1.03x).
LPT_MIN_KEYS = 4096


def lpt_order(call: Call) -> int:
    """1 if the kernel takes the sequences longest key range first, 0 for batch order (batches of 2
    to LPT_MAX_BATCH sequences with LPT_MIN_KEYS keys each on average). A chunked
    prefill batch is the case it is for: cached prefixes of 1k to 16k tokens give tiles of 10x
    different work, and in batch order the queue's last tiles are whichever sequence comes last
    (docs/notes.md, "Chunked prefill"). ``MLAGEN_SEQ_ORDER=batch`` keeps the batch order."""
    return int(1 < call.batch <= LPT_MAX_BATCH and call.total_k >= LPT_MIN_KEYS * call.batch
               and knobs.seq_order() == "lpt")


@dataclass(frozen=True)
class _Plan:
    """What a launch of one selected kernel reads on every call, derived once from its variant."""

    fp8: bool
    prepass: bool      # FP8 with V^T written by the pre-pass kernel (else by the kernel itself)
    elem: int
    block_m: int
    swizzle: tuple[int, int, int]  # q, k, v
    kv_rows: int                   # rows of a K/V box: in a cluster, each CTA loads its share
    cluster: int
    schedule: Schedule
    abi: ParamStruct
    block: tuple[int, int, int]
    smem: int


def _plan(selection, env: dict) -> _Plan:
    plan = selection.plan.get("tma")
    if plan is None:
        s = evaluate(selection.variant)
        fp8 = selection.spec.abi == "tma_fp8"
        prepass = fp8 and env.get("v_transpose") == "prepass"
        plan = _Plan(fp8, prepass, 1 if fp8 else 2, env["block_m"], (s.swizzle["q"], s.swizzle["k"], s.swizzle["v"]),
                     env["block_n"] // s.cluster, s.cluster, s, ABIS[selection.spec.abi],
                     (selection.resources.threads, 1, 1), selection.resources.smem_bytes)
        selection.plan["tma"] = plan
    return plan


LOG2E = 1.4426950408889634


def trait_values(call: Call) -> dict:
    """The mask's and the score traits' launch values (params.py; mask.cuh): a window's sides and a
    chunk's size, softcap's pre-scale (with softcap the softmax's scale becomes c * log2(e): the
    kernel computes c * tanh(scale * s / c)), and the sinks' pointer."""
    t = call.traits
    values = {"mask_left": t.window[0], "mask_right": t.window[1], "mask_chunk": max(t.chunk, 1),
              "softcap_scale": call.scale / t.softcap if t.softcap else 0.0,
              "attn_sink": 0 if t.attn_sink is None else t.attn_sink.data_ptr()}
    if t.softcap:
        values["scale_log2"] = t.softcap * LOG2E
    return values


# The tensor maps of the bf16 launcher, in its parameter struct's order (the launch plan's too).
MAP_FIELDS = (("tma_q", "q"), ("tma_k", "k"), ("tma_k_rope", "k_rope"), ("tma_v", "v"), ("tma_o", "out"))


def map_keys(selection, call: Call, env: dict, vt=None) -> tuple:
    """``map_key`` of each of MAP_FIELDS; ``vt`` is the FP8 pre-pass's V^T (its map stands for V's)."""
    p = _plan(selection, env)
    sw_q, sw_k, sw_v = p.swizzle
    if p.prepass:   # V^T as [d_v rows, heads, columns]; boxes of sw_v keys by all d_v rows (a cluster's share)
        v_key = map_key(vt.permute(1, 0, 2), sw_v, vt.size(1) // p.cluster, sw_v)
    elif p.fp8:     # V as stored, whole 128-byte rows (the kernel transposes them)
        v_key = map_key(call.v, call.v.size(2), p.kv_rows, 128)
    else:
        v_key = map_key(call.v, sw_v // 2, p.kv_rows, sw_v)
    return (map_key(call.q, sw_q // p.elem, p.block_m, sw_q), map_key(call.k, sw_k // p.elem, p.kv_rows, sw_k),
            map_key(call.k_rope, sw_k // p.elem, p.kv_rows, sw_k), v_key, map_key(call.out, sw_q // 2, 64, sw_q))


def launch(selection, call: Call, env: dict, stream: int) -> tuple[tuple, dict]:
    """Launch; returns the grid and the parameter values it packed."""
    p = _plan(selection, env)
    s, bm = p.schedule, p.block_m
    values = common_values(call)
    vt = launch_transpose_v(selection, call, stream) if p.prepass else None
    for (field, what), key in zip(MAP_FIELDS, map_keys(selection, call, env, vt)):
        values[field] = map_at(key, what)
    # Tiles are numbered per cluster: a cluster of C CTAs takes C * block_m query rows.
    n_virtual = num_virtual_tiles(call, bm * p.cluster)
    grid = s.grid(n_virtual * call.heads, device_info(call.q.device.index).sm_count if s.scheduler != "static" else 0)
    # Zeroed per launch; the kernel counts tiles in it.
    values["tile_counter"] = tile_counter(call.q.device, stream) if s.scheduler == "dynamic" else 0
    values["num_virtual_tiles"] = n_virtual
    values["head_group"] = head_group(call, s.scheduler)
    values["lpt_order"] = lpt_order(call)
    values["rope_shared"] = int(call.k_rope.size(1) == 1)
    values.update(trait_values(call))
    if p.fp8:
        values.update(descale_values(call))
    selection.kernel.launch((grid, 1, 1), p.block, p.smem, stream, p.abi.pack(values))
    return (grid, 1, 1), values
