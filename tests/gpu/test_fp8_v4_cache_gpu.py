"""Sparse MLA prefill from DeepSeek-V4's FP8 cache (``kv_format="fp8_v4"``, FlashMLA's
MODEL1_FP8Sparse: 448 e4m3 + 64 bf16 per token, UE8M0 scales after each page's rows) on the GPU.

Both paths, as users reach them: the default call (the rows staged into a bf16 workspace, both
routes, then dispatch's bf16 kernel) and the in-kernel conversion (``kernel=
"mla_sparse_prefill_sm90"``). Each is bit for bit the same kernel on the bf16 copy of the
dequantized rows, and close to the float32 reference on them; H 1, 16, 64, 128; topk 1, 129,
640, 1152; pages of 64 and 37 tokens (and 1); the pool, FlashMLA's 4-D view and pages in wider
slots; fuzzed indices (-1, negative, >= N, 2**31 - 1, duplicates, empty rows), topk_length, every
sink mode; outputs poisoned with NaN; every e4m3 byte times UE8M0 scales from 2^-127 up.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("spec_defaults")]

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device (the kernels run there)", allow_module_level=True)

import mlagen  # noqa: E402
from mlagen import operands  # noqa: E402
from mlagen.families.mla_sparse_prefill import reference as sp_ref, staging, tools  # noqa: E402

V4 = operands.get("fp8_v4")
SM90 = "mla_sparse_prefill_sm90"
SCALE = 512 ** -0.5


def _cache(rows, page_size: int, form: str):
    """rows [N, 512] as a V4 cache in ``form``: the pool [blocks, page_bytes], FlashMLA's view
    [blocks, page_size, 1, 584] of it (uint8, or float8_e4m3fn as FlashMLA types it), or pages in
    slots 1152 bytes wider than a page."""
    pool = operands.quantize(rows, V4, page_size=page_size)
    if form == "pool":
        return pool
    if form in ("4d", "4d_e4m3"):   # FlashMLA's quantize_k_cache returns this view, typed float8_e4m3fn
        view = pool.as_strided((pool.shape[0], page_size, 1, V4.token_bytes), (pool.stride(0), V4.token_bytes,
                                                                               V4.token_bytes, 1))
        return view.view(torch.float8_e4m3fn) if form == "4d_e4m3" else view
    slots = torch.zeros((pool.shape[0], pool.shape[1] + 1152), dtype=torch.uint8, device=pool.device)
    slots[:, :pool.shape[1]] = pool
    return slots[:, :pool.shape[1]]


def _rows(n: int, gen, spread: float = 2.0):
    """Random rows whose 64-value blocks differ by 10**+-spread (scales over orders of magnitude)."""
    rows = torch.randn((n, 512), generator=gen, device="cuda")
    mag = 10.0 ** ((torch.rand((n, 7), generator=gen, device="cuda") * 2 - 1) * spread)
    rows[:, :448] *= mag.repeat_interleave(64, dim=1)
    return rows


def _poisoned(sq, heads):
    return (torch.full((sq, heads, 512), math.nan, dtype=torch.bfloat16, device="cuda"),
            torch.full((sq, heads), math.nan, device="cuda"), torch.full((sq, heads), math.nan, device="cuda"))


def _check(case: dict, seed: int, kernel) -> None:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    sq, heads = case["sq"], case["heads"]
    cache = _cache(_rows(case["n"], gen, case.get("spread", 2.0)), case["page"], case["form"])
    n_rows = -(-case["n"] // case["page"]) * case["page"]
    idx, length, sink = tools.case_indices(torch, case, n_rows, gen, "cuda")
    q = torch.randn((sq, heads + 2, 512), generator=gen, device="cuda").to(torch.bfloat16)[:, 1:heads + 1]
    args = dict(softmax_scale=SCALE, topk_length=length, attn_sink=sink)
    out, ml, lse = _poisoned(sq, heads)
    got = mlagen.mla_sparse_prefill(q, cache, idx, **args, out=out, max_logits=ml, lse=lse, kv_format="fp8_v4",
                                    kernel=kernel)
    copy = operands.dequantize(cache, V4, round_bf16=True)        # [N, 512] bf16: what both paths compute with
    out2, ml2, lse2 = _poisoned(sq, heads)
    same = mlagen.mla_sparse_prefill(q, copy, idx, **args, out=out2, max_logits=ml2, lse=lse2, kernel=kernel)
    strict = sp_ref.reference(q, copy, idx, **args)
    ref32 = sp_ref.reference(q, cache, idx, **args, kv_format="fp8_v4")
    bound = tools.logit_bound(torch, q, operands.dequantize(cache, V4), idx, length, SCALE)
    torch.cuda.synchronize()
    for a, b, name in zip(got, same, ("out", "max_logits", "lse")):
        assert torch.equal(a, b), f"{case}: {name} differs from the bf16 kernel on the dequantized rows " \
                                  f"(max {(a.float() - b.float()).abs().nan_to_num(0).max().item():.2e})"
    ok, msg = tools.judge(torch, got, strict)
    assert ok, f"{case}: vs the reference on the bf16 rows: {msg}"
    ok, msg = tools.judge(torch, got, ref32, tools.FP8_OUT_TOL, bound=bound)
    assert ok, f"{case}: vs the reference on fp32-dequantized rows: {msg}"


def _cases() -> list[dict]:
    cases, i = [], 0
    forms, pages = ["pool", "4d", "wide", "4d_e4m3"], [64, 37, 64, 1]
    sinks = ["none", "finite", "+inf", "-inf", "mixed"]
    for heads in (1, 16, 64, 128):
        for topk in (1, 129, 640, 1152):
            page = pages[i % 4]
            form = forms[i % 4 if i % 8 < 4 else (i + 1) % 4]   # every form with each page size
            cases.append({"sq": 9 if topk >= 640 else 13, "heads": heads, "topk": topk, "n": 2000 if page > 1 else 700,
                          "page": page, "form": form, "sink": sinks[i % 5],
                          "topk_length": [None, "short", "long"][i % 3], "idx3": i % 2 == 1})
            i += 1
    cases.append({"sq": 5, "heads": 64, "topk": 640, "n": 3000, "page": 64, "form": "pool", "sink": "finite",
                  "invalid": 0.0, "spread": 6.0})       # scales 2^-20 .. 2^20, all entries valid
    cases.append({"sq": 4, "heads": 16, "topk": 256, "n": 100, "page": 37, "form": "4d", "sink": "finite",
                  "invalid": 1.0})                      # every entry invalid
    cases.append({"sq": 6, "heads": 20, "topk": 700, "n": 40, "page": 64, "form": "wide", "sink": "mixed",
                  "topk_length": "long"})               # 64 rows under 700 references: many duplicates
    return cases


CASES = _cases()


@pytest.mark.parametrize("kernel", [None, SM90], ids=["staged", "in_kernel"])
@pytest.mark.parametrize("i", range(len(CASES)))
def test_v4_cache_equals_the_bf16_kernel_on_the_dequantized_rows(i, kernel):
    _check(CASES[i], seed=4000 + i, kernel=kernel)


@pytest.mark.parametrize("fraction", [0, 10**9], ids=["whole", "compacted"])
def test_both_staging_routes_equal_the_in_kernel_conversion(monkeypatch, fraction):
    """The pool converted whole, and the named rows compacted (indices remapped), against the
    in-kernel conversion, bit for bit, with invalid and duplicate indices and topk_length."""
    monkeypatch.setattr(staging, "WHOLE_POOL_FRACTION", fraction)
    gen = torch.Generator(device="cuda").manual_seed(17)
    cache = _cache(_rows(37 * 50, gen), 37, "4d")
    n = 37 * 50
    idx = tools.fuzzed_indices(torch, 7, 200, n, gen, "cuda")
    idx[1, :] = idx[1, 3].clamp(0, n - 1)
    length = torch.tensor([200, 200, 0, 17, 200, 199, 1], dtype=torch.int32, device="cuda")
    q = torch.randn((7, 64, 512), generator=gen, device="cuda").to(torch.bfloat16)
    sink = torch.randn(64, generator=gen, device="cuda")
    args = dict(softmax_scale=SCALE, topk_length=length, attn_sink=sink, kv_format="fp8_v4")
    assert staging.whole_pool(SimpleNamespace(num_kv=n, sq=7, topk=200)) == (fraction == 0)
    want = mlagen.mla_sparse_prefill(q, cache, idx, **args, kernel=SM90)
    got = mlagen.mla_sparse_prefill(q, cache, idx, **args)
    torch.cuda.synchronize()
    for a, b in zip(got, want):
        assert torch.equal(a, b), (a.float() - b.float()).abs().nan_to_num(0).max().item()


#: UE8M0 scale bytes at the edges: 2^-127 (an fp32 subnormal) and products that are bf16 / fp32
#: subnormals, 2^0, and up to 2^100 (448 x 2^127 overflows bf16: such a key is inf).
EDGE_EXPONENTS = [0, 1, 2, 6, 10, 20, 60, 100, 120, 126, 127, 128, 133, 140, 180, 227]


@pytest.mark.parametrize("kernel", [None, SM90], ids=["staged", "in_kernel"])
@pytest.mark.parametrize("page", [64, 5])
def test_every_e4m3_byte_times_edge_scales_dequantizes_exactly(kernel, page):
    # One key per token, so out is that key's row (K = V: the rope too): every finite e4m3 byte
    # times every edge scale must equal the host's bf16_rn(fp32(value) * scale) bit for bit.
    n = 2 * 64
    blocks = -(-n // page)
    pool = torch.zeros((blocks, V4.page_bytes(page)), dtype=torch.uint8, device="cuda")
    body = pool[:, :page * 576].view(blocks, page, 576)
    vals = (torch.arange(448, device="cuda")[None, :] * 5 + torch.arange(blocks * page, device="cuda")[:, None] * 3) % 256
    vals[(vals & 0x7F) == 0x7F] = 0x7E   # NaN codes: NaN keys make NaN logits
    body[..., :448] = vals.to(torch.uint8).view(blocks, page, 448)
    gen = torch.Generator(device="cuda").manual_seed(3)
    rope = torch.randn((blocks, page, 64), generator=gen, device="cuda").to(torch.bfloat16)
    body[..., 448:] = rope.view(torch.uint8)
    pick = (torch.arange(blocks * page * 7, device="cuda") * 5) % len(EDGE_EXPONENTS)
    exps = torch.tensor(EDGE_EXPONENTS, dtype=torch.uint8, device="cuda")[pick]
    pool[:, page * 576:page * 584].view(blocks, page, 8)[..., :7] = exps.view(blocks, page, 7)
    want = operands.dequantize(pool, V4, round_bf16=True)[:n]
    # Each token's q scaled by 1 / its key's largest value, so every logit stays small: the 64-head
    # kernel forms exp2(s * c - round(m * c)) with an fma, which for a logit of 1e30 is not exp2(0).
    amax = want.float().abs().amax(-1).clamp_min(1e-30)
    q = (torch.randn((n, 4, 512), generator=gen, device="cuda") / amax[:, None, None]).to(torch.bfloat16)
    idx = torch.arange(n, dtype=torch.int32, device="cuda").view(n, 1)
    out, _, _ = _poisoned(n, 4)
    out, _, _ = mlagen.mla_sparse_prefill(q, pool, idx, softmax_scale=0.01, kv_format="fp8_v4", kernel=kernel, out=out)
    torch.cuda.synchronize()
    bad = out != want[:, None, :]
    assert not bad.any(), f"{int(bad.sum())} values differ, first at {bad.nonzero()[0].tolist()}"


def test_d_qk_576_and_bad_pools_are_refused_by_name():
    pool = operands.quantize(torch.randn(64, 512, device="cuda"), V4, page_size=64)
    idx = torch.zeros((2, 8), dtype=torch.int32, device="cuda")
    q = torch.zeros((2, 4, 576), dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match=r"q: last dimension \(d_qk\) must be 512 for kv_format 'fp8_v4'"):
        mlagen.mla_sparse_prefill(q, pool, idx, softmax_scale=0.1, kv_format="fp8_v4")
    with pytest.raises(ValueError, match=r"kv: a fp8_v4 pool \[num_blocks, page_bytes\] must have page_bytes"):
        mlagen.mla_sparse_prefill(q[..., :512], pool[:, :-16], idx, softmax_scale=0.1, kv_format="fp8_v4")


def test_v4_cache_in_graph_capture():
    """The staged call (the compacted route: 1024 pool rows under 10240 references) captured and
    replayed equals the eager call; nothing reads back to the host."""
    inp = sp_ref.make_inputs({"sq": 16, "heads": 64, "topk": 640, "s_kv": 1000, "d_qk": 512,
                              "kv_format": "fp8_v4"}, "cuda", seed=8)
    assert inp["kv"].shape == (16, 37440)
    eager = mlagen.mla_sparse_prefill(**inp)
    g = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        captured = mlagen.mla_sparse_prefill(**inp)
    g.replay()
    torch.cuda.synchronize()
    for a, b in zip(eager, captured):
        assert torch.equal(a, b)
