"""The gfx9 MFMA fragment layouts and the attention kernel's use of them, checked on the CPU.

Nothing here runs on an AMD GPU. Instead:

1. ``mfma_layout.cuh`` (the index functions the kernels are compiled with) is compiled into a
   host program that prints every lane's (row, col) for A, B and C/D, and ``pv_key``.
2. Those tables are compared with the layouts as the CDNA3/CDNA4 ISA guides document them
   (chapter 7; also AMD's "Matrix Core Programming on CDNA3 and CDNA4" examples), written out
   independently below.
3. An emulator of the instruction (A and B gathered from lanes by the documented layout, D = A B
   + C scattered back by the documented layout) runs the kernel's dataflow for one 32-query x
   64-key tile: S^T = K Q^T over 192 dims, then O^T = V^T P^T with P^T taken from the S^T
   registers (for fp8, packed four to a word as the kernel packs them), and the result must
   equal (Q K^T) V.
4. FP8 numerics: the kernel's FP8 arithmetic (e4m3 inputs with descales, P quantized to e4m3 as
   P * kPScale per key tile of the online softmax, fp32 accumulation, bf16 output) emulated
   with torch's fp8 dtypes, against float64 math on the dequantized inputs; the measured error
   is what docs/amd.md quotes.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from mlagen import paths

# (K, RUN): bf16 32x32x8 (gfx942, gfx950), bf16 32x32x16 (gfx950) and fp8 32x32x16 (gfx942's
# v_mfma_f32_32x32x16_fp8_fp8: the same lane layout, one byte per element), f8f6f4 32x32x64 with
# fp8 (gfx950).
ATOMS = [(8, 4), (16, 8), (64, 16)]


# --- the documented layouts (independent of the header) ------------------------------------


def doc_a(k_atom: int, lane: int, i: int) -> tuple[int, int]:
    """(row, k) of A held by element i of ``lane``, as the ISA guides tabulate it."""
    h, m = lane // 32, lane % 32
    if k_atom == 8:    # v_mfma_f32_32x32x8_bf16: 4 bf16 per lane, k = 4h .. 4h+3
        return m, 4 * h + i
    if k_atom == 16:   # v_mfma_f32_32x32x16_bf16 (8 bf16 per lane) and v_mfma_f32_32x32x16_fp8_fp8
        return m, 8 * h + i  # (8 fp8 bytes per lane, CDNA3 ISA 7.1): k = 8h .. 8h+7 either way
    if k_atom == 64:   # v_mfma_scale_f32_32x32x64_f8f6f4, fp8: 32 bytes, k = 16h + [0,16) and 32 + 16h + [0,16)
        return m, 32 * (i // 16) + 16 * h + i % 16
    raise ValueError(k_atom)


def doc_b(k_atom: int, lane: int, i: int) -> tuple[int, int]:
    """(k, col) of B held by element i of ``lane`` (B is laid out as A transposed)."""
    m, k = doc_a(k_atom, lane, i)
    return k, m


def doc_c(lane: int, r: int) -> tuple[int, int]:
    """(row, col) of C/D in register r of ``lane`` for every 32x32 single-block MFMA."""
    return 8 * (r // 4) + 4 * (lane // 32) + r % 4, lane % 32


def emulate_mfma(k_atom: int, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """One 32x32xK MFMA: ``a``, ``b`` [64, K/2] lane fragments, ``c`` [64, 16] -> d [64, 16]."""
    A = torch.full((32, k_atom), float("nan"), dtype=torch.float64)
    B = torch.full((k_atom, 32), float("nan"), dtype=torch.float64)
    for lane in range(64):
        for i in range(k_atom // 2):
            A[doc_a(k_atom, lane, i)] = a[lane, i]
            B[doc_b(k_atom, lane, i)] = b[lane, i]
    assert not torch.isnan(A).any() and not torch.isnan(B).any(), "the layout must cover A and B exactly"
    D = A @ B
    d = c.clone()
    for lane in range(64):
        for r in range(16):
            d[lane, r] += D[doc_c(lane, r)]
    return d


# --- the header's layouts, compiled for the host ----------------------------------------------

_PROGRAM = r"""
#define MLAGEN_HD
#include <cstdio>
#include "mlagen/gfx9/mfma_layout.cuh"
using namespace mlagen::gfx9;
int main() {
  const int atoms[3][2] = {{8, 4}, {16, 8}, {64, 16}};
  std::printf("{");
  for (int t = 0; t < 3; ++t) {
    const int K = atoms[t][0], run = atoms[t][1];
    std::printf("%s\"%d\": {\"a\": [", t ? ", " : "", K);
    for (int l = 0; l < 64; ++l)
      for (int i = 0; i < K / 2; ++i) std::printf("%s[%d, %d]", l || i ? ", " : "", a_row(l), a_col(run, l, i));
    std::printf("], \"b\": [");
    for (int l = 0; l < 64; ++l)
      for (int i = 0; i < K / 2; ++i) std::printf("%s[%d, %d]", l || i ? ", " : "", b_row(run, l, i), b_col(l));
    std::printf("], \"pv\": [");
    const int steps = 64 / K;  // over a 64-key tile (two 32-key sub-tiles)
    for (int l = 0; l < 64; ++l)
      for (int s = 0; s < steps; ++s)
        for (int i = 0; i < K / 2; ++i) std::printf("%s%d", l || s || i ? ", " : "", pv_key(K, l, s, i));
    std::printf("], \"p\": [");
    for (int g = 0; g < 32; ++g) std::printf("%s[%d, %d]", g ? ", " : "", p_step(K, g), p_elem(K, g));
    std::printf("]}");
  }
  std::printf(", \"c\": [");
  for (int l = 0; l < 64; ++l)
    for (int r = 0; r < 16; ++r) std::printf("%s[%d, %d]", l || r ? ", " : "", c_row(l, r), c_col(l));
  std::printf("]}\n");
}
"""


def _host_compiler() -> str | None:
    for name in ("c++", "g++", "clang++", "clang++-22"):
        if shutil.which(name):
            return shutil.which(name)
    return None


@pytest.fixture(scope="module")
def header_tables(tmp_path_factory) -> dict:
    cxx = _host_compiler()
    if cxx is None:
        pytest.skip("needs a host C++ compiler to evaluate mfma_layout.cuh")
    d = tmp_path_factory.mktemp("mfma_layout")
    (d / "main.cpp").write_text(_PROGRAM)
    subprocess.run([cxx, "-std=c++17", f"-I{paths.include_dir()}", str(d / "main.cpp"), "-o", str(d / "main")],
                   check=True, capture_output=True, text=True)
    return json.loads(subprocess.run([str(d / "main")], check=True, capture_output=True, text=True).stdout)


@pytest.mark.parametrize("k_atom, run", ATOMS)
def test_header_operand_layouts_match_the_isa(header_tables, k_atom, run):
    t = header_tables[str(k_atom)]
    per = k_atom // 2
    for lane in range(64):
        for i in range(per):
            assert tuple(t["a"][lane * per + i]) == doc_a(k_atom, lane, i), (k_atom, lane, i)
            assert tuple(t["b"][lane * per + i]) == doc_b(k_atom, lane, i), (k_atom, lane, i)


def test_header_accumulator_layout_matches_the_isa(header_tables):
    cells = [tuple(x) for x in header_tables["c"]]
    assert cells == [doc_c(lane, r) for lane in range(64) for r in range(16)]
    assert len(set(cells)) == 32 * 32  # every element of the 32x32 tile exactly once


def test_emulator_is_a_matrix_product():
    """The emulator itself, on layouts filled the documented way: D = A B + C."""
    g = torch.Generator().manual_seed(0)
    for k_atom, _ in ATOMS:
        A = torch.randn(32, k_atom, generator=g, dtype=torch.float64)
        B = torch.randn(k_atom, 32, generator=g, dtype=torch.float64)
        a = torch.tensor([[A[doc_a(k_atom, l, i)] for i in range(k_atom // 2)] for l in range(64)])
        b = torch.tensor([[B[doc_b(k_atom, l, i)] for i in range(k_atom // 2)] for l in range(64)])
        d = emulate_mfma(k_atom, a, b, torch.zeros(64, 16, dtype=torch.float64))
        D = torch.empty(32, 32, dtype=torch.float64)
        for l in range(64):
            for r in range(16):
                D[doc_c(l, r)] = d[l, r]
        torch.testing.assert_close(D, A @ B)


def p_operand_registers(p_table: list, k_pv: int) -> list[list[int]]:
    """For each k-step of P V, the accumulator register (g = 16 * sub-tile + register) that each
    element of the P^T operand holds, by the header's p_step / p_elem (what the kernel packs)."""
    steps = 64 // k_pv
    regs = [[None] * (k_pv // 2) for _ in range(steps)]
    for g, (step, elem) in enumerate(p_table):
        assert regs[step][elem] is None, "two registers packed into one operand element"
        regs[step][elem] = g
    assert all(r is not None for row in regs for r in row), "an operand element left unfilled"
    return regs


@pytest.mark.parametrize("k_qk, k_pv, elem_bytes", [(8, 8, 2), (16, 16, 2), (16, 16, 1), (64, 64, 1)],
                         ids=["bf16-k8", "bf16-k16", "fp8-k16-gfx942", "fp8-k64-gfx950"])
def test_attention_tile_dataflow(header_tables, k_qk, k_pv, elem_bytes):
    """The kernel's S^T = K Q^T and O^T = V^T P^T for one 32-query x 64-key tile (two 32-key
    sub-tiles), through the header's index functions (P^T packed by p_step / p_elem, elements in
    word order: the same for two bf16 or four fp8 per word, hence ``elem_bytes`` only names the
    case) and the emulated instruction, equals (Q K^T) V. The fp8 K = 64 step of P V spans both sub-tiles. (Values are not
    rounded here: this checks indexing; test_fp8_* below check the rounding.)"""
    t = header_tables[str(k_qk)]
    per = k_qk // 2
    a_tab = [[tuple(t["a"][l * per + i]) for i in range(per)] for l in range(64)]
    b_tab = [[tuple(t["b"][l * per + i]) for i in range(per)] for l in range(64)]
    c_tab = [[tuple(header_tables["c"][l * 16 + r]) for r in range(16)] for l in range(64)]
    tp = header_tables[str(k_pv)]
    per_pv = k_pv // 2
    a_pv = [[tuple(tp["a"][l * per_pv + i]) for i in range(per_pv)] for l in range(64)]
    steps = 64 // k_pv
    pv = [[[tp["pv"][(l * steps + s) * per_pv + i] for i in range(per_pv)] for s in range(steps)] for l in range(64)]

    g = torch.Generator().manual_seed(k_qk + elem_bytes)
    d_qk, d_v, keys = 192, 128, 64
    Q = torch.randn(32, d_qk, generator=g, dtype=torch.float64)
    Kt = torch.randn(keys, d_qk, generator=g, dtype=torch.float64)
    V = torch.randn(keys, d_v, generator=g, dtype=torch.float64)
    Vt = V.T

    # S^T = K Q^T per 32-key sub-tile j: A = K rows (keys) from LDS, B = Q^T (the lane's query).
    s_regs = torch.zeros(64, 16 * (keys // 32), dtype=torch.float64)
    for j in range(keys // 32):
        acc = torch.zeros(64, 16, dtype=torch.float64)
        for ks in range(d_qk // k_qk):
            a = torch.tensor([[Kt[32 * j + a_tab[l][i][0], ks * k_qk + a_tab[l][i][1]] for i in range(per)]
                              for l in range(64)])
            b = torch.tensor([[Q[b_tab[l][i][1], ks * k_qk + b_tab[l][i][0]] for i in range(per)] for l in range(64)])
            acc = emulate_mfma(k_qk, a, b, acc)
        for l in range(64):
            for r in range(16):
                key, query = c_tab[l][r]
                assert acc[l, r].item() == pytest.approx((Q[query] @ Kt[32 * j + key]).item())
        s_regs[:, 16 * j:16 * (j + 1)] = acc

    # O^T = V^T P^T: B = the S^T registers as the kernel packs them, A = V^T rows at pv_key's keys.
    regs = p_operand_registers(tp["p"], k_pv)
    o = [torch.zeros(64, 16, dtype=torch.float64) for _ in range(d_v // 32)]
    for st in range(steps):
        b = s_regs[:, regs[st]]
        for d in range(d_v // 32):
            a = torch.tensor([[Vt[32 * d + a_pv[l][i][0], pv[l][st][i]] for i in range(per_pv)] for l in range(64)])
            o[d] = emulate_mfma(k_pv, a, b, o[d])
    out = torch.empty(32, d_v, dtype=torch.float64)
    for d in range(d_v // 32):
        for l in range(64):
            for r in range(16):
                dd, query = c_tab[l][r]
                out[query, 32 * d + dd] = o[d][l, r]
    torch.testing.assert_close(out, (Q @ Kt.T) @ V)


def test_pv_key_runs_are_four_consecutive_keys(header_tables):
    """The kernel reads V^T's A operand as runs of four keys (8 bytes bf16, 4 bytes fp8): pv_key
    must give them, and a k-step's keys must be distinct and within the 64-key tile."""
    for k_atom in (8, 16, 64):
        per, steps = k_atom // 2, 64 // k_atom
        pv = header_tables[str(k_atom)]["pv"]
        for l in range(64):
            seen = set()
            for s in range(steps):
                keys = pv[(l * steps + s) * per:(l * steps + s + 1) * per]
                seen.update(keys)
                for g in range(0, per, 4):
                    assert keys[g] % 4 == 0 and keys[g:g + 4] == list(range(keys[g], keys[g] + 4))
            assert len(seen) == 32 and max(seen) < 64  # a lane half covers half of the 64 keys


# --- FP8 numerics ----------------------------------------------------------------------------

# (torch dtype, kPScale, largest finite value) of each target's e4m3, as mla_prefill_gfx9.cu.j2 sets them.
FP8 = {"gfx950": (torch.float8_e4m3fn, 256.0, 448.0), "gfx942": (torch.float8_e4m3fnuz, 128.0, 240.0)}


def quantize(x: torch.Tensor, target: str, per_row: bool = False):
    """(stored fp8 as float64, descale) with the largest magnitude on the format's largest value."""
    dtype, _, limit = FP8[target]
    amax = x.abs().amax(dim=-1, keepdim=True) if per_row else x.abs().amax()
    descale = amax / limit
    return (x / descale).clamp(-limit, limit).to(dtype).double(), descale


def emulate_fp8_kernel(q8, k8, v8, qd, kd, vd, target: str, block_n: int, causal: bool):
    """The FP8 kernel's arithmetic for one head: S = q8 k8^T (exact products, fp32-order sums are
    within 1e-7 of this), scale_log2 = scale * qd * kd * log2(e), online softmax per key tile of
    block_n, P^T = fp8(P * kPScale), O += P^T-products with the stored V, out = bf16(O * vd /
    (kPScale * l)). Returns (out, lse) in float64."""
    _, p_scale, _ = FP8[target]
    dtype = FP8[target][0]
    lq, lk = q8.shape[0], k8.shape[0]
    scale_log2 = (1 / math.sqrt(192)) * qd * kd * math.log2(math.e)
    s = (q8 @ k8.T).float().double()
    if causal:
        hidden = torch.arange(lk)[None, :] > torch.arange(lq)[:, None] + (lk - lq)
        s = s.masked_fill(hidden, -math.inf)
    m = torch.full((lq, 1), -math.inf, dtype=torch.float64)
    l = torch.zeros(lq, 1, dtype=torch.float64)
    o = torch.zeros(lq, v8.shape[1], dtype=torch.float64)
    for n0 in range(0, lk, block_n):
        st = s[:, n0:n0 + block_n] * scale_log2
        new_m = torch.maximum(m, st.amax(dim=1, keepdim=True))
        base = torch.where(torch.isinf(new_m), torch.zeros_like(new_m), new_m)
        corr = torch.exp2(m - base)
        p = torch.exp2(st - base)
        l = l * corr + p.sum(dim=1, keepdim=True)
        p8 = (p * p_scale).to(dtype).double()  # cvt_pk_fp8_f32: round to nearest even
        o = o * corr + p8 @ v8[n0:n0 + block_n]
        m = new_m
    out = (o * vd / (p_scale * l)).to(torch.bfloat16).double()
    lse = (m + torch.log2(l)) * math.log(2)
    return out, lse


def fp8_error(target: str, causal: bool, lq: int = 256, lk: int = 1024, block_n: int = 128, seed: int = 0):
    """(relative L2 error of out, max abs lse error) of the emulated FP8 kernel against float64
    attention on the dequantized inputs, for standard-normal Q, K, V."""
    g = torch.Generator().manual_seed(seed)
    Q, K, V = (torch.randn(n, d, generator=g, dtype=torch.float64) for n, d in ((lq, 192), (lk, 192), (lk, 128)))
    q8, qd = quantize(Q, target)
    k8, kd = quantize(K, target)
    v8, vd = quantize(V, target)
    out, lse = emulate_fp8_kernel(q8, k8, v8, float(qd), float(kd), float(vd), target, block_n, causal)
    s = (q8 * qd) @ (k8 * kd).T / math.sqrt(192)
    if causal:
        s = s.masked_fill(torch.arange(lk)[None, :] > torch.arange(lq)[:, None] + (lk - lq), -math.inf)
    ref_lse = torch.logsumexp(s, dim=1, keepdim=True)
    ref = torch.softmax(s, dim=1) @ (v8 * vd)
    return float((out - ref).norm() / ref.norm()), float((lse - ref_lse).abs().max())


def test_fp8_emulation_reproduces_exact_math_without_rounding():
    """Guard on the emulator: with P left unrounded (kPScale folding only), it is exact attention."""
    g = torch.Generator().manual_seed(3)
    Q, K, V = torch.randn(40, 192, generator=g), torch.randn(300, 192, generator=g), torch.randn(300, 128, generator=g)
    q8, qd = quantize(Q.double(), "gfx950")
    k8, kd = quantize(K.double(), "gfx950")
    v8, vd = quantize(V.double(), "gfx950")
    saved = FP8["gfx950"]
    FP8["gfx950"] = (torch.float64, 256.0, 448.0)  # no rounding of P
    try:
        out, _ = emulate_fp8_kernel(q8, k8, v8, float(qd), float(kd), float(vd), "gfx950", 128, True)
    finally:
        FP8["gfx950"] = saved
    s = (q8 * qd) @ (k8 * kd).T / math.sqrt(192)
    s = s.masked_fill(torch.arange(300)[None, :] > torch.arange(40)[:, None] + 260, -math.inf)
    ref = torch.softmax(s, dim=1) @ (v8 * vd)
    assert float((out - ref).norm() / ref.norm()) < 4e-3  # bf16 output rounding only


@pytest.mark.parametrize("target", ["gfx950", "gfx942"])
@pytest.mark.parametrize("causal", [True, False])
def test_fp8_error_is_within_the_family_tolerance(target, causal):
    """The FP8 kernels' own rounding (P in e4m3, bf16 out) against exact math on the dequantized
    inputs: within FP8_REL_TOL, which the family's comparison allows fp8 calls; lse (computed from
    fp32 P) within LSE_TOL. The measured numbers are in docs/amd.md."""
    from mlagen.families.mla_prefill.reference import FP8_REL_TOL, LSE_TOL

    rel, lse_err = fp8_error(target, causal)
    print(f"{target} causal={causal}: out rel L2 {rel:.2e}, lse max abs {lse_err:.2e}")
    assert rel < FP8_REL_TOL and lse_err < LSE_TOL
    assert rel > 1e-3  # P really is rounded to 3 mantissa bits (the check is not vacuous)


def test_kernel_uses_the_tested_functions():
    """The kernel header indexes its fragments only through mfma_layout.cuh's functions."""
    text = (Path(paths.include_dir()) / "mlagen/gfx9/mla_prefill.cuh").read_text()
    for name in ("a_row(lane)", "a_col(R, lane", "b_row(R, lane", "b_col(lane)", "c_row(lane", "pv_key(KP",
                 "pf[p_step(KP, g)][p_elem(KP, g) / kPPerWord]"):
        assert name in text
