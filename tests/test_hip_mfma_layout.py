"""The gfx9 MFMA fragment layouts and the attention kernel's use of them, checked on the CPU.

Nothing here runs on an AMD GPU. Instead:

1. ``mfma_layout.cuh`` (the index functions the kernels are compiled with) is compiled into a
   host program that prints every lane's (row, col) for A, B and C/D, and ``pv_key``.
2. Those tables are compared with the layouts as the CDNA3/CDNA4 ISA guides document them
   (chapter 7; also AMD's "Matrix Core Programming on CDNA3 and CDNA4" examples), written out
   independently below.
3. An emulator of the instruction (A and B gathered from lanes by the documented layout, D = A B
   + C scattered back by the documented layout) runs the kernel's dataflow for one 32-query x
   32-key tile: S^T = K Q^T over 192 dims, then O^T = V^T P^T with P^T taken from the S^T
   registers, and the result must equal (Q K^T) V.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from mlagen import paths

# (K, RUN): bf16 32x32x8 (gfx942, gfx950), bf16 32x32x16 (gfx950), f8f6f4 32x32x64 with fp8 (gfx950).
ATOMS = [(8, 4), (16, 8), (64, 16)]


# --- the documented layouts (independent of the header) ------------------------------------


def doc_a(k_atom: int, lane: int, i: int) -> tuple[int, int]:
    """(row, k) of A held by element i of ``lane``, as the ISA guides tabulate it."""
    h, m = lane // 32, lane % 32
    if k_atom == 8:    # v_mfma_f32_32x32x8_bf16: 4 bf16 per lane, k = 4h .. 4h+3
        return m, 4 * h + i
    if k_atom == 16:   # v_mfma_f32_32x32x16_bf16: 8 bf16 per lane, k = 8h .. 8h+7
        return m, 8 * h + i
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
    const int steps = K <= 32 ? 32 / K : 0;
    for (int l = 0; l < 64; ++l)
      for (int s = 0; s < steps; ++s)
        for (int i = 0; i < K / 2; ++i) std::printf("%s%d", l || s || i ? ", " : "", pv_key(K, l, s, i));
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


@pytest.mark.parametrize("k_qk, k_pv", [(8, 8), (16, 16), (64, 16)])
def test_attention_tile_dataflow(header_tables, k_qk, k_pv):
    """The kernel's S^T = K Q^T (bf16 atom, or the fp8 32x32x64 one) and O^T = V^T P^T (bf16
    atom) for one 32-query x 32-key tile, through the header's index functions and the emulated
    instruction, equals (Q K^T) V. (Values are not rounded to bf16 / fp8: this checks indexing.)"""
    t = header_tables[str(k_qk)]
    per = k_qk // 2
    a_tab = [[tuple(t["a"][l * per + i]) for i in range(per)] for l in range(64)]
    b_tab = [[tuple(t["b"][l * per + i]) for i in range(per)] for l in range(64)]
    c_tab = [[tuple(header_tables["c"][l * 16 + r]) for r in range(16)] for l in range(64)]
    tp = header_tables[str(k_pv)]
    per_pv = k_pv // 2
    a_pv = [[tuple(tp["a"][l * per_pv + i]) for i in range(per_pv)] for l in range(64)]
    steps = 32 // k_pv
    pv = [[[tp["pv"][(l * steps + s) * per_pv + i] for i in range(per_pv)] for s in range(steps)] for l in range(64)]
    k_atom = k_qk

    g = torch.Generator().manual_seed(k_qk)
    d_qk, d_v = 192, 128
    Q = torch.randn(32, d_qk, generator=g, dtype=torch.float64)
    Kt = torch.randn(32, d_qk, generator=g, dtype=torch.float64)
    V = torch.randn(32, d_v, generator=g, dtype=torch.float64)
    Vt = V.T

    # S^T = K Q^T: A = K rows (keys) from LDS, B = Q^T (the lane's query) from registers.
    s = torch.zeros(64, 16, dtype=torch.float64)
    for ks in range(d_qk // k_atom):
        a = torch.tensor([[Kt[a_tab[l][i][0], ks * k_atom + a_tab[l][i][1]] for i in range(per)] for l in range(64)])
        b = torch.tensor([[Q[b_tab[l][i][1], ks * k_atom + b_tab[l][i][0]] for i in range(per)] for l in range(64)])
        s = emulate_mfma(k_atom, a, b, s)
    for l in range(64):
        for r in range(16):
            key, query = c_tab[l][r]
            assert s[l, r].item() == pytest.approx((Q[query] @ Kt[key]).item())

    # O^T = V^T P^T: B = the S^T registers in order, A = V^T rows at the keys pv_key names.
    o = [torch.zeros(64, 16, dtype=torch.float64) for _ in range(d_v // 32)]
    for st in range(steps):
        b = s[:, st * per_pv:(st + 1) * per_pv]
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
    """The kernel reads V^T's A operand as 8-byte runs of four keys: pv_key must give them."""
    for k_atom in (8, 16):
        per, steps = k_atom // 2, 32 // k_atom
        pv = header_tables[str(k_atom)]["pv"]
        for l in range(64):
            for s in range(steps):
                keys = pv[(l * steps + s) * per:(l * steps + s + 1) * per]
                for g in range(0, per, 4):
                    assert keys[g] % 4 == 0 and keys[g:g + 4] == list(range(keys[g], keys[g] + 4))


def test_kernel_uses_the_tested_functions():
    """The kernel header indexes its fragments only through mfma_layout.cuh's functions."""
    text = (Path(paths.include_dir()) / "mlagen/gfx9/mla_prefill.cuh").read_text()
    for name in ("a_row(lane)", "a_col(R, lane", "b_row(R, lane", "b_col(lane)", "c_row(lane", "pv_key(KP"):
        assert name in text
