"""Launch plans of dense MLA prefill (:mod:`mlagen.plans`): an eager call repeated with the same
signature (every tensor's dtype, shape, strides, device and 16-byte alignment, the scalars, the
knobs) allocates its outputs, encodes or finds the tensor maps of its pointers and launches,
without the argument checks, dispatch or packing of the full path (:mod:`.entry`).

Every launcher: simt, the sm90 TMA one and its FP8 sibling (whose plan, for a pre-pass variant,
allocates V^T, runs the pre-pass kernel and maps V^T, as the full path does). A call whose full path copied an argument (a
misaligned view, CPU cu_seqlens) or read cu_seqlens back (``check_seqlens``) gets no plan.
"""

from __future__ import annotations

from ... import dispatch, knobs, plans, shapelog
from ...runtime import current_stream
from . import tma
from .call import Call
from .params import ABIS, VT_PARAMS

_plans = plans.PlanCache()

# The fields each launcher's plan writes per call, in the order DensePlan.run gives them.
_SIMT_VARIABLE = ("q", "k", "k_rope", "v", "out", "lse", "cu_seqlens_q", "cu_seqlens_k")
_TMA_VARIABLE = tuple(field for field, _ in tma.MAP_FIELDS) + ("tile_counter", "out", "lse", "cu_seqlens_q",
                                                                 "cu_seqlens_k", "attn_sink")
_FP8_VARIABLE = _TMA_VARIABLE + ("q_descale", "k_descale", "v_descale")
_VT_VARIABLE = ("v", "vt", "cu_seqlens_k")


def signature(torch, q, k, v, k_rope, cu_seqlens_q, cu_seqlens_k, causal, softmax_scale, out, lse, check_seqlens,
              max_seqlen_q, max_seqlen_k, kernel, q_descale, k_descale, v_descale):
    """The call's plan signature, or None when it takes the full path (plans off, check_seqlens
    asked, an argument a signature cannot hold). The current device comes last."""
    if (check_seqlens is not None and check_seqlens is not False) or type(q) is not torch.Tensor \
            or q.get_device() < 0:
        return None   # checked (or a check_seqlens the full path refuses), or the full path says what is wrong
    state = knobs.call_state()
    if state is None:
        return None
    t = torch.Tensor
    try:
        return (plans.tensor_sig(q, t), plans.tensor_sig(k, t), plans.tensor_sig(v, t), plans.tensor_sig(k_rope, t),
                plans.tensor_sig(cu_seqlens_q, t), plans.tensor_sig(cu_seqlens_k, t), plans.tensor_sig(out, t),
                plans.tensor_sig(lse, t), plans.tensor_sig(q_descale, t), plans.tensor_sig(k_descale, t),
                plans.tensor_sig(v_descale, t), plans.scalar_sig(causal), plans.scalar_sig(softmax_scale),
                plans.scalar_sig(check_seqlens), plans.scalar_sig(max_seqlen_q), plans.scalar_sig(max_seqlen_k),
                plans.scalar_sig(kernel), state, dispatch.dispatcher().generation, torch.cuda.current_device())
    except plans.NoPlan:
        return None


def lookup(sig):
    return _plans.get(sig) if sig is not None else None


def remember(sig, selection, call: Call, grid: tuple, values: dict, args: tuple) -> None:
    """Keep the plan of a call that ran on the current device (``sig`` from :func:`signature`),
    unless its full path copied an argument, read cu_seqlens, or counts shapes."""
    if sig is None or sig[-1] != call.q.device.index or selection.spec.abi not in ("simt", "tma", "tma_fp8"):
        return
    if knobs.check_seqlens() or shapelog.enabled():
        return
    q, k, v, k_rope, cu_q, cu_k = args
    used = (call.q, call.k, call.v, call.k_rope if k_rope is not None else None, call.cu_q, call.cu_k)
    given = (q, k, v, k_rope, cu_q, cu_k)
    if any((a is None) != (b is None) or (a is not None and a.data_ptr() != b.data_ptr()) for a, b in zip(used, given)):
        return
    try:
        built = DensePlan(selection, call, grid, values, k)
    except Exception:   # the call ran; without a plan the next one takes the full path again
        return
    _plans.put(sig, built)


