"""The eager path of one ``mla_sparse_prefill`` call: check the arguments, pick the kernel, launch
it, and keep a launch plan so that the next call of the same signature skips all of it. The torch
ops of :mod:`.op` run this."""

from __future__ import annotations

import math
import threading

from ... import knobs, plans
from ...errors import NoDeviceError
from .. import kit
from . import staging
from .call import Call, _fail, fill_empty, prepare
from .compile import accepts, kv_format_targets, preferred, specialization
from .params import ABIS
from .problem import D_V, NAME

_MAP_CACHE_SIZE = 256
_kv_maps: dict[tuple, bytes] = {}  # oldest first; read without the lock (dict reads are atomic)
_kv_maps_lock = threading.Lock()


_NO_MAP = bytes(128)


def _kv_map_key(call: Call) -> tuple:
    """(address, chunks, rows of a page, pages, row bytes, page bytes) of the KV tensor map."""
    row_bytes, chunks = 2 * call.kv_row_stride, call.d_qk // 64
    if call.page_size > 0:
        rows, pages, page_bytes = call.page_size, -(-call.num_kv // call.page_size), 2 * call.kv_page_stride
    else:
        rows, pages, page_bytes = max(call.num_kv, 1), 1, max(call.num_kv, 1) * row_bytes
    return (call.kv.data_ptr(), chunks, rows, pages, row_bytes, page_bytes)


def kv_tensor_map(call: Call) -> bytes:
    """TMA descriptor of a call's bf16 KV rows as a 4-D tensor (64 values, d_qk / 64 chunks, rows
    of a page, pages; a flat table is one page of N rows), 128-byte swizzled, box one row."""
    return _kv_map(_kv_map_key(call))


def _kv_map(key: tuple) -> bytes:
    from ...runtime import encode_tensor_map_bf16

    hit = _kv_maps.get(key)
    if hit is not None:
        return hit
    address, chunks, rows, pages, row_bytes, page_bytes = key
    encoded = encode_tensor_map_bf16(address, [64, chunks, rows, pages], [128, row_bytes, page_bytes],
                                     [64, chunks, 1, 1], 128, "kv")
    with _kv_maps_lock:
        if len(_kv_maps) >= _MAP_CACHE_SIZE:
            del _kv_maps[next(iter(_kv_maps))]
        _kv_maps[key] = encoded
    return encoded


def pack(call: Call, abi_name: str = "gather"):
    return ABIS[abi_name](call.kv_format).pack(_pack_values(call, abi_name))


def _pack_values(call: Call, abi_name: str) -> dict:
    values = {
        "q": call.q.data_ptr(), "kv": call.kv.data_ptr(), "indices": call.indices.data_ptr(),
        "topk_length": call.topk_length.data_ptr() if call.topk_length is not None else 0,
        "attn_sink": call.attn_sink.data_ptr() if call.attn_sink is not None else 0,
        "out": call.out.data_ptr(), "max_logits": call.max_logits.data_ptr(), "lse": call.lse.data_ptr(),
        "q_row_stride": call.q.stride(0), "q_head_stride": call.q.stride(1),
        "kv_row_stride": call.kv_row_stride, "kv_page_stride": call.kv_page_stride,
        "idx_row_stride": call.indices.stride(0),
        "o_row_stride": call.out.stride(0), "o_head_stride": call.out.stride(1),
        "ml_row_stride": call.max_logits.stride(0), "lse_row_stride": call.lse.stride(0),
        "sq": call.sq, "heads": call.heads, "topk": call.topk, "num_kv": call.num_kv,
        "page_size": call.page_size, "scale_log2": call.scale * math.log2(math.e),
    }
    if abi_name == "gather_tma":
        # A quantized cache is bulk-copied row by row (no tensor map; the field is zeros).
        values["kv_map"] = kv_tensor_map(call) if call.kv_format == "bf16" else _NO_MAP
    return values


def grid(selection, call: Call) -> tuple[int, int, int]:
    rows = selection.env["block_h"]
    items = call.sq * -(-call.heads // rows)
    if dict(selection.spec.problem).get("persistent", False):
        # One CTA per SM loops over the items (the kernel strides by gridDim.x).
        from ...runtime import device_info

        return (max(1, min(items, device_info(call.q.device.index).sm_count)), 1, 1)
    return (items, 1, 1)


def launch(selection, call: Call, stream: int) -> None:
    """Launch the selected kernel on ``stream``; no host synchronisation."""
    res = selection.resources
    selection.kernel.launch(grid(selection, call), (res.threads, 1, 1), res.smem_bytes, stream,
                            pack(call, selection.spec.abi))



def run(q, kv, indices, *, softmax_scale, topk_length=None, attn_sink=None, d_v=D_V, out=None, max_logits=None,
        lse=None, kernel=None, kv_format="bf16", compute="bf16"):
    """The eager path of one call (what the torch ops run): check, select, launch on the current
    stream; returns (out, max_logits, lse). See :func:`mlagen.mla_sparse_prefill`."""
    import torch

    from ...runtime import current_stream

    sig = None
    if kernel is None or type(kernel) is str:
        sig = _signature(torch, q, kv, indices, softmax_scale, topk_length, attn_sink, d_v, out, max_logits, lse,
                         kernel, kv_format, compute)
        plan = _plans.get(sig) if sig is not None else None
        if plan is not None:
            return plan.run(torch, q, kv, indices, topk_length, attn_sink, out, max_logits, lse)
    call = prepare(q, kv, indices, softmax_scale=softmax_scale, topk_length=topk_length, attn_sink=attn_sink,
                   d_v=d_v, out=out, max_logits=max_logits, lse=lse, kv_format=kv_format, compute=compute)
    if call.empty:
        if call.sq:
            fill_empty(call)
        return call.out, call.max_logits, call.lse
    if staging.applies(call, kernel):   # an FP8 cache in bf16: dequantized first (staging.py says why)
        ws, ws_indices = kit.on_device(torch, call.q.device.index, staging.stage, call)
        return run(call.q, ws, ws_indices, softmax_scale=call.scale, topk_length=call.topk_length,
                   attn_sink=call.attn_sink, d_v=d_v, out=call.out, max_logits=call.max_logits, lse=call.lse)
    device, selection = select(call, kernel)
    kit.on_device(torch, device, launch, selection, call, current_stream(torch, device))
    if sig is not None and sig[-1] == device:
        try:
            plan = _Plan.of(selection, call, q, kv, indices)
        except Exception:   # the call ran; without a plan the next one takes the full path again
            plan = None
        if plan is not None:
            _plans.put(sig, plan)
    return call.out, call.max_logits, call.lse


_plans = plans.PlanCache()


def _signature(torch, q, kv, indices, softmax_scale, topk_length, attn_sink, d_v, out, max_logits, lse, kernel,
               kv_format, compute):
    """The launch-plan signature of a call (mlagen/plans.py), or None when it takes the full path
    (plans off, or an argument a signature cannot hold). The current device comes last."""
    from ... import dispatch

    if type(q) is not torch.Tensor or q.get_device() < 0:
        return None   # the full path says what is wrong
    state = knobs.call_state()
    if state is None:
        return None
    try:
        t = torch.Tensor
        return (plans.tensor_sig(q, t), plans.tensor_sig(kv, t), plans.tensor_sig(indices, t),
                plans.tensor_sig(topk_length, t), plans.tensor_sig(attn_sink, t), plans.tensor_sig(out, t),
                plans.tensor_sig(max_logits, t), plans.tensor_sig(lse, t), plans.scalar_sig(softmax_scale),
                plans.scalar_sig(d_v), plans.scalar_sig(kernel), plans.scalar_sig(kv_format),
                plans.scalar_sig(compute), state, dispatch.dispatcher().generation, torch.cuda.current_device())
    except plans.NoPlan:
        return None


# The fields of the parameter struct that change from call to call with one signature.
_POINTERS = ("q", "kv", "indices", "topk_length", "attn_sink", "out", "max_logits", "lse")


class _Plan:
    """A sparse call's launch plan: the outputs' shapes and what ``pack`` would write, less the
    pointers (and the KV tensor map's address, for the TMA gather)."""

    def __init__(self, launch_plan, device, out_shape, stat_shape, kv_map_key):
        self.launch_plan, self.device = launch_plan, device
        self.out_shape, self.stat_shape, self.kv_map_key = out_shape, stat_shape, kv_map_key

    @classmethod
    def of(cls, selection, call: Call, q, kv, indices):
        """The plan of a call that ran, or None where the full path copied an argument (then a
        repeated call must copy again) or the kernel has no plan-able launcher."""
        if (call.q.data_ptr(), call.kv.data_ptr(), call.indices.data_ptr()) != (q.data_ptr(), kv.data_ptr(),
                                                                                 indices.data_ptr()):
            return None
        abi_name = selection.spec.abi
        values = _pack_values(call, abi_name)
        variable = _POINTERS
        kv_map_key = None
        if abi_name == "gather_tma" and call.kv_format == "bf16":
            variable = _POINTERS + ("kv_map",)
            kv_map_key = _kv_map_key(call)[1:]
        res = selection.resources
        launch_plan = plans.LaunchPlan(selection.kernel, grid(selection, call), (res.threads, 1, 1), res.smem_bytes,
                                       ABIS[abi_name](call.kv_format), values, variable)
        return cls(launch_plan, call.q.device, tuple(call.out.shape), tuple(call.lse.shape), kv_map_key)

    def run(self, torch, q, kv, indices, topk_length, attn_sink, out, max_logits, lse):
        from ...runtime import current_stream

        if out is None:
            out = torch.empty(self.out_shape, dtype=torch.bfloat16, device=self.device)
        if max_logits is None:
            max_logits = torch.empty(self.stat_shape, dtype=torch.float32, device=self.device)
        if lse is None:
            lse = torch.empty(self.stat_shape, dtype=torch.float32, device=self.device)
        values = [q.data_ptr(), kv.data_ptr(), indices.data_ptr(),
                  0 if topk_length is None else topk_length.data_ptr(),
                  0 if attn_sink is None else attn_sink.data_ptr(),
                  out.data_ptr(), max_logits.data_ptr(), lse.data_ptr()]
        if self.kv_map_key is not None:
            values.append(_kv_map((values[1],) + self.kv_map_key))
        self.launch_plan.launch(current_stream(torch, self.device.index), values)
        return out, max_logits, lse


# (device, the call's class, specialisation, kernel argument, forced spec) -> (device, Selection):
# a dispatch.SelectionMemo, made on first use (dispatch imports the families).
_selected = None


def select(call: Call, kernel=None):
    """(device index, dispatch Selection) for a validated call; ``kernel`` is a spec name or a Variant."""
    import torch

    from ... import dispatch, knobs
    from ...variant import Variant

    global _selected
    device = kit.device_of(torch, call.q)
    if isinstance(kernel, Variant):
        # A pinned variant skips dispatch's filter; one compiled for another layout or format
        # would read the cache at the wrong offsets.
        wrong = {k: v for k, v in specialization(call).items() if kernel.get(k, "bf16" if k == "kv_format" else None) != v}
        if wrong:
            _fail("kernel", f"variant {kernel.symbol} is compiled for "
                            f"{ {k: kernel.get(k) for k in wrong} }, the call needs {wrong}")
        return _select(call, kernel, device)
    if _selected is None:
        _selected = dispatch.SelectionMemo()
    memo = (device, str(call.key), tuple(specialization(call).items()), kernel, knobs.FAMILY.raw())
    return _selected.get(memo, lambda: _select(call, kernel, device))


def _select(call: Call, kernel, device: int):
    from ... import dispatch
    from ...variant import Variant

    try:
        selection = dispatch.dispatcher().select(
            NAME, str(call.key), specialization(call), device,
            accepts=lambda spec: accepts(spec, call) and (kernel is not None or preferred(spec, call)),
            variant=kernel if isinstance(kernel, Variant) else None,
            only=kernel if isinstance(kernel, str) else None,
        )
    except NoDeviceError as exc:
        if call.kv_format == "bf16":
            raise
        targets = ", ".join(kv_format_targets(call.kv_format)) or "none"
        raise NoDeviceError(f"mla_sparse_prefill: kv_format {call.kv_format!r}: no kernel for this device and "
                            f"these inputs ({exc}); kernels reading it target: {targets}") from None
    return device, selection

