"""Dense MLA prefill's bench peers (``mlagen bench``; ``../shared/BENCHMARKS.md``).

Every peer runs the same problem on the same fresh ``randn`` inputs (:mod:`.reference`):

* ``fa3``: FlashAttention-3's varlen forward: its 192/128 causal and no-mask kernels built from
  ``<peers>/fa3`` (see :data:`FA3`), and for the shapes those leave out (GLM-5's 256 / 256, a
  window) the kernels ``tools/fa3_extra/build.py`` builds from the same sources
  (:data:`FA3_EXTRA`); K is nope ‖ rope expanded to every head once, before timing, as a serving
  stack holds it. The strongest dense peer: the first column of the report when present.
* ``cudnn``: PyTorch SDPA restricted to the cuDNN backend; K is nope ‖ rope expanded to every head;
  a window as a dense additive mask.
* ``fa2``: PyTorch SDPA restricted to the flash backend (FlashAttention-2), V zero-padded to d_qk.
* ``mlagen``: the public call exactly as a user writes it, ``mlagen.mla_prefill(q, k, v,
  k_rope=..., cu_seqlens_q=..., cu_seqlens_k=..., causal=...)``: device cu_seqlens, default
  arguments, the dispatched kernel, the shared [Tk, 1, 64] rope key (the MLA case);
  ``mlagen:<spec>`` forces one kernel spec (``kernel=<spec>``), for comparing specs;
  ``mlagen:<kernel symbol>`` one variant (a tuning record against another, or against FA3). A
  shape of section 1b (another head geometry, a window) that the call cannot run yet is reported
  "not supported (why)" (:class:`~mlagen.errors.PeerUnsupported`).
* ``mlagen-check``: the same with ``check_seqlens=True`` (the cu_seqlens read back and checked).

Peer-side preparation (concatenation, padding, [B, H, L, D] layout, masks) happens here, before
any timing. Checked calls return (out [Tq, H, 128], lse [Tq, H] or None), what the family's
``compare`` takes.
"""

from __future__ import annotations

import inspect
import math

from ...errors import BenchError, PeerUnsupported
from ...peers import ExternalBuild, ProjectBuild
from ..base import Peer, Prepared

FA3 = ExternalBuild("fa3", "fa3_peer", "fa3_peer_C.so", "FA3_PEER_SO", "FA3_PEER_BUILD", "FlashAttention-3",
                    "build it on the GPU machine with: bash <peers>/fa3/run_remote.sh (about 2 minutes)")
#: FlashAttention-3's kernels for 256 / 256, a local window and softcap (``tools/fa3_extra``).
FA3_EXTRA = ProjectBuild("fa3_extra", "fa3_extra_C.so", "fa3_extra", "FA3_EXTRA_SO", "FA3_EXTRA_BUILD",
                         "FlashAttention-3's further kernels (256 / 256, local window, softcap)")


#: The inputs' keys of section 1b's call arguments (make_inputs adds those a shape has).
TRAIT_ARGS = ("window_size", "chunk_size", "softcap", "attn_sink")


def _dims(shape) -> tuple[int, int]:
    """(d_qk, d_v) of a shape (a shape without a geometry is 192 / 128)."""
    d_nope, d_rope, d_v = getattr(shape, "dims", (128, 64, 128))
    return d_nope + d_rope, d_v


def _mask(shape) -> str:
    return getattr(shape, "mask", "causal" if shape.causal else "none")


def _window(shape) -> tuple[int, int] | None:
    return tuple(shape.window) if _mask(shape) == "window" else None


def _softcap(shape) -> float:
    return float(getattr(shape, "softcap", 0.0) or 0.0)


def _base(shape) -> bool:
    """Section 1's traits: 192 / 128, causal or no mask, plain scores."""
    return (_dims(shape) == (192, 128) and _mask(shape) in ("causal", "none") and not _softcap(shape)
            and not getattr(shape, "sink", False))


def full_k(shape, inputs: dict):
    """K nope ‖ rope expanded to every head, [Tk, H, d_qk] (a copy: what FA3 and SDPA take)."""
    import torch

    if inputs["k_rope"] is None:
        return inputs["k"]
    return torch.cat([inputs["k"], inputs["k_rope"].expand(-1, shape.heads, -1)], dim=-1)


