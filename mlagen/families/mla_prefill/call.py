"""Argument checking of dense MLA prefill: the caller's arguments in one :class:`DenseArgs`, a
validated :class:`Call` out.

:class:`DenseArgs` holds the arguments of one call as given, unchecked: the public
``mla_prefill`` builds it once, and everything after it takes it whole: the torch ops' fake
implementations (:mod:`.op`; the ops themselves take plain tensors and scalars, and convert at
that one seam), the launch-plan signature, :func:`prepare`, dispatch and the launchers (through
``Call.args``). Adding an argument to the call is one field here (with its default), its op
schema type (``op.SCHEMA``) and its check (:func:`check_scalars`, :func:`check_arguments` or
``traits.check_traits``); the signatures between stay as they are.

Nothing here synchronises with the device unless asked: cu_seqlens on the GPU are checked for
shape and dtype only, unless ``check_seqlens`` (or ``MLAGEN_CHECK_SEQLENS=1``) asks for their
values to be read back. The kernels clamp every offset they read, so unchecked values can give
wrong results but never out-of-bounds accesses (``templates/include/mlagen/common/tile_index.cuh``).

:func:`check_arguments` reads only shapes, dtypes and strides, so the fake (meta) implementation
of the torch custom op runs it on FakeTensors; :func:`prepare` adds what needs real tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

from ... import knobs, shapelog
from ...errors import ArgumentError, ArgumentTypeError
from .. import kit
from .problem import D_QK, DEFAULT_GEOMETRY, GEOMETRIES, ProblemKey, problem_key
from .traits import Traits, check_traits, geometry_of


class DenseArgs(NamedTuple):
    """The arguments of one ``mla_prefill`` call as the caller gave them (see
    :func:`mlagen.mla_prefill`), nothing checked. The field order is that of the
    ``mlagen::mla_prefill_out`` schema (the functional op's is the same without out and lse;
    the ops take window_size as two ints, window_left and window_right)."""

    q: Any
    k: Any
    v: Any
    k_rope: Any = None
    cu_seqlens_q: Any = None
    cu_seqlens_k: Any = None
    causal: Any = True
    softmax_scale: Any = None
    check_seqlens: Any = None
    max_seqlen_q: Any = None
    max_seqlen_k: Any = None
    kernel: Any = None     # a spec name, a Variant (the tuner's; never through the ops) or None
    q_descale: Any = None  # fp32 [1] or [H] (fp8 inputs only; None: 1.0): real value = stored x descale
    k_descale: Any = None  # applies to k and k_rope
    v_descale: Any = None
    window_size: Any = (-1, -1)   # the mask and score traits (MLA.md section 1b; traits.check_traits)
    chunk_size: Any = None
    softcap: Any = 0.0
    attn_sink: Any = None
    out: Any = None
    lse: Any = None


@dataclass
class Call:
    """One validated invocation: tensors checked, outputs allocated, nothing launched yet. The
    tensors are those the kernel reads (a misaligned view copied, k split into nope and rope,
    cu_seqlens on q's device, the outputs allocated); ``args`` is the call as given."""

    q: Any
    k: Any
    k_rope: Any
    v: Any
    out: Any
    lse: Any
    cu_q: Any
    cu_k: Any
    total_q: int
    total_k: int
    heads: int
    batch: int
    scale: float
    rope: str  # "folded" (k holds 192 columns), "shared" ([Tk, 1, 64]) or "per_head" ([Tk, H, 64])
    args: DenseArgs
    dtype: str = "bf16"  # the inputs' element type: "bf16", "fp8_e4m3" (OCP) or "fp8_e4m3fnuz"
    traits: Traits | None = None  # geometry, mask and score traits (MLA.md section 1b); None: args.causal's

    def __post_init__(self):
        if self.traits is None:
            self.traits = Traits(mask="causal" if self.args.causal else "none")

    @property
    def causal(self) -> bool:
        return self.traits.mask == "causal"

    @property
    def mask(self) -> str:
        return self.traits.mask

    @property
    def key(self) -> ProblemKey:
        t = self.traits
        return problem_key(self.heads, self.total_q, self.total_k, self.batch, self.causal, t.mask, t.geometry, t.score)

    @property
    def empty(self) -> bool:
        return self.total_q == 0

    def tma_compatible(self) -> str | None:
        """None if every operand meets TMA's rules (16-byte aligned base and strides), else why not.
        Computed once per call (dispatch asks for each spec)."""
        try:
            return self._tma_verdict
        except AttributeError:
            self._tma_verdict = self._tma_check()
            return self._tma_verdict

    def _tma_check(self) -> str | None:
        for name in ("q", "k", "k_rope", "v", "out"):
            if kit.aligned(getattr(self, name)):
                continue
            t = getattr(self, name)
            if t.data_ptr() % 16:
                return f"{name} is not 16-byte aligned"
            for dim in range(t.dim() - 1):
                if t.size(dim) > 1 and (t.stride(dim) * t.element_size()) % 16:
                    return f"{name} stride {t.stride(dim)} (dim {dim}) is not a multiple of 16 bytes"
        return None


def _fail(arg: str, message: str):
    raise ArgumentError(f"mla_prefill: {arg}: {message}")


def _fail_type(arg: str, message: str):
    raise ArgumentTypeError(f"mla_prefill: {arg}: {message}")


def _check_tensor(torch, t, arg: str, dtype, ndim: int, device=None):
    if not isinstance(t, torch.Tensor):
        _fail_type(arg, f"expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        _fail_type(arg, f"dtype must be {dtype}, got {t.dtype}")
    if t.dim() != ndim:
        _fail(arg, f"expected {ndim} dimensions, got shape {tuple(t.shape)}")
    if device is not None and t.device != device:
        _fail(arg, f"must be on {device} (like q), got {t.device}")


# The element types the inputs may have, by dtype name (the spec's problem.dtype and the tuning
# record's dtypes). OCP e4m3 (torch.float8_e4m3fn: max 448, NaN = S.1111.111) is NVIDIA's and
# gfx950's; FNUZ e4m3 (torch.float8_e4m3fnuz: max 240, exponent bias 8, NaN = 1.0000.000, no -0)
# is gfx942's. Both are one byte per element.
INPUT_DTYPES = {"bf16": "bfloat16", "fp8_e4m3": "float8_e4m3fn", "fp8_e4m3fnuz": "float8_e4m3fnuz"}
FP8_DTYPES = ("fp8_e4m3", "fp8_e4m3fnuz")


_DTYPE_NAMES: dict = {}


def dtype_name(torch, dtype) -> str | None:
    """The dtype name ("bf16", "fp8_e4m3", "fp8_e4m3fnuz") of a torch dtype, None if not an input type."""
    if not _DTYPE_NAMES:
        _DTYPE_NAMES.update({getattr(torch, attr): name for name, attr in INPUT_DTYPES.items() if hasattr(torch, attr)})
    return _DTYPE_NAMES.get(dtype)


def _allowed_dtypes(torch) -> str:
    return ", ".join(f"torch.{a}" for a in INPUT_DTYPES.values() if hasattr(torch, a))


def check_scalars(args: DenseArgs) -> float:
    """Check the non-tensor arguments but ``kernel`` and ``check_seqlens`` (the public call checks
    those) and the traits (traits.check_traits); returns the softmax scale (default
    1/sqrt(192); :func:`prepare` sets another geometry's)."""
    causal, softmax_scale = args.causal, args.softmax_scale
    if not isinstance(causal, bool):
        _fail_type("causal", f"expected a bool, got {causal!r}")
    if softmax_scale is None:
        scale = 1.0 / math.sqrt(D_QK)
    else:
        if isinstance(softmax_scale, bool):
            _fail_type("softmax_scale", f"expected a float, got {softmax_scale!r}")
        try:
            scale = float(softmax_scale)
        except (TypeError, ValueError):
            _fail_type("softmax_scale", f"expected a float, got {softmax_scale!r}")
        if not (math.isfinite(scale) and scale > 0):
            _fail("softmax_scale", f"must be a finite positive number, got {softmax_scale!r}")
    for name, value in (("max_seqlen_q", args.max_seqlen_q), ("max_seqlen_k", args.max_seqlen_k)):
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int):
                _fail_type(name, f"expected a host int (like FlashAttention's varlen API), got {type(value).__name__}")
            if value < 0:
                _fail(name, f"must be >= 0, got {value}")
    return scale


def check_descales(torch, args: DenseArgs) -> str:
    """The inputs' dtype name, after checking q's dtype and the descale factors against it:
    fp32, shape [1] (per tensor) or [H] (per head), on q's device, given for fp8 inputs only."""
    q = args.q
    if not isinstance(q, torch.Tensor):
        _fail_type("q", f"expected a torch.Tensor, got {type(q).__name__}")
    dtype = dtype_name(torch, q.dtype)
    if dtype is None:
        _fail_type("q", f"dtype must be one of {_allowed_dtypes(torch)}, got {q.dtype}")
    heads = q.shape[1] if q.dim() == 3 else None
    for name, t in (("q_descale", args.q_descale), ("k_descale", args.k_descale), ("v_descale", args.v_descale)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            _fail_type(name, f"expected a float32 torch.Tensor of shape [1] or [heads], got {type(t).__name__}")
        if dtype not in FP8_DTYPES:
            _fail(name, f"descale factors apply to fp8 inputs only; q is {q.dtype}")
        if t.dtype != torch.float32:
            _fail_type(name, f"dtype must be torch.float32, got {t.dtype}")
        if t.dim() != 1 or t.shape[0] not in (1, heads):
            _fail(name, f"expected shape [1] (per tensor) or [{heads}] (per head), got {tuple(t.shape)}")
        if t.device != q.device:
            _fail(name, f"must be on {q.device} (like q), got {t.device}")
    return dtype


def _geometry_for_checks(torch, q, k, v, k_rope) -> str:
    """The geometry the tensors' widths name, else (some width is wrong) the first whose d_qk is q's,
    or the default: the checks then name the tensor that does not fit it."""
    try:
        if all(isinstance(t, torch.Tensor) and t.dim() == 3 for t in (k, v)):
            return geometry_of(q, k, v, k_rope)
    except ArgumentError:
        pass
    return next((g for g, (n, r, _) in GEOMETRIES.items() if n + r == q.shape[-1]), "n128r64v128")


def check_arguments(torch, args: DenseArgs) -> tuple[int, int, int, int, str]:
    """Shapes, dtypes, devices and strides of every tensor argument but the descale factors
    (:func:`check_descales`) and the sinks (traits.check_traits); reads no values, so it runs on
    FakeTensors too. q, k, k_rope and v share one dtype (bf16 or an fp8 e4m3, see INPUT_DTYPES);
    out is bf16 and lse fp32 either way. Returns (total_q, total_k, heads, batch, rope)."""
    q, k, v, k_rope, out, lse = args.q, args.k, args.v, args.k_rope, args.out, args.lse
    cu_seqlens_q, cu_seqlens_k = args.cu_seqlens_q, args.cu_seqlens_k
    max_seqlen_q, max_seqlen_k = args.max_seqlen_q, args.max_seqlen_k
    if not isinstance(q, torch.Tensor):
        _fail_type("q", f"expected a torch.Tensor, got {type(q).__name__}")
    if dtype_name(torch, q.dtype) is None:
        _fail_type("q", f"dtype must be one of {_allowed_dtypes(torch)}, got {q.dtype}")
    in_dtype = q.dtype
    _check_tensor(torch, q, "q", in_dtype, 3)
    device = q.device
    total_q, heads, dq = q.shape
    d_nope, d_rope, d_v = GEOMETRIES[_geometry_for_checks(torch, q, k, v, k_rope)]
    d_qk = d_nope + d_rope
    if dq != d_qk:
        _fail("q", f"last dimension must be {d_qk} (nope {d_nope} + rope {d_rope}), got {dq}")
    if heads < 1:
        _fail("q", "needs at least one head")
    for name, t in (("k", k), ("v", v), ("k_rope", k_rope)):
        if isinstance(t, torch.Tensor) and t.dtype != in_dtype:
            _fail_type(name, f"dtype must be {in_dtype} like q (q, k, k_rope and v share one dtype), got {t.dtype}")
    _check_tensor(torch, k, "k", in_dtype, 3, device)
    _check_tensor(torch, v, "v", in_dtype, 3, device)
    total_k = k.shape[0]
    if k.shape[1] != heads:
        _fail("k", f"has {k.shape[1]} heads, q has {heads}")
    if tuple(v.shape) != (total_k, heads, d_v):
        _fail("v", f"expected shape ({total_k}, {heads}, {d_v}), got {tuple(v.shape)}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1:
            _fail(name, f"last dimension must be contiguous (stride 1), got stride {t.stride(-1)}")
    if k_rope is None:
        if k.shape[2] != d_qk:
            _fail("k", f"without k_rope, k must hold nope and rope ({d_qk} columns), got {k.shape[2]}")
        rope = "folded"
    else:
        if k.shape[2] != d_nope:
            _fail("k", f"with k_rope given, k holds the {d_nope} nope columns only, got {k.shape[2]}")
        _check_tensor(torch, k_rope, "k_rope", in_dtype, 3, device)
        if k_rope.shape[0] != total_k or k_rope.shape[2] != d_rope or k_rope.shape[1] not in (1, heads):
            _fail("k_rope", f"expected shape ({total_k}, 1, {d_rope}) or ({total_k}, {heads}, {d_rope}), "
                            f"got {tuple(k_rope.shape)}")
        if k_rope.stride(-1) != 1:
            _fail("k_rope", f"last dimension must be contiguous (stride 1), got stride {k_rope.stride(-1)}")
        rope = "shared" if k_rope.shape[1] == 1 and heads > 1 else "per_head"

    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        _fail("cu_seqlens_q" if cu_seqlens_q is None else "cu_seqlens_k",
              "cu_seqlens_q and cu_seqlens_k must be given together (packed batch) or not at all")
    batch = 1
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if cu is None:
            continue
        if not isinstance(cu, torch.Tensor):
            _fail_type(name, f"expected a torch.Tensor of int32, got {type(cu).__name__}")
        if cu.dtype != torch.int32:
            _fail_type(name, f"dtype must be torch.int32, got {cu.dtype}")
        if cu.dim() != 1 or cu.numel() < 2:
            _fail(name, f"expected shape [batch + 1] with batch >= 1, got {tuple(cu.shape)}")
    if cu_seqlens_q is not None:
        if cu_seqlens_k.numel() != cu_seqlens_q.numel():
            _fail("cu_seqlens_k", f"has {cu_seqlens_k.numel()} entries but the other cu_seqlens has "
                                  f"{cu_seqlens_q.numel()}; both are [batch + 1]")
        batch = cu_seqlens_q.numel() - 1
    if total_q >= 2**31 or total_k >= 2**31:
        _fail("q" if total_q >= 2**31 else "k", "more than 2**31 - 1 rows is not supported")
    # max_seqlen is an upper bound (as in FlashAttention): below the mean length it cannot be one.
    for name, value, total in (("max_seqlen_q", max_seqlen_q, total_q), ("max_seqlen_k", max_seqlen_k, total_k)):
        if value is not None and value < -(-total // batch):
            _fail(name, f"{value} cannot bound the longest of {batch} sequence(s) holding {total} rows "
                        f"(at least {-(-total // batch)})")

    if out is not None:
        _check_tensor(torch, out, "out", torch.bfloat16, 3, device)
        if tuple(out.shape) != (total_q, heads, d_v):
            _fail("out", f"expected shape ({total_q}, {heads}, {d_v}), got {tuple(out.shape)}")
        if out.stride(-1) != 1:
            _fail("out", f"last dimension must be contiguous (stride 1), got stride {out.stride(-1)}")
        if any((out.stride(d) * 2) % 16 for d in range(2) if out.size(d) > 1):
            _fail("out", "base address and row/head strides must be multiples of 16 bytes")
    if lse is not None:
        _check_tensor(torch, lse, "lse", torch.float32, 2, device)
        if tuple(lse.shape) != (total_q, heads):
            _fail("lse", f"expected shape ({total_q}, {heads}), got {tuple(lse.shape)}")
        if lse.stride(1) != 1 and heads > 1:
            _fail("lse", f"heads must be contiguous (stride 1), got stride {lse.stride(1)}")
    return total_q, total_k, heads, batch, rope




def _check_cu_values(cu, arg: str, total: int, longest: int | None, longest_arg: str) -> None:
    values = cu.tolist()  # a CPU tensor costs nothing; a device tensor costs one small copy and a sync
    if values[0] != 0:
        _fail(arg, f"must start at 0, got {values[0]}")
    for i in range(len(values) - 1):
        if values[i + 1] < values[i]:
            _fail(arg, f"must be non-decreasing; entry {i + 1} ({values[i + 1]}) < entry {i} ({values[i]})")
    if values[-1] != total:
        _fail(arg, f"last entry must equal the packed length {total}, got {values[-1]}")
    if longest is not None:
        actual = max(b - a for a, b in zip(values, values[1:]))
        if actual > longest:
            _fail(longest_arg, f"{longest} is shorter than the longest sequence in {arg} ({actual})")


def resolve_check(torch, check_seqlens) -> bool:
    """``check_seqlens`` as given, else the MLAGEN_CHECK_SEQLENS knob; never while capturing."""
    capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    if check_seqlens is None:
        return knobs.check_seqlens() and not capturing
    if check_seqlens and capturing:
        _fail("check_seqlens", "reading cu_seqlens values synchronises; not allowed while capturing a CUDA graph")
    return bool(check_seqlens)


def prepare(args: DenseArgs) -> Call:
    """Validate arguments (errors name the argument) and allocate ``out``/``lse``.

    Argument errors are :class:`~mlagen.errors.ArgumentError` (a ValueError) or, for a wrong type
    or dtype, :class:`~mlagen.errors.ArgumentTypeError` (a TypeError); both are LaunchErrors.
    Device cu_seqlens are read back only when ``check_seqlens`` is true (default: the
    MLAGEN_CHECK_SEQLENS knob, off); CPU cu_seqlens are always checked, at no cost.
    """
    import torch

    scale = check_scalars(args)
    q = args.q
    if not isinstance(q, torch.Tensor):
        _fail_type("q", f"expected a torch.Tensor, got {type(q).__name__}")
    if q.device.type != "cuda":
        _fail("q", f"must be a CUDA tensor, got device {q.device}")
    total_q, total_k, heads, batch, rope = check_arguments(torch, args)
    dtype = check_descales(torch, args)
    k, v, k_rope = args.k, args.v, args.k_rope
    geometry = geometry_of(q, k, v, k_rope)
    d_nope, d_rope, d_v = GEOMETRIES[geometry]
    if args.softmax_scale is None:
        scale = 1.0 / math.sqrt(d_nope + d_rope)
    # Sizes past the keys are kept as given (no length-based rewrite), so a call runs the mask it names
    # and a variant of that mask (the tuner's) fits it.
    traits = check_traits(torch, q, args.causal, args.window_size, args.chunk_size, args.softcap, args.attn_sink,
                          geometry, heads)
    device = q.device
    check = resolve_check(torch, args.check_seqlens)
    cu_q = cu_k = None
    if args.cu_seqlens_q is not None:
        for name, cu, total, longest, longest_arg in (
                ("cu_seqlens_q", args.cu_seqlens_q, total_q, args.max_seqlen_q, "max_seqlen_q"),
                ("cu_seqlens_k", args.cu_seqlens_k, total_k, args.max_seqlen_k, "max_seqlen_k")):
            if cu.device.type == "cpu" or check:
                _check_cu_values(cu, name, total, longest, longest_arg)
        cu_q, cu_k = (cu if cu.device == device else cu.to(device, non_blocking=True)
                      for cu in (args.cu_seqlens_q, args.cu_seqlens_k))
        cu_q, cu_k = cu_q.contiguous(), cu_k.contiguous()
    out, lse = args.out, args.lse
    if out is None:
        out = torch.empty((total_q, heads, d_v), dtype=torch.bfloat16, device=device)
    elif out.data_ptr() % 16:
        _fail("out", "base address and row/head strides must be multiples of 16 bytes")
    if lse is None:
        lse = torch.empty((total_q, heads), dtype=torch.float32, device=device)
    if k_rope is None and d_rope:
        k_rope = k[:, :, d_nope:]
        k = k[:, :, :d_nope]
    q, k, v = kit.aligned_or_copy(q), kit.aligned_or_copy(k), kit.aligned_or_copy(v)
    # Without a rope part the kernels read no k_rope; k stands in for it (a valid tensor map).
    k_rope = k if not d_rope else kit.aligned_or_copy(k_rope)
    call = Call(q, k, k_rope, v, out, lse, cu_q, cu_k, total_q, total_k, heads, batch, scale, rope, args, dtype,
                traits)
    # TMA's rules are kit.aligned's: q, k, k_rope and v now meet them, and out was checked above (its
    # strides by check_arguments) or allocated here; so dispatch need not look again.
    call._tma_verdict = None
    return call


# --- what a call tells MLAGEN_RECORD_SHAPES (see mlagen.shapelog) ------------------------------

def describe_call(call: Call) -> str:
    """The shape description of a call: its batch, mean query and key length per sequence, heads,
    and its traits (geometry, mask, softcap, sink) where they are not the defaults."""
    b = max(call.batch, 1)
    parts = [f"b={call.batch}", f"q={round(call.total_q / b)}"]
    if call.total_k != call.total_q:
        parts.append(f"k={round(call.total_k / b)}")
    parts.append(f"h={call.heads}")
    t = call.traits
    if t.geometry != DEFAULT_GEOMETRY:
        parts.append("d=" + "/".join(map(str, t.dims)))
    parts.append({"window": f"window={t.window[0]}/{t.window[1]}", "chunked": f"chunk={t.chunk}"}.get(t.mask, t.mask))
    if t.softcap:
        parts.append(f"softcap={t.softcap:g}")
    if t.attn_sink is not None:
        parts.append("sink")
    return ",".join(parts)


def note_shape(call: Call) -> None:
    if shapelog.enabled():
        shapelog.note("mla_prefill", str(call.key), lambda: describe_call(call))
