"""Element offsets past 2**31 on the GPU: serving-sized tensors (a 128 K-token prefill of 128 heads
has a q of 3.2e9 elements; a paged FP8 latent pool of 3.3 M tokens is 2.2 GB) through every family.

Each case makes the kernels' largest offset exceed 2**31 elements (bytes for FP8) with strided
views of one large buffer (inputs and out in disjoint column ranges of the same rows), so the
problem stays small to compute while every address computation sees the large values: row x
row stride, head x head stride, index x KV row stride. The gaps between the views hold a sentinel
that must survive (no stray writes), out is poisoned with NaN first, and sampled rows (the first,
the last, and some in between) are checked against the float32 reference of MLA.md.
"""

from __future__ import annotations

import math

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

torch = pytest.importorskip("torch")

import mlagen  # noqa: E402
from mlagen import operands  # noqa: E402
from mlagen.families.mla_sparse_prefill import reference as sp_ref  # noqa: E402

BIG = 2 ** 31
NEED_BYTES = 24 << 30


def _memory_skip_reason():
    """Where a GPU is visible (else the ``gpu`` marker skips these, tests/conftest.py): enough free memory."""
    if not torch.cuda.is_available():
        return None
    free, _ = torch.cuda.mem_get_info()
    if free < NEED_BYTES:
        return f"needs {NEED_BYTES >> 30} GiB of free GPU memory for > 2**31-element tensors; {free >> 30} GiB free"
    return None


def _other_than_sm90a():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0)


pytestmark.append(pytest.mark.skipif(_memory_skip_reason() is not None, reason=str(_memory_skip_reason())))

SENTINEL = 3.0


def _max_offset(t) -> int:
    return sum((n - 1) * s for n, s in zip(t.shape, t.stride()))


