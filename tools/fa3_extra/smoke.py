#!/usr/bin/env python3
"""Check every kernel of the ``tools/fa3_extra`` build against a float32 reference on the GPU machine.

    PYTHONPATH=. python tools/fa3_extra/smoke.py

For each kernel the library lists (``torch.ops.fa3_extra.kernels()``): a ragged varlen batch (lengths 1,
lengths that fill no tile, a cached prefix, an empty sequence), MHA and GQA, out and lse against the
reference below (written from MLA.md sections 1 / 1b: bottom-right masks, softcap before the mask), outputs
checked for NaN. Exits 1 if any check fails. The reference is computed here, not by FA3 or mlagen.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

REL_TOL, LSE_TOL = 2e-2, 2e-2
# (q lengths, k lengths): a row of 1, a prefix (Lk > Lq), tiles not filled, an empty sequence
Q_LENS, K_LENS = (1, 77, 200, 0, 129), (1, 300, 200, 5, 129)
WINDOW = (37, 5)   # narrower than a tile on the left, a few keys ahead on the right
SOFTCAP = 30.0


def reference(q, k, v, cu_q, cu_k, *, causal, window, softcap, scale):
    """float32 out [Tq, H, dv] and lse [H, Tq] (FA3's layout); a row that sees nothing: out 0, lse +inf."""
    import torch

    tq, h, _ = q.shape
    hk = k.shape[1]
    out = torch.zeros(tq, h, v.shape[-1], dtype=torch.float32, device=q.device)
    lse = torch.full((h, tq), math.inf, dtype=torch.float32, device=q.device)
    for b in range(len(cu_q) - 1):
        qs, qe, ks, ke = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        lq, lk = qe - qs, ke - ks
        if lq == 0 or lk == 0:
            continue
        p = torch.arange(lq, device=q.device)[:, None] + (lk - lq)
        j = torch.arange(lk, device=q.device)[None, :]
        seen = torch.ones(lq, lk, dtype=torch.bool, device=q.device)
        if causal:
            seen &= j <= p
        if window is not None:
            if window[0] >= 0:
                seen &= j >= p - window[0]
            if window[1] >= 0:
                seen &= j <= p + window[1]
        qh = q[qs:qe].float().transpose(0, 1)
        kh = k[ks:ke].float().repeat_interleave(h // hk, dim=1).transpose(0, 1)
        vh = v[ks:ke].float().repeat_interleave(h // hk, dim=1).transpose(0, 1)
        s = qh @ kh.transpose(1, 2) * scale
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        s = s.masked_fill(~seen, -math.inf)
        row = torch.logsumexp(s, dim=-1)
        ok = torch.isfinite(row)
        prob = torch.where(ok[..., None], torch.exp(s - row[..., None]), torch.zeros_like(s))
        out[qs:qe] = (prob @ vh).transpose(0, 1)
        lse[:, qs:qe] = torch.where(ok, row, torch.full_like(row, math.inf))
    return out, lse


def check(ops, name: str, d: int, dv: int, causal: bool, window, softcap: float, heads: int, heads_k: int) -> str | None:
    """None if the kernel matches the reference, else what is wrong."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(0)
    tq, tk = sum(Q_LENS), sum(K_LENS)
    q = torch.randn(tq, heads, d, generator=gen, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(tk, heads_k, d, generator=gen, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(tk, heads_k, dv, generator=gen, device="cuda", dtype=torch.bfloat16)
    cu_q = [0]
    cu_k = [0]
    for lq, lk in zip(Q_LENS, K_LENS):
        cu_q.append(cu_q[-1] + lq)
        cu_k.append(cu_k[-1] + lk)
    dev = {"dtype": torch.int32, "device": "cuda"}
    left, right = window if window is not None else (-1, -1)
    out, lse = ops.fwd(q, k, v, torch.tensor(cu_q, **dev), torch.tensor(cu_k, **dev), max(Q_LENS), max(K_LENS),
                       causal, left, right, softcap, None)
    torch.cuda.synchronize()
    ref_out, ref_lse = reference(q, k, v, cu_q, cu_k, causal=causal, window=window, softcap=softcap,
                                 scale=1.0 / math.sqrt(d))
    problems = []
    if not bool(torch.isfinite(out).all()):
        problems.append("non-finite out")
    rel = float((out.float() - ref_out).norm() / ref_out.norm())
    if not rel <= REL_TOL:
        problems.append(f"out rel L2 {rel:.2e}")
    fin = torch.isfinite(ref_lse)
    lse_err = float((lse[fin] - ref_lse[fin]).abs().max())
    if not lse_err <= LSE_TOL or not bool((lse[~fin] == math.inf).all()):
        problems.append(f"lse err {lse_err:.2e} (or a row that sees nothing without lse +inf)")
    print(f"{name:28s} H {heads:2d}/{heads_k:2d} causal={causal} window={window} softcap={softcap}: "
          f"rel L2 {rel:.2e}, lse {lse_err:.2e} {'ok' if not problems else 'FAILED: ' + '; '.join(problems)}",
          flush=True)
    return "; ".join(problems) or None


def main() -> int:
    from mlagen.families.mla_prefill.peers import FA3_EXTRA

    ops = FA3_EXTRA.load()
    names = [str(n) for n in ops.kernels()]
    print(f"fa3_extra kernels: {', '.join(names)} ({FA3_EXTRA.library_path()})")
    failed = []
    for name in names:
        dims = name.removeprefix("hdim").split("_")
        d = int(dims[0])
        dv = int(dims[1]) if len(dims) > 1 and dims[1].isdigit() else d
        causal = "_causal" in name
        window = WINDOW if "_local" in name else None
        softcap = SOFTCAP if name.endswith("_softcap") else 0.0
        for heads, heads_k in ((5, 5), (4, 2)):
            if check(ops, name, d, dv, causal, window, softcap, heads, heads_k):
                failed.append(f"{name} H {heads}/{heads_k}")
        if window is not None:   # FA3's causal-with-window (left bounded, right 0) is the local kernel too
            if check(ops, name, d, dv, True, (WINDOW[0], -1), 0.0, 3, 3):
                failed.append(f"{name} causal window")
    print("FAILED: " + ", ".join(failed) if failed else "all fa3_extra kernels match the reference")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
