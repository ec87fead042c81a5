"""The eager path of one ``mla_prefill`` call: check the arguments, pick the kernel, launch it,
and keep a launch plan so that the next call of the same signature skips all of it.

The torch custom ops (:mod:`.op`) run this as their implementation; a call with an explicit
:class:`~mlagen.variant.Variant` (the tuner's) runs it directly. Every function here takes the
call's :class:`~.call.DenseArgs` whole.

Launch plans (:mod:`mlagen.plans`): an eager call repeated with the same signature (every
argument's: a tensor's dtype, shape, strides, device and 16-byte alignment, a scalar's type and
value; the knobs) allocates its outputs, encodes or finds the tensor maps of its pointers and
launches, without the argument checks, dispatch or packing of the full path. Every launcher
has them: simt, the sm90 TMA one and its FP8 sibling (whose plan, for a pre-pass variant,
allocates V^T, runs the pre-pass kernel and maps V^T, as the full path does). A call whose full
path copied an argument (a misaligned view, CPU cu_seqlens) or read cu_seqlens back
(``check_seqlens``) gets no plan.
"""

from __future__ import annotations

import math

from ... import dispatch, knobs, plans, runtime, shapelog
from ...errors import ArgumentError, ArgumentTypeError
from ...runtime import current_stream
from ...variant import Variant
from . import tma
from .call import FP8_DTYPES, INPUT_DTYPES, Call, DenseArgs, note_shape, prepare
from .compile import accepts, spec_dtype
from .params import ABIS, VT_PARAMS, num_virtual_tiles, simt_fp8_values, simt_values

FAMILY_NAME = "mla_prefill"


def run(args: DenseArgs):
    """Validate, select and launch on the current stream; returns (out, lse). No host sync
    unless ``check_seqlens`` asks for one (or the first call of a shape class compiles)."""
    import torch

    sig = None
    if (args.kernel is None or type(args.kernel) is str) and plain_traits(args):
        sig = signature(torch, args)
        hit = lookup(sig)
        if hit is not None:
            return hit.run(torch, args)
    return run_full(args, sig)


def plain_traits(args: DenseArgs) -> bool:
    """Whether a call leaves every mask and score trait at its default: only such calls get launch
    plans (DensePlan writes no sink pointer)."""
    window = args.window_size
    return (window is None or tuple(window) == (-1, -1)) and args.chunk_size is None and not args.softcap \
        and args.attn_sink is None


def planned(args: DenseArgs):
    """((out, lse), sig) of an eager call with the default kernel that has a launch plan, else
    (None, sig): the public call tries this before it checks anything, since a plan's signature
    equals that of a call whose arguments passed every check."""
    import torch

    sig = signature(torch, args)
    hit = lookup(sig)
    if hit is not None:
        return hit.run(torch, args), sig
    return None, sig


def run_full(args: DenseArgs, sig=None):
    """The full path of :func:`run` (checks, dispatch, launch); keeps a launch plan for ``sig``."""
    import torch

    call = prepare(args)
    note_shape(call)
    if call.empty:
        return call.out, call.lse
    if call.total_k == 0:  # no keys anywhere: every row sees nothing
        call.out.zero_()
        call.lse.fill_(math.inf)
        return call.out, call.lse
    device, selection = select(call, args.kernel)
    stream = current_stream(torch, device)
    if device == torch.cuda.current_device():
        grid, values = launch(selection, call, stream)
        remember(sig, selection, call, grid, values)
    else:  # the tensors' device, for anything the launcher allocates (a cheap check, a costly switch)
        with torch.cuda.device(device):
            launch(selection, call, stream)
    return call.out, call.lse


