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
from .problem import D_V, NAME, pool_rows

_MAP_CACHE_SIZE = 256
_kv_maps: dict[tuple, bytes] = {}  # oldest first; read without the lock (dict reads are atomic)
_kv_maps_lock = threading.Lock()


_NO_MAP = bytes(128)


def _kv_map_key(call: Call, pool=None) -> tuple:
    """(address, chunks, rows of a page, pages, row bytes, page bytes) of the KV tensor map of
    the call's first pool, or of ``pool`` (its extra Pool)."""
    src = call if pool is None else pool
    row_bytes, chunks = 2 * src.kv_row_stride, call.d_qk // 64
    if src.page_size > 0:
        rows, pages, page_bytes = src.page_size, -(-src.num_kv // src.page_size), 2 * src.kv_page_stride
    else:
        rows, pages, page_bytes = max(src.num_kv, 1), 1, max(src.num_kv, 1) * row_bytes
    return (src.kv.data_ptr(), chunks, rows, max(pages, 1), row_bytes, page_bytes)


def kv_tensor_map(call: Call, pool=None) -> bytes:
    """TMA descriptor of a call's bf16 KV rows (of ``pool``, its extra Pool, when given) as a 4-D
    tensor (64 values, d_qk / 64 chunks, rows of a page, pages; a flat table is one page of N
    rows), 128-byte swizzled, box one row."""
    return _kv_map(_kv_map_key(call, pool))


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
    x = call.extra
    # An empty first pool beside a second: its base is the second's (a valid address; no row of
    # it is read).
    kv = call.kv.data_ptr() if call.num_kv > 0 or x is None or x.empty else x.kv.data_ptr()
    values = {
        "q": call.q.data_ptr(), "kv": kv, "indices": call.indices.data_ptr(),
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
    if x is None or x.empty:
        # No second pool: extra_topk 0, nothing of it is read.
        values.update(extra_kv=kv, extra_indices=0, extra_topk_length=0, extra_idx_row_stride=0,
                      extra_row_stride=0, extra_page_stride=0, extra_topk=0, extra_num_kv=0, extra_page_size=1)
    else:
        values.update(extra_kv=x.kv.data_ptr(), extra_indices=x.indices.data_ptr(),
                      extra_topk_length=x.topk_length.data_ptr() if x.topk_length is not None else 0,
                      extra_idx_row_stride=x.indices.stride(0), extra_row_stride=x.kv_row_stride,
                      extra_page_stride=x.kv_page_stride, extra_topk=x.topk, extra_num_kv=x.num_kv,
                      extra_page_size=max(x.page_size, 1))
    if abi_name == "gather_tma":
        # A quantized cache is bulk-copied row by row (no tensor map; the field is zeros).
        values["kv_map"] = kv_tensor_map(call) if call.kv_format == "bf16" and call.num_kv > 0 else _NO_MAP
        values["extra_kv_map"] = kv_tensor_map(call, x) if x is not None and not x.empty else _NO_MAP
    return values


def grid(selection, call: Call) -> tuple[int, int, int]:
    rows = selection.env["block_h"]
    items = call.sq * -(-call.heads // rows)
    if selection.env.get("persistent", False):
        # One CTA per SM loops over the items (the kernel strides by gridDim.x): the spec's
        # problem.persistent (the H <= 16 kernel) or the variant's tunable (the 64-head kernel).
        from ...runtime import device_info

        return (max(1, min(items, device_info(call.q.device.index).sm_count)), 1, 1)
    return (items, 1, 1)


def launch(selection, call: Call, stream: int) -> None:
    """Launch the selected kernel on ``stream``; no host synchronisation."""
    res = selection.resources
    selection.kernel.launch(grid(selection, call), (res.threads, 1, 1), res.smem_bytes, stream,
                            pack(call, selection.spec.abi))



def run(q, kv, indices, *, softmax_scale, topk_length=None, attn_sink=None, d_v=D_V, out=None, max_logits=None,
        lse=None, kernel=None, kv_format="bf16", compute="bf16", extra_kv=None, extra_indices=None,
        extra_topk_length=None, extra_kv_format=None):
    """The eager path of one call (what the torch ops run): check, select, launch on the current
    stream; returns (out, max_logits, lse). See :func:`mlagen.mla_sparse_prefill`."""
    import torch

    from ...runtime import current_stream

    sig = None
    extra = (extra_kv, extra_indices, extra_topk_length)
    # A two-pool call of bf16 pools keeps a plan too (FP8 pools are staged: the full path).
    plannable = extra_kv is None or (kv_format == "bf16" and extra_kv_format in (None, "bf16"))
    if (kernel is None or type(kernel) is str) and plannable:
        sig = _signature(torch, q, kv, indices, softmax_scale, topk_length, attn_sink, d_v, out, max_logits, lse,
                         kernel, kv_format, compute, extra, extra_kv_format)
        plan = _plans.get(sig) if sig is not None else None
        if plan is not None:
            return plan.run(torch, q, kv, indices, topk_length, attn_sink, out, max_logits, lse, *extra)
    call = prepare(q, kv, indices, softmax_scale=softmax_scale, topk_length=topk_length, attn_sink=attn_sink,
                   d_v=d_v, out=out, max_logits=max_logits, lse=lse, kv_format=kv_format, compute=compute,
                   extra_kv=extra_kv, extra_indices=extra_indices, extra_topk_length=extra_topk_length,
                   extra_kv_format=extra_kv_format)
    if call.empty:
        if call.sq:
            fill_empty(call)
        return call.out, call.max_logits, call.lse
    if call.extra is not None:
        two_bf16 = call.kv_format == "bf16" and call.extra.kv_format == "bf16"
        device, selection = _run_two(torch, call, kernel)
        if sig is not None and sig[-1] == device and two_bf16:
            _keep_plan(sig, selection, call, q, kv, indices, extra_kv, extra_indices)
        return call.out, call.max_logits, call.lse
    if staging.applies(call, kernel):   # an FP8 cache in bf16: dequantized first (staging.py says why)
        ws, ws_indices = kit.on_device(torch, call.q.device.index, staging.stage, call)
        return run(call.q, ws, ws_indices, softmax_scale=call.scale, topk_length=call.topk_length,
                   attn_sink=call.attn_sink, d_v=d_v, out=call.out, max_logits=call.max_logits, lse=call.lse)
    device, selection = select(call, kernel)
    kit.on_device(torch, device, launch, selection, call, current_stream(torch, device))
    if sig is not None and sig[-1] == device:
        _keep_plan(sig, selection, call, q, kv, indices)
    return call.out, call.max_logits, call.lse


def _keep_plan(sig, selection, call: Call, q, kv, indices, extra_kv=None, extra_indices=None) -> None:
    try:
        plan = _Plan.of(selection, call, q, kv, indices, extra_kv, extra_indices)
    except Exception:   # the call ran; without a plan the next one takes the full path again
        plan = None
    if plan is not None:
        _plans.put(sig, plan)


def _run_two(torch, call: Call, kernel):
    """A call with a second pool: FP8 pools are staged into bf16 first (each on its own, as a
    one-pool call stages; the in-kernel FP8 operand reads one pool), then one bf16 launch reads
    both. Returns (device, selection)."""
    from ...runtime import current_stream

    _check_two_pool_kernel(kernel)
    device = kit.device_of(torch, call.q)
    x = call.extra
    for pool, view, arg in ((call, call, "kv"), (x, staging.pool_view(call, x), "extra_kv")):
        if pool.kv_format == "bf16":
            continue
        if pool.topk == 0 or pool.num_kv == 0:   # nothing of it is read
            pool.kv_format, pool.num_kv, pool.page_size, pool.kv_page_stride = "bf16", 0, 0, 0
            continue
        staging.check_workspace(view, arg)
        pool.kv, pool.indices = kit.on_device(torch, device, staging.stage, view)
        _as_bf16(call, pool)
    if (call.page_size > 0) != (x.page_size > 0):   # staged rows are flat; the other pool may be paged
        from .call import as_paged

        for pool in (call, x):
            if pool.page_size == 0:
                pool.page_size, pool.kv_page_stride = as_paged(pool.num_kv, pool.kv_row_stride)
    device, selection = select(call, kernel)
    kit.on_device(torch, device, launch, selection, call, current_stream(torch, device))
    return device, selection


def _check_two_pool_kernel(kernel) -> None:
    """A kernel named for a two-pool call must read two pools: one line naming extra_kv if not."""
    if kernel is None:
        return
    from ... import spec as spec_mod
    from .compile import two_pool_targets, two_pools

    try:
        spec = kernel.spec if hasattr(kernel, "spec") else spec_mod.load(kernel) if isinstance(kernel, str) else None
    except Exception:   # not a spec name (a kernel symbol, or a typo): dispatch says what it is
        return
    if spec is not None and not two_pools(spec):
        named = [s.name for s in family_specs_two_pools()]
        _fail("extra_kv", f"kernel {spec.name!r} reads one KV pool; the two-pool kernels are {named} (targets "
                          f"{', '.join(two_pool_targets())})")


def family_specs_two_pools():
    from .compile import family_specs, two_pools

    return [s for s in family_specs() if two_pools(s)]


def _as_bf16(call: Call, pool) -> None:
    """A staged pool: flat bf16 rows of d_qk values (its indices already point into them)."""
    pool.kv_format, pool.page_size, pool.kv_page_stride = "bf16", 0, 0
    pool.num_kv, pool.kv_row_stride = pool.kv.shape[0], call.d_qk


_plans = plans.PlanCache()


def _signature(torch, q, kv, indices, softmax_scale, topk_length, attn_sink, d_v, out, max_logits, lse, kernel,
               kv_format, compute, extra=(None, None, None), extra_kv_format=None):
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
                plans.scalar_sig(compute), *(plans.tensor_sig(x, t) for x in extra), plans.scalar_sig(extra_kv_format),
                state, dispatch.dispatcher().generation, torch.cuda.current_device())
    except plans.NoPlan:
        return None


# The fields of the parameter struct that change from call to call with one signature.
_POINTERS = ("q", "kv", "indices", "topk_length", "attn_sink", "out", "max_logits", "lse", "extra_kv",
             "extra_indices", "extra_topk_length")


class _Plan:
    """A sparse call's launch plan: the outputs' shapes and what ``pack`` would write, less the
    pointers (and the KV tensor maps' addresses, for the TMA gather). ``two``: the call's second
    pool is read; ``first_empty``: its first pool has no rows (the kernel's base is then the
    second's, as :func:`_pack_values` writes it)."""

    def __init__(self, launch_plan, device, out_shape, stat_shape, maps, kv_map_key, extra_map_key, two, first_empty):
        self.launch_plan, self.device = launch_plan, device
        self.out_shape, self.stat_shape, self.maps, self.kv_map_key = out_shape, stat_shape, maps, kv_map_key
        self.extra_map_key, self.two, self.first_empty = extra_map_key, two, first_empty

    @classmethod
    def of(cls, selection, call: Call, q, kv, indices, extra_kv=None, extra_indices=None):
        """The plan of a call that ran, or None where the full path copied an argument (then a
        repeated call must copy again) or the kernel has no plan-able launcher."""
        if (call.q.data_ptr(), call.kv.data_ptr(), call.indices.data_ptr()) != (q.data_ptr(), kv.data_ptr(),
                                                                                 indices.data_ptr()):
            return None
        x = call.extra
        if x is not None and (x.kv.data_ptr(), x.indices.data_ptr()) != (extra_kv.data_ptr(), extra_indices.data_ptr()):
            return None
        two = x is not None and not x.empty
        abi_name = selection.spec.abi
        values = _pack_values(call, abi_name)
        variable = _POINTERS
        kv_map_key = extra_map_key = None
        maps = abi_name == "gather_tma" and call.kv_format == "bf16"
        if maps:
            variable = _POINTERS + ("kv_map", "extra_kv_map")
            kv_map_key = _kv_map_key(call)[1:] if call.num_kv > 0 else None
            extra_map_key = _kv_map_key(call, x)[1:] if two else None
        res = selection.resources
        launch_plan = plans.LaunchPlan(selection.kernel, grid(selection, call), (res.threads, 1, 1), res.smem_bytes,
                                       ABIS[abi_name](call.kv_format), values, variable)
        return cls(launch_plan, call.q.device, tuple(call.out.shape), tuple(call.lse.shape), maps, kv_map_key,
                   extra_map_key, two, two and call.num_kv == 0)

    def run(self, torch, q, kv, indices, topk_length, attn_sink, out, max_logits, lse, extra_kv=None,
            extra_indices=None, extra_topk_length=None):
        from ...runtime import current_stream

        if out is None:
            out = torch.empty(self.out_shape, dtype=torch.bfloat16, device=self.device)
        if max_logits is None:
            max_logits = torch.empty(self.stat_shape, dtype=torch.float32, device=self.device)
        if lse is None:
            lse = torch.empty(self.stat_shape, dtype=torch.float32, device=self.device)
        base = extra_kv.data_ptr() if self.first_empty else kv.data_ptr()
        if self.two:
            second = (extra_kv.data_ptr(), extra_indices.data_ptr(),
                      0 if extra_topk_length is None else extra_topk_length.data_ptr())
        else:
            second = (base, 0, 0)   # no second pool: _pack_values's values
        values = [q.data_ptr(), base, indices.data_ptr(),
                  0 if topk_length is None else topk_length.data_ptr(),
                  0 if attn_sink is None else attn_sink.data_ptr(),
                  out.data_ptr(), max_logits.data_ptr(), lse.data_ptr(), *second]
        if self.maps:
            values.append(_kv_map((kv.data_ptr(),) + self.kv_map_key) if self.kv_map_key is not None else _NO_MAP)
            values.append(_kv_map((extra_kv.data_ptr(),) + self.extra_map_key) if self.extra_map_key is not None
                          else _NO_MAP)
        self.launch_plan.launch(current_stream(torch, self.device.index), values)
        return out, max_logits, lse


# (device, the sizes the call's class is made of, whether it has a second pool, specialisation,
# kernel argument, forced spec) -> (device, Selection): a dispatch.SelectionMemo, made on first use
# (dispatch imports the families). The raw sizes (heads, key positions, pool rows) stand for the
# class, so a hit builds no ProblemKey; the second pool is there because only some specs read one.
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
    memo = (device, call.heads, call.keys, pool_rows(call), call.extra is None, tuple(specialization(call).items()),
            kernel, knobs.FAMILY.raw())
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
        if call.extra is not None:
            from .compile import two_pool_targets

            raise NoDeviceError(f"mla_sparse_prefill: extra_kv: no kernel reading two KV pools for this device and "
                                f"these inputs ({exc}); two-pool kernels target: "
                                f"{', '.join(two_pool_targets()) or 'none'}") from None
        if call.kv_format == "bf16":
            raise
        targets = ", ".join(kv_format_targets(call.kv_format)) or "none"
        raise NoDeviceError(f"mla_sparse_prefill: kv_format {call.kv_format!r}: no kernel for this device and "
                            f"these inputs ({exc}); kernels reading it target: {targets}") from None
    return device, selection

