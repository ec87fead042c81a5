"""Dense MLA prefill (``../shared/MLA.md`` section 1): validation, launch, reference, FLOPs.

Two launchers ("abi" in the spec) drive the kernels of this family:

* ``simt``: pointer-and-stride parameters; cp.async loads (sm80 kernel, any NVIDIA target).
* ``tma``: TMA descriptors for Q, K, K-rope, V and O (sm90 warp-specialized kernel).

Both take the same validated :class:`Call`, built from torch tensors without any host
synchronisation, so a launch can be captured in a CUDA graph.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .. import abi
from ..errors import LaunchError, SpecError
from . import Family, register

D_NOPE, D_ROPE, D_V = 128, 64, 128
D_QK = D_NOPE + D_ROPE
MASKS = ("causal", "none")

_COMMON_FIELDS = (
    abi.Field("out", "bf16*"),
    abi.Field("lse", "float*"),
    abi.Field("cu_seqlens_q", "const int*"),
    abi.Field("cu_seqlens_k", "const int*"),
    abi.Field("o_row_stride", "i64"),
    abi.Field("o_head_stride", "i64"),
    abi.Field("lse_row_stride", "i64"),
    abi.Field("total_q", "int"),
    abi.Field("total_k", "int"),
    abi.Field("num_heads", "int"),
    abi.Field("batch", "int"),
    abi.Field("scale_log2", "float"),
)

SIMT_PARAMS = abi.ParamStruct("Params", (
    abi.Field("q", "const bf16*"),
    abi.Field("k", "const bf16*"),
    abi.Field("k_rope", "const bf16*"),
    abi.Field("v", "const bf16*"),
    abi.Field("q_row_stride", "i64"),
    abi.Field("q_head_stride", "i64"),
    abi.Field("k_row_stride", "i64"),
    abi.Field("k_head_stride", "i64"),
    abi.Field("kr_row_stride", "i64"),
    abi.Field("kr_head_stride", "i64"),
    abi.Field("v_row_stride", "i64"),
    abi.Field("v_head_stride", "i64"),
) + _COMMON_FIELDS)

TMA_PARAMS = abi.ParamStruct("Params", (
    abi.Field("tma_q", "tensormap"),
    abi.Field("tma_k", "tensormap"),
    abi.Field("tma_k_rope", "tensormap"),
    abi.Field("tma_v", "tensormap"),
    abi.Field("tma_o", "tensormap"),
    abi.Field("tile_counter", "int*"),
    abi.Field("num_virtual_tiles", "int"),
    abi.Field("rope_shared", "int"),
) + _COMMON_FIELDS)

_ABIS = {"simt": SIMT_PARAMS, "tma": TMA_PARAMS}


def _pow2_ceil(x: float) -> int:
    return 1 if x <= 1 else 1 << math.ceil(math.log2(x))


@dataclass(frozen=True)
class ProblemKey:
    """The shape class a tuning record applies to (host-known values only, bucketed)."""

    mask: str
    heads: int       # power of two at or above the head count
    q_per_seq: int   # power of two at or above the mean query length
    k_per_seq: int

    def __str__(self) -> str:
        return f"{self.mask}/h{self.heads}/q{self.q_per_seq}/k{self.k_per_seq}"

    @classmethod
    def parse(cls, text: str) -> "ProblemKey":
        try:
            mask, h, q, k = text.split("/")
            if mask not in MASKS or h[0] != "h" or q[0] != "q" or k[0] != "k":
                raise ValueError
            key = cls(mask, int(h[1:]), int(q[1:]), int(k[1:]))
            if min(key.heads, key.q_per_seq, key.k_per_seq) < 1:  # distance() takes their log2
                raise ValueError
            return key
        except (ValueError, IndexError):
            raise ValueError(f"{text!r} is not a problem key like 'causal/h128/q8192/k8192'") from None

    def distance(self, other: "ProblemKey") -> float:
        """How far apart two shape classes are, in powers of two (inf across masks)."""
        if self.mask != other.mask:
            return math.inf
        return sum(abs(math.log2(a) - math.log2(b)) for a, b in (
            (self.heads, other.heads), (self.q_per_seq, other.q_per_seq), (self.k_per_seq, other.k_per_seq)))


def problem_key(heads: int, total_q: int, total_k: int, batch: int, causal: bool) -> ProblemKey:
    """The shape class of a call: mask, and head count, mean query and key length per sequence,
    each rounded up to a power of two."""
    batch = max(batch, 1)
    return ProblemKey("causal" if causal else "none", _pow2_ceil(heads), _pow2_ceil(total_q / batch),
                      _pow2_ceil(total_k / batch))


@dataclass
class Call:
    """One validated invocation: tensors checked, outputs allocated, nothing launched yet."""

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
    causal: bool
    scale: float
    rope: str  # "folded" (k holds 192 columns), "shared" ([Tk, 1, 64]) or "per_head" ([Tk, H, 64])

    @property
    def mask(self) -> str:
        return "causal" if self.causal else "none"

    @property
    def key(self) -> ProblemKey:
        return problem_key(self.heads, self.total_q, self.total_k, self.batch, self.causal)

    @property
    def empty(self) -> bool:
        return self.total_q == 0

    def tma_compatible(self) -> str | None:
        """None if every operand meets TMA's rules (16-byte aligned base and strides), else why not."""
        for name in ("q", "k", "k_rope", "v", "out"):
            t = getattr(self, name)
            if t.data_ptr() % 16:
                return f"{name} is not 16-byte aligned"
            for dim in range(t.dim() - 1):
                if t.size(dim) > 1 and (t.stride(dim) * 2) % 16:
                    return f"{name} stride {t.stride(dim)} (dim {dim}) is not a multiple of 16 bytes"
        return None


