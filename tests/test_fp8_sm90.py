"""The FP8 Hopper kernel's data layouts, without a GPU: V^T as transpose_v writes it (every key of
every sequence exactly once, at the column the kernel's vt_column computes, in the PERM16 order),
and P V on the e4m3 A fragments that pack_p builds from the wgmma accumulator layout (emulated
here from the PTX ISA's fragment figures) equals P V on the natural key order. tests/gpu runs the
kernel itself (tests/gpu/test_fp8_gpu.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import importlib  # noqa: E402

tma = importlib.import_module("mlagen.families.mla_prefill.tma")


def vt_column(k_start: int, batch_index: int) -> int:
    """The kernel's vt_column for a sequence's first key (mla_prefill.cuh)."""
    return (k_start + 15) // 16 * 16 + 16 * batch_index


def test_perm16_is_a_permutation():
    assert sorted(tma.PERM16) == list(range(16))


@pytest.mark.parametrize("lengths", [(37,), (5, 1, 0, 200, 77, 301), (16, 32, 15, 17), (0, 0, 3)])
def test_transpose_v_places_every_key_once_where_the_kernel_reads_it(lengths):
    total = sum(lengths)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)
    heads, dv = 3, 128
    v = torch.randint(0, 120, (total, heads, dv), dtype=torch.uint8)  # finite e4m3 bit patterns
    vt = tma.transpose_v(v.view(torch.float8_e4m3fn), cu, total, len(lengths))
    assert tuple(vt.shape) == (heads, dv, tma.vt_width(total, len(lengths)))
    for b, n in enumerate(lengths):
        start = int(cu[b])
        col0 = vt_column(start, b)
        for key in range(n):
            pos = key // 16 * 16 + tma.PERM16.index(key % 16)
            assert torch.equal(vt[:, :, col0 + pos], v[start + key]), (b, key)
        # Columns of the last group that hold no key repeat one of the sequence's own keys.
        for pos in range(n, -(-n // 16) * 16):
            key = pos // 16 * 16 + tma.PERM16[pos % 16]
            if key >= n:
                assert torch.equal(vt[:, :, col0 + pos], v[start]), (b, pos)


def test_transpose_v_without_cu_seqlens():
    v = torch.randint(0, 120, (40, 2, 128), dtype=torch.uint8)
    vt = tma.transpose_v(v.view(torch.float8_e4m3fn), None, 40, 1)
    for key in range(40):
        assert torch.equal(vt[:, :, key // 16 * 16 + tma.PERM16.index(key % 16)], v[key])


def accumulator_owner(block_n: int):
    """(thread, register) -> (row, column) of the m64nN fp32 accumulator of one warpgroup."""
    owner = {}
    for tid in range(128):
        warp, lane = divmod(tid, 32)
        g, t = divmod(lane, 4)
        for j in range(block_n // 8):
            for e in range(4):
                owner[(tid, 4 * j + e)] = (16 * warp + g + 8 * (e // 2), 8 * j + 2 * t + e % 2)
    return owner


def a_fragment_e4m3(tid: int, reg: int, byte: int):
    """(row, k) of byte ``byte`` of A register ``reg`` of thread ``tid`` for wgmma m64nNk32 with
    8-bit A in registers (PTX ISA, "Register fragment for matrix A": the mma.m16n8k32 layout per
    warp's 16 rows)."""
    warp, lane = divmod(tid, 32)
    g, t = divmod(lane, 4)
    return 16 * warp + g + 8 * (reg % 2), 16 * (reg // 2) + 4 * t + byte


def pack_p_sources(kt: int):
    """The accumulator registers pack_p puts in bytes 0..3 of each A register of k-step kt."""
    s = 16 * kt
    return [[s + 0, s + 1, s + 4, s + 5], [s + 2, s + 3, s + 6, s + 7],
            [s + 8, s + 9, s + 12, s + 13], [s + 10, s + 11, s + 14, s + 15]]


@pytest.mark.parametrize("block_n", [32, 128, 192])
def test_pack_p_fragments_times_permuted_vt_is_p_v(block_n):
    gen = torch.Generator().manual_seed(block_n)
    p = torch.rand(64, block_n, generator=gen, dtype=torch.float64)
    v = torch.randn(block_n, 128, generator=gen, dtype=torch.float64)
    owner = accumulator_owner(block_n)
    # A[row][k-position] as the hardware reads it from the packed registers.
    a = torch.full((64, block_n), float("nan"), dtype=torch.float64)
    for tid in range(128):
        for kt in range(block_n // 32):
            for reg, sources in enumerate(pack_p_sources(kt)):
                for byte, acc in enumerate(sources):
                    row, col = owner[(tid, acc)]
                    arow, k = a_fragment_e4m3(tid, reg, byte)
                    assert arow == row, "a thread's A bytes and S registers are the same row"
                    a[arow, 32 * kt + k] = p[row, col]
    assert not torch.isnan(a).any()
    # B[k-position] = V^T's column: key PERM16 within each 16 (the tile starts on a 16-column boundary).
    keys = [pos // 16 * 16 + tma.PERM16[pos % 16] for pos in range(block_n)]
    b = v[keys]
    torch.testing.assert_close(a @ b, p @ v)


@pytest.mark.parametrize("causal", [True, False])
def test_emulated_p_rounding_error_is_within_the_fp8_tolerance(causal):
    """The kernel's only rounding beyond the reference's dequantized inputs is P (in [0, 1]) to
    e4m3 before P V, then the bf16 output. Emulated on 512 x 512 (2 heads) that error is 2-3%
    relative L2 (the H100 measured 2.1% on D1 and 2.6% on D3), inside FP8_REL_TOL."""
    import math

    ref = importlib.import_module("mlagen.families.mla_prefill.reference")
    from mlagen.families.mla_prefill.problem import Shape

    n, h = 512, 2
    inp = ref.make_inputs(Shape("x", (n,), (n,), h, causal), "cpu", 0, "fp8_e4m3")
    q = ref.dequantize(inp["q"], inp["q_descale"], torch.float32)
    k = torch.cat([ref.dequantize(inp["k"], inp["k_descale"], torch.float32),
                   ref.dequantize(inp["k_rope"].expand(-1, h, -1), inp["k_descale"], torch.float32)], -1)
    v = ref.dequantize(inp["v"], inp["v_descale"], torch.float32)
    s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(192)
    if causal:
        s = s.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), float("-inf"))
    p = torch.exp(s - s.amax(-1, keepdim=True))
    rowsum = p.sum(-1, keepdim=True)  # the kernel sums P in fp32, before rounding it
    exact = torch.einsum("hqk,khd->qhd", p / rowsum, v)
    kernel = (torch.einsum("hqk,khd->qhd", p.to(torch.float8_e4m3fn).float(), v) / rowsum.permute(1, 0, 2))
    rel = float((kernel.to(torch.bfloat16).float() - exact).norm() / exact.norm())
    assert 0.01 < rel < ref.FP8_REL_TOL