def mlagen_peer(shape, inputs: dict, arg: str | None = None, *, check_seqlens: bool | None = None) -> Prepared:
    """Our kernel through the public API, called exactly as a user writes it: device cu_seqlens,
    the shared rope key, every other argument at its default. ``check_seqlens=True`` makes the
    ``mlagen-check`` peer; ``arg`` forces a spec (``mlagen:<spec>``) or one variant
    (``mlagen:<kernel symbol>``, as the tuner and the records print it). The checked call poisons
    ``out`` and ``lse`` with NaN so a row the kernel never writes shows up."""
    import torch

    from ... import dispatch
    from .entry import mla_prefill_kernel
    from .op import mla_prefill

    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    kwargs = {"k_rope": inputs["k_rope"], "cu_seqlens_q": inputs["cu_seqlens_q"],
              "cu_seqlens_k": inputs["cu_seqlens_k"], "causal": shape.causal}
    for name in TRAIT_ARGS:   # a section 1b shape's traits, as the call takes them
        if name in inputs:
            _require_keyword(mla_prefill, name, _traits(shape))
            kwargs[name] = inputs[name]
    d_v = _dims(shape)[1]
    extra = {}
    if arg is not None:
        kernel = dispatch.kernel_choice("mla_prefill", arg) if isinstance(arg, str) else arg
        mask = "causal" if shape.causal else "none"
        if not isinstance(kernel, str) and kernel.get("mask", mask) != mask:
            raise BenchError(f"mlagen:{arg}: a kernel for mask={kernel['mask']}, the shape {shape.id} is {mask}")
        extra["kernel"] = kernel
    if check_seqlens is not None:
        extra["check_seqlens"] = check_seqlens

    def fn():
        return mla_prefill(q, k, v, **kwargs, **extra)

    def checked_call():
        out = torch.full((shape.total_q, shape.heads, d_v), math.nan, dtype=torch.bfloat16, device=q.device)
        lse = torch.full((shape.total_q, shape.heads), math.nan, dtype=torch.float32, device=q.device)
        got_out, got_lse = mla_prefill(q, k, v, out=out, lse=lse, **kwargs, **extra)
        if got_out.data_ptr() != out.data_ptr() or got_lse.data_ptr() != lse.data_ptr():
            raise BenchError("mla_prefill returned new tensors instead of the out= / lse= given to it")
        return got_out, got_lse

    takes = inspect.signature(mla_prefill_kernel).parameters   # the call's keywords it knows (the note only)
    try:
        sel = mla_prefill_kernel(q, k, v, **{a: b for a, b in kwargs.items() if a in takes},
                                 **({"kernel": extra["kernel"]} if arg else {}))
    except (TypeError, ValueError) as exc:
        if _base(shape):
            raise
        # a section 1b shape the call refuses: no kernel for the geometry or mask (yet)
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise PeerUnsupported(f"{_traits(shape)}: {why}") from None
    how = "public call, default arguments" if not extra else ", ".join(
        f"{a}={getattr(b, 'symbol', b)!r}" for a, b in extra.items())
    order = ""
    if sel.spec.abi in ("tma", "tma_fp8"):  # the tile order the launcher picks (tma.py: head_group)
        from .schedule import evaluate
        from .tma import head_group

        order = f"; tiles in groups of {head_group(shape, evaluate(sel.variant).scheduler)} heads"
    rope = "" if inputs["k_rope"] is None else f"; shared k_rope [Tk, 1, {inputs['k_rope'].shape[-1]}]"
    return Prepared(fn, checked_call, f"{how}{rope}; {sel.variant.symbol} ({sel.origin}){order}")


def _traits(shape) -> str:
    """What sets a section 1b shape apart, for messages: ``d 192/64/256``, ``window 4095/0``."""
    parts = []
    if tuple(getattr(shape, "dims", (128, 64, 128))) != (128, 64, 128):
        parts.append("d {}/{}/{}".format(*shape.dims))
    if _mask(shape) not in ("causal", "none"):
        parts.append(f"window {shape.window[0]}/{shape.window[1]}" if _window(shape) else _mask(shape))
    if _softcap(shape):
        parts.append(f"softcap {_softcap(shape):g}")
    if getattr(shape, "sink", False):
        parts.append("sink")
    return ", ".join(parts) or "this shape"


