"""Correctness of a dense MLA prefill run: inputs, the float32 reference, and the comparison.

``tune`` checks every variant with these before timing it, ``bench`` every peer. Inputs are fresh
``randn`` data (never zeros, never constants), outputs are compared with the float32 reference
of MLA.md section 1 on a few heads (every head is checked for coverage: NaN-poisoned outputs
must be overwritten). Everything here is specific to the dense family (its operands, its
reference); it is the family's verification.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .families import mla_prefill as family
from .families.mla_prefill import D_NOPE, D_QK, D_ROPE, D_V
from .shapes import Shape

REL_TOL = 2e-2      # relative L2 error of out allowed against the float32 reference
LSE_TOL = 2e-2      # absolute error of lse (natural log) allowed
CHECK_HEADS = 2     # heads compared against the reference (every head is checked for coverage)


# --- inputs ---------------------------------------------------------------------------------


def make_inputs(shape: Shape, device, seed: int = 0) -> dict[str, Any]:
    """Fresh standard-normal bf16 operands for ``shape`` (never zeros, never constants).

    Returns a dict with q [Tq, H, 192], k [Tk, H, 128] (nope), k_rope [Tk, 1, 64] (shared by all
    heads), v [Tk, H, 128], and cu_seqlens_q / cu_seqlens_k (int32 [B + 1] on ``device``, or None
    for a batch of one).
    """
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*size):
        return torch.randn(size, generator=gen, device=device, dtype=torch.bfloat16)

    tq, tk, h = shape.total_q, shape.total_k, shape.heads
    inputs = {"q": randn(tq, h, D_QK), "k": randn(tk, h, D_QK - D_ROPE), "k_rope": randn(tk, 1, D_ROPE),
              "v": randn(tk, h, D_V), "cu_seqlens_q": None, "cu_seqlens_k": None}
    if shape.packed:
        cu_q, cu_k = shape.cu_seqlens()
        inputs["cu_seqlens_q"] = torch.tensor(cu_q, dtype=torch.int32, device=device)
        inputs["cu_seqlens_k"] = torch.tensor(cu_k, dtype=torch.int32, device=device)
    return inputs


# --- reference and comparison ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """How one peer's output compares with the reference; ``problem`` is None when it passes."""

    max_abs: float
    rel_l2: float
    lse_max_abs: float | None
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None


def reference_heads(shape: Shape, inputs: dict, heads: int = CHECK_HEADS, budget_bytes: int = 2 << 30):
    """MLA.md section 1 in float32 for heads [0, heads): (out [Tq, heads, 128], lse [Tq, heads]).

    Runs :func:`mlagen.families.mla_prefill.reference` on chunks of query rows, so its score
    matrices stay within about ``budget_bytes``. A causal chunk of rows [r0, r1) gets the keys
    [0, r1 + Lk - Lq) of its sequence: the reference's own bottom-right offset then lands each
    row on the keys it sees in the whole sequence.
    """
    import torch

    q, k, v, k_rope = inputs["q"][:, :heads], inputs["k"][:, :heads], inputs["v"][:, :heads], inputs["k_rope"]
    out = torch.zeros((shape.total_q, heads, D_V), dtype=torch.float32, device=q.device)
    lse = torch.full((shape.total_q, heads), math.inf, dtype=torch.float32, device=q.device)
    for qs, lq, ks, lk in shape.sequence_lengths():
        rows = max(1, budget_bytes // (6 * 4 * heads * max(lk, 1)))  # ~6 live fp32 score matrices
        for r0 in range(0, lq, rows):
            r1 = min(lq, r0 + rows)
            keys = max(0, min(lk, r1 + lk - lq)) if shape.causal else lk
            kr = slice(ks, ks + keys)
            o, l = family.reference(q[qs + r0:qs + r1], k[kr], v[kr], k_rope=k_rope[kr], causal=shape.causal,
                                    dtype=torch.float32)
            out[qs + r0:qs + r1] = o
            lse[qs + r0:qs + r1] = l
    return out, lse


def compare(out, lse, ref_out, ref_lse) -> Check:
    """Check ``out`` (and ``lse`` if given) everywhere for coverage, and on the reference's heads
    for accuracy: relative L2 error of out at most REL_TOL, lse within LSE_TOL."""
    import torch

    heads = ref_out.shape[1]
    problems = []
    bad = int((~torch.isfinite(out)).sum())
    if bad:
        problems.append(f"{bad} of {out.numel()} output elements are NaN or inf")
    diff = out[:, :heads].float() - ref_out
    max_abs = float(diff.abs().max()) if diff.numel() else 0.0
    rel = float(diff.double().norm() / ref_out.double().norm().clamp_min(1e-30))
    if not rel <= REL_TOL:
        problems.append(f"relative L2 error {rel:.2e} > {REL_TOL:.0e}")
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


def check_problem(shape, device, seed: int) -> dict:
    """A small packed batch with length-1, empty and off-tile sequences, ``shape``'s mask and
    head count (capped at 16), and a cached prefix when causal: ``{"args": (q, k, v),
    "kwargs": {...}}`` for ``mla_prefill``. Odd lengths catch tile-edge bugs the real shape hides."""
    import torch

    heads = min(shape.heads, 16)
    lq = [1, 77, 0, 300, 129]
    lk = [1, 77, 5, 333, 129] if shape.causal else [3, 50, 5, 333, 200]
    g = torch.Generator(device=device).manual_seed(seed + 1)

    def rnd(*s):
        return torch.randn(*s, generator=g, device=device, dtype=torch.float32).to(torch.bfloat16)

    tq, tk = sum(lq), sum(lk)

    def cu(xs):
        return torch.tensor([0] + [sum(xs[:i + 1]) for i in range(len(xs))], dtype=torch.int32, device=device)

    return {"args": (rnd(tq, heads, D_NOPE + D_ROPE), rnd(tk, heads, D_NOPE), rnd(tk, heads, D_V)),
            "kwargs": {"k_rope": rnd(tk, 1, D_ROPE), "cu_seqlens_q": cu(lq), "cu_seqlens_k": cu(lk),
                       "causal": shape.causal}}