def launch(selection, call: Call, stream: int) -> tuple[tuple, dict]:
    """Launch the selected kernel on ``stream`` with either launcher ("abi" in the spec); no host
    synchronisation, so a launch can be captured in a CUDA graph. Returns the grid and the
    parameter values it packed (what a launch plan keeps)."""
    env = selection.env
    res = selection.resources
    if selection.spec.abi in ("simt", "simt_fp8"):
        values = (simt_values if selection.spec.abi == "simt" else simt_fp8_values)(call, env)
        grid = (num_virtual_tiles(call, env["block_m"]), call.heads, 1)
        selection.kernel.launch(grid, (res.threads, 1, 1), res.smem_bytes, stream, ABIS[selection.spec.abi].pack(values))
        return grid, values
    return tma.launch(selection, call, env, stream)


# (device, the call's class and kernel argument, forced spec) -> (device, Selection).
_selected = dispatch.SelectionMemo()


def select(call: Call, kernel=None):
    """(device index, dispatch Selection) for a validated call; ``kernel`` is a spec name or a Variant."""
    import torch

    device = call.q.device.index if call.q.device.index is not None else torch.cuda.current_device()
    if isinstance(kernel, Variant):
        return _select(call, kernel, device)
    memo = (device, call.dtype, call.heads, call.total_q, call.total_k, call.batch, call.causal,
            tuple(call.traits.specialization().items()),
            call.tma_compatible() is None, kernel, knobs.FAMILY.raw())
    return _selected.get(memo, lambda: _select(call, kernel, device))


def _select(call: Call, kernel, device: int):
    named = kernel.spec if isinstance(kernel, Variant) else next(
        (s for s in dispatch.family_specs(FAMILY_NAME) if s.name == kernel), None)
    if named is not None and spec_dtype(named) != call.dtype:
        raise ArgumentTypeError(f"mla_prefill: kernel: {named.name} takes {spec_dtype(named)} inputs, "
                                f"q is {call.q.dtype}")
    if not isinstance(kernel, Variant):
        check_dtype_supported(call, device)
        check_traits_supported(call, device, named)
    else:
        check_variant_traits(call, kernel)
    selection = dispatch.dispatcher().select(
        FAMILY_NAME, str(call.key), call.traits.specialization(), device,
        accepts=lambda spec: accepts(spec, call),
        variant=kernel if isinstance(kernel, Variant) else None,
        only=kernel if isinstance(kernel, str) else None,
    )
    return device, selection


def dtype_targets(dtype: str) -> dict[str, list[str]]:
    """Targets with a kernel of this family for inputs of ``dtype``, and those specs' names."""
    out: dict[str, list[str]] = {}
    for spec in dispatch.family_specs(FAMILY_NAME):
        if spec_dtype(spec) == dtype:
            for target in spec.targets:
                out.setdefault(target, []).append(spec.name)
    return out


def check_dtype_supported(call: Call, device: int) -> None:
    """One clear line (a TypeError naming the dtype) when the device's target has no kernel for
    the inputs' dtype, e.g. fp8 inputs on sm_90a, or OCP e4m3 on gfx942 (whose fp8 is FNUZ)."""
    if call.dtype == "bf16":
        return
    target = runtime.device_info(device).target
    if target is None:
        return  # dispatch names the unknown device
    have = dtype_targets(call.dtype)
    if target.name not in have:
        fp8 = {d: sorted(dtype_targets(d)) for d in FP8_DTYPES}
        known = "; ".join(f"{INPUT_DTYPES[d]} on {', '.join(t) or 'none'}" for d, t in fp8.items())
        raise ArgumentTypeError(f"mla_prefill: q: {call.dtype} inputs (torch.{INPUT_DTYPES[call.dtype]}) have no "
                                f"kernel for {target.name}; fp8 kernels: {known}")


def check_variant_traits(call: Call, v: Variant) -> None:
    """A variant given as ``kernel`` (the tuner's) must compute the call's mask, geometry and score
    traits (its specialisation; an axis its spec lacks is the default): a sink kernel run without
    sinks would read a null pointer. ArgumentError naming both."""
    want = {**{k: values[0] for k, values in v.spec.specialize}, **call.traits.specialization()}
    have = v.specialization
    wrong = {k: want[k] for k in want if k in have and have[k] != want[k]} or {
        k: val for k, val in call.traits.specialization().items() if k not in have}
    if wrong:
        raise ArgumentError(f"mla_prefill: kernel: {v.symbol} computes "
                            f"{', '.join(f'{k} {have.get(k, chr(45))}' for k in wrong)}; the call has "
                            f"{', '.join(f'{k} {val}' for k, val in wrong.items())}")


