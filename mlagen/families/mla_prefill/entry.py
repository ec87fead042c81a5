"""The eager path of one ``mla_prefill`` call: check the arguments, pick the kernel, launch it.

The torch custom ops (:mod:`.op`) run this as their implementation; a call with an explicit
:class:`~mlagen.variant.Variant` (the tuner's) runs it directly.
"""

from __future__ import annotations

import math

from ... import dispatch, knobs, runtime
from ...runtime import current_stream
from ...errors import ArgumentError, ArgumentTypeError
from ...variant import Variant
from .launch import accepts, launch, spec_dtype
from . import plan, record
from .call import FP8_DTYPES, INPUT_DTYPES, Call, prepare

FAMILY_NAME = "mla_prefill"


def run(q, k, v, *, k_rope=None, cu_seqlens_q=None, cu_seqlens_k=None, causal=True, softmax_scale=None,
        out=None, lse=None, check_seqlens=None, max_seqlen_q=None, max_seqlen_k=None, kernel=None, q_descale=None,
        k_descale=None, v_descale=None, window_size=(-1, -1), chunk_size=None, softcap=0.0, attn_sink=None):
    """Validate, select and launch on the current stream; returns (out, lse). No host sync
    unless ``check_seqlens`` asks for one (or the first call of a shape class compiles)."""
    import torch

    sig = None
    if (kernel is None or type(kernel) is str) and plain_traits(window_size, chunk_size, softcap, attn_sink):
        sig = plan.signature(torch, q, k, v, k_rope, cu_seqlens_q, cu_seqlens_k, causal, softmax_scale, out, lse,
                             check_seqlens, max_seqlen_q, max_seqlen_k, kernel, q_descale, k_descale, v_descale)
        hit = plan.lookup(sig)
        if hit is not None:
            return hit.run(torch, q, k, v, k_rope, cu_seqlens_q, cu_seqlens_k, out, lse, q_descale, k_descale,
                           v_descale)
    return run_full(q, k, v, k_rope=k_rope, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, causal=causal,
                    softmax_scale=softmax_scale, out=out, lse=lse, check_seqlens=check_seqlens,
                    max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, kernel=kernel, q_descale=q_descale,
                    k_descale=k_descale, v_descale=v_descale, window_size=window_size, chunk_size=chunk_size,
                    softcap=softcap, attn_sink=attn_sink, sig=sig)


def plain_traits(window_size, chunk_size, softcap, attn_sink) -> bool:
    """Whether a call leaves every mask and score trait at its default: only such calls get launch
    plans (whose signatures hold no traits)."""
    return (window_size is None or tuple(window_size) == (-1, -1)) and chunk_size is None and not softcap \
        and attn_sink is None


def planned(q, k, v, k_rope, cu_seqlens_q, cu_seqlens_k, causal, softmax_scale, out, lse, check_seqlens,
            max_seqlen_q, max_seqlen_k, q_descale, k_descale, v_descale):
    """((out, lse), sig) of an eager call with the default kernel that has a launch plan, else
    (None, sig): the public call tries this before it checks anything, since a plan's signature
    equals that of a call whose arguments passed every check."""
    import torch

    sig = plan.signature(torch, q, k, v, k_rope, cu_seqlens_q, cu_seqlens_k, causal, softmax_scale, out, lse,
                         check_seqlens, max_seqlen_q, max_seqlen_k, None, q_descale, k_descale, v_descale)
    hit = plan.lookup(sig)
    if hit is not None:
        return hit.run(torch, q, k, v, k_rope, cu_seqlens_q, cu_seqlens_k, out, lse, q_descale, k_descale,
                       v_descale), sig
    return None, sig


def run_full(q, k, v, *, k_rope=None, cu_seqlens_q=None, cu_seqlens_k=None, causal=True, softmax_scale=None,
             out=None, lse=None, check_seqlens=None, max_seqlen_q=None, max_seqlen_k=None, kernel=None,
             q_descale=None, k_descale=None, v_descale=None, window_size=(-1, -1), chunk_size=None, softcap=0.0,
             attn_sink=None, sig=None):
    """The full path of :func:`run` (checks, dispatch, launch); keeps a launch plan for ``sig``."""
    import torch

    call = prepare(q, k, v, k_rope=k_rope, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, causal=causal,
                   softmax_scale=softmax_scale, out=out, lse=lse, check_seqlens=check_seqlens,
                   max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, q_descale=q_descale, k_descale=k_descale,
                   v_descale=v_descale, window_size=window_size, chunk_size=chunk_size, softcap=softcap,
                   attn_sink=attn_sink)
    record.note(call)
    if call.empty:
        return call.out, call.lse
    if call.total_k == 0:  # no keys anywhere: every row sees nothing
        call.out.zero_()
        call.lse.fill_(math.inf)
        return call.out, call.lse
    device, selection = select(call, kernel)
    stream = current_stream(torch, device)
    if device == torch.cuda.current_device():
        grid, values = launch(selection, call, stream)
        plan.remember(sig, selection, call, grid, values, (q, k, v, k_rope, cu_seqlens_q, cu_seqlens_k))
    else:  # the tensors' device, for anything the launcher allocates (a cheap check, a costly switch)
        with torch.cuda.device(device):
            launch(selection, call, stream)
    return call.out, call.lse


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
    call = prepare(q, k, v, k_rope=k_rope, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                   causal=causal, check_seqlens=False, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
                   window_size=window_size, chunk_size=chunk_size, softcap=softcap, attn_sink=attn_sink)
    return select(call, kernel)[1]
