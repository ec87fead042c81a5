"""Sparse MLA prefill from an FP8 latent cache (issue 10), without a GPU: the operand
descriptions, dequantization against a byte-by-byte decoding, the reference, argument errors,
problem keys and shapes, and the spec's fp8 variants (render, resource checks, NVRTC compilation
without spills). tests/gpu/test_sparse_fp8_gpu.py runs the kernels."""

from __future__ import annotations

import math
import struct

import pytest

from mlagen import operands, render, spec, variant

torch = pytest.importorskip("torch")

from mlagen.families.mla_sparse_prefill import tools as bench_sparse  # noqa: E402
from mlagen.families import mla_sparse_prefill as fam  # noqa: E402
from mlagen.families.mla_sparse_prefill import problem as sp_problem, call as sp_call, compile as sp_compile, reference as sp_ref  # noqa: E402

# Formats with their scales in the rows (fp8_v4 keeps them per page: tests/test_fp8_v4_cache.py).
FP8 = [n for n in operands.NAMES if n != "bf16" and not operands.get(n).page_scales]


def test_formats_describe_their_rows():
    v32 = operands.get("fp8_v32")
    assert (v32.row_bytes, v32.scales, v32.scale_offset, v32.rope_offset, v32.d_qk) == (656, 4, 512, 528, 576)
    assert [operands.get(n).row_bytes for n in ("fp8_b64", "fp8_b32", "fp8_b0")] == [672, 704, 640]
    assert operands.for_scale_block(128) is v32 and operands.for_scale_block(0).name == "fp8_b0"
    bf16 = operands.get("bf16", 512)
    assert (bf16.row_bytes, bf16.elem_bytes, bf16.row_elems, bf16.quantized) == (1024, 2, 512, False)
    with pytest.raises(ValueError, match="kv_format"):
        operands.get("fp8_e5m2")
    with pytest.raises(ValueError, match="scale_block"):
        operands.for_scale_block(96)


def _decode_e4m3(byte: int) -> float:
    """OCP e4m3fn by hand: 1 sign, 4 exponent (bias 7), 3 mantissa bits; S.1111.111 is NaN."""
    sign = -1.0 if byte & 0x80 else 1.0
    e, m = (byte >> 3) & 0xF, byte & 0x7
    if e == 0xF and m == 0x7:
        return math.nan
    if e == 0:
        return sign * m / 8 * 2.0 ** -6
    return sign * (1 + m / 8) * 2.0 ** (e - 7)


def _bf16(x: float) -> float:
    return torch.tensor([x], dtype=torch.float32).to(torch.bfloat16).item()