def _rows(n):
    return sorted({0, 1, n // 3, n // 2 + 7, n - 2, n - 1})


def _dense_reference(q, k, v, k_rope, rows, causal=True):
    """out [len(rows), H, 128], lse [len(rows), H] in float32 for query rows ``rows`` of one
    sequence with Lq = Lk (MLA.md section 1), from the dequantized (float) inputs."""
    scale = 1.0 / math.sqrt(192)
    kf = torch.cat([k.float(), k_rope.float().expand(k.shape[0], k.shape[1], 64)], -1)    # [T, H, 192]
    outs, lses = [], []
    for r in rows:
        n = r + 1 if causal else k.shape[0]
        s = torch.einsum("hd,khd->hk", q[r].float(), kf[:n]) * scale
        lse = torch.logsumexp(s, -1)
        outs.append(torch.einsum("hk,khd->hd", torch.exp(s - lse[:, None]), v[:n].float()))
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses)


def _check_dense(out, lse, ref_out, ref_lse, rows, rel_tol):
    got = out[rows].float()
    assert not torch.isnan(out).any(), "out was not fully written"
    err = ((got - ref_out).norm() / ref_out.norm()).item()
    assert err < rel_tol, f"out relative L2 error {err:.3e} on rows {rows}"
    assert torch.allclose(lse[rows], ref_lse, atol=2e-3, rtol=0), (lse[rows] - ref_lse).abs().max().item()


def _dense_views(buf):
    """q, k, v, out as disjoint column ranges of ``buf`` [T, H, C]; the columns between them keep
    the sentinel."""
    q, k, v, out = buf[..., 0:192], buf[..., 256:384], buf[..., 512:640], buf[..., 768:896]
    return q, k, v, out


@pytest.mark.parametrize("causal", [True, False])
def test_dense_bf16_past_2_31(causal):
    t, heads, cols = 20001, 16, 8192            # row stride 131072 elements: offsets to 2.6e9
    g = torch.Generator(device="cuda").manual_seed(11)
    buf = torch.full((t, heads, cols), SENTINEL, dtype=torch.bfloat16, device="cuda")
    q, k, v, out = _dense_views(buf)
    for x in (q, k, v):
        x.copy_(torch.randn(x.shape, generator=g, device="cuda"))
    k_rope = torch.randn((t, 1, 64), generator=g, device="cuda").to(torch.bfloat16)
    out.fill_(float("nan"))
    lse = torch.full((t, heads), float("nan"), device="cuda")
    assert min(_max_offset(x) for x in (q, k, v, out)) > BIG
    mlagen.mla_prefill(q, k, v, k_rope=k_rope, causal=causal, out=out, lse=lse)
    torch.cuda.synchronize()
    rows = _rows(t)
    ref_out, ref_lse = _dense_reference(q, k, v, k_rope, rows, causal)
    _check_dense(out, lse, ref_out, ref_lse, rows, 1e-2)
    assert bool((buf[..., 896:1024] == SENTINEL).all()) and bool((buf[..., 640:768] == SENTINEL).all())


@pytest.mark.skipif(_other_than_sm90a(), reason="FP8 dense inputs have a kernel on sm_90a only (this GPU is another)")
def test_dense_fp8_past_2_31():
    t, heads, cols = 20001, 16, 8192            # bytes = elements: offsets to 2.6e9
    g = torch.Generator(device="cuda").manual_seed(12)
    f8 = torch.float8_e4m3fn
    buf = torch.full((t, heads, cols), SENTINEL, dtype=f8, device="cuda")
    q, k, v, _ = _dense_views(buf)
    for x in (q, k, v):
        x.copy_(torch.randn(x.shape, generator=g, device="cuda").to(f8))
    k_rope = torch.randn((t, 1, 64), generator=g, device="cuda").to(f8)
    obuf = torch.full((t, heads, 4096), SENTINEL, dtype=torch.bfloat16, device="cuda")   # out's offsets to 1.3e9
    out = obuf[..., 2048:2176]
    out.fill_(float("nan"))
    lse = torch.full((t, heads), float("nan"), device="cuda")
    assert min(_max_offset(x) for x in (q, k, v)) > BIG
    mlagen.mla_prefill(q, k, v, k_rope=k_rope, causal=True, out=out, lse=lse)
    torch.cuda.synchronize()
    rows = _rows(t)
    ref_out, ref_lse = _dense_reference(q, k, v, k_rope, rows)
    _check_dense(out, lse, ref_out, ref_lse, rows, 5e-2)   # P rounded to e4m3 (README: 2-3%)
    assert bool((obuf[..., 2176:2304] == SENTINEL).all()) and bool((obuf[..., 1920:2048] == SENTINEL).all())
    assert bool((buf[..., 896:1024].float() == SENTINEL).all())


def _sparse_indices(g, sq, topk, n):
    """Random rows over the whole table, the last row in every query row, some invalid entries."""
    idx = torch.randint(0, n, (sq, topk), generator=g, device="cuda", dtype=torch.int32)
    idx[:, 0] = n - 1
    idx[:, 1] = -1
    idx[::7, 2] = n            # out of range: never read
    return idx


def _sparse_reference(q, table, indices, rows, scale, sink, kv_format="bf16"):
    """The reference on the sampled query rows, with ``table`` ([N, row], the cache's own row format)
    cut down to the rows they use."""
    idx = indices[rows].long()
    valid = (idx >= 0) & (idx < table.shape[0])
    used = torch.unique(idx[valid])
    remap = torch.full_like(idx, -1)
    remap[valid] = torch.searchsorted(used, idx[valid])
    return sp_ref.reference(q[rows], table[used].contiguous(), remap.to(torch.int32), softmax_scale=scale,
                            attn_sink=sink, kv_format=kv_format)


def _check_sparse(got, ref, rows, rel_tol, stat_tol):
    out, ml, lse = got
    r_out, r_ml, r_lse = ref
    assert not torch.isnan(out).any(), "out was not fully written"
    err = ((out[rows].float() - r_out).norm() / r_out.norm()).item()
    assert err < rel_tol, f"out relative L2 error {err:.3e} on rows {rows}"
    for name, a, b in (("lse", lse[rows], r_lse), ("max_logits", ml[rows], r_ml)):
        d = ((a - b).abs() / (1 + b.abs())).max().item()
        assert d < stat_tol, f"{name} off by {d:.3e} of 1 + |ref|"


@pytest.mark.parametrize("heads", [128, 16])
def test_sparse_bf16_past_2_31(heads):
    sq, topk, cols = 20001, 96, 1152
    n = (1 << 22) + 3                           # KV rows of 576 elements: index x stride to 2.4e9
    g = torch.Generator(device="cuda").manual_seed(13)
    buf = torch.full((sq, heads, cols), SENTINEL, dtype=torch.bfloat16, device="cuda")
    q, out = buf[..., 0:576], buf[..., 576:1088]
    q.copy_(torch.randn(q.shape, generator=g, device="cuda"))
    out.fill_(float("nan"))
    kv = torch.randn((n, 576), generator=g, device="cuda").to(torch.bfloat16)
    indices = _sparse_indices(g, sq, topk, n)
    sink = torch.randn((heads,), generator=g, device="cuda")
    assert _max_offset(kv) > BIG and (heads < 128 or _max_offset(q) > BIG)
    scale = 576 ** -0.5
    got = mlagen.mla_sparse_prefill(q, kv, indices, softmax_scale=scale, attn_sink=sink, out=out)
    torch.cuda.synchronize()
    rows = _rows(sq)
    ref = _sparse_reference(q, kv, indices, rows, scale, sink)
    _check_sparse(got, ref, rows, sp_ref.REL_TOL, sp_ref.STAT_TOL)
    assert bool((buf[..., 1088:] == SENTINEL).all())


@pytest.mark.skipif(_other_than_sm90a(), reason="FP8 caches have sparse kernels on sm_90a only (this GPU is another)")
def test_sparse_fp8_cache_past_2_31():
    sq, heads, topk = 4001, 128, 96
    fmt = operands.get("fp8_v32")
    pages = (7 << 19) // 64 + 5                 # 3.7 M tokens of 656 B: index x stride to 2.4e9 bytes
    g = torch.Generator(device="cuda").manual_seed(14)
    cache = torch.empty((pages, 64, fmt.row_bytes), dtype=torch.uint8, device="cuda")
    flat = cache.view(-1, fmt.row_bytes)
    n = flat.shape[0]
    indices = _sparse_indices(g, sq, topk, n)
    # Only the rows the indices reach are read: quantize random rows into those (plus the last).
    used = torch.unique(indices[(indices >= 0) & (indices < n)].long())
    flat[used] = operands.quantize(torch.randn((used.numel(), 576), generator=g, device="cuda"), fmt)
    q = torch.randn((sq, heads, 576), generator=g, device="cuda").to(torch.bfloat16)
    sink = torch.randn((heads,), generator=g, device="cuda")
    assert (n - 1) * fmt.row_bytes > BIG
    scale = 576 ** -0.5
    got = mlagen.mla_sparse_prefill(q, cache, indices, softmax_scale=scale, attn_sink=sink, kv_format=fmt.name)
    torch.cuda.synchronize()
    rows = _rows(sq)
    ref = _sparse_reference(q, flat, indices, rows, scale, sink, kv_format=fmt.name)
    # bf16 rounding of the dequantized rows on top of the bf16 kernel's own (notes-sparse.md)
    _check_sparse(got, ref, rows, 2e-2, 1e-2)
