// Session 18 call p: the FP8 dense kernel's V^T transpose alone (transpose_v_tile's addressing for
// block_n 96, swizzle_v 32, 3 warps), in a loop, for Nsight Compute's shared-memory wavefront counts:
// does ldmatrix.x4.trans / stmatrix.x4 with these addresses take 4 wavefronts each in isolation?
// Build: nvcc -arch=sm_90a -O3 -o tmicro tmicro.cu
#include <cstdio>
#include <cstdint>
typedef uint32_t u32;
constexpr int kBlockN = 96, kSwV = 32, kWarps = 3, kVCbBytes = 128 * kSwV;
__device__ __forceinline__ u32 swz(u32 off) { return off ^ (((off >> 7) & (kSwV / 16 - 1)) << 4); }
__global__ void __launch_bounds__(96) tmicro(int iters, u32* sink, int mode) {
  extern __shared__ __align__(1024) unsigned char sm[];
  const u32 base = (u32)__cvta_generic_to_shared(sm);
  const u32 raw = (base + 1023) & ~1023u, vt = raw + kBlockN * 128;
  for (int i = threadIdx.x; i < kBlockN * 128 / 4; i += blockDim.x) ((u32*)(sm + (raw - base)))[i] = i * 2654435761u;
  __syncthreads();
  const int tw = threadIdx.x / 32, lane = threadIdx.x % 32, m = lane / 8, r = lane % 8;
  const u32 ld = (raw + (8 * (m % 2) + r) * 128) | ((u32)((m / 2) ^ r) << 4);
  const int dd = (m % 2 == 0) == (r < 4) ? 2 * r : 2 * r + 1;
  const int st_row = 16 * (m / 2) + dd;
  const u32 sel0 = lane < 16 ? 0x6420u : 0x7531u;
  u32 acc = 0;
  for (int it = 0; it < iters; ++it) {
#pragma unroll 1
    for (int g = tw; g < kBlockN / 16; g += kWarps) {
      const u32 src = ld + g * 16 * 128;
      const u32 dst = vt + (g / (kSwV / 16)) * kVCbBytes + swz(st_row * kSwV + (g % (kSwV / 16)) * 16);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        u32 x[4];
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(x[0]), "=r"(x[1]), "=r"(x[2]), "=r"(x[3]) : "r"(src ^ ((u32)(2 * j) << 4)) : "memory");
        const u32 sel1 = sel0 ^ 0x1111u;
        if (mode == 0) {
          asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(dst + j * 32 * kSwV),
                       "r"(__byte_perm(x[0], x[1], sel0)), "r"(__byte_perm(x[0], x[1], sel1)),
                       "r"(__byte_perm(x[2], x[3], sel0)), "r"(__byte_perm(x[2], x[3], sel1)) : "memory");
        } else {
          acc += __byte_perm(x[0], x[1], sel0) ^ __byte_perm(x[2], x[3], sel1);
        }
      }
    }
  }
  if (acc == 0x12345678u) sink[0] = acc;
}
int main() {
  u32* sink; cudaMalloc(&sink, 4);
  cudaFuncSetAttribute(tmicro, cudaFuncAttributeMaxDynamicSharedMemorySize, 32 * 1024);
  for (int mode = 0; mode < 2; ++mode) {
    tmicro<<<1, 96, 26 * 1024>>>(1000, sink, mode);
    cudaError_t e = cudaDeviceSynchronize();
    printf("mode %d (%s): %s\n", mode, mode == 0 ? "ldmatrix + stmatrix" : "ldmatrix only", cudaGetErrorString(e));
  }
  return 0;
}
