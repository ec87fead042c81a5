"""DeepSeek-V4's FP8 KV cache (``fp8_v4``, FlashMLA's MODEL1_FP8Sparse) without a GPU: the format's
layout, the quantizer and dequantizer against a byte-by-byte reference written from FlashMLA's
``tests/quant.py`` description (per token 448 e4m3 values + 64 bf16 rope values, 576 B, first for
the whole page; then per token 7 UE8M0 scales + 1 pad byte; the page padded to a multiple of
576 B), the cache forms the call takes and its errors, the spec's variants (refused without pages
or at d_qk 576) and their sm_90a compilation without spills. tests/gpu/test_fp8_v4_cache_gpu.py
runs the kernels."""

from __future__ import annotations

import bisect
import math
import struct

import pytest

from mlagen import arch, operands, render, resources, spec, variant

torch = pytest.importorskip("torch")

from mlagen.families import mla_sparse_prefill as fam  # noqa: E402
from mlagen.families.mla_sparse_prefill import call as sp_call, reference as sp_ref, staging  # noqa: E402

V4 = operands.get("fp8_v4")


# --- a reference written from FlashMLA's description, byte by byte ------------------------------

def _e4m3(byte: int) -> float:
    """OCP e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; S.1111.111 is NaN."""
    sign = -1.0 if byte & 0x80 else 1.0
    e, m = (byte >> 3) & 0xF, byte & 0x7
    if e == 0xF and m == 0x7:
        return math.nan
    return sign * (m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))


_POSITIVE = sorted((_e4m3(b), b) for b in range(0x7F))   # the 127 finite non-negative codes, 0 first
_POS_VALUES = [v for v, _ in _POSITIVE]


def _encode_e4m3(x: float) -> int:
    """Nearest e4m3 code (ties to the even mantissa), saturating at 448."""
    mag = min(abs(x), 448.0)
    i = bisect.bisect_left(_POS_VALUES, mag)
    if i == len(_POS_VALUES):
        i -= 1
    if i > 0 and (mag - _POS_VALUES[i - 1] < _POS_VALUES[i] - mag
                  or (mag - _POS_VALUES[i - 1] == _POS_VALUES[i] - mag and _POSITIVE[i - 1][1] % 2 == 0)):
        i -= 1
    return _POSITIVE[i][1] | (0x80 if math.copysign(1.0, x) < 0 else 0)


def _f32(x: float) -> float:
    """x rounded to fp32 (the products here are exact there unless they reach 2^128: inf)."""
    if abs(x) >= 2.0 ** 128:
        return math.copysign(math.inf, x)
    return struct.unpack("<f", struct.pack("<f", x))[0]


