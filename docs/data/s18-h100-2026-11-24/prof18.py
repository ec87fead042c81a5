"""Session 18: one profiled call of the FP8 dense kernel per mode (V^T in the kernel, pre-pass) on D3,
the D3 record's schedule at 32 producer registers, for Nsight Compute (--profile-from-start off)."""
import torch

from mlagen import spec, variant
from mlagen.families import get

fam = get("mla_prefill")
shape = fam.shapes()["D3"]
f8 = fam.make_inputs(shape, "cuda", 0, dtype="fp8_e4m3")
R = dict(consumers=3, order="none", block_n=96, swizzle_v=32, load_warps=1, consumer_regs=160, rescale="lazy",
         epilogue="direct", pv_wait="early", diagonal="full", producer_regs=32, stages=3, mask="none")
sp = spec.load("mla_prefill_sm90_fp8")
vs = [variant.make(sp, {**R, "v_transpose": m}) for m in ("kernel", "prepass")]
for v in vs:   # compile and warm outside the profiled range
    for _ in range(3):
        fam.call(f8, variant=v)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for v in vs:
    fam.call(f8, variant=v)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
