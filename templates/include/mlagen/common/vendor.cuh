// Selects the vendor primitives (cuda/ or gfx9/) that the common headers are written against.
// The one place that branches on the compiler's target: everything below common/ uses only the
// names these files define (ldg, ballot32, fast_exp2, pack_bf16x2, ...).
#pragma once
#if defined(__AMDGCN__)
#include "mlagen/gfx9/prelude.cuh"
#else
#include "mlagen/cuda/prims.cuh"
#endif