class LaunchFailure(LaunchError):
    pass


def _fail(arg: str, message: str):
    raise LaunchError(f"mla_prefill: {arg}: {message}")


def _check_tensor(torch, t, arg: str, dtype, ndim: int, device=None):
    if not isinstance(t, torch.Tensor):
        _fail(arg, f"expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        _fail(arg, f"dtype must be {dtype}, got {t.dtype}")
    if t.dim() != ndim:
        _fail(arg, f"expected {ndim} dimensions, got shape {tuple(t.shape)}")
    if device is not None and t.device != device:
        _fail(arg, f"must be on {device} (like q), got {t.device}")


def _aligned_or_copy(t):
    """cp.async and TMA read 16-byte chunks: a view whose base or strides break that is copied."""
    ok = t.data_ptr() % 16 == 0 and all(
        (t.stride(d) * t.element_size()) % 16 == 0 for d in range(t.dim() - 1) if t.size(d) > 1)
    return t if ok else t.contiguous()


def _check_cu(torch, cu, arg: str, batch_hint, total: int, device, check_values: bool):
    if not isinstance(cu, torch.Tensor):
        _fail(arg, f"expected a torch.Tensor of int32, got {type(cu).__name__}")
    if cu.dtype != torch.int32:
        _fail(arg, f"dtype must be torch.int32, got {cu.dtype}")
    if cu.dim() != 1 or cu.numel() < 2:
        _fail(arg, f"expected shape [batch + 1] with batch >= 1, got {tuple(cu.shape)}")
    if batch_hint is not None and cu.numel() != batch_hint:
        _fail(arg, f"has {cu.numel()} entries but the other cu_seqlens has {batch_hint}; both are [batch + 1]")
    if cu.device.type == "cpu" or check_values:
        values = cu.tolist()  # a CPU tensor costs nothing; a device tensor costs one small copy
        if values[0] != 0:
            _fail(arg, f"must start at 0, got {values[0]}")
        for i in range(len(values) - 1):
            if values[i + 1] < values[i]:
                _fail(arg, f"must be non-decreasing; entry {i + 1} ({values[i + 1]}) < entry {i} ({values[i]})")
        if values[-1] != total:
            _fail(arg, f"last entry must equal the packed length {total}, got {values[-1]}")
    if cu.device != device:
        cu = cu.to(device, non_blocking=True)
    return cu.contiguous()


def prepare(q, k, v, *, k_rope=None, cu_seqlens_q=None, cu_seqlens_k=None, causal=True, softmax_scale=None,
            out=None, lse=None, check_seqlens=None) -> Call:
    """Validate arguments (errors name the argument) and allocate ``out``/``lse``."""
    import torch

    _check_tensor(torch, q, "q", torch.bfloat16, 3)
    if q.device.type != "cuda":
        _fail("q", f"must be a CUDA tensor, got device {q.device}")
    device = q.device
    total_q, heads, dq = q.shape
    if dq != D_QK:
        _fail("q", f"last dimension must be {D_QK} (nope {D_NOPE} + rope {D_ROPE}), got {dq}")
    if heads < 1:
        _fail("q", "needs at least one head")
    _check_tensor(torch, k, "k", torch.bfloat16, 3, device)
    _check_tensor(torch, v, "v", torch.bfloat16, 3, device)
    total_k = k.shape[0]
    if k.shape[1] != heads:
        _fail("k", f"has {k.shape[1]} heads, q has {heads}")
    if tuple(v.shape) != (total_k, heads, D_V):
        _fail("v", f"expected shape ({total_k}, {heads}, {D_V}), got {tuple(v.shape)}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1:
            _fail(name, f"last dimension must be contiguous (stride 1), got stride {t.stride(-1)}")

    if k_rope is None:
        if k.shape[2] != D_QK:
            _fail("k", f"without k_rope, k must hold nope and rope ({D_QK} columns), got {k.shape[2]}")
        rope = "folded"
    else:
        if k.shape[2] != D_NOPE:
            _fail("k", f"with k_rope given, k holds the {D_NOPE} nope columns only, got {k.shape[2]}")
        _check_tensor(torch, k_rope, "k_rope", torch.bfloat16, 3, device)
        if k_rope.shape[0] != total_k or k_rope.shape[2] != D_ROPE or k_rope.shape[1] not in (1, heads):
            _fail("k_rope", f"expected shape ({total_k}, 1, {D_ROPE}) or ({total_k}, {heads}, {D_ROPE}), "
                            f"got {tuple(k_rope.shape)}")
        if k_rope.stride(-1) != 1:
            _fail("k_rope", f"last dimension must be contiguous (stride 1), got stride {k_rope.stride(-1)}")
        rope = "shared" if k_rope.shape[1] == 1 and heads > 1 else "per_head"

    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        _fail("cu_seqlens_q" if cu_seqlens_q is None else "cu_seqlens_k",
              "cu_seqlens_q and cu_seqlens_k must be given together (packed batch) or not at all")
    capturing = torch.cuda.is_current_stream_capturing()
    if check_seqlens is None:
        check_seqlens = not capturing
    elif check_seqlens and capturing:
        _fail("check_seqlens", "reading cu_seqlens values synchronises; not allowed while capturing a CUDA graph")
    if cu_seqlens_q is not None:
        cu_q = _check_cu(torch, cu_seqlens_q, "cu_seqlens_q", None, total_q, device, check_seqlens)
        cu_k = _check_cu(torch, cu_seqlens_k, "cu_seqlens_k", cu_q.numel(), total_k, device, check_seqlens)
        batch = cu_q.numel() - 1
    else:
        cu_q = cu_k = None
        batch = 1

    if softmax_scale is None:
        scale = 1.0 / math.sqrt(D_QK)
    else:
        try:
            scale = float(softmax_scale)
        except (TypeError, ValueError):
            _fail("softmax_scale", f"expected a float, got {softmax_scale!r}")
        if not (math.isfinite(scale) and scale > 0):
            _fail("softmax_scale", f"must be a finite positive number, got {softmax_scale!r}")
    if not isinstance(causal, bool):
        _fail("causal", f"expected a bool, got {causal!r}")
    if total_q >= 2**31 or total_k >= 2**31:
        _fail("q" if total_q >= 2**31 else "k", "more than 2**31 - 1 rows is not supported")

    if out is None:
        out = torch.empty((total_q, heads, D_V), dtype=torch.bfloat16, device=device)
    else:
        _check_tensor(torch, out, "out", torch.bfloat16, 3, device)
        if tuple(out.shape) != (total_q, heads, D_V):
            _fail("out", f"expected shape ({total_q}, {heads}, {D_V}), got {tuple(out.shape)}")
        if out.stride(-1) != 1:
            _fail("out", f"last dimension must be contiguous (stride 1), got stride {out.stride(-1)}")
        if out.data_ptr() % 16 or any((out.stride(d) * 2) % 16 for d in range(2) if out.size(d) > 1):
            _fail("out", "base address and row/head strides must be multiples of 16 bytes")
    if lse is None:
        lse = torch.empty((total_q, heads), dtype=torch.float32, device=device)
    else:
        _check_tensor(torch, lse, "lse", torch.float32, 2, device)
        if tuple(lse.shape) != (total_q, heads):
            _fail("lse", f"expected shape ({total_q}, {heads}), got {tuple(lse.shape)}")
        if lse.stride(1) != 1 and heads > 1:
            _fail("lse", f"heads must be contiguous (stride 1), got stride {lse.stride(1)}")

    if k_rope is None:
        k_rope = k[:, :, D_NOPE:]
        k = k[:, :, :D_NOPE]
    q, k, k_rope, v = (_aligned_or_copy(t) for t in (q, k, k_rope, v))
    return Call(q, k, k_rope, v, out, lse, cu_q, cu_k, total_q, total_k, heads, batch, causal, scale, rope)


def _common_values(call: Call) -> dict:
    return {
        "out": call.out.data_ptr(),
        "lse": call.lse.data_ptr(),
        "cu_seqlens_q": call.cu_q.data_ptr() if call.cu_q is not None else 0,
        "cu_seqlens_k": call.cu_k.data_ptr() if call.cu_k is not None else 0,
        "o_row_stride": call.out.stride(0),
        "o_head_stride": call.out.stride(1),
        "lse_row_stride": call.lse.stride(0),
        "total_q": call.total_q,
        "total_k": call.total_k,
        "num_heads": call.heads,
        "batch": call.batch,
        "scale_log2": call.scale * math.log2(math.e),
    }


def _head_stride(t) -> int:
    """Stride between heads; 0 for a tensor shared by all heads ([T, 1, D])."""
    return 0 if t.size(1) == 1 else t.stride(1)


def num_virtual_tiles(call: Call, block_m: int) -> int:
    """Query tiles per head the kernel is launched over (see tile_index.cuh)."""
    if call.cu_q is None:
        return -(-call.total_q // block_m)
    return call.total_q // block_m + call.batch


def pack_simt(call: Call, env: dict) -> abi.PackedParams:
    values = {
        "q": call.q.data_ptr(), "k": call.k.data_ptr(), "k_rope": call.k_rope.data_ptr(), "v": call.v.data_ptr(),
        "q_row_stride": call.q.stride(0), "q_head_stride": call.q.stride(1),
        "k_row_stride": call.k.stride(0), "k_head_stride": call.k.stride(1),
        "kr_row_stride": call.k_rope.stride(0), "kr_head_stride": _head_stride(call.k_rope),
        "v_row_stride": call.v.stride(0), "v_head_stride": call.v.stride(1),
        **_common_values(call),
    }
    return SIMT_PARAMS.pack(values)


class MlaPrefillFamily(Family):
    name = "mla_prefill"

    def validate_spec(self, spec) -> None:
        problem = dict(spec.problem)
        expected = {"d_nope": D_NOPE, "d_rope": D_ROPE, "d_v": D_V, "dtype": "bf16"}
        for key, value in expected.items():
            if problem.get(key) != value:
                raise SpecError(spec.path, f"problem.{key}",
                                f"{problem.get(key)!r}: this family implements {key} = {value!r}")
        if spec.abi not in _ABIS:
            raise SpecError(spec.path, "abi", f"{spec.abi!r} is not one of {sorted(_ABIS)}")
        axes = dict(spec.specialize)
        if set(axes) != {"mask"} or not set(axes["mask"]) <= set(MASKS):
            raise SpecError(spec.path, "specialize", f"this family specialises on mask only, values from {list(MASKS)}")
        if spec.abi == "tma":
            from .. import schedule

            schedule.validate_spec(spec)
        from .. import expr, variant

        default = variant.make(spec, {})
        env = default.env()
        for i, c in enumerate(spec.constraints):
            try:
                ok = c.require(env)
            except expr.ExprError as exc:
                raise SpecError(spec.path, f"constraints[{i}].require", str(exc)) from None
            if not ok:
                raise SpecError(spec.path, "tune", f"the default variant breaks constraint {i}: {c.message} "
                                f"(requires {c.require.text})")

    def check_variant(self, variant, target, resources) -> list[str]:
        if variant.spec.abi == "tma":
            from .. import schedule

            return schedule.check_variant(variant, target, resources)
        return []

    def render_context(self, variant) -> dict:
        from ..resources import estimate

        ctx = {"params_decl": _ABIS[variant.spec.abi].c_declaration(), "smem_bytes": estimate(variant).smem_bytes}
        if variant.spec.abi == "tma":
            from .. import schedule

            ctx["schedule"] = schedule.render_schedule(variant)
        return ctx


FAMILY = register(MlaPrefillFamily())


# --- reference and FLOPs -------------------------------------------------------------------


def sequence_lengths(cu_q, cu_k, total_q: int, total_k: int) -> list[tuple[int, int, int, int]]:
    """(q_start, len_q, k_start, len_k) per sequence, from host-side (CPU or list) offsets."""
    if cu_q is None:
        return [(0, total_q, 0, total_k)]
    cq = [int(x) for x in (cu_q.tolist() if hasattr(cu_q, "tolist") else cu_q)]
    ck = [int(x) for x in (cu_k.tolist() if hasattr(cu_k, "tolist") else cu_k)]
    return [(cq[b], cq[b + 1] - cq[b], ck[b], ck[b + 1] - ck[b]) for b in range(len(cq) - 1)]


def visible_pairs(len_q: int, len_k: int, causal: bool) -> int:
    """(query, key) pairs a sequence computes: row i sees min(len_k, max(0, i + len_k - len_q + 1))
    keys when causal, all len_k otherwise."""
    if not causal:
        return len_q * len_k
    offset = len_k - len_q
    first_seeing = min(len_q, max(0, -offset))                        # rows before see nothing
    first_full = max(first_seeing, min(len_q, len_k - offset - 1))    # rows from here see all keys
    ramp = (first_seeing + offset + 1 + first_full + offset) * (first_full - first_seeing) // 2
    return ramp + (len_q - first_full) * len_k


def flops(lengths, heads: int, causal: bool) -> int:
    """BENCHMARKS.md convention: 2 * H * (d_qk + d_v) * visible pairs, summed over sequences."""
    return sum(2 * heads * (D_QK + D_V) * visible_pairs(lq, lk, causal) for _, lq, _, lk in lengths)


def reference(q, k, v, *, k_rope=None, cu_seqlens_q=None, cu_seqlens_k=None, causal=True, softmax_scale=None,
              dtype=None, head_chunk: int = 16):
    """MLA.md section 1 computed in ``dtype`` (float32 on GPU, float64 on CPU by default).

    Returns (out, lse) in that dtype: out [Tq, H, 128], lse [Tq, H] (natural log; +inf for a row
    that sees no key, whose output is 0).
    """
    import torch

    if dtype is None:
        dtype = torch.float64 if q.device.type == "cpu" else torch.float32
    total_q, heads, _ = q.shape
    total_k = k.shape[0]
    if k_rope is not None:
        kr = k_rope.expand(total_k, heads, D_ROPE) if k_rope.shape[1] == 1 else k_rope
        k = torch.cat([k, kr], dim=-1)
    scale = 1.0 / math.sqrt(D_QK) if softmax_scale is None else float(softmax_scale)
    cu_q = None if cu_seqlens_q is None else cu_seqlens_q.cpu()
    cu_k = None if cu_seqlens_k is None else cu_seqlens_k.cpu()
    out = torch.zeros((total_q, heads, D_V), dtype=dtype, device=q.device)
    lse = torch.full((total_q, heads), math.inf, dtype=dtype, device=q.device)
    for qs, lq, ks, lk in sequence_lengths(cu_q, cu_k, total_q, total_k):
        if lq == 0 or lk == 0:
            continue
        i = torch.arange(lq, device=q.device).unsqueeze(1)
        j = torch.arange(lk, device=q.device).unsqueeze(0)
        visible = (j <= i + (lk - lq)) if causal else torch.ones(lq, lk, dtype=torch.bool, device=q.device)
        for h0 in range(0, heads, head_chunk):
            h1 = min(heads, h0 + head_chunk)
            qh = q[qs:qs + lq, h0:h1].to(dtype).transpose(0, 1)          # [h, lq, 192]
            kh = k[ks:ks + lk, h0:h1].to(dtype).transpose(0, 1)          # [h, lk, 192]
            vh = v[ks:ks + lk, h0:h1].to(dtype).transpose(0, 1)          # [h, lk, 128]
            s = torch.matmul(qh, kh.transpose(1, 2)) * scale
            s = s.masked_fill(~visible, -math.inf)
            row_lse = torch.logsumexp(s, dim=-1)                         # -inf where nothing visible
            seen = torch.isfinite(row_lse)
            p = torch.where(seen.unsqueeze(-1), torch.exp(s - row_lse.unsqueeze(-1)), torch.zeros_like(s))
            out[qs:qs + lq, h0:h1] = torch.matmul(p, vh).transpose(0, 1)
            lse[qs:qs + lq, h0:h1] = torch.where(seen, row_lse, torch.full_like(row_lse, math.inf)).transpose(0, 1)
    return out, lse


# --- launch ---------------------------------------------------------------------------------


def accepts(spec, call: Call) -> bool:
    """Whether ``spec``'s kernels can take this call's tensors."""
    return spec.abi != "tma" or call.tma_compatible() is None


def launch(selection, call: Call, stream: int) -> None:
    """Launch the selected kernel on ``stream``; no host synchronisation."""
    env = selection.env
    res = selection.resources
    if selection.spec.abi == "simt":
        params = pack_simt(call, env)
        grid = (num_virtual_tiles(call, env["block_m"]), call.heads, 1)
        selection.kernel.launch(grid, (res.threads, 1, 1), res.smem_bytes, stream, params)
        return
    from . import mla_prefill_tma

    mla_prefill_tma.launch(selection, call, env, stream)