class DensePlan:
    """What a repeated call writes: its outputs' pointers, its inputs' (the rope's too, when it is
    a view of k), their tensor maps (TMA launcher) and a zeroed tile counter (dynamic scheduler)."""

    def __init__(self, selection, call: Call, grid: tuple, values: dict, k):
        res = selection.resources
        self.device = call.q.device
        self.out_shape, self.lse_shape = tuple(call.out.shape), tuple(call.lse.shape)
        self.rope_offset = call.k_rope.data_ptr() - k.data_ptr()  # k_rope a view of k: where it starts
        self.tma = selection.spec.abi in ("tma", "tma_fp8")
        self.vt_shape = self.pre_pass = None
        self.fp8 = False
        if self.tma:
            p = tma._plan(selection, selection.env)
            block, smem, variable = p.block, p.smem, _TMA_VARIABLE
            vt = None
            self.fp8 = p.fp8
            if p.fp8:
                variable = _FP8_VARIABLE
            if p.prepass:   # V^T: allocated per call, written by the pre-pass, mapped in V's place
                self.vt_shape = tma.vt_shape(call)
                vt = call.v.new_empty(self.vt_shape)   # its layout, for the map's key (once)
                self.pre_pass = plans.LaunchPlan(selection.kernel.entry(f"{selection.variant.symbol}_vt"),
                                                 tma.vt_grid(call), (tma.VT_THREADS, 1, 1), 0, VT_PARAMS,
                                                 tma.vt_values(call, 0), _VT_VARIABLE)
            self.map_tails = tuple(key[1:] for key in tma.map_keys(selection, call, selection.env, vt))
            self.dynamic = p.schedule.scheduler == "dynamic"
        else:
            block, smem, variable = (res.threads, 1, 1), res.smem_bytes, _SIMT_VARIABLE
        self.launch_plan = plans.LaunchPlan(selection.kernel, grid, block, smem, ABIS[selection.spec.abi], values,
                                            variable)

    def run(self, torch, q, k, v, k_rope, cu_q, cu_k, out, lse, q_descale=None, k_descale=None, v_descale=None):
        if out is None:
            out = torch.empty(self.out_shape, dtype=torch.bfloat16, device=self.device)
        if lse is None:
            lse = torch.empty(self.lse_shape, dtype=torch.float32, device=self.device)
        kp, vp = k.data_ptr(), v.data_ptr()
        tail = (lse.data_ptr(), 0 if cu_q is None else cu_q.data_ptr(), 0 if cu_k is None else cu_k.data_ptr())
        stream = current_stream(torch, self.device.index)
        if self.pre_pass is not None:
            vt = torch.empty(self.vt_shape, dtype=torch.uint8, device=self.device)
            self.pre_pass.launch(stream, (vp, vt.data_ptr(), tail[2]))
            vp = vt.data_ptr()   # the main kernel maps V^T in V's place
        pointers = (q.data_ptr(), kp, kp + self.rope_offset if k_rope is None else k_rope.data_ptr(), vp,
                    out.data_ptr())
        if self.tma:
            maps = tuple(tma.map_at((ptr,) + key, what)
                         for ptr, key, (_, what) in zip(pointers, self.map_tails, tma.MAP_FIELDS))
            counter = tma.tile_counter(self.device, stream) if self.dynamic else 0
            values = maps + (counter, pointers[4]) + tail + (0,)   # no sink: calls with one get no plan
            if self.fp8:
                values += tuple(0 if t is None else t.data_ptr() for t in (q_descale, k_descale, v_descale))
        else:
            values = pointers + tail
        self.launch_plan.launch(stream, values)
        return out, lse