def check_traits_supported(call: Call, device: int, named=None) -> None:
    """One clear line (a ValueError naming the argument) when no spec for the device's target (or
    the one named) implements the call's geometry, mask or score traits (MLA.md section 1b)."""
    traits = call.traits
    if traits.default:
        return
    target = runtime.device_info(device).target
    if target is None:
        return  # dispatch names the unknown device
    specs = [s for s in dispatch.family_specs(FAMILY_NAME) if spec_dtype(s) == call.dtype]
    offer = [s for s in specs if all(v in dict(s.specialize).get(k, ()) for k, v in traits.specialization().items())]
    here = [s for s in offer if target.name in s.targets and (named is None or s.name == named.name)]
    if here:
        return
    arg = ("q" if traits.geometry != "n128r64v128" else "window_size" if traits.mask == "window" else
           "chunk_size" if traits.mask == "chunked" else "softcap" if traits.softcap else "attn_sink")
    what = ", ".join(f"{k} {v}" for k, v in traits.specialization().items())
    where = sorted({t for s in offer for t in s.targets})
    raise ArgumentError(f"mla_prefill: {arg}: {what} has {call.dtype} kernels for {', '.join(where) or 'no target'} "
                        f"({', '.join(s.name for s in offer) or 'no spec'}), not for {target.name}"
                        f"{f' in {named.name}' if named is not None else ''}")


def mla_prefill_kernel(q, k, v, *, k_rope=None, cu_seqlens_q=None, cu_seqlens_k=None, causal=True, kernel=None,
                       q_descale=None, k_descale=None, v_descale=None, window_size=(-1, -1), chunk_size=None,
                       softcap=0.0, attn_sink=None):
    """The kernel :func:`mlagen.mla_prefill` would run for these arguments, without running it.

    Returns the dispatcher's Selection: ``.spec``, ``.variant`` (``.variant.symbol``), ``.origin``
    ("default"; "user" for the tuning database; "shipped:<file>" for packaged records; either
    followed by " (other device: <name>)" for a record made on another device of the same
    architecture; or "explicit"), ``.binary.resources`` (registers and spills from ptxas).
    Builds the kernel if it is not built yet.
    """
    args = DenseArgs(q, k, v, k_rope=k_rope, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, causal=causal,
                     check_seqlens=False, kernel=kernel, q_descale=q_descale, k_descale=k_descale,
                     v_descale=v_descale, window_size=window_size, chunk_size=chunk_size, softcap=softcap,
                     attn_sink=attn_sink)
    return select(prepare(args), kernel)[1]


# --- launch plans ----------------------------------------------------------------------------

_plans = plans.PlanCache()

# The fields each launcher's plan writes per call, in the order DensePlan.run gives them.
_SIMT_VARIABLE = ("q", "k", "k_rope", "v", "out", "lse", "cu_seqlens_q", "cu_seqlens_k")
_TMA_VARIABLE = tuple(field for field, _ in tma.MAP_FIELDS) + ("tile_counter", "out", "lse", "cu_seqlens_q",
                                                                 "cu_seqlens_k", "attn_sink")
_FP8_VARIABLE = _TMA_VARIABLE + ("q_descale", "k_descale", "v_descale")
_VT_VARIABLE = ("v", "vt", "cu_seqlens_k")


