"""``mla_prefill`` as PyTorch operators, so ``torch.compile(fullgraph=True)`` traces a model that
calls it without a graph break, and CUDA graphs capture it.

Two custom ops (``torch.library.custom_op``) with fake (meta) implementations:

* ``mlagen::mla_prefill(q, k, v, k_rope?, cu_seqlens_q?, cu_seqlens_k?, causal, softmax_scale?,
  check_seqlens?, max_seqlen_q?, max_seqlen_k?, kernel?, q_descale?, k_descale?, v_descale?,
  window_left, window_right, chunk_size?, softcap, attn_sink?) -> (out, lse)``: allocates its outputs;
* ``mlagen::mla_prefill_out(..., Tensor(a20!) out, Tensor(a21!) lse) -> ()``: writes preallocated
  outputs (declared mutated, so functionalization in torch.compile orders it correctly).

Both schemas are the fields of :class:`~.call.DenseArgs` in order (:data:`SCHEMA` gives each its
op arguments), and their implementations turn their plain arguments back into one DenseArgs.

:func:`mla_prefill` is the public Python entry point over both: it makes the call's DenseArgs,
checks the non-tensor arguments (errors are ValueError / TypeError naming the argument) and
picks the op. Importing this module imports torch and registers the ops.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode as _current_dispatch_mode

from ... import layouts
from ...errors import ArgumentTypeError
from . import entry
from .call import DenseArgs, check_arguments, check_descales, check_scalars
from .traits import check_traits

Tensor = torch.Tensor

# The op arguments of each DenseArgs field, "type name": the ops take plain tensors and scalars
# (torch ops take nothing else), in DenseArgs order, and their implementations make one DenseArgs
# of them, the one seam. window_size is two ints (checked before the op: traits.check_traits).
# ``out`` and ``lse`` are mlagen::mla_prefill_out's mutated outputs and are not arguments of
# mlagen::mla_prefill. A new DenseArgs field adds its op arguments here.
SCHEMA = {
    "q": ("Tensor q",), "k": ("Tensor k",), "v": ("Tensor v",), "k_rope": ("Tensor? k_rope",),
    "cu_seqlens_q": ("Tensor? cu_seqlens_q",), "cu_seqlens_k": ("Tensor? cu_seqlens_k",), "causal": ("bool causal",),
    "softmax_scale": ("float? softmax_scale",), "check_seqlens": ("bool? check_seqlens",),
    "max_seqlen_q": ("SymInt? max_seqlen_q",), "max_seqlen_k": ("SymInt? max_seqlen_k",), "kernel": ("str? kernel",),
    "q_descale": ("Tensor? q_descale",), "k_descale": ("Tensor? k_descale",), "v_descale": ("Tensor? v_descale",),
    "window_size": ("SymInt window_left", "SymInt window_right"), "chunk_size": ("SymInt? chunk_size",),
    "softcap": ("float softcap",), "attn_sink": ("Tensor? attn_sink",), "out": ("Tensor out",), "lse": ("Tensor lse",),
}
OUTPUTS = ("out", "lse")
_OUT_AT = DenseArgs._fields.index("out")
assert DenseArgs._fields[_OUT_AT:] == OUTPUTS, "out and lse are the last DenseArgs fields"
_WINDOW_AT = DenseArgs._fields.index("window_size")
# (index, name) of each field the public call checks to be a tensor (or None) before anything
# else; attn_sink is checked with the traits (traits.check_traits).
_TENSOR_ARGS = tuple((i, name) for i, name in enumerate(DenseArgs._fields)
                     if SCHEMA[name][0].startswith("Tensor") and name != "attn_sink")


def _schema(fields, mutated=()) -> str:
    """``(Tensor q, ..., Tensor(a20!) out, ...)``: the argument list torch.library would infer."""
    parts = [arg for name in fields for arg in SCHEMA[name]]
    names = [arg.split()[1] for arg in parts]
    return "(" + ", ".join(arg.replace("Tensor ", f"Tensor(a{i}!) ") if names[i] in mutated else arg
                           for i, arg in enumerate(parts)) + ")"


def op_inputs(args: DenseArgs) -> tuple:
    """The arguments of ``mlagen::mla_prefill`` (of mla_prefill_out, but out and lse) for checked
    traits: the fields but out and lse, window_size as two ints, softcap a float."""
    left, right = (int(x) for x in tuple(args.window_size))
    return args[:_WINDOW_AT] + (left, right, args.chunk_size, float(args.softcap)) + args[_WINDOW_AT + 3:_OUT_AT]


def _of_inputs(inputs: tuple, out=None, lse=None) -> DenseArgs:
    return DenseArgs._make(inputs[:_WINDOW_AT] + ((inputs[_WINDOW_AT], inputs[_WINDOW_AT + 1]),)
                           + inputs[_WINDOW_AT + 2:] + (out, lse))


@torch.library.custom_op("mlagen::mla_prefill", mutates_args=(),
                         schema=_schema(tuple(f for f in DenseArgs._fields if f not in OUTPUTS)) + " -> (Tensor, Tensor)")
def _op(*inputs) -> tuple[Tensor, Tensor]:
    return entry.run(_of_inputs(inputs))


def _fake_checks(args: DenseArgs) -> None:
    check_descales(torch, args)
    check_traits(torch, args.q, args.causal, args.window_size, args.chunk_size, args.softcap, args.attn_sink,
                 heads=args.q.shape[1])


@_op.register_fake
def _op_fake(*inputs):
    args = _of_inputs(inputs)
    total_q, _, heads, _, _ = check_arguments(torch, args)
    _fake_checks(args)
    return (args.q.new_empty((total_q, heads, args.v.shape[-1]), dtype=torch.bfloat16),
            args.q.new_empty((total_q, heads), dtype=torch.float32))


@torch.library.custom_op("mlagen::mla_prefill_out", mutates_args=OUTPUTS,
                         schema=_schema(DenseArgs._fields, OUTPUTS) + " -> ()")
def _op_out(*values) -> None:
    entry.run(_of_inputs(values[:-2], *values[-2:]))


@_op_out.register_fake
def _op_out_fake(*values):
    args = _of_inputs(values[:-2], *values[-2:])
    check_arguments(torch, args)
    _fake_checks(args)


def _tracing(q) -> bool:
    """Whether this call is being traced (torch.compile, FakeTensors, a dispatch mode such as
    make_fx or functionalization): then it must go through the op. Dynamo folds
    ``is_compiling()`` to True, so it never traces the rest."""
    if torch.compiler.is_compiling():
        return True
    return type(q) is not torch.Tensor or _current_dispatch_mode() is not None


def mla_prefill(q, k, v, *, k_rope=None, cu_seqlens_q=None, cu_seqlens_k=None, causal=True, softmax_scale=None,
                out=None, lse=None, check_seqlens=None, max_seqlen_q=None, max_seqlen_k=None, kernel=None,
                q_descale=None, k_descale=None, v_descale=None, window_size=(-1, -1), chunk_size=None, softcap=0.0,
                attn_sink=None):
    """Dense MLA prefill attention (unabsorbed, "MHA mode"), as in MLA.md sections 1 and 1b.

    The head geometry (d_nope, d_rope, d_v) follows from the tensors' widths: 128 / 64 / 128
    (DeepSeek-V3, Kimi-K2; the widths below), 192 / 64 / 256 (GLM-5) or 128 / 0 / 128 (no rope
    part: k has d_nope columns and there is no k_rope). Geometries other than the first, and the
    window, chunk, softcap and sink traits, run on the sm_90a kernels: bf16, and fp8 e4m3 at
    128 / 64 / 128 and 128 / 0 / 128 (softcap applies to the descaled score).

    Args:
        q: [Tq, H, 192] bf16 or fp8 e4m3, nope (128) followed by rope (64). Strided views are
            fine; the last dimension must be contiguous. q, k, k_rope and v share one dtype:
            torch.bfloat16, torch.float8_e4m3fn (OCP e4m3: kernels for gfx950) or
            torch.float8_e4m3fnuz (FNUZ e4m3: kernels for gfx942). A device with no kernel for
            the dtype raises TypeError naming it and the targets that have one.
        k: [Tk, H, 192], or [Tk, H, 128] (nope only) when ``k_rope`` is given.
        v: [Tk, H, 128].
        k_rope: optional [Tk, 1, 64] (one rope key shared by all heads: the MLA case; read once
            per key tile, never expanded) or [Tk, H, 64].
        cu_seqlens_q, cu_seqlens_k: optional int32 [B + 1] offsets of a packed (ragged) batch;
            both or neither. Sequence b has queries cu_seqlens_q[b]:cu_seqlens_q[b+1].
        causal: bottom-right aligned: query i of a sequence sees key j iff j <= i + Lk - Lq.
        softmax_scale: defaults to 1/sqrt(d_nope + d_rope).
        out: optional preallocated [Tq, H, 128] bf16 output (16-byte aligned strides).
        lse: optional preallocated [Tq, H] fp32 output (heads contiguous).
        check_seqlens: read device cu_seqlens back and check that they start at 0, never
            decrease, end at the packed lengths and fit max_seqlen_q/k. This synchronises the
            host with the device, so it is off by default (``MLAGEN_CHECK_SEQLENS=1`` turns it
            on for debugging) and refused while capturing a CUDA graph. CPU cu_seqlens are
            always checked, at no cost. Unchecked values can give wrong results but never
            out-of-bounds accesses: the kernels clamp every offset they read.
        max_seqlen_q, max_seqlen_k: optional host ints bounding the longest sequence, as in
            FlashAttention's varlen API. They need no device read; a bound below the mean
            length is an error, and with checking on they are checked against cu_seqlens. The
            shape class (which tuning record applies) is the mean length per sequence, which
            the host knows without them (Tq / B), so they do not change the kernel chosen.
        kernel: optional spec name (e.g. ``"mla_prefill_sm80"``) or Variant to force a kernel;
            by default the best kernel for the device, tuned for this shape class if the tuning
            database or the shipped records know one.
        q_descale, k_descale, v_descale: fp8 inputs only: optional float32 tensors of shape [1]
            (one factor per tensor) or [H] (one per head), on q's device. The real value of an
            element is its stored fp8 value times its tensor's (head's) descale; k_descale
            applies to k and k_rope alike. None means 1.0. The softmax scale applies to the real
            values: S = softmax_scale * (q_descale * q) (k_descale * k)^T. Accumulation is
            fp32; out is bf16 and lse fp32 as for bf16 inputs.
        window_size: (left, right), FlashAttention's local attention: query i (at p = i + Lk - Lq)
            sees keys p - left .. p + right; -1 is unbounded. With ``causal`` right is 0.
        chunk_size: optional int C: chunked attention, query p sees keys j <= p with
            j // C == p // C (excludes a window).
        softcap: c > 0 caps the scores, s <- c * tanh(s / c), before the mask; 0.0 is none.
        attn_sink: optional float32 [H] on q's device, one sink per head (natural-log units):
            out = sum_j exp(s_j - m) v_j / (sum_j exp(s_j - m) + exp(sink - m)); lse ignores it.

    Returns:
        (out, lse): out [Tq, H, d_v] bf16; lse [Tq, H] fp32, natural log. A row that sees no key
        (its mask leaves none) gives out = 0 and lse = +inf.

    Raises:
        ValueError (``mlagen.errors.ArgumentError``) or TypeError
        (``mlagen.errors.ArgumentTypeError``, for a wrong type or dtype) naming the argument;
        both are also ``mlagen.errors.LaunchError``.

    The launch goes on the current torch stream with no host synchronisation (after the first
    call of a shape class, which may compile), so it can be captured in a CUDA graph. Traced
    (torch.compile, FakeTensors, make_fx), the call is the ``mlagen::mla_prefill`` /
    ``mlagen::mla_prefill_out`` operator, so ``torch.compile(fullgraph=True)`` has no graph break;
    eager calls run the operators' implementation directly, skipping the dispatcher (about 30 us
    functional and 90 us mutating per call on the 2-core CI machine, measured with an empty op),
    and so does a Variant ``kernel`` (a tuning aid).
    Batched inputs (q [B, S, H, 192], k / v / k_rope [B, Sk, H, ...], no cu_seqlens) with any batch,
    token and head strides go in without a copy and give out [B, S, H, 128], lse [B, S, H]:
    :mod:`mlagen.layouts` (the transposed view of a [B, H, S, D] tensor included).
    """
    if isinstance(q, torch.Tensor) and q.dim() == 4:   # issue 38 hook: batched inputs, mlagen/layouts.py
        return layouts.dense_batched(mla_prefill, _tracing(q), q, k, v, k_rope=k_rope, cu_seqlens_q=cu_seqlens_q,
                                     cu_seqlens_k=cu_seqlens_k, causal=causal, softmax_scale=softmax_scale, out=out,
                                     lse=lse, check_seqlens=check_seqlens, max_seqlen_q=max_seqlen_q,
                                     max_seqlen_k=max_seqlen_k, kernel=kernel, q_descale=q_descale,
                                     k_descale=k_descale, v_descale=v_descale, window_size=window_size,
                                     chunk_size=chunk_size, softcap=softcap, attn_sink=attn_sink)
    # Positional (half the cost of keywords, on every call): DenseArgs' field order, which
    # test_op's test_the_public_call_hands_each_argument_to_its_field holds it to.
    args = DenseArgs(q, k, v, k_rope, cu_seqlens_q, cu_seqlens_k, causal, softmax_scale, check_seqlens, max_seqlen_q,
                     max_seqlen_k, kernel, q_descale, k_descale, v_descale, window_size, chunk_size, softcap,
                     attn_sink, out, lse)
    if kernel is None and type(q) is torch.Tensor and not _tracing(q) and entry.plain_traits(args):
        # A call with a launch plan first (its signature is one whose arguments passed every check).
        hit, sig = entry.planned(args)
        if hit is not None:
            return hit
    else:
        sig = None
    check_scalars(args)
    for i, name in _TENSOR_ARGS:
        t = args[i]
        if t is not None and not isinstance(t, torch.Tensor):
            raise ArgumentTypeError(f"mla_prefill: {name}: expected a torch.Tensor, got {type(t).__name__}")
    if check_seqlens is not None and not isinstance(check_seqlens, bool):
        raise ArgumentTypeError(f"mla_prefill: check_seqlens: expected a bool or None, got {check_seqlens!r}")
    check_traits(torch, q, causal, window_size, chunk_size, softcap, attn_sink, heads=q.shape[1] if q.dim() == 3 else None)
    if kernel is not None and not isinstance(kernel, str):
        from ...variant import Variant

        if not isinstance(kernel, Variant):
            raise ArgumentTypeError(f"mla_prefill: kernel: expected a spec name or a Variant, got "
                                    f"{type(kernel).__name__}")
        return entry.run(args)
    if not _tracing(q):
        # Eager: the same implementation the ops run, without the dispatcher's cost per call.
        if kernel is None:   # its plan was looked for above
            return entry.run_full(args, sig)
        return entry.run(args)
    if softmax_scale is not None:
        args = args._replace(softmax_scale=float(softmax_scale))
    if out is None and lse is None:
        return torch.ops.mlagen.mla_prefill(*op_inputs(args))
    if out is None or lse is None:  # one given: the op writes both, so allocate the other
        total_q, _, heads, _, _ = check_arguments(torch, args)
        if out is None:
            out = q.new_empty((total_q, heads, v.shape[-1]), dtype=torch.bfloat16)
        if lse is None:
            lse = q.new_empty((total_q, heads), dtype=torch.float32)
    torch.ops.mlagen.mla_prefill_out(*op_inputs(args), out, lse)
    return out, lse