def _require_keyword(fn, name: str, what: str) -> None:
    """PeerUnsupported unless ``fn`` takes the keyword ``name``."""
    if name not in inspect.signature(fn).parameters:
        raise PeerUnsupported(f"{what}: mlagen.{fn.__name__} takes no {name}= yet")


def mlagen_checked_peer(shape, inputs: dict, arg: str | None = None) -> Prepared:
    """The public call with ``check_seqlens=True``: what checking the offsets costs."""
    return mlagen_peer(shape, inputs, check_seqlens=True)


def fa3_status() -> str | None:
    """None if either FA3 build is there (each shape then finds out whether its own is), else both
    reasons."""
    a, b = FA3.why_not(), FA3_EXTRA.why_not()
    return None if a is None or b is None else f"{a}; {b}"


def _fa3_varlen(shape, inputs: dict):
    """(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) as FA3's varlen call takes
    them: K nope ‖ rope expanded to every head, and cu_seqlens [0, T] for a batch of one."""
    import torch

    device = inputs["q"].device
    cu_q, cu_k = inputs["cu_seqlens_q"], inputs["cu_seqlens_k"]
    if cu_q is None:
        cu_q = torch.tensor([0, shape.total_q], dtype=torch.int32, device=device)
        cu_k = torch.tensor([0, shape.total_k], dtype=torch.int32, device=device)
    return (inputs["q"], full_k(shape, inputs).contiguous(), inputs["v"], cu_q, cu_k, max(shape.q_lens),
            max(shape.k_lens))


def fa3_peer(shape, inputs: dict, arg: str | None = None) -> Prepared:
    """FlashAttention-3's varlen forward: ``<peers>/fa3``'s 192 / 128 kernels for the shapes of
    section 1, ``tools/fa3_extra``'s for the others (:func:`fa3_extra_peer`). FA3 takes K with the
    rope part expanded to every head: built once here, outside the timed call, as a serving stack
    holds it. A batch of one gets cu_seqlens [0, T] (the varlen API, as vLLM and SGLang call it)."""
    if not _base(shape):
        return fa3_extra_peer(shape, inputs)
    fa3 = FA3.load()
    q, k, v, cu_q, cu_k, max_q, max_k = _fa3_varlen(shape, inputs)

    def fn():
        return fa3.fwd(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k,
                       causal=shape.causal)

    def checked_call():
        out, lse = fn()
        return out, lse.transpose(0, 1)   # FA3's lse is [H, Tq]

    return Prepared(fn, checked_call, "K nope ‖ rope expanded to [Tk, H, 192] once, before timing; varlen API")


def fa3_extra_peer(shape, inputs: dict) -> Prepared:
    """FlashAttention-3's kernel for the shape's geometry and mask from ``tools/fa3_extra``
    (``torch.ops.fa3_extra.fwd``: varlen, window (left, right) with -1 unbounded, as FA3's
    ``window_size``). A geometry or mask it has no kernel for raises PeerUnsupported."""
    if _mask(shape) not in ("causal", "none", "window") or getattr(shape, "sink", False):
        raise PeerUnsupported(f"{_traits(shape)}: FA3's forward has no such mask or sink")
    ops = FA3_EXTRA.load()
    d_qk, d_v = _dims(shape)
    window, softcap = _window(shape), _softcap(shape)
    causal, (left, right) = shape.causal, (window if window is not None else (-1, -1))
    have = [str(n) for n in ops.kernels()]
    if not any(_kernel_fits(n, d_qk, d_v, causal, window is not None, softcap > 0) for n in have):
        raise PeerUnsupported(f"no FA3 kernel built for d {d_qk} / {d_v}, "
                              f"{'causal' if causal else 'window' if window else 'no mask'}"
                              f"{', softcap' if softcap else ''}; built: {', '.join(have)}")
    q, k, v, cu_q, cu_k, max_q, max_k = _fa3_varlen(shape, inputs)

    def fn():
        return ops.fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, left, right, softcap, None)

    def checked_call():
        out, lse = fn()
        return out, lse.transpose(0, 1)   # FA3's lse is [H, Tq]

    return Prepared(fn, checked_call, f"tools/fa3_extra kernel for d {d_qk} / {d_v}"
                    + (f", window ({left}, {right})" if window is not None else "")
                    + (f", softcap {softcap:g}" if softcap else "")
                    + f"; K nope ‖ rope expanded to [Tk, H, {d_qk}] once, before timing; varlen API")