def signature(torch, args: DenseArgs):
    """The call's plan signature: :func:`mlagen.plans.values_sig` of every argument, the knobs,
    the dispatcher's generation and the current device (last); None when it takes the full path
    (plans off, check_seqlens asked, an argument a signature cannot hold)."""
    check, q = args.check_seqlens, args.q
    if (check is not None and check is not False) or type(q) is not torch.Tensor or q.get_device() < 0:
        return None   # checked (or a check_seqlens the full path refuses), or the full path says what is wrong
    state = knobs.call_state()
    if state is None:
        return None
    try:
        return plans.values_sig(args, torch.Tensor) + (state, dispatch.dispatcher().generation,
                                                        torch.cuda.current_device())
    except plans.NoPlan:
        return None


def lookup(sig):
    return _plans.get(sig) if sig is not None else None


def remember(sig, selection, call: Call, grid: tuple, values: dict) -> None:
    """Keep the plan of a call that ran on the current device (``sig`` from :func:`signature`),
    unless its full path copied an argument, read cu_seqlens, or counts shapes."""
    if sig is None or sig[-1] != call.q.device.index or selection.spec.abi not in ("simt", "tma", "tma_fp8"):
        return
    if knobs.check_seqlens() or shapelog.enabled():
        return
    a = call.args
    used = (call.q, call.k, call.v, call.k_rope if a.k_rope is not None else None, call.cu_q, call.cu_k)
    given = (a.q, a.k, a.v, a.k_rope, a.cu_seqlens_q, a.cu_seqlens_k)
    if any((x is None) != (y is None) or (x is not None and x.data_ptr() != y.data_ptr()) for x, y in zip(used, given)):
        return
    try:
        built = DensePlan(selection, call, grid, values)
    except Exception:   # the call ran; without a plan the next one takes the full path again
        return
    _plans.put(sig, built)


class DensePlan:
    """What a repeated call writes: its outputs' pointers, its inputs' (the rope's too, when it is
    a view of k), their tensor maps (TMA launcher) and a zeroed tile counter (dynamic scheduler)."""

    def __init__(self, selection, call: Call, grid: tuple, values: dict):
        res = selection.resources
        self.device = call.q.device
        self.out_shape, self.lse_shape = tuple(call.out.shape), tuple(call.lse.shape)
        self.rope_offset = call.k_rope.data_ptr() - call.args.k.data_ptr()  # k_rope a view of k: where it starts
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

    def run(self, torch, args: DenseArgs):
        out, lse, cu_q, cu_k, k_rope = args.out, args.lse, args.cu_seqlens_q, args.cu_seqlens_k, args.k_rope
        if out is None:
            out = torch.empty(self.out_shape, dtype=torch.bfloat16, device=self.device)
        if lse is None:
            lse = torch.empty(self.lse_shape, dtype=torch.float32, device=self.device)
        kp, vp = args.k.data_ptr(), args.v.data_ptr()
        tail = (lse.data_ptr(), 0 if cu_q is None else cu_q.data_ptr(), 0 if cu_k is None else cu_k.data_ptr())
        stream = current_stream(torch, self.device.index)
        if self.pre_pass is not None:
            vt = torch.empty(self.vt_shape, dtype=torch.uint8, device=self.device)
            self.pre_pass.launch(stream, (vp, vt.data_ptr(), tail[2]))
            vp = vt.data_ptr()   # the main kernel maps V^T in V's place
        pointers = (args.q.data_ptr(), kp, kp + self.rope_offset if k_rope is None else k_rope.data_ptr(), vp,
                    out.data_ptr())
        if self.tma:
            maps = tuple(tma.map_at((ptr,) + key, what)
                         for ptr, key, (_, what) in zip(pointers, self.map_tails, tma.MAP_FIELDS))
            counter = tma.tile_counter(self.device, stream) if self.dynamic else 0
            values = maps + (counter, pointers[4]) + tail + (0,)   # no sink: calls with one get no plan
            if self.fp8:
                values += tuple(0 if t is None else t.data_ptr() for t in (args.q_descale, args.k_descale, args.v_descale))
        else:
            values = pointers + tail
        self.launch_plan.launch(stream, values)
        return out, lse