@pytest.mark.parametrize("name", FP8)
def test_dequantize_matches_a_byte_by_byte_decoding(name):
    fmt = operands.get(name)
    g = torch.Generator().manual_seed(1)
    cache = bench_sparse.make_fp8_kv(torch, "p64", 70, fmt, g, "cpu")
    raw = cache.reshape(-1, fmt.row_bytes)
    got = operands.dequantize(cache, fmt)
    got_bf16 = operands.dequantize(cache, fmt, round_bf16=True)
    assert got.dtype == torch.float32 and got.shape == (128, 576) and got_bf16.dtype == torch.bfloat16
    for row in (0, 5, 127):
        b = bytes(raw[row].tolist())
        scales = struct.unpack(f"<{fmt.scales}f", b[fmt.scale_offset:fmt.rope_offset]) if fmt.scales else ()
        for col in range(0, 512, 37):
            scale = scales[col // fmt.scale_block] if fmt.scales else 1.0
            # The fp32 product (as the kernel computes it), then bf16 for the kernel's copy.
            want = float(torch.tensor(_decode_e4m3(b[col]), dtype=torch.float32) * torch.tensor(scale))
            assert got[row, col].item() == want
            assert got_bf16[row, col].item() == _bf16(want)
        for j in (0, 63):
            rope = struct.unpack("<H", b[fmt.rope_offset + 2 * j:fmt.rope_offset + 2 * j + 2])[0]
            want = struct.unpack("<f", struct.pack("<I", rope << 16))[0]
            assert got[row, 512 + j].item() == want == got_bf16[row, 512 + j].item()


def test_quantize_keeps_e4m3_precision_and_scales_span_orders_of_magnitude():
    fmt = operands.get("fp8_v32")
    g = torch.Generator().manual_seed(2)
    rows = torch.randn(64, 576, generator=g) * 10.0 ** torch.randint(-3, 4, (64, 1), generator=g)
    back = operands.dequantize(operands.quantize(rows, fmt), fmt)
    rel = ((back[:, :512] - rows[:, :512]).abs() / rows[:, :512].abs().amax(-1, keepdim=True)).max().item()
    assert rel <= 2.0 ** -4        # e4m3: 3 mantissa bits; each block scaled to its amax
    assert torch.equal(back[:, 512:], rows[:, 512:].to(torch.bfloat16).float())
    cache = bench_sparse.make_fp8_kv(torch, "p1", 200, fmt, g, "cpu")
    s = cache.reshape(-1, 656)[:, 512:528].contiguous().view(torch.float32)
    assert (s.max() / s.min()).item() > 1e3


@pytest.mark.parametrize("layout", list(bench_sparse.FP8_LAYOUTS))
def test_reference_dequantizes_then_computes_as_for_bf16(layout):
    fmt = operands.get("fp8_v32")
    g = torch.Generator().manual_seed(3)
    cache = bench_sparse.make_fp8_kv(torch, layout, 150, fmt, g, "cpu")
    n = cache.shape[0] * cache.shape[1]
    q = torch.randn(4, 3, 576, generator=g).to(torch.bfloat16)
    idx = torch.randint(-3, n + 3, (4, 40), generator=g, dtype=torch.int32)
    sink = torch.randn(3, generator=g)
    length = torch.tensor([40, 0, 17, 100], dtype=torch.int32)
    got = sp_ref.reference(q, cache, idx, softmax_scale=0.05, attn_sink=sink, topk_length=length, kv_format="fp8_v32")
    rows = operands.dequantize(cache, fmt)             # [N, 576] float32 rows
    want = sp_ref.reference(q, rows, idx, softmax_scale=0.05, attn_sink=sink, topk_length=length)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert got[2][1].isinf().all() and (got[0][1] == 0).all()   # topk_length 0: no key


def _cpu_call(kv, kv_format, q=None):
    q = torch.zeros(2, 4, 576, dtype=torch.bfloat16) if q is None else q
    return sp_call.kv_layout(kv, sp_call.kv_format_of(kv_format, q.shape[-1]))


def test_cache_layouts_map_onto_rows():
    pool = torch.zeros(5, 64, 656, dtype=torch.uint8)
    kv, n, ps, rs, pstride = _cpu_call(pool, "fp8_v32")
    assert (n, ps, rs, pstride) == (320, 0, 656, 0)                   # pages back to back: flat
    kv, n, ps, rs, pstride = _cpu_call(pool.unsqueeze(2), "fp8_v32")  # FlashMLA's decode form
    assert (n, ps, rs, pstride) == (320, 0, 656, 0) and kv.dim() == 3
    slot = torch.zeros(5, 128, 656, dtype=torch.uint8)[:, :64]
    kv, n, ps, rs, pstride = _cpu_call(slot, "fp8_v32")
    assert (n, ps, rs, pstride) == (320, 64, 656, 128 * 656)
    kv, n, ps, rs, pstride = _cpu_call(torch.zeros(7, 1, 656, dtype=torch.uint8), "fp8_v32")
    assert (n, ps, rs) == (7, 0, 656)
    kv, n, ps, rs, pstride = _cpu_call(torch.zeros(9, 672, dtype=torch.uint8), "fp8_b64")
    assert (n, ps, rs) == (9, 0, 672)


@pytest.mark.parametrize("kv, kv_format, exc, match", [
    (torch.zeros(4, 64, 576, dtype=torch.bfloat16), "fp8_v32", TypeError, r"kv: dtype must be torch.uint8"),
    (torch.zeros(4, 64, 655, dtype=torch.uint8), "fp8_v32", ValueError, r"kv: last dimension must be 656"),
    (torch.zeros(4, 64, 656, dtype=torch.uint8), "fp8_b64", ValueError, r"kv: last dimension must be 672"),
    (torch.zeros(4, 64, 2, 656, dtype=torch.uint8), "fp8_v32", ValueError, r"kv: a 4-D cache must be"),
    (torch.zeros(656, dtype=torch.uint8), "fp8_v32", ValueError, r"kv: expected 2 or 3 or 4 dimensions"),
    (torch.zeros(4, 64, 656, dtype=torch.uint8), "fp8", ValueError, r"kv_format: 'fp8' is not one of"),
    (torch.zeros(4, 64, 656, dtype=torch.uint8), 656, TypeError, r"kv_format: expected a string"),
    (torch.zeros(4, 576, dtype=torch.uint8), "bf16", TypeError, r"kv: dtype must be torch.bfloat16"),
])
def test_bad_caches_name_the_argument(kv, kv_format, exc, match):
    with pytest.raises(exc, match=match) as info:
        _cpu_call(kv, kv_format)
    assert "\n" not in str(info.value)


def test_prepare_checks_kv_format_and_q_width_first():
    q = torch.zeros(2, 4, 576, dtype=torch.bfloat16)
    kv = torch.zeros(4, 64, 656, dtype=torch.uint8)
    idx = torch.zeros(2, 8, dtype=torch.int32)
    with pytest.raises(ValueError, match="kv_format: 'nope' is not one of"):
        sp_call.prepare(q, kv, idx, softmax_scale=0.1, kv_format="nope")
    with pytest.raises(ValueError, match="q: must be a CUDA tensor"):
        sp_call.prepare(q, kv, idx, softmax_scale=0.1, kv_format="fp8_v32")


def test_problem_keys_and_shapes_carry_the_format():
    k = sp_problem.ProblemKey(576, 128, 2048, "paged", "fp8_v32")
    assert str(k) == "d576/h128/k2048/paged/fp8_v32" and sp_problem.ProblemKey.parse(str(k)) == k
    assert sp_problem.ProblemKey.parse("d576/h128/k2048/flat").kv_format == "bf16"
    assert k.distance(sp_problem.ProblemKey(576, 128, 2048, "paged")) == math.inf
    assert k.distance(sp_problem.ProblemKey(576, 64, 2048, "paged", "fp8_v32")) == 1
    with pytest.raises(ValueError):
        sp_problem.ProblemKey.parse("d576/h128/k2048/flat/fp9")
    f = fam.FAMILY
    s = f.parse_shape("sq=4096,h=128,topk=2048,skv=8192,kv=fp8_v32", id="S1f")
    assert s.kv_format == "fp8_v32" and f.parse_shape(f.describe_shape(s)).kv_format == "fp8_v32"
    assert f.problem_key(s) == "d576/h128/k2048/s8192/flat/fp8_v32"
    assert f.problem_specialization(f.problem_key(s)) == f.specialization(s) == {
        "d_qk": 576, "paged": False, "kv_format": "fp8_v32"}
    assert f.check_shape(s).kv_format == "fp8_v32"
    for bad in ("sq=1,h=1,topk=1,skv=1,kv=fp9", "sq=1,h=1,topk=1,skv=1,d=512,kv=fp8_v32"):
        with pytest.raises(ValueError):
            f.parse_shape(bad)


def test_make_inputs_builds_a_paged_fp8_cache():
    inp = sp_ref.make_inputs({"sq": 3, "heads": 2, "topk": 5, "s_kv": 70, "kv_format": "fp8_v32"}, "cpu", seed=1)
    assert inp["kv_format"] == "fp8_v32" and inp["kv"].dtype == torch.uint8 and inp["kv"].shape == (2, 64, 656)
    ref = fam.FAMILY.reference(None, inp)
    assert ref[0].shape == (3, 2, 512) and torch.isfinite(ref[2]).all()


def test_spec_variants_for_each_format():
    from mlagen import arch, resources

    s = spec.load("mla_sparse_prefill_sm90")
    v = variant.make(s, {"kv_format": "fp8_v32", "paged": True})
    assert "fp8_v32" in v.symbol
    text = render.render(v).text
    assert "kKvRowBytes = 656;" in text and "sparse_kv_fp8.cuh" in text and "const mlagen::u8* kv;" in text
    assert "sparse_kv_bf16.cuh" in render.render(variant.make(s, {})).text
    bad = resources.check(variant.make(s, {"kv_format": "fp8_v32", "d_qk": 512}), arch.TARGETS["sm_90a"])
    assert not bad.ok and any("d_qk must be 576" in r for r in bad.reasons)
    dup = resources.check(variant.make(s, {"kv_format": "fp8_v32", "l2_evict_last": False}), arch.TARGETS["sm_90a"])
    assert not dup.ok and any("L1 prefetches" in r for r in dup.reasons)
    sm80 = spec.load("mla_sparse_prefill_sm80")
    assert dict(sm80.specialize)["kv_format"] == ("bf16",)
    assert sp_compile.kv_format_targets("fp8_v32") == ["sm_90a"] and "sm_80" in sp_compile.kv_format_targets("bf16")


@pytest.mark.parametrize("values", [
    {"kv_format": "fp8_v32"}, {"kv_format": "fp8_v32", "paged": True}, {"kv_format": "fp8_b64"},
    {"kv_format": "fp8_b32", "paged": True}, {"kv_format": "fp8_b0"},
    {"kv_format": "fp8_v32", "gather_fence": True}, {"kv_format": "fp8_v32", "epilogue": "direct"},
    {"kv_format": "fp8_v32", "consumer_regs": 208, "producer_regs": 88},
])
def test_fp8_variants_compile_without_spills(values):
    from mlagen.compiler import for_target

    s = spec.load("mla_sparse_prefill_sm90")
    b = for_target("sm_90a").compile(render.render(variant.make(s, values)), "sm_90a")
    assert b.resources.spill_stores == 0 and b.resources.spill_loads == 0, b.log


@pytest.mark.parametrize("name", ["fp8_v32", "fp8_b64", "fp8_b32", "fp8_b0"])
def test_the_benchmarks_serving_pass_makes_the_kernels_bf16_copy(name):
    # bench-fp8's stand-in for the serving stacks' gather-and-dequantize must produce exactly the
    # rows the kernel computes with, so "fp8 vs serving" compares the same arithmetic (every format
    # bench-fp8 takes: fp8_b0, without scales, once crashed it).
    fmt = operands.get(name)
    g = torch.Generator().manual_seed(5)
    cache = bench_sparse.make_fp8_kv(torch, "p64", 200, fmt, g, "cpu")
    buf = torch.empty(cache.shape[0] * 64, 576, dtype=torch.bfloat16)
    assert torch.equal(bench_sparse.serving_dequant(torch, cache, fmt, buf), operands.dequantize(cache, fmt, round_bf16=True))


def test_the_rounding_bound_holds_on_the_reference_and_catches_more():
    # What the bf16 compute mode may differ from fp32-dequantized rows by: the reference on the
    # bf16-rounded rows stays within logit_bound of the reference on the fp32 rows (scales spread
    # over 10**+-2), and a max_logits moved past the bound fails.
    fmt = operands.get("fp8_v32")
    g = torch.Generator().manual_seed(11)
    cache = bench_sparse.make_fp8_kv(torch, "p64", 300, fmt, g, "cpu")
    n = cache.shape[0] * cache.shape[1]
    q = torch.randn(6, 8, 576, generator=g).to(torch.bfloat16)
    idx = bench_sparse.fuzzed_indices(torch, 6, 64, n, g, "cpu")
    scale = 576 ** -0.5
    ref32 = sp_ref.reference(q, cache, idx, softmax_scale=scale, kv_format=fmt.name)
    ref16 = sp_ref.reference(q, operands.dequantize(cache, fmt, round_bf16=True), idx, softmax_scale=scale)
    bound = bench_sparse.logit_bound(torch, q, operands.dequantize(cache, fmt), idx, None, scale)
    assert (bound > 0).any()
    ok, msg = bench_sparse.judge(torch, ref16, ref32, bench_sparse.FP8_OUT_TOL, bound=bound)
    assert ok, msg
    moved = torch.where(torch.isinf(ref16[1]), ref16[1], ref16[1] + 2 * bound + 0.1)
    assert not bench_sparse.judge(torch, (ref16[0], moved, ref16[2]), ref32, bench_sparse.FP8_OUT_TOL, bound=bound)[0]


def test_ue8m0_scales_are_powers_of_two_at_or_above_amax_over_448():
    fmt = operands.get("fp8_v32")
    g = torch.Generator().manual_seed(3)
    rows = torch.randn(50, 576, generator=g) * 10.0 ** torch.randint(-3, 4, (50, 1), generator=g)
    rows[7, :128] = 0.0   # an all-zero block keeps scale 1
    cache = operands.quantize(rows, fmt, scale_fmt="ue8m0")
    scales = cache[:, fmt.scale_offset:fmt.rope_offset].contiguous().view(torch.float32)
    mant, exp = torch.frexp(scales)
    assert torch.all(mant == 0.5), "every scale a power of two"
    amax = rows[:, :512].abs().view(50, 4, 128).amax(-1)
    nz = amax > 0
    assert torch.all(scales[nz] >= amax[nz] / 448) and torch.all(scales[nz] < 2 * amax[nz] / 448)
    assert scales[7, 0] == 1.0
    # Dequantized, the values stay within e4m3's rounding of the rows.
    back = operands.dequantize(cache, fmt)[:, :512]
    assert torch.allclose(back, rows[:, :512], rtol=2 ** -3, atol=float(scales.max()) * 2 ** -9)
    with pytest.raises(ValueError, match="scale_fmt"):
        operands.quantize(rows, fmt, scale_fmt="e8m0")


def test_the_fp8_matrix_covers_both_scale_formats():
    cases = bench_sparse.fp8_cases()
    assert {c.get("scales", "fp32") for c in cases} == {"fp32", "ue8m0"}
    # Power-of-two scales spread from 2^-40 to 2^20 (tiny and huge products).
    assert any(c.get("scales") == "ue8m0" and c.get("spread", 2.0) >= 6 for c in cases)


def test_check_gpu_times_an_fp8_record_on_s1_read_from_that_format():
    # `mlagen check --gpu` times each shipped record on its class's shapes; an fp8 class has no
    # BENCHMARKS.md id of its own, so the family offers S1's sizes read from the format.
    got = fam.FAMILY.check_shapes("d576/h128/k2048/flat/fp8_v32")
    assert [(s.id, s.s_kv, s.kv_format) for s in got] == [("S1", 8192, "fp8_v32")]
    assert [s.id for s in fam.FAMILY.check_shapes("d576/h128/k2048/flat")] == ["S1", "S2", "S3"]   # an old key
    # A key with the pool's size: the shape of that size read from the format.
    got = fam.FAMILY.check_shapes("d576/h128/k2048/s32768/flat/fp8_v32")
    assert [(s.id, s.s_kv, s.kv_format) for s in got] == [("S2", 32768, "fp8_v32")]
    assert fam.FAMILY.check_shapes("d576/h16/k2048/paged/fp8_v32") == []
    from mlagen import db
    shipped = [b for b in db.shipped_records() if b.key.spec == "mla_sparse_prefill_sm90"]
    assert shipped and all(fam.FAMILY.check_shapes(b.key.problem) for b in shipped)
