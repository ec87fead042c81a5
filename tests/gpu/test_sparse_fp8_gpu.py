"""Sparse MLA prefill straight from an FP8 latent cache (issue 10) on the GPU.

The matrix of mlagen.families.mla_sparse_prefill.tools.fp8_cases (H in {1, 16, 64, 128} x topk in {1, 33, 640, 2048};
fp8_v32 and scale blocks 64 / 32 / none; page sizes 64 and 1, FlashMLA's 4-D decode form and
strided pages; per-block scales spread over four orders of magnitude; -1, negative, >= N and
2**31 - 1 indices; duplicates; topk_length; every sink mode; outputs poisoned with NaN): each
case against the float32 reference (dequantized first), and bit for bit against the bf16
kernel on the bf16 copy of the dequantized rows.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import mlagen  # noqa: E402
from mlagen import operands  # noqa: E402
from mlagen.families.mla_sparse_prefill import tools as bench_sparse  # noqa: E402
from mlagen.errors import NoDeviceError  # noqa: E402
from mlagen.families.mla_sparse_prefill import reference as sp_ref  # noqa: E402

CASES = bench_sparse.fp8_cases()


H16 = "mla_sparse_prefill_sm90_h16"
SM90 = "mla_sparse_prefill_sm90"


@pytest.mark.parametrize("kernel", [None, SM90, H16], ids=["staged", "sm90", "h16"])
@pytest.mark.parametrize("i", range(len(CASES)))
def test_fp8_cache_matches_reference_and_bf16_kernel(i, kernel):
    """The call as users write it (rows staged into bf16, then dispatch's bf16 kernel), and the
    kernels that convert the raw rows themselves, asked by name (the 64-head kernel; the H <= 16
    kernel, every H in groups of 16): each bit for bit against the same kernel on the bf16 copy."""
    ok, msg = bench_sparse.check_fp8_case(torch, CASES[i], seed=2000 + i, kernel=kernel)
    assert ok, f"{CASES[i]}: {msg}"


def _inputs(seed=4):
    return sp_ref.make_inputs({"sq": 16, "heads": 64, "topk": 256, "s_kv": 1000, "kv_format": "fp8_v32"}, "cuda",
                           seed=seed)


@pytest.mark.parametrize("fraction", [0, 10**9], ids=["whole", "compacted"])
def test_fp8_cuda_graph_capture_and_replay(monkeypatch, fraction):
    """The staged call (both routes: the pool converted whole; the rows compacted, with the scan and
    the remap) captured and replayed on new inputs, against the in-kernel conversion eagerly."""
    from mlagen.families.mla_sparse_prefill import staging

    monkeypatch.setattr(staging, "WHOLE_POOL_FRACTION", fraction)
    inp = _inputs()
    mlagen.mla_sparse_prefill(**inp)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o, ml, lse = mlagen.mla_sparse_prefill(**inp)
    new = _inputs(seed=5)
    for k in ("q", "kv", "indices", "attn_sink"):
        inp[k].copy_(new[k])
    g.replay()
    ro, rml, rlse = mlagen.mla_sparse_prefill(**new, kernel=SM90)
    torch.cuda.synchronize()
    assert torch.equal(o, ro) and torch.equal(lse, rlse) and torch.equal(ml, rml)


@pytest.mark.parametrize("name", ["fp8_v32", "fp8_b64", "fp8_b32", "fp8_b0"])
@pytest.mark.parametrize("kv", ["p64_4d", "flat"])
def test_staging_whole_and_compacted_equal_the_in_kernel_conversion(monkeypatch, name, kv):
    """Both staging routes (the pool converted whole; the named rows compacted, indices remapped)
    against the in-kernel conversion, bit for bit, with invalid, negative, duplicate indices and
    entries past topk_length that name rows (they may be staged, never read)."""
    from mlagen.families.mla_sparse_prefill import staging

    fmt = operands.get(name)
    g = torch.Generator(device="cuda").manual_seed(11)
    sq, heads, topk, n = 7, 64, 96, 64 * 40
    rows32 = torch.randn((n, 576), generator=g, device="cuda")
    spread = 10 ** (torch.rand((n, 4), generator=g, device="cuda") * 4 - 2)   # blocks scaled by 10^-2 .. 10^2
    rows32[:, :512] *= spread.repeat_interleave(128, dim=1)
    cache = operands.quantize(rows32, fmt)
    if kv == "p64_4d":
        cache = cache.view(n // 64, 64, 1, fmt.row_bytes)
    idx = torch.randint(0, n, (sq, topk), generator=g, device="cuda", dtype=torch.int32)
    idx[0, :5] = torch.tensor([-1, -7, n, 2**31 - 1, 3], dtype=torch.int32)
    idx[1, :] = idx[1, 0]                      # all duplicates
    idx[2, :] = -1                             # an empty row
    length = torch.full((sq,), topk, dtype=torch.int32, device="cuda")
    length[3], length[4] = 0, 17
    q = torch.randn((sq, heads, 576), generator=g, device="cuda").to(torch.bfloat16)
    sink = torch.randn(heads, generator=g, device="cuda")
    args = dict(softmax_scale=576 ** -0.5, topk_length=length, attn_sink=sink, kv_format=name)
    want = mlagen.mla_sparse_prefill(q, cache, idx, **args, kernel=SM90)
    for fraction, route in ((0, "whole"), (10**9, "compacted")):
        monkeypatch.setattr(staging, "WHOLE_POOL_FRACTION", fraction)
        got = mlagen.mla_sparse_prefill(q, cache, idx, **args)
        for a, b in zip(got, want):
            assert torch.equal(a, b), (route, (a.float() - b.float()).abs().nan_to_num(0).max().item())


def test_fp8_through_the_torch_op():
    inp = _inputs()
    eager = mlagen.mla_sparse_prefill(**inp)
    compiled = torch.compile(lambda **kw: mlagen.mla_sparse_prefill(**kw), fullgraph=True)(**inp)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)


def test_fp8_opcheck():
    from mlagen.families.mla_sparse_prefill import op

    inp = _inputs()
    args = (inp["q"], inp["kv"], inp["indices"], 0.04, None, inp["attn_sink"], None, "fp8_v32")
    for name, result in torch.library.opcheck(op._op, args).items():
        assert result == "SUCCESS", (name, result)


def test_a_pinned_variant_of_another_format_is_refused():
    from mlagen import spec, variant

    inp = _inputs()
    bf16_variant = variant.make(spec.load("mla_sparse_prefill_sm90"), {})
    with pytest.raises(ValueError, match="kernel: variant .* the call needs"):
        mlagen.mla_sparse_prefill(**inp, kernel=bf16_variant)


def test_the_sm80_fallback_names_kv_format_and_its_targets():
    inp = _inputs()
    with pytest.raises(NoDeviceError, match="kv_format 'fp8_v32'.*target: sm_90a"):
        mlagen.mla_sparse_prefill(**inp, kernel="mla_sparse_prefill_sm80")


def test_scale_blocks_64_32_and_none_match_their_references():
    for name in ("fp8_b64", "fp8_b32", "fp8_b0"):
        case = {"sq": 5, "heads": 128, "topk": 300, "n": 900, "kv": "p64", "kv_format": name, "sink": "finite"}
        ok, msg = bench_sparse.check_fp8_case(torch, case, seed=7)
        assert ok, f"{name}: {msg}"
    assert operands.get("fp8_b0").scales == 0


# Scales at edges of the exact dequantization: powers of two near the ends of fp32's range,
# products that are fp32 subnormals, zero, negative, and scales with more than 8 significant bits.
EDGE_SCALES = [2.0 ** -120, 2.0 ** -121, 2.0 ** 7, 2.0 ** 8, 1.5, 1.1, -2.0, 0.0, 2.0 ** -126, 255.0, 3.0e-3,
               2.0 ** -7]


@pytest.mark.parametrize("kernel", [None, H16], ids=["dispatched", "h16"])
@pytest.mark.parametrize("name", ["fp8_v32", "fp8_b64", "fp8_b0"])
def test_every_e4m3_byte_and_edge_scale_dequantizes_exactly(name, kernel):
    # One key per token, so out is that key's V row: every finite e4m3 byte times every edge scale
    # must equal the host's bf16_rn(fp32(value) * scale) bit for bit.
    fmt = operands.get(name)
    n = 96
    g = torch.Generator(device="cuda").manual_seed(3)
    raw = torch.empty((n, fmt.row_bytes), dtype=torch.uint8, device="cuda")
    vals = (torch.arange(fmt.values, device="cuda")[None, :] * 5 + torch.arange(n, device="cuda")[:, None] * 3) % 256
    vals[(vals & 0x7F) == 0x7F] = 0   # NaN patterns: NaN != NaN would need its own check
    raw[:, :fmt.values] = vals.to(torch.uint8)
    if fmt.scales:
        pick = (torch.arange(n * fmt.scales, device="cuda") * 7) % len(EDGE_SCALES)
        scales = torch.tensor(EDGE_SCALES, dtype=torch.float32, device="cuda")[pick].view(n, fmt.scales)
        raw[:, fmt.scale_offset:fmt.rope_offset] = scales.view(torch.uint8)
    rope = torch.randn((n, fmt.rope), generator=g, device="cuda").to(torch.bfloat16)
    raw[:, fmt.rope_offset:] = rope.view(torch.uint8)
    cache = raw.view(n, 1, fmt.row_bytes)
    q = torch.randn((n, 4, 576), generator=g, device="cuda").to(torch.bfloat16)
    idx = torch.arange(n, dtype=torch.int32, device="cuda").view(n, 1)
    out, _, _ = mlagen.mla_sparse_prefill(q, cache, idx, softmax_scale=0.01, kv_format=name, kernel=kernel)
    want = operands.dequantize(raw, fmt, round_bf16=True)[:, :512]
    torch.cuda.synchronize()
    bad = (out != want[:, None, :]) & ~(torch.isnan(out) & torch.isnan(want[:, None, :]))
    assert not bad.any(), f"{int(bad.sum())} values differ, first at {bad.nonzero()[0].tolist()}"
