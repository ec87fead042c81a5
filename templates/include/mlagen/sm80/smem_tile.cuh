// Shared-memory tiles of bf16 rows for ldmatrix/cp.async, in 16-byte chunks, with the bank-conflict
// avoidance chosen by the variant: XOR of the chunk index with the row (within 128-byte groups),
// or one 16-byte pad per row.
#pragma once
#include "mlagen/common/types.cuh"

namespace mlagen::sm80 {

enum class Swizzle { kXor, kPad };

template <int ROWS, int COLS, Swizzle SW>
struct SmemTile {
  static_assert(COLS % 64 == 0, "tile rows must be whole 128-byte groups for the XOR swizzle");
  static constexpr int kChunks = COLS / 8;  // 16-byte chunks per row
  static constexpr int kRowBytes = COLS * 2 + (SW == Swizzle::kPad ? 16 : 0);
  static constexpr int kBytes = ROWS * kRowBytes;

  // Byte offset of 16-byte chunk `chunk` of row `row`.
  __device__ __forceinline__ static u32 offset(int row, int chunk) {
    if constexpr (SW == Swizzle::kXor) {
      return row * kRowBytes + (((chunk & ~7) | ((chunk ^ row) & 7)) << 4);
    } else {
      return row * kRowBytes + (chunk << 4);
    }
  }
};

}  // namespace mlagen::sm80