#: The kernels ``tools/fa3_extra/build.py`` names: hdim<d>[_<dv>]_<causal|noncausal|local>[_softcap].
def _kernel_fits(name: str, d_qk: int, d_v: int, causal: bool, local: bool, softcap: bool = False) -> bool:
    parts = name.split("_")
    dims = parts[0].removeprefix("hdim")
    rest = parts[1:]
    if rest and rest[0].isdigit():
        dims, rest = f"{dims}_{rest[0]}", rest[1:]
    d, _, dv = dims.partition("_")
    mask = "causal" if causal else "local" if local else "noncausal"
    return (int(d), int(dv or d)) == (d_qk, d_v) and rest == [mask] + (["softcap"] if softcap else [])


def cudnn_peer(shape, inputs: dict, arg: str | None = None) -> Prepared:
    """PyTorch SDPA on the cuDNN backend (d_qk 192 / d_v 128 natively)."""
    from torch.nn.attention import SDPBackend

    return sdpa_peer(shape, inputs, backend=SDPBackend.CUDNN_ATTENTION, pad_v=False, lower_right="dense")


def fa2_peer(shape, inputs: dict, arg: str | None = None) -> Prepared:
    """PyTorch SDPA on the flash backend (FlashAttention-2), which needs d_v = d_qk: V padded to 192."""
    from torch.nn.attention import SDPBackend

    return sdpa_peer(shape, inputs, backend=SDPBackend.FLASH_ATTENTION, pad_v=True, lower_right="bias")


def sdpa_peer(shape, inputs: dict, *, backend, pad_v: bool, lower_right: str) -> Prepared:
    """``scaled_dot_product_attention`` restricted to ``backend`` on copies laid out [B, H, L, D].

    SDPA takes no packed batch: uniform lengths run as one batched call, ragged ones as one call
    per sequence (all inside the timed call). SDPA's ``is_causal`` is top-left aligned, right only
    when Lq = Lk; otherwise the bottom-right mask is either ``"dense"``, an additive bf16 [Lq, Lk]
    mask built before timing, or ``"bias"``, ``causal_lower_right`` (which picks its kernel itself,
    ignoring ``sdpa_kernel``: for the flash backend we first make sure it will pick flash).
    """
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    d_qk, d_v = _dims(shape)
    if _softcap(shape) or getattr(shape, "sink", False):
        raise PeerUnsupported(f"{_traits(shape)}: SDPA has no softcap or sink")
    if backend == SDPBackend.FLASH_ATTENTION and _mask(shape) not in ("causal", "none"):
        raise PeerUnsupported(f"{_traits(shape)}: SDPA's flash backend takes no mask but causal")
    calls = _sdpa_calls(shape, inputs, pad_v, lower_right)
    if backend == SDPBackend.FLASH_ATTENTION:
        _require_flash_for_bias(calls)
    scale = 1.0 / math.sqrt(d_qk)

    def fn():
        with sdpa_kernel(backend):
            return [F.scaled_dot_product_attention(q, k, v, scale=scale, **mask) for q, k, v, mask in calls]

    def checked_call():
        outs = fn()
        return torch.cat([o[..., :d_v].transpose(1, 2).reshape(-1, shape.heads, d_v) for o in outs]), None

    notes = []
    if pad_v and d_v < d_qk:
        notes.append(f"V zero-padded to {d_qk}")
    if not shape.uniform:
        notes.append(f"per-sequence calls ({shape.batch} SDPA calls per timed call; SDPA takes no packed batch)")
    if _mask(shape) not in ("causal", "none"):
        notes.append(f"{_traits(shape)} as a dense additive [Lq, Lk] mask (SDPA takes no window; every block is "
                     "computed)")
    elif shape.causal and any(lq != lk for lq, lk in zip(shape.q_lens, shape.k_lens)):
        notes.append("bottom-right causal as a dense additive [Lq, Lk] mask (SDPA's is_causal is top-left, and "
                     "causal_lower_right never dispatches to cuDNN)" if lower_right == "dense"
                     else "bottom-right causal through causal_lower_right (flash kernel)")
    return Prepared(fn, checked_call, "; ".join(notes))


