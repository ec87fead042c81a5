"""The reference of dense MLA prefill (MLA.md section 1 in high precision), random inputs of a
shape, and the comparison tune and bench use to accept a kernel's result."""

from __future__ import annotations

import math
from typing import Any

from ..kit import Check
from .problem import normalize_mask, sequence_lengths, shape_sequences

REL_TOL = 2e-2      # relative L2 error of out allowed against the float32 reference
LSE_TOL = 2e-2      # absolute error of lse (natural log) allowed
# FP8 inputs: the reference runs on the dequantized inputs, so what remains is the kernel's own
# rounding, chiefly P = exp(S - max) quantized to e4m3 (3 mantissa bits) for the P V product.
# tests/test_hip_mfma_layout.py emulates that rounding: see FP8_REL_TOL's use there and docs/amd.md.
FP8_REL_TOL = 5e-2
FP8_MAX = {"fp8_e4m3": 448.0, "fp8_e4m3fnuz": 240.0}  # largest finite value of each e4m3


def dequantize(x, descale, dtype):
    """``x`` (any dtype) in ``dtype``, times its descale factor ([1] or [H], None: 1.0) per head."""
    x = x.to(dtype)
    if descale is None:
        return x
    return x * descale.to(device=x.device, dtype=dtype).reshape(1, -1, 1)


def band(positions, len_k: int, mask: str, window=(-1, -1), chunk: int = 0):
    """Visible keys [lo, hi) of each query position (MLA.md section 1b; mlagen/common/mask.cuh),
    as a bool [len(positions), len_k] tensor."""
    import torch

    p = positions.unsqueeze(1)
    j = torch.arange(len_k, device=positions.device).unsqueeze(0)
    if mask == "none":
        return torch.ones(p.shape[0], len_k, dtype=torch.bool, device=p.device)
    if mask == "causal":
        return j <= p
    if mask == "chunked":
        return (j <= p) & (torch.div(j, chunk, rounding_mode="floor") == torch.div(p, chunk, rounding_mode="floor"))
    left, right = window
    visible = torch.ones(p.shape[0], len_k, dtype=torch.bool, device=p.device)
    if left >= 0:
        visible &= j >= p - left
    if right >= 0:
        visible &= j <= p + right
    return visible


