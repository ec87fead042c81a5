// Fragment layouts of the 32x32 MFMA atoms: which (row, col) of A, B and C/D a lane's element holds.
//
// Plain constexpr integer functions with no device code, so the same text is compiled into the
// kernels and into a host program that tests/test_hip_mfma_layout.py checks against the ISA's
// documented layouts (CDNA3 / CDNA4 ISA guides, chapter 7 "Matrix Arithmetic Instructions").
// For the 32x32xK atoms with one block, a lane holds K/2 elements of A and of B, in runs of RUN
// consecutive k (RUN = 4 for bf16 K = 8, 8 for bf16 K = 16 and for fp8 K = 16 (gfx942's
// 32x32x16_fp8_fp8), 16 for the f8f6f4 K = 64 with fp8):
//   A (32 x K): lane l holds row l % 32; its element i is column
//               (i / RUN) * 2 * RUN + (l / 32) * RUN + i % RUN;
//   B (K x 32): lane l holds column l % 32; element i is the row of that same formula;
//   C/D (32 x 32 fp32, 16 registers): lane l, register r holds column l % 32, row
//               8 * (r / 4) + 4 * (l / 32) + r % 4.
#pragma once

#ifndef MLAGEN_HD
#define MLAGEN_HD __device__
#endif

namespace mlagen {
namespace gfx9 {

constexpr int kWave = 64;
constexpr int kAtomMN = 32;  // rows and columns of the 32x32xK atoms
constexpr int kAccRegs = 16; // fp32 accumulator registers of a 32x32 tile per lane

MLAGEN_HD constexpr int half_of(int lane) { return lane / 32; }
MLAGEN_HD constexpr int a_row(int lane) { return lane % 32; }
MLAGEN_HD constexpr int a_col(int run, int lane, int i) { return (i / run) * 2 * run + half_of(lane) * run + i % run; }
MLAGEN_HD constexpr int b_col(int lane) { return lane % 32; }
MLAGEN_HD constexpr int b_row(int run, int lane, int i) { return a_col(run, lane, i); }
MLAGEN_HD constexpr int c_col(int lane) { return lane % 32; }
MLAGEN_HD constexpr int c_row(int lane, int r) { return 8 * (r / 4) + 4 * half_of(lane) + r % 4; }

// The attention kernel computes S^T = K Q^T, so a lane's accumulator holds one query (its
// column) and 16 keys per 32-key sub-tile; then O^T = V^T P^T takes P^T straight from those
// registers as the B operand: k-step s of the second product (counted over the whole key tile)
// uses the accumulator registers g in [s*K/2, (s+1)*K/2) (register g % 16 of sub-tile g / 16), so
// B's element i in lane l is key 32 * (g / 16) + c_row(l, g % 16) of the tile, g = s*K/2 + i. The
// hardware pairs A's element i in lane l with the same k as B's element i in a lane of the same
// half, and that key depends on the half and i only, so the A operand (V^T) reads key
// pv_key(K, l, s, i). For K = 8 this is the natural order; for K = 16 a lane's keys come in two
// runs of four; the fp8 K = 64 step spans two sub-tiles (eight runs of four).
// The B side of the same pairing: accumulator register g of a lane (register g % 16 of sub-tile
// g / 16) is element p_elem(K, g) of the P^T operand of k-step p_step(K, g). Elements are packed
// into words in order (two bf16 or four fp8 per word, element 0 in the low bits).
MLAGEN_HD constexpr int p_step(int k_atom, int g) { return g / (k_atom / 2); }
MLAGEN_HD constexpr int p_elem(int k_atom, int g) { return g % (k_atom / 2); }

MLAGEN_HD constexpr int pv_key(int k_atom, int lane, int s, int i) {
  return 32 * ((s * (k_atom / 2) + i) / 16) + c_row(lane, (s * (k_atom / 2) + i) % 16);
}

}  // namespace gfx9
}  // namespace mlagen
