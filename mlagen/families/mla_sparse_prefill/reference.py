"""The reference of sparse MLA prefill (MLA.md section 2 in float64 / float32), benchmark inputs,
and the comparison with it."""

from __future__ import annotations

import math

from ... import operands
from ..kit import Check, out_error
from .problem import D_V, Shape

def kv_rows(kv):
    """The KV table as [N, d] rows (a paged pool's row is block * page_size + offset)."""
    return kv.reshape(-1, kv.shape[-1])


def concatenated(kv, indices, extra_kv, extra_indices, *, topk_length=None, extra_topk_length=None,
                 kv_format="bf16", extra_kv_format=None, d_qk: int = 576):
    """The one-pool form of a two-pool call (MLA.md 2b): (rows [N1 + N2, d_qk] of both pools,
    dequantized to fp32 where quantized; indices [Sq, topk1 + topk2] into them, every invalid
    entry -1). What a server without a two-pool kernel builds, and the reference's input."""
    import torch

    def rows_of(t, fmt_name):
        fmt = operands.get(fmt_name, d_qk)
        return operands.dequantize(t, fmt) if fmt.quantized else kv_rows(t).float()

    def valid_ids(idx, n, length, shift):
        if idx.dim() == 3:
            idx = idx[:, 0, :]
        idx = idx.long()
        ok = (idx >= 0) & (idx < n)
        if length is not None:
            ok &= torch.arange(idx.shape[1], device=idx.device).unsqueeze(0) < length.long().unsqueeze(1)
        return torch.where(ok, idx + shift, torch.full_like(idx, -1))

    a = rows_of(kv, kv_format)
    b = rows_of(extra_kv, extra_kv_format or kv_format)
    ids = torch.cat([valid_ids(indices, a.shape[0], topk_length, 0),
                     valid_ids(extra_indices, b.shape[0], extra_topk_length, a.shape[0])], dim=1)
    return torch.cat([a, b]), ids.to(torch.int32)


def reference(q, kv, indices, *, softmax_scale, topk_length=None, attn_sink=None, d_v=D_V, dtype=None,
              chunk: int = 64, kv_format="bf16", extra_kv=None, extra_indices=None, extra_topk_length=None,
              extra_kv_format=None):
    """MLA.md section 2 in ``dtype`` (float64 on CPU, float32 on GPU by default).

    With a second pool (``extra_kv`` / ``extra_indices`` / ``extra_topk_length``, MLA.md 2b), the
    one-pool reference on the pools concatenated (:func:`concatenated`).

    A quantized cache (``kv_format`` other than bf16) is dequantized first (fp32 product of the
    e4m3 value and its block's scale, :func:`mlagen.operands.dequantize`, not rounded to bf16);
    the rest is the same computation.

    Returns (out [Sq, H, d_v], max_logits [Sq, H], lse [Sq, H]) in that dtype, natural log. Invalid
    entries (index < 0 or >= N, or position >= topk_length) count for nothing; duplicates count
    each time; the sink enters the denominator only; a row with no valid entry gives out 0,
    max_logits -inf and lse +inf.
    """
    import torch

    if dtype is None:
        dtype = torch.float64 if q.device.type == "cpu" else torch.float32
    if extra_kv is not None or extra_indices is not None:
        kv, indices = concatenated(kv, indices, extra_kv, extra_indices, topk_length=topk_length,
                                   extra_topk_length=extra_topk_length, kv_format=kv_format,
                                   extra_kv_format=extra_kv_format, d_qk=q.shape[-1])
        topk_length, kv_format = None, "bf16"
    fmt = operands.get(kv_format, q.shape[-1])
    rows = operands.dequantize(kv, fmt) if fmt.quantized else kv_rows(kv)
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
    """Benchmark / verification inputs for a shape {sq, heads, topk, s_kv[, d_qk][, sink][, kv_format]}:
    fresh randn data, indices a uniform choice without repetition (BENCHMARKS.md), the sink on unless
    ``sink`` is False. Returns keyword arguments of :func:`mlagen.mla_sparse_prefill` (``kv_format``
    only for a quantized cache)."""
    import torch

    if isinstance(shape, Shape):
        shape = {"sq": shape.sq, "heads": shape.heads, "topk": shape.topk, "s_kv": shape.s_kv, "d_qk": shape.d_qk,
                 "sink": shape.sink, "kv_format": shape.kv_format}
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    sq, heads, topk, s_kv = shape["sq"], shape["heads"], shape["topk"], shape["s_kv"]
    d_qk = shape.get("d_qk", 576)
    q = torch.randn((sq, heads, d_qk), device=device, generator=gen).to(torch.bfloat16)
    kv = torch.randn((s_kv, 1, d_qk), device=device, generator=gen).to(torch.bfloat16)
    indices = random_indices(sq, topk, s_kv, device, gen).view(sq, 1, topk)
    sink = torch.randn((heads,), device=device, generator=gen) if shape.get("sink", True) else None
    inputs = {"q": q, "kv": kv, "indices": indices, "softmax_scale": d_qk ** -0.5, "attn_sink": sink}
    fmt = operands.get(shape.get("kv_format", "bf16"), d_qk)
    if fmt.quantized:
        # The same rows quantized into a pool of 64-token pages (the V3.2 and V4 serving layouts).
        inputs["kv"] = operands.quantize_pages(kv[:, 0].float(), fmt, 64)
        inputs["kv_format"] = fmt.name
    return inputs


REL_TOL = 1e-2    # bf16 P and output; fp32 accumulation
STAT_TOL = 2e-3   # lse and max_logits, relative to 1 + |value|

def compare(got, ref, rel_tol: float = REL_TOL, stat_tol: float = STAT_TOL) -> Check:
    """(out, max_logits, lse) against the reference's: coverage (no NaN) everywhere, accuracy on
    the reference's heads; rows with no valid entry must be exactly 0 / -inf / +inf."""
    import torch

    out, ml, lse = got
    r_out, r_ml, r_lse = ref
    heads = r_out.shape[1]
    problems = []
    bad = int(torch.isnan(out).sum()) + int(torch.isnan(ml).sum()) + int(torch.isnan(lse).sum())
    if bad:
        problems.append(f"{bad} output values are NaN (unwritten or computed)")
    max_abs, rel = out_error(out[:, :heads], r_out)
    if not rel <= rel_tol:
        problems.append(f"relative L2 error {rel:.2e} > {rel_tol:.0e}")
    lse_err = 0.0
    for name, a, b in (("lse", lse[:, :heads], r_lse), ("max_logits", ml[:, :heads], r_ml)):
        a = a.double()
        b = b.double()
        inf_b = torch.isinf(b)
        if not torch.equal(a[inf_b], b[inf_b]):
            problems.append(f"{name} of rows with no valid entry must be {'+inf' if name == 'lse' else '-inf'}")
        fin = ~inf_b
        if bool(fin.any()):
            err = float(((a[fin] - b[fin]).abs() / (1 + b[fin].abs())).max())
            if name == "lse":
                lse_err = err
            if not err <= stat_tol:
                problems.append(f"{name} error {err:.2e} > {stat_tol:.0e}")
    return Check(max_abs, rel, lse_err, "; ".join(problems) or None)