def _attend(qh, kh, vh, positions, mask, window, chunk, scale, softcap, sink):
    """One sequence's heads: qh [h, lq, d_qk] at ``positions``, kh / vh [h, lk, ...]; (out, lse) with
    out [h, lq, d_v] and lse [h, lq] (+inf where nothing is visible)."""
    import torch

    s = torch.matmul(qh, kh.transpose(1, 2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~band(positions, kh.shape[1], mask, window, chunk), -math.inf)
    row_lse = torch.logsumexp(s, dim=-1)                         # -inf where nothing visible
    seen = torch.isfinite(row_lse)
    p = torch.where(seen.unsqueeze(-1), torch.exp(s - row_lse.unsqueeze(-1)), torch.zeros_like(s))
    if sink is not None:   # the denominator gains exp(sink): p / (1 + exp(sink - lse))
        p = p / (1 + torch.exp(sink.reshape(-1, 1) - row_lse.clamp_min(-1e30))).unsqueeze(-1)
    return torch.matmul(p, vh), torch.where(seen, row_lse, torch.full_like(row_lse, math.inf))


def reference(q, k, v, *, k_rope=None, cu_seqlens_q=None, cu_seqlens_k=None, causal=True, softmax_scale=None,
              dtype=None, head_chunk: int = 16, q_descale=None, k_descale=None, v_descale=None,
              window_size=(-1, -1), chunk_size=None, softcap=0.0, attn_sink=None, q_positions=None):
    """MLA.md sections 1 and 1b computed in ``dtype`` (float32 on GPU, float64 on CPU by default).

    Any head geometry (q [Tq, H, d_qk], k [Tk, H, d_qk] or [Tk, H, d_nope] with k_rope [Tk, 1 or H,
    d_rope], v [Tk, H, d_v]); the masks causal / none / ``window_size`` / ``chunk_size`` (bottom-right
    aligned, FlashAttention's conventions), ``softcap`` (s <- c tanh(s / c) before the mask) and a
    per-head ``attn_sink`` [H] (only the denominator changes; lse ignores it). FP8 inputs are
    dequantized first (stored value x descale, per tensor or per head; k_descale applies to k and
    k_rope), so the reference is exact math on the values the kernel is given. ``q_positions``
    (one sequence only): the position of each query row, for a slice of a sequence's rows.
    Returns (out, lse) in that dtype: out [Tq, H, d_v], lse [Tq, H] (natural log; +inf for a row
    that sees no key, whose output is 0).
    """
    import torch

    if dtype is None:
        dtype = torch.float64 if q.device.type == "cpu" else torch.float32
    total_q, heads, d_qk = q.shape
    total_k, d_v = k.shape[0], v.shape[2]
    if q_descale is not None or k_descale is not None or v_descale is not None:
        q, k, v = dequantize(q, q_descale, dtype), dequantize(k, k_descale, dtype), dequantize(v, v_descale, dtype)
        if k_rope is not None:
            k_rope = dequantize(k_rope.expand(total_k, heads, k_rope.shape[2]), k_descale, dtype)
    if k_rope is not None:
        kr = k_rope.expand(total_k, heads, k_rope.shape[2]) if k_rope.shape[1] == 1 else k_rope
        k = torch.cat([k.to(dtype), kr.to(dtype)], dim=-1)
    scale = 1.0 / math.sqrt(d_qk) if softmax_scale is None else float(softmax_scale)
    mask, window, chunk = normalize_mask(causal, tuple(window_size), chunk_size or 0)
    sink = None if attn_sink is None else attn_sink.to(device=q.device, dtype=dtype)
    cu_q = None if cu_seqlens_q is None else cu_seqlens_q.cpu()
    cu_k = None if cu_seqlens_k is None else cu_seqlens_k.cpu()
    out = torch.zeros((total_q, heads, d_v), dtype=dtype, device=q.device)
    lse = torch.full((total_q, heads), math.inf, dtype=dtype, device=q.device)
    for qs, lq, ks, lk in sequence_lengths(cu_q, cu_k, total_q, total_k):
        if lq == 0 or lk == 0:
            continue
        positions = (torch.arange(lq, device=q.device) + (lk - lq)) if q_positions is None else q_positions.to(q.device)
        for h0 in range(0, heads, head_chunk):
            h1 = min(heads, h0 + head_chunk)
            qh = q[qs:qs + lq, h0:h1].to(dtype).transpose(0, 1)          # [h, lq, d_qk]
            kh = k[ks:ks + lk, h0:h1].to(dtype).transpose(0, 1)          # [h, lk, d_qk]
            vh = v[ks:ks + lk, h0:h1].to(dtype).transpose(0, 1)          # [h, lk, d_v]
            o, l = _attend(qh, kh, vh, positions, mask, window, chunk, scale, softcap,
                           None if sink is None else sink[h0:h1])
            out[qs:qs + lq, h0:h1] = o.transpose(0, 1)
            lse[qs:qs + lq, h0:h1] = l.transpose(0, 1)
    return out, lse


def quantize(x, dtype: str, per_head: bool):
    """(fp8 tensor, fp32 descale) of float ``x`` [T, H, D]: the descale maps the largest magnitude
    (per head, or over the tensor) to the format's largest finite value."""
    import torch

    amax = x.abs().amax(dim=(0, 2)) if per_head else x.abs().amax().reshape(1)
    descale = (amax.float().clamp_min(1e-12) / FP8_MAX[dtype]).to(torch.float32)
    fp8 = torch.float8_e4m3fn if dtype == "fp8_e4m3" else torch.float8_e4m3fnuz
    limit = FP8_MAX[dtype]
    # torch's cast does not saturate (out-of-range values become NaN), so clamp first.
    stored = (x.float() / descale.reshape(1, -1, 1)).clamp(-limit, limit).to(fp8)
    return stored, descale


def make_inputs(shape, device, seed: int = 0, dtype: str = "bf16") -> dict[str, Any]:
    """Fresh standard-normal operands for ``shape`` (never zeros, never constants).

    Returns a dict with q [Tq, H, d_qk], k [Tk, H, d_nope], k_rope [Tk, 1, d_rope] (shared by all
    heads; None when the shape's geometry has no rope part), v [Tk, H, d_v], cu_seqlens_q /
    cu_seqlens_k (int32 [B + 1] on ``device``, or None for a batch of one) and causal; a shape's
    other traits add window_size, chunk_size, softcap and attn_sink (fp32 [H], 2 N(0, 1) + 2). ``dtype`` "fp8_e4m3" or "fp8_e4m3fnuz" quantizes the operands
    (q and v with one descale per head, k and k_rope with one for the tensor, as a shared rope
    needs) and adds q_descale, k_descale and v_descale.
    """
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    fp8 = dtype in FP8_MAX
    if not fp8 and dtype != "bf16":
        raise ValueError(f"dtype {dtype!r}: expected bf16, {', '.join(FP8_MAX)}")

    def randn(*size):
        return torch.randn(size, generator=gen, device=device, dtype=torch.float32 if fp8 else torch.bfloat16)

    tq, tk, h = sum(shape.q_lens), sum(shape.k_lens), shape.heads
    d_nope, d_rope, d_v = getattr(shape, "dims", (128, 64, 128))
    inputs = {"q": randn(tq, h, d_nope + d_rope), "k": randn(tk, h, d_nope),
              "k_rope": randn(tk, 1, d_rope) if d_rope else None,
              "v": randn(tk, h, d_v), "cu_seqlens_q": None, "cu_seqlens_k": None, "causal": shape.causal}
    if getattr(shape, "window", (-1, -1)) != (-1, -1):
        inputs["window_size"] = tuple(shape.window)
    if getattr(shape, "chunk", 0):
        inputs["chunk_size"] = shape.chunk
    if getattr(shape, "softcap", 0):
        inputs["softcap"] = float(shape.softcap)
    if getattr(shape, "sink", False):
        inputs["attn_sink"] = 2 * torch.randn(h, generator=gen, device=device, dtype=torch.float32) + 2
    if fp8:
        inputs["q"], inputs["q_descale"] = quantize(inputs["q"], dtype, per_head=True)
        inputs["v"], inputs["v_descale"] = quantize(inputs["v"], dtype, per_head=True)
        k_amax = inputs["k"].abs().amax()
        if inputs["k_rope"] is not None:
            k_amax = torch.maximum(k_amax, inputs["k_rope"].abs().amax())
        k_descale = (k_amax / FP8_MAX[dtype]).reshape(1).to(torch.float32)
        for name in ("k", "k_rope") if inputs["k_rope"] is not None else ("k",):
            scaled = (inputs[name] / k_descale).clamp(-FP8_MAX[dtype], FP8_MAX[dtype])
            inputs[name] = scaled.to(torch.float8_e4m3fn if dtype == "fp8_e4m3" else torch.float8_e4m3fnuz)
        inputs["k_descale"] = k_descale
    if len(shape.q_lens) > 1:
        seqs = shape_sequences(shape)
        cu_q = [s[0] for s in seqs] + [tq]
        cu_k = [s[2] for s in seqs] + [tk]
        inputs["cu_seqlens_q"] = torch.tensor(cu_q, dtype=torch.int32, device=device)
        inputs["cu_seqlens_k"] = torch.tensor(cu_k, dtype=torch.int32, device=device)
    return inputs


def make_stress_inputs(shape, device, seed: int = 0, dtype: str = "bf16") -> dict[str, Any] | None:
    """FP8 ``dtype``: :func:`make_inputs` with V = 1 + 0.1 N(0, 1) (quantized per head), a channel mean
    as real V has. A kernel that sums a row's P V in the FP8 wgmma accumulator, whose adds keep about
    14 bits, loses the small terms of such one-signed sums (out 0.85x the reference at 8192 keys,
    nineteenth session); zero-mean V hides it. None for bf16 (its wgmma accumulates in fp32)."""
    import torch

    if dtype not in FP8_MAX:
        return None
    inputs = make_inputs(shape, device, seed, dtype)
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    v = 1.0 + 0.1 * torch.randn(inputs["v"].shape, generator=gen, device=device)
    inputs["v"], inputs["v_descale"] = quantize(v, dtype, per_head=True)
    return inputs


def reference_heads(shape, inputs: dict, heads: int | None = 2, budget_bytes: int = 2 << 30):
    """MLA.md sections 1 and 1b in float32 for heads [0, heads) (all if None): (out, lse), with
    the shape's geometry, mask and score traits (the inputs' window_size, chunk_size, softcap,
    attn_sink).

    Runs :func:`reference` on chunks of query rows, so its score matrices stay within about
    ``budget_bytes``; each chunk gets its rows' positions in the sequence (q_positions) and the keys
    its band can reach.
    """
    import torch

    heads = shape.heads if heads is None else min(heads, shape.heads)
    q, k, v, k_rope = inputs["q"][:, :heads], inputs["k"][:, :heads], inputs["v"][:, :heads], inputs["k_rope"]
    descales = {}
    for name in ("q_descale", "k_descale", "v_descale"):
        d = inputs.get(name)
        descales[name] = None if d is None else (d if d.numel() == 1 else d[:heads])
    sink = inputs.get("attn_sink")
    traits = {"window_size": inputs.get("window_size", (-1, -1)), "chunk_size": inputs.get("chunk_size"),
              "softcap": inputs.get("softcap", 0.0), "attn_sink": None if sink is None else sink[:heads]}
    mask = getattr(shape, "mask", "causal" if shape.causal else "none")
    total_q = sum(shape.q_lens)
    out = torch.zeros((total_q, heads, v.shape[2]), dtype=torch.float32, device=q.device)
    lse = torch.full((total_q, heads), math.inf, dtype=torch.float32, device=q.device)
    for qs, lq, ks, lk in shape_sequences(shape):
        rows = max(1, budget_bytes // (6 * 4 * heads * max(lk, 1)))  # ~6 live fp32 score matrices
        for r0 in range(0, lq, rows):
            r1 = min(lq, r0 + rows)
            # Keys past the last row's band are never visible (causal, chunked, a window's right side).
            right = -1 if mask == "none" else (traits["window_size"][1] if mask == "window" else 0)
            keys = lk if right < 0 else max(0, min(lk, r1 + lk - lq + right))
            kr = slice(ks, ks + keys)
            positions = torch.arange(r0, r1, device=q.device) + (lk - lq)
            o, l = reference(q[qs + r0:qs + r1], k[kr], v[kr], k_rope=None if k_rope is None else k_rope[kr],
                             causal=shape.causal, dtype=torch.float32, q_positions=positions, **traits, **descales)
            out[qs + r0:qs + r1] = o
            lse[qs + r0:qs + r1] = l
    return out, lse


#: The stress check's bound on bias: out / reference by least squares within this of 1. The FP8
#: accumulator's loss is a bias that the bound on the relative L2 error lets through on shorter rows
#: (single-level: 15% at 8192 keys, 1-2% at several hundred); two-level accumulation as the spec allows
#: it measures at most 0.43% (twentieth session), so 0.75% leaves it room for other shapes' spread.
STRESS_BIAS = 7.5e-3


def compare_bias(out, ref_out, check: Check, bound: float = STRESS_BIAS) -> Check:
    """``check`` (of :func:`compare`) with a problem added when out, on the reference's heads, is the
    reference times a factor further than ``bound`` from 1 (least squares)."""
    heads = ref_out.shape[1]
    o, r = out[:, :heads].double(), ref_out.double()
    ratio = float((o * r).sum() / (r * r).sum().clamp_min(1e-300))
    if abs(ratio - 1.0) <= bound:
        return check
    problem = f"out / reference {ratio:.4f} by least squares: a bias (at most {bound:.2%} allowed)"
    return Check(check.max_abs, check.rel_l2, check.lse_max_abs, "; ".join(filter(None, (check.problem, problem))))


def compare(out, lse, ref_out, ref_lse, rel_tol: float = REL_TOL) -> Check:
    """Check ``out`` (and ``lse`` if given) everywhere for coverage, and on the reference's heads
    for accuracy: relative L2 error of out at most ``rel_tol`` (REL_TOL; FP8_REL_TOL for fp8
    inputs), lse within LSE_TOL."""
    import torch

    heads = ref_out.shape[1]
    problems = []
    bad = int((~torch.isfinite(out)).sum())
    if bad:
        problems.append(f"{bad} of {out.numel()} output elements are NaN or inf")
    diff = out[:, :heads].float() - ref_out
    max_abs = float(diff.abs().max()) if diff.numel() else 0.0
    rel = float(diff.double().norm() / ref_out.double().norm().clamp_min(1e-30))
    if not rel <= rel_tol:
        problems.append(f"relative L2 error {rel:.2e} > {rel_tol:.0e}")
    lse_err = None
    if lse is not None:
        nan = int(torch.isnan(lse).sum())
        if nan:
            problems.append(f"{nan} of {lse.numel()} lse values are NaN")
        got, seen = lse[:, :heads], torch.isfinite(ref_lse)
        lse_err = float((got[seen] - ref_lse[seen]).abs().max()) if bool(seen.any()) else 0.0
        if not bool((got[~seen] == math.inf).all()):
            problems.append("rows that see no key must have lse = +inf")
        if not lse_err <= LSE_TOL:
            problems.append(f"lse error {lse_err:.2e} > {LSE_TOL:.0e}")
    return Check(max_abs, rel, lse_err, "; ".join(problems) or None)
