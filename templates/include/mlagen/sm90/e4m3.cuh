// Dequantizing OCP e4m3 values on sm_89+ (the FP8 KV caches of mlagen/operands.py): the fp32
// product of each value and its scale, rounded to bf16 (round to nearest even), which is what the
// host's operands.dequantize(..., round_bf16=True) returns.
#pragma once
#include "mlagen/common/types.cuh"

namespace mlagen::sm90 {

// Four e4m3 values (w's bytes, lowest first) times `scale`, as two bf16 pairs.
__device__ __forceinline__ uint2 dequant_e4m3x4(u32 w, float scale) {
  u32 h01, h23;
  asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %2;\n cvt.rn.f16x2.e4m3x2 %0, lo;\n cvt.rn.f16x2.e4m3x2 %1, hi;\n}\n"
      : "=r"(h01), "=r"(h23)
      : "r"(w));
  float f0, f1, f2, f3;
  asm("{\n .reg .f16 a, b, c, d;\n mov.b32 {a, b}, %4;\n mov.b32 {c, d}, %5;\n cvt.f32.f16 %0, a;\n"
      " cvt.f32.f16 %1, b;\n cvt.f32.f16 %2, c;\n cvt.f32.f16 %3, d;\n}\n"
      : "=f"(f0), "=f"(f1), "=f"(f2), "=f"(f3)
      : "r"(h01), "r"(h23));
  return make_uint2(pack_bf16x2(__fmul_rn(f0, scale), __fmul_rn(f1, scale)),
                    pack_bf16x2(__fmul_rn(f2, scale), __fmul_rn(f3, scale)));
}

__device__ __forceinline__ void st_shared_16(u32 addr, uint2 lo, uint2 hi) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(lo.x), "r"(lo.y), "r"(hi.x), "r"(hi.y)
               : "memory");
}

}  // namespace mlagen::sm90