def _ref_quantize(rows, page_size: int) -> bytes:
    """FlashMLA's MODEL1 layout of bf16 rows [N, 512] (N a multiple of page_size), as bytes:
    scale_inv = amax / 448 (fp32), rounded up to a power of two after a floor of 1e-4."""
    n = rows.shape[0]
    data = rows.float().tolist()
    token, row = 584, 576
    page = math.ceil(page_size * token / 576) * 576
    out = bytearray(page * (n // page_size))
    for r in range(n):
        base, off = (r // page_size) * page, r % page_size
        vals = data[r]
        for blk in range(7):
            block = vals[64 * blk:64 * blk + 64]
            inv = max(_f32(max(abs(v) for v in block) / 448.0), 1e-4)
            exp = math.ceil(math.log2(inv))
            out[base + page_size * row + 8 * off + blk] = exp + 127
            for j, v in enumerate(block):
                out[base + row * off + 64 * blk + j] = _encode_e4m3(v / 2.0 ** exp)
        for j in range(64):
            bits = struct.unpack("<I", struct.pack("<f", vals[448 + j]))[0] >> 16   # bf16 input: exact
            out[base + row * off + 448 + 2 * j:base + row * off + 450 + 2 * j] = struct.pack("<H", bits)
    return bytes(out)


def _ref_dequantize(raw: bytes, blocks: int, page_size: int, page_stride: int) -> list[list[float]]:
    """Rows of a MODEL1 pool (fp32 products e4m3 x 2^(e - 127); e = 255 is NaN)."""
    rows = []
    for b in range(blocks):
        for off in range(page_size):
            row = b * page_stride + 576 * off
            sc = b * page_stride + 576 * page_size + 8 * off
            scales = [math.nan if raw[sc + j] == 255 else 2.0 ** (raw[sc + j] - 127) for j in range(7)]
            vals = [_f32(_e4m3(raw[row + i]) * scales[i // 64]) for i in range(448)]
            rope = [struct.unpack("<f", struct.pack("<I", struct.unpack("<H", raw[row + 448 + 2 * j:row + 450 + 2 * j])[0] << 16))[0]
                    for j in range(64)]
            rows.append(vals + rope)
    return rows


def _rows(n: int, seed: int):
    """bf16 rows [n, 512] with blocks from 1e-6 to 1e3 in magnitude, an all-zero block and one
    below FlashMLA's scale floor (448e-4)."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.randn(n, 512, generator=g)
    mag = 10.0 ** (torch.rand(n, 7, generator=g) * 9 - 6)
    rows[:, :448] *= mag.repeat_interleave(64, dim=1)
    rows[0, :64] = 0.0
    rows[1, 64:128] *= 1e-3 / rows[1, 64:128].abs().max()
    return rows.to(torch.bfloat16)


# --- the format ---------------------------------------------------------------------------------

def test_the_v4_format_describes_flashmla_model1():
    assert (V4.values, V4.rope, V4.scales, V4.scale_block, V4.scale_dtype, V4.d_qk) == (448, 64, 7, 64, "ue8m0", 512)
    assert (V4.row_bytes, V4.token_bytes, V4.rope_offset, V4.page_scales) == (576, 584, 448, 8)
    assert V4.page_bytes(64) == 37440 == 65 * 576 and V4.page_bytes(1) == 1152 and V4.page_bytes(72) == 73 * 576
    for p in range(1, 400):
        assert V4.page_size_of(V4.page_bytes(p)) == p
    assert V4.page_size_of(74 * 576) is None and V4.page_size_of(37441) is None
    assert operands.for_scale_block(64).name == "fp8_b64"   # the in-row format, not V4's


@pytest.mark.parametrize("page_size", [64, 5])
def test_quantize_writes_flashmlas_bytes(page_size):
    rows = _rows(2 * page_size, seed=page_size)
    got = operands.quantize(rows, V4, page_size=page_size)
    assert got.dtype == torch.uint8 and got.shape == (2, V4.page_bytes(page_size))
    want = _ref_quantize(rows, page_size)
    diff = [i for i, (a, b) in enumerate(zip(bytes(got.flatten().tolist()), want)) if a != b]
    assert not diff, f"{len(diff)} bytes differ, first at {diff[:5]}"
    assert got[0, page_size * 576 + 0].item() == 127 - 13   # the all-zero block: the floor 1e-4 -> 2^-13
    assert got[0, page_size * 576 + 8 + 1].item() == 127 - 13   # below the floor too


def test_quantize_pads_the_last_page_with_zeros_and_checks_its_arguments():
    rows = _rows(70, seed=3)
    got = operands.quantize(rows, V4, page_size=64)
    assert got.shape == (2, 37440)
    back = operands.dequantize(got, V4)
    assert back.shape == (128, 512) and (back[70:] == 0).all()
    assert (got[1, 6 * 576:64 * 576] == 0).all() and (got[1, 64 * 576 + 6 * 8:] == 0).all()
    assert torch.equal(operands.quantize_pages(rows, V4, 64), got)
    with pytest.raises(ValueError, match="page_size: a fp8_v4 cache is a pool of pages"):
        operands.quantize(rows, V4)
    with pytest.raises(ValueError, match=r"rows: expected \[N, 512\]"):
        operands.quantize(torch.zeros(4, 576), V4, page_size=4)
    with pytest.raises(ValueError, match="scales: fp8_v4 scales are powers of two"):
        operands.quantize(rows[:4], V4, page_size=4, scales=torch.full((4, 7), 3.0))
    with pytest.raises(ValueError, match="page_size: fp8_v32 rows hold their scales"):
        operands.quantize(torch.zeros(4, 576), operands.get("fp8_v32"), page_size=4)


def test_given_scales_are_written_as_exponents_down_to_2_pow_minus_127():
    rows = torch.zeros(3, 512)
    rows[:, :448] = 1.0
    scales = torch.tensor([[2.0 ** -127, 2.0 ** -126, 1.0, 2.0, 2.0 ** 100, 2.0 ** 127, 0.5]] * 3)
    got = operands.quantize(rows, V4, page_size=3, scales=scales)
    assert got[0, 3 * 576:3 * 576 + 7].tolist() == [0, 1, 127, 128, 227, 254, 126]
    back = operands.dequantize(got, V4)
    # 1 / 2^-127 saturates to 448; 1 / 2^100 underflows to 0; the others are exact.
    assert back[0, 0] == torch.tensor(448.0) * torch.tensor(2.0 ** -127) and back[0, 0] > 0
    assert [back[0, 64 * j].item() for j in range(1, 7)] == [2.0 ** -126 * 448, 1.0, 1.0, 0.0, 0.0, 1.0]


@pytest.mark.parametrize("form", ["pool", "4d", "3d"])
def test_dequantize_matches_the_byte_reference_in_every_form(form):
    g = torch.Generator().manual_seed(9)
    page_size, blocks = 6, 3
    raw = torch.randint(0, 256, (blocks, V4.page_bytes(page_size)), generator=g, dtype=torch.uint8)
    # Every e4m3 byte, NaN codes included, and UE8M0 bytes 0 (2^-127) to 254 and 255 (NaN).
    raw[:, :page_size * 576].view(blocks, page_size, 576)[..., :448] = (
        torch.arange(blocks * page_size * 448).view(blocks, page_size, 448) % 256).to(torch.uint8)
    raw[:, page_size * 576:page_size * 584].view(blocks, page_size, 8)[..., :7] = torch.tensor(
        [0, 1, 100, 127, 200, 254, 255], dtype=torch.uint8)
    want = torch.tensor(_ref_dequantize(bytes(raw.flatten().tolist()), blocks, page_size, raw.stride(0)))
    cache = {"pool": raw,
             "4d": raw.as_strided((blocks, page_size, 1, 584), (raw.stride(0), 584, 584, 1)),
             "3d": raw.as_strided((blocks, page_size, 584), (raw.stride(0), 584, 1))}[form]
    got = operands.dequantize(cache, V4)
    assert got.dtype == torch.float32 and got.shape == (blocks * page_size, 512)
    same = (got == want) | (torch.isnan(got) & torch.isnan(want))
    assert same.all(), f"{int((~same).sum())} values differ"
    got16 = operands.dequantize(cache, V4, round_bf16=True)
    ref16 = want.to(torch.bfloat16)
    assert ((got16 == ref16) | (torch.isnan(got16) & torch.isnan(ref16))).all()
    # FlashMLA's dequantization (bf16 value times bf16 scale, in bf16) gives the same bf16 rows.
    rows = raw[:, :page_size * 576].reshape(-1, 576)
    e = raw[:, page_size * 576:page_size * 584].reshape(-1, 8)[:, :7]
    fm = rows[:, :448].contiguous().view(torch.float8_e4m3fn).to(torch.bfloat16) * \
        e.contiguous().view(torch.float8_e8m0fnu).to(torch.bfloat16).repeat_interleave(64, dim=1)
    assert ((fm == got16[:, :448]) | (torch.isnan(fm) & torch.isnan(got16[:, :448]))).all()


def test_quantize_then_dequantize_stays_within_e4m3_rounding():
    rows = _rows(128, seed=4).float()
    cache = operands.quantize(rows, V4, page_size=64)
    back = operands.dequantize(cache, V4)
    e = cache[:, 64 * 576:64 * 584].reshape(128, 8)[:, :7].long()
    step = (2.0 ** (e - 127)).repeat_interleave(64, dim=1)      # each value's scale
    err = (back[:, :448] - rows[:, :448]).abs()
    assert torch.all(err <= torch.maximum(rows[:, :448].abs() * 2 ** -4, step * 2 ** -10))
    assert torch.equal(back[:, 448:], rows[:, 448:])


# --- the call's view of the cache ---------------------------------------------------------------

def _layout(kv):
    return sp_call.kv_layout(kv, sp_call.kv_format_of("fp8_v4", 512))[1:]


def test_cache_forms_map_onto_paged_rows():
    pool = torch.zeros(5, 37440, dtype=torch.uint8)
    assert _layout(pool) == (320, 64, 576, 37440)
    assert _layout(pool.as_strided((5, 64, 1, 584), (37440, 584, 584, 1))) == (320, 64, 576, 37440)
    assert _layout(pool.as_strided((5, 64, 584), (37440, 584, 1))) == (320, 64, 576, 37440)
    assert _layout(torch.zeros(3, V4.page_bytes(37), dtype=torch.uint8)) == (111, 37, 576, V4.page_bytes(37))
    assert _layout(torch.zeros(1, V4.page_bytes(1), dtype=torch.uint8)) == (1, 1, 576, 1152)   # still paged
    wide = torch.zeros(4, 40000, dtype=torch.uint8)[:, :37440]          # pages in wider slots
    assert _layout(wide) == (256, 64, 576, 40000)
    assert _layout(torch.zeros(5, 64, 584, dtype=torch.uint8)) == (320, 64, 576, 64 * 584)   # packed pages
    # FlashMLA's quantize_k_cache types its bytes float8_e4m3fn: the same bytes are taken.
    fm = pool.view(torch.float8_e4m3fn).as_strided((5, 64, 1, 584), (37440, 584, 584, 1))
    kv, *rest = sp_call.kv_layout(fm, V4)
    assert kv.dtype == torch.uint8 and kv.data_ptr() == pool.data_ptr() and tuple(rest) == (320, 64, 576, 37440)
    assert torch.equal(operands.dequantize(fm, V4), operands.dequantize(pool, V4))


@pytest.mark.parametrize("kv, exc, match", [
    (torch.zeros(5, 37000, dtype=torch.uint8), ValueError, r"kv: a fp8_v4 pool \[num_blocks, page_bytes\] must have page_bytes"),
    (torch.zeros(5, 64, 2, 584, dtype=torch.uint8), ValueError, r"kv: a 4-D fp8_v4 cache must be \[num_blocks, page_size, 1, 584\]"),
    (torch.zeros(5, 64, 656, dtype=torch.uint8), ValueError, r"kv: last dimension must be 584"),
    (torch.zeros(5, 63, 584, dtype=torch.uint8), ValueError, r"kv: a fp8_v4 pool's base address and page stride must be multiples of 16"),
    (torch.zeros(5 * 37440 + 1, dtype=torch.uint8)[1:].view(5, 37440), ValueError, r"kv: .*multiples of 16 bytes"),
    (torch.zeros(5, 64, 1168, dtype=torch.uint8)[:, :, ::2], ValueError, r"kv: .*last dimension|kv: .*contiguous"),
    (torch.zeros(5, 37440, dtype=torch.uint8).as_strided((5, 64, 584), (37440, 576, 1)), ValueError,
     r"kv: a \[num_blocks, page_size, ..., 584\] fp8_v4 cache is a view of"),
    (torch.zeros(4, 37440, dtype=torch.uint8).as_strided((4, 37440), (30000, 1)), ValueError, r"kv: pages overlap"),
    (torch.zeros(37440, dtype=torch.uint8), ValueError, r"kv: expected 2 or 3 or 4 dimensions"),
    (torch.zeros(5, 37440, dtype=torch.bfloat16), TypeError, r"kv: dtype must be torch.uint8 for kv_format 'fp8_v4'"),
])
def test_bad_caches_name_the_argument(kv, exc, match):
    with pytest.raises(exc, match=match) as info:
        _layout(kv)
    assert "\n" not in str(info.value)


def test_d_qk_576_is_refused_by_name():
    s = fam.FAMILY
    assert s.parse_shape("sq=8,h=64,topk=640,skv=1000,d=512,kv=fp8_v4").kv_format == "fp8_v4"
    with pytest.raises(ValueError, match="kv=fp8_v4 holds d=512 rows"):
        s.parse_shape("sq=8,h=64,topk=640,skv=1000,kv=fp8_v4")
    # The call's check, after the device check, names q and the format (the GPU tests call it).
    assert V4.d_qk == 512


def test_v4_shapes_and_calls_are_paged_classes():
    f = fam.FAMILY
    s = f.parse_shape("sq=4096,h=64,topk=640,skv=32768,d=512,kv=fp8_v4", id="V1f")
    assert f.problem_key(s) == "d512/h64/k1024/s32768/paged/fp8_v4"
    assert f.specialization(s) == f.problem_specialization(f.problem_key(s)) == {
        "d_qk": 512, "paged": True, "kv_format": "fp8_v4"}
    assert f.check_shapes("d512/h64/k1024/s32768/paged/fp8_v4") == [] == f.check_shapes("d512/h64/k1024/paged/fp8_v4")   # no BENCHMARKS.md shape of d576 reads it


def test_make_inputs_and_the_reference_read_the_pool():
    inp = sp_ref.make_inputs({"sq": 3, "heads": 2, "topk": 5, "s_kv": 70, "d_qk": 512, "kv_format": "fp8_v4"},
                             "cpu", seed=1)
    assert inp["kv"].shape == (2, 37440) and inp["kv"].dtype == torch.uint8 and inp["kv_format"] == "fp8_v4"
    got = fam.FAMILY.reference(None, inp)
    rows = operands.dequantize(inp["kv"], V4)
    want = sp_ref.reference(inp["q"], rows, inp["indices"], softmax_scale=inp["softmax_scale"],
                            attn_sink=inp["attn_sink"])
    for a, b in zip(got, want):
        assert torch.equal(a, b)


# --- kernels: variants and compilation ----------------------------------------------------------

def test_the_spec_reads_v4_only_paged_at_d_qk_512():
    s = spec.load("mla_sparse_prefill_sm90")
    assert "fp8_v4" in dict(s.specialize)["kv_format"]
    sm90 = arch.TARGETS["sm_90a"]
    assert resources.check(variant.make(s, {"kv_format": "fp8_v4", "paged": True, "d_qk": 512}), sm90).ok
    flat = resources.check(variant.make(s, {"kv_format": "fp8_v4", "paged": False, "d_qk": 512}), sm90)
    assert not flat.ok and any("a paged variant" in r for r in flat.reasons)
    wide = resources.check(variant.make(s, {"kv_format": "fp8_v4", "paged": True, "d_qk": 576}), sm90)
    assert not wide.ok and any("d_qk must be 512" in r for r in wide.reasons)
    h16 = spec.load("mla_sparse_prefill_sm90_h16")
    assert "fp8_v4" not in dict(h16.specialize)["kv_format"]   # the staged path serves H <= 16


def test_the_in_kernel_variant_renders_the_format_and_compiles_without_spills():
    from mlagen.compiler import for_target

    v = variant.make(spec.load("mla_sparse_prefill_sm90"), {"kv_format": "fp8_v4", "paged": True, "d_qk": 512})
    text = render.render(v).text
    for line in ("kKvRowBytes = 576;", "kKvValues = 448;", "kKvScaleBlock = 64;", "kKvRopeOffset = 448;",
                 "kKvScaleUe8m0 = true;", "kKvPageScales = 8;", "sparse_kv_fp8.cuh"):
        assert line in text, line
    b = for_target("sm_90a").compile(render.render(v), "sm_90a")
    assert b.resources.spill_stores == 0 and b.resources.spill_loads == 0, b.log


def test_the_staging_kernels_read_page_scales():
    src = staging.source(V4)
    for line in ("kValues = 448;", "kPageScales = 8;", "kRowBytes = 576;", "kScaleUe8m0 = true;", "kRopeOffset = 448;"):
        assert line in src.text, line
    # the workspace: 512 bf16 values a row
    from types import SimpleNamespace
    call = SimpleNamespace(kv_format="fp8_v4", d_qk=512, num_kv=8192, sq=4096, topk=640)
    assert staging.workspace_bytes(call) == 8192 * 1024