def _bhsd(t, batch: int):
    """[batch * L, H, D] packed rows → contiguous [batch, H, L, D]."""
    return t.unflatten(0, (batch, -1)).transpose(1, 2).contiguous()


def _sdpa_calls(shape, inputs: dict, pad_v: bool, lower_right: str) -> list[tuple]:
    """(q, k, v, mask kwargs) per SDPA call, every tensor prepared."""
    import torch

    q, v = inputs["q"], inputs["v"]
    k = full_k(shape, inputs)
    d_qk, d_v = _dims(shape)
    if pad_v and d_v < d_qk:
        v = torch.nn.functional.pad(v, (0, d_qk - d_v))
    if shape.uniform:
        groups = [(slice(0, shape.total_q), slice(0, shape.total_k), shape.batch, shape.q_lens[0], shape.k_lens[0])]
    else:
        groups = [(slice(qs, qs + lq), slice(ks, ks + lk), 1, lq, lk) for qs, lq, ks, lk in shape.sequence_lengths()]
    return [(_bhsd(q[qs], b), _bhsd(k[ks], b), _bhsd(v[ks], b),
             _sdpa_mask(lq, lk, shape.causal, lower_right, q.device, shape))
            for qs, ks, b, lq, lk in groups]


def _sdpa_mask(lq: int, lk: int, causal: bool, lower_right: str, device, shape=None) -> dict:
    import torch

    if shape is not None and _mask(shape) not in ("causal", "none"):   # a dense additive mask: what SDPA takes
        from .reference import band

        chunk = [shape.chunk] if _mask(shape) == "chunked" else []
        visible = band(torch.arange(lq, device=device) + (lk - lq), lk, _mask(shape), tuple(shape.window), *chunk)
        bias = torch.zeros(1, 1, lq, lk, dtype=torch.bfloat16, device=device).masked_fill(~visible, -math.inf)
        return {"attn_mask": bias}
    if not causal:
        return {}
    if lq == lk:
        return {"is_causal": True}
    if lower_right == "bias":
        from torch.nn.attention.bias import causal_lower_right

        return {"attn_mask": causal_lower_right(lq, lk)}
    visible = torch.ones(lq, lk, dtype=torch.bool, device=device).tril(diagonal=lk - lq)
    bias = torch.zeros(1, 1, lq, lk, dtype=torch.bfloat16, device=device).masked_fill(~visible, -math.inf)
    return {"attn_mask": bias}


def _require_flash_for_bias(calls: list[tuple]) -> None:
    from torch.backends.cuda import SDPAParams, can_use_flash_attention
    from torch.nn.attention.bias import CausalBias

    for q, k, v, mask in calls:
        if isinstance(mask.get("attn_mask"), CausalBias) and not can_use_flash_attention(
                SDPAParams(q, k, v, None, 0.0, False, False)):
            raise BenchError("the flash kernel cannot take this shape with a bottom-right causal mask, and "
                             "causal_lower_right would silently run another kernel")


#: The peers in the report's column order: fa3 (the lead, when built), cudnn, fa2, mlagen, mlagen-check.
#: Run by default: fa3 (when built), cudnn, mlagen.
PEERS: dict[str, Peer] = {p.name: p for p in (
    Peer("fa3", "FlashAttention-3 (varlen forward, built from <peers>/fa3; 256 / 256 and windows from "
         "tools/fa3_extra)", fa3_peer, default=True, lead=True, status=fa3_status),
    Peer("cudnn", "PyTorch SDPA, cuDNN backend", cudnn_peer, default=True),
    Peer("fa2", "PyTorch SDPA, flash backend (FlashAttention-2), V padded to d_qk", fa2_peer),
    Peer("mlagen", "the public call mlagen.mla_prefill, default arguments (mlagen:<spec> forces a spec, mlagen:<kernel symbol> a variant)", mlagen_peer,
         ours=True, default=True, arg="spec|symbol"),
    Peer("mlagen-check", "the public call with check_seqlens=True", mlagen_checked_peer, ours=True),
)}
