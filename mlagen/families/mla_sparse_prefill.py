"""Sparse MLA prefill (``../shared/MLA.md`` section 2, DeepSeek-V3.2 DSA): validation, launch,
reference, FLOPs and benchmark inputs.

Compile side: :class:`MlaSparsePrefillFamily` checks specs of the family (the ``gather`` ABI: raw
pointers and strides, since gathered rows cannot be described to TMA), adds the register-pool and
schedule checks to the resource model, and supplies the render context.

Run side, as functions that map onto a family protocol: :func:`prepare` (arguments -> :class:`Call`,
no host synchronisation), :func:`problem_key` (the tuning shape class), :func:`launch`,
:func:`reference`, :func:`flops` and :func:`make_inputs`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .. import abi
from ..errors import LaunchError, SpecError
from . import Family, register

D_V = 512
D_QK_VALUES = (576, 512)
BLOCK_H = 64      # heads per CTA of the sm90 kernel (fewer are zero-padded)
MAX_ROWS = 2**31 - 1

PARAMS = abi.ParamStruct("Params", (
    abi.Field("q", "const bf16*"),
    abi.Field("kv", "const bf16*"),
    abi.Field("indices", "const int*"),
    abi.Field("topk_length", "const int*"),
    abi.Field("attn_sink", "float*"),
    abi.Field("out", "bf16*"),
    abi.Field("max_logits", "float*"),
    abi.Field("lse", "float*"),
    abi.Field("q_row_stride", "i64"),
    abi.Field("q_head_stride", "i64"),
    abi.Field("kv_row_stride", "i64"),
    abi.Field("kv_page_stride", "i64"),
    abi.Field("idx_row_stride", "i64"),
    abi.Field("o_row_stride", "i64"),
    abi.Field("o_head_stride", "i64"),
    abi.Field("ml_row_stride", "i64"),
    abi.Field("lse_row_stride", "i64"),
    abi.Field("sq", "int"),
    abi.Field("heads", "int"),
    abi.Field("topk", "int"),
    abi.Field("num_kv", "int"),
    abi.Field("page_size", "int"),
    abi.Field("scale_log2", "float"),
))

_ABIS = {"gather": PARAMS}
_SCHEDULE_KEYS = ("roles", "gather", "consumer_split")


class ArgumentError(LaunchError, ValueError):
    """A bad argument to the sparse prefill call (names the argument and what is allowed)."""


def _fail(arg: str, message: str, kind=ArgumentError):
    raise kind(f"mla_sparse_prefill: {arg}: {message}")


def _pow2_ceil(x: float) -> int:
    return 1 if x <= 1 else 1 << math.ceil(math.log2(x))


@dataclass(frozen=True)
class ProblemKey:
    """Shape class of a call for tuning records: d_qk, heads and topk rounded up to powers of two."""

    d_qk: int
    heads: int
    topk: int

    def __str__(self) -> str:
        return f"d{self.d_qk}/h{self.heads}/k{self.topk}"

    @classmethod
    def parse(cls, text: str) -> "ProblemKey":
        try:
            d, h, k = text.split("/")
            if d[0] != "d" or h[0] != "h" or k[0] != "k":
                raise ValueError
            key = cls(int(d[1:]), int(h[1:]), int(k[1:]))
            if key.d_qk not in D_QK_VALUES or min(key.heads, key.topk) < 1:
                raise ValueError
            return key
        except (ValueError, IndexError):
            raise ValueError(f"{text!r} is not a sparse problem key like 'd576/h128/k2048'") from None

    def distance(self, other: "ProblemKey") -> float:
        if self.d_qk != other.d_qk:
            return math.inf
        return abs(math.log2(self.heads) - math.log2(other.heads)) + abs(math.log2(self.topk) - math.log2(other.topk))


def problem_key(call: "Call") -> ProblemKey:
    return ProblemKey(call.d_qk, _pow2_ceil(call.heads), _pow2_ceil(max(call.topk, 1)))


@dataclass
class Call:
    """One validated invocation: tensors checked, outputs allocated, nothing launched yet."""

    q: Any            # [Sq, H, d_qk]
    kv: Any           # the caller's tensor (2-D or 3-D)
    indices: Any      # [Sq, topk] view
    topk_length: Any  # [Sq] int32 or None
    attn_sink: Any    # [H] fp32 or None
    out: Any
    max_logits: Any
    lse: Any
    sq: int
    heads: int
    topk: int
    d_qk: int
    num_kv: int
    kv_row_stride: int
    kv_page_stride: int
    page_size: int    # 0: rows are kv_row_stride apart; else row r is (r // ps, r % ps) of a paged pool
    scale: float

    @property
    def key(self) -> ProblemKey:
        return problem_key(self)

    @property
    def empty(self) -> bool:
        """Nothing to launch: no rows, or no row can see a key."""
        return self.sq == 0 or self.topk == 0 or self.num_kv == 0


def _check_tensor(torch, t, arg: str, dtype, ndims: tuple, device=None):
    if not isinstance(t, torch.Tensor):
        _fail(arg, f"expected a torch.Tensor, got {type(t).__name__}", TypeError)
    if t.dtype != dtype:
        _fail(arg, f"dtype must be {dtype}, got {t.dtype}", TypeError)
    if t.dim() not in ndims:
        _fail(arg, f"expected {' or '.join(map(str, ndims))} dimensions, got shape {tuple(t.shape)}")
    if device is not None and t.device != device:
        _fail(arg, f"must be on {device} (like q), got {t.device}")
    if t.numel() > 0 and t.stride(-1) != 1:
        _fail(arg, f"last dimension must be contiguous (stride 1), got stride {t.stride(-1)}")


def _aligned_or_copy(t):
    """cp.async reads 16-byte chunks: a view whose base or strides break that is copied."""
    ok = t.data_ptr() % 16 == 0 and all(
        (t.stride(d) * t.element_size()) % 16 == 0 for d in range(t.dim() - 1) if t.size(d) > 1)
    return t if ok else t.contiguous()


def prepare(q, kv, indices, *, softmax_scale, topk_length=None, attn_sink=None, d_v=D_V, out=None,
            max_logits=None, lse=None) -> Call:
    """Validate the arguments (errors name the argument) and allocate the outputs. Reads no
    device values, so it never synchronises the host and can run inside CUDA graph capture."""
    import torch

    if not isinstance(q, torch.Tensor):
        _fail("q", f"expected a torch.Tensor, got {type(q).__name__}", TypeError)
    if q.device.type != "cuda":
        _fail("q", f"must be a CUDA tensor, got device {q.device}")
    device = q.device
    _check_tensor(torch, q, "q", torch.bfloat16, (3,))
    sq, heads, d_qk = q.shape
    if d_qk not in D_QK_VALUES:
        _fail("q", f"last dimension (d_qk) must be 576 (512 latent + 64 rope) or 512, got {d_qk}")
    if heads < 1:
        _fail("q", "needs at least one head")
    if d_v != D_V:
        _fail("d_v", f"must be {D_V} (V is the first 512 columns of each KV row), got {d_v!r}")

    _check_tensor(torch, kv, "kv", torch.bfloat16, (2, 3), device)
    if kv.shape[-1] != d_qk:
        _fail("kv", f"last dimension must match q's d_qk {d_qk}, got {kv.shape[-1]}")
    if kv.dim() == 2:
        num_kv, page_size, row_stride, page_stride = kv.shape[0], 0, kv.stride(0), 0
    else:
        blocks, ps = kv.shape[0], kv.shape[1]
        num_kv = blocks * ps
        if ps == 1:
            page_size, row_stride, page_stride = 0, kv.stride(0), 0
        elif blocks <= 1 or kv.stride(0) == ps * kv.stride(1):
            page_size, row_stride, page_stride = 0, kv.stride(1), 0   # pages back to back: a flat table
        else:
            page_size, row_stride, page_stride = ps, kv.stride(1), kv.stride(0)

    _check_tensor(torch, indices, "indices", torch.int32, (2, 3), device)
    if indices.dim() == 3:
        if indices.shape[1] != 1:
            _fail("indices", f"expected [Sq, topk] or [Sq, 1, topk], got {tuple(indices.shape)}")
        indices = indices[:, 0, :]
    if indices.shape[0] != sq:
        _fail("indices", f"has {indices.shape[0]} rows, q has {sq} query tokens")
    topk = indices.shape[1]

    if topk_length is not None:
        _check_tensor(torch, topk_length, "topk_length", torch.int32, (1,), device)
        if topk_length.shape[0] != sq:
            _fail("topk_length", f"expected shape ({sq},), got {tuple(topk_length.shape)}")
    if attn_sink is not None:
        _check_tensor(torch, attn_sink, "attn_sink", torch.float32, (1,), device)
        if attn_sink.shape[0] != heads:
            _fail("attn_sink", f"expected shape ({heads},) (one per head), got {tuple(attn_sink.shape)}")

    if isinstance(softmax_scale, bool):
        _fail("softmax_scale", f"expected a float, got {softmax_scale!r}", TypeError)
    try:
        scale = float(softmax_scale)
    except (TypeError, ValueError):
        _fail("softmax_scale", f"expected a float, got {softmax_scale!r}", TypeError)
    if not (math.isfinite(scale) and scale > 0):
        _fail("softmax_scale", f"must be a finite positive number, got {softmax_scale!r}")
    if sq * max(1, -(-heads // BLOCK_H)) > MAX_ROWS:
        _fail("q", "more than 2**31 - 1 (token, head group) blocks is not supported")

    if out is None:
        out = torch.empty((sq, heads, D_V), dtype=torch.bfloat16, device=device)
    else:
        _check_tensor(torch, out, "out", torch.bfloat16, (3,), device)
        if tuple(out.shape) != (sq, heads, D_V):
            _fail("out", f"expected shape ({sq}, {heads}, {D_V}), got {tuple(out.shape)}")
        if out.data_ptr() % 4 or any(out.stride(d) % 2 for d in range(2) if out.size(d) > 1):
            _fail("out", "base address and row/head strides must be multiples of 4 bytes")
    for name, t in (("max_logits", max_logits), ("lse", lse)):
        if t is not None:
            _check_tensor(torch, t, name, torch.float32, (2,), device)
            if tuple(t.shape) != (sq, heads):
                _fail(name, f"expected shape ({sq}, {heads}), got {tuple(t.shape)}")
    if max_logits is None:
        max_logits = torch.empty((sq, heads), dtype=torch.float32, device=device)
    if lse is None:
        lse = torch.empty((sq, heads), dtype=torch.float32, device=device)

    q = _aligned_or_copy(q)
    if kv.numel() and not (kv.data_ptr() % 16 == 0 and all((s * 2) % 16 == 0 for s in (row_stride, page_stride))):
        kv = kv.contiguous()
        page_size, page_stride, row_stride = 0, 0, d_qk
    return Call(q, kv, indices, topk_length, attn_sink, out, max_logits, lse, sq, heads, topk, d_qk,
                min(num_kv, MAX_ROWS), row_stride, page_stride, page_size, scale)


def fill_empty(call: Call) -> None:
    """Outputs of a call in which no row sees a key: out 0, max_logits -inf, lse +inf."""
    call.out.zero_()
    call.max_logits.fill_(-math.inf)
    call.lse.fill_(math.inf)


def pack(call: Call):
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
    return PARAMS.pack(values)


def grid(selection, call: Call) -> tuple[int, int, int]:
    rows = selection.env["block_h"]
    return (call.sq * -(-call.heads // rows), 1, 1)


def launch(selection, call: Call, stream: int) -> None:
    """Launch the selected kernel on ``stream``; no host synchronisation."""
    res = selection.resources
    selection.kernel.launch(grid(selection, call), (res.threads, 1, 1), res.smem_bytes, stream, pack(call))


def specialization(call: Call) -> dict:
    """The compile-time values a call needs: d_qk, and whether kv is a pool of strided pages."""
    return {"d_qk": call.d_qk, "paged": call.page_size > 0}


def accepts(spec, call: Call) -> bool:
    axes = dict(spec.specialize)
    return spec.abi == "gather" and all(v in axes.get(k, ()) for k, v in specialization(call).items())


# --- the family (compile side) --------------------------------------------------------------


class MlaSparsePrefillFamily(Family):
    name = "mla_sparse_prefill"

    def validate_spec(self, spec) -> None:
        problem = dict(spec.problem)
        for key, value in {"d_v": D_V, "dtype": "bf16"}.items():
            if problem.get(key) != value:
                raise SpecError(spec.path, f"problem.{key}",
                                f"{problem.get(key)!r}: this family implements {key} = {value!r}")
        if spec.abi not in _ABIS:
            raise SpecError(spec.path, "abi", f"{spec.abi!r} is not one of {sorted(_ABIS)}")
        axes = dict(spec.specialize)
        if set(axes) != {"d_qk", "paged"} or not set(axes["d_qk"]) <= set(D_QK_VALUES) \
                or not set(axes["paged"]) <= {False, True}:
            raise SpecError(spec.path, "specialize", f"this family specialises on d_qk (values from "
                            f"{list(D_QK_VALUES)}) and paged (false, true)")
        if spec.schedule is not None:
            _validate_schedule(spec)
        from .. import expr, variant

        env = variant.make(spec, {}).env()
        for i, c in enumerate(spec.constraints):
            try:
                ok = c.require(env)
            except expr.ExprError as exc:
                raise SpecError(spec.path, f"constraints[{i}].require", str(exc)) from None
            if not ok:
                raise SpecError(spec.path, "tune", f"the default variant breaks constraint {i}: {c.message} "
                                f"(requires {c.require.text})")

    def check_variant(self, variant, target, resources) -> list[str]:
        if variant.spec.schedule is None:
            return []
        if not target.has("wgmma") or not target.has("setmaxnreg"):
            return [f"{target.name} has no wgmma/setmaxnreg; this schedule needs sm_90a"]
        s = evaluate_schedule(variant)
        reasons = []
        pool = resources.threads * min(255, 65536 // resources.threads // 8 * 8)
        total = sum(128 * wgs * regs for wgs, regs in s["roles"].values())
        if total > pool:
            reasons.append(f"register budget: roles need {total} registers, the CTA holds {pool} at launch "
                           f"({resources.threads} threads); setmaxnreg would wait forever")
        for name, (wgs, regs) in s["roles"].items():
            if not (24 <= regs <= 256 and regs % 8 == 0):
                reasons.append(f"{name} registers {regs}: setmaxnreg takes a multiple of 8 in [24, 256]")
        if s["roles"]["consumer"][0] != 2 or s["roles"]["producer"][0] != 1:
            reasons.append("this kernel has one gathering warpgroup and two consumer warpgroups")
        if s["gather"]["rows"] != 64 or s["gather"]["buffers"] != 2 or s["gather"]["halves"] != 2 \
                or s["gather"]["threads_per_row"] != 8:
            reasons.append("the gather is 64 rows into 2 buffers of 2 halves, 8 threads per 128-byte row")
        return reasons

    def render_context(self, variant) -> dict:
        from ..resources import estimate

        return {"params_decl": _ABIS[variant.spec.abi].c_declaration(), "smem_bytes": estimate(variant).smem_bytes}


def _validate_schedule(spec) -> None:
    from .. import expr

    sched = spec.schedule
    if not isinstance(sched, dict) or set(sched) != set(_SCHEDULE_KEYS):
        raise SpecError(spec.path, "schedule", f"expected the keys {list(_SCHEDULE_KEYS)}")
    known = ({k for k, _ in spec.problem} | {k for k, _ in spec.derived} | {k for k, _ in spec.specialize}
             | {t.name for t in spec.tunables})

    def check(value, where):
        try:
            e = expr.parse(value)
        except expr.ExprError as exc:
            raise SpecError(spec.path, where, str(exc)) from None
        if e.names - known:
            raise SpecError(spec.path, where, f"unknown name(s) {sorted(e.names - known)}")

    roles = sched["roles"]
    if not isinstance(roles, dict) or list(roles) != ["producer", "consumer"]:
        raise SpecError(spec.path, "schedule.roles", "expected the roles producer and consumer, in that order")
    for name, body in roles.items():
        if not isinstance(body, dict) or set(body) != {"warpgroups", "registers", "tasks"}:
            raise SpecError(spec.path, f"schedule.roles.{name}", "expected keys warpgroups, registers, tasks")
        check(body["warpgroups"], f"schedule.roles.{name}.warpgroups")
        check(body["registers"], f"schedule.roles.{name}.registers")
    gather = sched["gather"]
    keys = {"rows", "buffers", "halves", "threads_per_row", "l2_evict_last"}
    if not isinstance(gather, dict) or set(gather) != keys:
        raise SpecError(spec.path, "schedule.gather", f"expected keys {sorted(keys)}")
    for k, value in gather.items():
        check(value, f"schedule.gather.{k}")
    split = sched["consumer_split"]
    if split != {"scores": "alternate_blocks", "output_columns": "halves"}:
        raise SpecError(spec.path, "schedule.consumer_split",
                        "this kernel splits scores by alternate blocks and the output columns in halves")


def evaluate_schedule(variant) -> dict:
    from .. import expr

    env = variant.env()
    sched = variant.spec.schedule
    roles = {name: (int(expr.parse(b["warpgroups"])(env)), int(expr.parse(b["registers"])(env)))
             for name, b in sched["roles"].items()}
    gather = {k: expr.parse(v)(env) for k, v in sched["gather"].items()}
    return {"roles": roles, "gather": gather}


FAMILY = register(MlaSparsePrefillFamily())


# --- reference, FLOPs, inputs -----------------------------------------------------------------


def flops(sq: int, heads: int, topk: int, d_qk: int = 576, d_v: int = D_V) -> int:
    """BENCHMARKS.md convention: 2 * Sq * H * topk * (d_qk + d_v), invalid entries counted."""
    return 2 * sq * heads * topk * (d_qk + d_v)


def kv_rows(kv):
    """The KV table as [N, d] rows (a paged pool's row is block * page_size + offset)."""
    return kv.reshape(-1, kv.shape[-1])


def reference(q, kv, indices, *, softmax_scale, topk_length=None, attn_sink=None, d_v=D_V, dtype=None,
              chunk: int = 64):
    """MLA.md section 2 in ``dtype`` (float64 on CPU, float32 on GPU by default).

    Returns (out [Sq, H, d_v], max_logits [Sq, H], lse [Sq, H]) in that dtype, natural log. Invalid
    entries (index < 0 or >= N, or position >= topk_length) count for nothing; duplicates count
    each time; the sink enters the denominator only; a row with no valid entry gives out 0,
    max_logits -inf and lse +inf.
    """
    import torch

    if dtype is None:
        dtype = torch.float64 if q.device.type == "cpu" else torch.float32
    rows = kv_rows(kv)
    n = rows.shape[0]
    if indices.dim() == 3:
        indices = indices[:, 0, :]
    sq, heads, _ = q.shape
    topk = indices.shape[1]
    out = torch.zeros((sq, heads, d_v), dtype=dtype, device=q.device)
    max_logits = torch.full((sq, heads), -math.inf, dtype=dtype, device=q.device)
    lse = torch.full((sq, heads), math.inf, dtype=dtype, device=q.device)
    if sq == 0 or topk == 0 or n == 0:
        return out, max_logits, lse
    pos = torch.arange(topk, device=q.device)
    for t0 in range(0, sq, chunk):
        t1 = min(sq, t0 + chunk)
        idx = indices[t0:t1].long()
        valid = (idx >= 0) & (idx < n)
        if topk_length is not None:
            valid &= pos.unsqueeze(0) < topk_length[t0:t1].long().unsqueeze(1)
        g = rows[idx.clamp(0, n - 1)].to(dtype)                               # [c, topk, d_qk]
        s = torch.einsum("chd,ckd->chk", q[t0:t1].to(dtype), g) * softmax_scale
        s = s.masked_fill(~valid.unsqueeze(1), -math.inf)
        m = s.amax(dim=-1)                                                    # -inf where empty
        seen = torch.isfinite(m)
        m_safe = torch.where(seen, m, torch.zeros_like(m))
        p = torch.exp(s - m_safe.unsqueeze(-1))
        total = p.sum(-1)
        denom = total.clone()
        if attn_sink is not None:
            denom = denom + torch.exp(attn_sink.to(dtype).unsqueeze(0) - m_safe)
        o = torch.einsum("chk,ckd->chd", p, g[..., :d_v]) / denom.unsqueeze(-1)
        out[t0:t1] = torch.where(seen.unsqueeze(-1), o, torch.zeros_like(o))
        max_logits[t0:t1] = m
        lse[t0:t1] = torch.where(seen, m_safe + torch.log(total), torch.full_like(m, math.inf))
    return out, max_logits, lse


def random_indices(sq: int, topk: int, s_kv: int, device, generator=None, chunk: int = 256):
    """[Sq, topk] int32, each row a uniform random choice without repetition over [0, s_kv)."""
    import torch

    if topk > s_kv:
        raise ValueError(f"topk {topk} > s_kv {s_kv}: a choice without repetition is impossible")
    rows = []
    for t0 in range(0, sq, chunk):
        r = torch.rand((min(chunk, sq - t0), s_kv), device=device, generator=generator)
        rows.append(r.topk(topk, dim=-1).indices.to(torch.int32))
    return torch.cat(rows) if rows else torch.empty((0, topk), dtype=torch.int32, device=device)


def make_inputs(shape: dict, device, seed: int = 0) -> dict:
    """Benchmark / verification inputs for a shape {sq, heads, topk, s_kv[, d_qk][, sink]}: fresh
    randn data, indices a uniform choice without repetition (BENCHMARKS.md), the sink on unless
    ``sink`` is False. Returns keyword arguments of :func:`mlagen.mla_sparse_prefill`."""
    import torch

    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    sq, heads, topk, s_kv = shape["sq"], shape["heads"], shape["topk"], shape["s_kv"]
    d_qk = shape.get("d_qk", 576)
    q = torch.randn((sq, heads, d_qk), device=device, generator=gen).to(torch.bfloat16)
    kv = torch.randn((s_kv, 1, d_qk), device=device, generator=gen).to(torch.bfloat16)
    indices = random_indices(sq, topk, s_kv, device, gen).view(sq, 1, topk)
    sink = torch.randn((heads,), device=device, generator=gen) if shape.get("sink", True) else None
    return {"q": q, "kv": kv, "indices": indices, "softmax_scale": d_qk ** -0.5, "attn_sink": sink}
